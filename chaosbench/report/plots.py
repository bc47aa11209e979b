"""Per-run timeline plots, drawn only from the run's ``events.jsonl``, into the run's own directory
(``<run_dir>/timeline.png``): once when the run ends (:func:`draw_run_timeline`, which never raises), and again
only when ``chaosbench report`` is asked to; the report links them.

x is seconds since the run's ``run_start`` event (the first event when there is none). The top panel draws the
step each rank completed over time, a line per rank and incarnation (labelled ``node/rankN`` when the rank's
``rank_start`` names its node; a restart starts a new line from the step it restored, a rank that stalls or is
lost leaves the others' lines), with complete checkpoint saves (black down-triangles) and loads (green
up-triangles) at their step, and the first fault's recovery shaded phase by phase: fault -> detect -> restart ->
restore -> resume (a serving run: fault -> detect -> recover), grey to the run's end when no step followed. A
panel below holds lanes for the processes (``proc_start``/``proc_exit``) and nodes (and the ranks of a run
without steps: a serving run's replicas). Thin vertical lines mark every fault (red), detection (orange), restart
(purple), revert and the run's end, and the first step after recovery (green, from the results table since
"recovery" is a metric, not an event).

matplotlib is imported inside the functions and only its Agg canvas is used (no pyplot, no global backend
switch), so the harness and its tests stay headless and importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from chaosbench.report.fmt import MISSING, as_bool, as_float, as_int, as_text
from chaosbench.rundir import RunDir, replace_atomic
from chaosbench.timeline import Event, read_events

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from chaosbench.analysis.metrics import RunMetrics

#: A run's timeline plot, in its own run directory (drawn once when the run ends; linked by the report).
TIMELINE_PNG = RunDir.TIMELINE_PNG

#: Figure size in inches and resolution: 9x3 in at 80 dpi is ~720x240 px, a few tens of kB per PNG (taller by the
#: lanes panel below the steps when the run has one).
FIGSIZE_IN = (9.0, 3.0)
DPI = 80

_LINE_STYLES: dict[str, dict[str, Any]] = {
    "fault": {"color": "#d62728", "lw": 1.2, "ls": "-"},
    "fault revert": {"color": "#d62728", "lw": 0.9, "ls": ":"},
    "detect": {"color": "#ff7f0e", "lw": 1.0, "ls": "-"},
    "restart": {"color": "#9467bd", "lw": 1.0, "ls": "-"},
    "resume (first step after recovery)": {"color": "#2ca02c", "lw": 1.2, "ls": "-"},
    "give up": {"color": "#000000", "lw": 1.0, "ls": "--"},
    "recovered (error rate back under the SLO)": {"color": "#2ca02c", "lw": 1.2, "ls": "--"},
    "replica marked down": {"color": "#ff7f0e", "lw": 0.8, "ls": ":"},
    "replica marked up": {"color": "#9467bd", "lw": 0.8, "ls": ":"},
    "run end": {"color": "#999999", "lw": 0.8, "ls": "--"},
}
#: Events drawn as a vertical line: event kind -> line (a key of ``_LINE_STYLES``).
_MARKED = {
    "fault_inject": "fault",
    "fault_revert": "fault revert",
    "detect": "detect",
    "restart": "restart",
    "give_up": "give up",
    "run_end": "run end",
    "balancer_down": "replica marked down",
    "balancer_up": "replica marked up",
}
_NODE_KINDS = {"node_start", "node_exit", "node_pause", "node_unpause"}
_NODE_STYLES: dict[str, tuple[str, dict[str, Any]]] = {
    "node_start": ("node start", {"marker": "^", "color": "#2ca02c"}),
    "node_exit": ("node exit", {"marker": "v", "color": "#d62728"}),
    "node_pause": ("node pause", {"marker": "s", "color": "#1f77b4", "fillstyle": "none"}),
    "node_unpause": ("node unpause", {"marker": "s", "color": "#1f77b4"}),
}
_RANK_KINDS = {
    "rank_start",
    "rank_exit",
    "step",
    "ckpt_save_begin",
    "ckpt_save_end",
    "train_end",
    "replica_ready",
}


@dataclass(frozen=True)
class RunMarkers:
    """Times (s since run_start) from the results table; fault/detect are used only when the timeline lacks them;
    ``recover_t_s``: a serving run's recovery (its error rate back under the SLO); ``serving``: a serving run (its
    recovery ends there, not at a resume)."""

    resume_t_s: float | None = None
    recover_t_s: float | None = None
    fault_t_s: float | None = None
    detect_t_s: float | None = None
    serving: bool = False


def events_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RunDir.EVENTS


def timeline_png(run_dir: str | Path) -> Path:
    """Where a run's timeline plot lies: ``<run_dir>/timeline.png``."""
    return Path(run_dir) / TIMELINE_PNG


