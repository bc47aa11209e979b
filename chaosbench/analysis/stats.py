"""Statistics over repeats: bootstrap confidence intervals, success rates, rank tests.

Thin wrappers over :mod:`scipy.stats` (``bootstrap``, ``mannwhitneyu``, ``binomtest``) that take the caller's
lists of floats, drop missing values, answer ``None`` instead of raising on samples too small to say anything,
and are deterministic for a seed.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from scipy import stats as scipy_stats


@functools.cache
def _scipy_stats() -> Any:
    """scipy.stats, imported on first use: loading a suite (which names metrics) need not pay its 1.5 s."""
    from scipy import stats

    return stats


@dataclass(frozen=True)
class Estimate:
    """A median with a bootstrap percentile confidence interval (None bounds when n < 2)."""

    median: float | None
    lo: float | None
    hi: float | None
    n: int
    confidence: float = 0.95


def _present(values: Iterable[float | None]) -> list[float]:
    """The values as floats, without None and NaN (a measurement that could not be taken)."""
    return [f for v in values if v is not None and not math.isnan(f := float(v))]


def median_ci(
    values: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> Estimate:
    """Median of ``values`` and a percentile bootstrap interval for it (``scipy.stats.bootstrap``, ``n_boot``
    resamples with replacement drawn from ``numpy.random.default_rng(seed)``: the same values and seed give
    the same interval).

    The percentile method rather than scipy's default BCa: BCa's jackknife acceleration is degenerate for a
    median over a handful of repeats (it returns NaN, with a warning, as soon as the values are all equal or
    few are distinct), and the percentile interval is what the report's captions promise. Its bounds are
    numpy's linearly interpolated percentiles of the bootstrap medians. None and NaN values are dropped; no
    value left gives an empty estimate (n=0), one value a median without bounds (n=1)."""
    vals = _present(values)
    if not vals:
        return Estimate(None, None, None, 0, confidence)
    med = statistics.median(vals)
    if len(vals) < 2:
        return Estimate(med, None, None, 1, confidence)
    res = _scipy_stats().bootstrap(
        (np.asarray(vals),),
        np.median,
        n_resamples=n_boot,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(med, float(ci.low), float(ci.high), len(vals), confidence)


def wilson(
    successes: int, n: int, confidence: float = 0.95
) -> tuple[float | None, float | None, float | None]:
    """Success rate ``successes / n`` and its Wilson score interval without continuity correction
    (``scipy.stats.binomtest(successes, n).proportion_ci(method="wilson")``); ``(None, None, None)`` when
    ``n <= 0``. ValueError when ``successes`` is outside ``[0, n]``."""
    if n <= 0:
        return None, None, None
    ci = _scipy_stats().binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return successes / n, float(ci.low), float(ci.high)


@dataclass(frozen=True)
class RankTest:
    """Mann-Whitney U test of ``a`` against ``b``. ``p_greater``: one-sided p that a tends to exceed b;
    ``p_two_sided``; ``exact`` when computed from the exact distribution of U over every split of the pooled
    values."""

    u: float
    p_greater: float
    p_less: float
    p_two_sided: float
    exact: bool


_EXACT_MAX_SPLITS = 200_000


def mann_whitney(a: Sequence[float], b: Sequence[float], exact_limit: int = 20) -> RankTest | None:
    """Mann-Whitney U of ``a`` against ``b`` (``u`` counts the pairs where a's value exceeds b's, ties one
    half) with ``scipy.stats.mannwhitneyu``. None and NaN values are dropped; None when either sample is then
    empty. ``p_two_sided`` is ``min(1, 2 * min(p_greater, p_less))``.

    Exact when ``len(a) + len(b) <= exact_limit`` (and at most 200,000 splits): without ties scipy's exact
    distribution of U; with ties (repeats often give equal step counts) an exact permutation test over every
    split of the pooled values (``PermutationMethod(n_resamples=inf)``), since scipy's ``method="exact"`` does
    not correct for ties; a one-observation sample, which scipy's permutation test refuses, is enumerated
    through the pooled mid-ranks. Every larger case uses the normal approximation with tie and continuity
    corrections (``exact`` False). All values equal: no evidence either way, every p is 1."""
    xs, ys = _present(a), _present(b)
    n1, n2 = len(xs), len(ys)
    if not n1 or not n2:
        return None
    pooled = xs + ys
    small = n1 + n2 <= exact_limit and math.comb(n1 + n2, n1) <= _EXACT_MAX_SPLITS
    distinct = len(set(pooled))
    if distinct == 1:
        # every split gives the same U (all pairs tie); the normal approximation would divide by zero
        return RankTest(n1 * n2 / 2, 1.0, 1.0, 1.0, small)
    ties = distinct < len(pooled)
    method: str | scipy_stats.PermutationMethod = "asymptotic"
    if small and not ties:
        # without ties the exact p depends only on U and the sample sizes: computed once per (n1, n2, U)
        u = float(sum(1 for x in xs for y in ys if x > y))
        pg, pl = _exact_no_ties(n1, n2, u, tuple(xs), tuple(ys))
        return RankTest(u, pg, pl, min(1.0, 2 * min(pg, pl)), True)
    elif small and min(n1, n2) == 1:
        return _one_observation_test(xs, ys)
    elif small:
        method = _scipy_stats().PermutationMethod(n_resamples=np.inf)
    greater = _scipy_stats().mannwhitneyu(xs, ys, alternative="greater", method=method)
    less = _scipy_stats().mannwhitneyu(xs, ys, alternative="less", method=method)
    pg, pl = float(greater.pvalue), float(less.pvalue)
    return RankTest(float(greater.statistic), pg, pl, min(1.0, 2 * min(pg, pl)), method != "asymptotic")


_exact_cache: dict[tuple[int, int, float], tuple[float, float]] = {}


def _exact_no_ties(
    n1: int, n2: int, u: float, xs: tuple[float, ...], ys: tuple[float, ...]
) -> tuple[float, float]:
    """scipy's exact one-sided p-values (greater, less) for samples without ties, cached by ``(n1, n2, U)``: any
    samples of these sizes with this U have these p-values (the exact null distribution of U)."""
    key = (n1, n2, u)
    if key not in _exact_cache:
        greater = _scipy_stats().mannwhitneyu(xs, ys, alternative="greater", method="exact")
        less = _scipy_stats().mannwhitneyu(xs, ys, alternative="less", method="exact")
        assert float(greater.statistic) == u
        _exact_cache[key] = (float(greater.pvalue), float(less.pvalue))
    return _exact_cache[key]


def _one_observation_test(xs: list[float], ys: list[float]) -> RankTest:
    """The exact test, with ties, when one sample has a single observation (scipy's permutation test needs two
    per sample): each split sets one of the pooled values apart, so U is that value's mid-rank among the pooled
    values (``scipy.stats.rankdata``) minus one when it is ``xs``'s, ``len(xs)`` minus that when it is
    ``ys``'s."""
    ranks = _scipy_stats().rankdata(xs + ys)
    u_null = ranks - 1 if len(xs) == 1 else len(xs) - (ranks - 1)
    u = float(u_null[0] if len(xs) == 1 else u_null[-1])
    pg, pl = float(np.mean(u_null >= u)), float(np.mean(u_null <= u))
    return RankTest(u, pg, pl, min(1.0, 2 * min(pg, pl)), True)


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


