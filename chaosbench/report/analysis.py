"""Cross-framework analysis blocks of a report: medians with bootstrap intervals and success rates per
framework x fault cell, time-to-resume distributions, badput waterfalls, detection against timeouts,
Young/Daly checkpoint intervals and the fleet-scale goodput projection."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaosbench.fleet import LLAMA3, FleetScale, costs_from_rows, project
from chaosbench.report.document import Block, Cell, Heading, Image, Paragraph, Table
from chaosbench.report.fmt import MISSING
from chaosbench.stats import median_ci, wilson, young_daly_interval_s

STAGES = ("badput_detect_s", "badput_restart_init_s", "badput_restore_s", "badput_recompute_s")
STAGE_LABELS = ("detect", "restart/init", "restore", "recompute")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


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
    return [v for r in rs if (v := _num(r.get(key))) is not None]


def stats_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Per fault x framework: success rate (Wilson 95 %) and medians with bootstrap 95 % intervals."""
    out: list[list[Cell]] = []
    for (fault, fw), rs in _cells(rows).items():
        ok = sum(1 for r in rs if r.get("outcome") == "recovered")
        p, lo, hi = wilson(ok, len(rs))
        rate = MISSING if p is None else f"{ok}/{len(rs)} ({p:.0%}; {lo:.0%}-{hi:.0%})"
        out.append([fault, fw, rate, _ci_text(_values(rs, "time_to_detect_s")),
                    _ci_text(_values(rs, "time_to_resume_s")), _ci_text(_values(rs, "lost_steps")),
                    _ci_text(_values(rs, "extra_wall_s"))])  # fmt: skip
    return Table(
        ["fault", "framework", "recovered (95 % CI)", "time_to_detect_s median [95 % CI]",
         "time_to_resume_s median [95 % CI]", "lost_steps median [95 % CI]", "extra_wall_s median [95 % CI]"],
        out,
        caption="Medians with percentile-bootstrap 95 % intervals over repeats; success rates with Wilson intervals.",
    )  # fmt: skip


