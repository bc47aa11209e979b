"""The slurm runtime, the slurm-requeue framework, slurm-node-down and clock offsets, against a real cluster.

Skipped when no Slurm cluster answers (``sinfo`` fails), unless ``CHAOSBENCH_REQUIRE`` names slurm: then
failed with the reason. ``scripts/slurm-local up`` starts a local cluster of three nodes (n1-n3) on this host.
Real ranks (ddp-mlp, 2 ranks on 2 Slurm nodes), real jobs, real requeues; numbers asserted with tolerances
that hold on a loaded 2-core machine.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.results import collect
from chaosbench.runner import Runner
from chaosbench.specs import load_yaml_text, suite_from_data
from chaosbench.timeline import Event
from tests.helpers import events_of as _events
from tests.helpers import require, slurm_problem

pytestmark = pytest.mark.integration


_PROBLEM = slurm_problem()
require(
    "slurm",
    None if _PROBLEM is None else f"no cluster answers: {_PROBLEM} (start one with scripts/slurm-local up)",
)


WORKLOAD = (
    "{name: ddp-mlp, ranks: 2, nodes: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.02, "
    "pg_timeout_s: 5}"
)
KILL = "{injector: kill, target: {rank: 1}, trigger: {at_step: 15}}"
NODE_DOWN = "{injector: slurm-node-down, target: {node: node1}, trigger: {at_step: 15}}"


def _run(
    out: Path, frameworks: str, faults: str, fw: str, fault: str, control: bool
) -> dict[str, RunMetrics]:
    text = f"""
    name: slurm
    seed: 11
    control: {str(control).lower()}
    defaults:
      runtime: slurm
      deadline_s: 120
      workload: {WORKLOAD}
    frameworks: {frameworks}
    faults: {faults}
    matrix: {{frameworks: [{fw}], faults: [{fault}], repeats: 1}}
    """
    data, smap = load_yaml_text(textwrap.dedent(text), "test_slurm.yaml")
    runner = Runner(suite_from_data(data, smap), out)
    for rec in runner.run():
        assert rec.leftovers == [], f"{rec.scenario.id}: jobs or processes left: {rec.leftovers}"
    return {f"{m.scenario}#{m.repeat}": m for m in collect(runner.suite_dir, write=True)}


def _kinds(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


@pytest.fixture(scope="module")
def restart_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunMetrics]:
    """The restart framework's control and kill runs (the control's digest is the reference for all tests)."""
    return _run(
        tmp_path_factory.mktemp("slurm-restart"),
        "{restart: {heartbeat_timeout_s: 10}}",
        f"{{kill: {KILL}}}",
        "restart",
        "kill",
        control=True,
    )


def test_kill_under_restart_on_two_slurm_nodes(restart_runs: dict[str, RunMetrics]) -> None:
    ctl, m = restart_runs["restart/control#0"], restart_runs["restart/kill#0"]
    assert ctl.outcome == "completed" and ctl.final_step == 30
    assert m.outcome == "recovered", m.missing
    assert m.fidelity == "exact" and m.digest == ctl.digest
    assert m.restart_count == 1 and m.lost_steps is not None and 0 <= m.lost_steps <= 10
    # detection = the srun of the killed rank exiting, seen by the harness: well under a second
    assert m.detected and m.time_to_detect_s is not None and 0 <= m.time_to_detect_s < 2.0, m.time_to_detect_s
    ev = _events(m)
    # every rank ran as its own job on its own Slurm node
    starts = [e for e in _kinds(ev, "proc_start") if e.get("incarnation") == 0]
    assert len({e.get("slurm_node") for e in starts}) == 2
    killed = next(e for e in _kinds(ev, "proc_exit") if e.get("proc") == "rank1.i0")
    assert killed.get("returncode") == -9 and killed.get("job_id")
    # the signal went through a job step on the rank's node: its delivery lag after fault_inject is measured
    fault, sent = _kinds(ev, "fault_inject")[0], _kinds(ev, "signal_sent")[0]
    assert sent.get("stamp") == "node" and sent.get("slurm_node") == killed.get("slurm_node")
    assert 0 < (sent.t_ns - fault.t_ns) / 1e9 < 2.0
    # the fault took effect when the node delivered the signal (its own clock, corrected): metrics start there
    assert fault.get("effect_t_ns") == sent.t_ns and "delivered" in str(fault.get("effect"))
    assert m.injection_latency_s == pytest.approx((sent.t_ns - fault.t_ns) / 1e9)
    assert m.trigger_step == 15 and m.fault_step is not None and m.fault_step >= m.trigger_step
    assert m.blame == "correct" and m.restarts_claimed == 1


def test_clock_offsets_recorded_with_bound(restart_runs: dict[str, RunMetrics]) -> None:
    from chaosbench.timeline import clocks

    ev = _events(restart_runs["restart/kill#0"])
    offs = [e for e in _kinds(ev, "clock_offset") if e.get("offset_ns") is not None]
    assert {e.get("slurm_node") for e in offs} == {e.get("slurm_node") for e in _kinds(ev, "node_map")}
    for e in offs:
        # all nodes of the local cluster share this host's clock: the true offset (0) lies within the bound
        assert abs(e["offset_ns"]) <= e["bound_ns"], e.data
        assert 0 < e["bound_ns"] < 50_000_000 and e["samples"] >= 1 and e.get("node_host")
    bound = clocks.offset_bound_s(ev)
    assert bound is not None and bound < 0.05
    # one host: nothing to correct, and correction leaves the timeline as it is
    assert clocks.host_offsets(ev) == {} and clocks.uncorrected_hosts(ev) == []
    assert [e.t_ns for e in clocks.correct(ev)] == [e.t_ns for e in ev]


def test_kill_under_torchrun_on_slurm(tmp_path: Path, restart_runs: dict[str, RunMetrics]) -> None:
    res = _run(
        tmp_path,
        "{torchrun: {share_rdzv_tcp_store: false}}",
        f"{{kill: {KILL}}}",
        "torchrun",
        "kill",
        control=False,
    )
    m = res["torchrun/kill#0"]
    assert m.outcome == "recovered", m.missing
    assert m.detected and m.time_to_detect_s is not None and m.time_to_detect_s < 3.0
    # the same final parameters as the fault-free control (fidelity exact)
    assert m.digest == restart_runs["restart/control#0"].digest
    agents = [e for e in _kinds(_events(m), "proc_start") if e.get("role") == "agent"]
    assert len(agents) == 2 and len({e.get("slurm_node") for e in agents}) == 2


def test_kill_under_slurm_requeue(tmp_path: Path, restart_runs: dict[str, RunMetrics]) -> None:
    from chaosbench.frameworks.slurm_requeue import scheduler_delays

    res = _run(
        tmp_path,
        "{slurm-requeue: {max_restarts: 2}}",
        f"{{kill: {KILL}}}",
        "slurm-requeue",
        "kill",
        control=False,
    )
    m = res["slurm-requeue/kill#0"]
    assert m.outcome == "recovered", m.missing
    assert m.digest == restart_runs["restart/control#0"].digest
    assert m.restart_count == 1 and m.lost_steps is not None and m.lost_steps <= 10
    ev = _events(m)
    det, rst = _kinds(ev, "detect"), _kinds(ev, "restart")
    assert det and det[0].get("by") == "harness" and "scheduler state" in det[0]["reason"]
    assert len(rst) == 1 and rst[0].get("action") == "scontrol requeue"
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 5.0
    states = [(e.get("state"), e.get("restarts")) for e in _kinds(ev, "sched_state")]
    assert ("running", 0) in states and ("queued", 1) in states and ("running", 1) in states
    hold = m.timeouts["scheduler_requeue_hold_s"]
    (delay,) = scheduler_delays(ev)
    # the scheduler's share: at least its requeue hold (cred_expire), then a scheduling pass
    assert delay["scheduler_s"] is not None and hold <= delay["scheduler_s"] < hold + 30, delay
    # the workload's share: batch script, srun, Python and torch start-up, rendezvous, restore
    assert delay["workload_s"] is not None and 0 < delay["workload_s"] < 60, delay
    assert m.time_to_resume_s == pytest.approx(
        (rst[0].t_ns - _kinds(ev, "fault_inject")[0].t_ns) / 1e9 + delay["scheduler_s"] + delay["workload_s"],
        abs=0.5,
    )


def test_node_down_requeued_by_the_scheduler(tmp_path: Path, restart_runs: dict[str, RunMetrics]) -> None:
    from chaosbench.runtimes.slurm import NodeState, node_state

    # the earlier tests' jobs may still be completing on their nodes: wait for the three to be idle again
    deadline, idle = time.monotonic() + 60, set()
    while len(idle) < 3 and time.monotonic() < deadline:
        res = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True)
        idle = set(res.stdout.split())
        time.sleep(0 if len(idle) >= 3 else 1)
    problem = f"needs a third idle Slurm node for the requeued job (idle: {sorted(idle)})"
    require("slurm", None if len(idle) >= 3 else problem)
    res = _run(
        tmp_path,
        "{slurm-requeue: {max_restarts: 2}}",
        f"{{down: {NODE_DOWN}}}",
        "slurm-requeue",
        "down",
        control=False,
    )
    m = res["slurm-requeue/down#0"]
    assert m.outcome == "recovered", m.missing
    assert m.digest == restart_runs["restart/control#0"].digest
    ev = _events(m)
    fault = _kinds(ev, "fault_inject")[0]
    (downed,) = fault["details"]["slurm_nodes"]
    assert node_state(fault["details"]["after"][downed]) is NodeState.DOWN
    # the scheduler requeued the job by itself (node failure, --requeue): nobody ran scontrol requeue
    det, rst = _kinds(ev, "detect"), _kinds(ev, "restart")
    assert det[0].get("by") == "scheduler" and rst[0].get("by") == "scheduler"
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 2.0
    rerun = next(
        e for e in _kinds(ev, "sched_state") if e.get("state") == "running" and e.get("restarts") == 1
    )
    assert downed not in rerun["slurm_nodes"]
    # reverted at the end of the run: the node is back
    assert _kinds(ev, "fault_revert")[0].get("undone") is True
    # (resumed, it shows not responding, idle*, until slurmd's next registration)
    deadline = time.monotonic() + 60
    while True:
        state = subprocess.run(
            ["sinfo", "-h", "-n", downed, "-o", "%T"], capture_output=True, text=True
        ).stdout
        if node_state(state.strip()) in (NodeState.UP, NodeState.BUSY) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert node_state(state.strip()) in (NodeState.UP, NodeState.BUSY), state


def test_concurrent_runs_on_nodes_of_their_own(tmp_path: Path) -> None:
    """``--jobs 2`` on the cluster: every run done once, outcomes as a sequential run has them, and two runs
    that overlap in time never share a Slurm node (each slot excludes the other's nodes)."""
    text = f"""
    name: slurm-jobs
    seed: 12
    defaults:
      runtime: slurm
      deadline_s: 120
      workload: {{name: ddp-mlp, ranks: 2, nodes: 1, steps: 30, checkpoint_every: 10, step_sleep_s: 0.03}}
    frameworks: {{restart: {{heartbeat_timeout_s: 10}}}}
    faults: {{kill: {KILL}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 2}}
    """
    data, smap = load_yaml_text(textwrap.dedent(text), "test_slurm.yaml")
    runner = Runner(suite_from_data(data, smap), tmp_path)
    records = runner.run(jobs=2)
    assert [(r.scenario.id, r.scenario.repeat) for r in records] == [
        ("restart/control", 0),
        ("restart/kill", 0),
        ("restart/kill", 1),
    ]
    for rec in records:
        assert rec.leftovers == [], f"{rec.scenario.id}: jobs or processes left: {rec.leftovers}"
    metrics = {f"{m.scenario}#{m.repeat}": m for m in collect(runner.suite_dir, write=False)}
    assert metrics["restart/control#0"].outcome == "completed"
    spans, nodes = {}, {}
    for key in ("restart/kill#0", "restart/kill#1"):
        m = metrics[key]
        assert m.outcome == "recovered" and m.fidelity == "exact", (key, m.verdict)
        ev = _events(m)
        spans[key] = (_kinds(ev, "run_start")[0].t_ns, _kinds(ev, "run_end")[0].t_ns)
        nodes[key] = {e["slurm_node"] for e in _kinds(ev, "node_map")}
        assert nodes[key]
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, "the two fault runs did not run at the same time"
    assert not (nodes["restart/kill#0"] & nodes["restart/kill#1"]), nodes
