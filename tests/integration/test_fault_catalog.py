"""Stragglers, crash loops and silent data corruption with real ranks, measured from the timeline."""

from __future__ import annotations

import pytest

from chaosbench.injectors.straggler import cgroup_v1_cpu_available
from tests.helpers import events_of, kinds, require

pytestmark = pytest.mark.integration

SUITE = """
name: catalog
seed: 4
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 40, checkpoint_every: 10, step_sleep_s: 0.01, pg_timeout_s: 10}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 8}
faults:
  slow-cgroup: {injector: straggler, target: 1, trigger: {at_step: 8},
                params: {cpu_fraction: 0.05, duration_s: 3, method: cgroup}}
  slow-duty: {injector: straggler, target: 1, trigger: {at_step: 8},
              params: {cpu_fraction: 0.1, duration_s: 3, method: duty-cycle}}
  crash: {injector: crash-loop, target: 1, params: {at_step: 14}}
  sdc-nan: {injector: sdc, target: 1, params: {at_step: 14, kind: nan, where: grad, loss_check: true}}
  sdc-scale: {injector: sdc, target: 1, params: {at_step: 14, kind: scale, where: param, scale: 3.0}}
matrix:
  frameworks: [restart]
  faults: [FAULTS]
  repeats: 1
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from chaosbench.analysis.results import collect
    from chaosbench.runner import Runner
    from tests.conftest import make_suite

    faults = ["slow-duty", "crash", "sdc-nan", "sdc-scale"]
    if cgroup_v1_cpu_available():
        faults.insert(0, "slow-cgroup")
    suite = make_suite(SUITE.replace("FAULTS", ", ".join(faults)))
    runner = Runner(suite, tmp_path_factory.mktemp("catalog"))
    for rec in runner.run():
        assert rec.leftovers == []
    return {m.scenario: m for m in collect(runner.suite_dir)}


@pytest.mark.parametrize("fault", ["slow-cgroup", "slow-duty"])
def test_straggler_gates_the_whole_job(results, fault) -> None:
    if fault == "slow-cgroup" and not cgroup_v1_cpu_available():
        require("cgroup", "the cgroup v1 cpu controller is not writable here")
    m, ctl = results[f"restart/{fault}"], results["restart/control"]
    # nothing reacts to a slow rank: the job outlasted it (its cost is the slowdown, not a recovery)
    assert m.outcome == "outlasted" and m.fidelity == "exact"
    # every step of both ranks waits for the slow one: the job's step time grows several times
    assert m.slowdown is not None and m.slowdown > 2.5, (m.fault_step_time_s, ctl.step_time_s)
    assert m.detected is False  # the restart framework's heartbeat (8 s) does not notice a slow rank
    # and the job lost over a second of its 3 s window: the steps rank 0 logged in it (fault_inject to
    # fault_revert) would take the control a fraction of it (not extra_wall_s, the difference of two runs' walls,
    # which a busy machine moves by a second either way)
    ev = events_of(m)
    t0 = kinds(ev, "fault_inject")[0].t_ns
    t1 = kinds(ev, "fault_revert")[0].t_ns
    steps = [e for e in kinds(ev, "step", rank=0) if t0 <= e.t_ns <= t1]
    assert ctl.step_time_s is not None and (t1 - t0) / 1e9 - len(steps) * ctl.step_time_s > 1.0, (
        len(steps),
        t1 - t0,
    )


def test_crash_loop_stops_at_retry_limit(results) -> None:
    m = results["restart/crash"]
    assert m.outcome == "not_recovered"
    assert m.crash_loop and m.failure_class == "deterministic"
    assert m.gave_up and m.restart_count == 2
    assert m.fault_count == 3  # the planted bug fired in each of the 3 incarnations
    assert m.time_burned_s is not None and m.time_burned_s > 3


def test_sdc_nan_caught_by_loss_check_and_recovered(results) -> None:
    m = results["restart/sdc-nan"]
    assert m.detected and m.detected_by == "loss-check"
    assert m.outcome == "recovered" and m.failure_class == "transient"
    assert m.fidelity == "exact" and m.ranks_agree  # recomputed from the step-10 checkpoint without the fault


def test_sdc_scaled_params_propagate_silently(results) -> None:
    m = results["restart/sdc-scale"]
    assert m.detected is False and m.restart_count == 0
    assert m.outcome == "outlasted"  # nothing noticed: training "finished", nothing reacted
    assert m.fidelity == "diverged"
    assert m.ranks_agree is False  # rank 1's replica no longer matches rank 0's
