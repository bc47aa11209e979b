"""The report's serving section, shown when the result set has serving runs (``serving`` true: replicas behind a
balancer under a load): per fault, a table comparing the recovery policies (the framework entries: no health
checks, health checks, a supervisor, retries) on time to detect, time to recover, failed requests, error-budget
burn, p99 latency during the incident and capacity lost, as medians with percentile-bootstrap 95 % intervals; the
controls' baseline; and per policy x fault the per-second plot of successful and failed requests and the p99
latency of its first repeat that has one, with the fault marked. The numbers are the results table's
(definitions: :mod:`chaosbench.analysis.serving`). The plot is the run's own ``per_second.png``, drawn from its
``events.jsonl`` when the run ended (:func:`draw_run_per_second`, a post-run hook); the report reads no timeline
unless asked to draw absent plots (``plots="missing"``) or all again (``"all"``). matplotlib is imported inside the
plotting function."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.analysis.serving import load_of, per_second
from chaosbench.analysis.stats import median_ci, wilson
from chaosbench.analysis.timeline_index import TimelineIndex
from chaosbench.analysis.timing import fault_effect_ns
from chaosbench.report.document import Block, Cell, Heading, Image, Paragraph, Table
from chaosbench.report.fmt import (
    MISSING,
    as_bool,
    as_float,
    as_int,
    as_text,
    fmt_count,
    fmt_percent,
    fmt_seconds,
)
from chaosbench.report.links import href, run_dir_candidates
from chaosbench.report.plots import DrawnTimeline, load_run_events
from chaosbench.rundir import RunDir, replace_atomic
from chaosbench.timeline import Event

if TYPE_CHECKING:
    from chaosbench.analysis.metrics import RunMetrics

#: Metrics of the per-scenario table for a serving scenario, and how each is formatted.
SERVING_METRICS: list[tuple[str, str]] = [
    ("time_to_detect_s", "s"),
    ("time_to_recover_s", "s"),
    ("requests", "count"),
    ("failed_requests", "count"),
    ("retried_requests", "count"),
    ("error_rate", "fraction"),
    ("budget_request_rate_per_s", "number"),
    ("error_budget_burn", "number"),
    ("latency_p50_ms", "number"),
    ("latency_p99_ms", "number"),
    ("latency_p50_before_ms", "number"),
    ("latency_p99_before_ms", "number"),
    ("latency_p50_during_ms", "number"),
    ("latency_p99_during_ms", "number"),
    ("latency_p50_after_ms", "number"),
    ("latency_p99_after_ms", "number"),
    ("capacity_lost_replica_s", "s"),
    ("capacity_lost_share", "fraction"),
    ("throughput_during_share", "fraction"),
    ("replicas", "count"),
    ("restart_count", "count"),
    ("restarts_claimed", "count"),
    ("injection_latency_s", "s"),
    ("wall_s", "s"),
    ("time_burned_s", "s"),
]

#: Figure size in inches and resolution of a per-second plot.
FIGSIZE_IN = (9.0, 3.6)
DPI = 80
#: A serving run's per-second plot, in its run directory.
PER_SECOND_PNG = "per_second.png"
#: Why a serving run has no per-second plot in ``plots="existing"`` mode.
NOT_DRAWN = "drawn when the run ends; `chaosbench report --plots missing` draws missing ones"


def is_serving(row: dict[str, Any]) -> bool:
    """A results row of a serving run."""
    return as_bool(row.get("serving")) is True


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [v for r in rows if (v := as_float(r.get(key))) is not None]


def _ms(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _est(rows: Sequence[dict[str, Any]], key: str, fmt: Callable[[float], str] = fmt_seconds) -> str:
    """Median [95 % CI] of ``key`` over ``rows``; ``(n=1)`` for one value."""
    e = median_ci(_values(rows, key))
    if e.median is None:
        return MISSING
    if e.lo is None or e.hi is None:
        return f"{fmt(e.median)} (n=1)"
    return f"{fmt(e.median)} [{fmt(e.lo)}, {fmt(e.hi)}]"


def _median(rows: Sequence[dict[str, Any]], key: str, fmt: Callable[[float], str]) -> str:
    e = median_ci(_values(rows, key))
    return MISSING if e.median is None else fmt(e.median)


def _recovered(rows: Sequence[dict[str, Any]]) -> str:
    k = sum(1 for r in rows if as_bool(r.get("recovered")) is True)
    p, lo, hi = wilson(k, len(rows))
    return (
        MISSING if p is None or lo is None or hi is None else f"{k}/{len(rows)} ({p:.0%}; {lo:.0%}-{hi:.0%})"
    )


def _via(rows: Sequence[dict[str, Any]]) -> str:
    counts = Counter(as_text(r.get("detected_via")) or "not detected" for r in rows)
    return ", ".join(f"{n} {k}" for k, n in counts.most_common())


def _percent(v: float) -> str:
    """Three significant digits: a burn of 0.14 % is not 0.1 %."""
    return f"{v * 100:.3g}%"


def fault_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One row per recovery policy (framework) of the fault runs of one fault whose fault fired."""
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    out: list[list[Cell]] = []
    for fw, rs in sorted(by_fw.items()):
        out.append(
            [
                fw,
                str(len(rs)),
                _recovered(rs),
                _est(rs, "time_to_detect_s"),
                _via(rs),
                _est(rs, "time_to_recover_s"),
                _est(rs, "failed_requests", fmt_count),
                _median(rs, "retried_requests", fmt_count),
                _est(rs, "error_budget_burn", _percent),
                _median(rs, "latency_p99_before_ms", _ms),
                _est(rs, "latency_p99_during_ms", _ms),
                _median(rs, "latency_p99_after_ms", _ms),
                _est(rs, "throughput_during_share", fmt_percent),
                _est(rs, "capacity_lost_replica_s"),
                _median(rs, "capacity_lost_share", fmt_percent),
            ]
        )
    return Table(
        [
            "policy (framework)",
            "runs",
            "recovered (95 % CI)",
            "time to detect (s)",
            "detected by",
            "time to recover (s)",
            "failed requests",
            "retried (median)",
            "error budget burn",
            "p99 before (ms, median)",
            "p99 during (ms)",
            "p99 after (ms, median)",
            "pace during (of before)",
            "capacity lost (replica-s)",
            "capacity lost (share, median)",
        ],
        out,
        numeric={1, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14},
        caption="Runs whose fault fired. Medians with percentile-bootstrap 95 % intervals [lo, hi] (n=1: one run); "
        "recovered rate with a Wilson interval. Detection: the balancer marking the faulted replica down or "
        "the first failed request, whichever first; recovery: the first span of the SLO's recovery window "
        "with every window's error rate under the SLO (also over the request timeout after it); burn: the "
        "share of the SLO window's error budget the failed requests used; pace: requests per second during "
        "the fault over before it.",
    )


