"""Reading values from the results table, whatever stored them (parquet, CSV, pandas' missing values)."""

from __future__ import annotations

import math
from typing import Any

_MISSING_TEXT = {"", "nan", "none", "null", "nat", "<na>"}


def is_missing(value: Any) -> bool:
    """True for ``None``, NaN, ``pd.NA``/``NaT`` and empty or null-like strings."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower() in _MISSING_TEXT
    if isinstance(value, (list, tuple, dict, set)):
        return False
    try:
        import pandas as pd

        return bool(pd.isna(value))
    except (TypeError, ValueError, ImportError):
        return False


def as_float(value: Any) -> float | None:
    """The value as a float, or ``None`` when it is missing or not a number (NaN counts as missing)."""
    if is_missing(value) or isinstance(value, (list, tuple, dict, set)):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def as_bool(value: Any) -> bool | None:
    """``True``/``False`` from bools, 0/1 and the usual strings; ``None`` when missing or unreadable."""
    if is_missing(value):
        return None
    if isinstance(value, str):
        low = value.strip().lower()
        if low in {"true", "yes", "1"}:
            return True
        if low in {"false", "no", "0"}:
            return False
        return None
    try:
        return bool(value)
    except (TypeError, ValueError):
        return None
