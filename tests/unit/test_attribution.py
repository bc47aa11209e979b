"""Truth on a user's job, on hand-written timelines: who detected what and whom, what the harness caused, runs
that started from someone else's state, when a fault took effect, and a final line without a step."""

from __future__ import annotations

from pathlib import Path

from chaosbench.analysis.metrics import compute_metrics
from tests.unit.test_metrics import TL, control_run, kill_and_restart, restart_run


def _kill_tl() -> TL:
    return restart_run()


def test_train_end_without_step_takes_the_last_step() -> None:
    """A script whose final line has a digest but no step (``final checksum HEX``): the control finished."""
    tl = TL(control=True).incarnation(0, 0.1, 1, 30)
    tl.rank(tl.t_last + 0.01, "train_end", 0, 0, step=None, loss=None, digest="abc")
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.final_step == 30 and m.outcome == "completed" and m.digest == "abc"
    assert m.ranks_agree is None and "only one rank" in m.missing["ranks_agree"]


def test_reactions_after_the_harness_teardown_are_not_detections() -> None:
    """A hang torchrun cannot see: at the deadline the harness tears down, torchrun logs "Sending process ...
    closing signal SIGTERM". That is no detection."""
    tl = TL().incarnation(0, 0.1, 1, 15)
    t_fault = tl.t_last + 0.01
    tl.add(t_fault, "fault_inject", src="injector", fault="hang", injector="hang", target=[{"rank": 1}])
    tl.add(t_fault + 100, "teardown_begin", reason="deadline")
    tl.add(
        t_fault + 100.02,
        "detect",
        src="framework",
        framework="torchrun",
        line="Sending process 1 closing signal",
        node="node0",
    )
    tl.add(t_fault + 100.5, "restart", src="framework", framework="torchrun")
    tl.rank(t_fault + 100.6, "step", 0, 0, step=16)  # a rank that got SIGCONT during the teardown
    tl.add(t_fault + 101, "run_end", outcome="deadline")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.detected is False and m.time_to_detect_s is None
    assert "only after the harness began tearing the run down" in m.missing["time_to_detect_s"]
    assert m.verdict == "not detected, not recovered (deadline)"
    assert m.time_to_resume_s is None and m.restarts_claimed is None


def test_blame_from_the_restart_watchdog_and_from_torchrun_lines() -> None:
    tl = _kill_tl()
    ev = next(e for e in tl.events if e.kind == "detect")
    ev.data["blame_rank"] = 1
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert (m.blame, m.blamed) == ("correct", "rank 1")
    ev.data["blame_rank"] = 0
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert (m.blame, m.blamed) == ("wrong", "rank 0") and "blamed rank 0, not the faulted rank" in (
        m.verdict or ""
    )
    # torchrun: "failed (exitcode: -9) local_rank: 1" from the agent on node0 names the rank on that node
    del ev.data["blame_rank"]
    ev.data.update(local_rank="1", node="node0")
    for e in tl.events:
        if e.kind == "rank_start":
            e.data.update(node="node0", local_rank=e.get("rank"))
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert (m.blame, m.blamed) == ("correct", "rank 1")
    # a detection that names no one
    ev.data.pop("local_rank")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.blame == "none" and m.blamed is None


def test_torchft_blame_by_replica_group() -> None:
    tl = _kill_tl()
    for e in tl.events:
        if e.kind == "rank_start":
            e.data["replica_group"] = e.get("rank")
    ev = next(e for e in tl.events if e.kind == "detect")
    ev.data["blame_groups"] = [1]
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert (m.blame, m.blamed) == ("correct", "rank 1")


