"""Metric extraction on hand-written timelines with known answers."""

from __future__ import annotations

import pytest

from chaosbench.analysis.metrics import compute_metrics
from chaosbench.timeline import Event

S = 1_000_000_000
T0 = 1_700_000_000 * S


class TL:
    """Builds a timeline with times given in seconds since run start."""

    def __init__(self, control: bool = False, fault: str | None = "kill") -> None:
        self.events: list[Event] = []
        self.add(
            0.0,
            "run_start",
            scenario="fw/x",
            framework="fw",
            fault=None if control else fault,
            repeat=0,
            control=control,
        )

    def add(self, t: float, kind: str, src: str = "harness", **data: object) -> TL:
        self.events.append(Event(t_ns=T0 + int(round(t * S)), kind=kind, src=src, data=dict(data)))
        return self

    def rank(self, t: float, kind: str, rank: int, inc: int, **data: object) -> TL:
        return self.add(t, kind, src="rank", rank=rank, incarnation=inc, **data)

    def incarnation(
        self,
        inc: int,
        t_start: float,
        first: int,
        last: int,
        dt: float = 0.1,
        load_from: int | None = None,
        ckpt_every: int = 10,
        ranks: int = 2,
        end: bool = False,
        digest: str = "d",
    ) -> TL:
        """Ranks start at t_start, (optionally) load a checkpoint for 0.2 s, then one step every dt."""
        for r in range(ranks):
            self.rank(t_start, "rank_start", r, inc, pid=100 + 10 * inc + r, world_size=ranks)
        t = t_start + 1.0  # 1 s of init
        if load_from is not None:
            for r in range(ranks):
                self.rank(t, "ckpt_load_begin", r, inc, step=load_from)
            t += 0.2
            for r in range(ranks):
                self.rank(t, "ckpt_load_end", r, inc, step=load_from)
        for step in range(first, last + 1):
            t += dt
            for r in range(ranks):
                self.rank(t, "step", r, inc, step=step, loss=1.0 / step, duration_s=dt)
            if ckpt_every and step % ckpt_every == 0:
                for r in range(ranks):
                    self.rank(t + 0.002, "ckpt_save_begin", r, inc, step=step)
                    self.rank(t + 0.05, "ckpt_save_end", r, inc, step=step, complete=True)
                t += 0.05
        if end:
            for r in range(ranks):
                self.rank(t + 0.01, "train_end", r, inc, step=last, loss=1.0 / last, digest=digest)
        self.t_last = t
        return self

    def sorted(self) -> list[Event]:
        return sorted(self.events, key=lambda e: e.t_ns)