def control_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The controls' baseline per framework: requests, failures, rate and latency without a fault."""
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    out: list[list[Cell]] = []
    for fw, rs in sorted(by_fw.items()):
        clean = sum(1 for r in rs if as_bool(r.get("clean")) is True)
        out.append(
            [
                fw,
                str(len(rs)),
                f"{clean}/{len(rs)}",
                _median(rs, "requests", fmt_count),
                _median(rs, "failed_requests", fmt_count),
                _median(rs, "budget_request_rate_per_s", _ms),
                _est(rs, "latency_p50_ms", _ms),
                _est(rs, "latency_p99_ms", _ms),
            ]
        )
    return Table(
        [
            "policy (framework)",
            "control runs",
            "clean",
            "requests (median)",
            "failed (median)",
            "requests/s (median)",
            "p50 (ms)",
            "p99 (ms)",
        ],
        out,
        numeric={1, 3, 4, 5, 6, 7},
        caption="Fault-free controls: the error budget's request rate comes from them.",
    )


# ------------------------------------------------------------------------------------------------- the plots
def per_second_title(row: Mapping[str, Any]) -> str:
    """A per-second plot's title from the run's metrics row: ``health · kill-replica1 · repeat 0: recovered``."""
    return (
        f"{as_text(row.get('framework'))} · {as_text(row.get('fault'))} · repeat {as_int(row.get('repeat'))}: "
        f"{as_text(row.get('outcome')) or MISSING}"
    )


