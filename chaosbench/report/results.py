"""The suite's results table on disk: ``results.parquet`` (typed) and ``results.csv`` (for people and tools).

One row per run; the columns are those the report reads (see :mod:`chaosbench.report.tables`), any of which may
be missing. pandas and pyarrow are imported inside the functions so importing this module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.errors import ChaosbenchError
from chaosbench.report.fmt import is_missing

if TYPE_CHECKING:
    import pandas as pd

RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"


def load_results(suite_dir: str | Path) -> pd.DataFrame:
    """Read ``results.parquet`` from ``suite_dir``, or ``results.csv`` when there is no parquet file.

    Raises :class:`~chaosbench.errors.ChaosbenchError` when neither exists.
    """
    import pandas as pd

    suite_dir = Path(suite_dir)
    parquet = suite_dir / RESULTS_PARQUET
    csv = suite_dir / RESULTS_CSV
    if parquet.exists():
        return pd.read_parquet(parquet)
    if csv.exists():
        return pd.read_csv(csv)
    raise ChaosbenchError(f"no {RESULTS_PARQUET} or {RESULTS_CSV} in {suite_dir}")


def _kind(value: Any) -> str:
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    return type(value).__name__


def _to_text(value: Any) -> Any:
    if is_missing(value):
        return None
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` that pyarrow can always write.

    Object columns whose values are of mixed types (``1`` and ``"x"``), or hold dicts/lists, or that pyarrow
    rejects for any other reason, become text columns (dicts and lists as JSON); missing values stay ``None``.
    """
    import pyarrow as pa

    out = df.reset_index(drop=True).copy()
    out.columns = [str(c) for c in out.columns]
    for col in out.columns:
        series = out[col]
        if series.dtype != object:
            continue
        present = [v for v in series if not is_missing(v)]
        kinds = {_kind(v) for v in present}
        convert = len(kinds) > 1 or bool(kinds - {"bool", "int", "float", "str"})
        if not convert:
            try:
                pa.array(series, from_pandas=True)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                convert = True
        if convert:
            out[col] = series.map(_to_text).astype(object)
    return out


def write_results(suite_dir: str | Path, df: pd.DataFrame) -> dict[str, Path]:
    """Write ``results.csv`` and ``results.parquet`` into ``suite_dir``; return ``{"csv": …, "parquet": …}``."""
    import pyarrow as pa

    suite_dir = Path(suite_dir)
    suite_dir.mkdir(parents=True, exist_ok=True)
    safe = parquet_safe(df)
    csv = suite_dir / RESULTS_CSV
    parquet = suite_dir / RESULTS_PARQUET
    safe.to_csv(csv, index=False)
    try:
        safe.to_parquet(parquet, index=False, engine="pyarrow")
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # Last resort, so the table is never lost: every object column as text.
        for col in safe.columns:
            if safe[col].dtype == object:
                safe[col] = safe[col].map(_to_text).astype(object)
        safe.to_parquet(parquet, index=False, engine="pyarrow")
    return {"csv": csv, "parquet": parquet}
