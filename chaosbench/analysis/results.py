"""From run directories to the results table, recomputable at any time from the timelines alone, and the table
on disk: ``results.parquet`` (typed) and ``results.csv`` (for people and tools), one row per run, the columns the
report reads (any may be missing). pandas and pyarrow are imported inside the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.analysis.metrics import RunMetrics, compute_metrics
from chaosbench.analysis.slo import evaluate
from chaosbench.analysis.values import is_missing
from chaosbench.errors import ResultsError
from chaosbench.rundir import RunDir, SuiteDir, replace_atomic, write_atomic
from chaosbench.timeline import Event, read_events

if TYPE_CHECKING:
    import pandas as pd


def run_metrics(
    run: RunDir, control: RunDir | None, write: bool = True, control_events: list[Event] | None = None
) -> RunMetrics:
    """One run's metrics (a fault run against its framework's control run), its SLO verdicts, and with ``write``
    its ``metrics.json``; ``workload`` (name) and ``strategy`` come from the run's configuration. ``control_events``: the control's timeline when the caller has it already."""
    cfg = run.read_config()
    sc = cfg["scenario"]
    if control is None or control.path == run.path:
        control_events = None
    elif control_events is None:
        control_events = read_events(control.events)
    m = compute_metrics(read_events(run.events), control=control_events, total_steps=cfg.get("total_steps"))
    m.run_dir = str(run.path)
    m.suite, m.scenario, m.framework = sc["suite"], sc["scenario"], sc["framework"]
    m.fault, m.repeat, m.control = sc["fault"], sc["repeat"], sc["control"]
    m.workload = (sc.get("workload") or {}).get("name")
    m.strategy = sc.get("strategy")
    checks = evaluate(m, sc.get("slos") or {})
    m.slo_ok = all(c.ok for c in checks) if checks else None
    m.slo_failures = [c.describe() for c in checks if not c.ok]
    if write:
        write_atomic(run.metrics, json.dumps(m.to_dict(), indent=2, default=str))
    return m


def controls_of(runs: list[RunDir]) -> dict[str, RunDir]:
    """Each framework's control run among ``runs``."""
    out = {}
    for run in runs:
        sc = run.read_config()["scenario"]
        if sc.get("control"):
            out[sc["framework"]] = run
    return out


def collect(suite_dir: Path, write: bool = True) -> list[RunMetrics]:
    """Recompute the metrics of every run below ``suite_dir`` from its timeline (each fault run against its
    framework's control) and, with ``write``, store ``metrics.json`` per run and the suite's table
    (``chaosbench report``; a suite being run computes each run's metrics once, when it ends)."""
    runs = SuiteDir(suite_dir).runs()
    controls = controls_of(runs)
    control_events = {fw: read_events(r.events) for fw, r in controls.items()}
    out = []
    for run in runs:
        fw = run.read_config()["scenario"]["framework"]
        ctl = controls.get(fw)
        out.append(run_metrics(run, ctl, write, control_events.get(fw) if ctl is not None else None))
    if write and out:
        write_table(Path(suite_dir), out)
    return out


def to_frame(metrics: list[RunMetrics]) -> Any:
    import pandas as pd

    rows = []
    for m in metrics:
        d = m.to_dict()
        for k in ("missing", "notes", "versions", "timeouts", "slo_failures", "timeout_problems", "faults"):
            d[k] = json.dumps(d[k], sort_keys=True, default=str)
        rows.append(d)
    return pd.DataFrame(rows)


def write_table(suite_dir: Path, metrics: list[RunMetrics]) -> None:
    write_results(suite_dir, to_frame(metrics))


# ------------------------------------------------------------------------------------------- the table on disk
RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"


def load_results(suite_dir: str | Path) -> pd.DataFrame:
    """Read ``results.parquet`` from ``suite_dir``, or ``results.csv`` when there is no parquet file.

    Raises :class:`~chaosbench.errors.ResultsError` when neither exists.
    """
    import pandas as pd

    suite_dir = Path(suite_dir)
    parquet = suite_dir / RESULTS_PARQUET
    csv = suite_dir / RESULTS_CSV
    if parquet.exists():
        return pd.read_parquet(parquet)
    if csv.exists():
        return pd.read_csv(csv)
    raise ResultsError(
        str(suite_dir),
        f"no {RESULTS_PARQUET} or {RESULTS_CSV}",
        message=f"no {RESULTS_PARQUET} or {RESULTS_CSV} in {suite_dir}",
    )


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
    """Write ``results.csv`` and ``results.parquet`` into ``suite_dir``; return ``{"csv": …, "parquet": …}``.
    Each file is replaced whole (written beside it, then renamed): a harness killed meanwhile leaves the old
    table, never a torn one."""
    import pyarrow as pa

    suite_dir = Path(suite_dir)
    suite_dir.mkdir(parents=True, exist_ok=True)
    safe = parquet_safe(df)
    csv = suite_dir / RESULTS_CSV
    parquet = suite_dir / RESULTS_PARQUET
    write_atomic(csv, safe.to_csv(index=False))
    try:
        replace_atomic(parquet, lambda tmp: safe.to_parquet(tmp, index=False, engine="pyarrow"))
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # Last resort, so the table is never lost: every object column as text.
        for col in safe.columns:
            if safe[col].dtype == object:
                safe[col] = safe[col].map(_to_text).astype(object)
        replace_atomic(parquet, lambda tmp: safe.to_parquet(tmp, index=False, engine="pyarrow"))
    return {"csv": csv, "parquet": parquet}
