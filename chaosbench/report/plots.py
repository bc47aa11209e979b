"""Per-run timeline plots, drawn only from the run's ``events.jsonl``, into the run's own directory
(``<run_dir>/timeline.png``): once when the run ends (:func:`draw_run_timeline`, which never raises), and again
only when ``chaosbench report`` is asked to; the report links them.

x is seconds since the run's ``run_start`` event (the first event when there is none). One horizontal lane per
rank (labelled ``node/rankN`` when the rank's ``rank_start`` names its node) carries a marker per ``step``
event, coloured by incarnation; a separate "processes" lane carries ``proc_start``/``proc_exit``. Thin vertical
lines mark the fault (red), detection (orange), restarts (purple) and the first step after recovery (green, from
the results table since "recovery" is a metric, not an event); complete checkpoints are small ticks at the top.

matplotlib is imported inside the functions and only its Agg canvas is used (no pyplot, no global backend
switch), so the harness and its tests stay headless and importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from chaosbench.report.fmt import MISSING, as_bool, as_float, as_int, as_text
from chaosbench.rundir import RunDir, replace_atomic
from chaosbench.timeline import Event, read_events

if TYPE_CHECKING:
    from chaosbench.analysis.metrics import RunMetrics

#: A run's timeline plot, in its own run directory (drawn once when the run ends; linked by the report).
TIMELINE_PNG = RunDir.TIMELINE_PNG

#: Figure size in inches and resolution: 9x3 in at 80 dpi is ~720x240 px, a few tens of kB per PNG.
FIGSIZE_IN = (9.0, 3.0)
DPI = 80

# Incarnation colours avoid red/orange/purple/green, which the vertical markers use.
_INCARNATION_COLORS = ["#1f77b4", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939"]
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
_MARKED = {"fault_inject": "fault", "fault_revert": "fault revert", "detect": "detect", "restart": "restart",
           "give_up": "give up", "run_end": "run end", "balancer_down": "replica marked down",
           "balancer_up": "replica marked up"}  # fmt: skip
_NODE_KINDS = {"node_start", "node_exit", "node_pause", "node_unpause"}
_NODE_STYLES: dict[str, tuple[str, dict[str, Any]]] = {
    "node_start": ("node start", {"marker": "^", "color": "#2ca02c"}),
    "node_exit": ("node exit", {"marker": "v", "color": "#d62728"}),
    "node_pause": ("node pause", {"marker": "s", "color": "#1f77b4", "fillstyle": "none"}),
    "node_unpause": ("node unpause", {"marker": "s", "color": "#1f77b4"}),
}
_RANK_KINDS = {"rank_start", "rank_exit", "step", "ckpt_save_begin", "ckpt_save_end", "train_end", "replica_ready"}


@dataclass(frozen=True)
class RunMarkers:
    """Times (s since run_start) from the results table; fault/detect are used only when the timeline lacks them;
    ``recover_t_s``: a serving run's recovery (its error rate back under the SLO)."""

    resume_t_s: float | None = None
    recover_t_s: float | None = None
    fault_t_s: float | None = None
    detect_t_s: float | None = None


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


