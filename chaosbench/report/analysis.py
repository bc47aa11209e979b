"""Cross-framework analysis blocks of a report: medians with bootstrap intervals and success rates per
framework x fault cell, time-to-resume distributions, badput waterfalls, detection against timeouts,
Young/Daly checkpoint intervals and the fleet-scale goodput projection."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaosbench.analysis.faults import FIRED_OUTCOMES
from chaosbench.analysis.fleet import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_MANUAL_RECOVERY_S,
    LLAMA3,
    LLAMA3_MIX,
    Assumptions,
    FaultMix,
    FleetScale,
    costs_from_rows,
    project,
)
from chaosbench.analysis.metrics import STAGE_METRICS
from chaosbench.analysis.stats import median_ci, wilson, young_daly_interval_s
from chaosbench.analysis.values import fault_rows
from chaosbench.report.document import Block, Cell, Heading, Image, Paragraph, Table
from chaosbench.report.elasticity import elasticity_blocks
from chaosbench.report.fmt import MISSING, as_bool, as_float, parse_json_object
from chaosbench.report.serving import is_serving, serving_blocks

#: The waterfall's stages: the four stages of a recovery (definitions: chaosbench.analysis.metrics).
STAGES = STAGE_METRICS
STAGE_LABELS = ("detect", "reschedule", "reshard or replace", "resume")


def _s(v: float | None, digits: int = 3) -> str:
    return MISSING if v is None else f"{v:.{digits}f}"


def _ci_text(values: list[float]) -> str:
    est = median_ci(values)
    if est.median is None:
        return MISSING
    if est.lo is None:
        return f"{est.median:.3f} (n=1)"
    return f"{est.median:.3f} [{est.lo:.3f}, {est.hi:.3f}]"


def _cells(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("control") is True or str(r.get("control")).lower() == "true":
            continue
        out.setdefault((str(r.get("fault")), str(r.get("framework"))), []).append(r)
    return dict(sorted(out.items()))


def _values(rs: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [v for r in rs if (v := as_float(r.get(key))) is not None]


def unusable_frameworks(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Frameworks whose fault-free control did not run clean, and why: their fault runs are not comparable (a
    framework that restarts or detects without a fault, or fails without one, is broken in this configuration)."""
    out: dict[str, str] = {}
    for r in rows:
        if as_bool(r.get("control")) is not True:
            continue
        fw = str(r.get("framework"))
        if r.get("outcome") != "completed":
            out[fw] = f"its control run did not complete ({r.get('verdict') or r.get('outcome')})"
        elif r.get("clean") is not None and as_bool(r.get("clean")) is not True:
            out[fw] = f"its control run was not clean ({r.get('verdict')})"
    return out


def _unusable_row(fault: str, fw: str, why: str, width: int) -> list[Cell]:
    row: list[Cell] = [fault, fw, f"unusable: {why}"]
    return row + [MISSING] * (width - 3)


def stats_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Per fault x framework: success rate (Wilson 95 %) and medians with bootstrap 95 % intervals; a schedule of
    several faults gets a row per fault too (``kill+kill-during-restore › kill-during-restore``), from each
    fault's own figures. Medians of resume and lost work are over the recovered faults only (a run that did not
    recover has no such figure; an outlasted fault's stall is no recovery), of detection over the detected."""
    out: list[list[Cell]] = []
    unusable = unusable_frameworks(rows)
    for (fault, fw), rs in _cells(rows).items():
        if fw in unusable:
            out.append(_unusable_row(fault, fw, unusable[fw], 7))
            continue
        per_run = [fault_rows(r) for r in rs]
        out.append(_stats_row(fault, fw, [fs[-1] for fs in per_run if fs], rs, _values(rs, "extra_wall_s")))
        width = max((len(fs) for fs in per_run), default=0)
        for i in range(width if width > 1 else 0):
            nth = [fs[i] for fs in per_run if len(fs) > i]
            name = next((str(f.get("fault")) for f in nth if f.get("fault")), str(i + 1))
            out.append(_stats_row(f"{fault} › {name}", fw, nth, None, []))
    return Table(
        [
            "fault",
            "framework",
            "recovered (95 % CI)",
            "time_to_detect_s median [95 % CI]",
            "time_to_resume_s median [95 % CI]",
            "lost_steps median [95 % CI]",
            "extra_wall_s median [95 % CI]",
        ],
        out,
        caption="Medians with percentile-bootstrap 95 % intervals over repeats (resume and lost work over the "
        "recovered faults); success rates with Wilson intervals over the runs whose fault fired (the "
        "others are named, not counted); an outlasted fault (the job went on with "
        "no framework reaction) is counted apart. A framework whose fault-free control did not run clean "
        "is unusable, not ranked.",
    )


