"""Statistics over repeats: bootstrap confidence intervals, success rates, rank tests.

Standard library only (plus the caller's lists of floats), deterministic for a seed.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """A median with a bootstrap percentile confidence interval (None bounds when n < 2)."""

    median: float | None
    lo: float | None
    hi: float | None
    n: int
    confidence: float = 0.95


def median_ci(values: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> Estimate:
    """Median of ``values`` and a percentile bootstrap interval for it (resampling with replacement)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return Estimate(None, None, None, 0, confidence)
    med = statistics.median(vals)
    if len(vals) < 2:
        return Estimate(med, None, None, 1, confidence)
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(n_boot))
    alpha = (1 - confidence) / 2
    lo = boots[max(0, int(math.floor(alpha * n_boot)))]
    hi = boots[min(n_boot - 1, int(math.ceil((1 - alpha) * n_boot)) - 1)]
    return Estimate(med, lo, hi, len(vals), confidence)


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Success rate and its Wilson score interval."""
    if n <= 0:
        return None, None, None
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)


def _z(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def _u_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """Mann-Whitney U of ``a`` (ties count one half)."""
    u = 0.0
    for x in a:
        for y in b:
            u += 1.0 if x > y else (0.5 if x == y else 0.0)
    return u


@dataclass(frozen=True)
class RankTest:
    """Mann-Whitney U test of ``a`` against ``b``. ``p_greater``: one-sided p that a tends to exceed b;
    ``p_two_sided``; ``exact`` when computed by enumerating every split of the pooled values."""

    u: float
    p_greater: float
    p_less: float
    p_two_sided: float
    exact: bool


def mann_whitney(a: Sequence[float], b: Sequence[float], exact_limit: int = 20) -> RankTest | None:
    """Rank test; exact permutation distribution when len(a)+len(b) <= ``exact_limit``, else the normal
    approximation with tie correction. None when either sample is empty."""
    a = [float(x) for x in a]
    b = [float(x) for x in b]
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return None
    u = _u_statistic(a, b)
    if n1 + n2 <= exact_limit and math.comb(n1 + n2, n1) <= 200_000:
        pooled = a + b
        ge = le = total = 0
        for idx in itertools.combinations(range(n1 + n2), n1):
            chosen = set(idx)
            ua = _u_statistic([pooled[i] for i in idx], [pooled[i] for i in range(n1 + n2) if i not in chosen])
            total += 1
            ge += ua >= u - 1e-12
            le += ua <= u + 1e-12
        pg, pl = ge / total, le / total
        return RankTest(u, pg, pl, min(1.0, 2 * min(pg, pl)), True)
    mean = n1 * n2 / 2
    pooled = sorted(a + b)
    ties = [len(list(g)) for _, g in itertools.groupby(pooled)]
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - sum(t**3 - t for t in ties) / (n * (n - 1)))
    if var <= 0:
        return RankTest(u, 1.0, 1.0, 1.0, False)
    nd = statistics.NormalDist()
    z_hi = (u - mean - 0.5) / math.sqrt(var)
    z_lo = (u - mean + 0.5) / math.sqrt(var)
    pg, pl = 1 - nd.cdf(z_hi), nd.cdf(z_lo)
    return RankTest(u, pg, pl, min(1.0, 2 * min(pg, pl)), False)


def young_daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Optimal checkpoint interval: Young's sqrt(2 C M), with Daly's higher-order correction
    sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + C / 18M) - C when C < 2M, else M."""
    c, m = checkpoint_cost_s, mtbf_s
    if c <= 0 or m <= 0:
        raise ValueError("checkpoint cost and MTBF must be positive")
    if c >= 2 * m:
        return m
    base = math.sqrt(2 * c * m)
    return base * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c