def draw_run_per_second(run_dir: str | Path, metrics: RunMetrics | Mapping[str, Any]) -> DrawnTimeline:
    """Draw a serving run's ``<run_dir>/per_second.png`` from its ``events.jsonl``, titled and marked from its
    metrics (a :class:`~chaosbench.analysis.metrics.RunMetrics` or its results-table row). Meant to be called
    once when the run ends; the report then only shows it. The PNG is renamed into place whole. Never raises:
    ``(path, None)``, or ``(None, reason)`` when there is nothing to draw (no timeline, no load) or drawing
    failed, so a plot never costs a run or a report."""
    try:
        row: Mapping[str, Any] = metrics if isinstance(metrics, Mapping) else vars(metrics)
        events = load_run_events(run_dir)
        if not events:
            return DrawnTimeline(None, "no timeline")
        if per_second(events) is None:
            return DrawnTimeline(None, "the run recorded no load")
        title, recover_s = per_second_title(row), as_float(row.get("time_to_recover_s"))
        png = replace_atomic(
            Path(run_dir) / PER_SECOND_PNG, lambda tmp: plot_per_second(events, tmp, title, recover_s)
        )
        return DrawnTimeline(png, None)
    except OSError as exc:
        return DrawnTimeline(None, f"timeline unreadable or plot not written: {exc}")
    except Exception as exc:  # noqa: BLE001 - a plotting bug must not cost the run or the report; it is reported
        return DrawnTimeline(None, f"plot failed: {type(exc).__name__}: {exc}")


def plot_per_second(
    events: Sequence[Event], out_path: Path, title: str, recover_s: float | None = None
) -> bool:
    """Draw the run's load per second (successful and failed requests, p99 latency of the successes) with the
    fault, the recovery (``recover_s`` after the fault) and the balancer's down/up marks; False when the run has
    no load."""
    series = per_second(events)
    ix = TimelineIndex(events)
    load = load_of(ix)
    if series is None or load is None:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    x = [t + 0.5 for t in series.t_s]
    top.bar(x, series.ok, width=1.0, color="#2ca02c", label="successful")
    top.bar(x, series.failed, width=1.0, bottom=series.ok, color="#d62728", label="failed")
    top.set_ylabel("requests / s", fontsize=8)
    px = [xi for xi, p in zip(x, series.p99_ms, strict=True) if p is not None]
    py = [p for p in series.p99_ms if p is not None]
    bottom.plot(px, py, color="#1f77b4", lw=1.2, marker=".", ms=3, label="p99 latency")
    bottom.set_ylabel("p99 (ms)", fontsize=8)
    if py and max(py) / max(min(py), 1e-9) > 20:
        bottom.set_yscale("log")
    fault = ix.first("fault_inject")
    t0 = load.t0_ns
    for ax in (top, bottom):
        if fault is not None:
            tf = fault_effect_ns(ix, fault)
            ax.axvline((tf - t0) / 1e9, color="#d62728", lw=1.2, label="fault" if ax is top else None)
            if recover_s is not None:
                ax.axvline(
                    (tf - t0) / 1e9 + recover_s,
                    color="#000000",
                    lw=1.2,
                    ls="--",
                    label="recovered" if ax is top else None,
                )
        for e in ix.of("balancer_down", "balancer_up"):
            down = e.kind == "balancer_down"
            ax.axvline(
                (e.t_ns - t0) / 1e9,
                color="#ff7f0e" if down else "#9467bd",
                lw=0.8,
                ls=":",
                label=("replica marked down" if down else "replica marked up") if ax is top else None,
            )
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", color="#eeeeee", lw=0.5)
    handles, labels = top.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    top.legend(
        list(seen.values()),
        list(seen),
        fontsize=6,
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        frameon=False,
    )
    bottom.set_xlabel("seconds since the load started", fontsize=8)
    top.set_title(title, fontsize=9)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png", dpi=DPI, bbox_inches="tight")
    return True


