"""Ray Train 2.60 under the ``ray-train`` adapter: a Ray cluster of its own (a head and one worker node as local
processes), a ``TorchTrainer`` of 2 workers (gloo, CPU) running ``ddp-mlp`` inside them, a training rank killed.

What is checked against Ray's own records (not the metrics): the controller's failure decision (one ``RETRY``,
``Error count: 1 (max allowed: 2)``), the raylet's report of the dead worker (the killed rank's pid), the
checkpoint Ray handed the restarted worker group (``ray.train.get_checkpoint()``, as the workers printed it, and
Ray's checkpoint-manager snapshot in its run directory), the steps the ranks' own lines say were done again. The
resumed run must end bit-identical to the same program launched without Ray.

Skipped when Ray Train is not importable, unless CHAOSBENCH_REQUIRE contains "ray" (then failed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from chaosbench.workloads.skeleton import marked_step
from tests.helpers import events_of, launch_ranks, require_engines
from tests.helpers.truth import (
    assert_ray_blamed_by_the_logs,
    assert_stages_match_the_timeline,
    lost_steps_by_the_logs,
)

pytestmark = pytest.mark.integration

require_engines("ray")

STEPS, EVERY, KILL_AT = 30, 5, 13

# The kill fires after step 13: the checkpoint of step 10 was reported 3 steps (0.6 s) before it, so the
# controller, polling every 0.25 s, has registered it (a report reaches Ray's checkpoint manager only at the
# controller's next poll of the worker: one made just before a kill can be lost, and Ray restores an older one).
SUITE = f"""
name: ray
seed: 3
control: false
keep_checkpoints: all
defaults:
  deadline_s: 170
  workload: {{name: ddp-mlp, ranks: 2, nodes: 1, steps: {STEPS}, checkpoint_every: {EVERY}, step_sleep_s: 0.2,
             pg_timeout_s: 20}}
frameworks:
  ray-train: {{max_failures: 2, health_check_interval_s: 0.25}}
faults:
  kill-r1: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: {KILL_AT}}}}}
matrix: {{frameworks: [ray-train], faults: [kill-r1], repeats: 1}}
"""


def _without_ray_digest(run_dir: Path, tmp_path: Path) -> str:
    """The final digest of the program the run's workers ran (its own argument list, from the plan), launched as 2
    plain ranks without Ray and without the step sleep (it changes no value)."""
    plan = json.loads((run_dir / "config.json").read_text())["plan"]
    driver = next(p for p in plan["processes"] if p["role"] == "driver")
    argv = json.loads(driver["argv"][driver["argv"].index("--config") + 1])["loop"]["argv"]
    args = argv[3:]
    args[args.index("--ckpt-dir") + 1] = str(tmp_path / "plain-ckpt")
    i = args.index("--step-sleep-s")
    del args[i : i + 2]
    events = tmp_path / "plain.jsonl"
    job = launch_ranks(argv[2], args, 2, events, tmp_path, "plain")
    assert job.finish(120) == [0, 0], job.output()
    digests = {e["digest"] for e in read_events(events) if e.kind == "train_end"}
    assert len(digests) == 1, digests
    return digests.pop()


def test_ray_train_restarts_a_killed_worker_from_the_checkpoint_it_kept(run_suite, tmp_path: Path) -> None:
    res = run_suite(SUITE)
    m = res["ray-train/kill-r1#0"]
    assert m.outcome == "recovered" and m.final_step == STEPS, (m.verdict, m.missing)
    assert m.versions["ray"] == "2.60.0" and m.versions["torch"].startswith("2.13.0")
    assert m.timeouts["health_check_interval_s"] == 0.25 and m.timeouts["workload_pg_timeout_s"] == 20.0
    run_dir = Path(str(m.run_dir))
    events = events_of(m)
    fault = next(e for e in events if e.kind == "fault_inject")
    killed_pid = int(fault["target"][0]["pid"])
    out = (run_dir / "logs" / "ray.driver.out").read_text(errors="replace")
    err = (run_dir / "logs" / "ray.driver.err").read_text(errors="replace")

    # Ray's controller decided once to restart the worker group, its first failure of the 2 allowed
    assert len(re.findall(r"\[FailurePolicy\] RETRY", out + err)) == 1
    assert "Error count: 1 (max allowed: 2)" in out + err
    assert "[FailurePolicy] RAISE" not in out + err
    assert m.restart_count == 1 and m.restarts_claimed == 1
    # the raylet reported the killed worker by its pid, and the adapter blamed that rank
    assert [int(p) for p in re.findall(r"A worker died or was killed.*?Worker PID: (\d+)", out + err)] == [
        killed_pid
    ]
    assert_ray_blamed_by_the_logs(m, events, fault, killed_pid, rank=1)
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 2.0  # both lines come within one poll

    # the restarted group restored the checkpoint Ray handed it: step 10, the newest reported before the kill
    restored = set(re.findall(r"ray train: restoring from checkpoint (\S+)", out + err))
    assert len(restored) == 1, restored
    path = Path(restored.pop())
    assert path.parent == run_dir / "checkpoints" and marked_step(path) == 10
    loads = [e for e in events if e.kind == "ckpt_load_end"]
    assert sorted((e["rank"], e["step"], e["incarnation"]) for e in loads) == [(0, 10, 1), (1, 10, 1)]
    # Ray's own record of the checkpoints reported to it (its checkpoint manager's snapshot, written as they came)
    snapshot = json.loads((path.parent / "checkpoint_manager_snapshot.json").read_text())
    reported = {c["checkpoint_dir_name"]: c["metrics"]["step"] for c in snapshot["checkpoint_results"]}
    assert reported[path.name] == 10
    # the steps done again: 11-13, by the ranks' own lines
    assert m.lost_steps == lost_steps_by_the_logs(m) == KILL_AT - 10
    assert_stages_match_the_timeline(m)

    # restored from Ray's checkpoint, the run ends where the same program ends without Ray, bit for bit
    ends = {e["digest"] for e in events if e.kind == "train_end"}
    assert ends == {_without_ray_digest(run_dir, tmp_path)} and m.ranks_agree
    # nothing of the cluster is left: no process (run_suite checks), no temp-dir link
    assert not Path(
        str(json.loads((run_dir / "config.json").read_text())["plan"]["options"]["temp_dir"])
    ).exists()


# Elastic (num_workers=(1, 2)) on 2 Ray nodes of 1 CPU: node1 lost after step 13 (its ray start and every process
# under it SIGKILLed at once). Ray's controller decides at its next poll; its elastic policy sizes the new group
# from Ray's autoscaling coordinator, whose view of the nodes is refreshed every 20 s (its TICK_INTERVAL_S): it saw
# 2 workers' worth of resources still and waited worker_group_start_timeout_s (twice, in the run measured here)
# for a placement group that could not be placed, then restarted with the 1 worker the cluster had. How many such
# waits happen depends on when that refresh falls: not asserted.
NODE_SUITE = f"""
name: ray-node
seed: 3
control: false
defaults:
  deadline_s: 200
  workload: {{name: ddp-mlp, ranks: 2, nodes: 2, steps: {STEPS}, checkpoint_every: {EVERY}, step_sleep_s: 0.2,
             pg_timeout_s: 20}}