def test_false_detections_in_a_control_and_before_the_fault() -> None:
    tl = TL(control=True).incarnation(0, 0.1, 1, 12)
    tl.add(tl.t_last + 0.01, "detect", src="framework", framework="nvrx", reason="section 'step' unknown")
    tl.add(tl.t_last + 0.02, "detect", src="framework", framework="nvrx", reason="failed (exitcode: 1)")
    tl.add(tl.t_last + 0.05, "restart", src="framework", framework="nvrx", proc="ft_launcher")
    tl.incarnation(1, tl.t_last + 0.5, 11, 30, load_from=10, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.outcome == "completed" and m.clean is False and m.false_detections == 1 and m.restart_count == 1
    assert m.verdict.startswith("completed, but not clean: 1 restarts and 1 detections without a fault")

    tl = _kill_tl()
    tl.add(1.0, "detect", src="framework", framework="fw", reason="spurious")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.false_detections == 1 and "1 detection(s) before the fault" in (m.verdict or "")


def test_restart_count_cross_checked_against_the_framework() -> None:
    tl = _kill_tl()
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.restarts_claimed == m.restart_count == 1 and "mismatch" not in (m.verdict or "")
    tl.add(tl.t_fault + 0.31, "restart", src="framework", framework="fw", attempt=2)  # type: ignore[attr-defined]
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert (
        m.restarts_claimed == 2
        and "restart count mismatch: the ranks show 1, the framework reported 2" in (m.verdict or "")
    )


def test_contamination_by_a_foreign_checkpoint() -> None:
    """The first incarnation loads a checkpoint before this run saved any: another run's state."""
    tl = TL(control=True).incarnation(0, 0.1, 31, 30, load_from=30)
    tl.rank(tl.t_last + 0.01, "train_end", 0, 0, step=30, digest="x")
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.outcome == "contaminated" and m.contaminated
    assert m.verdict == (
        "contaminated: rank 0 loaded a checkpoint (step 30) before this run had saved one: state "
        "from outside the run"
    )

    # no load line, but the first incarnation's steps begin far beyond 1
    tl = TL().incarnation(0, 0.1, 21, 30, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "contaminated" and "first step was 21" in (m.verdict or "")

    # a clean restart run is not contaminated (it loads its own checkpoint after saving it)
    assert compute_metrics(_kill_tl().sorted(), control=control_run(), total_steps=30).contaminated is False

    # nor one whose first incarnation began a save and was stopped before reporting its end: the checkpoint may
    # be complete on disk (rank 0 marked it, then its closing barrier failed on the killed peer), and the next
    # incarnation loads it before its own first save (seen under nvrx, a bridge killed at step 10)
    tl = TL(fault="kill").incarnation(0, 0.1, 1, 9)
    for r in (0, 1):
        tl.rank(tl.t_last + 0.01, "step", r, 0, step=10)
        tl.rank(tl.t_last + 0.002, "ckpt_save_begin", r, 0, step=10)
    kill_and_restart(tl, tl.t_last + 0.003)
    tl.incarnation(1, tl.t_last + 2.0, 11, 30, load_from=10, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.contaminated is False and m.outcome == "recovered", m.verdict
    # a later incarnation that loads before any save of this run had begun is still judged contaminated
    tl = TL(fault="kill").incarnation(0, 0.1, 1, 9, ckpt_every=0)
    kill_and_restart(tl, tl.t_last + 0.003)
    tl.incarnation(1, tl.t_last + 2.0, 11, 30, load_from=10, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "contaminated" and "(step 10) before this run had saved one" in (m.verdict or ""), (
        m.verdict
    )


def test_fault_measured_from_when_it_took_effect() -> None:
    """A kill triggered at step 25 that reached the rank 61 ms later (after step 26 completed) is measured from
    its effect; the verdict says it landed late."""
    tl = TL().incarnation(0, 0.1, 1, 30, dt=0.01)
    step25 = next(e for e in tl.events if e.kind == "step" and e.get("step") == 25 and e.get("rank") == 1)
    t25 = (step25.t_ns - tl.events[0].t_ns) / 1e9
    tl.add(
        t25 + 0.001,
        "fault_inject",
        src="injector",
        fault="kill",
        injector="kill",
        target=[{"rank": 1}],
        trigger_step=25,
        effect_t_ns=tl.events[0].t_ns + int((t25 + 0.062) * 1e9),
    )
    tl.add(t25 + 0.08, "detect", src="framework", framework="fw", blame_rank=1)
    tl.add(t25 + 0.1, "run_end", outcome="failed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert abs(m.injection_latency_s - 0.061) < 1e-6  # type: ignore[operator]
    assert m.trigger_step == 25 and m.fault_step == 30
    assert abs(m.time_to_detect_s - 0.018) < 1e-6  # type: ignore[operator]
    assert "fault landed at step 30, 5 steps after its trigger (step 25), injection latency 61 ms" in (
        m.verdict or ""
    )


def test_per_step_commit_follows_the_quorum() -> None:
    """TorchFT, group 1 hung for 20 s after step 25: the survivor's one-group quorum commits step 26 at +10.06 s
    (after the process-group timeout), so the job resumed then; at +20 s the hung group comes back, forms its own
    quorum and commits 26.. again. The job step is complete when the quorum that committed it has, not when every
    rank ever seen has reported it."""
    tl = TL()
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2, replica_group=r, group_world_size=1)
    t = 1.0
    for step in range(1, 26):
        t += 0.03
        for r in (0, 1):
            tl.rank(t, "step", r, 0, step=step, duration_s=0.02, committed=True, participants=2, quorum_id=2)
    t_fault = t + 0.004
    tl.add(t_fault, "fault_inject", src="injector", fault="hang", injector="hang", target=[{"rank": 1}])
    tl.rank(t_fault + 10.039, "step_skipped", 0, 0, step=26, duration_s=0.02)
    for i, step in enumerate(range(26, 61)):
        tl.rank(
            t_fault + 10.068 + 0.024 * i,
            "step",
            0,
            0,
            step=step,
            duration_s=0.02,
            committed=True,
            participants=1,
            quorum_id=3,
        )
    tl.rank(t_fault + 10.9, "train_end", 0, 0, step=60, digest="d")
    tl.add(t_fault + 20.0, "fault_revert", src="injector", fault="hang")
    tl.rank(t_fault + 20.005, "step_skipped", 1, 0, step=26, duration_s=0.02)
    for i, step in enumerate(range(26, 61)):
        tl.rank(
            t_fault + 20.033 + 0.025 * i,
            "step",
            1,
            0,
            step=step,
            duration_s=0.02,
            committed=True,
            participants=1,
            quorum_id=4,
        )
    tl.rank(t_fault + 20.9, "train_end", 1, 0, step=60, digest="d")
    tl.add(t_fault + 21.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=60)
    assert m.outcome == "recovered"
    assert abs(m.time_to_resume_s - 10.068) < 1e-6, m.time_to_resume_s  # type: ignore[operator]
    assert (
        m.lost_steps == 1 and m.time_to_rejoin_s is None
    )  # step 26's compute was thrown away; nothing restarted
    assert m.verdict == "recovered in place, not detected"  # no framework event in this hand-built timeline


def test_a_skipped_step_whose_report_gives_no_duration_leaves_lost_work_missing() -> None:
    """A user's TorchFT script: the Manager's ``should_commit=False`` line says step 12 was not committed, not how
    long its compute took. It is 1 lost step; its seconds are missing with the reason, not counted as 0."""
    tl = TL()
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2, replica_group=r, group_world_size=1)
    for step in range(1, 12):
        for r in (0, 1):
            tl.rank(1.0 + 0.1 * step, "step", r, 0, step=step, committed=True, participants=2)
    t_fault = 2.15
    tl.add(t_fault, "fault_inject", src="injector", fault="hang", injector="hang", target=[{"rank": 1}])
    tl.add(
        t_fault + 2.0,
        "detect",
        src="framework",
        framework="torchft",
        via="lighthouse",
        mechanism="framework heartbeat",
        reason="lighthouse: 2 -> 1 replica groups heartbeating",
    )
    tl.rank(t_fault + 2.1, "step_skipped", 0, 0, step=12, reason="None")
    for i, step in enumerate(range(12, 21)):
        for r in (0, 1):
            tl.rank(t_fault + 3.1 + 0.1 * i, "step", r, 0, step=step, committed=True, participants=2)
    tl.add(t_fault + 4.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=20)
    assert m.outcome == "recovered" and m.lost_steps == 1 and m.skipped_steps == 1
    assert m.lost_work_s is None and m.missing["lost_work_s"].startswith(
        "step 12 was not committed, but how long"
    )
    tl.events = [e for e in tl.events if e.kind != "step_skipped"]
    tl.rank(t_fault + 2.1, "step_skipped", 0, 0, step=12, reason="None", duration_s=0.02)
    m = compute_metrics(tl.sorted(), total_steps=20)
    assert m.lost_steps == 1 and m.lost_work_s == 0.02


def test_restart_that_loads_a_checkpoint_is_clean_even_without_save_lines() -> None:
    """A script whose saves no pattern reports (only its 'resumed from' line): a restarted incarnation's load is
    its own checkpoint, not contamination; the same load in the first incarnation would be."""
    tl = restart_run()
    tl.events = [e for e in tl.events if e.kind not in ("ckpt_save_begin", "ckpt_save_end")]
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.contaminated is False and m.outcome == "recovered"


def test_what_detected_the_failure() -> None:
    """``detected_via``: a rank's exit after its peer's collective timed out is the process-group timeout's
    doing; an exit without one is the process's exit; a named mechanism or a ``via`` is taken as it is."""
    tl = _kill_tl()
    ev = next(e for e in tl.events if e.kind == "detect")
    tf = tl.t_fault  # type: ignore[attr-defined]

    def via() -> tuple[str | None, str | None]:
        m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
        return m.detected_via, m.verdict

    assert via()[0] is None  # the source said nothing
    ev.data["via"] = "exit"
    assert via() == ("process exit", "recovered after 1 restart; detected by process exit")
    # rank 0 printed its gloo timeout before it exited: the exit was the timeout's doing
    tl.add(
        tf + 0.07,
        "rank_error",
        signature="collective_timeout",
        rank=0,
        proc="rank0",
        line="RuntimeError: [...] Timed out waiting 10000ms for recv operation to complete",
    )
    assert via()[0] == "process-group timeout"
    ev.data["via"] = "step watchdog"
    assert via()[0] == "step watchdog"
    ev.data.update(via="lighthouse", mechanism="quorum change")
    assert via()[0] == "quorum change"
    # a timeout printed before the fault is not this failure's
    tl.events.pop()
    tl.add(
        tf - 1.0, "rank_error", signature="collective_timeout", rank=0, proc="rank0", line="Timed out waiting"
    )
    ev.data.update(via="exit", mechanism=None)
    assert via()[0] == "process exit"


def test_rank_error_watcher_reports_each_signature_once_per_rank(tmp_path: Path) -> None:
    from chaosbench.frameworks.base import RankErrorWatcher
    from chaosbench.runtimes.base import ProcessSpec, ProcHandle
    from chaosbench.timeline import TimelineWriter, read_events

    tw = TimelineWriter(tmp_path / "events.jsonl")
    watch = RankErrorWatcher(tw)
    rank1 = ProcHandle(ProcessSpec("rank1", ["python"], {"RANK": "1"}, role="rank", node="node0"), 11, None)
    agent = ProcHandle(ProcessSpec("agent0", ["torchrun"], {}, role="agent", node="node0"), 12, None)
    timeout = "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
    for line in ("step 3 loss 0.1", timeout, timeout, "Connection closed by peer [127.0.0.1]:5299"):
        watch(rank1, "stderr", line, 1)
    watch(agent, "stderr", "[rank0]: " + timeout, 2)
    watch(agent, "stderr", "[rank1]: " + timeout, 3)
    store = (
        "[W1201 03:21:49.394330824 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=4"
    )
    watch(rank1, "stderr", store, 4)  # a rank losing its store: its peer's doing, not a rendezvous loss
    watch(agent, "stderr", "[rank1]: " + store, 5)
    watch(agent, "stderr", store, 6)  # the agent's own line
    tw.close()
    got = [(e["proc"], e.get("rank"), e["signature"]) for e in read_events(tmp_path / "events.jsonl")]
    assert got == [
        ("rank1", 1, "collective_timeout"),
        ("rank1", 1, "peer_lost"),
        ("agent0", 0, "collective_timeout"),
        ("agent0", 1, "collective_timeout"),
        ("agent0", None, "rendezvous_lost"),
    ]


def test_training_that_finished_in_a_job_that_failed_says_so() -> None:
    """A killed agent whose workers trained on: the model is right, the job still ended badly."""
    tl = _kill_tl()
    end = next(e for e in tl.events if e.kind == "run_end")
    end.data["outcome"] = "failed"
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "recovered" and "training finished but the job ended failed" in (m.verdict or ""), (
        m.verdict
    )


def test_a_control_whose_rank_aborts_at_exit_says_so_and_is_no_fidelity_reference() -> None:
    """A rank that aborts after the job's last step (a script that never destroys its gloo process group:
    ``terminate called without an active exception``, pytorch/pytorch#190489) is restarted by the adapter; the
    control's verdict names the abort, and a fault run is not judged against the restarted control's state."""
    from chaosbench.signatures import error_line

    assert error_line("terminate called without an active exception")
    assert error_line("[rank1]: terminate called after throwing an instance of 'gloo::EnforceNotMet'")
    assert not error_line("the job will terminate called-back handlers")

    tl = TL(control=True).incarnation(0, 0.1, 1, 30)
    t = tl.t_last + 0.3
    tl.add(
        t,
        "proc_error",
        proc="rank1.i0",
        pid=201,
        role="rank",
        stream="stdout",
        line="terminate called without an active exception",
    )
    tl.add(t + 0.01, "proc_exit", proc="rank1.i0", pid=201, returncode=-6, role="rank", incarnation=0)
    tl.add(
        t + 0.02, "detect", src="framework", framework="fw", reason="rank1.i0 exited with signal SIGABRT (-6)"
    )
    tl.add(t + 0.05, "restart", src="framework", framework="fw", attempt=1)
    tl.incarnation(1, t + 0.5, 31, 31, load_from=30, ckpt_every=0, end=True, digest="other")
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    ctl = tl.sorted()
    m = compute_metrics(ctl, total_steps=30)
    assert m.outcome == "completed" and m.clean is False and m.restart_count == 1
    assert m.verdict == (
        "completed, but not clean: 1 restarts and 1 detections without a fault (the first: "
        "rank1.i0 exited with signal SIGABRT (-6), after the job's last step (30); rank1.i0 "
        "printed 'terminate called without an active exception')"
    )

    k = compute_metrics(_kill_tl().sorted(), control=ctl, total_steps=30)
    assert k.outcome == "recovered" and k.fidelity is None
    assert k.missing["fidelity"] == (
        "the control run restarted (1): its final state is no fault-free reference"
    )
    # against a clean control the same run is judged
    assert compute_metrics(_kill_tl().sorted(), control=control_run(), total_steps=30).fidelity == "exact"