def control_run(total: int = 30) -> list[Event]:
    tl = TL(control=True).incarnation(0, 0.1, 1, total, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    return tl.sorted()


def kill_and_restart(tl: TL, t_fault: float) -> None:
    """Rank 1 killed at ``t_fault``, detected 0.08 s later, the job restarted 0.3 s after the kill."""
    tl.add(t_fault, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(t_fault + 0.08, "detect", src="framework", framework="fw", reason="rank1 exited")
    tl.add(t_fault + 0.3, "restart", src="framework", framework="fw", attempt=1)


def restart_run(digest: str = "d") -> TL:
    """Steps 1..25 (checkpoint at 10, 20), kill at 25+0.05 s, detect +0.08, restart from 20, finish 30."""
    tl = TL().incarnation(0, 0.1, 1, 25)
    t_fault = tl.t_last + 0.05
    kill_and_restart(tl, t_fault)
    tl.incarnation(1, t_fault + 0.5, 21, 30, load_from=20, end=True, digest=digest)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    tl.t_fault = t_fault  # type: ignore[attr-defined]
    return tl


def test_kill_and_restart_known_answers() -> None:
    tl = restart_run()
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    tf = tl.t_fault  # type: ignore[attr-defined]
    assert m.outcome == "recovered" and m.detected and m.recovered
    assert m.fault_t_s == pytest.approx(tf, abs=1e-6)
    assert m.time_to_detect_s == pytest.approx(0.08, abs=1e-6)
    # new incarnation: starts at tf+0.5, init 1 s, load 0.2 s, first step +0.1
    assert m.time_to_resume_s == pytest.approx(0.5 + 1.0 + 0.2 + 0.1, abs=1e-6)
    assert m.lost_steps == 5
    # steps 21..25 took 5 x 0.1 s (no checkpoint between 20 and 25 except the one right after 20)
    assert m.lost_work_s == pytest.approx(0.5 + 0.05, abs=1e-6)
    assert m.restart_count == 1
    # catch-up: first completion of step 26 after the fault = resume + 5 more steps (ckpt at 20 not redone)
    assert m.time_to_catch_up_s == pytest.approx(m.time_to_resume_s + 0.5, abs=1e-6)
    # newest complete save: ends 0.05 s after step 20; the fault is 5 steps + that save + 0.05 s after step 20
    assert m.checkpoint_age_s == pytest.approx((0.05 + 5 * 0.1 + 0.05) - 0.05, abs=1e-6)
    assert m.checkpoint_save_s == pytest.approx(0.048, abs=1e-6)
    assert m.badput_detect_s == pytest.approx(0.08, abs=1e-6)
    assert m.badput_restart_init_s == pytest.approx(0.5 + 1.0 - 0.08, abs=1e-6)
    assert m.badput_restore_s == pytest.approx(0.2, abs=1e-6)
    assert m.badput_recompute_s == pytest.approx(0.5, abs=1e-6)
    # productive: 30 distinct steps x 0.1 s
    assert m.productive_s == pytest.approx(3.0, abs=1e-6)
    assert m.goodput == pytest.approx(3.0 / m.wall_s)
    assert m.fidelity == "exact" and m.loss_diff == 0.0
    assert m.verdict == "recovered after 1 restart" and m.ranks_agree is True
    ctl = compute_metrics(control_run(), total_steps=30)
    assert m.extra_wall_s == pytest.approx(m.wall_s - ctl.wall_s)
    assert ctl.outcome == "completed" and ctl.fidelity is None


def test_diverged_final_state() -> None:
    m = compute_metrics(restart_run(digest="other").sorted(), control=control_run(), total_steps=30)
    assert m.fidelity == "diverged"
    assert m.verdict == "recovered after 1 restart; final state diverged"


def test_hang_outlasted_without_detection() -> None:
    """A hang that ended by itself with no framework reaction is outlasted, not recovered: its cost is its stall
    (before: "recovered in place, not detected", and it ranked as a recovery)."""
    tl = TL(fault="hang").incarnation(0, 0.1, 1, 12, ckpt_every=0)
    tf = tl.t_last + 0.02
    tl.add(tf, "fault_inject", src="injector", fault="hang", injector="hang")
    tl.add(tf + 3.0, "fault_revert", src="injector", fault="hang")
    # the same incarnation continues: steps 13..20 after the revert
    t = tf + 3.0
    for step in range(13, 21):
        t += 0.1
        for r in range(2):
            tl.rank(t, "step", r, 0, step=step, loss=0.1, duration_s=0.1)
    for r in range(2):
        tl.rank(t + 0.01, "train_end", r, 0, step=20, loss=0.1, digest="d")
    tl.add(t + 0.1, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=20)
    assert m.outcome == "outlasted" and m.detected is False and m.recovered is False
    assert m.verdict == "outlasted: the job went on after a 3.10 s stall, with no framework reaction"
    assert [f["status"] for f in m.faults] == ["outlasted"]
    # the window of the fault (inject to revert) holds the one 3.1 s gap: the job stood still
    assert m.fault_step_time_s == pytest.approx(3.12, abs=1e-6)
    assert m.time_to_detect_s is None and "no detection" in m.missing["time_to_detect_s"]
    assert m.time_to_resume_s == pytest.approx(3.1, abs=1e-6)
    assert m.time_to_catch_up_s == pytest.approx(3.1, abs=1e-6)
    assert m.lost_steps == 0 and m.lost_work_s == 0.0 and m.restart_count == 0
    assert m.badput_restore_s == 0.0 and m.badput_recompute_s == 0.0
    assert m.checkpoint_age_s is None and "no checkpoint" in m.missing["checkpoint_age_s"]
    assert m.missing["fidelity"] == "no control run"


def test_not_recovered_is_an_outcome_with_reasons() -> None:
    tl = TL().incarnation(0, 0.1, 1, 8)
    tf = tl.t_last + 0.01
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill")
    tl.add(tf + 0.5, "proc_exit", proc="rank1.i0", returncode=-9)
    tl.add(tf + 1.0, "run_end", outcome="failed", reason="rank1.i0 exited with signal SIGKILL (-9)")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "not_recovered" and m.recovered is False and m.detected is False
    assert m.time_to_resume_s is None
    assert (
        m.missing["time_to_resume_s"]
        == "not recovered: no training step completed after the fault (run ended: failed)"
    )
    assert m.missing["fidelity"] == "this run did not finish training"
    assert m.run_end_outcome == "failed"
    assert m.verdict == "not detected, not recovered (failed)"
    assert m.time_burned_s == pytest.approx(1.0, abs=1e-6)
    assert m.wall_s == pytest.approx(tf + 1.0, abs=1e-6)


def test_fault_not_fired_and_missing_run_end() -> None:
    tl = TL().incarnation(0, 0.1, 1, 30, end=True)
    tl.add(tl.t_last + 0.1, "fault_skipped", src="injector", fault="kill", reason="rank 3 has not started")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.outcome == "fault_not_fired"
    assert "rank 3 has not started" in m.missing["time_to_resume_s"]
    assert m.wall_s is None and "no run_end" in m.missing["wall_s"]


def test_restart_from_scratch_counts_all_steps_lost() -> None:
    tl = TL().incarnation(0, 0.1, 1, 7, ckpt_every=0)
    tf = tl.t_last + 0.05
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill")
    tl.add(tf + 0.1, "detect", src="framework", framework="fw")
    tl.incarnation(1, tf + 0.2, 1, 10, ckpt_every=0, end=True)
    tl.add(tl.t_last + 0.1, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=10)
    assert m.lost_steps == 7
    # from the faulted incarnation's first event (rank_start at 0.1) to step 7
    assert m.lost_work_s == pytest.approx(1.0 + 0.7, abs=1e-6)
    # no checkpoint load: restore is zero, restart/init runs from detection to the first step's start
    assert m.badput_restore_s == 0.0
    assert m.badput_restart_init_s == pytest.approx(0.1 + 1.0, abs=1e-6)
    assert m.badput_recompute_s == pytest.approx(0.7, abs=1e-6)


def test_torn_last_line_is_ignored(tmp_path) -> None:
    from chaosbench.timeline import TimelineWriter, read_events

    p = tmp_path / "events.jsonl"
    with TimelineWriter(p) as w:
        w.emit("run_start", t_ns=5)
        w.emit("step", t_ns=3, src="rank", rank=0, step=1)
    with p.open("a") as f:
        f.write('{"t_ns": 9, "kind": "st')
    ev = read_events(p)
    assert [e.kind for e in ev] == ["step", "run_start"]  # sorted by stamp, torn line dropped


def test_step_in_flight_at_the_fault_counts_as_lost_not_as_resume() -> None:
    """Rank 0 logs step 26 just after rank 1 was killed (their all-reduce had finished): one rank's report is
    not a completed job step, so neither a resume in place nor progress; the job restarted from step 20."""
    tl = TL().incarnation(0, 0.1, 1, 25)
    tf = tl.t_last + 0.01
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill")
    tl.rank(tf + 0.02, "step", 0, 0, step=26, loss=0.1, duration_s=0.1)
    tl.add(tf + 0.05, "detect", src="framework", framework="fw")
    tl.incarnation(1, tf + 0.2, 21, 30, load_from=20, end=True)
    tl.add(tl.t_last + 0.1, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.lost_steps == 5
    assert m.time_to_resume_s == pytest.approx(0.2 + 1.0 + 0.2 + 0.1, abs=1e-6)
    assert m.verdict == "recovered after 1 restart"


def test_stopped_rank_stall_is_not_productive_time() -> None:
    """A rank stopped for 10 s: its step and its peer's next step both report ~10 s; the job's step takes the
    fastest rank's compute, so goodput stays below 1 and the stall shows in the step time of the window."""
    tl = TL(fault="hang").incarnation(0, 0.1, 1, 5, ckpt_every=0)
    tf = tl.t_last + 0.01
    tl.add(tf, "fault_inject", src="injector", fault="hang", injector="hang")
    tl.rank(tf + 0.02, "step", 0, 0, step=6, loss=0.1, duration_s=0.1)  # rank 0 finished step 6
    tl.rank(tf + 10.0, "step", 1, 0, step=6, loss=0.1, duration_s=10.0)  # rank 1 was stopped inside it
    tl.add(tf + 10.0, "fault_revert", src="injector", fault="hang")
    tl.rank(tf + 10.1, "step", 0, 0, step=7, loss=0.1, duration_s=10.08)  # rank 0 waited in the all-reduce
    tl.rank(tf + 10.1, "step", 1, 0, step=7, loss=0.1, duration_s=0.1)
    for r in range(2):
        tl.rank(tf + 10.2, "train_end", r, 0, step=7, loss=0.1, digest="d")
    tl.add(tf + 10.3, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=7)
    assert m.productive_s == pytest.approx(0.7, abs=1e-6)
    assert m.goodput is not None and m.goodput < 0.1
    assert m.time_to_resume_s == pytest.approx(10.0, abs=1e-6)  # step 6 completed for the job at +10 s


# ------------------------------------------------------------------------------ the four stages of a recovery
STAGES = ("stage_detect_s", "stage_reschedule_s", "stage_reshard_or_replace_s", "stage_resume_s")


def _stage_sum(m) -> float:  # type: ignore[no-untyped-def]
    return sum(v for k in STAGES if (v := getattr(m, k)) is not None)


def test_stages_of_a_restart_add_up_to_the_catch_up() -> None:
    tl = restart_run()
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    # detect +0.08; the new incarnation's rank_start at +0.5; 1 s init + 0.2 s load; steps 21..26 at 0.1 s
    assert m.stage_detect_s == pytest.approx(0.08, abs=1e-6)
    assert m.stage_reschedule_s == pytest.approx(0.5 - 0.08, abs=1e-6)
    assert m.stage_reshard_or_replace_s == pytest.approx(1.0 + 0.2, abs=1e-6)
    assert m.stage_resume_s == pytest.approx(0.6, abs=1e-6)
    assert m.time_to_recover_s == pytest.approx(_stage_sum(m), abs=1e-9)
    assert m.time_to_recover_s == pytest.approx(m.time_to_catch_up_s, abs=1e-9)
    # the same pieces as badput: restart/init + restore = reschedule + reshard (both end at the restore's end)
    assert m.badput_restart_init_s + m.badput_restore_s == pytest.approx(  # type: ignore[operator]
        m.stage_reschedule_s + m.stage_reshard_or_replace_s, abs=1e-9
    )  # type: ignore[operator]
    assert m.stage_reschedule_runtime_s is None
    assert "framework restarted its processes itself" in m.missing["stage_reschedule_runtime_s"]
    assert not m.notes


def test_reschedule_lasts_until_every_rank_of_the_new_world_is_placed() -> None:
    """Restart in place on a rebooting node: rank 0's node relaunches at once, rank 1 starts only when its node is
    back 0.4 s later. The capacity is there at the last start, so the runtime's share (the reboot) fits inside
    the reschedule stage instead of spilling into the restore."""
    import dataclasses

    events = restart_run().sorted()
    moved = [
        dataclasses.replace(e, t_ns=e.t_ns + 400_000_000)
        if e.kind == "rank_start" and e.get("incarnation") == 1 and e.get("rank") == 1
        else e
        for e in events
    ]
    m = compute_metrics(sorted(moved, key=lambda e: e.t_ns), control=control_run(), total_steps=30)
    assert m.stage_reschedule_s == pytest.approx(0.5 + 0.4 - 0.08, abs=1e-6)
    assert m.stage_reshard_or_replace_s == pytest.approx(1.0 + 0.2 - 0.4, abs=1e-6)
    assert m.time_to_recover_s == pytest.approx(_stage_sum(m), abs=1e-9)


def test_stages_of_a_recovery_in_place_without_detection() -> None:
    """A hang that ended by itself: not detected (missing, and the next stage runs from the fault), nothing
    rescheduled or restored (0, noted), resume = the stall."""
    tl = TL(fault="hang").incarnation(0, 0.1, 1, 12, ckpt_every=0)
    tf = tl.t_last + 0.02
    tl.add(tf, "fault_inject", src="injector", fault="hang", injector="hang")
    t = tf + 3.0
    for step in range(13, 21):
        t += 0.1
        for r in range(2):
            tl.rank(t, "step", r, 0, step=step, loss=0.1, duration_s=0.1)
    for r in range(2):
        tl.rank(t + 0.01, "train_end", r, 0, step=20, loss=0.1, digest="d")
    tl.add(t + 0.1, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=20)
    assert m.stage_detect_s is None and "measured from the fault" in m.missing["stage_detect_s"]
    assert m.stage_reschedule_s == 0.0 and m.stage_reshard_or_replace_s == 0.0
    assert "recovered in place" in m.notes["stage_reschedule_s"]
    assert m.stage_resume_s == pytest.approx(3.1, abs=1e-6)
    assert (
        m.time_to_recover_s == pytest.approx(_stage_sum(m), abs=1e-9) == pytest.approx(m.time_to_catch_up_s)
    )


def test_stages_missing_when_not_recovered() -> None:
    tl = TL().incarnation(0, 0.1, 1, 8)
    tf = tl.t_last + 0.01
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill")
    tl.add(tf + 0.2, "detect", src="framework", framework="fw")
    tl.add(tf + 1.0, "run_end", outcome="failed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.stage_detect_s == pytest.approx(0.2, abs=1e-6)
    for k in STAGES[1:]:
        assert getattr(m, k) is None
        assert m.missing[k] == "not recovered: no training step completed after the fault (run ended: failed)"
    assert m.time_to_recover_s is None and m.missing["time_to_recover_s"]


def _torchft(replacement: bool) -> tuple[TL, float]:
    """Two replica groups of one rank; group 1 killed after step 10; the survivor's quorum commits from +0.5 s;
    with ``replacement`` group 1's restart joins at +2 s, heals 2.8 -> 3.0 s and commits step 40 at +3.05 s."""
    tl = TL()
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2, replica_group=r, group_world_size=1)
    t = 1.0
    for step in range(1, 11):
        t += 0.03
        for r in (0, 1):
            tl.rank(t, "step", r, 0, step=step, duration_s=0.02, committed=True, participants=2, quorum_id=1)
    tf = t + 0.01
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(tf + 0.1, "detect", src="framework", framework="torchft", via="lighthouse")
    for i, step in enumerate(range(11, 41)):
        tl.rank(
            tf + 0.5 + 0.05 * i,
            "step",
            0,
            0,
            step=step,
            duration_s=0.02,
            committed=True,
            participants=1,
            quorum_id=2,
        )
    if replacement:
        tl.rank(tf + 2.0, "rank_start", 1, 1, pid=200, world_size=2, replica_group=1, group_world_size=1)
        tl.rank(tf + 2.8, "heal_begin", 1, 1, step=36)
        tl.rank(tf + 3.0, "heal_end", 1, 1, step=36, duration_s=0.2)
        for i, step in enumerate(range(41, 44)):
            for r, inc in ((0, 0), (1, 1)):
                tl.rank(
                    tf + 3.05 + 0.03 * i,
                    "step",
                    r,
                    inc,
                    step=step,
                    duration_s=0.02,
                    committed=True,
                    participants=2,
                    quorum_id=3,
                )
    end = tf + 3.2
    for r in (0, 1) if replacement else (0,):
        tl.rank(end, "train_end", r, 1 if r == 1 else 0, step=43 if replacement else 40, digest="d")
    tl.add(end + 0.1, "run_end", outcome="completed")
    return tl, tf


def test_stages_follow_the_replacement_under_per_step_commit() -> None:
    tl, tf = _torchft(replacement=True)
    m = compute_metrics(tl.sorted(), total_steps=43)
    assert m.stage_detect_s == pytest.approx(0.1, abs=1e-6)
    assert m.stage_reschedule_s == pytest.approx(1.9, abs=1e-6)  # detection to the replacement's rank_start
    assert m.stage_reshard_or_replace_s == pytest.approx(1.0, abs=1e-6)  # rank_start to heal_end
    assert m.stage_resume_s == pytest.approx(0.05, abs=1e-6)  # heal_end to its first committed step (41 > 10)
    assert m.time_to_recover_s == pytest.approx(_stage_sum(m), abs=1e-9) == pytest.approx(3.05, abs=1e-6)
    # the job itself never waited for it: it caught up on the survivor at +0.5 s
    assert m.time_to_catch_up_s == pytest.approx(0.5, abs=1e-6)


def test_stages_when_the_job_continued_without_the_lost_replica() -> None:
    tl, tf = _torchft(replacement=False)
    m = compute_metrics(tl.sorted(), total_steps=40)
    assert m.stage_reschedule_s == 0.0 and m.stage_reshard_or_replace_s == 0.0
    assert "continued without the lost replica" in m.notes["stage_reshard_or_replace_s"]
    assert m.stage_resume_s == pytest.approx(0.4, abs=1e-6)
    assert m.time_to_recover_s == pytest.approx(_stage_sum(m)) == pytest.approx(m.time_to_catch_up_s)


def test_a_stage_end_before_the_previous_one_counts_as_zero() -> None:
    """The detection line was read after the restarted ranks had started: reschedule is 0, noted; the sum holds."""
    tl = restart_run()
    ev = next(e for e in tl.events if e.kind == "detect")
    tl.events.remove(ev)
    tl.add(tl.t_fault + 0.7, "detect", src="framework", framework="fw")  # type: ignore[attr-defined]
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.stage_reschedule_s == 0.0 and "counted as 0" in m.notes["stage_reschedule_s"]
    assert m.stage_reshard_or_replace_s == pytest.approx(1.2 - 0.2, abs=1e-6)
    assert (
        m.time_to_recover_s == pytest.approx(_stage_sum(m), abs=1e-9) == pytest.approx(m.time_to_catch_up_s)
    )


@pytest.mark.parametrize(
    "events, share, what",
    [
        ([("sched_state", {"state": "running"}, 0.9)], 0.6, "scheduler"),
        (
            [
                ("node_exit", {"node": "node1", "reason": "node-kill"}, 0.01),
                ("node_start", {"node": "node1", "reason": "takeover", "spare": True}, 0.41),
            ],
            0.4,
            "hot spare",
        ),
        (
            [
                ("node_exit", {"node": "node1", "reason": "node-kill"}, 0.01),
                ("node_start", {"node": "node1", "reason": "reboot"}, 0.31),
            ],
            0.3,
            "rebooted",
        ),
        (
            [
                ("proc_exit", {"proc": "torchrun.node1", "role": "agent", "returncode": -9}, 0.02),
                ("proc_start", {"proc": "torchrun.node2.spare", "role": "agent"}, 0.27),
            ],
            0.25,
            "spare start",
        ),
    ],
)
def test_the_runtimes_share_of_rescheduling(events, share, what) -> None:  # type: ignore[no-untyped-def]
    tl = restart_run()
    tf = tl.t_fault  # type: ignore[attr-defined]
    for kind, data, dt in events:
        tl.add(tf + dt, kind, src="runtime", **data)
    m = compute_metrics(tl.sorted(), total_steps=30)
    if what == "scheduler":  # the restart at +0.3 s to the job running again at +0.9 s
        assert m.scheduler_delay_s == pytest.approx(share, abs=1e-6)
    assert m.stage_reschedule_runtime_s == pytest.approx(share, abs=1e-6)
    assert what in m.notes["stage_reschedule_runtime_s"]


# ------------------------------------------------------------------------------ fidelity after a change of world
def _with_world(tl: TL, inc: int, world_size: int, global_batch: int | None) -> TL:
    for e in tl.events:
        if e.kind == "rank_start" and e.get("incarnation") == inc:
            e.data["world_size"] = world_size
            if global_batch is not None:
                e.data["global_batch"] = global_batch
    return tl


def _shrunk(global_batch: int | None) -> TL:
    """Two ranks (global batch 32); after the kill only one (16) resumes from the checkpoint."""
    tl = TL().incarnation(0, 0.1, 1, 25)
    tf = tl.t_last + 0.05
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="node-kill", target=[{"node": "node1"}])
    tl.add(tf + 0.1, "detect", src="framework", framework="fw")
    tl.incarnation(1, tf + 0.5, 21, 30, load_from=20, end=True, digest="shrunk", ranks=1)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    _with_world(tl, 0, 2, 32 if global_batch else None)
    return _with_world(tl, 1, 1, global_batch)


def _control_world(global_batch: int | None) -> list[Event]:
    tl = TL(control=True).incarnation(0, 0.1, 1, 30, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    return _with_world(tl, 0, 2, global_batch).sorted()


def test_a_shrunken_run_diverges_as_expected_and_an_exact_slo_still_fails() -> None:
    from chaosbench.analysis.slo import evaluate

    m = compute_metrics(_shrunk(16).sorted(), control=_control_world(32), total_steps=30)
    assert (m.world_size_before, m.world_size_after, m.global_batch_before, m.global_batch_after) == (
        2,
        1,
        32,
        16,
    )
    assert m.fidelity == "diverged"
    assert m.fidelity_reason is not None and m.fidelity_reason.startswith(
        "world size 2 -> 1: global batch 32 -> 16"
    )
    assert "final state diverged (expected: world size 2 -> 1" in (m.verdict or "")
    [slo] = evaluate(m, {"fidelity": "exact"})
    assert slo.ok is False and slo.measured == "diverged"
    # no global batch reported: the world size alone says it
    m = compute_metrics(_shrunk(None).sorted(), control=_control_world(None), total_steps=30)
    assert (
        m.fidelity_reason is not None and "world size 2 -> 1 (global batch not reported)" in m.fidelity_reason
    )


def test_a_divergence_without_a_change_of_batch_is_not_excused() -> None:
    """The world shrank but the global batch stayed (the workload keeps it): a divergence is a finding."""
    m = compute_metrics(_shrunk(32).sorted(), control=_control_world(32), total_steps=30)
    assert m.fidelity == "diverged" and m.fidelity_reason is None
    assert m.verdict is not None and m.verdict.endswith("final state diverged")
    # the same world as the control: no reason either
    m = compute_metrics(restart_run(digest="other").sorted(), control=control_run(), total_steps=30)
    assert m.fidelity == "diverged" and m.fidelity_reason is None


def test_slowdown_counts_a_stall_after_quick_steps_in_full() -> None:
    """A straggler throttled at step 8: steps 9 and 10 still come quickly (the rank had quota left), then the
    step-10 checkpoint and step 11 take the rest of the 3 s window. The same steps took 0.35 s in the control:
    the window's steps took ~10 times as long (a median of the window's three intervals said 1)."""
    tl = TL(fault="slow").incarnation(0, 0.1, 1, 8)
    tf = tl.t_last + 0.002
    tl.add(tf, "fault_inject", src="injector", fault="slow", injector="straggler")
    t = tl.t_last
    for step, dt in ((9, 0.1), (10, 0.1), (11, 3.1), (12, 0.1)):
        t += dt
        for r in range(2):
            tl.rank(t, "step", r, 0, step=step, loss=0.1)
    tl.add(tf + 3.0, "fault_revert", src="injector", fault="slow")
    for r in range(2):
        tl.rank(t + 0.01, "train_end", r, 0, step=12, loss=0.1, digest="d")
    tl.add(t + 0.1, "run_end", outcome="completed")
    ctl = TL(control=True).incarnation(0, 0.1, 1, 12, ckpt_every=10, end=True)
    ctl.add(ctl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=ctl.sorted(), total_steps=12)
    # the window overlaps the intervals ending at steps 9, 10, 11: 3.3 s; the control: 0.1 + 0.1 + 0.15 (the
    # step-10 checkpoint's 0.05 s in it)
    assert m.fault_step_time_s == pytest.approx(3.3 / 3, abs=1e-6)
    assert m.slowdown == pytest.approx(3.3 / 0.35, rel=1e-6)
    assert compute_metrics(tl.sorted(), total_steps=12).missing["slowdown"] == "no control run"


def test_fault_window_ends_where_the_revert_began() -> None:
    """A network delay's revert deletes its rule first and stops its delayer after: two quick steps came between
    (as in a CI run, where 6 of them outnumbered the window's 4 delayed ones). The window ends at the revert's
    start (``began_t_ns``), so only the delayed steps count; without it, at the event's own time."""

    def run(began: bool) -> TL:
        tl = TL(fault="delay").incarnation(0, 0.1, 1, 8)
        tf = tl.t_last + 0.002
        tl.add(tf, "fault_inject", src="injector", fault="delay", injector="net-delay")
        t = tl.t_last
        for step, dt in ((9, 1.0), (10, 1.0), (11, 0.03), (12, 0.03)):
            t += dt
            for r in range(2):
                tl.rank(t, "step", r, 0, step=step, loss=0.1)
        stamp = {"began_t_ns": T0 + int(round((tf + 1.99) * S))} if began else {}
        tl.add(t + 0.01, "fault_revert", src="injector", fault="delay", undone=True, **stamp)
        for r in range(2):
            tl.rank(t + 0.02, "train_end", r, 0, step=12, loss=0.1, digest="d")
        tl.add(t + 0.1, "run_end", outcome="completed")
        return tl

    # the intervals overlapping the window: those ending at steps 9 and 10 (1 s each; the revert began at tf + 1.99,
    # before step 10 ended), not the quick ones after
    assert compute_metrics(run(True).sorted(), total_steps=12).fault_step_time_s == pytest.approx(
        1.0, abs=1e-6
    )
    # the event's own time takes in the intervals ending at 11 and 12 too
    assert compute_metrics(run(False).sorted(), total_steps=12).fault_step_time_s == pytest.approx(
        2.06 / 4, abs=1e-6
    )
