"""Ray Train 2.60 under the ``ray-train`` adapter on the ``docker`` runtime: a Ray cluster in two node containers
(the head beside node0's Ray node in node0's container, node1's in its own), a ``TorchTrainer`` of 2 workers (gloo,
CPU, elastic: at least 1) running ``ddp-mlp``, one worker per node. Two runs: rank 1's worker killed, and node1
lost (``docker kill`` of its container).

What is checked against Ray's own records, as ``test_ray_train.py`` does on the local runtime: the controller's
failure decisions (``[FailurePolicy] RETRY`` and their error counts), the raylet's report of the dead worker (the
killed rank's pid, a pid of its container), the checkpoint Ray handed the restarted worker group (as the workers
printed it, and Ray's checkpoint-manager snapshot), the world the lost node's run went on with, and the steps the
ranks' own lines say were done again.

Skipped when Ray Train is not importable or no Docker engine answers, unless CHAOSBENCH_REQUIRE names "ray" /
"docker" (then failed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from docker_support import events_of, kinds, require_docker, run_objects

from tests.helpers import require_engines, run_suite_text
from tests.helpers.truth import (
    assert_ray_blamed_by_the_logs,
    assert_stages_match_the_timeline,
    lost_steps_by_the_logs,
)

pytestmark = pytest.mark.integration

require_engines("ray")
require_docker()

from chaosbench.workloads.skeleton import marked_step  # noqa: E402

STEPS, EVERY, FAULT_AT = 20, 5, 8

# Both faults fire after step 8: the checkpoint of step 5 was reported 3 steps (0.6 s) before, so the controller,
# polling every 0.25 s, has registered it (a report reaches Ray's checkpoint manager only at its next poll).
# The GCS gives a lost node up after 2 missed checks 0.5 s apart. The elastic controller sizes the new worker group
# from Ray's autoscaling coordinator, whose view of the nodes is refreshed every 20 s (its TICK_INTERVAL_S): until
# then it still counts the lost node's CPU and waits worker_group_start_timeout_s (5 s) for 2 workers, as many
# times as fit before the refresh (2 in the run measured here; 0 to 4 by when the refresh falls).
SUITE = f"""
name: ray-docker
seed: 3
control: false
keep_checkpoints: all
defaults:
  runtime: docker
  deadline_s: 150
  workload: {{name: ddp-mlp, ranks: 2, nodes: 2, steps: {STEPS}, checkpoint_every: {EVERY}, step_sleep_s: 0.2,
             pg_timeout_s: 10}}
frameworks:
  ray-train: {{max_failures: 3, min_workers: 1, health_check_interval_s: 0.25, worker_group_start_timeout_s: 5,
              node_health_check_period_s: 0.5, node_health_check_failure_threshold: 2,
              node_health_check_timeout_s: 1, teardown_grace_s: 0.5}}
faults:
  kill-r1: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: {FAULT_AT}}}}}
  lose-node1: {{injector: node-kill, target: {{node: node1}}, trigger: {{at_step: {FAULT_AT}}}}}
matrix: {{frameworks: [ray-train], faults: [kill-r1, lose-node1], repeats: 1}}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    res = run_suite_text(SUITE, tmp_path_factory.mktemp("ray-docker"))
    for m in res.values():
        assert run_objects(str(m.run_dir)) == []  # every container and the network removed
    return res


def _logs(run_dir: Path) -> str:
    return "".join(
        (run_dir / "logs" / f).read_text(errors="replace") for f in ("ray.driver.out", "ray.driver.err")
    )


def _containers(events: list[Any]) -> dict[str, str]:
    return {str(e.get("proc")): str(e.get("container")) for e in kinds(events, "proc_start")}


