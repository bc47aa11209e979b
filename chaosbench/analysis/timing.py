"""When things happened around the fault: when it took effect, when the framework reacted, when training resumed,
rejoined and caught up, the work lost, the recovery split by stage (badput), step times inside the fault
window, the age of the newest checkpoint and the scheduler's share. Definitions:
:mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from chaosbench.analysis.timeline_index import JobSteps, TimelineIndex, incarnation, ns_to_s
from chaosbench.timeline import Event


def fault_effect_ns(ix: TimelineIndex, fault: Event) -> int:
    """When ``fault`` took effect: its ``effect_t_ns``, else when the injector began; but no later than its first
    consequence (a process exit or a detection after the injector began)."""
    effect = fault.get("effect_t_ns")
    tf = int(effect) if effect is not None else fault.t_ns
    # A stamp taken when an engine call returned, or when the engine reported it, may come after the fault's
    # first consequence (a docker kill: the rank's exec exits 35 ms in, the engine's die event at 72 ms).
    seen = [e.t_ns for e in (*ix.of("proc_exit"), *ix.of("detect")) if fault.t_ns <= e.t_ns < tf]
    return min(seen) if seen else tf


@dataclass(frozen=True)
class FaultPoint:
    """Where the job stood when the fault took effect (``t_ns``): the incarnation running (``incarnation``), the
    highest job step it had completed (``step``), the highest step recovery has to get beyond
    (``last_step_before``: steps the faulted incarnation still completed before a newer one started were in
    flight and count; per-step commit: only steps completed before the fault) and whether a newer incarnation
    started after it (``restarted``)."""

    t_ns: int
    incarnation: int
    step: int
    last_step_before: int
    restarted: bool


def fault_point(ix: TimelineIndex, tf: int) -> FaultPoint:
    steps = ix.steps
    fault_inc = max((incarnation(e) for e in ix.of("rank_start") if e.t_ns <= tf), default=0)
    before = steps.before(tf)
    max_before = max((idx for _, idx in before), default=0)
    fault_step = max((idx for inc, idx in before if inc == fault_inc), default=max_before)
    restarted = [e.t_ns for e in ix.of("rank_start") if e.t_ns > tf and incarnation(e) > fault_inc]
    # Steps the faulted incarnation still completed after the fault (in flight when it hit) were lost too; under
    # per-step commit nothing rolls back: a survivor's step after the fault is progress, not in-flight work.
    if restarted and not ix.per_step_commit:
        first_new = min(restarted)
        max_before = max([max_before] + [i for (n, i), t in steps.t.items() if n == fault_inc and t < first_new])
    return FaultPoint(tf, fault_inc, fault_step, max_before, bool(restarted))


def rejoin_ns(steps: JobSteps, fp: FaultPoint) -> int | None:
    """The first step completed by an incarnation newer than the faulted one."""
    return next((t for t, (inc, _) in steps.after(fp.t_ns) if inc > fp.incarnation), None)


def resume_point(steps: JobSteps, fp: FaultPoint, per_step_commit: bool) -> tuple[int, tuple[int, int]] | None:
    """(stamp, (incarnation, step)) of the first completed step after recovery, or None."""
    for t, (inc, idx) in steps.after(fp.t_ns):
        if per_step_commit:
            resumed = idx > fp.last_step_before
        else:
            resumed = inc > fp.incarnation or (not fp.restarted and idx > fp.last_step_before)
        if resumed:
            return t, (inc, idx)
    return None


def catch_up_ns(steps: JobSteps, fp: FaultPoint) -> int | None:
    """The first completion after the fault of a step beyond every step completed before it."""
    return next((t for t, k in steps.after(fp.t_ns) if k[1] > fp.last_step_before), None)


@dataclass(frozen=True)
class LostWork:
    """``lost_steps`` (skipped steps included), ``lost_work_s`` (None: ``missing`` says why) and, under per-step
    commit, ``skipped_steps``."""

    lost_steps: int
    lost_work_s: float | None
    skipped_steps: int | None
    missing: str | None = None


def lost_work(ix: TimelineIndex, fp: FaultPoint, resume_step: tuple[int, int]) -> LostWork:
    """The steps completed before the fault that were done again after it (recovery restarted from the step
    before ``resume_step``), the seconds they had taken, and under per-step commit the steps computed but not
    committed after the fault."""
    steps = ix.steps
    restored = resume_step[1] - 1
    lost_steps = max(0, fp.last_step_before - restored)
    skipped_steps = None
    skipped_s = 0.0
    if ix.per_step_commit:
        skipped_by_index: dict[int, float] = {}
        for e in ix.of("step_skipped"):
            if e.t_ns >= fp.t_ns:
                i = int(e["step"])
                d = float(e.get("duration_s") or 0.0)
                skipped_by_index[i] = min(skipped_by_index[i], d) if i in skipped_by_index else d
        skipped_steps = len(skipped_by_index)
        skipped_s = sum(skipped_by_index.values())
    total = lost_steps + (skipped_steps or 0)
    if lost_steps == 0:
        return LostWork(total, skipped_s, skipped_steps)
    t_hi = steps.t.get((fp.incarnation, fp.last_step_before))
    t_lo = steps.t.get((fp.incarnation, restored))
    if t_lo is None:  # restarted from scratch: from the faulted incarnation's first rank event
        first = ix.first("rank_start", incarnation=fp.incarnation)
        t_lo = first.t_ns if first else None
    if t_hi is not None and t_lo is not None:
        return LostWork(total, ns_to_s(t_hi - t_lo) + skipped_s, skipped_steps)
    return LostWork(total, None, skipped_steps, "the lost steps are not on the timeline")


@dataclass(frozen=True)
class Badput:
    """The recovery after detection split by stage, in seconds; ``recompute_s`` None: ``missing`` says why."""

    restart_init_s: float
    restore_s: float
    recompute_s: float | None
    missing: str | None = None


def badput(ix: TimelineIndex, fp: FaultPoint, detect: Event | None, resume: tuple[int, tuple[int, int]],
           lost_steps: int) -> Badput:  # fmt: skip
    """Restart+init, restore and recompute of a recovery that resumed at ``resume`` (stamp, step)."""
    steps = ix.steps
    resume_t, resume_key = resume
    react = detect.t_ns if detect is not None else fp.t_ns
    if ix.per_step_commit:  # survivors never stopped: the stall is waiting for a new quorum; healing is elsewhere
        started = resume_t - int(steps.duration.get(resume_key, 0.0) * 1e9)
        return Badput(max(0.0, ns_to_s(started - react)), 0.0, 0.0)
    new_inc = resume_key[0]
    if new_inc == fp.incarnation:  # recovered in place: nothing restarted, restored or recomputed
        return Badput(0.0, 0.0, 0.0)
    loads_b = [e.t_ns for e in ix.of("ckpt_load_begin") if e.get("incarnation") == new_inc]
    loads_e = [e.t_ns for e in ix.of("ckpt_load_end") if e.get("incarnation") == new_inc]
    if loads_b and loads_e:
        restore_b, restore_e = min(loads_b), max(loads_e)
        restore_s = ns_to_s(restore_e - restore_b)
    else:
        first_dur = steps.duration.get(resume_key, 0.0)
        restore_b = restore_e = resume_t - int(first_dur * 1e9)
        restore_s = 0.0
    restart_init_s = ns_to_s(restore_b - react)
    redo = steps.t.get((new_inc, fp.last_step_before))
    if lost_steps == 0:
        return Badput(restart_init_s, restore_s, 0.0)
    if redo is not None:
        return Badput(restart_init_s, restore_s, ns_to_s(redo - restore_e))
    return Badput(restart_init_s, restore_s, None, "the recovered job did not redo the lost steps")


def scheduler_delay_s(ix: TimelineIndex, tf: int) -> float | None:
    """Seconds from the first ``restart`` at or after ``tf`` until the scheduler ran the job again."""
    requeue = ix.first("restart", after_ns=tf)
    back = ix.first("sched_state", after_ns=requeue.t_ns, state="running") if requeue is not None else None
    if requeue is not None and back is not None:
        return ns_to_s(back.t_ns - requeue.t_ns)
    return None


def median_step_interval(steps: JobSteps, t_from: int | None, t_to: int | None) -> float | None:
    """Median seconds between consecutive step completions of one incarnation, over the intervals that overlap
    the window (so a stall spanning the whole window still counts)."""
    gaps = []
    for items in steps.by_incarnation.values():
        for (i0, t_a), (i1, t_b) in zip(items, items[1:], strict=False):
            if i1 != i0 + 1:
                continue
            if (t_from is None or t_b > t_from) and (t_to is None or t_a < t_to):
                gaps.append(ns_to_s(t_b - t_a))
    return statistics.median(gaps) if gaps else None


def checkpoint_age(events: Sequence[Event], t_ns: int) -> float | None:
    """Seconds since the newest complete checkpoint save (``ckpt_save_end`` among ``events``) before ``t_ns``
    (None: none completed)."""
    done = [e.t_ns for e in events if e.kind == "ckpt_save_end" and e.get("complete") and e.t_ns <= t_ns]
    return ns_to_s(t_ns - max(done)) if done else None