def median_difference_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> Estimate:
    """median(a) - median(b) and a percentile bootstrap interval for it (each sample resampled on its own,
    ``scipy.stats.bootstrap`` with ``paired=False``; deterministic for a seed). None and NaN values are dropped;
    bounds are None when either sample has fewer than two values (``n`` is the smaller sample's size)."""
    xs, ys = _present(a), _present(b)
    n = min(len(xs), len(ys))
    if not xs or not ys:
        return Estimate(None, None, None, n, confidence)
    diff = statistics.median(xs) - statistics.median(ys)
    if n < 2:
        return Estimate(diff, None, None, n, confidence)

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(x, axis=axis) - np.median(y, axis=axis)

    res = _scipy_stats().bootstrap(
        (np.asarray(xs), np.asarray(ys)),
        stat,
        n_resamples=n_boot,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(diff, float(ci.low), float(ci.high), n, confidence)


@dataclass(frozen=True)
class ShareTest:
    """Fisher's exact test, one-sided, that B's share of good runs is lower than A's (``p``), and the smallest
    p any table with the same margins could give (``p_min``: B good in as few runs as the pooled good count
    allows). Conditional on the margins (the pooled good count), as Fisher's test is: a share that is the same
    in every run of both sets (3/3 and 3/3) has ``p_min`` 1, so it cannot be a finding at any level."""

    p: float
    p_min: float


@functools.lru_cache(maxsize=4096)
def fisher_worse(good_a: int, n_a: int, good_b: int, n_b: int) -> ShareTest:
    """One-sided Fisher's exact test that B's rate of good runs (``good_b`` of ``n_b``) is lower than A's
    (``good_a`` of ``n_a``): ``scipy.stats.fisher_exact([[good_a, n_a - good_a], [good_b, n_b - good_b]],
    alternative="greater")``, and the smallest p the margins allow (:class:`ShareTest`). ValueError when a count
    is outside ``[0, n]`` or a side has no run."""
    if n_a <= 0 or n_b <= 0 or not (0 <= good_a <= n_a and 0 <= good_b <= n_b):
        raise ValueError(f"bad counts {good_a}/{n_a}, {good_b}/{n_b}")
    table = [[good_a, n_a - good_a], [good_b, n_b - good_b]]
    p = float(_scipy_stats().fisher_exact(table, alternative="greater").pvalue)
    pooled = good_a + good_b
    # the most extreme table with these margins: A holds as many of the good runs as it can
    p_min = float(_scipy_stats().hypergeom.pmf(min(n_a, pooled), n_a + n_b, pooled, n_a))
    return ShareTest(min(1.0, p), min(1.0, p_min))


def rank_min_p(a: Sequence[float], b: Sequence[float], b_greater: bool = True) -> float:
    """The smallest one-sided p (b greater than a, or less with ``b_greater`` False) that :func:`mann_whitney`
    can give for these pooled values split into samples of these sizes: the split where b holds the largest
    (smallest) values. 1 when every value is the same or a sample is empty. Without ties and in the exact range
    it is ``1 / C(n_a + n_b, n_a)``."""
    xs, ys = _present(a), _present(b)
    if not xs or not ys:
        return 1.0
    pooled = sorted(xs + ys, reverse=b_greater)
    top, rest = pooled[: len(ys)], pooled[len(ys) :]
    test = mann_whitney(top, rest)
    assert test is not None
    return test.p_greater if b_greater else test.p_less


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times the number of p-values
    not smaller in rank (m - i + 1), made non-decreasing in rank, at most 1. Rejecting every hypothesis whose
    adjusted p is <= alpha keeps the chance of any false rejection among them <= alpha, whatever their
    dependence (Holm 1979)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out
