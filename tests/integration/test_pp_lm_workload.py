"""The pipeline-parallel LM workload through the runner: 2 nodes x 2 ranks = 2 stages x 2 replicas.

Under ``restart`` a killed stage-1 rank brings the job back from the per-stage checkpoints, bit-identical to the
fault-free control. Under ``torchrun-elastic`` losing node1 (stage 1 of both replicas) re-forms the job at world
size 2: one replica (dp 1), resumed from the checkpoint written by two, at half the global batch.
"""

from __future__ import annotations

import pytest

from chaosbench.timeline import Event
from tests.helpers import events_of, kinds, require_engines

pytestmark = pytest.mark.integration

MICROBATCHES = 2
MICROBATCH_SIZE = 2


def workload(extra: str) -> str:
    """A tiny model, so that four ranks on two busy cores take well under a second per step."""
    return (
        f"{{name: pp-lm, ranks: 4, nodes: 2, stages: 2, microbatches: {MICROBATCHES}, "
        f"microbatch_size: {MICROBATCH_SIZE}, d_model: 16, heads: 2, seq_len: 8, vocab: 32, layers: 2, "
        f"pg_timeout_s: 10, {extra}}}"
    )


def rank_starts(events: list[Event], incarnation: int) -> dict[int, Event]:
    return {
        int(e["rank"]): e for e in kinds(events, "rank_start") if int(e.get("incarnation", 0)) == incarnation
    }


def test_killed_stage_rank_recovers_exactly(run_suite) -> None:
    res = run_suite(f"""
    name: pp
    seed: 5
    defaults:
      deadline_s: 120
      workload: {workload("steps: 12, checkpoint_every: 5, step_sleep_s: 0.1")}
    frameworks:
      restart: {{heartbeat_timeout_s: 20}}
    faults:
      kill: {{injector: kill, target: 2, trigger: {{at_step: 7}}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 1}}
    """)
    ctl = res["restart/control#0"]
    assert ctl.outcome == "completed" and ctl.final_step == 12, ctl.verdict
    m = res["restart/kill#0"]
    assert m.outcome == "recovered" and m.restart_count == 1, (m.verdict, m.missing)
    assert m.fidelity == "exact", m.verdict
    ev = events_of(m)
    # pipeline is the outer dimension: rank = stage * dp + replica, so each replica spans both nodes
    starts = rank_starts(ev, 0)
    assert {r: (e["stage"], e["replica"], e["node"]) for r, e in starts.items()} == {
        0: (0, 0, "node0"),
        1: (0, 1, "node0"),
        2: (1, 0, "node1"),
        3: (1, 1, "node1"),
    }, starts
    assert {(e["dp"], e["global_batch"]) for e in starts.values()} == {
        (2, 2 * MICROBATCHES * MICROBATCH_SIZE)
    }
    # the restarted job loaded the step-5 checkpoint on every rank and went on from step 6
    loads = [e for e in kinds(ev, "ckpt_load_end") if int(e.get("incarnation", 0)) == 1]
    assert sorted((int(e["rank"]), int(e["step"])) for e in loads) == [(r, 5) for r in range(4)]
    steps_after = sorted({int(e["step"]) for e in kinds(ev, "step") if int(e.get("incarnation", 0)) == 1})
    assert steps_after == list(range(6, 13))
    # every training rank reports its replica's loss: the two stages of a replica report the same one
    for step in (6, 12):
        losses = {
            int(e["rank"]): e["loss"] for e in kinds(ev, "step", step=step) if e.get("incarnation") == 1
        }
        assert losses[0] == losses[2] and losses[1] == losses[3], losses


