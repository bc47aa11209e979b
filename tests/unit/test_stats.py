"""Statistics and the fleet projection on inputs with known answers."""

from __future__ import annotations

import math
import random

import pytest

from chaosbench.fleet import LLAMA3, FleetScale, RecoveryCosts, analytic_goodput, project, simulate
from chaosbench.stats import mann_whitney, median_ci, wilson, young_daly_interval_s


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
    costs = RecoveryCosts("x", recovery_s=[60.0, 60.0], checkpoint_cost_s=5.0, checkpoint_interval_s=600.0)
    g = analytic_goodput(60.0, 5.0, 600.0, scale.job_mtbf_s)
    assert g == pytest.approx(1 - 5 / 605 - (60 + 300) / 36_000)
    p = project(costs, scale, horizon_days=60, trials=60, seed=3)
    # the simulation agrees with the first-order model in this regime (failures rare against the interval)
    assert p.goodput_mc_mean == pytest.approx(g, abs=0.01)
    assert p.goodput_mc_p5 <= p.goodput_mc_mean <= p.goodput_mc_p95
    assert p.goodput_analytic_at_optimum >= p.goodput_analytic - 1e-9
    # no failures at all: only the checkpoint overhead remains
    never = simulate(costs, mtbf_s=1e12, horizon_s=86_400, rng=random.Random(1))
    assert never == pytest.approx(600 / 605, abs=0.01)