def _stats_row(
    fault: str,
    fw: str,
    faults: list[dict[str, Any]],
    runs: list[dict[str, Any]] | None,
    extra_wall: list[float],
) -> list[Cell]:
    """One row of :func:`stats_table`: over whole runs (``runs``: the run's outcome; ``faults`` their last
    faults) or over the n-th fault of each run (``runs`` None: that fault's status)."""
    every = (
        [str(r.get("outcome")) for r in runs] if runs is not None else [str(f.get("status")) for f in faults]
    )
    # counted over the runs whose fault fired, as the headline counts (a fault that did not fire, a contaminated
    # or failed run says nothing of recovery); the others are named beside
    outcomes = [o for o in every if o in FIRED_OUTCOMES]
    ok = sum(1 for o in outcomes if o == "recovered")
    outlasted = sum(1 for o in outcomes if o == "outlasted")
    p, lo, hi = wilson(ok, len(outcomes))
    rate = MISSING if p is None else f"{ok}/{len(outcomes)} ({p:.0%}; {lo:.0%}-{hi:.0%})"
    if outlasted:
        rate += f"; {outlasted} outlasted"
    others = Counter(o for o in every if o not in FIRED_OUTCOMES)
    if others:
        rate += "; not counted: " + ", ".join(f"{n} {o.replace('_', ' ')}" for o, n in sorted(others.items()))
    recovered = [f for f in faults if f.get("status") == "recovered"]
    return [
        fault,
        fw,
        rate,
        _ci_text(_values(faults, "time_to_detect_s")),
        _ci_text(_values(recovered, "time_to_resume_s")),
        _ci_text(_values(recovered, "lost_steps")),
        _ci_text(extra_wall),
    ]


def _rate(k: int, n: int) -> str:
    p, lo, hi = wilson(k, n)
    return MISSING if p is None else f"{k}/{n} ({p:.0%}; {lo:.0%}-{hi:.0%})"


def scorecard_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Per framework, over its runs: detected rate (fault runs whose fault fired), culprit accuracy (detections
    that named the faulted rank, among those that named anyone) and false-positive rate (runs, controls included,
    with a detection without a fault or before it), each with a Wilson 95 % interval."""
    unusable = unusable_frameworks(rows)
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    out: list[list[Cell]] = []
    for fw, rs in sorted(by_fw.items()):
        fired = [
            r for r in rs if as_bool(r.get("control")) is not True and r.get("outcome") in FIRED_OUTCOMES
        ]
        detected = [r for r in fired if (as_bool(r.get("detected")) is True)]
        named = [r for r in detected if r.get("blame") in ("correct", "imprecise", "wrong")]
        correct = sum(1 for r in named if r.get("blame") == "correct")
        judged = [r for r in rs if as_float(r.get("false_detections")) is not None]
        false = sum(1 for r in judged if (as_float(r.get("false_detections")) or 0) > 0)
        silent = sum(1 for r in detected if r.get("blame") == "none")
        row: list[Cell] = [
            fw,
            _rate(len(detected), len(fired)),
            _rate(correct, len(named)),
            f"{silent}/{len(detected)}" if detected else MISSING,
            _rate(false, len(judged)),
        ]
        if fw in unusable:
            row.append(f"unusable: {unusable[fw]}")
        else:
            row.append("")
        out.append(row)
    return Table(
        [
            "framework",
            "detected (95 % CI)",
            "culprit named correctly (95 % CI)",
            "detected without naming anyone",
            "runs with false detections (95 % CI)",
            "note",
        ],
        out,
        caption="Detected: fault runs whose fault fired and that the framework detected (before the harness began "
        "its teardown). Culprit: among detections that named a rank, node or replica group, those that "
        "named the faulted one. False detections: detections in fault-free controls or before the fault.",
    )


def detection_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Time to detect next to what the timeouts in force predict, and the timeouts themselves."""
    out: list[list[Cell]] = []
    unusable = unusable_frameworks(rows)
    for (fault, fw), rs in _cells(rows).items():
        if fw in unusable:
            out.append(_unusable_row(fault, fw, unusable[fw], 6))
            continue
        knobs: dict[str, Any] = {}
        for r in rs:
            try:
                knobs = json.loads(str(r.get("timeouts") or "{}"))
            except ValueError:
                knobs = {}
            if knobs:
                break
        knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items() if v is not None) or MISSING
        ttd = _values(rs, "time_to_detect_s")
        med = statistics.median(ttd) if ttd else None
        out.append([fault, fw, _predicted_text(rs), _s(med), f"{len(ttd)}/{len(rs)}", knob_text])
    return Table(
        [
            "fault",
            "framework",
            "predicted from the timeouts",
            "median time_to_detect_s (measured)",
            "detected",
            "timeouts in force (s)",
        ],
        out,
    )


