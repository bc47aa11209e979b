"""Reading values from the results table, whatever stored them (parquet, CSV, pandas' missing values)."""

from __future__ import annotations

import math
from typing import Any

_MISSING_TEXT = {"", "nan", "none", "null", "nat", "<na>"}


def is_missing(value: Any) -> bool:
    """True for ``None``, NaN, ``pd.NA``/``NaT`` and empty or null-like strings."""
    if value is None:
        return True
    if isinstance(value, (bool, int)):  # the common cases, without asking pandas
        return False
    if isinstance(value, float):
        return math.isnan(value)
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


#: The run-level fields a fault's own figures share (chaosbench.analysis.faults.FaultFigures).
_FAULT_FIELDS = (
    "fault",
    "fault_class",
    "detected",
    "time_to_detect_s",
    "detected_via",
    "blame",
    "blamed",
    "time_to_resume_s",
    "lost_steps",
    "lost_work_s",
    "rollback",
)


def fault_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The faults of one result row, each measured on its own (its ``faults`` column: a list, or its JSON); a row
    of an older chaosbench without one stands for its single fault (its run-level figures, its outcome as the
    fault's status). Controls and runs whose fault did not fire have none."""
    value = row.get("faults")
    if isinstance(value, str) and not is_missing(value):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if isinstance(value, list) and value:
        return [dict(f) for f in value if isinstance(f, dict)]
    outcome = row.get("outcome")
    if as_bool(row.get("control")) is True or outcome not in ("recovered", "not_recovered", "outlasted"):
        return []
    return [{**{k: row.get(k) for k in _FAULT_FIELDS}, "status": outcome}]
