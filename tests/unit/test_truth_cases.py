"""The eleven cases of issue 24: metrics that were wrong without a warning, each on a hand-built timeline whose
answer follows from it by hand (the timelines fed to compute_metrics directly, as the issue found them)."""

from __future__ import annotations

import pytest

from chaosbench.analysis.fleet import Sample, costs_from_rows
from chaosbench.analysis.metrics import RECOVERY_METRICS, compute_metrics
from chaosbench.report.analysis import assumptions_from, stats_table
from tests.unit.test_metrics import TL, control_run, restart_run


def test_1_no_digest_on_either_side_is_no_match() -> None:
    """A smoke run with its digests removed: 'exact' (None == None) before; missing now."""
    tl = restart_run(digest="")
    ctl = TL(control=True).incarnation(0, 0.1, 1, 30, end=True, digest="")
    ctl.add(ctl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=ctl.sorted(), total_steps=30)
    assert m.outcome == "recovered" and m.fidelity is None
    assert m.missing["fidelity"].startswith(
        "no final digest to compare (this run: its train_end carried no digest"
    )


def _two_groups(tl: TL) -> None:
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2, replica_group=r, group_world_size=1)


def test_2_per_step_commit_resume_comes_after_the_frameworks_reaction() -> None:
    """TorchFT: group 1 killed; the survivor's step 26 was in flight and commits 5 ms after the kill; the
    Lighthouse drops group 1 after its 5 s heartbeat timeout and the survivor trains on alone. The job stalled
    5 s: its resume is the first commit after that reaction (before: 0.005 s, which fed the fleet projection)."""
    tl = TL()
    _two_groups(tl)
    t = 1.0
    for step in range(1, 26):
        t += 0.03
        for r in (0, 1):
            tl.rank(t, "step", r, 0, step=step, duration_s=0.02, committed=True, participants=2, quorum_id=1)
    tf = t + 0.03
    # step 26 was in flight: group 1 committed it just before it was killed, group 0 5 ms after
    tl.rank(tf - 0.001, "step", 1, 0, step=26, duration_s=0.02, committed=True, participants=2, quorum_id=1)
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.rank(tf + 0.005, "step", 0, 0, step=26, duration_s=0.02, committed=True, participants=2, quorum_id=1)
    tl.add(tf + 5.0, "detect", src="framework", framework="fw", via="lighthouse", blame_groups=["1"])
    for i, step in enumerate(range(27, 41)):
        tl.rank(
            tf + 5.1 + 0.03 * i,
            "step",
            0,
            0,
            step=step,
            duration_s=0.02,
            committed=True,
            participants=1,
            quorum_id=2,
        )
    tl.rank(tf + 6.0, "train_end", 0, 0, step=40, digest="d")
    tl.add(tf + 6.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=40)
    assert m.outcome == "recovered" and m.detected
    assert m.time_to_detect_s == pytest.approx(5.0, abs=1e-6)
    assert m.time_to_resume_s == pytest.approx(5.1, abs=1e-6)
    assert m.time_to_catch_up_s == pytest.approx(5.1, abs=1e-6)