def _predicted_text(rs: Sequence[dict[str, Any]]) -> str:
    pred = next((r for r in rs if as_float(r.get("predicted_detect_s")) is not None), None)
    if pred is None:
        why = next((parse_json_object(r.get("missing")).get("predicted_detect_s") for r in rs), None)
        return f"{MISSING} ({why})" if why else MISSING
    return f"~{float(pred['predicted_detect_s']):.3g} s by {pred.get('predicted_by')}"


def timeout_sanity_blocks(rows: Sequence[dict[str, Any]]) -> list[Block]:
    """Every distinct timeout problem the runs recorded (before they ran), per framework."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        problems = r.get("timeout_problems")
        try:
            items = json.loads(problems) if isinstance(problems, str) else list(problems or [])
        except (TypeError, ValueError):
            items = []
        for p in items:
            lst = seen.setdefault(str(r.get("framework")), [])
            if p not in lst:
                lst.append(p)
    if not seen:
        return []
    return [
        Heading(3, "Timeout sanity"),
        Table(
            ["framework", "problem (found from the timeouts before the runs)"],
            [[fw, p] for fw, ps in sorted(seen.items()) for p in ps],
        ),
    ]


def _plot_distribution(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cells = {k: _values(v, "time_to_resume_s") for k, v in _cells(rows).items()}
    cells = {k: v for k, v in cells.items() if v}
    if not cells:
        return False
    fig = Figure(figsize=(9, 0.45 * len(cells) + 1.2), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{fault} · {fw}" for fault, fw in cells]
    for i, vals in enumerate(cells.values()):
        ax.scatter(vals, [i] * len(vals), s=18, alpha=0.8)
        ax.plot([statistics.median(vals)] * 2, [i - 0.3, i + 0.3], color="black", lw=1.5)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("time to resume (s)")
    ax.set_title("time to resume per framework and fault (dots: repeats; bar: median)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


def _plot_waterfall(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cells: dict[tuple[str, str], list[float]] = {}
    for key, rs in _cells(rows).items():
        meds = [statistics.median(v) if (v := _values(rs, s)) else 0.0 for s in STAGES]
        if any(meds):
            cells[key] = meds
    if not cells:
        return False
    fig = Figure(figsize=(9, 0.45 * len(cells) + 1.4), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = ["#e6842a", "#8e6bbf", "#4c9bd6", "#d64c4c"]
    for i, meds in enumerate(cells.values()):
        left = 0.0
        for j, width in enumerate(meds):
            ax.barh(i, width, left=left, color=colors[j], label=STAGE_LABELS[j] if i == 0 else None)
            left += width
    ax.set_yticks(range(len(cells)), [f"{f} · {fw}" for f, fw in cells], fontsize=7)
    ax.set_xlabel("seconds from the fault (median of each stage)")
    ax.set_title("recovery waterfall: detect, reschedule, reshard or replace, resume", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


def _scale(projection: dict[str, Any] | None) -> tuple[FleetScale, str]:
    if projection:
        return (
            FleetScale(
                int(projection["nodes"]),
                int(projection.get("gpus_per_node", 8)),
                float(projection["node_mtbf_h"]),
            ),
            "the suite's projection settings",
        )
    return LLAMA3, (
        "Llama 3's reported scale (16,384 GPUs, 419 unexpected interruptions in 54 days), for orientation"
    )


def young_daly_table(rows: Sequence[dict[str, Any]], scale: FleetScale) -> Table:
    """This workload's measured checkpoint cost, its interval as its fault-free controls measured it, and the
    Young/Daly optimum for that cost at the fleet's job MTBF (what this checkpoint would need at that scale)."""
    out: list[list[Cell]] = []
    unusable = unusable_frameworks(rows)
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    for fw, rs in sorted(by_fw.items()):
        saves = _values(rs, "checkpoint_save_s")
        if not saves:
            continue
        if fw in unusable:
            out.append([fw, f"unusable: {unusable[fw]}", MISSING, MISSING, MISSING])
            continue
        cost = statistics.median(saves)
        if cost <= 0:  # a save whose duration the timeline shows as 0: no interval follows from it
            out.append([fw, _s(cost), MISSING, MISSING, "checkpoint cost measured as 0 s: no optimum"])
            continue
        intervals = _values([r for r in rs if (as_bool(r.get("control")) is True)], "checkpoint_interval_s")
        interval = statistics.median(intervals) if intervals else None
        opt = young_daly_interval_s(cost, scale.job_mtbf_s)
        out.append(
            [
                fw,
                _s(cost),
                _s(interval),
                _s(opt, 1),
                f"{interval / opt:.3g}x" if interval is not None else MISSING,
            ]
        )
    return Table(
        [
            "framework",
            "checkpoint cost C (s, measured)",
            "interval (s, measured in the controls)",
            "Young/Daly optimum at the fleet's MTBF (s)",
            "measured / optimum",
        ],
        out,
        caption=f"Job MTBF M = {scale.job_mtbf_s:.0f} s; optimum = sqrt(2CM) with Daly's correction.",
    )