def detection_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Time to detect next to the detection knobs in force (each adapter's timeouts)."""
    out: list[list[Cell]] = []
    for (fault, fw), rs in _cells(rows).items():
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
        out.append([fault, fw, _s(med), f"{len(ttd)}/{len(rs)}", knob_text])
    return Table(["fault", "framework", "median time_to_detect_s", "detected", "timeouts in force (s)"], out)


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
    ax.set_xlabel("seconds (median of each stage)")
    ax.set_title("badput waterfall: detect, restart/init, restore, recompute", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


def _scale(projection: dict[str, Any] | None) -> tuple[FleetScale, str]:
    if projection:
        return (
            FleetScale(int(projection["nodes"]), int(projection.get("gpus_per_node", 8)),
                       float(projection["node_mtbf_h"])),
            "the suite's projection settings",
        )  # fmt: skip
    return LLAMA3, "Llama 3's reported scale (16,384 GPUs, 466 interruptions in 54 days), for orientation"


def young_daly_table(rows: Sequence[dict[str, Any]], checkpoint_every: int | None, scale: FleetScale) -> Table:
    out: list[list[Cell]] = []
    for c in costs_from_rows(rows, checkpoint_every):
        opt = young_daly_interval_s(c.checkpoint_cost_s, scale.job_mtbf_s)
        out.append([c.framework, _s(c.checkpoint_cost_s), _s(c.checkpoint_interval_s), _s(opt, 1),
                    f"{c.checkpoint_interval_s / opt:.3g}x"])  # fmt: skip
    return Table(["framework", "checkpoint cost C (s)", "configured interval (s)", "Young/Daly optimum (s)",
                  "configured / optimum"], out,
                 caption=f"Job MTBF M = {scale.job_mtbf_s:.0f} s; optimum = sqrt(2CM) with Daly's correction.")  # fmt: skip


def projection_table(rows: Sequence[dict[str, Any]], checkpoint_every: int | None, scale: FleetScale,
                     projection: dict[str, Any] | None) -> Table:  # fmt: skip
    out: list[list[Cell]] = []
    opts = projection or {}
    for c in costs_from_rows(rows, checkpoint_every):
        p = project(c, scale, horizon_days=float(opts.get("horizon_days", 30)), trials=int(opts.get("trials", 200)),
                    recovery_scale=float(opts.get("recovery_scale", 1.0)))  # fmt: skip
        out.append([p.framework, f"{p.gpus}", f"{p.interruptions_per_day:.2f}", _s(p.recovery_s_median),
                    f"{p.goodput_analytic:.2%}", f"{p.goodput_analytic_at_optimum:.2%}",
                    f"{p.goodput_mc_mean:.2%} ({p.goodput_mc_p5:.2%}-{p.goodput_mc_p95:.2%})"])  # fmt: skip
    return Table(["framework", "GPUs", "interruptions/day", "recovery (s, measured median)",
                  "goodput (analytic)", "goodput at Young/Daly interval", "goodput (Monte Carlo, 5-95 %)"], out,
                 caption="Recovery = detect + restart/init + restore measured here; recompute modelled as half "
                         "an interval per failure. Costs at test scale: restart at fleet scale usually costs more "
                         "(projection.recovery_scale).")  # fmt: skip


def analysis_blocks(
    rows: Sequence[dict[str, Any]], suite_dir: Path, definition: dict[str, Any] | None
) -> tuple[list[Block], dict[str, Path]]:
    """The analysis section; ``definition`` is the suite's own definition (from suite.json), if known."""
    if not _cells(rows):
        return [], {}
    blocks: list[Block] = [Heading(2, "Framework comparison"), stats_table(rows)]
    written: dict[str, Path] = {}
    plots = suite_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    for name, fn, alt in (("distribution_time_to_resume.png", _plot_distribution, "time to resume"),
                          ("badput_waterfall.png", _plot_waterfall, "badput waterfall")):  # fmt: skip
        try:
            if fn(rows, plots / name):
                blocks.append(Image(f"plots/{name}", alt))
                written[f"plots/{name}"] = plots / name
        except Exception as exc:  # noqa: BLE001 - a plot never costs the report
            blocks.append(Paragraph(f"{alt} plot failed: {type(exc).__name__}: {exc}"))
    blocks += [Heading(3, "Detection against the timeouts in force"), detection_table(rows)]
    bounds = _values(rows, "clock_offset_bound_s")
    if bounds:
        blocks.append(Paragraph(
            f"Clocks: each node's clock offset was measured at the start of its run and stamps written on other "
            f"hosts were corrected; every corrected stamp is within {max(bounds) * 1e3:.3f} ms (largest bound)."
        ))  # fmt: skip
    definition = definition or {}
    wl = (definition.get("defaults") or {}).get("workload") or {}
    checkpoint_every = wl.get("checkpoint_every", 10 if wl.get("name", "ddp-mlp") == "ddp-mlp" else None)
    projection = definition.get("projection")
    scale, source = _scale(projection)
    blocks.append(Heading(3, "Checkpoint interval (Young/Daly)"))
    yd = young_daly_table(rows, checkpoint_every, scale)
    blocks.append(yd if yd.rows else Paragraph(f"{MISSING} (needs recovered runs, checkpoint costs and step times)"))
    blocks.append(Heading(3, f"Fleet projection: {scale.nodes} nodes x {scale.gpus_per_node} GPUs, "
                             f"node MTBF {scale.node_mtbf_h:.0f} h"))  # fmt: skip
    blocks.append(Paragraph(f"Scale from {source}: job MTBF = node MTBF / nodes = {scale.job_mtbf_s / 3600:.2f} h, "
                            f"{scale.interruptions_per_day:.1f} interruptions per day."))  # fmt: skip
    pt = projection_table(rows, checkpoint_every, scale, projection)
    blocks.append(pt if pt.rows else Paragraph(f"{MISSING} (needs recovered runs with measured recovery stages)"))
    return blocks, written
