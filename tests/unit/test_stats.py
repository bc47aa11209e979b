"""Statistics and the fleet projection on inputs with known answers."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

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
from chaosbench.analysis.stats import (
    Estimate,
    RankTest,
    mann_whitney,
    median_ci,
    wilson,
    young_daly_interval_s,
)


def test_median_ci_brackets_the_median_and_is_seeded() -> None:
    vals = [1.0, 2.0, 3.0, 4.0, 100.0]
    est = median_ci(vals, seed=1)
    assert est.median == 3.0 and est.lo is not None and est.hi is not None
    assert est.lo <= 3.0 <= est.hi and est.lo >= 1.0 and est.hi <= 100.0
    assert median_ci(vals, seed=1) == est  # a report rendered twice shows the same interval


def test_median_ci_known_bootstrap_quantiles() -> None:
    """The bootstrap distribution of the median of 2k+1 distinct values is known: the resampled median is at
    most the k'th smallest x_(j) when at least k+1 of the 2k+1 draws are, P = P(Binomial(2k+1, j/(2k+1)) > k).
    For 1..11: P(median <= 2) = 0.0072, P(median <= 3) = 0.0512, P(median <= 4) = 0.1727 (and symmetrically),
    so the 2.5 % and 97.5 % points are 3 and 9, the 10 % and 90 % points 4 and 8, far enough from the steps
    that 2000 resamples land on them for any seed."""
    vals = [float(v) for v in range(1, 12)]
    for seed in (0, 1, 2):
        assert median_ci(vals, seed=seed) == Estimate(6.0, 3.0, 9.0, 11, 0.95)
        assert median_ci(vals, confidence=0.8, seed=seed) == Estimate(6.0, 4.0, 8.0, 11, 0.8)
    # two values: the resampled median is 1, 1.5 or 2 with probabilities 1/4, 1/2, 1/4
    assert median_ci([1.0, 2.0]) == Estimate(1.5, 1.0, 2.0, 2)


def test_median_ci_degenerate_inputs() -> None:
    nan = float("nan")
    assert median_ci([]) == Estimate(None, None, None, 0)
    assert median_ci([None, nan]) == Estimate(None, None, None, 0)  # type: ignore[list-item]
    assert median_ci([7.0]) == Estimate(7.0, None, None, 1)
    assert median_ci([None, 7.0, nan]) == Estimate(7.0, None, None, 1)  # type: ignore[list-item]
    assert median_ci([5.0, 5.0, 5.0]) == Estimate(5.0, 5.0, 5.0, 3)
    assert median_ci([4.0, None, 2.0]) == Estimate(3.0, 2.0, 4.0, 2)  # type: ignore[list-item]


def test_wilson_interval() -> None:
    p, lo, hi = wilson(2, 2)
    assert p == 1.0 and hi == 1.0 and lo == pytest.approx(0.342, abs=1e-3)  # the textbook value for 2/2
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3
    for k, n, want_lo, want_hi in (
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ):
        p, lo, hi = wilson(k, n)
        assert (
            p == k / n and lo == pytest.approx(want_lo, abs=1e-4) and hi == pytest.approx(want_hi, abs=1e-4)
        )
    assert wilson(0, 5)[1] == 0.0 and wilson(5, 5)[2] == 1.0
    assert wilson(0, 0) == (None, None, None)
    assert wilson(3, -1) == (None, None, None)


def test_mann_whitney_exact() -> None:
    t = mann_whitney([1, 2, 3], [4, 5, 6])
    assert t is not None and t.exact and t.u == 0.0
    assert t.p_less == pytest.approx(1 / 20) and t.p_two_sided == pytest.approx(0.1)  # 1 split of C(6,3) = 20
    assert t.p_greater == pytest.approx(1.0)
    t = mann_whitney([1, 2, 3, 4], [5, 6, 7, 8])
    assert t is not None and t.exact and t.p_less == pytest.approx(1 / 70)
    t = mann_whitney([5, 6, 7, 8], [1, 2, 3, 4])
    assert (
        t is not None
        and t.u == 16.0
        and t.p_greater == pytest.approx(1 / 70)
        and t.p_less == pytest.approx(1.0)
    )


def test_mann_whitney_exact_with_ties() -> None:
    """[1, 2] against [2, 3]: the six splits of the pooled 1, 2, 2, 3 give U = 0.5 ({1, 2} twice), 2 ({1, 3},
    {2, 2}), 3.5 ({2, 3} twice). Observed U = 0.5: P(U <= 0.5) = 2/6, P(U >= 0.5) = 1; the test does not
    pretend the ties away (scipy's untied exact distribution would give 1/6)."""
    t = mann_whitney([1.0, 2.0], [2.0, 3.0])
    assert t is not None and t.exact and t.u == 0.5
    assert t.p_less == pytest.approx(1 / 3) and t.p_greater == pytest.approx(1.0)
    assert t.p_two_sided == pytest.approx(2 / 3)


def test_mann_whitney_normal_approximation() -> None:
    """Past ``exact_limit``: the normal approximation with continuity correction and, with ties, the tie
    correction of the variance, computed here by hand."""
    nd = NormalDist()
    # 1..25 against 26..50: U = 0, mean 312.5, variance 25 * 25 * 51 / 12
    t = mann_whitney(list(range(1, 26)), list(range(26, 51)))
    assert t is not None and not t.exact and t.u == 0.0
    assert t.p_less == pytest.approx(nd.cdf((0 - 312.5 + 0.5) / math.sqrt(25 * 25 * 51 / 12)), rel=1e-6)
    assert t.p_two_sided == pytest.approx(2 * t.p_less)
    # 20 ones and 5 twos against 5 ones and 20 twos: U = 25 + 0.5 * (100 + 100) = 125; two tie groups of 25
    t = mann_whitney([1.0] * 20 + [2.0] * 5, [1.0] * 5 + [2.0] * 20)
    var = 25 * 25 / 12 * (51 - 2 * (25**3 - 25) / (50 * 49))
    assert t is not None and not t.exact and t.u == 125.0
    assert t.p_less == pytest.approx(nd.cdf((125 - 312.5 + 0.5) / math.sqrt(var)), rel=1e-6)
    assert t.p_greater == pytest.approx(1 - nd.cdf((125 - 312.5 - 0.5) / math.sqrt(var)), rel=1e-6)
    rng = random.Random(0)
    a = [rng.gauss(0, 1) for _ in range(30)]
    b = [rng.gauss(1.5, 1) for _ in range(30)]
    big = mann_whitney(a, b)
    assert big is not None and not big.exact and big.p_less < 1e-4


def test_mann_whitney_degenerate_inputs() -> None:
    assert mann_whitney([], [1.0]) is None and mann_whitney([1.0], []) is None
    assert mann_whitney([None], [1.0]) is None  # type: ignore[list-item]
    # None and NaN are dropped, not ranked
    assert mann_whitney([None, 1.0], [2.0]) == mann_whitney([1.0], [2.0])  # type: ignore[list-item]
    assert mann_whitney([float("nan"), 1.0], [2.0, 3.0]) == mann_whitney([1.0], [2.0, 3.0])
    # one observation each: U is 0 or 1 with probability 1/2
    assert mann_whitney([1.0], [2.0]) == RankTest(0.0, 1.0, 0.5, 1.0, True)
    # all values equal: no evidence either way
    assert mann_whitney([1.0], [1.0]) == RankTest(0.5, 1.0, 1.0, 1.0, True)
    assert mann_whitney([1.0, 1.0], [1.0, 1.0]) == RankTest(2.0, 1.0, 1.0, 1.0, True)
    assert mann_whitney([3.0] * 15, [3.0] * 15) == RankTest(112.5, 1.0, 1.0, 1.0, False)
    # a one-observation sample with ties (scipy's permutation test refuses it): the three splits of 1, 1, 2 set
    # apart a 1 (U = 0.5, twice) or the 2 (U = 2); observed U = 0.5
    one = mann_whitney([1.0], [1.0, 2.0])
    assert one is not None and one.exact and one.u == 0.5
    assert one.p_greater == 1.0 and one.p_less == pytest.approx(2 / 3) and one.p_two_sided == 1.0
    # the other side: [1, 2] against [2] has U = 0 + 0.5; setting apart a 2 gives 0.5 (twice), the 1 gives 2
    other = mann_whitney([1.0, 2.0], [2.0])
    assert other is not None and other.exact and other.u == 0.5
    assert other.p_greater == 1.0 and other.p_less == pytest.approx(2 / 3)


def test_young_daly() -> None:
    c, m = 10.0, 3600.0
    young = math.sqrt(2 * c * m)
    assert young_daly_interval_s(c, m) == pytest.approx(
        young * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c
    )
    assert young_daly_interval_s(100.0, 40.0) == 40.0  # C >= 2M: checkpoint every MTBF
    with pytest.raises(ValueError):
        young_daly_interval_s(0, 1)


def test_fleet_scale_and_projection() -> None:
    # the 419 unexpected interruptions the fault mix counts too (466 with the 47 planned: case 11 of issue 24)
    assert LLAMA3.interruptions_per_day == pytest.approx(419 / 54, rel=1e-9)
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
        rows.append(
            {
                "framework": fw,
                "control": True,
                "outcome": "completed",
                "clean": True,
                "checkpoint_save_s": 0.02 if fw == "fast" else 0.001,
            }
        )
        for _ in range(3):
            rows.append(
                {
                    "framework": fw,
                    "control": False,
                    "outcome": "recovered",
                    "fault_class": "crash",
                    "time_to_resume_s": resume,
                    "rollback": True,
                    "lost_work_s": 1.0,
                }
            )
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
    rows = [
        {
            "framework": "nvrx",
            "control": True,
            "outcome": "completed",
            "clean": False,
            "verdict": "completed, but not clean: 3 restarts and 3 detections without a fault",
        },
        {
            "framework": "nvrx",
            "control": False,
            "outcome": "recovered",
            "fault_class": "crash",
            "time_to_resume_s": 1.0,
            "rollback": True,
        },
    ]
    from chaosbench.report.analysis import projection_table, stats_table

    table = projection_table(rows, LLAMA3, None)
    assert table.rows[0][0] == "—" and "unusable" in str(table.rows[0][2])
    assert "unusable" in str(stats_table(rows).rows[0][2])


def test_fault_classes() -> None:
    # legacy events (no declared fault_class): read by their injector's name as before
    assert fault_class({"injector": "kill", "params": {"signal": "SIGKILL"}}) == "crash"
    assert fault_class({"injector": "kill", "params": {"signal": "SIGSTOP"}}) == "hang"
    assert fault_class({"injector": "local-node-kill"}) == "node"
    assert fault_class({"injector": "straggler"}) is None
    # a declared class is the event's, whatever its injector is called
    assert fault_class({"injector": "kill", "fault_class": None}) is None
    assert fault_class({"injector": "my-plugin", "fault_class": "node"}) == "node"
    assert sum(LLAMA3_MIX.weights.values()) == 419


def test_holm_adjusted_p_values() -> None:
    from chaosbench.analysis.stats import holm

    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, then kept non-decreasing: 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_exact_rank_test_without_ties_matches_scipy_and_its_smallest_p() -> None:
    from scipy import stats as scipy_stats

    from chaosbench.analysis.stats import rank_min_p

    rng = random.Random(3)
    for _ in range(20):
        a = [rng.random() for _ in range(rng.randint(1, 6))]
        b = [rng.random() for _ in range(rng.randint(2, 6))]
        t = mann_whitney(a, b)
        assert t is not None
        ref = scipy_stats.mannwhitneyu(a, b, alternative="greater", method="exact")
        assert (t.u, t.p_greater) == (pytest.approx(float(ref.statistic)), pytest.approx(float(ref.pvalue)))
        assert rank_min_p(b, a) == pytest.approx(1 / math.comb(len(a) + len(b), len(a)))
    assert rank_min_p([1.0, 1.0], [1.0, 1.0]) == 1.0