def _per_second_png(rows: Sequence[dict[str, Any]], suite_dir: Path, plots: str) -> tuple[Path | None, str]:
    """The per-second plot to show of one policy's runs (by repeat), and whether this call drew it: the first
    repeat's ``per_second.png`` there is (``plots`` ``existing``/``missing``); else, with ``missing``, or always
    with ``all``, the first repeat that can be drawn, drawn now. ``(None, why)`` when there is none."""
    rows = sorted(rows, key=lambda r: as_int(r.get("repeat")) or 0)
    if plots != "all":
        for r in rows:
            for d in map(Path, run_dir_candidates(str(suite_dir), r)):
                if (d / PER_SECOND_PNG).is_file():
                    return d / PER_SECOND_PNG, ""
        if plots == "existing":
            return None, NOT_DRAWN
    why = "no run's events.jsonl found"
    for r in rows:
        for d in map(Path, run_dir_candidates(str(suite_dir), r)):
            if (d / RunDir.EVENTS).is_file():
                png, reason = draw_run_per_second(d, r)
                if png is not None:
                    return png, "drawn"
                why = reason or why
                break
    return None, why


def plot_blocks(
    fault: str, rows: Sequence[dict[str, Any]], suite_dir: Path, plots: str = "existing"
) -> tuple[list[Block], dict[str, Path]]:
    """One per-second plot per framework for ``fault``: its first repeat's ``per_second.png`` (drawn when the run
    ended; with ``plots`` ``missing`` or ``all`` drawn here, see :func:`_per_second_png`), shown in the report
    by its path and embedded in the HTML. Returns the blocks and the PNGs this call drew, by path relative to
    ``suite_dir``."""
    blocks: list[Block] = []
    written: dict[str, Path] = {}
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    for fw, rs in sorted(by_fw.items()):
        png, how = _per_second_png(rs, suite_dir, plots)
        if png is None:
            blocks.append(Paragraph(f"{fw} · {fault}: no per-second plot ({how})."))
            continue
        rel = href(os.path.abspath(png), os.path.abspath(suite_dir))
        blocks.append(Image(rel, f"requests and p99 latency per second: {fw}, {fault}"))
        if how == "drawn":
            written[Path(os.path.relpath(os.path.abspath(png), os.path.abspath(suite_dir))).as_posix()] = png
    return blocks, written


def serving_blocks(
    rows: Sequence[dict[str, Any]], suite_dir: Path, plots: str = "existing"
) -> tuple[list[Block], dict[str, Path]]:
    """The section and the plots it drew (paths relative to ``suite_dir``; ``plots``: see :func:`plot_blocks`),
    or nothing without serving runs."""
    runs = [r for r in rows if is_serving(r)]
    if not runs:
        return [], {}
    controls = [r for r in runs if as_bool(r.get("control")) is True]
    faulted = [
        r
        for r in runs
        if as_bool(r.get("control")) is not True and r.get("outcome") in ("recovered", "not_recovered")
    ]
    unfired = sum(1 for r in runs if r.get("outcome") == "fault_not_fired")
    blocks: list[Block] = [
        Heading(2, "Serving: recovery policies under load"),
        Paragraph(
            "Replicas behind a load balancer, driven by a load of users; each policy (framework entry) "
            "faced the same faults. Time to detect: from the fault to the balancer marking the replica down "
            "or the first failed request; time to recover: to the first span of the SLO's recovery window "
            "whose every load window kept the error rate under the SLO; error budget burn: failed requests "
            "over the requests the availability SLO allows to fail in its window at the control's request "
            "rate; capacity lost: replica-seconds in which a replica could not serve (dead, frozen or held "
            "out by the balancer)."
        ),
    ]
    if controls:
        blocks.append(control_table(controls))
    written: dict[str, Path] = {}
    by_fault: dict[str, list[dict[str, Any]]] = {}
    for r in faulted:
        by_fault.setdefault(str(r.get("fault")), []).append(r)
    for fault, rs in sorted(by_fault.items()):
        blocks += [Heading(3, f"Fault: {fault}"), fault_table(rs)]
        drawn, w = plot_blocks(fault, rs, suite_dir, plots)
        blocks += drawn
        written.update(w)
    if unfired:
        blocks.append(Paragraph(f"{unfired} serving run(s) whose fault did not fire are left out."))
    if not by_fault:
        blocks.append(Paragraph("No serving run with a fault that fired."))
    return blocks, written
