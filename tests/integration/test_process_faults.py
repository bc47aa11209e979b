"""Process-level faults with real ranks (ddp-mlp on gloo under restart), measured from the timeline: a segfault and
an abort in native code, a background thread that dies (silently, or stalling the loop), the GIL held by native
code, an OOM kill in a memory cgroup, and a preemption notice (SIGTERM) with and without a save on it."""

from __future__ import annotations

import pytest

from chaosbench.injectors.oom import memory_root
from tests.helpers import events_of, kinds, require, run_suite_text
from tests.helpers.truth import lost_steps_by_the_logs

pytestmark = pytest.mark.integration

SUITE = """
name: process-faults
seed: 12
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.01, pg_timeout_s: 10,
             save_on_sigterm: SAVE}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 6}
faults:
  segfault: {injector: segfault, target: 1, params: {at_step: 15}}
  abort: {injector: abort, target: 1, params: {at_step: 15}}
  thread-silent: {injector: thread-exception, target: 1, params: {at_step: 15}}
  thread-stall: {injector: thread-exception, target: 1, params: {at_step: 15, mode: stall}}
  gil-hold: {injector: gil-hold, target: 1, params: {at_step: 15, duration_s: 3}}
  oom: {injector: oom, target: 1, params: {at_step: 15, limit_mb: 64}}
  sigterm: {injector: sigterm, target: 1, trigger: {at_step: 15}}
matrix:
  frameworks: [restart]
  faults: [FAULTS]
  repeats: 1
"""

FAULTS = ["segfault", "abort", "thread-silent", "thread-stall", "gil-hold", "oom", "sigterm"]


def _run(tmp_path_factory, name: str, faults: list[str], save: bool) -> dict:
    text = SUITE.replace("FAULTS", ", ".join(faults)).replace("SAVE", str(save).lower())
    return run_suite_text(text, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run(tmp_path_factory, "process", FAULTS, save=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _run(tmp_path_factory, "process-save", ["sigterm"], save=True)


def _rank1_exit(m) -> int | None:
    exits = [
        e
        for e in kinds(events_of(m), "proc_exit", role="rank", incarnation=0)
        if str(e.get("proc")).startswith("rank1.")
    ]
    return exits[0].get("returncode") if exits else None


@pytest.mark.parametrize(("fault", "returncode"), [("segfault", -11), ("abort", -6)])
def test_native_crash_is_a_crash_and_recovers(results, fault: str, returncode: int) -> None:
    m = results[f"restart/{fault}"]
    assert _rank1_exit(m) == returncode
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact"
    assert (
        m.fault_count == 1 and m.restart_count == 1
    )  # once per run: the recomputed step does not fire again
    assert m.lost_steps == 4  # steps 11-14: back to the step-10 checkpoint, the fault before step 15


def test_silent_thread_exception_goes_unnoticed(results) -> None:
    m = results["restart/thread-silent"]
    assert m.outcome == "outlasted" and m.detected is False and m.restart_count == 0
    assert m.fidelity == "exact"  # the dead thread did nothing the training needed


def test_stalled_loop_is_a_live_hang_seen_by_the_step_watchdog(results) -> None:
    m = results["restart/thread-stall"]
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact"
    # the process stayed alive: the framework found it by its missing steps (6 s), not by an exit; its peer
    # waits in the allreduce as long, so the watchdog cannot tell which of them is stuck (blame is a guess)
    assert m.time_to_detect_s is not None and 5.5 < m.time_to_detect_s < 9, m.time_to_detect_s
    det = kinds(events_of(m), "detect")[0]
    assert "no heartbeat for" in str(det.get("reason")), det.data
    assert _rank1_exit(m) == -15  # alive until the teardown's SIGTERM


def test_gil_hold_pauses_the_rank_and_training_goes_on(results) -> None:
    m = results["restart/gil-hold"]
    # the held GIL ended by itself before any timeout: outlasted, not recovered
    assert m.outcome == "outlasted" and m.detected is False and m.restart_count == 0 and m.fidelity == "exact"
    reverts = [e for e in kinds(events_of(m), "fault_revert") if e.get("injector") == "gil-hold"]
    inject = next(e for e in kinds(events_of(m), "fault_inject") if e.get("injector") == "gil-hold")
    assert len(reverts) == 1 and 2.9 < (reverts[0].t_ns - inject.t_ns) / 1e9 < 4.5
    # every rank waited for the held one: rank 0's steps (incarnation 0) pause as long as the GIL was held (the
    # hold's revert - inject, less the one step rank 1 had begun); not extra_wall_s, the difference of two runs'
    # walls, which a busy machine moves by a second either way
    held = (reverts[0].t_ns - inject.t_ns) / 1e9
    stamps = [e.t_ns for e in kinds(events_of(m), "step", incarnation=0) if e.get("rank") == 0]
    pause = max(b - a for a, b in zip(stamps, stamps[1:], strict=False)) / 1e9
    assert held - 0.5 < pause < held + 1.0, (pause, held)


def test_oom_kill_in_a_memory_cgroup(results) -> None:
    found = memory_root()
    require("cgroup", found if isinstance(found, str) else None)
    m = results["restart/oom"]
    assert _rank1_exit(m) == -9  # the kernel's OOM killer
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact"
    lines = [str(e.get("line")) for e in kinds(events_of(m), "log") if "OOM killer" in str(e.get("line"))]
    assert lines and "ended 1 process(es)" in lines[0], lines


def test_sigterm_without_a_save_loses_the_steps_since_the_checkpoint(results) -> None:
    m = results["restart/sigterm"]
    assert _rank1_exit(m) == -15
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact"
    assert m.lost_steps == lost_steps_by_the_logs(m) and m.lost_steps >= 5
    assert kinds(events_of(m), "preempt_save") == []


def test_sigterm_with_save_on_sigterm_loses_nothing(saved) -> None:
    m = saved["restart/sigterm"]
    assert _rank1_exit(m) == -15  # the noticed rank still dies of it, after the save
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact"
    notes = kinds(events_of(m), "preempt_save")
    assert {e.get("rank") for e in notes} == {0, 1} and len({e.get("step") for e in notes}) == 1
    assert m.lost_steps == 0, m.lost_steps