def assumptions_from(projection: dict[str, Any] | None) -> tuple[Assumptions, list[str]]:
    """The projection's assumptions (the suite's ``projection`` settings over the defaults), and one line on each
    saying where it comes from."""
    o = projection or {}

    def given(key: str) -> bool:  # set in the suite (an explicit 0 is a value, not "use the default")
        return o.get(key) is not None

    a = Assumptions(
        checkpoint_cost_s=float(o["checkpoint_cost_s"])
        if given("checkpoint_cost_s")
        else DEFAULT_CHECKPOINT_COST_S,
        checkpoint_interval_s=float(o["checkpoint_interval_s"]) if given("checkpoint_interval_s") else None,
        manual_recovery_s=float(o["manual_recovery_s"])
        if given("manual_recovery_s")
        else DEFAULT_MANUAL_RECOVERY_S,
        recovery_scale=float(o["recovery_scale"]) if given("recovery_scale") else 1.0,
        mix=FaultMix(dict(o["fault_mix"]), "the suite's projection.fault_mix")
        if o.get("fault_mix")
        else LLAMA3_MIX,
    )
    said = "the suite's projection settings"
    notes = [
        f"checkpoint cost C = {a.checkpoint_cost_s:g} s (assumed: "
        + (
            said
            if given("checkpoint_cost_s")
            else "a blocking sharded save of a ~1 TB state; set projection.checkpoint_cost_s"
        )
        + ")",
        "checkpoint interval = "
        + (
            f"{a.checkpoint_interval_s:g} s ({said})"
            if a.checkpoint_interval_s is not None
            else "the Young/Daly optimum for C at the job MTBF"
        ),
        f"a failure the framework did not recover from costs {a.manual_recovery_s:g} s (assumed: "
        + (said if given("manual_recovery_s") else "an operator restarts the job")
        + ")",
        f"measured recovery x {a.recovery_scale:g} (projection.recovery_scale)",
        "fault mix: " + a.mix.source + " = " + ", ".join(f"{k} {a.mix.share(k):.1%}" for k in a.mix.weights),
    ]
    return a, notes


