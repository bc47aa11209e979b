"""``torchrun-elastic`` on the local runtime: 2 agents with ``--nnodes 1:2``, a node lost, a spare joining.

Losing a node is ``local-node-kill`` (node1's agent and its worker frozen and SIGKILLed together). The survivor
re-rendezvouses and goes on at world size 1 from the newest checkpoint; a spare node joining later makes it
restart at world size 2. Each change of world size changes the global batch (world size x per-rank batch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosbench.timeline import Event, read_events
from tests.helpers.truth import lost_steps_by_the_logs

pytestmark = pytest.mark.integration

BATCH = 32


def suite(steps: int, spares: int) -> str:
    # Short rendezvous timeouts keep the test fast; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 because with torch's
    # shared store a node joining a running job deadlocks the next rendezvous (docs: see the adapter's notes).
    return f"""
    name: el
    seed: 5
    control: false
    defaults:
      deadline_s: 150
      workload: {{name: ddp-mlp, ranks: 2, nodes: 2, steps: {steps}, checkpoint_every: 5, step_sleep_s: 0.1,
                  batch_size: {BATCH}, pg_timeout_s: 10}}
    frameworks:
      elastic: {{adapter: torchrun-elastic, last_call_timeout_s: 3, keep_alive_interval_s: 1,
                 keep_alive_max_attempt: 3, share_rdzv_tcp_store: false, spares: {spares}, spare_delay_s: 10}}
    faults:
      lose-node1: {{injector: local-node-kill, target: {{node: node1}}, trigger: {{at_step: 12}}}}
    matrix: {{frameworks: [elastic], faults: [lose-node1], repeats: 1}}
    """


def world_sizes(events: list[Event]) -> list[tuple[int, int, set[str]]]:
    """(incarnation, world size, nodes) of every incarnation that started, in order."""
    out: dict[int, tuple[int, set[str]]] = {}
    for e in events:
        if e.kind == "rank_start":
            inc = int(e.get("incarnation", 0))
            ws, nodes = out.get(inc, (int(e["world_size"]), set()))
            nodes.add(str(e.get("node")))
            out[inc] = (ws, nodes)
    return [(inc, ws, nodes) for inc, (ws, nodes) in sorted(out.items())]


def _run(run_suite, steps: int, spares: int):  # type: ignore[no-untyped-def]
    m = run_suite(suite(steps, spares))["elastic/lose-node1#0"]
    assert m.run_dir is not None
    ev = read_events(Path(m.run_dir) / "events.jsonl")
    fault = next(e for e in ev if e.kind == "fault_inject")
    assert fault.get("details", {}).get("nodes") == ["node1"]
    # the survivor's agent reacts when its worker has died of the reset connection: ~0.8 s on a quiet machine,
    # up to ~3 s when the 2 cores are busy (the dying worker's interpreter teardown)
    assert m.detected and 0 <= m.time_to_detect_s < 6.0, m.time_to_detect_s
    assert m.timeouts["rdzv_last_call_timeout_s"] == 3 and m.timeouts["rdzv_dead_node_timeout_s"] == 3
    # the survivor's agent restarted its worker group, rendezvoused alone and resumed from the checkpoint
    assert 3.0 < m.time_to_resume_s < 30.0, m.time_to_resume_s
    assert m.lost_steps == lost_steps_by_the_logs(m)
    rdzv = [int(e["world_size"]) for e in ev if e.kind == "rendezvous" and e.t_ns > fault.t_ns]
    assert rdzv and rdzv[0] == 1
    return m, ev


def test_node_loss_shrinks_the_world_and_training_goes_on(run_suite) -> None:
    m, ev = _run(run_suite, steps=40, spares=0)
    incs = world_sizes(ev)
    assert [(ws, nodes) for _, ws, nodes in incs] == [(2, {"node0", "node1"}), (1, {"node0"})], incs
    starts = {int(e.get("incarnation", 0)): e for e in ev if e.kind == "rank_start" and e.get("rank") == 0}
    # global batch before/after: world size x per-rank batch (reported by the workload where it can)
    assert [int(starts[i].get("global_batch") or ws * BATCH) for i, ws, _ in incs] == [2 * BATCH, BATCH]
    assert m.outcome == "recovered" and m.final_step == 40 and m.restart_count == 1


def test_spare_node_grows_the_world_back(run_suite) -> None:
    m, ev = _run(run_suite, steps=100, spares=1)
    incs = world_sizes(ev)
    assert [(ws, nodes) for _, ws, nodes in incs] == [
        (2, {"node0", "node1"}),
        (1, {"node0"}),
        (2, {"node0", "node2"}),
    ], incs
    starts = {int(e.get("incarnation", 0)): e for e in ev if e.kind == "rank_start" and e.get("rank") == 0}
    assert [int(starts[i]["global_batch"]) for i, _, _ in incs] == [2 * BATCH, BATCH, 2 * BATCH]
    # growth is a membership change: the agents restart the worker group (not counted against max_restarts)
    assert any(e.kind == "restart" and e.get("waiting_nodes") == 1 for e in ev)
    grown = incs[-1][0]
    loads = [e for e in ev if e.kind == "ckpt_load_end" and e.get("incarnation") == grown]
    assert {int(e["rank"]) for e in loads} == {0, 1}  # rank 1 loaded a checkpoint written by 1 rank
    assert m.outcome == "recovered" and m.final_step == 100 and m.restart_count == 2 and m.ranks_agree