def test_node_loss_reforms_one_replica_at_half_the_batch(run_suite) -> None:
    # Elastic settings as in test_elastic.py (short rendezvous timeouts, no shared rendezvous store).
    m = run_suite(f"""
    name: ppel
    seed: 5
    defaults:
      deadline_s: 150
      workload: {workload("steps: 16, checkpoint_every: 5, step_sleep_s: 0.1")}
    frameworks:
      elastic: {{adapter: torchrun-elastic, last_call_timeout_s: 3, keep_alive_interval_s: 1,
                 keep_alive_max_attempt: 3, share_rdzv_tcp_store: false}}
    faults:
      lose-node1: {{injector: local-node-kill, target: {{node: node1}}, trigger: {{at_step: 8}}}}
    matrix: {{frameworks: [elastic], faults: [lose-node1], repeats: 1}}
    """)["elastic/lose-node1#0"]
    assert m.outcome == "recovered" and m.final_step == 16 and m.restart_count == 1, (m.verdict, m.missing)
    assert (m.world_size_before, m.world_size_after) == (4, 2)
    full = 2 * MICROBATCHES * MICROBATCH_SIZE
    assert (m.global_batch_before, m.global_batch_after) == (full, full // 2)
    # another global batch after the loss: another result than the control's, and the verdict says why
    assert m.fidelity == "diverged" and m.fidelity_reason, m.verdict
    ev = events_of(m)
    after = max(int(e.get("incarnation", 0)) for e in kinds(ev, "rank_start"))
    starts = rank_starts(ev, after)
    assert {r: (e["stage"], e["replica"], e["dp"], e["node"]) for r, e in starts.items()} == {
        0: (0, 0, 1, "node0"),
        1: (1, 0, 1, "node0"),
    }, starts
    # both stages of the one replica left loaded their part of the checkpoint written by two replicas
    loads = [e for e in kinds(ev, "ckpt_load_end") if int(e.get("incarnation", 0)) == after]
    assert sorted(int(e["rank"]) for e in loads) == [0, 1]
    assert len({int(e["step"]) for e in loads}) == 1 and int(loads[0]["step"]) in (5, 10)


FT_STEPS = 24


def test_torchft_heals_a_lost_pipeline_replica_exactly(run_suite) -> None:
    """Under TorchFT a replica group is one whole pipeline (its torchrun world: the 2 stages, group g on node
    g); each stage's gradients are summed with the same stage of the other group through the Manager. Killing
    stage 1 of group 1: group 0 trains on alone on the whole global batch, group 1's torchrun restarts both its
    stages, each heals from group 0's same stage, and the run ends bit-identical to the control."""
    require_engines("torchft")
    from chaosbench.registry import FRAMEWORKS

    if "torchft" not in FRAMEWORKS.names():
        FRAMEWORKS.register("torchft", "chaosbench.frameworks.torchft:TorchftFramework")
    res = run_suite(f"""
    name: ppft
    seed: 5
    defaults:
      deadline_s: 150
      workload: {workload(f"steps: {FT_STEPS}, step_sleep_s: 0.15")}
    frameworks:
      torchft: {{heartbeat_timeout_ms: 5000}}
    faults:
      kill-g1-stage1: {{injector: kill, target: {{rank: 3}}, trigger: {{at_step: 8, delay_s: 0.1}}}}
    matrix: {{frameworks: [torchft], faults: [kill-g1-stage1], repeats: 1}}
    """)
    ctl, m = res["torchft/control#0"], res["torchft/kill-g1-stage1#0"]
    assert ctl.outcome == "completed" and ctl.final_step == FT_STEPS and ctl.ranks_agree, ctl.verdict
    assert m.outcome == "recovered", (m.verdict, m.missing)
    ev = events_of(m)
    # rank = group * stages + stage: group 1 (ranks 2, 3) is node1's whole pipeline
    starts = rank_starts(ev, 0)
    assert {r: (e["stage"], e["replica"], e["node"]) for r, e in starts.items()} == {
        0: (0, 0, "node0"),
        1: (1, 0, "node0"),
        2: (0, 1, "node1"),
        3: (1, 1, "node1"),
    }, starts
    # group 1's torchrun restarted both its stages once (each attempt rendezvouses afresh), and each healed from
    # the same stage of group 0
    assert m.restart_count == 1, m.verdict
    healed = {int(e["rank"]) for e in kinds(ev, "heal_end") if int(e.get("incarnation", 0)) == 1}
    assert healed == {2, 3}, healed
    assert {int(e["rank"]) for e in kinds(ev, "heal_send")} == {0, 1}
    group0 = [int(e["step"]) for e in kinds(ev, "step", rank=0)]
    assert group0 == list(range(1, FT_STEPS + 1))  # no rollback on the survivor
    assert m.fidelity == "exact" and m.ranks_agree, m.verdict
