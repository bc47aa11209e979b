"""Reading loosely typed result cells and formatting them for people.

Result tables come from pandas, parquet and csv, so a cell that means "no value" may be ``None``, ``NaN``,
``pd.NA``, an empty string or the text ``"nan"``. Everything here treats those alike and never raises: a value
that cannot be read is missing and is shown as :data:`MISSING`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from chaosbench.analysis import values
from chaosbench.analysis.values import is_missing

#: What a table shows for a value that could not be measured.
MISSING = "—"


def as_float(value: Any) -> float | None:
    """:func:`chaosbench.analysis.values.as_float`, with the same answers; plain floats and ints (what the
    report's rows hold once read) skip its pandas lookup, which dominated a 10,000-run report."""
    kind = type(value)
    if kind is float:
        return None if math.isnan(value) else value
    if kind is int:
        return float(value)
    if value is None:
        return None
    return values.as_float(value)


def as_bool(value: Any) -> bool | None:
    """:func:`chaosbench.analysis.values.as_bool`, with the same answers; bools and ``None`` answered at once."""
    if value is None or value is True or value is False:
        return value
    return values.as_bool(value)


def as_int(value: Any) -> int | None:
    """The value as an int when it is a whole number, else ``None``."""
    f = as_float(value)
    if f is None or math.isinf(f) or f != int(f):
        return None
    return int(f)


def as_text(value: Any) -> str | None:
    """The value as text, or ``None`` when missing."""
    if is_missing(value):
        return None
    return str(value)


def as_name(value: Any) -> str | None:
    """A framework's or fault's name as text, ``None`` only when absent (``None``, NaN): unlike :func:`as_text`,
    ``none`` (the framework that does nothing) is a name, not a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def parse_json_object(value: Any) -> dict[str, Any]:
    """A JSON object cell (or an already parsed dict) as a dict; anything else gives ``{}``."""
    if isinstance(value, dict):
        return dict(value)
    if is_missing(value) or not isinstance(value, (str, bytes)):
        return {}
    try:
        obj = json.loads(value)
    except (TypeError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def fmt_seconds(value: float | None) -> str:
    """Seconds with 3 decimals below 100 s and 2 above."""
    if value is None:
        return MISSING
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.2f}"


def fmt_count(value: float | None) -> str:
    """Whole numbers without decimals (a median of counts may be x.5: one decimal then)."""
    if value is None:
        return MISSING
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return str(int(value)) if value == int(value) else f"{value:.1f}"


def fmt_percent(value: float | None) -> str:
    """A fraction 0..1 as a percentage with one decimal."""
    if value is None:
        return MISSING
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value * 100:.1f}%"


def fmt_number(value: float | None) -> str:
    """Any other quantity: 4 significant digits."""
    if value is None:
        return MISSING
    return f"{value:.4g}"


def fmt_bool(value: Any) -> str:
    b = as_bool(value)
    return MISSING if b is None else ("yes" if b else "no")


def fmt_text(value: Any) -> str:
    t = as_text(value)
    return MISSING if t is None else t


#: How each kind of quantity is formatted.
FORMATTERS = {"s": fmt_seconds, "count": fmt_count, "fraction": fmt_percent, "number": fmt_number}


def fmt_value(kind: str, value: Any) -> str:
    """Format a raw cell as the given kind (``s``, ``count``, ``fraction``, ``number``)."""
    return FORMATTERS.get(kind, fmt_number)(as_float(value))