def projection_table(
    rows: Sequence[dict[str, Any]], scale: FleetScale, projection: dict[str, Any] | None
) -> Table:
    """Frameworks ranked by their projected goodput at fleet scale, from their measured recoveries."""
    a, _ = assumptions_from(projection)
    opts = projection or {}
    unusable = unusable_frameworks(rows)
    projected = []
    out: list[list[Cell]] = []
    for c in costs_from_rows(rows):
        if c.framework in unusable:
            out.append(_unusable_row(MISSING, c.framework, unusable[c.framework], 9))
            continue
        if not c.classes(a.mix):
            out.append([MISSING, c.framework, "no measured fault of the mix's classes", *[MISSING] * 6])
            continue
        projected.append(
            project(
                c,
                scale,
                a,
                horizon_days=float(opts.get("horizon_days", 30)),
                trials=int(opts.get("trials", 200)),
            )
        )
    projected.sort(key=lambda p: -p.goodput_mc_mean)
    ranked: list[list[Cell]] = []
    for i, p in enumerate(projected, 1):
        cover = f"{p.coverage:.0%} ({', '.join(p.classes)}"
        cover += f"; not measured: {', '.join(p.missing_classes)})" if p.missing_classes else ")"
        ranked.append(
            [
                str(i),
                p.framework,
                _s(p.recovery_s, 2),
                f"{p.unrecovered:.0%}",
                _s(p.lost_s, 1),
                cover,
                f"{p.checkpoint_interval_s:.0f}",
                f"{p.goodput_analytic:.2%}",
                f"{p.goodput_mc_mean:.2%} ({p.goodput_mc_p5:.2%}-{p.goodput_mc_p95:.2%})",
            ]
        )
    return Table(
        [
            "rank",
            "framework",
            "recovery per failure (s; measured time to resume, mix-weighted)",
            "failures not recovered (measured)",
            "lost work per failure (s; modelled: tau/2 on rollback, else measured)",
            "mix covered by measurements",
            "checkpoint interval tau (s; assumed)",
            "goodput (analytic)",
            "goodput (Monte Carlo, 5-95 %)",
        ],
        ranked + out,
        caption="Ranked by the Monte Carlo mean. Only the recovery columns are measured; scale, fault mix, checkpoint "
        "cost and interval and the cost of an unrecovered failure are assumed (listed above). Classes of "
        "the mix a framework was not measured on are left out and the rest reweighted (coverage). A framework "
        "that trains on with fewer replicas while one recovers (TorchFT) is counted at full speed.",
    )


def _scorecard_blocks(rows: Sequence[dict[str, Any]]) -> list[Block]:
    return [Heading(3, "Detection scorecard"), scorecard_table(rows)]


def analysis_blocks(
    rows: Sequence[dict[str, Any]],
    suite_dir: Path,
    definition: dict[str, Any] | None,
    plots: str = "existing",
) -> tuple[list[Block], dict[str, Path]]:
    """The analysis section; ``definition`` is the suite's own definition (from suite.json), if known. Serving
    runs get their own section (:mod:`chaosbench.report.serving`), after the training runs' analysis; ``plots``
    says whether their per-second plots absent from their run directories are drawn (the report's ``plots``)."""
    serving, serving_written = serving_blocks(rows, suite_dir, plots)
    rows = [r for r in rows if not is_serving(r)]
    if not _cells(rows):
        return serving, serving_written
    blocks: list[Block] = [Heading(2, "Framework comparison"), stats_table(rows)]
    unusable = unusable_frameworks(rows)
    if unusable:
        blocks.append(
            Paragraph(
                "Unusable in this configuration (not ranked anywhere): "
                + "; ".join(f"{fw}: {why}" for fw, why in sorted(unusable.items()))
                + "."
            )
        )
    plot_blocks, written = _plot_blocks(rows, suite_dir)
    blocks += plot_blocks
    blocks += _scorecard_blocks(rows)
    blocks += [Heading(3, "Detection: predicted from the timeouts, and measured"), detection_table(rows)]
    blocks += timeout_sanity_blocks(rows)
    blocks += _measurement_notes(rows)
    definition = definition or {}
    blocks += _fleet_blocks(rows, definition)
    written.update(serving_written)
    return blocks + serving, written


