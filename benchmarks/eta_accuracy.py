"""How right the progress's ETA is, replayed on a real finished result set. Prints figures; asserts nothing.

Reads every run directory of a suite's results (its ``events.jsonl``: ``run_start`` and ``run_end``; its
``config.json``: the deadline), orders the runs as they ran, and takes each run's wall as the time from its
``run_start`` to the next run's (the last: to its own ``run_end``), so the harness's work between runs counts.
It then replays them, in that order and on a fake clock, through :class:`chaosbench.progress.SuiteProgress`
twice: as it was (no plan: the mean of the finished runs for every run left) and with the suite's plan (each
run left estimated from its cell, framework and fault, and the floor its timeouts put on its cost, as its
``detection_prediction`` events recorded it: :func:`chaosbench.progress.estimate_run_s`). At 10, 20,
..., 90 % of the runs finished it prints each ETA against the time that was in fact left, and its error::

    python benchmarks/eta_accuracy.py reports/compare    # a suite directory (the one holding suite.json)
    python benchmarks/eta_accuracy.py reports/compare --controls-first

``--controls-first`` replays the same walls with every control first (the order ``--jobs`` runs them in): an
order the runs did not run in, taking each run's wall as independent of its place. A result set of ``--jobs 1``
only: with several runs at once the walls overlap and the replay does not hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from chaosbench.progress import PlannedRun, replay_eta
from chaosbench.runner import RUN_OVERHEAD_S
from chaosbench.timeline import read_events


@dataclass
class Replayed:
    planned: PlannedRun
    start_ns: int
    wall_s: float


def runs_of(suite_dir: Path) -> list[Replayed]:
    """The suite's runs in the order they started, each with its wall (to the next run's start)."""
    found = []
    for events_path in sorted(suite_dir.glob("*/*/events.jsonl")):
        events = read_events(events_path)
        start = next((e for e in events if e.kind == "run_start"), None)
        end = next((e for e in reversed(events) if e.kind == "run_end"), None)
        if start is None or end is None:
            print(f"{events_path}: no run_start or run_end, left out", file=sys.stderr)
            continue
        config = json.loads((events_path.parent / "config.json").read_text())
        deadline_s = float(config["scenario"]["deadline_s"])
        fault = start.get("fault") or "control"
        label = f"{start.get('scenario')} #{start.get('repeat')}"
        # the floor the plan gets from the outlook, as the run's own detection_prediction events recorded it
        floor_s = sum(
            float(f)
            for e in events
            if e.kind == "detection_prediction"
            and (f := e.get("resume_floor_s") if e.get("resume_floor_s") is not None else e.get("expected_s"))
            is not None
        )
        found.append(
            (
                start.t_ns,
                end.t_ns,
                PlannedRun(
                    0,
                    label,
                    str(start.get("framework")),
                    str(fault),
                    deadline_s + RUN_OVERHEAD_S,
                    floor_s,
                    deadline_s,
                ),
            )
        )
    found.sort(key=lambda f: f[0])
    out = []
    for i, (start_ns, end_ns, p) in enumerate(found):
        next_ns = found[i + 1][0] if i + 1 < len(found) else end_ns
        planned = PlannedRun(i + 1, p.label, p.framework, p.fault, p.bound_s, p.floor_s, p.deadline_s)
        out.append(Replayed(planned, start_ns, (next_ns - start_ns) / 1e9))
    return out


def replay(runs: list[Replayed], with_plan: bool) -> dict[int, float | None]:
    """The ETA (seconds) right after each run finished: finished count -> ETA."""
    etas = replay_eta([(r.planned, r.wall_s) for r in runs], with_plan)
    return {i + 1: eta for i, (eta, _) in enumerate(etas)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite_dir", type=Path, help="a suite's result directory (holding its run directories)")
    ap.add_argument("--controls-first", action="store_true", help="replay every control first (see above)")
    ap.add_argument(
        "--save",
        type=Path,
        metavar="FILE",
        help="also write the runs as replayed (plan entries and walls) to FILE (JSON), the form "
        "tests/unit/test_eta_replay.py reads",
    )
    args = ap.parse_args()
    runs = runs_of(args.suite_dir)
    if args.controls_first:
        runs = sorted(runs, key=lambda r: r.planned.fault != "control")  # stable: otherwise in the order run
        for i, r in enumerate(runs):
            r.planned = replace(r.planned, index=i + 1)
    if len(runs) < 2:
        sys.exit(f"{args.suite_dir}: {len(runs)} runs with a timeline; need 2 or more")
    total_s = sum(r.wall_s for r in runs)
    if args.save:
        args.save.write_text(
            json.dumps([{**asdict(r.planned), "wall_s": round(r.wall_s, 3)} for r in runs], indent=1)
        )
    old, new = replay(runs, with_plan=False), replay(runs, with_plan=True)
    order = ", every control first" if args.controls_first else ""
    print(f"{args.suite_dir}: {len(runs)} runs, {total_s:.0f} s of runs{order}")
    print(
        f"{'done':>5} {'runs':>5} {'left_s':>8} {'old_eta_s':>10} {'old_err':>8} {'new_eta_s':>10} {'new_err':>8}"
    )
    worst = {"old": 0.0, "new": 0.0}
    for pct in range(10, 100, 10):
        k = max(1, round(len(runs) * pct / 100))
        left_s = sum(r.wall_s for r in runs[k:])
        cells = [f"{pct:>4}% {k:>5} {left_s:>8.0f}"]
        for name, etas in (("old", old), ("new", new)):
            eta = etas[k]
            if eta is None or left_s <= 0:
                cells.append(f"{'-':>10} {'-':>8}")
                continue
            err = (eta - left_s) / left_s
            if pct >= 20:
                worst[name] = max(worst[name], abs(err))
            cells.append(f"{eta:>10.0f} {err:>+8.0%}")
        print(" ".join(cells))
    print(f"largest error from 20 % on: old {worst['old']:.0%}, new {worst['new']:.0%} (goal: within 25 %)")


if __name__ == "__main__":
    main()
