"""Collective hangs in live processes with real ranks (ddp-mlp on gloo): a rank blocked before its collective (for
good, or for a while), one that skips a gradient allreduce, and one that calls it with another shape or op;
under restart (its step watchdog) and torchrun (the peer's process-group timeout)."""

from __future__ import annotations

import pytest

from tests.helpers import events_of, kinds, run_suite_text
from tests.helpers.truth import lost_steps_by_the_logs

pytestmark = pytest.mark.integration

SUITE = """
name: collective-faults
seed: 13
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.01, pg_timeout_s: 5}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 3}
  torchrun: {max_restarts: 2, share_rdzv_tcp_store: false}
faults:
  block: {injector: collective-hang, target: 1, params: {at_step: 15}}
  block-2s: {injector: collective-hang, target: 1, params: {at_step: 15, duration_s: 2}}
  skip: {injector: collective-hang, target: 1, params: {at_step: 15, mode: skip}}
  shape: {injector: collective-hang, target: 1, params: {at_step: 15, mode: mismatch, mismatch: shape}}
  op: {injector: collective-hang, target: 1, params: {at_step: 15, mode: mismatch, mismatch: op}}
matrix:
  frameworks: [FRAMEWORKS]
  faults: [FAULTS]
  repeats: 1
"""


def _run(tmp_path_factory, name: str, frameworks: list[str], faults: list[str]) -> dict:
    text = SUITE.replace("FRAMEWORKS", ", ".join(frameworks)).replace("FAULTS", ", ".join(faults))
    return run_suite_text(text, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="module")
def restart(tmp_path_factory):
    return _run(tmp_path_factory, "collective", ["restart"], ["block", "block-2s", "skip", "shape", "op"])


@pytest.fixture(scope="module")
def timeouts(tmp_path_factory):
    return _run(tmp_path_factory, "collective-pg", ["torchrun"], ["block"])


def _rank1_exits(m) -> list[int | None]:
    return [
        e.get("returncode")
        for e in kinds(events_of(m), "proc_exit", incarnation=0)
        if str(e.get("proc")).startswith("rank1")
    ]


def test_blocked_rank_is_alive_and_the_step_watchdog_finds_it(restart) -> None:
    m = restart["restart/block"]
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact", m.verdict
    assert m.detected_via == "step watchdog" and "detected by step watchdog" in (m.verdict or "")
    assert m.time_to_detect_s is not None and 2.5 < m.time_to_detect_s < 5, m.time_to_detect_s
    assert _rank1_exits(m) == [-15]  # alive (blocked, not frozen) until the teardown's SIGTERM
    fired = kinds(events_of(m), "fault_inject")
    assert len(fired) == 1 and fired[0].get("mode") == "block" and fired[0].get("step") == 15


def test_a_short_block_passes_unnoticed(restart) -> None:
    m = restart["restart/block-2s"]
    assert m.outcome == "outlasted" and not m.detected and m.restart_count == 0 and m.fidelity == "exact"
    reverts = [e for e in kinds(events_of(m), "fault_revert") if e.get("injector") == "collective-hang"]
    inject = kinds(events_of(m), "fault_inject")[0]
    assert len(reverts) == 1 and 1.9 < (reverts[0].t_ns - inject.t_ns) / 1e9 < 3.5


def test_skip_desynchronises_the_group_until_it_hangs(restart) -> None:
    m = restart["restart/skip"]
    assert kinds(events_of(m), "fault_inject")[0].get("desync") == "skip"
    # rank 1's later allreduces pair with rank 0's of the step before, until the checkpoint's collectives meet
    # a gradient allreduce: both wait, alive; the step watchdog sees it, and cannot tell who started it
    assert m.detected and m.detected_via == "step watchdog" and m.outcome == "recovered", m.verdict
    assert (
        m.fault_count == 1 and m.restart_count == 1 and m.fidelity == "exact"
    )  # back to the step-10 checkpoint
    assert m.lost_steps == lost_steps_by_the_logs(m) and m.lost_steps >= 5, m.lost_steps


def test_shape_mismatch_is_caught_by_gloo_size_check(restart) -> None:
    m = restart["restart/shape"]
    assert _rank1_exits(m) == [-6]  # gloo::EnforceNotMet: "Received data size doesn't match expected size"
    assert m.detected and m.detected_via == "collective mismatch check" and m.outcome == "recovered", (
        m.verdict
    )
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 2 and m.fidelity == "exact"
    mismatch = [e for e in kinds(events_of(m), "rank_error") if e.get("signature") == "collective_mismatch"]
    assert [e.get("rank") for e in mismatch] == [1], [e.data for e in mismatch]


def test_op_mismatch_is_silent_and_wrong(restart) -> None:
    m = restart["restart/op"]
    assert kinds(events_of(m), "fault_inject")[0].get("desync") == "op"
    # nothing notices: the step's gradients are a mix of sums and maxima, and the run ends with another model
    assert m.outcome == "outlasted" and not m.detected and m.restart_count == 0, m.verdict
    assert m.fidelity == "diverged" and "final state diverged" in (m.verdict or "")


def test_torchrun_sees_a_blocked_rank_only_by_its_peers_timeout(timeouts) -> None:
    m = timeouts["torchrun/block"]
    assert m.detected and m.outcome == "recovered" and m.fidelity == "exact", m.verdict
    assert m.detected_via == "process-group timeout", (m.detected_via, m.verdict)
    # the one whose timeout fired exits first and is blamed: the survivor, never the blocked rank
    assert (m.blame, m.blamed) == ("wrong", "rank 0"), m.verdict
    # the peer's 5 s timeout, then its exit noticed
    assert m.time_to_detect_s is not None and 4.5 < m.time_to_detect_s < 9, m.time_to_detect_s
    errors = [e for e in kinds(events_of(m), "rank_error") if e.get("signature") == "collective_timeout"]
    assert errors and errors[0].get("rank") == 0, [e.data for e in errors]  # the peer, not the blocked rank
