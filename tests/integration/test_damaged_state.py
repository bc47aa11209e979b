"""Damaged training state that loads without error, with real ranks (ddp-mlp on gloo under restart): the
optimizer's state zeroed or dropped, a rank's RNG rewound, the data position reset, a rank's shard from an
older checkpoint, and a checkpoint poisoned by an sdc right before its save."""

from __future__ import annotations

import pytest

from tests.helpers import events_of, kinds, run_suite_text

pytestmark = pytest.mark.integration

SUITE = """
name: damaged-state
seed: 31
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.05, pg_timeout_s: 10,
             load_fallback: true}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 10}
faults:
  zero-opt: {use: damaged-state}
  drop-opt: {use: damaged-state, params: {mode: drop-optimizer}}
  rewind-rng: {use: damaged-state, params: {mode: rewind-rng}}
  reset-data: {use: damaged-state, params: {mode: reset-data-position}}
  mixed: {use: damaged-state, params: {mode: mixed-step}}
  poisoned: {use: poisoned-checkpoint}
matrix: {frameworks: [restart], faults: [zero-opt, drop-opt, rewind-rng, reset-data, mixed, poisoned]}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_suite_text(SUITE, tmp_path_factory.mktemp("damaged"), "tests/integration/damaged.yaml")


def _restored(m) -> list[int]:
    return sorted({int(e.get("step")) for e in kinds(events_of(m), "ckpt_load_end")})


@pytest.mark.parametrize("fault", ["zero-opt", "rewind-rng"])
def test_damaged_state_loads_silently_and_the_model_diverges(results, fault: str) -> None:
    m = results[f"restart/{fault}"]
    assert m.outcome == "recovered" and m.restart_count == 1, (fault, m.verdict, m.missing)
    assert _restored(m) == [20] and m.checkpoint_outcome == "loaded_silently", (fault, m.verdict)
    assert m.fidelity == "diverged", (fault, m.verdict)


def test_dropped_optimizer_state_is_refused_and_an_older_checkpoint_used(results) -> None:
    m = results["restart/drop-opt"]
    failed = kinds(events_of(m), "ckpt_load_failed")
    assert failed and failed[0].get("step") == 20 and "momentum_buffer" in str(failed[0].get("error")), (
        m.verdict
    )
    assert m.checkpoint_outcome == "fell_back" and _restored(m) == [10] and m.fidelity == "exact", m.verdict


def test_mixed_step_checkpoint_is_caught_by_the_programs_step_check(results) -> None:
    # DCP wrote the replicated progress entry from rank 1's shard: the swapped shard says step 10, and the
    # program refuses a checkpoint that holds another step than its name
    m = results["restart/mixed"]
    failed = kinds(events_of(m), "ckpt_load_failed")
    assert failed and "holds step 10, not 20" in str(failed[0].get("error")), [e.data for e in failed]
    assert m.checkpoint_outcome == "fell_back" and _restored(m) == [10] and m.fidelity == "exact", m.verdict


def test_reset_data_position_trains_from_the_start_again(results) -> None:
    m = results["restart/reset-data"]
    loads = kinds(events_of(m), "ckpt_load_end")
    assert [e.get("step") for e in loads][:1] == [20] and m.checkpoint_outcome == "loaded_silently"
    # the program resumes at its data position: step 1 again, with the model of step 20
    resumed = [e for e in kinds(events_of(m), "step") if e.get("incarnation") == 1]
    assert resumed and min(int(e.get("step")) for e in resumed) == 1, m.verdict
    assert m.fidelity == "diverged", m.verdict


def test_poisoned_checkpoint_crash_loops_under_the_loss_guard(results) -> None:
    m = results["restart/poisoned"]
    fired = kinds(events_of(m), "fault_inject")
    assert fired[0].get("checkpoint_step") == 20 and fired[0].get("where") == "save"
    # the guard fails rank 0 at step 21; every restart loads the poisoned step-20 checkpoint and fails again
    assert m.detected and m.detected_via == "loss guard", m.verdict
    assert m.crash_loop and m.checkpoint_outcome == "loaded_silently" and m.outcome == "not_recovered", (
        m.verdict
    )
