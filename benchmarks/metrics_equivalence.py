"""Do the run metrics of the working tree equal those of a git revision, on every timeline at hand, and which is
faster? Prints figures; exits 1 when any metric differs.

Loads ``chaosbench/analysis/metrics.py`` as of ``--rev`` beside the working tree's, then computes every run found
below the given roots (each ``events.jsonl``) with both: with its ``config.json``, against its framework's
control run in the same suite directory and with the scenario's ``total_steps``; every such run once more
without a control, so the no-control paths are compared too. Compares every field of RunMetrics (the
serialised dict, key order included) and times ``compute_metrics`` alone, best of ``--repeat`` rounds. For a
refactoring of the metrics, whose values must not change. Usage::

    python benchmarks/metrics_equivalence.py [--rev HEAD] [--repeat 3] [ROOT ...]   # default ROOT: reports/
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaosbench.analysis import metrics as tree_metrics
from chaosbench.timeline import Event, read_events

REPO = Path(__file__).resolve().parents[1]

Case = tuple[str, list[Event], list[Event] | None, int | None]  # label, events, control's events, total_steps


def metrics_at(rev: str) -> Any:
    """The metrics module as of ``rev`` (importing the rest of chaosbench from the working tree)."""
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:chaosbench/analysis/metrics.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="cb-metrics-") as tmp:
        path = Path(tmp) / "metrics_at_rev.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("metrics_at_rev", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["metrics_at_rev"] = mod  # dataclasses look their module up while the class is built
        spec.loader.exec_module(mod)
    return mod


def _control_of(run: Path, scenario: dict[str, Any]) -> list[Event] | None:
    for cfg in sorted(run.parent.parent.glob("*/*/config.json")):
        other = json.loads(cfg.read_text()).get("scenario") or {}
        if other.get("control") and other.get("framework") == scenario.get("framework"):
            if (cfg.parent / "events.jsonl").exists():
                return read_events(cfg.parent / "events.jsonl")
    return None


def cases(roots: list[Path]) -> list[Case]:
    """Every run below the roots, with its control where it has one, and once more without."""
    out: list[Case] = []
    for ev_path in sorted({p.resolve() for r in roots for p in r.rglob("events.jsonl")}):
        run = ev_path.parent
        try:
            events = read_events(ev_path)
        except (OSError, ValueError, KeyError) as e:
            print(f"skipped, unreadable: {ev_path}: {e}")
            continue
        control, total_steps = None, None
        if (run / "config.json").exists():
            cfg = json.loads((run / "config.json").read_text())
            total_steps = cfg.get("total_steps")
            scenario = cfg.get("scenario") or {}
            if not scenario.get("control"):
                control = _control_of(run, scenario)
        out.append((str(run), events, control, total_steps))
        if control is not None or total_steps is not None:
            out.append((f"{run} (without control and total_steps)", events, None, None))
    return out


def compute_all(mod: Any, todo: list[Case]) -> tuple[list[Any], float]:
    """Every case's RunMetrics, and the seconds computing them took (serialising them is not counted)."""
    t = time.perf_counter()
    out = [
        mod.compute_metrics(events, control=control, total_steps=steps) for _, events, control, steps in todo
    ]
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="*", type=Path, default=[REPO / "reports"])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    versions = {args.rev: metrics_at(args.rev), "working tree": tree_metrics}
    todo = cases(args.roots)
    if not todo:
        print("no events.jsonl below", ", ".join(map(str, args.roots)))
        return 0
    seconds: dict[str, list[float]] = {name: [] for name in versions}
    computed: dict[str, list[str]] = {}
    for _ in range(args.repeat):
        for name, mod in versions.items():
            metrics, took = compute_all(mod, todo)
            seconds[name].append(took)
            computed[name] = [json.dumps(m.to_dict(), default=str) for m in metrics]
    old, new = computed[args.rev], computed["working tree"]
    differ = 0
    for (label, *_), a, b in zip(todo, old, new, strict=True):
        if a == b:
            continue
        differ += 1
        da, db = json.loads(a), json.loads(b)
        fields = [k for k in da if da[k] != db.get(k)] or ["(the order of the fields)"]
        print(f"differs: {label}: {', '.join(fields)}")
        for k in fields[:5]:
            print(f"    {k}: {da.get(k)!r} -> {db.get(k)!r}")
    runs = len({label.split(" (without", 1)[0] for label, *_ in todo})
    n_events = sum(len(events) for _, events, *_ in todo)
    n_fields = len(json.loads(old[0]))
    print(
        f"{runs} runs, {len(todo)} computations ({n_events} events), {n_fields} fields each: {differ} differ"
    )
    print(
        f"compute_metrics for all of them, best of {args.repeat}: "
        + ", ".join(f"{name} {min(s):.3f} s" for name, s in seconds.items())
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
