"""What the run's time bought, and the inputs of the fleet projection: wall time, the compute time of the steps
that survived into the final state (productive time, goodput), checkpoint save cost. Definitions:
:mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

import statistics
from typing import Any

from chaosbench.analysis.timeline_index import JobSteps, TimelineIndex, ns_to_s


def wall_s(ix: TimelineIndex) -> float | None:
    """``run_end`` minus ``run_start`` (the last ``run_end``, the first ``run_start``); None without either."""
    start, end = ix.first("run_start"), ix.last("run_end")
    return ns_to_s(end.t_ns - start.t_ns) if start is not None and end is not None else None


def productive_s(steps: JobSteps) -> float | None:
    """For every step index, the compute time of its last execution (the one that survived into the final
    state); None when no step has a duration."""
    last_exec: dict[int, tuple[int, int]] = {}
    for (inc, idx), t in steps.t.items():
        if idx not in last_exec or t > steps.t[last_exec[idx]]:
            last_exec[idx] = (inc, idx)
    durations = [steps.duration[k] for k in last_exec.values() if k in steps.duration]
    return sum(durations) if durations else None


def checkpoint_save_durations(ix: TimelineIndex) -> list[float]:
    """Seconds from ``ckpt_save_begin`` to a complete ``ckpt_save_end``, per (incarnation, rank, step) of a rank's
    own saves, per path of the saves the checkpoint watcher saw on the filesystem (``src`` ``watcher``: from the
    first write seen to the last, so a serialization into memory before it is not in it; a file renamed into place
    from outside the watched directories shows no writing at all and no duration)."""
    begins: dict[tuple[Any, ...], int] = {}
    out = []
    for ev in ix.of("ckpt_save_begin", "ckpt_save_end"):
        if ev.src == "watcher":
            key: tuple[Any, ...] = ("watcher", ev.get("dir"), ev.get("path"))
        else:
            key = (int(ev.get("incarnation", 0)), int(ev.get("rank", 0)), int(ev.get("step") or 0))
        if ev.kind == "ckpt_save_begin":
            begins[key] = ev.t_ns
        elif ev.get("complete") and key in begins:
            if ev.src == "watcher" and ev.t_ns == begins[key]:
                continue  # renamed into place from elsewhere (Lightning's fsspec transaction): no write was seen
            out.append(ns_to_s(ev.t_ns - begins[key]))
    return out


def checkpoint_interval_s(ix: TimelineIndex) -> float | None:
    """Median seconds between consecutive complete checkpoints of one incarnation: the end of the first complete
    save of each step (several ranks, or a file and its ``last.ckpt`` copy, saving the same step are one
    checkpoint) to the next one's; None with fewer than two."""
    starts = sorted((e.t_ns, int(e.get("incarnation", 0))) for e in ix.of("rank_start"))
    first: dict[tuple[int, int], int] = {}
    for ev in ix.of("ckpt_save_end"):
        if not ev.get("complete") or ev.get("step") is None:
            continue
        if ev.src == "rank":
            inc = int(ev.get("incarnation", 0))
        else:  # the watcher's: the incarnation running when it was written
            inc = max((i for t, i in starts if t <= ev.t_ns), default=0)
        first.setdefault((inc, int(ev["step"])), ev.t_ns)
    by_inc: dict[int, list[int]] = {}
    for (inc, _), t in first.items():
        by_inc.setdefault(inc, []).append(t)
    gaps = [
        ns_to_s(b - a) for ts in by_inc.values() for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)
    ]
    return statistics.median(gaps) if gaps else None