def test_ray_train_on_docker_restarts_a_killed_worker_from_the_checkpoint_it_kept(
    runs: dict[str, Any],
) -> None:
    m = runs["ray-train/kill-r1"]
    assert m.outcome == "recovered" and m.final_step == STEPS, (m.verdict, m.missing)
    run_dir = Path(str(m.run_dir))
    events = events_of(m)
    logs = _logs(run_dir)
    # the head shares node0's container with node0's Ray node and the driver; node1's Ray node has its own
    where = _containers(events)
    assert where["ray.head"] == where["ray.node0"] == where["ray.driver"] != where["ray.node1"]
    assert "chaosbench ray driver: cluster up: 3 nodes, 2 CPUs" in logs

    fault = next(e for e in events if e.kind == "fault_inject")
    killed_pid = int(fault["target"][0]["pid"])
    # Ray's controller decided once to restart the worker group, its first failure of the 3 allowed
    assert len(re.findall(r"\[FailurePolicy\] RETRY", logs)) == 1
    assert "Error count: 1 (max allowed: 3)" in logs and "[FailurePolicy] RAISE" not in logs
    assert m.restart_count == 1 and m.restarts_claimed == 1
    # the raylet reported the killed worker by its pid (a pid of its container), and the adapter blamed rank 1
    assert [int(p) for p in re.findall(r"A worker died or was killed.*?Worker PID: (\d+)", logs)] == [
        killed_pid
    ]
    assert_ray_blamed_by_the_logs(m, events, fault, killed_pid, rank=1)
    # the raylet's line comes when its child dies, the controller's at its next 0.25 s poll (measured: 0.02 s and
    # 0.09 s); 2 s leaves room for a loaded machine
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 2.0

    # the restarted group, 2 workers again (both nodes are up), restored step 5: the newest reported before the kill
    restored = set(re.findall(r"ray train: restoring from checkpoint (\S+)", logs))
    assert len(restored) == 1, restored
    path = Path(restored.pop())
    assert path.parent == run_dir / "checkpoints" and marked_step(path) == EVERY
    loads = kinds(events, "ckpt_load_end")
    assert sorted((e["rank"], e["step"], e["incarnation"]) for e in loads) == [(0, EVERY, 1), (1, EVERY, 1)]
    snapshot = json.loads((path.parent / "checkpoint_manager_snapshot.json").read_text())
    reported = {c["checkpoint_dir_name"]: c["metrics"]["step"] for c in snapshot["checkpoint_results"]}
    assert reported[path.name] == EVERY
    assert m.lost_steps == lost_steps_by_the_logs(m) == FAULT_AT - EVERY
    assert_stages_match_the_timeline(m)
    assert m.ranks_agree


def test_ray_train_on_docker_goes_on_with_one_worker_after_losing_a_node(runs: dict[str, Any]) -> None:
    m = runs["ray-train/lose-node1"]
    assert m.outcome == "recovered" and m.final_step == STEPS, (m.verdict, m.missing)
    run_dir = Path(str(m.run_dir))
    events = events_of(m)
    logs = _logs(run_dir)
    fault = next(e for e in events if e.kind == "fault_inject")
    # the engine's own record: node1's container died, killed by the fault, and its Ray node with it, not run again
    (died,) = kinds(events, "node_exit", node="node1", reason="node-kill")
    assert died.t_ns >= fault.t_ns
    (node1_exit,) = kinds(events, "proc_exit", proc="ray.node1")
    assert node1_exit.get("node_lost") is True and len(kinds(events, "proc_start", proc="ray.node1")) == 1
    lost = {int(e["rank"]) for e in kinds(events, "rank_start", node="node1") if e.t_ns < fault.t_ns}
    assert len(lost) == 1  # which rank Ray placed on node1 is its choice
    # Ray's GCS gave node1 up (missed health checks), by the name the adapter gave it
    assert re.findall(
        r"node name: (\S+) has been marked dead because the detector has missed too many", logs
    ) == ["node1"]
    # Ray went on with the one worker left: a world of 1 on node0, restored from step 5 (written by a world of 2)
    resumed = [e for e in kinds(events, "rank_start") if e.t_ns > fault.t_ns]
    assert resumed and {e["world_size"] for e in resumed} == {1} and {e["node"] for e in resumed} == {"node0"}
    assert [(e["step"], e["rank"]) for e in kinds(events, "ckpt_load_end")] == [(EVERY, 0)]
    assert "(written at world size 2)" in logs
    assert m.lost_steps == lost_steps_by_the_logs(m) == FAULT_AT - EVERY
    # every restart decision of Ray's is a restart on the timeline; the first is on the failed worker group, any
    # later one on a start that timed out waiting for the lost node's CPU (which the GCS still counted)
    retries = re.findall(r"\[FailurePolicy\] RETRY\s*\n.*?Source: (worker group|controller)", logs)
    assert retries and retries[0] == "worker group" and all(r == "controller" for r in retries[1:]), retries
    assert m.restarts_claimed == len(retries) and "[FailurePolicy] RAISE" not in logs
    assert (len(retries) > 1) == ("The worker group startup timed out after 5.0 seconds" in logs)
    assert m.restart_count == 1  # one incarnation beyond the first: a start that timed out started no rank
    assert m.detected
