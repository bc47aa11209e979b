"""When things happened around the fault: when it took effect, when the framework reacted, when training resumed,
rejoined and caught up, the work lost, the recovery split by stage (badput) and into its four stages (detect,
reschedule with the runtime's share of it, reshard-or-replace, resume), step times inside the fault window, the
age of the newest checkpoint and the scheduler's share. Definitions: :mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def revert_began_ns(revert: Event) -> int:
    """Until when a reverted fault was certainly in effect: when its revert began (``began_t_ns`` of its
    ``fault_revert``; the effect ended between that and the event's own time), else the event's time."""
    began = revert.get("began_t_ns")
    return int(began) if began is not None else revert.t_ns


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


def fault_point(
    ix: TimelineIndex, tf: int, until_ns: int | None = None, revert_ns: int | None = None
) -> FaultPoint:
    """Where the job stood when the fault at ``tf`` took effect. Per-step commit: the highest step any group had
    committed. Otherwise the faulted incarnation's own: its highest completed step, or, before its first, the
    step it restored (0 from scratch): steps an earlier incarnation had done and a rollback undid were lost to
    the fault that caused that rollback, not to this one. Whether it restarted looks only up to ``until_ns``
    (the next fault: a restart after that one is that one's); a fault that ended by itself (``revert_ns``) after
    which the faulted incarnation went on beyond where it stood was outlasted in place, whatever restarted the
    job later (a false detection, say)."""
    steps = ix.steps
    fault_inc = max((incarnation(e) for e in ix.of("rank_start") if e.t_ns <= tf), default=0)
    before = steps.before(tf)
    own = [idx for inc, idx in before if inc == fault_inc]
    if ix.per_step_commit:
        reached = max((idx for _, idx in before), default=0)
    elif own:
        reached = max(own)
    else:
        reached = _restored_before(ix, fault_inc, tf)
    fault_step = max(own) if own else reached
    restarted = [
        e.t_ns
        for e in ix.of("rank_start")
        if e.t_ns > tf and (until_ns is None or e.t_ns < until_ns) and incarnation(e) > fault_inc
    ]
    # Steps the faulted incarnation still completed after the fault (in flight when it hit) were lost too; under
    # per-step commit nothing rolls back: a survivor's step after the fault is progress, not in-flight work.
    if restarted and revert_ns is not None and revert_ns < min(restarted):
        first_new = min(restarted)
        if any(
            n == fault_inc and i > reached and revert_ns <= t < first_new for (n, i), t in steps.t.items()
        ):
            restarted = []  # it went on after the fault ended: that restart is not this fault's
    if restarted and not ix.per_step_commit:
        first_new = min(restarted)
        reached = max([reached] + [i for (n, i), t in steps.t.items() if n == fault_inc and t < first_new])
    return FaultPoint(tf, fault_inc, fault_step, reached, bool(restarted))


def _restored_before(ix: TimelineIndex, inc: int, tf: int) -> int:
    """The step incarnation ``inc`` had restored by ``tf`` before completing one: its last checkpoint load by
    then (its ranks' own, else one the watcher saw after its start), else 0."""
    own = [
        e
        for e in ix.of("ckpt_load_end")
        if e.src == "rank" and incarnation(e) == inc and e.t_ns <= tf and e.get("step") is not None
    ]
    if not own:
        starts = [e.t_ns for e in ix.rank_starts_of(inc)]
        own = [
            e
            for e in ix.of("ckpt_load_end")
            if e.src == "watcher" and e.get("step") is not None and starts and min(starts) <= e.t_ns <= tf
        ]
    return int(own[-1]["step"]) if own else 0


def rejoin_ns(ix: TimelineIndex, fp: FaultPoint) -> int | None:
    """The first step completed by an incarnation newer than the faulted one; per-step commit, also a step whose
    quorum had a rank of an incarnation begun after the fault (each replica group numbers its incarnations from
    0: a step is keyed by the newest incarnation in its quorum, which may be another group's older restart)."""
    steps = ix.steps
    running: dict[int, int] = {}  # rank -> its incarnation when the fault hit
    newer: set[tuple[int, int]] = set()
    for e in ix.of("rank_start"):
        rank = int(e.get("rank", 0))
        if e.t_ns <= fp.t_ns:
            running[rank] = max(running.get(rank, 0), incarnation(e))
        elif incarnation(e) > running.get(rank, -1):
            newer.add((rank, incarnation(e)))
    return next(
        (
            t
            for t, key in steps.after(fp.t_ns)
            if key[0] > fp.incarnation or steps.committers.get(key, frozenset()) & newer
        ),
        None,
    )


def resume_point(
    steps: JobSteps, fp: FaultPoint, per_step_commit: bool, after_ns: int | None = None
) -> tuple[int, tuple[int, int]] | None:
    """(stamp, (incarnation, step)) of the first completed step after recovery (completed after ``after_ns`` too,
    when given: per-step commit, the framework's reaction), or None."""
    for t, (inc, idx) in steps.after(max(fp.t_ns, after_ns or fp.t_ns)):
        if per_step_commit:
            resumed = idx > fp.last_step_before
        else:
            resumed = inc > fp.incarnation or (not fp.restarted and idx > fp.last_step_before)
        if resumed:
            return t, (inc, idx)
    return None


def catch_up_ns(steps: JobSteps, fp: FaultPoint, after_ns: int | None = None) -> int | None:
    """The first completion after the fault (and after ``after_ns``, when given) of a step beyond every step
    completed before it."""
    return next(
        (t for t, k in steps.after(max(fp.t_ns, after_ns or fp.t_ns)) if k[1] > fp.last_step_before), None
    )


@dataclass(frozen=True)
class LostWork:
    """``lost_steps`` (skipped steps included), ``lost_work_s`` (None: ``missing`` says why) and, under per-step
    commit, ``skipped_steps``."""

    lost_steps: int
    lost_work_s: float | None
    skipped_steps: int | None
    missing: str | None = None


def lost_work(
    ix: TimelineIndex, fp: FaultPoint, resume_step: tuple[int, int], until_ns: int | None = None
) -> LostWork:
    """The steps completed before the fault that were done again after it (recovery restarted from the step
    before ``resume_step``), the seconds they had taken, and under per-step commit the steps computed but not
    committed after the fault and before ``until_ns`` (the next fault: the steps skipped from then on are that
    fault's)."""
    steps = ix.steps
    restored = restored_step(ix, resume_step, fp.t_ns)
    lost_steps = max(0, fp.last_step_before - restored)
    skipped_steps = None
    skipped_s = 0.0
    untimed: list[int] = []  # skipped indices no report of which says how long its compute took
    if ix.per_step_commit:
        skipped_by_index: dict[int, float | None] = {}
        for e in ix.of("step_skipped"):
            if e.t_ns >= fp.t_ns and (until_ns is None or e.t_ns < until_ns):
                i = int(e["step"])
                d = None if e.get("duration_s") is None else float(e["duration_s"])
                known = [x for x in (skipped_by_index.get(i), d) if x is not None]
                skipped_by_index[i] = min(known) if known else None
        skipped_steps = len(skipped_by_index)
        skipped_s = sum(d for d in skipped_by_index.values() if d is not None)
        untimed = sorted(i for i, d in skipped_by_index.items() if d is None)
    total = lost_steps + (skipped_steps or 0)
    if untimed:  # a user's script logs that a step did not commit, not how long its compute took
        return LostWork(
            total,
            None,
            skipped_steps,
            f"step {untimed[0]} was not committed, but how long its compute "
            "took is not on the timeline (the line that says so gives no duration)",
        )
    if lost_steps == 0:
        return LostWork(total, skipped_s, skipped_steps)
    t_hi = steps.t.get((fp.incarnation, fp.last_step_before))
    t_lo = _step_done_ns(ix, fp.incarnation, restored)
    if t_lo is None:  # restarted from scratch: from the faulted incarnation's first rank event
        first = ix.first("rank_start", incarnation=fp.incarnation)
        t_lo = first.t_ns if first else None
    if t_hi is not None and t_lo is not None:
        return LostWork(total, ns_to_s(t_hi - t_lo) + skipped_s, skipped_steps)
    return LostWork(total, None, skipped_steps, "the lost steps are not on the timeline")


def restored_step(ix: TimelineIndex, resume_step: tuple[int, int], after_ns: int) -> int:
    """The step recovery restarted from, for an incarnation that resumed at ``resume_step`` (incarnation, step):
    the step before its first step, or the step of the checkpoint it loaded after the fault (``after_ns``) when
    that is earlier (a script that resumes at the epoch its snapshot had finished trains it again; a progress
    bar's first count after a resume may skip a step or two: the load says where it restarted). Its loads: its
    own ``ckpt_load_end`` events, else the checkpoint reads the watcher saw between its first ``rank_start`` and
    its first step. A recovery in place loaded nothing after the fault: the step before its first step."""
    inc, first = resume_step
    loaded = [
        e
        for e in ix.of("ckpt_load_end")
        if e.src == "rank" and incarnation(e) == inc and e.get("step") is not None and e.t_ns >= after_ns
    ]
    if not loaded:
        starts = [e.t_ns for e in ix.rank_starts_of(inc)]
        first_t = ix.steps.by_incarnation.get(inc, [(0, None)])[0][1]
        if starts and first_t is not None:
            loaded = [
                e
                for e in ix.of("ckpt_load_end")
                if e.src == "watcher"
                and e.get("step") is not None
                and max(min(starts), after_ns) <= e.t_ns <= first_t
            ]
    restored = first - 1
    return min(restored, int(loaded[-1]["step"])) if loaded else restored


def _step_done_ns(ix: TimelineIndex, inc: int, step: int) -> int | None:
    """When incarnation ``inc`` had done ``step``: that step's completion; where the logs skipped it (a sparse
    progress bar), the start of its checkpoint's save, else the last step the logs show before it."""
    steps = ix.steps
    done = steps.t.get((inc, step))
    if done is not None:
        return done
    save = next((e.t_ns for e in ix.of("ckpt_save_begin") if e.get("step") == step), None)
    if save is not None:
        return save
    earlier = [t for idx, t in steps.by_incarnation.get(inc, []) if idx < step]
    return max(earlier) if earlier else None


def restore_window(ix: TimelineIndex, resume: tuple[int, tuple[int, int]]) -> tuple[int, int, bool]:
    """(begin, end, loaded) of the restore of the incarnation that resumed at ``resume`` (stamp, step): its
    earliest ``ckpt_load_begin`` to its latest ``ckpt_load_end``; without a load (restarted from scratch) a
    restore of nothing at the start of its first step (``loaded`` False)."""
    resume_t, resume_key = resume
    inc = resume_key[0]
    loads_b = [e.t_ns for e in ix.of("ckpt_load_begin") if e.get("incarnation") == inc]
    loads_e = [e.t_ns for e in ix.of("ckpt_load_end") if e.get("incarnation") == inc]
    if loads_b and loads_e:
        return min(loads_b), max(loads_e), True
    start = resume_t - int(ix.steps.duration.get(resume_key, 0.0) * 1e9)
    return start, start, False


@dataclass(frozen=True)
class Badput:
    """The recovery after detection split by stage, in seconds; ``recompute_s`` None: ``missing`` says why."""

    restart_init_s: float
    restore_s: float
    recompute_s: float | None
    missing: str | None = None


def badput(
    ix: TimelineIndex,
    fp: FaultPoint,
    detect: Event | None,
    resume: tuple[int, tuple[int, int]],
    lost_steps: int,
) -> Badput:
    """Restart+init, restore and recompute of a recovery that resumed at ``resume`` (stamp, step)."""
    steps = ix.steps
    resume_t, resume_key = resume
    react = detect.t_ns if detect is not None else fp.t_ns
    if (
        ix.per_step_commit
    ):  # survivors never stopped: the stall is waiting for a new quorum; healing is elsewhere
        started = resume_t - int(steps.duration.get(resume_key, 0.0) * 1e9)
        return Badput(max(0.0, ns_to_s(started - react)), 0.0, 0.0)
    new_inc = resume_key[0]
    if new_inc == fp.incarnation:  # recovered in place: nothing restarted, restored or recomputed
        return Badput(0.0, 0.0, 0.0)
    restore_b, restore_e, _ = restore_window(ix, resume)
    restore_s = ns_to_s(restore_e - restore_b)
    restart_init_s = ns_to_s(restore_b - react)
    # the new incarnation got back to the step reached at the fault (or past it, where its logs skipped that one)
    redo = next((t for idx, t in steps.by_incarnation.get(new_inc, []) if idx >= fp.last_step_before), None)
    if lost_steps == 0:
        return Badput(restart_init_s, restore_s, 0.0)
    if redo is not None:
        return Badput(restart_init_s, restore_s, ns_to_s(redo - restore_e))
    return Badput(restart_init_s, restore_s, None, "the recovered job did not redo the lost steps")


#: The four stages of a recovery, in order (``stage_<name>_s`` metrics; definitions in
#: :mod:`chaosbench.analysis.metrics`).
STAGE_NAMES = ("detect", "reschedule", "reshard_or_replace", "resume")


@dataclass(frozen=True)
class Stages:
    """A recovery's four stages in seconds (None: ``missing[name]`` says why), the fault to the end of the last
    one (``total_s``: the stages present add up to it), and ``notes[name]`` on a stage whose value needs saying
    (0 because it does not apply, or a boundary stamped before the one it follows)."""

    seconds: dict[str, float | None]
    total_s: float | None
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def recovery_stages(
    ix: TimelineIndex,
    fp: FaultPoint,
    detect: Event | None,
    resume: tuple[int, tuple[int, int]] | None,
    fault: Event | None = None,
    until_ns: int | None = None,
) -> Stages:
    """Detect, reschedule, reshard-or-replace and resume of the recovery from the fault at ``fp`` (``detect``:
    the first detection after it; ``resume``: :func:`resume_point`'s answer; ``fault``: its ``fault_inject``,
    whose targets say which replica group was lost under per-step commit; ``until_ns``: the next fault, whose
    restarts are its own).

    Each stage runs from one boundary to the next: the fault, the detection, the replacement capacity in place
    (the last ``rank_start`` of the recovering incarnation: every rank of the new world placed), the end of its restore (or heal), the first step beyond the step reached at the fault (by
    the recovering capacity). A missing boundary leaves its stage missing and the next stage starts at the
    boundary before it; a boundary stamped before the one it follows is taken at that one (its stage is 0, with
    a note). So the stages present always add up to ``total_s``."""
    names = STAGE_NAMES
    missing: dict[str, str] = {}
    notes: dict[str, str] = {}
    ends: dict[str, int | None] = dict.fromkeys(names)
    if detect is not None:
        ends["detect"] = detect.t_ns
    else:
        missing["detect"] = "not detected: the next stage is measured from the fault"
    if ix.per_step_commit:
        lost = _lost_group(ix, fault, fp.t_ns) if fault is not None else None
        _per_step_commit_ends(ix, fp, ends, missing, notes, lost, until_ns)
    elif resume is None:
        for n in names[1:]:
            missing[n] = "no training step completed after the fault"
    elif resume[1][0] == fp.incarnation:
        notes["reschedule"] = notes["reshard_or_replace"] = (
            "recovered in place: nothing was rescheduled or restored"
        )
        ends["resume"] = catch_up_ns(ix.steps, fp)
    else:
        inc = resume[1][0]
        starts = [e.t_ns for e in ix.rank_starts_of(inc)]
        # the last start: a rank waiting for its rebooted node is still being rescheduled (the first start is
        # only a survivor's node relaunching at once)
        ends["reschedule"] = max(starts) if starts else None
        if not starts:
            missing["reschedule"] = f"incarnation {inc} resumed training but wrote no rank_start"
        _, restore_end, loaded = restore_window(ix, resume)
        ends["reshard_or_replace"] = restore_end
        if not loaded:
            notes["reshard_or_replace"] = (
                f"incarnation {inc} loaded no checkpoint (restarted from scratch): the "
                "stage ends when its first step starts"
            )
        ends["resume"] = catch_up_ns(ix.steps, fp)
    if ends["resume"] is None and "resume" not in missing:
        missing["resume"] = "the job never got beyond the step reached at the fault"
    seconds: dict[str, float | None] = {}
    prev = fp.t_ns
    for n in names:
        end = ends[n]
        if end is None and n in notes:  # does not apply: 0, ends where the stage before it did
            end = prev
        if end is None:
            seconds[n] = None
            missing.setdefault(n, "its end is not on the timeline")
            continue
        if end < prev:
            clamp = f"ended {ns_to_s(prev - end):.3f} s before the previous stage ended; counted as 0"
            notes[n] = f"{notes[n]}; {clamp}" if n in notes else clamp
            end = prev
        seconds[n] = ns_to_s(end - prev)
        prev = end
    total = ns_to_s(prev - fp.t_ns) if ends["resume"] is not None else None
    return Stages(seconds, total, missing, notes)


def _lost_group(ix: TimelineIndex, fault: Event, tf: int) -> set[int] | None:
    """The ranks of the replica groups whose ranks ``fault`` targeted (as they ran at ``tf``); the targets
    themselves in a job without groups; None when it names no rank."""
    targets = {
        int(t["rank"]) for t in fault.get("target") or [] if isinstance(t, dict) and t.get("rank") is not None
    }
    if not targets:
        return None
    group_of = {int(e.get("rank", 0)): e.get("replica_group") for e in ix.of("rank_start") if e.t_ns <= tf}
    groups = {group_of.get(r) for r in targets}
    if None in groups:
        return targets
    return {r for r, g in group_of.items() if g in groups}


def _per_step_commit_ends(
    ix: TimelineIndex,
    fp: FaultPoint,
    ends: dict[str, int | None],
    missing: dict[str, str],
    notes: dict[str, str],
    lost: set[int] | None = None,
    until_ns: int | None = None,
) -> None:
    """Stage ends under per-step commit (TorchFT): the survivors never stopped, so the stages follow the lost
    replica group's replacement, started before the next fault (``until_ns``: a later start is the next fault's
    restart; ``lost``: the group's ranks; None: whichever ranks start first after the fault): its
    ``rank_start``, its ``heal_end``, its first committed step of the job beyond the step reached at the fault (a
    step it committed alone from stale state is not the job's); without a replacement the job continued without
    the replica (nothing rescheduled or restored) and resumed at the survivors' first step beyond it."""
    replacement = next(
        (
            e
            for e in ix.of("rank_start")
            if e.t_ns > fp.t_ns
            and (until_ns is None or e.t_ns < until_ns)
            and (lost is None or int(e.get("rank", 0)) in lost)
        ),
        None,
    )
    if replacement is None:
        notes["reschedule"] = notes["reshard_or_replace"] = (
            "continued without the lost replica: no replacement started before "
            f"{'the next fault' if until_ns is not None else 'the run ended'}, nothing was rescheduled or "
            "restored"
        )
        ends["resume"] = catch_up_ns(
            ix.steps, fp, ends["detect"]
        )  # a step in flight at the fault is no resume
        return
    inc = incarnation(replacement)
    group = replacement.get("replica_group")  # each group numbers its incarnations: only its own
    joined = [e for e in ix.rank_starts_of(inc) if e.t_ns > fp.t_ns and e.get("replica_group") == group]
    ranks = {int(e.get("rank", 0)) for e in joined}
    ends["reschedule"] = (
        max(e.t_ns for e in joined) if joined else replacement.t_ns
    )  # every rank of the group
    healed = [
        e.t_ns
        for e in ix.of("heal_end")
        if incarnation(e) == inc and int(e.get("rank", 0)) in ranks and e.t_ns >= replacement.t_ns
    ]
    in_job = {(r, i, key[1]) for key, who in ix.steps.committers.items() for r, i in who}
    mine = [
        e
        for e in ix.of("step")
        if incarnation(e) == inc
        and int(e.get("rank", 0)) in ranks
        and e.t_ns > replacement.t_ns
        and e.get("committed")
        and (not in_job or (int(e.get("rank", 0)), inc, int(e["step"])) in in_job)
    ]
    if healed:
        ends["reshard_or_replace"] = max(healed)
    elif mine:
        first = mine[0]
        ends["reshard_or_replace"] = first.t_ns - int(float(first.get("duration_s") or 0.0) * 1e9)
        notes["reshard_or_replace"] = (
            "the replacement did not heal from a peer: the stage ends when its first step starts"
        )
    else:
        missing["reshard_or_replace"] = (
            "the replacement neither healed nor committed a step before the run ended"
        )
    heal_end = ends["reshard_or_replace"] or replacement.t_ns
    ends["resume"] = next(
        (e.t_ns for e in mine if e.t_ns >= heal_end and int(e["step"]) > fp.last_step_before), None
    )
    if ends["resume"] is None:
        missing["resume"] = "the replacement committed no step beyond the step reached at the fault"


@dataclass(frozen=True)
class RuntimeShare:
    """The share of rescheduling the runtime measured (seconds), what it was, or why there is none."""

    seconds: float | None
    what: str | None = None
    missing: str | None = None


def reschedule_runtime(ix: TimelineIndex, tf: int, scheduler_delay: float | None) -> RuntimeShare:
    """The runtime's share of the reschedule stage: the scheduler's delay (Slurm: ``scheduler_delay``), else the
    node replacement a container runtime recorded (a node's ``node_exit`` at or after ``tf`` to the ``node_start``
    of its reboot, of the spare that took it over, or of a framework's spare node), else the spare agent start a
    framework recorded (``torchrun-elastic``: the lost node's agent killed, ``proc_exit`` with a signal, to the
    ``proc_start`` of a ``*.spare`` agent)."""
    if scheduler_delay is not None:
        return RuntimeShare(scheduler_delay, "scheduler: the requeue to the job running again")
    lost = next((e for e in ix.of("node_exit") if e.t_ns >= tf and e.get("reason") != "cleanup"), None)
    if lost is not None:
        back = next(
            (
                e
                for e in ix.of("node_start")
                if e.t_ns >= lost.t_ns
                and (
                    (e.get("node") == lost.get("node") and e.get("reason") in ("reboot", "takeover"))
                    or e.get("reason") == "spare"
                )
            ),
            None,
        )
        if back is not None:
            how = {"reboot": "rebooted", "takeover": "taken over by a hot spare"}.get(
                str(back.get("reason")), "replaced by a spare node"
            )
            return RuntimeShare(
                ns_to_s(back.t_ns - lost.t_ns),
                f"node replacement: {lost.get('node')}'s container exited, {how} ({back.get('node')})",
            )
    killed = next(
        (
            e
            for e in ix.of("proc_exit")
            if e.t_ns >= tf and e.get("role") == "agent" and int(e.get("returncode") or 0) < 0
        ),
        None,
    )
    if killed is not None:
        spare = next(
            (
                e
                for e in ix.of("proc_start")
                if e.t_ns >= killed.t_ns
                and e.get("role") == "agent"
                and str(e.get("proc", "")).endswith(".spare")
            ),
            None,
        )
        if spare is not None:
            return RuntimeShare(
                ns_to_s(spare.t_ns - killed.t_ns),
                f"spare start: {killed.get('proc')} killed, {spare.get('proc')} started",
            )
    return RuntimeShare(
        None,
        missing="no scheduler state, node replacement or spare start after the fault (the "
        "framework restarted its processes itself)",
    )


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
    gaps = [s for _, s in window_intervals(steps, t_from, t_to)]
    return statistics.median(gaps) if gaps else None


def window_intervals(steps: JobSteps, t_from: int | None, t_to: int | None) -> list[tuple[int, float]]:
    """(step index, seconds) of every interval between consecutive step completions of one incarnation (step
    ``index - 1`` to ``index``) that overlaps the window (None: open)."""
    out = []
    for items in steps.by_incarnation.values():
        for (i0, t_a), (i1, t_b) in zip(items, items[1:], strict=False):
            if i1 != i0 + 1:
                continue
            if (t_from is None or t_b > t_from) and (t_to is None or t_a < t_to):
                out.append((i1, ns_to_s(t_b - t_a)))
    return out


def same_steps_ratio(fault: list[tuple[int, float]], control: JobSteps) -> float | None:
    """How many times longer the steps ``fault`` (from :func:`window_intervals`) took than the same steps (step
    ``index - 1`` to ``index``, its first incarnation that ran both) took in the control run: the sum of their
    seconds over the control's sum for the indices the control has; None when it has none of them. The same
    steps on both sides, so a checkpoint save inside the window is matched by the control's save of that step
    and a stall of the whole window counts in full (a median of the window's intervals let two quick steps at
    its start outvote the 3 s stall after them)."""
    ctl: dict[int, float] = {}
    for i, s in window_intervals(control, None, None):
        ctl.setdefault(i, s)
    matched = [(s, ctl[i]) for i, s in fault if i in ctl]
    total_ctl = sum(c for _, c in matched)
    return sum(s for s, _ in matched) / total_ctl if matched and total_ctl > 0 else None


def checkpoint_age(events: Sequence[Event], t_ns: int) -> float | None:
    """Seconds since the newest complete checkpoint save (``ckpt_save_end`` among ``events``) before ``t_ns``
    (None: none completed)."""
    done = [e.t_ns for e in events if e.kind == "ckpt_save_end" and e.get("complete") and e.t_ns <= t_ns]
    return ns_to_s(t_ns - max(done)) if done else None
