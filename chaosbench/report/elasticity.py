"""The report's elasticity section, shown when the suite's framework entries name a recovery ``strategy``: per
workload, a table of the strategies (runs, recovered rate, time to resume with its interval, the four stages of a
recovery, goodput, lost work, world size and global batch before -> after, fidelity), which strategy won and by
how much, and each strategy's fleet projection with the goodput a hot-spare pool buys. The numbers come from
:mod:`chaosbench.analysis.elasticity`; the stage definitions from :mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from chaosbench.analysis.elasticity import (
    STRATEGIES,
    Comparison,
    StrategyRuns,
    by_workload,
    compare,
    has_strategies,
    project_strategies,
)
from chaosbench.analysis.fleet import (
    DEFAULT_NODE_REPAIR_S,
    DEFAULT_SPARE_POOLS,
    LLAMA3,
    Assumptions,
    FleetScale,
)
from chaosbench.analysis.metrics import STAGE_METRICS
from chaosbench.analysis.stats import Estimate, wilson
from chaosbench.report.document import Block, Cell, Heading, Paragraph, Table
from chaosbench.report.fmt import MISSING, fmt_count, fmt_percent, fmt_seconds

STAGE_LABELS = ("detect", "reschedule", "reshard or replace", "resume")


def _est(e: Estimate, fmt: Any = fmt_seconds) -> str:
    if e.median is None:
        return MISSING
    if e.lo is None or e.hi is None:
        return f"{fmt(e.median)} (n=1)"
    return f"{fmt(e.median)} [{fmt(e.lo)}, {fmt(e.hi)}]"


def _rate(g: StrategyRuns) -> str:
    p, lo, hi = wilson(g.recovered, g.n)
    return MISSING if p is None else f"{g.recovered}/{g.n} ({p:.0%}; {lo:.0%}-{hi:.0%})"


def _fidelity(g: StrategyRuns) -> str:
    counts, _ = g.fidelity()
    if not counts:
        return MISSING
    return ", ".join(f"{n} {k}" for k, n in counts.most_common())


def strategy_table(groups: Sequence[StrategyRuns]) -> Table:
    """One row per framework entry of a workload."""
    rows: list[list[Cell]] = []
    for g in groups:
        stages = [fmt_seconds(g.median(s)) for s in STAGE_METRICS]
        share = g.median("stage_reschedule_runtime_s")
        if share is not None:
            stages[1] += f" (runtime {fmt_seconds(share)})"
        rows.append(
            [
                g.label,
                str(g.n),
                _rate(g),
                _est(g.estimate("time_to_resume_s")),
                *stages,
                _est(g.estimate("goodput"), fmt_percent),
                fmt_count(g.median("lost_steps")),
                fmt_seconds(g.median("lost_work_s")),
                g.transitions("world_size_before", "world_size_after") or MISSING,
                g.transitions("global_batch_before", "global_batch_after") or MISSING,
                _fidelity(g),
            ]
        )
    return Table(
        [
            "strategy",
            "runs",
            "recovered (95 % CI)",
            "time_to_resume_s median [95 % CI]",
            *(f"{label} (s, median)" for label in STAGE_LABELS),
            "goodput median [95 % CI]",
            "lost steps (median)",
            "lost work (s, median)",
            "world size before -> after",
            "global batch before -> after",
            "fidelity",
        ],
        rows,
        caption="Runs whose fault fired. The four stages run from the fault to the first step beyond the step "
        "reached at the fault (they add up to time_to_recover_s; under per-step commit they follow the "
        "lost replica's replacement, while the job itself resumed at time_to_resume_s); reschedule "
        "(runtime ...): the share the runtime measured (scheduler delay, node replacement, spare start). "
        "Medians with percentile-bootstrap 95 % intervals; recovered rate with a Wilson interval.",
    )


def _difference(c: Comparison, fmt: Any) -> str:
    d = c.difference
    if d.median is None:
        return MISSING
    text = f"by {fmt(abs(d.median))}"
    if c.separable and d.lo is not None and d.hi is not None:
        return text + f" (95 % CI of the difference {fmt(d.lo)} to {fmt(d.hi)})"
    if d.lo is not None and d.hi is not None:
        return (
            text
            + f", not separable: the 95 % interval of the difference, {fmt(d.lo)} to {fmt(d.hi)}, includes 0"
        )
    return text + f", not separable: {c.why}"


def winner_sentences(workload: str, groups: Sequence[StrategyRuns]) -> list[str]:
    """Who won on ``workload`` by median time to resume and by median goodput, and by how much."""
    out: list[str] = []
    ttr = compare(groups, "time_to_resume_s", lower_is_better=True)
    if ttr is None:
        out.append(f"{workload}: fewer than two strategies measured a time to resume; no winner.")
    else:
        out.append(
            f"{workload}: {ttr.best.label} resumed fastest (median {fmt_seconds(ttr.best.median(ttr.metric))} "
            f"s against {fmt_seconds(ttr.other.median(ttr.metric))} s for {ttr.other.label}), "
            f"{_difference(ttr, _seconds)}."
        )
    gp = compare(groups, "goodput", lower_is_better=False)
    if gp is not None:
        out.append(
            f"Goodput over the run: {gp.best.label} highest (median {fmt_percent(gp.best.median(gp.metric))} "
            f"against {fmt_percent(gp.other.median(gp.metric))} for {gp.other.label}), "
            f"{_difference(gp, _points)}."
        )
    return out


def _seconds(v: float) -> str:
    return f"{fmt_seconds(v)} s"


def _points(v: float) -> str:
    return f"{v * 100:.1f} points"


def _fidelity_blocks(groups: Sequence[StrategyRuns]) -> list[Block]:
    lines = []
    for g in groups:
        counts, reasons = g.fidelity()
        if reasons:
            lines.append(
                f"{g.label}: {counts['diverged (expected)']} run(s) diverged as expected ({'; '.join(reasons)})"
            )
    if not lines:
        return []
    return [
        Paragraph(
            "Fidelity: " + ". ".join(lines) + ". This is no failure of the recovery: a job that trains on a "
            "different global batch, data split and schedule cannot end in the control's state. An SLO "
            "`fidelity == exact` still fails for these runs, as it should; compare their loss instead "
            "(loss_diff in the repeats)."
        )
    ]


def scale_from(projection: dict[str, Any] | None) -> FleetScale:
    """The suite's projection scale, else Llama 3's (2048 nodes x 8 GPUs, its reported failure rate)."""
    if projection and projection.get("nodes") and projection.get("node_mtbf_h"):
        return FleetScale(
            int(projection["nodes"]),
            int(projection.get("gpus_per_node") or 8),
            float(projection["node_mtbf_h"]),
        )
    return LLAMA3


def fleet_blocks(
    groups: Sequence[StrategyRuns], projection: dict[str, Any] | None, a: Assumptions
) -> list[Block]:
    """Each strategy's projected goodput at the suite's scale and, for the hot spare, per spare-pool size
    (``a``: the framework projection's assumptions)."""
    o = projection or {}
    scale = scale_from(projection)
    repair_s = float(o.get("node_repair_s") or DEFAULT_NODE_REPAIR_S)
    pools = [int(p) for p in (o.get("spare_pools") or DEFAULT_SPARE_POOLS)]
    fleet = project_strategies(groups, scale, a, repair_s, pools)
    blocks: list[Block] = []
    rows: list[list[Cell]] = [
        [
            s.label,
            fmt_seconds(s.measured_s),
            fmt_seconds(s.per_loss_s),
            fmt_seconds(s.lost_s),
            fmt_percent(s.goodput),
            s.model,
        ]
        for s in fleet.strategies
    ]
    if rows:
        blocks.append(
            Table(
                [
                    "strategy",
                    "measured recovery per loss (s, mean)",
                    "cost per loss at scale (s)",
                    "lost work per loss (s)",
                    "goodput (analytic)",
                    "model",
                ],
                rows,
                caption="Ranked by projected goodput.",
            )
        )
    if fleet.missing:
        blocks.append(
            Paragraph("Not measured for this workload (not projected): " + ", ".join(fleet.missing) + ".")
        )
    if fleet.pools:
        prow: list[list[Cell]] = [
            [
                str(p.pool),
                fmt_percent(p.spare_found),
                fmt_seconds(p.recovery_s),
                fmt_percent(p.goodput),
                fmt_percent(p.idle_share),
                fmt_percent(p.net_goodput),
            ]
            for p in fleet.pools
        ]
        blocks.append(
            Table(
                [
                    "spare pool (nodes)",
                    "losses that find a spare",
                    "recovery per loss (s)",
                    "goodput",
                    "pool / nodes (GPUs idling)",
                    "goodput net of the pool",
                ],
                prow,
                caption=f"{fleet.pools_of}: pool 0 is restart in place.",
            )
        )
        gain = fleet.pools[-1].goodput - fleet.pools[0].goodput if len(fleet.pools) > 1 else 0.0
        blocks.append(
            Paragraph(
                f"A spare pool is worth it up to {fleet.break_even} node(s) at {scale.nodes} nodes: beyond that one more "
                f"spare buys less goodput than the 1/{scale.nodes} of the GPUs it idles. From a pool of "
                f"{fleet.pools[0].pool} to {fleet.pools[-1].pool} the job's goodput changes by {gain * 100:+.1f} points."
            )
        )
    blocks += [Paragraph(n + ".") for n in fleet.notes]
    return blocks


def elasticity_blocks(
    rows: Sequence[dict[str, Any]], definition: dict[str, Any] | None, assumptions: Assumptions | None = None
) -> list[Block]:
    """The section, or nothing when no run names a strategy; ``assumptions``: the framework projection's (from the
    suite's ``projection`` settings; the defaults when None)."""
    if not has_strategies(rows):
        return []
    projection = (definition or {}).get("projection")
    scale = scale_from(projection)
    o = projection or {}
    blocks: list[Block] = [
        Heading(2, "Elasticity: recovery strategies"),
        Paragraph(
            "Each recovery in four stages: detect (the fault to the framework's reaction), reschedule (to the "
            "replacement capacity's first rank start: a rebooted node, a spare, fewer nodes, or a replica "
            "group's replacement), reshard or replace (to the end of the checkpoint restore onto the new "
            "world, or of the heal from a peer), resume (to the first step beyond the step reached at the "
            "fault). A stage that does not apply is 0 (recovery in place; a job that continued without the "
            "lost replica)."
        ),
    ]
    for workload, groups in by_workload(rows).items():
        blocks.append(Heading(3, f"Workload: {workload}"))
        blocks.append(strategy_table(groups))
        blocks.append(Paragraph(" ".join(winner_sentences(workload, groups))))
        absent = [s for s in STRATEGIES if not any(g.strategy == s for g in groups)]
        if absent:
            blocks.append(Paragraph(f"Strategies without runs on {workload}: {', '.join(absent)}."))
        blocks += _fidelity_blocks(groups)
        blocks.append(Heading(4, f"Fleet projection at {scale.nodes} nodes x {scale.gpus_per_node} GPUs"))
        blocks += fleet_blocks(groups, projection, assumptions or Assumptions())
    a_notes = [
        f"node MTBF {scale.node_mtbf_h:.0f} h, job MTBF {scale.job_mtbf_s / 3600:.2f} h (every interruption "
        "taken to be a lost node)",
        f"node repair time {float(o.get('node_repair_s') or DEFAULT_NODE_REPAIR_S):g} s "
        + (
            "(projection.node_repair_s)"
            if o.get("node_repair_s")
            else "(assumed: a reboot and health check; set projection.node_repair_s)"
        ),
        "the checkpoint cost, interval, manual recovery and recovery scale of the framework projection",
    ]
    blocks.append(
        Paragraph(
            "Projection assumptions: " + "; ".join(a_notes) + ". The model per strategy is in "
            "chaosbench.analysis.elasticity."
        )
    )
    blocks.append(Paragraph(harness_cpu_sentence(rows)))
    return blocks


def harness_cpu_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """The harness's own CPU while the suite ran (``harness_cpu_share`` of every run, controls included): what
    the harness took from the machine the ranks and nodes share."""
    shares = sorted(float(r["harness_cpu_share"]) for r in rows if r.get("harness_cpu_share") is not None)
    if not shares:
        return "The harness's own CPU share was not measured (runs of an older chaosbench, or --jobs)."
    return (
        f"The harness itself used {fmt_percent(statistics.median(shares))} of one core while a run went on (median over "
        f"{len(shares)} runs, at most {fmt_percent(shares[-1])}): its CPU time over the run's wall time."
    )