def _plot_blocks(rows: Sequence[dict[str, Any]], suite_dir: Path) -> tuple[list[Block], dict[str, Path]]:
    """The time-to-resume distribution and the badput waterfall, drawn under ``suite_dir/plots``: their image
    blocks (or a paragraph saying why a plot failed: a plot never costs the report) and the files written, by
    path relative to ``suite_dir``."""
    blocks: list[Block] = []
    written: dict[str, Path] = {}
    plots = suite_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for name, fn, alt in (
        ("distribution_time_to_resume.png", _plot_distribution, "time to resume"),
        ("badput_waterfall.png", _plot_waterfall, "badput waterfall"),
    ):
        try:
            if fn(rows, plots / name):
                blocks.append(Image(f"plots/{name}", alt))
                written[f"plots/{name}"] = plots / name
        except Exception as exc:  # noqa: BLE001 - a plot never costs the report
            blocks.append(Paragraph(f"{alt} plot failed: {type(exc).__name__}: {exc}"))
    return blocks, written


def _measurement_notes(rows: Sequence[dict[str, Any]]) -> list[Block]:
    """Notes on how the runs were measured: the largest clock-offset bound, and the faults that landed later
    than their trigger asked (none when there is nothing to say)."""
    blocks: list[Block] = []
    bounds = _values(rows, "clock_offset_bound_s")
    if bounds:
        blocks.append(
            Paragraph(
                f"Clocks: each node's clock offset was measured at the start of its run and stamps written on other "
                f"hosts were corrected; every corrected stamp is within {max(bounds) * 1e3:.3f} ms (largest bound)."
            )
        )
    late = [
        r
        for r in rows
        if (as_float(r.get("fault_step")) or 0) > (as_float(r.get("trigger_step")) or float("inf"))
    ]
    if late:
        blocks.append(
            Paragraph(
                f"{len(late)} fault(s) landed later than their trigger asked (see each run's verdict and "
                "injection_latency_s): their recovery is measured from when the fault took effect."
            )
        )
    return blocks


def _fleet_blocks(rows: Sequence[dict[str, Any]], definition: dict[str, Any]) -> list[Block]:
    """The Young/Daly checkpoint interval, the fleet-scale goodput projection and the elasticity section, at the
    scale and assumptions of the suite ``definition``'s ``projection`` (defaults where it names none)."""
    projection = definition.get("projection")
    scale, source = _scale(projection)
    blocks: list[Block] = [Heading(3, "Checkpoint interval (Young/Daly)")]
    yd = young_daly_table(rows, scale)
    blocks.append(yd if yd.rows else Paragraph(f"{MISSING} (no checkpoint saves measured)"))
    blocks.append(
        Heading(
            3,
            f"Fleet projection: {scale.nodes} nodes x {scale.gpus_per_node} GPUs, "
            f"node MTBF {scale.node_mtbf_h:.0f} h",
        )
    )
    blocks.append(
        Paragraph(
            f"Scale from {source}: job MTBF = node MTBF / nodes = {scale.job_mtbf_s / 3600:.2f} h, "
            f"{scale.interruptions_per_day:.1f} interruptions per day."
        )
    )
    _, notes = assumptions_from(projection)
    blocks.append(Paragraph("Assumed: " + "; ".join(notes) + "."))
    pt = projection_table(rows, scale, projection)
    blocks.append(pt if pt.rows else Paragraph(f"{MISSING} (no fault run of a class in the fault mix fired)"))
    blocks += elasticity_blocks(rows, definition, assumptions_from(projection)[0])
    return blocks
