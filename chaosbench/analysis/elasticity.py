"""Recovery strategies compared from the results table: per workload, each framework entry that names a
``strategy`` (``restart-in-place``, ``hot-spare``, ``shrink``, ``continue``), its runs' recovery, which strategy
won and by how much, and what each would be worth at fleet scale. Reads only result rows (any column may be
missing); the report is :mod:`chaosbench.report.elasticity`.

Fleet projection of a strategy (first order, :func:`chaosbench.analysis.fleet.analytic_goodput` at the job's
MTBF; every interruption is taken to be a lost node, the suite's fault). Measured per strategy: the mean
recovery per loss R (``time_to_resume_s`` x ``recovery_scale``; a run that did not recover costs the assumed
manual recovery), the work lost (half a checkpoint interval per rollback, else ``lost_work_s``) and the runtime's
share of the rescheduling (``stage_reschedule_runtime_s``). Assumed: the node repair time D
(:data:`~chaosbench.analysis.fleet.DEFAULT_NODE_REPAIR_S`) and what each strategy does at scale:

- ``restart-in-place``: the job waits for the lost node to come back, then restarts: D + R - the measured runtime
  share (in the test a reboot or a requeue stood for the repair; where no share was measured R is kept whole);
- ``hot-spare``: R when the pool still holds a spare, else the restart-in-place cost (measured as above; without
  a restart-in-place entry D + R); the pool's size decides (:func:`~chaosbench.analysis.fleet.spare_found`);
- ``shrink``: R to shrink and R again to re-grow when the node is back (both are a re-rendezvous and a reload,
  each rolling back), plus the lost node's share of throughput while it is out (D / nodes seconds per loss);
- ``continue``: R (the survivors' stall) and the measured work thrown away, plus the lost node's share of
  throughput while it is out (D / nodes), with the replica group taken to be one node as in the suite;
- a framework entry without a strategy: R, as in the framework projection.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosbench.analysis.faults import FIRED_OUTCOMES
from chaosbench.analysis.fleet import (
    DEFAULT_NODE_REPAIR_S,
    DEFAULT_SPARE_POOLS,
    Assumptions,
    FleetScale,
    PoolPoint,
    analytic_goodput,
    break_even_pool,
    spare_pool_point,
)
from chaosbench.analysis.stats import Estimate, median_ci, median_difference_ci
from chaosbench.analysis.values import as_bool, as_float, is_missing

#: The strategies of the elasticity suite, in the order the report lists them.
STRATEGIES = ("restart-in-place", "hot-spare", "shrink", "continue")
#: Outcomes of a fault run whose fault fired.
FIRED = FIRED_OUTCOMES


def _text(value: Any) -> str | None:
    return None if is_missing(value) else str(value)


@dataclass
class StrategyRuns:
    """The fault runs (their fault fired) of one framework entry on one workload."""

    workload: str
    framework: str
    strategy: str | None
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return (
            self.framework
            if self.strategy in (None, self.framework)
            else f"{self.framework} ({self.strategy})"
        )

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def recovered(self) -> int:
        return sum(1 for r in self.rows if r.get("outcome") == "recovered")

    def values(self, key: str) -> list[float]:
        return [v for r in self.rows if (v := as_float(r.get(key))) is not None]

    def median(self, key: str) -> float | None:
        vals = self.values(key)
        return statistics.median(vals) if vals else None

    def estimate(self, key: str) -> Estimate:
        return median_ci(self.values(key))

    def transitions(self, before: str, after: str) -> str | None:
        """The runs' ``before -> after`` values (the most common first, with counts when they differ)."""
        seen = Counter(
            f"{_num(r.get(before))} -> {_num(r.get(after))}"
            for r in self.rows
            if as_float(r.get(before)) is not None or as_float(r.get(after)) is not None
        )
        if not seen:
            return None
        if len(seen) == 1:
            return next(iter(seen))
        return ", ".join(f"{k} ({n}x)" for k, n in seen.most_common())

    def fidelity(self) -> tuple[Counter[str], list[str]]:
        """Fidelity verdicts by count (``diverged (expected)`` apart from ``diverged``) and the distinct reasons
        a divergence was expected."""
        counts: Counter[str] = Counter()
        reasons: list[str] = []
        for r in self.rows:
            verdict = _text(r.get("fidelity"))
            if verdict is None:
                continue
            reason = _text(r.get("fidelity_reason"))
            if verdict == "diverged" and reason:
                verdict = "diverged (expected)"
                if reason not in reasons:
                    reasons.append(reason)
            counts[verdict] += 1
        return counts, reasons


