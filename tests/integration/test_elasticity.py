"""The elasticity suite in small (CI) size: a lost docker node under three recovery strategies, through the CLI.

pp-lm on 4 docker nodes, 1 rank each (2 stages x 2 replicas, pp outer: node1 holds stage 0 of replica 1), node1
killed after step 15 of 30 (checkpoints every 5):

- hot-spare: the ``restart`` framework; a spare container takes node1's name and address (``lost_node: spare``)
  and the whole job restarts at the same world size;
- shrink: ``torchrun-elastic`` with no spare (``lost_node: none``): the 3 agents left re-form the job at world
  size 3, pp-lm runs one pipeline replica (its 3rd rank idle) from the stage checkpoints, global batch halved;
- continue: TorchFT (ft-mlp, 4 replica groups): the other groups go on without committing the lost group's step
  and do not roll back; the group rejoins and heals when its node is back (``lost_node: reboot``).

The full suite (suites/elasticity.yaml: 8 nodes, fsdp-lm too, restart in place, 3 repeats, controls) is run by
hand; its wall time is in docs/frameworks.md ("Elasticity").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from docker_support import events_of, kinds, require_docker, run_objects

from chaosbench.analysis.metrics import RunMetrics
from tests.helpers import require_engines
from tests.helpers.truth import lost_steps_by_the_logs

require_docker()
require_engines("torchft")  # the continue strategy

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "chaosbench.cli"]

SUITE = """
name: el
seed: 29
control: false
defaults:
  runtime: docker
  runtime_options: {cpus_per_node: 1.0, memory_per_node: 2g, lost_node: reboot, reboot_delay_s: 3}
  deadline_s: 150
  workload: {name: pp-lm, ranks: 4, nodes: 4, steps: 30, checkpoint_every: 5, step_sleep_s: 0.02,
             pg_timeout_s: 10, microbatches: 2}
frameworks:
  hot-spare: {adapter: restart, strategy: hot-spare, heartbeat_timeout_s: 20,
              runtime_options: {spare_nodes: 1, lost_node: spare}}
  shrink: {adapter: torchrun-elastic, strategy: shrink, min_nodes: 2, max_restarts: 3, share_rdzv_tcp_store: false,
           last_call_timeout_s: 3, keep_alive_interval_s: 1, keep_alive_max_attempt: 3,
           runtime_options: {lost_node: none}}
  continue: {adapter: torchft, strategy: continue, workload: {name: ft-mlp, steps: 30, step_sleep_s: 0.05,
                                                              pg_timeout_s: 10}}
faults:
  lose-node1: {injector: node-kill, target: {node: node1}, trigger: {at_step: 15}}
matrix: {frameworks: [hot-spare, shrink, continue], faults: [lose-node1], repeats: 1}
"""

STAGES = ("stage_detect_s", "stage_reschedule_s", "stage_reshard_or_replace_s", "stage_resume_s")


@pytest.fixture(scope="module")
def elasticity(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, RunMetrics], Path]:
    tmp = tmp_path_factory.mktemp("el")
    (tmp / "el.yaml").write_text(SUITE)
    res = subprocess.run(
        [*CLI, "run", str(tmp / "el.yaml"), "--out", str(tmp / "out")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    suite_dir = tmp / "out" / "el"
    runs = {}
    for f in suite_dir.glob("*/0/metrics.json"):
        m = RunMetrics.from_dict(json.loads(f.read_text()))
        runs[str(m.framework)] = m
    return runs, suite_dir


def _stages_add_up(m: RunMetrics) -> None:
    stages = [getattr(m, k) for k in STAGES]
    assert all(s is not None and s >= 0 for s in stages), (m.framework, stages, m.missing)
    assert m.time_to_recover_s is not None
    assert sum(stages) == pytest.approx(m.time_to_recover_s, abs=1e-6), (m.framework, stages)


def test_hot_spare_takes_the_lost_nodes_place(elasticity) -> None:  # type: ignore[no-untyped-def]
    runs, _ = elasticity
    m = runs["hot-spare"]
    assert m.outcome == "recovered" and m.strategy == "hot-spare" and m.workload == "pp-lm"
    ev = events_of(m)
    takeover = [e for e in kinds(ev, "node_start") if e.get("spare") and e.get("reason") != "provision"]
    assert len(takeover) == 1 and str(takeover[0].get("container")).endswith("-spare0"), takeover
    assert not kinds(ev, "node_start", reason="reboot")
    # same world, same batch; pp-lm's placement: rank = stage * dp + replica
    assert (m.world_size_before, m.world_size_after) == (4, 4)
    assert m.global_batch_before == m.global_batch_after == 2 * 2 * 2  # dp x micro-batches x micro-batch size
    starts = {int(e["rank"]): (e.get("stage"), e.get("replica")) for e in kinds(ev, "rank_start")}
    assert starts == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, starts
    _stages_add_up(m)
    # the runtime's share: node1's container died -> the spare took over (well under the reboot path's 3 s delay)
    assert m.stage_reschedule_runtime_s is not None and 0 < m.stage_reschedule_runtime_s < 3
    assert m.lost_steps == lost_steps_by_the_logs(m)


def test_shrink_reforms_on_fewer_nodes_with_one_pipeline_replica(elasticity) -> None:  # type: ignore[no-untyped-def]
    runs, _ = elasticity
    m = runs["shrink"]
    assert m.outcome == "recovered" and m.strategy == "shrink" and m.final_step == 30
    assert (m.world_size_before, m.world_size_after) == (4, 3)
    assert (m.global_batch_before, m.global_batch_after) == (8, 4)  # one pipeline replica fewer
    ev = events_of(m)
    assert not kinds(ev, "node_start", reason="reboot") and not kinds(ev, "node_start", reason="spare")
    _stages_add_up(m)
    assert (
        m.stage_reshard_or_replace_s is not None and m.stage_reshard_or_replace_s > 0
    )  # a restore, resharded


def test_continue_without_the_lost_replica_group(elasticity) -> None:  # type: ignore[no-untyped-def]
    runs, _ = elasticity
    m = runs["continue"]
    assert m.outcome == "recovered" and m.strategy == "continue" and m.workload == "ft-mlp"
    assert m.restart_count is not None
    # per-step commit: no rollback; at most the step in flight is lost
    assert m.lost_steps is not None and m.lost_steps <= 2
    ev = events_of(m)
    # node1 came back (reboot) and its group started again
    assert kinds(ev, "node_start", reason="reboot")
    fault_t = kinds(ev, "fault_inject")[0].t_ns
    assert any(
        int(e.get("group", e.get("replica_group", -1))) == 1 or e.get("node") == "node1"
        for e in kinds(ev, "rank_start")
        if e.t_ns > fault_t
    )
    for run in runs.values():
        assert run_objects(run.run_dir) == []
        # the harness's own CPU over the run (followers, log readers, fault control), one run at a time
        assert run.harness_cpu_share is not None and 0 < run.harness_cpu_share < 0.5, run.harness_cpu_share


def test_report_names_a_winner_per_workload(elasticity) -> None:  # type: ignore[no-untyped-def]
    _, suite_dir = elasticity
    report = (suite_dir / "report.md").read_text()
    assert "## Elasticity: recovery strategies" in report
    section = report.split("## Elasticity: recovery strategies", 1)[1]
    assert "### Workload: pp-lm" in section and "### Workload: ft-mlp" in section
    assert "pp-lm: " in section and "resumed fastest" in section
    assert "spare pool (nodes)" in section and "The harness itself used" in section
