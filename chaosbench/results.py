"""From run directories to the results table: recomputable at any time from the timelines alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaosbench.metrics import RunMetrics, compute_metrics
from chaosbench.slo import evaluate
from chaosbench.timeline import read_events


def find_runs(suite_dir: Path) -> list[Path]:
    """Run directories below a suite directory (those with a config.json), in a stable order."""
    return sorted(p.parent for p in Path(suite_dir).glob("*/*/config.json"))


def _config(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "config.json").read_text())


def collect(suite_dir: Path, write: bool = True) -> list[RunMetrics]:
    """Compute metrics of every run (each fault run against its framework's control) and, with ``write``,
    store ``metrics.json`` per run and ``results.csv``/``results.parquet`` for the suite."""
    runs = find_runs(suite_dir)
    configs = {r: _config(r) for r in runs}
    controls: dict[str, Path] = {}
    for r, cfg in configs.items():
        sc = cfg["scenario"]
        if sc.get("control"):
            controls[sc["framework"]] = r
    cache: dict[Path, list[Any]] = {}

    def events(r: Path) -> list[Any]:
        if r not in cache:
            cache[r] = read_events(r / "events.jsonl")
        return cache[r]

    out = []
    for r, cfg in configs.items():
        sc = cfg["scenario"]
        ctl = controls.get(sc["framework"])
        m = compute_metrics(
            events(r),
            control=events(ctl) if ctl is not None and ctl != r else None,
            total_steps=cfg.get("total_steps"),
        )
        m.run_dir = str(r)
        m.suite, m.scenario, m.framework = sc["suite"], sc["scenario"], sc["framework"]
        m.fault, m.repeat, m.control = sc["fault"], sc["repeat"], sc["control"]
        checks = evaluate(m, sc.get("slos") or {})
        m.slo_ok = all(c.ok for c in checks) if checks else None
        m.slo_failures = [c.describe() for c in checks if not c.ok]
        if write:
            (r / "metrics.json").write_text(json.dumps(m.to_dict(), indent=2, default=str))
        out.append(m)
    if write and out:
        write_table(Path(suite_dir), out)
    return out


def to_frame(metrics: list[RunMetrics]) -> Any:
    import pandas as pd

    rows = []
    for m in metrics:
        d = m.to_dict()
        for k in ("missing", "versions", "timeouts", "slo_failures", "timeout_problems"):
            d[k] = json.dumps(d[k], sort_keys=True, default=str)
        rows.append(d)
    return pd.DataFrame(rows)


def write_table(suite_dir: Path, metrics: list[RunMetrics]) -> None:
    from chaosbench.report import write_results

    write_results(suite_dir, to_frame(metrics))