def _num(value: Any) -> str:
    f = as_float(value)
    if f is None:
        return "?"
    return str(int(f)) if f == int(f) else f"{f:g}"


def has_strategies(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether any run names a strategy (the elasticity section is shown)."""
    return any(_text(r.get("strategy")) for r in rows)


def by_workload(rows: Sequence[dict[str, Any]]) -> dict[str, list[StrategyRuns]]:
    """Fault runs whose fault fired, per workload and framework entry (entries in order of first appearance),
    for suites whose entries name a strategy; entries without one are compared too (as themselves)."""
    out: dict[str, dict[str, StrategyRuns]] = {}
    for r in rows:
        if as_bool(r.get("control")) is True or r.get("outcome") not in FIRED:
            continue
        wl = _text(r.get("workload")) or "(workload not recorded)"
        fw = _text(r.get("framework")) or "?"
        group = out.setdefault(wl, {}).setdefault(fw, StrategyRuns(wl, fw, _text(r.get("strategy"))))
        group.rows.append(r)
    return {wl: list(groups.values()) for wl, groups in sorted(out.items())}


@dataclass(frozen=True)
class Comparison:
    """The best entry by a metric's median and the runner-up; ``difference``: how much better the best is
    (>= 0, in the metric's unit) with its bootstrap interval; ``separable``: the interval excludes 0 (else
    ``why`` not)."""

    metric: str
    best: StrategyRuns
    other: StrategyRuns
    difference: Estimate
    separable: bool
    why: str | None = None


def compare(groups: Sequence[StrategyRuns], metric: str, lower_is_better: bool) -> Comparison | None:
    """The winner of ``metric`` among ``groups`` (by median) against the runner-up; None with fewer than two
    entries that measured it."""
    measured = [g for g in groups if g.values(metric)]
    if len(measured) < 2:
        return None
    measured.sort(key=lambda g: (g.median(metric) or 0.0) * (1 if lower_is_better else -1))
    best, other = measured[0], measured[1]
    a, b = (other, best) if lower_is_better else (best, other)
    diff = median_difference_ci(a.values(metric), b.values(metric))
    if diff.lo is None or diff.hi is None:
        return Comparison(metric, best, other, diff, False, f"too few runs for an interval (n={diff.n})")
    if diff.lo <= 0 <= diff.hi:
        return Comparison(metric, best, other, diff, False, "the interval of the difference includes 0")
    return Comparison(metric, best, other, diff, True)


# ---------------------------------------------------------------------------------------- fleet projection
@dataclass(frozen=True)
class FleetStrategy:
    """One entry's projection: the measured recovery per loss (``measured_s``), its cost per loss at fleet scale
    under the strategy's model (``per_loss_s``), the work lost per loss (half a checkpoint interval per rollback,
    else measured), the analytic goodput, the model in words, and for a hot spare the pool size it was projected
    with."""

    label: str
    strategy: str | None
    measured_s: float
    per_loss_s: float
    lost_s: float
    goodput: float
    model: str
    pool: int | None = None


@dataclass
class ElasticFleet:
    """A workload's fleet projection: per entry, and for the hot spare the goodput per pool size and the pool
    worth having (``break_even``)."""

    strategies: list[FleetStrategy] = field(default_factory=list)
    pools: list[PoolPoint] = field(default_factory=list)
    pools_of: str | None = None
    break_even: int | None = None
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _measured(
    g: StrategyRuns, a: Assumptions, interval_s: float
) -> tuple[float, float, bool, float | None] | None:
    """(mean recovery per loss, mean lost work per loss (half of ``interval_s`` per rollback or unrecovered run,
    else the measured ``lost_work_s``), whether every recovery rolled back, mean runtime share of the
    rescheduling or None); None when no run has a recovery to count."""
    rec: list[float] = []
    lost: list[float] = []
    for r in g.rows:
        if r.get("outcome") != "recovered":
            rec.append(a.manual_recovery_s)
            lost.append(interval_s / 2)
            continue
        resume = as_float(r.get("time_to_resume_s"))
        if resume is None:
            continue
        rec.append(resume * a.recovery_scale)
        rollback = as_bool(r.get("rollback")) is True
        lost.append(interval_s / 2 if rollback else (as_float(r.get("lost_work_s")) or 0.0))
    if not rec:
        return None
    shares = g.values("stage_reschedule_runtime_s")
    rollback = all(as_bool(r.get("rollback")) is True for r in g.rows if r.get("outcome") == "recovered")
    return (
        statistics.fmean(rec),
        statistics.fmean(lost),
        rollback,
        statistics.fmean(shares) * a.recovery_scale if shares else None,
    )


def project_strategies(
    groups: Sequence[StrategyRuns],
    scale: FleetScale,
    a: Assumptions,
    repair_s: float = DEFAULT_NODE_REPAIR_S,
    pools: Sequence[int] = DEFAULT_SPARE_POOLS,
) -> ElasticFleet:
    """Each entry's goodput at ``scale`` under its strategy's model (module docstring), the hot spare's goodput
    per pool size in ``pools`` and its break-even pool; strategies of :data:`STRATEGIES` without a measured entry
    are named in ``missing``."""
    m = scale.job_mtbf_s
    tau = a.interval_s(m)
    out = ElasticFleet()
    measured = {g.framework: x for g in groups if (x := _measured(g, a, tau)) is not None}
    out.missing = [
        s for s in STRATEGIES if not any(g.strategy == s and g.framework in measured for g in groups)
    ]
    in_place = next((g for g in groups if g.strategy == "restart-in-place" and g.framework in measured), None)
    no_spare_s: float | None = None
    if in_place is not None:
        rec, _, _, share = measured[in_place.framework]
        no_spare_s = repair_s + rec - (share or 0.0)
        if share is None:
            out.notes.append(
                f"{in_place.label}: no runtime share of its rescheduling was measured, so its whole "
                "measured recovery is added to the repair time"
            )
    degraded_s = repair_s / scale.nodes
    for g in groups:
        if g.framework not in measured:
            continue
        rec, lost, _, share = measured[g.framework]
        if g.strategy == "hot-spare":
            fallback = no_spare_s if no_spare_s is not None else repair_s + rec
            if no_spare_s is None:
                out.notes.append(
                    f"{g.label}: no restart-in-place entry was measured; an exhausted pool is taken to "
                    "cost the repair time + this entry's own recovery"
                )
            pool = break_even_pool(rec, fallback, scale, a, repair_s, lost)
            point = spare_pool_point(pool, rec, fallback, scale, a, repair_s, lost)
            if not out.pools:
                out.pools = [spare_pool_point(p, rec, fallback, scale, a, repair_s, lost) for p in pools]
                out.pools_of, out.break_even = g.label, pool
            out.strategies.append(
                FleetStrategy(
                    g.label,
                    g.strategy,
                    rec,
                    point.recovery_s,
                    lost,
                    point.net_goodput,
                    f"measured recovery while a spare is left, else restart in place; pool of {pool} (goodput net of "
                    "its idle GPUs)",
                    pool,
                )
            )
            continue
        if g.strategy == "restart-in-place":
            per_loss = repair_s + rec - (share or 0.0)
            model = "repair time + measured recovery" + (" - its runtime share" if share is not None else "")
        elif g.strategy == "shrink":
            per_loss, lost = 2 * rec + degraded_s, 2 * lost
            model = "2 x (measured recovery + lost work) (shrink, re-grow) + the lost node's throughput while in repair"
        elif g.strategy == "continue":
            per_loss = rec + degraded_s
            model = "measured recovery + the lost node's throughput while in repair"
        else:
            per_loss = rec
            model = "measured recovery"
        goodput = analytic_goodput(per_loss, a.checkpoint_cost_s, tau, m, lost_s=lost)
        out.strategies.append(FleetStrategy(g.label, g.strategy, rec, per_loss, lost, goodput, model))
    out.strategies.sort(key=lambda s: -s.goodput)
    return out
