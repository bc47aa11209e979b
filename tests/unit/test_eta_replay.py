"""The progress's ETA replayed on a real finished suite: ``chaosbench run suites/compare.yaml`` as run on
2026-12-07 (91 runs in the order they ran, every control first, 3222 s of runs on this 2-core machine; each run's
plan entry and wall as ``benchmarks/eta_accuracy.py --save`` wrote them). Issue 27's goal: from 20 % of the runs
on, the ETA within 25 % of the time in fact left. The replay is deterministic: the figures are exact."""

from __future__ import annotations

import json
from pathlib import Path

from chaosbench.progress import PlannedRun, replay_eta

WALLS = Path(__file__).resolve().parents[1] / "fixtures" / "eta" / "compare-2026-12-07.json"


def _runs() -> list[tuple[PlannedRun, float]]:
    rows = json.loads(WALLS.read_text())
    return [(PlannedRun(**{k: v for k, v in r.items() if k != "wall_s"}), float(r["wall_s"])) for r in rows]


def _worst_from(
    runs: list[tuple[PlannedRun, float]], etas: list[tuple[float | None, float]], share: float
) -> float:
    """The largest relative error at 20, 30, ..., 90 % of the runs finished (the benchmark's checkpoints)."""
    worst = 0.0
    for pct in range(int(share * 100), 100, 10):
        k = max(1, round(len(runs) * pct / 100))
        eta, left = etas[k - 1]
        assert eta is not None
        worst = max(worst, abs(eta - left) / left)
    return worst


def test_the_eta_of_the_compare_suite_is_within_a_quarter_from_a_fifth_on() -> None:
    runs = _runs()
    assert len(runs) == 91 and all(p.fault == "control" for p, _ in runs[:7])
    worst = _worst_from(runs, replay_eta(runs), 0.2)
    assert round(worst, 3) == 0.213  # -21 % at 20 %, -7 to -19 % from 30 to 90 % (a fault's extra seconds)
    assert worst <= 0.25


def test_the_mean_of_the_runs_so_far_was_not() -> None:
    """The estimate before a plan (the mean of the finished runs) on the same walls: the test above can fail."""
    runs = _runs()
    assert round(_worst_from(runs, replay_eta(runs, with_plan=False), 0.2), 3) == 0.729
