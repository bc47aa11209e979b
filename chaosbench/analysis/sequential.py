"""Repeating a scenario until its verdict is decided: ``repeats: {max: N, until: decided}`` (and ``min``).

A scenario so declared runs at least ``min`` (default 2) and at most ``max`` repeats; after each repeat from
``min`` on, the runner asks :meth:`StoppingRule.settle` whether its verdict is decided, and stops repeating it
when it is.

**Alpha spent over the looks (Bonferroni).** The verdict of such a scenario is looked at ``L = max - min + 1``
times. Every comparison of its key enters the baseline verdict with its p (and its smallest attainable p)
multiplied by ``L`` (:attr:`~chaosbench.analysis.baseline.Difference.looks`) before the family is formed and
Holm's correction applied. Why the whole verdict's false-alarm rate stays <= ``alpha`` whatever the stopping
rule: for a figure whose distribution did not change, the chance that its p at the look where the scenario
stopped is <= c is at most the chance that any of the ``L`` looks gives p <= c, at most ``L * c`` (each look's p
is a valid p-value); so ``L * p`` is a valid p-value at any stopping point, and Holm over valid p-values keeps
the chance of any false regression <= ``alpha`` under any dependence. A scenario with fixed repeats has
``L = 1``: nothing changes for it.

**The stopping rule.** After ``k`` repeats (``min <= k < max``) a scenario is *decided* when both hold:

1. Every figure the baseline measured for it (:func:`~chaosbench.analysis.baseline.compare`'s shares and
   timings) is *settled*, i.e. its verdict at the stopping point is the same for every possible outcome of the
   ``max - k`` repeats not made, whatever the rest of the suite's verdict is:

   - *settled as a regression*: for every ``n`` in ``k..max``, even the most favourable continuation (the
     ``n - k`` further runs all on the good side of a share; for a timing all better than every value so far)
     leaves it a regression in any verdict: it moved the bad way beyond its noise floor and
     ``m * L * p <= alpha``, with ``m`` an upper bound of the verdict's family size
     (:attr:`~chaosbench.analysis.power.Power.family_max`: Holm's adjusted p is at most ``m`` times the p);
   - *settled as no regression*: for every ``n`` in ``k..max``, even the most adverse continuation (all
     further runs on the bad side of a share; for a timing all worse than every value so far) leaves it no
     regression in any verdict: it did not move the bad way beyond its noise floor, or ``L * p > alpha``
     (Holm's adjusted p is never below the p itself);
   - a figure *no longer measured* (measured in every baseline run, in none of the ``k``) is settled only at
     ``max``: one more run that measures it would make it a comparison.

2. Its SLO verdict is settled: it has no SLOs, or one of its runs missed one (the gate fails the suite, exit
   3, whatever the other repeats do). A scenario whose runs have all met their SLOs is *not* settled before
   ``max``: one more run could miss.

Nothing to decide (no baseline with this scenario, and no SLOs): it runs ``max`` repeats. At ``max`` it stops
whatever. The most adverse and most favourable continuations bound every other one for Fisher's test (more bad
runs, a smaller p) and, for the rank test, in its exact range without ties (every new value beyond the old ones
gives the largest or smallest U); with ties among the old values it is the natural bound, not a proof.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaosbench.analysis.baseline import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    SHARES,
    Difference,
    Share,
    Status,
    at_most,
    best_p,
    groups,
    share_difference,
    timing_difference,
)
from chaosbench.analysis.values import as_bool, as_float
from chaosbench.specs import UntilDecided

#: Written into the suite directory by the runner: per scenario repeated until decided, its repeats and looks.
REPEATS_FILE = "repeats.json"


@dataclass(frozen=True)
class Settlement:
    """Where a scenario repeated until decided stands after ``repeats`` runs. ``decided``: its verdict can no
    longer change (the module's rule); ``regressions``: the figures settled as regressions; ``unsettled``: what
    is not settled yet (figures, ``SLOs``); ``slo_missed``: a run missed an SLO; ``nothing_to_decide``: no
    baseline for it and no SLOs (it runs ``max``)."""

    key: str
    repeats: int
    design: UntilDecided
    decided: bool
    regressions: tuple[str, ...] = ()
    unsettled: tuple[str, ...] = ()
    slo_missed: bool = False
    nothing_to_decide: bool = False

    @property
    def stops(self) -> bool:
        """No more repeats: decided, or ``max`` reached."""
        return self.decided or self.repeats >= self.design.max

    def describe(self) -> str:
        """One line: ``restart/kill: decided after 3 of at most 8 repeats (no comparison can become a regression;
        no SLOs)`` or ``...: max reached: 8 repeats (not settled: time_to_resume_s, SLOs (all met so far))``."""
        found = []
        if self.regressions:
            found.append(f"regressions: {', '.join(self.regressions)}")
        if self.slo_missed:
            found.append("an SLO missed")
        if self.decided:
            what = "; ".join(found) or "no comparison can become a regression, SLOs settled"
            return f"{self.key}: decided after {self.repeats} of at most {self.design.max} repeats ({what})"
        if self.nothing_to_decide:
            why = "nothing to decide (no baseline for it, no SLOs)"
        else:
            why = "not settled: " + ", ".join(self.unsettled)
        head = "max reached" if self.repeats >= self.design.max else "not decided"
        return f"{self.key}: {head}: {self.repeats} repeats ({why})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "min": self.design.min_repeats,
            "max": self.design.max,
            "looks": self.design.looks,
            "decided": self.decided,
            "regressions": list(self.regressions),
            "unsettled": list(self.unsettled),
            "slo_missed": self.slo_missed,
            "nothing_to_decide": self.nothing_to_decide,
            "why": self.describe(),
        }


@dataclass(frozen=True)
class _Figure:
    """A figure compared with the baseline: a share, or a timing (``metric``)."""

    name: str
    share: Share | None = None

    def diff(
        self, key: str, ra: Sequence[dict[str, Any]], rb: Sequence[dict[str, Any]], threshold: float
    ) -> Difference | None:
        if self.share is not None:
            return share_difference(key, self.share, ra, rb)
        return timing_difference(key, self.name, ra, rb, threshold)

    def continued(
        self, key: str, ra: Sequence[dict[str, Any]], rb: Sequence[dict[str, Any]], more: int, adverse: bool
    ) -> list[dict[str, Any]]:
        """``rb`` and ``more`` runs, all on the bad side of this figure (``adverse``) or all on the good side:
        for a timing each new value beyond every value so far, all distinct."""
        if more <= 0:
            return list(rb)
        if self.share is not None:
            side = self.share.bad_run if adverse else self.share.good_run
            return list(rb) + [{"scenario": key, **dict(side)} for _ in range(more)]
        pooled = [v for r in (*ra, *rb) if (v := as_float(r.get(self.name))) is not None] or [0.0]
        worse_is_up = (self.name in LOWER_IS_BETTER) == adverse
        edge = max(pooled) if worse_is_up else min(pooled)
        step = (abs(edge) + 1) * (1 if worse_is_up else -1)
        return list(rb) + [{"scenario": key, self.name: edge + (i + 1) * step} for i in range(more)]


FIGURES = tuple(_Figure(s.name, s) for s in SHARES) + tuple(
    _Figure(m) for m in LOWER_IS_BETTER + HIGHER_IS_BETTER
)


class StoppingRule:
    """The stopping rule of the module's docstring for one suite run: ``baseline_rows`` (None: no baseline),
    ``alpha`` and ``threshold`` as the gate uses them, ``family_bound``: an upper bound of the verdict's family
    size (:func:`for_suite` takes the power statement's)."""

    def __init__(
        self,
        baseline_rows: Sequence[dict[str, Any]] | None,
        *,
        alpha: float = 0.05,
        threshold: float = 0.2,
        family_bound: int = 1,
        by: str = "scenario",
    ) -> None:
        self.baseline = groups(baseline_rows, by) if baseline_rows else {}
        self.alpha = alpha
        self.threshold = threshold
        self.family_bound = max(1, family_bound)

    @classmethod
    def for_suite(
        cls,
        suite: Any,
        baseline_rows: Sequence[dict[str, Any]] | None,
        *,
        alpha: float = 0.05,
        threshold: float = 0.2,
    ) -> StoppingRule:
        """The rule for ``suite`` against ``baseline_rows``: the family bound is every figure the baseline
        measured for the scenarios in both (:func:`chaosbench.analysis.power.power`)."""
        if not baseline_rows:
            return cls(None, alpha=alpha, threshold=threshold)
        from chaosbench.analysis.power import power, suite_repeats

        bound = power(baseline_rows, suite_repeats(suite), alpha=alpha, threshold=threshold).family_max
        return cls(baseline_rows, alpha=alpha, threshold=threshold, family_bound=bound)

    def settle(
        self, key: str, design: UntilDecided, rows: Sequence[dict[str, Any]], has_slos: bool
    ) -> Settlement:
        """Whether scenario ``key``'s verdict is decided after ``rows`` (its fault runs so far, result rows or
        :meth:`RunMetrics.to_dict` dicts; controls are left out)."""
        rb = [r for r in rows if as_bool(r.get("control")) is not True]
        k = len(rb)
        missed = any(as_bool(r.get("slo_ok")) is False for r in rb)
        ra = self.baseline.get(key, [])
        if not ra and not has_slos:
            return Settlement(key, k, design, False, nothing_to_decide=True)
        unsettled: list[str] = []
        regressions: list[str] = []
        if has_slos and not missed:
            unsettled.append("SLOs (all met so far)")
        for fig in FIGURES if ra else ():
            state = self._figure(fig, key, ra, rb, design)
            if state is None:
                unsettled.append(fig.name)
            elif state:
                regressions.append(fig.name)
        decided = k >= design.min_repeats and not unsettled
        return Settlement(key, k, design, decided, tuple(regressions), tuple(unsettled), missed)

    # ------------------------------------------------------------------------------------------------ figures
    def _could_fail(self, d: Difference | None, looks: int) -> bool:
        """A regression in some verdict: no longer measured, or adverse with ``L * p <= alpha``."""
        if d is None:
            return False
        if d.status is Status.NO_LONGER_MEASURED:
            return True
        return d.adverse and d.p_worse is not None and at_most(min(1.0, d.p_worse * looks), self.alpha)

    def _fails_surely(self, d: Difference | None, looks: int) -> bool:
        """A regression in every verdict: adverse with ``m * L * p <= alpha``."""
        if d is None or d.p_worse is None:
            return False
        return d.adverse and at_most(d.p_worse * looks * self.family_bound, self.alpha)

    def _figure(
        self,
        fig: _Figure,
        key: str,
        ra: Sequence[dict[str, Any]],
        rb: Sequence[dict[str, Any]],
        design: UntilDecided,
    ) -> bool | None:
        """True: settled as a regression; False: settled as none (or not compared at all); None: not settled."""
        k, top, looks = len(rb), design.max, design.looks
        now = fig.diff(key, ra, rb, self.threshold)
        if now is None:
            return False  # the baseline never measured it: never compared
        if now.status is Status.NO_LONGER_MEASURED:
            return None  # at max a regression, but not settled: one more run could measure it
        if self._fails_surely(now, looks):
            favourable = (
                fig.diff(key, ra, fig.continued(key, ra, rb, n - k, adverse=False), self.threshold)
                for n in range(k + 1, top + 1)
            )
            return True if all(self._fails_surely(d, looks) for d in favourable) else None
        if self._could_fail(now, looks):
            return None
        if now.p_worse is not None and len(ra) + top <= 20:
            # no data can give a p below best_p at n repeats (exact tests, no ties): often nothing to compute
            if all(not at_most(best_p(now, n) * looks, self.alpha) for n in range(k + 1, top + 1)):
                return False
        for n in range(top, k, -1):  # the most repeats first: the likeliest to reach the level
            if self._could_fail(
                fig.diff(key, ra, fig.continued(key, ra, rb, n - k, adverse=True), self.threshold), looks
            ):
                return None
        return False


def looks_of(designs: Mapping[str, UntilDecided]) -> dict[str, int]:
    """Scenario id -> looks (:attr:`UntilDecided.looks`), for :func:`~chaosbench.analysis.baseline.compare`."""
    return {key: d.looks for key, d in designs.items()}


def recorded_looks(result_set: str | Path) -> dict[str, int]:
    """Scenario id -> looks from a suite directory's ``repeats.json`` (empty for a CSV, or a suite without
    scenarios repeated until decided)."""
    path = Path(result_set) / REPEATS_FILE
    if not path.is_file():
        return {}
    return {key: int(rec.get("looks", 1)) for key, rec in json.loads(path.read_text()).items()}