frameworks:
  ray-train: {{max_failures: 2, min_workers: 1, health_check_interval_s: 0.25, worker_group_start_timeout_s: 10,
              node_health_check_period_s: 1.0, node_health_check_failure_threshold: 3}}
faults:
  lose-node: {{injector: node-kill, target: {{node: node1}}, trigger: {{at_step: {KILL_AT}}}}}
matrix: {{frameworks: [ray-train], faults: [lose-node], repeats: 1}}
"""


def test_ray_train_goes_on_with_fewer_workers_after_losing_a_node(run_suite) -> None:
    m = run_suite(NODE_SUITE)["ray-train/lose-node#0"]
    assert m.outcome == "recovered" and m.final_step == STEPS, (m.verdict, m.missing)
    events = events_of(m)
    run_dir = Path(str(m.run_dir))
    logs = "".join(
        (run_dir / "logs" / f).read_text(errors="replace") for f in ("ray.driver.out", "ray.driver.err")
    )
    fault = next(e for e in events if e.kind == "fault_inject")
    lost = {
        int(e["rank"])
        for e in events
        if e.kind == "rank_start" and e.get("node") == "node1" and e.t_ns < fault.t_ns
    }
    assert len(lost) == 1
    # Ray went on with the one worker left: a world of 1, restored from step 10 (written by a world of 2)
    resumed = [e for e in events if e.kind == "rank_start" and e.t_ns > fault.t_ns]
    assert resumed and {e["world_size"] for e in resumed} == {1} and {e["node"] for e in resumed} == {"node0"}
    loads = [e for e in events if e.kind == "ckpt_load_end"]
    assert [(e["step"], e["rank"]) for e in loads] == [(10, 0)]
    assert "(written at world size 2)" in logs
    assert m.lost_steps == lost_steps_by_the_logs(m) == KILL_AT - 10
    # every restart decision of Ray's is a restart on the timeline, and the ranks' incarnations agree
    retries = re.findall(r"\[FailurePolicy\] RETRY\s*\n.*?Source: (worker group|controller)", logs)
    assert retries and retries[0] == "worker group", retries
    assert m.restarts_claimed == len(retries) and "[FailurePolicy] RAISE" not in logs
    assert m.restart_count == 1  # one incarnation beyond the first: a start that timed out started no rank
    # after the first, each decision is on a start that timed out waiting for the lost node's CPU (the GCS still
    # counted it); a restart Ray reports that started no rank: the verdict names the mismatch
    assert all(r == "controller" for r in retries[1:]), retries
    assert (len(retries) > 1) == ("The worker group startup timed out after 10.0 seconds" in logs)
    assert m.detected and m.time_to_detect_s is not None and m.time_to_detect_s < 2.0