def plot_timeline(
    events: Sequence[Event],
    out_path: str | Path,
    title: str,
    markers: RunMarkers | None = None,
) -> Path:
    """Draw one run's timeline and save it as PNG at ``out_path``; returns the path.

    Works with any subset of event kinds (a run killed before its ranks started still gets a plot of what
    happened); raises ``ValueError`` only when there are no events at all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    markers = markers or RunMarkers()
    t0 = time_origin_ns(events)
    if t0 is None:
        raise ValueError("no events to plot")

    def rel(ev: Event) -> float:
        return (ev.t_ns - t0) / 1e9

    # Lanes: one per rank seen in rank events, labelled with the node(s) from rank_start.
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
    lane = {r: i for i, r in enumerate(rank_order)}
    labels = [_rank_label(r, nodes.get(r, [])) for r in rank_order]
    proc_events = [ev for ev in events if ev.kind in {"proc_start", "proc_exit"}]
    proc_lane = len(rank_order) if proc_events else None
    if proc_lane is not None:
        labels.append("processes")
    # One lane per node whose container start/exit/pause is on the timeline (docker runtime).
    node_events = [ev for ev in events if ev.kind in _NODE_KINDS and ev.get("node")]
    node_names = sorted({str(ev.get("node")) for ev in node_events})
    node_lane = {n: len(labels) + i for i, n in enumerate(node_names)}
    labels += [f"node {n}" for n in node_names]

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    handles: dict[str, Any] = {}
    xs_all: list[float] = [0.0]

    # Steps, coloured by incarnation.
    steps: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
    for ev in events:
        if ev.kind == "step":
            xs, ys = steps.setdefault(_incarnation_key(ev.get("incarnation")), ([], []))
            xs.append(rel(ev))
            ys.append(lane[as_int(ev.get("rank"))])
    for i, key in enumerate(sorted(steps)):
        xs, ys = steps[key]
        xs_all += xs
        name = f"steps, incarnation {key[1]}" if key[0] == 0 else "steps, incarnation ?"
        color = _INCARNATION_COLORS[i % len(_INCARNATION_COLORS)]
        ax.scatter(xs, ys, s=70, marker="|", linewidths=1.3, color=color)
        # A proxy handle so the legend shows one tick, not a cloud of points.
        handles[name] = Line2D([], [], ls="none", marker="|", ms=7, color=color)

    # Processes lane.
    if proc_lane is not None:
        for ev in proc_events:
            x = rel(ev)
            xs_all.append(x)
            style: dict[str, Any]
            if ev.kind == "proc_start":
                name, style = "process start", {"marker": ">", "color": "#444444"}
            elif as_int(ev.get("returncode")) == 0:
                name, style = "process exit (rc 0)", {"marker": "s", "color": "#444444"}
            else:
                name, style = "process exit (failed)", {"marker": "X", "color": "#d62728"}
            (h,) = ax.plot([x], [proc_lane], ls="none", ms=5, **style)
            handles.setdefault(name, h)

    # Nodes lanes: container start (reboot, spare takeover), exit (lost, cleanup), pause and unpause.
    for ev in node_events:
        x = rel(ev)
        xs_all.append(x)
        name, style = _NODE_STYLES[ev.kind]
        (h,) = ax.plot([x], [node_lane[str(ev.get("node"))]], ls="none", ms=5, **style)
        handles.setdefault(name, h)

    # Vertical markers.
    def vline(x: float | None, name: str) -> None:
        if x is None:
            return
        xs_all.append(x)
        h = ax.axvline(x, **_LINE_STYLES[name])
        handles.setdefault(name, h)

    kinds_present = {ev.kind for ev in events}
    for ev in events:
        if ev.kind in _MARKED:
            vline(rel(ev), _MARKED[ev.kind])
    if "fault_inject" not in kinds_present:
        vline(as_float(markers.fault_t_s), "fault")
    if "detect" not in kinds_present:
        vline(as_float(markers.detect_t_s), "detect")
    vline(as_float(markers.resume_t_s), "resume (first step after recovery)")
    vline(as_float(markers.recover_t_s), "recovered (error rate back under the SLO)")

    # Serving replicas: ready (listening, model loaded), on their rank's lane.
    for ev in events:
        if ev.kind == "replica_ready" and as_int(ev.get("rank")) in lane:
            xs_all.append(rel(ev))
            (h,) = ax.plot([rel(ev)], [lane[as_int(ev.get("rank"))]], ls="none", marker="o", ms=5, color="#2ca02c")
            handles.setdefault("replica ready", h)

    # Complete checkpoints: small ticks along the top edge.
    ckpt_x = [rel(ev) for ev in events if ev.kind == "ckpt_save_end" and as_bool(ev.get("complete"))]
    if ckpt_x:
        xs_all += ckpt_x
        (h,) = ax.plot(
            ckpt_x,
            [1.0] * len(ckpt_x),
            ls="none",
            marker="v",
            ms=5,
            color="black",
            transform=ax.get_xaxis_transform(),
            clip_on=False,
        )
        handles["checkpoint saved (complete)"] = h

    # Axes.
    n_lanes = len(labels)
    if n_lanes:
        ax.set_yticks(range(n_lanes), labels)
        ax.set_ylim(n_lanes - 0.5, -0.5)  # first rank on top
    else:
        ax.set_yticks([])
    lo, hi = min(xs_all), max(xs_all)
    pad = max((hi - lo) * 0.02, 0.05)
    ax.set_xlim(lo - pad, hi + pad)
    has_start = any(ev.kind == "run_start" for ev in events)
    ax.set_xlabel(f"time since {'run_start' if has_start else 'first event (no run_start)'} (s)", fontsize=8)
    ax.set_title(title, fontsize=9, pad=8)  # room for the checkpoint ticks
    ax.tick_params(labelsize=7)
    ax.grid(axis="x", color="#eeeeee", lw=0.5)
    ax.set_axisbelow(True)
    if handles:
        ax.legend(
            list(handles.values()),
            list(handles),
            fontsize=6,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            frameon=False,
            borderaxespad=0.0,
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png", dpi=DPI, bbox_inches="tight")
    return out_path


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
