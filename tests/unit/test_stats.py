"""Statistics and the fleet projection on inputs with known answers."""

from __future__ import annotations

import math
import random

import pytest

from chaosbench.analysis.fleet import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_MANUAL_RECOVERY_S,
    LLAMA3,
    LLAMA3_MIX,
    Assumptions,
    FleetScale,
    RecoveryCosts,
    Sample,
    analytic_goodput,
    costs_from_rows,
    fault_class,
    project,
    simulate,
)
from chaosbench.analysis.stats import mann_whitney, median_ci, wilson, young_daly_interval_s


def test_median_ci_brackets_the_median_and_is_seeded() -> None:
    vals = [1.0, 2.0, 3.0, 4.0, 100.0]
    est = median_ci(vals, seed=1)
    assert est.median == 3.0 and est.lo is not None and est.hi is not None
    assert est.lo <= 3.0 <= est.hi and est.lo >= 1.0 and est.hi <= 100.0
    assert median_ci(vals, seed=1) == est
    assert median_ci([7.0]).lo is None and median_ci([]).median is None


def test_wilson_interval() -> None:
    p, lo, hi = wilson(2, 2)
    assert p == 1.0 and hi == 1.0 and lo == pytest.approx(0.342, abs=1e-3)  # the textbook value for 2/2
    assert wilson(0, 0) == (None, None, None)


def test_mann_whitney_exact_and_normal() -> None:
    t = mann_whitney([1, 2, 3], [4, 5, 6])
    assert t is not None and t.exact
    assert t.p_less == pytest.approx(1 / 20) and t.p_two_sided == pytest.approx(0.1)
    assert t.p_greater == pytest.approx(1.0)
    rng = random.Random(0)
    a = [rng.gauss(0, 1) for _ in range(30)]
    b = [rng.gauss(1.5, 1) for _ in range(30)]
    big = mann_whitney(a, b)
    assert big is not None and not big.exact and big.p_less < 1e-4
    same = mann_whitney([1.0, 1.0], [1.0, 1.0])
    assert same is not None and same.p_two_sided == 1.0


def test_young_daly() -> None:
    c, m = 10.0, 3600.0
    young = math.sqrt(2 * c * m)
    assert young_daly_interval_s(c, m) == pytest.approx(young * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c)
    assert young_daly_interval_s(100.0, 40.0) == 40.0  # C >= 2M: checkpoint every MTBF
    with pytest.raises(ValueError):
        young_daly_interval_s(0, 1)


def test_fleet_scale_and_projection() -> None:
    assert LLAMA3.interruptions_per_day == pytest.approx(466 / 54, rel=1e-9)
    scale = FleetScale(nodes=100, gpus_per_node=8, node_mtbf_h=1000)
    assert scale.job_mtbf_s == pytest.approx(36_000)
    costs = RecoveryCosts("x", {"crash": [Sample(60.0), Sample(60.0)]})
    a = Assumptions(checkpoint_cost_s=5.0, checkpoint_interval_s=600.0)
    g = analytic_goodput(60.0, 5.0, 600.0, scale.job_mtbf_s)
    assert g == pytest.approx(1 - 5 / 605 - (60 + 300) / 36_000)
    p = project(costs, scale, a, horizon_days=60, trials=60, seed=3)
    assert p.goodput_analytic == pytest.approx(g)
    # the simulation agrees with the first-order model in this regime (failures rare against the interval)
    assert p.goodput_mc_mean == pytest.approx(g, abs=0.01)
    assert p.goodput_mc_p5 <= p.goodput_mc_mean <= p.goodput_mc_p95
    # only "crash" was measured: the other classes of the mix are left out and named
    assert p.classes == ["crash"] and set(p.missing_classes) == {"node", "hang", "sdc"}
    assert p.coverage == pytest.approx(318 / 419)
    # no failures at all: only the checkpoint overhead remains
    never = simulate(costs, a, 600.0, mtbf_s=1e12, horizon_s=86_400, rng=random.Random(1))
    assert never == pytest.approx(600 / 605, abs=0.01)
    # default interval: the Young/Daly optimum for the assumed fleet checkpoint cost
    d = project(costs, scale, Assumptions(), trials=5)
    assert d.checkpoint_interval_s == pytest.approx(young_daly_interval_s(DEFAULT_CHECKPOINT_COST_S, 36_000))


def test_fleet_projection_ranks_by_measured_recovery() -> None:
    """Two frameworks whose measured recovery differs are ranked accordingly, whatever their test-scale
    checkpoint settings were (they play no part at fleet scale)."""
    rows = []
    for fw, resume in (("slow", 25.0), ("fast", 5.0)):
        rows.append({"framework": fw, "control": True, "outcome": "completed", "clean": True,
                     "checkpoint_save_s": 0.02 if fw == "fast" else 0.001})
        for _ in range(3):
            rows.append({"framework": fw, "control": False, "outcome": "recovered", "fault_class": "crash",
                         "time_to_resume_s": resume, "rollback": True, "lost_work_s": 1.0})
    from chaosbench.report.analysis import projection_table

    table = projection_table(rows, LLAMA3, None)
    assert [r[1] for r in table.rows] == ["fast", "slow"]
    assert [r[0] for r in table.rows] == ["1", "2"]
    # an unrecovered run costs the (assumed) manual recovery and pushes a framework down
    rows.append({"framework": "fast", "control": False, "outcome": "not_recovered", "fault_class": "crash"})
    by_fw = {c.framework: c for c in costs_from_rows(rows)}
    assert [s.recovery_s for s in by_fw["fast"].samples["crash"]] == [5.0, 5.0, 5.0, None]
    fast = project(by_fw["fast"], LLAMA3, Assumptions(), trials=20)
    assert fast.recovery_s == pytest.approx((3 * 5.0 + DEFAULT_MANUAL_RECOVERY_S) / 4)
    assert fast.unrecovered == pytest.approx(0.25)


def test_fleet_projection_marks_unusable_frameworks() -> None:
    rows = [{"framework": "nvrx", "control": True, "outcome": "completed", "clean": False,
             "verdict": "completed, but not clean: 3 restarts and 3 detections without a fault"},
            {"framework": "nvrx", "control": False, "outcome": "recovered", "fault_class": "crash",
             "time_to_resume_s": 1.0, "rollback": True}]
    from chaosbench.report.analysis import projection_table, stats_table

    table = projection_table(rows, LLAMA3, None)
    assert table.rows[0][0] == "—" and "unusable" in str(table.rows[0][2])
    assert "unusable" in str(stats_table(rows).rows[0][2])


def test_fault_classes() -> None:
    assert fault_class("kill", {"signal": "SIGKILL"}) == "crash"
    assert fault_class("kill", {"signal": "SIGSTOP"}) == "hang"
    assert fault_class("local-node-kill") == "node"
    assert fault_class("straggler") is None
    assert sum(LLAMA3_MIX.weights.values()) == 419