def load_run_events(run_dir: str | Path) -> list[Event]:
    """The run's events sorted by time; ``[]`` when there is no timeline."""
    return read_events(events_path(run_dir))


def time_origin_ns(events: Sequence[Event]) -> int | None:
    """``t_ns`` of the first ``run_start`` event, else of the first event; ``None`` for no events."""
    for ev in events:
        if ev.kind == "run_start":
            return ev.t_ns
    return min((ev.t_ns for ev in events), default=None)


def _rank_label(rank: int | None, nodes: list[str]) -> str:
    name = f"rank{rank}" if rank is not None else "rank ?"
    return f"{'+'.join(nodes)}/{name}" if nodes else name


def _incarnation_key(value: Any) -> tuple[int, int]:
    inc = as_int(value)
    return (1, 0) if inc is None else (0, inc)


#: The recovery's phases, shaded between its milestones (each phase named by the milestones it spans, coloured as
#: the line of the milestone that begins it): fault -> detect -> restart -> restore -> resume; a milestone the run
#: lacks is skipped (a framework that recovers in place has no restart), and from the last milestone of a fault
#: not resumed to the run's end is shaded grey when no step followed it.
_PHASE_COLORS = {"fault": "#d62728", "detect": "#ff7f0e", "restart": "#9467bd", "restore": "#2ca02c"}
_NOT_RESUMED = "#999999"
#: Up to this many ranks get a colour (and a legend entry) each; more are drawn in one colour. The colours avoid
#: red/orange/purple/green, which the vertical markers and phases use.
_MAX_RANK_COLORS = 8
_RANK_COLORS = ["#1f77b4", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939"]


def _milestones(events: Sequence[Event], rel: Any, markers: RunMarkers) -> list[tuple[str, float]]:
    """The first fault's recovery milestones in time order (s since the origin): the fault and its detection
    (from the results table, else the first such events), the first ``restart`` after them, the first
    ``ckpt_load_end`` after that (the restore), and the resume (the first step after recovery, a metric); a
    serving run's: the fault, its detection and its recovery (the error rate back under the SLO). A milestone
    missing, or earlier than the one before it, is left out."""

    def first(kind: str, after: float | None) -> float | None:
        return next(
            (rel(ev) for ev in events if ev.kind == kind and (after is None or rel(ev) >= after)), None
        )

    fault = as_float(markers.fault_t_s)
    if fault is None:
        fault = first("fault_inject", None)
    if fault is None:
        return []
    detect = as_float(markers.detect_t_s)
    if detect is None:
        detect = first("detect", fault)
    if markers.serving:  # replicas restart on their own while the others serve: its end is the error rate's
        later: tuple[tuple[str, float | None], ...] = (
            ("detect", detect),
            ("recover", as_float(markers.recover_t_s)),
        )
    else:
        restart = first("restart", detect if detect is not None else fault)
        restore = first("ckpt_load_end", restart if restart is not None else fault)
        later = (
            ("detect", detect),
            ("restart", restart),
            ("restore", restore),
            ("resume", as_float(markers.resume_t_s)),
        )
    out = [("fault", fault)]
    for name, t in later:
        if t is not None and t >= out[-1][1]:
            out.append((name, t))
    return out


def plot_timeline(
    events: Sequence[Event],
    out_path: str | Path,
    title: str,
    markers: RunMarkers | None = None,
) -> Path:
    """Draw one run's timeline (:func:`timeline_figure`) and save it as PNG at ``out_path``; returns the path.
    Raises ``ValueError`` only when there are no events at all."""
    fig = timeline_figure(events, title, markers)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png", dpi=DPI, bbox_inches="tight")
    return out_path


@dataclass
class _Drawing:
    """What the timeline's parts share while they draw: the time axis (``rel``: an event's seconds since the
    origin), the axes every vertical mark spans (top first), the legend's entries in the order they were first
    drawn, and every x drawn (the x limits span them)."""

    rel: Callable[[Event], float]
    axes: list[Axes]
    handles: dict[str, Any] = field(default_factory=dict)
    xs: list[float] = field(default_factory=lambda: [0.0])


@dataclass
class _Lanes:
    """The lanes panel's rows, top to bottom: the ranks (only in a run without steps), the processes (when any
    process event is there), then one lane per node; ``labels`` names them in that order."""

    labels: list[str]
    rank_lane: dict[int | None, int]
    proc_events: list[Event]
    proc_lane: int | None
    node_events: list[Event]
    node_lane: dict[str, int]


def _ranks(events: Sequence[Event]) -> tuple[list[int | None], dict[int | None, list[str]]]:
    """The ranks in the timeline, in order (an unknown rank last), and the nodes each ran on (from its
    ``rank_start`` events), for the step lines' legend or, without steps, the rank lanes."""
    ranks: set[int | None] = set()
    nodes: dict[int | None, list[str]] = {}
    for ev in events:
        if ev.kind in _RANK_KINDS and ("rank" in ev.data or ev.kind in {"rank_start", "step"}):
            rank = as_int(ev.get("rank"))
            ranks.add(rank)
            node = ev.get("node")
            if ev.kind == "rank_start" and node is not None:
                seen = nodes.setdefault(rank, [])
                if str(node) not in seen:
                    seen.append(str(node))
    rank_order = sorted(r for r in ranks if r is not None) + ([None] if None in ranks else [])
    return rank_order, nodes


def _lanes(
    events: Sequence[Event], has_steps: bool, rank_order: list[int | None], nodes: dict[int | None, list[str]]
) -> _Lanes:
    """The lanes panel's rows: ranks (only without steps), processes, nodes."""
    labels: list[str] = []
    rank_lane: dict[int | None, int] = {}
    if not has_steps:
        rank_lane = {r: i for i, r in enumerate(rank_order)}
        labels = [_rank_label(r, nodes.get(r, [])) for r in rank_order]
    proc_events = [ev for ev in events if ev.kind in {"proc_start", "proc_exit"}]
    proc_lane = len(labels) if proc_events else None
    if proc_lane is not None:
        labels.append("processes")
    node_events = [ev for ev in events if ev.kind in _NODE_KINDS and ev.get("node")]
    node_names = sorted({str(ev.get("node")) for ev in node_events})
    node_lane = {n: len(labels) + i for i, n in enumerate(node_names)}
    labels += [f"node {n}" for n in node_names]
    return _Lanes(labels, rank_lane, proc_events, proc_lane, node_events, node_lane)


def _new_figure(has_steps: bool, n_lanes: int) -> tuple[Figure, Axes | None, Axes | None]:
    """The figure on an Agg canvas and its axes: the steps' on top and the lanes' below (sharing x) when the run
    has both, else whichever it has (the lanes' when it has neither)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    two = has_steps and bool(n_lanes)
    fig = Figure(figsize=(FIGSIZE_IN[0], FIGSIZE_IN[1] + (0.25 * n_lanes + 0.4 if two else 0)), dpi=DPI)
    FigureCanvasAgg(fig)
    step_ax: Axes | None
    lane_ax: Axes | None
    if two:
        grid = fig.add_gridspec(2, 1, height_ratios=[3, max(0.6, 0.35 * n_lanes)], hspace=0.08)
        step_ax = fig.add_subplot(grid[0])
        lane_ax = fig.add_subplot(grid[1], sharex=step_ax)
        step_ax.tick_params(labelbottom=False)
    else:
        step_ax = fig.add_subplot() if has_steps else None
        lane_ax = fig.add_subplot() if step_ax is None else None
    return fig, step_ax, lane_ax


def _draw_steps(
    d: _Drawing,
    ax: Axes,
    step_events: Sequence[Event],
    rank_order: list[int | None],
    nodes: dict[int | None, list[str]],
) -> None:
    """A line per rank and incarnation: the step it completed over time (one colour per rank up to
    ``_MAX_RANK_COLORS`` ranks, else one for all)."""
    lines: dict[tuple[int | None, tuple[int, int]], tuple[list[float], list[int]]] = {}
    for ev in step_events:
        key = (as_int(ev.get("rank")), _incarnation_key(ev.get("incarnation")))
        xs, ys = lines.setdefault(key, ([], []))
        xs.append(d.rel(ev))
        ys.append(as_int(ev.get("step")) or 0)
    each = len(rank_order) <= _MAX_RANK_COLORS
    for (rank, inc), (xs, ys) in sorted(
        lines.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
    ):
        d.xs += xs
        i = rank_order.index(rank) if each else 0
        color = _RANK_COLORS[i % len(_RANK_COLORS)]
        name = _rank_label(rank, nodes.get(rank, [])) if each else f"steps of {len(rank_order)} ranks"
        (h,) = ax.plot(
            xs,
            ys,
            lw=1.3,
            color=color,
            ms=4,
            marker="." if len(xs) < 3 else "",
            gid=f"steps rank {rank} incarnation {inc[1] if inc[0] == 0 else '?'}",
        )
        d.handles.setdefault(name, h)
    ax.set_ylabel("step", fontsize=8)


def _draw_checkpoints(d: _Drawing, ax: Axes, events: Sequence[Event]) -> None:
    """Checkpoints saved (complete) and loaded, where they happened on the step axis (along its top edge when the
    event names no step)."""
    ckpt_styles: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("ckpt_save_end", "checkpoint saved", {"marker": "v", "color": "black", "ms": 5}),
        (
            "ckpt_load_end",
            "checkpoint loaded",
            {"marker": "^", "color": "#2ca02c", "ms": 6, "mec": "black", "mew": 0.5},
        ),
    )
    for kind, name, ckpt_style in ckpt_styles:
        pts = [
            (d.rel(ev), as_int(ev.get("step")))
            for ev in events
            if ev.kind == kind and (kind != "ckpt_save_end" or as_bool(ev.get("complete")))
        ]
        at = [(x, s) for x, s in pts if s is not None]
        if at:
            (h,) = ax.plot([x for x, _ in at], [s for _, s in at], ls="none", zorder=3, **ckpt_style)
            d.handles[name] = h
        if edge := [x for x, s in pts if s is None]:  # no step recorded: along the top edge
            (h,) = ax.plot(
                edge,
                [1.0] * len(edge),
                ls="none",
                transform=ax.get_xaxis_transform(),
                clip_on=False,
                **ckpt_style,
            )
            d.handles.setdefault(name, h)
        d.xs += [x for x, _ in pts]


def _draw_lanes(d: _Drawing, ax: Axes, events: Sequence[Event], lanes: _Lanes) -> None:
    """The lanes: process starts and exits (failed ones red), node events, and serving replicas ready (listening,
    model loaded) on their rank's lane."""
    for ev in lanes.proc_events:
        assert lanes.proc_lane is not None
        x = d.rel(ev)
        d.xs.append(x)
        style: dict[str, Any]
        if ev.kind == "proc_start":
            name, style = "process start", {"marker": ">", "color": "#444444"}
        elif as_int(ev.get("returncode")) == 0:
            name, style = "process exit (rc 0)", {"marker": "s", "color": "#444444"}
        else:
            name, style = "process exit (failed)", {"marker": "X", "color": "#d62728"}
        (h,) = ax.plot([x], [lanes.proc_lane], ls="none", ms=5, **style)
        d.handles.setdefault(name, h)
    for ev in lanes.node_events:
        x = d.rel(ev)
        d.xs.append(x)
        name, style = _NODE_STYLES[ev.kind]
        (h,) = ax.plot([x], [lanes.node_lane[str(ev.get("node"))]], ls="none", ms=5, **style)
        d.handles.setdefault(name, h)
    for ev in events:
        if ev.kind == "replica_ready" and as_int(ev.get("rank")) in lanes.rank_lane:
            d.xs.append(d.rel(ev))
            (h,) = ax.plot(
                [d.rel(ev)],
                [lanes.rank_lane[as_int(ev.get("rank"))]],
                ls="none",
                marker="o",
                ms=5,
                color="#2ca02c",
            )
            d.handles.setdefault("replica ready", h)
    ax.set_yticks(range(len(lanes.labels)), lanes.labels)
    ax.set_ylim(len(lanes.labels) - 0.5, -0.5)  # first lane on top


def _shade_recovery(
    d: _Drawing, events: Sequence[Event], step_events: Sequence[Event], markers: RunMarkers
) -> None:
    """The phases of the first fault's recovery (:func:`_milestones`), shaded on every axis; grey hatching from
    the last milestone to the run's end when the fault was not resumed (recovered)."""
    from matplotlib.patches import Patch

    stones = _milestones(events, d.rel, markers)
    for (a, ta), (b, tb) in zip(stones, stones[1:], strict=False):
        name = f"{a} → {b}"
        for ax in d.axes:
            ax.axvspan(ta, tb, color=_PHASE_COLORS[a], alpha=0.18, lw=0)
        d.handles[name] = Patch(color=_PHASE_COLORS[a], alpha=0.35)
    end = max((d.rel(ev) for ev in events), default=None)
    last = "recover" if markers.serving else "resume"
    # grey only when nothing stepped after the last milestone: a first fault interrupted by a second one has no
    # resume of its own, yet the job went on
    stepped = stones and any(d.rel(ev) > stones[-1][1] for ev in step_events)
    if stones and stones[-1][0] != last and not stepped and end is not None and end > stones[-1][1]:
        for ax in d.axes:
            ax.axvspan(stones[-1][1], end, color=_NOT_RESUMED, alpha=0.15, lw=0, hatch="//")
        name = f"not {'recovered' if markers.serving else 'resumed'} by the run's end"
        d.handles[name] = Patch(color=_NOT_RESUMED, alpha=0.3)
    d.xs += [t for _, t in stones]


def _draw_marks(d: _Drawing, events: Sequence[Event], markers: RunMarkers) -> None:
    """Thin vertical lines on every axis: each marked event (fault, detection, restart, revert, run end, ...), the
    fault and detection from the results table when the timeline has none, the resume and a serving run's
    recovery (metrics, not events)."""

    def vline(x: float | None, name: str) -> None:
        if x is None:
            return
        d.xs.append(x)
        for ax in d.axes:
            h = ax.axvline(x, **_LINE_STYLES[name])
        d.handles.setdefault(name, h)

    kinds_present = {ev.kind for ev in events}
    for ev in events:
        if ev.kind in _MARKED:
            vline(d.rel(ev), _MARKED[ev.kind])
    if "fault_inject" not in kinds_present:
        vline(as_float(markers.fault_t_s), "fault")
    if "detect" not in kinds_present:
        vline(as_float(markers.detect_t_s), "detect")
    vline(as_float(markers.resume_t_s), "resume (first step after recovery)")
    vline(as_float(markers.recover_t_s), "recovered (error rate back under the SLO)")


def _finish_axes(d: _Drawing, events: Sequence[Event], title: str, step_ax: Axes | None) -> None:
    """x limits spanning everything drawn (padded), the x label naming the origin, the title, grids and the
    legend (right of the top axes)."""
    lo, hi = min(d.xs), max(d.xs)
    pad = max((hi - lo) * 0.02, 0.05)
    bottom = d.axes[-1]
    bottom.set_xlim(lo - pad, hi + pad)
    has_start = any(ev.kind == "run_start" for ev in events)
    bottom.set_xlabel(
        f"time since {'run_start' if has_start else 'first event (no run_start)'} (s)", fontsize=8
    )
    d.axes[0].set_title(title, fontsize=9, pad=8)
    for ax in d.axes:
        ax.tick_params(labelsize=7)
        ax.grid(axis="x", color="#eeeeee", lw=0.5)
        ax.set_axisbelow(True)
    if step_ax is not None:
        step_ax.grid(axis="y", color="#f3f3f3", lw=0.5)
    if d.handles:
        d.axes[0].legend(
            list(d.handles.values()),
            list(d.handles),
            fontsize=6,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            frameon=False,
            borderaxespad=0.0,
        )


def timeline_figure(events: Sequence[Event], title: str, markers: RunMarkers | None = None) -> Figure:
    """One run's timeline as a matplotlib figure (Agg canvas).

    Top: the step each rank completed over time, a line per rank and incarnation (a restart starts a new line from
    the step it restored); checkpoint saves (complete) and loads marked where they happened; the recovery's phases
    shaded (fault -> detect -> restart -> restore -> resume, :func:`_milestones`). Below, lanes for the processes
    and the nodes (and the ranks, in a run without steps: a serving run's replicas). Thin vertical lines mark every
    fault, detection, restart, revert and the run's end.

    Works with any subset of event kinds (a run killed before its ranks started still gets a plot of what
    happened); raises ``ValueError`` only when there are no events at all.
    """
    markers = markers or RunMarkers()
    t0 = time_origin_ns(events)
    if t0 is None:
        raise ValueError("no events to plot")

    def rel(ev: Event) -> float:
        return (ev.t_ns - t0) / 1e9

    step_events = [ev for ev in events if ev.kind == "step" and as_int(ev.get("step")) is not None]
    rank_order, nodes = _ranks(events)
    lanes = _lanes(events, bool(step_events), rank_order, nodes)
    fig, step_ax, lane_ax = _new_figure(bool(step_events), len(lanes.labels))
    d = _Drawing(rel, [a for a in (step_ax, lane_ax) if a is not None])
    if step_ax is not None:
        _draw_steps(d, step_ax, step_events, rank_order, nodes)
        _draw_checkpoints(d, step_ax, events)
    if lane_ax is not None:
        _draw_lanes(d, lane_ax, events, lanes)
    _shade_recovery(d, events, step_events, markers)
    _draw_marks(d, events, markers)
    _finish_axes(d, events, title, step_ax)
    return fig


def run_title(row: Mapping[str, Any]) -> str:
    """A run's plot title from its metrics row: ``restart/kill-rank1 · repeat 0 · recovered``."""
    scenario = as_text(row.get("scenario")) or "(no scenario)"
    control = " (control)" if as_bool(row.get("control")) else ""
    rep = as_int(row.get("repeat"))
    repeat = str(rep) if rep is not None else (as_text(row.get("repeat")) or "?")
    return f"{scenario}{control} · repeat {repeat} · {as_text(row.get('outcome')) or MISSING}"


def run_markers(row: Mapping[str, Any]) -> RunMarkers:
    """The fault, detection and resume times of a run's metrics row (s since run_start; missing ones None)."""
    fault_t, recover = as_float(row.get("fault_t_s")), as_float(row.get("time_to_recover_s"))
    serving = as_bool(row.get("serving")) is True
    return RunMarkers(
        resume_t_s=as_float(row.get("resume_t_s")),
        recover_t_s=fault_t + recover if serving and fault_t is not None and recover is not None else None,
        fault_t_s=as_float(row.get("fault_t_s")),
        detect_t_s=as_float(row.get("detect_t_s")),
        serving=serving,
    )


class NoTimeline(ValueError):
    """The run has no events to plot (no ``events.jsonl``, or an empty one)."""


def plot_run_timeline(run_dir: str | Path, title: str, markers: RunMarkers | None = None) -> Path:
    """Draw the timeline of the run in ``run_dir`` (its ``events.jsonl``) into ``<run_dir>/timeline.png``.

    Returns the PNG's path. The PNG is written next to it first and then renamed into place, so a harness
    killed while drawing leaves the previous plot or none, never a truncated one. Raises :class:`NoTimeline`
    when the run has no events, ``OSError`` when the timeline cannot be read or the PNG not written, and
    whatever matplotlib raises on a plotting bug (:func:`draw_run_timeline` never raises).
    """
    run_dir = Path(run_dir)
    events = load_run_events(run_dir)
    if not events:
        raise NoTimeline("events.jsonl is empty" if events_path(run_dir).is_file() else "no events.jsonl")
    return replace_atomic(timeline_png(run_dir), lambda tmp: plot_timeline(events, tmp, title, markers))


class DrawnTimeline(NamedTuple):
    """What :func:`draw_run_timeline` did: the PNG's path, or ``None`` and why there is none."""

    path: Path | None
    reason: str | None


def draw_run_timeline(run_dir: str | Path, metrics: RunMetrics | Mapping[str, Any]) -> DrawnTimeline:
    """Draw one run's ``<run_dir>/timeline.png`` from its ``events.jsonl``, titled and marked (fault, detection,
    resume) from its metrics: a :class:`~chaosbench.analysis.metrics.RunMetrics` or its results-table row.

    Meant to be called once when a run ends, after its metrics are computed; the report then only links the
    PNG. Never raises: returns ``(path, None)``, or ``(None, reason)`` when nothing could be drawn (no or an
    empty timeline, an unreadable file, a plotting bug), so a plot never costs a run or a report.
    """
    try:
        row: Mapping[str, Any] = metrics if isinstance(metrics, Mapping) else vars(metrics)
        return DrawnTimeline(plot_run_timeline(run_dir, run_title(row), run_markers(row)), None)
    except NoTimeline as exc:
        return DrawnTimeline(None, f"no timeline: {exc}")
    except OSError as exc:
        return DrawnTimeline(None, f"timeline unreadable or plot not written: {exc}")
    except Exception as exc:  # noqa: BLE001 - a plotting bug must not cost the run or the report; it is reported
        return DrawnTimeline(None, f"plot failed: {type(exc).__name__}: {exc}")