def test_3_sparse_logging_of_every_rank_restarts_from_the_loaded_checkpoint() -> None:
    """Every rank logs every 5th step; killed after step 25 (checkpoint 20): the resumed job's first line is step
    25 again (21..24 are not printed): restarted from 20, as its load says (before: from 24, 1 step lost)."""
    tl = TL()
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2)
    t = 1.0
    for step in range(1, 26):
        t += 0.1
        if step % 5 == 0:
            for r in (0, 1):
                tl.rank(t, "step", r, 0, step=step, loss=0.5)
        if step == 20:
            for r in (0, 1):
                tl.rank(t + 0.01, "ckpt_save_end", r, 0, step=20, complete=True)
    tf = t + 0.05
    tl.add(tf, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(tf + 0.1, "detect", src="framework", framework="fw", blame_rank=1)
    tl.add(tf + 0.2, "restart", src="framework", framework="fw")
    for r in (0, 1):
        tl.rank(tf + 0.3, "rank_start", r, 1, pid=200 + r, world_size=2)
        tl.rank(tf + 1.0, "ckpt_load_end", r, 1, step=20)
    for i, step in enumerate(range(25, 31, 5)):
        for r in (0, 1):
            tl.rank(tf + 1.5 + 0.5 * i, "step", r, 1, step=step, loss=0.4)
    tl.rank(tf + 3.0, "train_end", 0, 1, step=30, digest="d")
    tl.add(tf + 3.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "recovered" and m.lost_steps == 5


def test_4_a_fault_the_job_outlasted_is_no_recovery_anywhere() -> None:
    """A hang with a duration, nothing reacting: 'outlasted', counted apart in the comparison and costing its
    stall in the projection (before: 'recovered', and it out-ranked a framework that detects and restarts)."""
    rows = [
        {
            "framework": "fw",
            "fault": "hang",
            "control": False,
            "outcome": "outlasted",
            "fault_class": "hang",
            "time_to_resume_s": 3.1,
            "lost_steps": 0,
            "lost_work_s": 0.0,
            "rollback": False,
            "extra_wall_s": 3.0,
        },
        {
            "framework": "fw",
            "fault": "hang",
            "control": False,
            "outcome": "recovered",
            "fault_class": "hang",
            "time_to_resume_s": 9.0,
            "lost_steps": 4,
            "lost_work_s": 0.4,
            "rollback": True,
            "extra_wall_s": 9.5,
        },
    ]
    table = stats_table(rows)
    (row,) = table.rows
    assert row[2] == "1/2 (50%; 9%-91%); 1 outlasted"
    assert row[4] == "9.000 (n=1)"  # the stall is no time to resume
    (costs,) = costs_from_rows(rows)
    assert costs.samples["hang"] == [Sample(3.1, 0.0), Sample(9.0, None)]


def test_5_a_false_detection_that_ends_the_run_and_a_flap_after_recovery_count() -> None:
    tl = TL().incarnation(0, 0.1, 1, 8)
    tl.add(
        tl.t_last + 0.1, "detect", src="framework", framework="fw", reason="heartbeat"
    )  # nothing was faulted
    tl.add(tl.t_last + 0.2, "give_up", src="framework", framework="fw")
    tl.add(tl.t_last + 0.3, "run_end", outcome="gave_up")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert (
        m.outcome == "fault_not_fired" and m.false_detections == 1
    )  # before: None (the scorecard dropped it)

    tl = restart_run()
    tl.add(tl.t_last - 0.2, "detect", src="framework", framework="fw", reason="flap")  # after the resume
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "recovered" and m.false_detections == 1  # before: 0


def test_6_every_fault_is_measured_a_second_kill_during_recovery_interrupts_the_first() -> None:
    """Killed at step 25, killed again 0.4 s later while the job restarts: the first fault was interrupted (the
    job had not resumed), the second recovered; its resume is its own (before: charged to the first)."""
    tl = TL().incarnation(0, 0.1, 1, 25)
    t1 = tl.t_last + 0.05
    tl.add(t1, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(t1 + 0.08, "detect", src="framework", framework="fw", blame_rank=1)
    tl.add(t1 + 0.2, "restart", src="framework", framework="fw")
    for r in (0, 1):
        tl.rank(t1 + 0.3, "rank_start", r, 1, pid=200 + r, world_size=2)
    t2 = t1 + 0.4
    tl.add(
        t2, "fault_inject", src="injector", fault="kill-during-restore", injector="kill", target=[{"rank": 0}]
    )
    tl.add(t2 + 0.05, "detect", src="framework", framework="fw", blame_rank=0)
    tl.add(t2 + 0.1, "restart", src="framework", framework="fw")
    tl.incarnation(2, t2 + 0.2, 21, 30, load_from=20, end=True)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.outcome == "recovered" and m.fault_count == 2
    assert [f["status"] for f in m.faults] == ["interrupted", "recovered"]
    assert m.faults[0]["interrupted_by"] == "kill-during-restore"
    assert m.faults[1]["time_to_detect_s"] == pytest.approx(0.05, abs=1e-6)
    assert m.faults[1]["time_to_resume_s"] == pytest.approx(0.2 + 1.0 + 0.2 + 0.1, abs=1e-6)
    # steps 21..25 were lost to the first kill (done again from checkpoint 20); the second found nothing done
    assert m.faults[0]["lost_steps"] == 5 and m.faults[1]["lost_steps"] == 0
    assert m.faults[1]["restarts"] == 1 and m.faults[0]["restarts"] == 1
    assert m.time_to_resume_s is None and m.missing["time_to_resume_s"].startswith("interrupted: fault")
    table = stats_table([{**m.to_dict(), "fault": "kill+kill-during-restore"}])
    assert [r[0] for r in table.rows] == [
        "kill+kill-during-restore",
        "kill+kill-during-restore › kill",
        "kill+kill-during-restore › kill-during-restore",
    ]


def test_7_a_clock_that_could_not_be_measured_is_not_one_host_one_clock() -> None:
    tl = restart_run()
    tl.add(0.05, "clock_offset", node="node1", slurm_node="n2", error="srun timed out")
    m = compute_metrics(tl.sorted(), control=control_run(), total_steps=30)
    assert m.clock_offset_bound_s is None
    assert m.missing["clock_offset_bound_s"] == (
        "the clock of node1 could not be measured (srun timed out): its stamps are uncorrected"
    )
    assert "its stamps are uncorrected" in (m.verdict or "")


def test_8_runs_that_did_not_recover_feed_no_median() -> None:
    """A not-recovered row of an older chaosbench still carrying a partial resume: the medians leave it out."""
    rows = [
        {
            "framework": "fw",
            "fault": "kill",
            "control": False,
            "outcome": "recovered",
            "time_to_resume_s": 4.0,
            "lost_steps": 5,
        },
        {
            "framework": "fw",
            "fault": "kill",
            "control": False,
            "outcome": "not_recovered",
            "time_to_resume_s": 0.046,
            "lost_steps": 99,
        },
    ]
    (row,) = stats_table(rows).rows
    assert row[4] == "4.000 (n=1)" and row[5] == "5.000 (n=1)"
    m = compute_metrics(
        TL()
        .incarnation(0, 0.1, 1, 10)
        .add(2.5, "fault_inject", src="injector", fault="k", injector="kill")
        .add(9.0, "run_end", outcome="failed")
        .sorted(),
        total_steps=30,
    )
    assert all(getattr(m, k) is None for k in RECOVERY_METRICS)


def test_9_naming_a_whole_node_for_one_ranks_fault_is_imprecise() -> None:
    tl = TL().incarnation(0, 0.1, 1, 25, ranks=4)
    tl.events = [
        e
        if e.kind != "rank_start"
        else type(e)(e.t_ns, e.kind, e.src, e.host, {**e.data, "node": f"node{int(e.data['rank']) // 2}"})
        for e in tl.events
    ]  # two ranks a node
    t = tl.t_last + 0.05
    tl.add(t, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(t + 0.1, "detect", src="framework", framework="fw", blame_node="node0")
    tl.add(t + 0.2, "restart", src="framework", framework="fw")
    tl.incarnation(1, t + 0.3, 21, 30, load_from=20, end=True, ranks=4)
    tl.add(tl.t_last + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.blamed == "rank 0, rank 1" and m.blame == "imprecise"  # before: "correct"


def test_10_restart_count_counts_each_groups_restarts() -> None:
    """Two TorchFT groups, each restarted once (incarnation 1 of its own): 2 restarts (before: the highest
    incarnation, 1)."""
    tl = TL(control=True)
    for inc in (0, 1):
        for r in (0, 1):
            tl.rank(
                0.1 + inc + 0.5 * r,
                "rank_start",
                r,
                inc,
                pid=100 + 10 * inc + r,
                world_size=2,
                replica_group=r,
                group_world_size=1,
            )
    for r in (0, 1):
        tl.rank(3.0, "step", r, 1, step=1, duration_s=0.1, committed=True, participants=2, quorum_id=5)
        tl.rank(3.1, "train_end", r, 1, step=1, digest="d")
    tl.add(3.5, "run_end", outcome="completed")
    assert compute_metrics(tl.sorted(), total_steps=1).restart_count == 2


def test_11_projection_inputs_are_what_was_given_and_measured() -> None:
    a, notes = assumptions_from({"nodes": 8, "node_mtbf_h": 100, "manual_recovery_s": 0.0})
    assert a.manual_recovery_s == 0.0  # an explicit 0 is not the default
    rows = [
        {
            "framework": "fw",
            "fault": "k",
            "control": False,
            "outcome": "recovered",
            "fault_class": "crash",
            "time_to_resume_s": 3.0,
            "rollback": False,
            "lost_work_s": None,
        }
    ]
    assert costs_from_rows(rows) == []  # a missing lost work is no 0 s of it


def test_a_kill_that_bites_late_is_detected_not_a_false_detection() -> None:
    """A real run (test_role_faults, CI): the rendezvous host's agent killed after step 10; both ranks go on
    for two steps until node1's agent next calls the store, finds it gone (a rendezvous_lost line, +0.97 s) and
    stops its worker (the detection, +0.98 s); the job fails. Those two steps were the kill not having bitten yet,
    no resume from it: the detection is the kill's (before: '1 detection(s) before the fault', not detected)."""
    from pathlib import Path

    from chaosbench.timeline import read_events

    fixture = (
        Path(__file__).resolve().parent.parent
        / "fixtures"
        / "timelines"
        / "torchrun_kill_rendezvous_host.jsonl"
    )
    m = compute_metrics(read_events(fixture, strict=True))
    assert m.outcome == "not_recovered" and m.run_end_outcome == "failed", m.verdict
    assert m.detected and m.detected_via == "rendezvous store lost" and m.false_detections == 0, m.verdict
    assert m.time_to_detect_s == pytest.approx(
        0.974484883, abs=1e-9
    )  # the detect line less the kill's effect


def test_a_give_up_with_no_detection_before_it_is_the_frameworks_reaction() -> None:
    """A real run (nvidia-resiliency-ext 0.7.0, 2 nodes, node0's ft_launcher, the rendezvous store's host,
    SIGKILLed after step 15): node1's launcher lost its store (``Connection reset by peer``, +0.015 s) and ended at
    once, logging only ``Agent run ended with exception, e=DistNetworkError(...). Agent's exit code = 1``
    (+1.159 s), no detection line before it. Before: 'gave up after 0 restarts' with no detection; a give-up
    before any detection is the reaction, and what the launcher printed first says what noticed it."""
    from pathlib import Path

    from chaosbench.timeline import read_events

    fixture = (
        Path(__file__).resolve().parent.parent
        / "fixtures"
        / "timelines"
        / "nvrx07_kill_rendezvous_host.jsonl"
    )
    events = read_events(fixture, strict=True)
    m = compute_metrics(events)
    (give_up,) = [e for e in events if e.kind == "give_up"]
    (fault,) = [e for e in events if e.kind == "fault_inject"]
    assert m.outcome == "not_recovered" and m.gave_up and m.restart_count == 0, m.verdict
    assert m.detected and m.detected_by == "nvrx" and m.detected_via == "rendezvous store lost", m.verdict
    assert m.time_to_detect_s == pytest.approx((give_up.t_ns - int(fault["effect_t_ns"])) / 1e9, abs=1e-9)
    assert m.verdict == "gave up after 0 restarts; detected by rendezvous store lost"


def test_a_fresh_run_whose_first_step_is_a_counted_loss_line_is_not_contaminated() -> None:
    """A real run (test_real_trainers[hf], restart, kill rank 1 at step 70, CI on a busy machine): the Trainer's
    first loss line (step 10, counted by step_every: 10) came before the tqdm bar's first redraw, so the first
    incarnation's first step was 10 while its steps were at most 9 apart (the bar's redraws); it was reported
    'contaminated'. A counted line stands for the 10 steps up to it (its step events say every: 10), so a first
    step of 10 is a fresh start. The logs: checkpoint-50 saved, killed at 70, resumed from checkpoint-50
    (the watcher's load), finished at 150: 20 steps lost, one restart."""
    import dataclasses
    from pathlib import Path

    from chaosbench.timeline import read_events

    fixture = (
        Path(__file__).resolve().parent.parent
        / "fixtures"
        / "timelines"
        / "hf_trainer_restart_kill_first_step_10.jsonl"
    )
    events = read_events(fixture, strict=True)
    m = compute_metrics(events)
    assert m.outcome == "recovered" and not m.contaminated, m.verdict
    assert m.lost_steps == 20 and m.restart_count == 1 and m.final_step == 150, m.verdict
    # without the cadence the same steps read as a resume from elsewhere (what the run was reported as)
    bare = [dataclasses.replace(e, data={k: v for k, v in e.data.items() if k != "every"}) for e in events]
    assert compute_metrics(bare).outcome == "contaminated"


def test_runs_whose_fault_did_not_fire_are_not_in_the_recovered_share() -> None:
    """The comparison table's recovered x/y counts the runs whose fault fired, as the headline does: a fault that
    never fired and a contaminated run are named beside, not counted as failures to recover."""
    rows = [
        {"framework": "fw", "fault": "kill", "control": False, "outcome": o, "time_to_resume_s": 4.0}
        for o in ("recovered", "recovered", "not_recovered", "fault_not_fired", "contaminated")
    ]
    (row,) = stats_table(rows).rows
    assert row[2] == "2/3 (67%; 21%-94%); not counted: 1 contaminated, 1 fault not fired"
