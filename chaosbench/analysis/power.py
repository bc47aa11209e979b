"""What the regression gate can detect with a suite's repeats against a baseline's, stated before the suite runs
and in the comparison's report, so that a green gate is read for what it is.

For every key the baseline and the new result set share, with ``n_a`` baseline and ``n_b`` new repeats, over a
family of at most ``m`` comparisons (every figure the baseline measured, per key: the family of
:mod:`chaosbench.analysis.baseline` can only be smaller, since comparisons that cannot vary drop out), the gate
tests at Holm's first level ``alpha / m`` or looser. Stated per figure kind:

- **Shares** (recovered, detected, ...): from a baseline good in every run (100 %), the highest new share a
  one-sided Fisher's exact test still tells apart at ``alpha / m`` ("100 % -> 0 % of 3 detectable at p <=
  0.0014; 100 % -> 33 % is not"), or that not even 0 % is, and how many new repeats would make 0 % so.
- **Timings and counts**: whether complete separation (every new value worse than every baseline value: the
  rank test's smallest p, ``1 / C(n_a + n_b, n_a)``) reaches ``alpha / m``, and, per figure, the smallest change
  that counts: the noise floor, the larger of the relative threshold and twice the baseline's interquartile range
  over its median (:func:`~chaosbench.analysis.baseline.noise`), across keys ("time_to_resume_s +20 % to +45 %").
- A figure the baseline measured in every run and the new results in none fails without statistics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaosbench.analysis.baseline import HIGHER_IS_BETTER, LOWER_IS_BETTER, SHARES, at_most, groups, noise
from chaosbench.analysis.stats import fisher_worse
from chaosbench.analysis.values import as_float


@dataclass(frozen=True)
class SharePower:
    """From a baseline good in all ``n_a`` runs against ``n_b`` new ones at ``level``: ``detectable_at_most``,
    the most good new runs that still tell apart (None: not even 0), its p; ``needs``: the fewest new repeats
    with which 0 good runs would (None when ``detectable_at_most`` is not None or none up to 1000 would);
    ``needs_each``: the fewest repeats on both sides that would."""

    n_a: int
    n_b: int
    level: float
    detectable_at_most: int | None
    p: float
    needs: int | None
    needs_each: int | None


def share_power(n_a: int, n_b: int, level: float) -> SharePower:
    """:class:`SharePower` by exact computation (one-sided Fisher's test, :func:`fisher_worse`)."""
    best = None
    p = fisher_worse(n_a, n_a, 0, n_b).p
    for k in range(n_b, -1, -1):
        pk = fisher_worse(n_a, n_a, k, n_b).p
        if at_most(pk, level):
            best, p = k, pk
            break
    needs = needs_each = None
    if best is None:
        needs = next(
            (n for n in range(n_b + 1, 1001) if at_most(fisher_worse(n_a, n_a, 0, n).p, level)), None
        )
        needs_each = next(
            (n for n in range(max(n_a, n_b) + 1, 1001) if at_most(1 / math.comb(2 * n, n), level)), None
        )
    return SharePower(n_a, n_b, level, best, p, needs, needs_each)


@dataclass(frozen=True)
class TimingFloor:
    """A timing's noise floor in one key, relative to the baseline's median: max(threshold, 2 x interquartile range / |median|)."""

    key: str
    metric: str
    relative: float


@dataclass(frozen=True)
class Power:
    """The gate's power for one baseline against a number of new repeats per key (:func:`power`)."""

    alpha: float
    family_max: int  # the family's size: an upper bound before the runs (``bound``), the verdict's after
    repeats: dict[str, tuple[int, int]]  # key -> (baseline repeats, new repeats)
    shares: dict[tuple[int, int], SharePower]
    timing_best_p: dict[tuple[int, int], float]
    floors: list[TimingFloor]
    bound: bool = True
    varying: int = 0  # of the bound's comparisons, those whose figure varies among the baseline's runs

    @property
    def level(self) -> float:
        return self.alpha / max(self.family_max, 1)

    def lines(self) -> list[str]:
        """The power statement, one line per figure kind (what ``chaosbench run --baseline`` prints first and
        the comparison's report shows)."""
        if not self.repeats:
            return ["gate power: no scenario in common with the baseline: nothing is compared"]
        pairs = sorted(set(self.repeats.values()))
        reps = ", ".join(f"{a} baseline vs {b} new" for a, b in pairs)
        over = f"at most {self.family_max}" if self.bound else f"the verdict's {self.family_max}"
        out = [
            f"gate power: {reps} repeats per scenario; alpha {self.alpha:g} for the whole verdict, Holm over "
            f"{over} comparisons (first level {self.alpha:g}/{max(self.family_max, 1)} = {self.level:.2g}):"
        ]
        for pair in pairs:
            sp = self.shares[pair]
            a, b = pair
            if sp.detectable_at_most is not None:
                k = sp.detectable_at_most
                tail = "" if k + 1 > b else f"; 100 % -> {(k + 1) / b:.0%} is not"
                text = f"100 % -> {k / b:.0%} of {b} detectable (p = {sp.p:.2g}){tail}"
            else:
                text = (
                    f"not even 100 % -> 0 % of {b} is detectable (p = {sp.p:.2g} > {self.level:.2g}): needs "
                    f"{_n(sp.needs)} new repeats against the baseline's {a}, or {_n(sp.needs_each)} on both "
                    "sides"
                )
            out.append(f"  {a} vs {b}: shares ({', '.join(s.name for s in SHARES)}): {text}")
            best = self.timing_best_p[pair]
            if at_most(best, self.level):
                t = f"a change beyond its noise floor is detectable when every new run is worse (p = {best:.2g})"
            else:
                each = next(
                    (n for n in range(max(a, b) + 1, 1001) if at_most(1 / math.comb(2 * n, n), self.level)),
                    None,
                )
                t = (
                    f"not detectable (smallest p = 1/C({a + b},{a}) = {best:.2g} > {self.level:.2g}): needs "
                    f"{_n(_timing_needs(a, b, self.level))} new repeats against the baseline's {a}, or {_n(each)} on "
                    "both sides"
                )
            out.append(f"  {a} vs {b}: timings: {t}")
        by_metric: dict[str, list[TimingFloor]] = {}
        for f in self.floors:
            by_metric.setdefault(f.metric, []).append(f)
        if by_metric:
            parts = []
            for metric, fs in by_metric.items():
                lo, hi = min(f.relative for f in fs), max(f.relative for f in fs)
                parts.append(f"{metric} {_rel(lo)}" + ("" if hi == lo else f" to {_rel(hi)}"))
            out.append(
                "  a timing change counts only above its noise floor (threshold or twice the baseline's interquartile range): "
                + ", ".join(parts)
            )
        out.append("  a figure measured in every baseline run and in none now fails without statistics")
        if self.bound:
            out.append(self._family_line(pairs))
        return out

    def _family_line(self, pairs: Sequence[tuple[int, int]]) -> str:
        """Before the runs the family is a bound: a comparison whose figure is the same in every run of both
        sides cannot reach alpha and is left out, so the verdict's family is usually smaller (a clean change's:
        about the figures that vary among the baseline's runs). The largest family in which complete
        separation still decides, per repeats pair."""
        parts = []
        for a, b in pairs:
            best = self.timing_best_p[(a, b)]
            largest = math.floor(self.alpha / best * (1 + 1e-9))
            parts.append(f"{a} vs {b} (p = 1/C({a + b},{a})) decides in a family of up to {largest}")
        return (
            f"  the family is known after the runs (a figure the same in every run of both sides is left out; "
            f"{self.varying} of the at most {self.family_max} vary among the baseline's runs): complete "
            f"separation of {'; '.join(parts)}"
        )


def _n(repeats: int | None) -> str:
    """A number of repeats the search found, or that it found none up to 1,000."""
    return "more than 1000" if repeats is None else str(repeats)


def _rel(x: float) -> str:
    return "any increase" if math.isinf(x) else f"{x:+.0%}"


def _timing_needs(n_a: int, n_b: int, level: float) -> int | None:
    return next((n for n in range(n_b + 1, 1001) if at_most(1 / math.comb(n_a + n, n_a), level)), None)


def power(
    baseline_rows: Sequence[dict[str, Any]],
    new_repeats: Mapping[str, int],
    alpha: float = 0.05,
    threshold: float = 0.2,
    by: str = "scenario",
    family_size: int | None = None,
) -> Power:
    """The gate's power for ``baseline_rows`` against ``new_repeats`` (key -> runs per key that will be, or
    were, compared). The family: ``family_size`` when the verdict is known (the comparison's report), else
    every (key, figure) the baseline measured for the keys in both, an upper bound (before the runs)."""
    base = groups(baseline_rows, by)
    repeats: dict[str, tuple[int, int]] = {}
    family_max = varying = 0
    floors: list[TimingFloor] = []
    for key in sorted(set(base) & set(new_repeats)):
        rows = base[key]
        repeats[key] = (len(rows), int(new_repeats[key]))
        for share in SHARES:
            held = [h for r in rows if (h := share.holds(r)) is not None]
            family_max += bool(held)
            varying += len(set(held)) > 1
        for metric in LOWER_IS_BETTER + HIGHER_IS_BETTER:
            vals = [v for r in rows if (v := as_float(r.get(metric))) is not None]
            if not vals:
                continue
            family_max += 1
            varying += len(set(vals)) > 1
            med = statistics.median(vals)
            spread = noise(vals)
            rel = max(threshold, spread / abs(med)) if med else (math.inf if spread else threshold)
            floors.append(TimingFloor(key, metric, rel))
    bound = family_size is None
    if family_size is not None:
        family_max = family_size
    level = alpha / max(family_max, 1)
    pairs = set(repeats.values())
    shares = {p: share_power(p[0], p[1], level) for p in pairs if p[0] and p[1]}
    best = {p: 1 / math.comb(p[0] + p[1], p[0]) for p in pairs}
    return Power(alpha, family_max, repeats, shares, best, floors, bound, varying)


def suite_repeats(suite: Any) -> dict[str, int]:
    """Runs per scenario id a suite will make, controls left out (:meth:`chaosbench.specs.Suite.scenarios`)."""
    out: dict[str, int] = {}
    for sc in suite.scenarios():
        if not sc.control:
            out[sc.id] = out.get(sc.id, 0) + 1
    return out
