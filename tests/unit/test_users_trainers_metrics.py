"""Metrics of timelines shaped like users' real trainers (issue 23): a job with no closing line, steps on the main
process only or at other cadences per rank, a progress bar's sparse counts, checkpoints seen only on the
filesystem, a final artifact instead of a printed digest, and runs that did not recover. Each timeline is what
the command shim and the checkpoint watcher write for such a script; each answer follows from it by hand."""

from __future__ import annotations

import pytest

from chaosbench.analysis.metrics import RECOVERY_METRICS, compute_metrics
from tests.unit.test_metrics import TL


def shim_run(
    tl: TL,
    inc: int,
    t: float,
    steps: list[int],
    ranks: tuple[int, ...] = (0,),
    dt: float = 0.1,
    every: dict[int, int] | None = None,
    world: int = 2,
) -> float:
    """An incarnation as the shim reports it: every rank starts, ``ranks`` log the given steps (rank r only
    every ``every[r]``-th), nothing at the end. Returns the time of the last step."""
    for r in range(world):
        tl.rank(t, "rank_start", r, inc, pid=100 + 10 * inc + r, world_size=world)
    t += 1.0
    for step in steps:
        t += dt
        for r in ranks:
            if step % (every or {}).get(r, 1) == 0:
                tl.rank(t, "step", r, inc, step=step, loss=1.0 / step)
    return t


def control(total: int = 30, steps: list[int] | None = None, artifact: str | None = None) -> list:
    tl = TL(control=True)
    t = shim_run(tl, 0, 0.1, steps or list(range(1, total + 1)))
    if artifact is not None:
        tl.add(t + 0.4, "artifact_digest", path="final", digest=artifact, tensors=3)
    tl.add(t + 0.5, "run_end", outcome="completed")
    return tl.sorted()


def killed_and_restarted(
    resume_from: int, last_before: int = 25, total: int = 30, artifact: str | None = None, bar_gap: int = 1
) -> TL:
    """Rank 0 alone logs steps; killed after ``last_before``, restarted, first step ``resume_from + 1``."""
    tl = TL()
    t = shim_run(tl, 0, 0.1, list(range(1, last_before + 1)))
    tl.add(t + 0.05, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
    tl.add(t + 0.1, "detect", src="framework", framework="fw", reason="rank1 exited")
    tl.add(t + 0.3, "restart", src="framework", framework="fw", attempt=1)
    t = shim_run(tl, 1, t + 0.5, list(range(resume_from + 1, total + 1, bar_gap)) + [total])
    if artifact is not None:
        tl.add(t + 0.4, "artifact_digest", path="final", digest=artifact, tensors=3)
    tl.add(t + 0.5, "run_end", outcome="completed")
    return tl


def test_a_job_that_exits_0_after_its_last_step_is_finished_without_a_closing_line() -> None:
    m = compute_metrics(control(), total_steps=30)
    assert m.outcome == "completed" and m.clean, m.verdict
    assert m.final_step == 30 and m.steps_short is None
    assert m.verdict == "completed"


def test_a_job_that_exits_0_short_of_its_total_says_by_how_much() -> None:
    """Before: "control failed (completed)". A 0-based counter read as 1-based ends one step short."""
    m = compute_metrics(control(steps=list(range(1, 30))), total_steps=30)
    assert m.outcome == "failed" and m.final_step == 29 and m.steps_short == 1
    assert m.verdict.startswith(
        "control failed: the job exited 0 at step 29 of 30 (1 short); check the workload's "
        "steps and how the step pattern counts (step_base"
    )


def test_a_job_that_did_not_exit_0_has_not_ended_training() -> None:
    tl = TL(control=True)
    t = shim_run(tl, 0, 0.1, list(range(1, 31)))
    tl.add(t + 0.5, "run_end", outcome="deadline")  # every step, but the job never exited
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.outcome == "failed" and m.final_step is None and m.steps_short is None
    assert m.verdict == "control failed (deadline)"


def test_steps_logged_by_rank_0_only_and_lost_work_from_the_new_incarnations_first_step() -> None:
    """HF Trainer: the bar of the resumed job shows 301 first (its 0 is no step, the shim drops it): restored
    from 300, the steps 301..320 done before the kill were done again."""
    tl = killed_and_restarted(resume_from=300, last_before=320, total=340)
    m = compute_metrics(tl.sorted(), control=control(340), total_steps=340)
    assert m.outcome == "recovered", m.verdict
    assert m.fault_step == 320 and m.lost_steps == 20
    assert m.lost_work_s == pytest.approx(20 * 0.1, abs=1e-6)  # step 300 to step 320 the first time


def test_a_sparse_bar_skipping_counts_still_resumes_at_its_first_count() -> None:
    tl = killed_and_restarted(resume_from=20, last_before=25, bar_gap=3)  # resumed bar shows 21, 24, 27, 30
    m = compute_metrics(tl.sorted(), control=control(), total_steps=30)
    assert m.outcome == "recovered" and m.lost_steps == 5


def test_ranks_logging_at_other_cadences_complete_every_step() -> None:
    """Rank 1 logs every 5th step: every step is still a job step once rank 1 reported it or a later one."""
    tl = TL(control=True)
    t = shim_run(tl, 0, 0.1, list(range(1, 31)), ranks=(0, 1), every={1: 5})
    tl.add(t + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=30)
    assert m.outcome == "completed"
    # each step's 0.1 s counted once, not only every 5th step; step 1 has no interval (from the rank's start-up)
    assert m.productive_s == pytest.approx(29 * 0.1, abs=1e-6)


def test_a_steps_first_report_counts_a_repeat_from_another_pattern_does_not() -> None:
    """A loss line counted to step 10 right after the bar showed 10: the step is stamped by the bar."""
    tl = TL(control=True)
    t = shim_run(tl, 0, 0.1, list(range(1, 11)))
    tl.rank(t + 0.001, "step", 0, 0, step=10, loss=0.5)
    tl.add(t + 0.5, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=10)
    assert m.productive_s == pytest.approx(9 * 0.1, abs=1e-6)
    assert m.final_loss == 0.5  # the last loss a step reported


def test_no_digest_on_either_side_is_missing_not_exact() -> None:
    tl = killed_and_restarted(resume_from=20)
    m = compute_metrics(tl.sorted(), control=control(), total_steps=30)
    assert m.outcome == "recovered" and m.fidelity is None
    assert m.missing["fidelity"] == (
        "no final digest to compare (this run: it printed no final line and the suite names no final artifact "
        "(fidelity_from); its control: it printed no final line and the suite names no final artifact "
        "(fidelity_from))"
    )


@pytest.mark.parametrize(("run", "expected"), [("aa", "exact"), ("bb", "diverged")])
def test_fidelity_from_the_final_artifact(run: str, expected: str) -> None:
    tl = killed_and_restarted(resume_from=20, artifact=run)
    m = compute_metrics(tl.sorted(), control=control(artifact="aa"), total_steps=30)
    assert m.fidelity == expected and m.digest == run


def test_an_artifact_that_could_not_be_digested_is_missing_with_why() -> None:
    tl = killed_and_restarted(resume_from=20)
    tl.add(1000.0, "artifact_digest", path="{ckpt_dir}/final", error="no file at /x/final")
    m = compute_metrics(tl.sorted(), control=control(artifact="aa"), total_steps=30)
    assert m.fidelity is None
    assert "this run: its final artifact could not be digested: no file at /x/final" in m.missing["fidelity"]


def test_checkpoints_seen_on_the_filesystem_give_the_checkpoint_age() -> None:
    tl = killed_and_restarted(resume_from=20)
    t20 = next(
        e.t_ns for e in tl.events if e.kind == "step" and e.get("step") == 20 and e.get("incarnation") == 0
    )
    tl.events.append(
        type(tl.events[0])(
            t_ns=t20 + 10_000_000,
            kind="ckpt_save_end",
            src="watcher",
            data={"path": "epoch=0-step=20.ckpt", "step": 20, "complete": True},
        )
    )
    m = compute_metrics(tl.sorted(), control=control(), total_steps=30)
    fault = next(e.t_ns for e in tl.events if e.kind == "fault_inject")
    assert m.checkpoint_age_s == pytest.approx((fault - t20 - 10_000_000) / 1e9, abs=1e-6)
    assert not m.contaminated  # a save the watcher saw is not a rank's load from outside the run


def test_a_run_that_did_not_recover_has_no_resume_or_lost_work_figure() -> None:
    """Before: an undetected hang that never ended still had time_to_resume_s 0.046 s (its in-flight step)."""
    tl = TL()
    t = shim_run(tl, 0, 0.1, list(range(1, 16)), ranks=(0, 1))
    tl.add(t + 0.02, "fault_inject", src="injector", fault="hang", injector="hang", target=[{"rank": 1}])
    for r in (0, 1):  # the step in flight when rank 1 was stopped: 46 ms after the fault
        tl.rank(t + 0.066, "step", r, 0, step=16, loss=0.1)
    tl.add(t + 30, "teardown_begin", reason="deadline")
    tl.add(t + 31, "run_end", outcome="deadline")
    m = compute_metrics(tl.sorted(), control=control(), total_steps=30)
    assert m.outcome == "not_recovered"
    for k in RECOVERY_METRICS:
        assert getattr(m, k) is None, k
        assert m.missing[k] == "not recovered: training did not finish (run ended: deadline)", k
    assert m.verdict == "not detected, not recovered (deadline)"


def test_a_sparse_bar_that_skips_the_first_steps_after_a_resume_is_placed_by_the_checkpoint_read() -> None:
    """HF Trainer killed at step 70 with checkpoint-50: the resumed bar draws 0, then 53 (51 and 52 went by
    within its 0.1 s). The watcher saw checkpoint-50's files read after the new ranks started: restored from 50."""
    tl = killed_and_restarted(resume_from=52, last_before=70, total=150)
    start1 = min(e.t_ns for e in tl.events if e.kind == "rank_start" and e.get("incarnation") == 1)
    tl.events.append(
        type(tl.events[0])(
            t_ns=start1 + 500_000_000,
            kind="ckpt_load_end",
            src="watcher",
            data={"path": "checkpoint-50", "step": 50},
        )
    )
    m = compute_metrics(tl.sorted(), control=control(150), total_steps=150)
    assert m.outcome == "recovered" and m.lost_steps == 20
    assert m.lost_work_s == pytest.approx(20 * 0.1, abs=1e-6)
    without = compute_metrics(
        killed_and_restarted(resume_from=52, last_before=70, total=150).sorted(),
        control=control(150),
        total_steps=150,
    )
    assert without.lost_steps == 18  # what the bar alone shows


def test_a_script_that_trains_its_snapshots_last_epoch_again_lost_it_too() -> None:
    """The PyTorch tutorial saves snapshot.pt after epoch e with EPOCHS_RUN = e and resumes at epoch e: the
    snapshot holds e + 1 epochs (the watcher's step), yet epoch e (step e + 1) is trained again: it was lost."""
    tl = killed_and_restarted(resume_from=3, last_before=5, total=10)  # resumed: "Epoch 3" -> step 4 again
    start1 = min(e.t_ns for e in tl.events if e.kind == "rank_start" and e.get("incarnation") == 1)
    tl.events.append(
        type(tl.events[0])(
            t_ns=start1 + 1, kind="ckpt_load_end", src="watcher", data={"path": "snapshot.pt", "step": 4}
        )
    )
    m = compute_metrics(tl.sorted(), control=control(10), total_steps=10)
    assert m.lost_steps == 2  # steps 4 and 5 done before the kill, done again


def test_a_scripts_start_up_is_no_steps_compute() -> None:
    """Lightning takes ~8 s from the shim's rank_start to its first global_step line: before, that step's
    duration was those 8 s and a killed-and-restarted run had a higher goodput than its control."""
    tl = TL(control=True)
    for r in (0, 1):
        tl.rank(0.1, "rank_start", r, 0, pid=100 + r, world_size=2)
    for i, step in enumerate(range(1, 11)):
        tl.rank(8.1 + 0.1 * i, "step", 0, 0, step=step, loss=0.5)
    tl.add(10.0, "run_end", outcome="completed")
    m = compute_metrics(tl.sorted(), total_steps=10)
    assert m.productive_s == pytest.approx(9 * 0.1, abs=1e-6)
    assert m.goodput == pytest.approx(0.9 / 10.0, abs=1e-6)
