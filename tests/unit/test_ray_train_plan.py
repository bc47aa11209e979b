"""The ``ray-train`` adapter's plan (its Ray cluster, driver and the TorchTrainer's settings), timeouts and
detection model, and the pieces its workers use: the skeleton's checkpoint bridge and the start counter. Ray
itself is not needed: planning imports none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosbench.frameworks.ray_train import ray_temp_link
from chaosbench.launchers.ray_node import resolve_node_ip
from chaosbench.launchers.ray_train import next_attempt
from chaosbench.runner import Runner
from chaosbench.workloads.skeleton import COMPLETE_MARKER, mark_complete, marked_step
from tests.conftest import make_suite

SUITE = """
name: ray-plan
seed: 1
defaults:
  runtime: {runtime}
  workload: {{name: {workload}, ranks: 4, nodes: 2, steps: 5, pg_timeout_s: 12.5}}
frameworks:
  ray-train: {{max_failures: 2, health_check_interval_s: 0.5{extra}}}
matrix: {{frameworks: [ray-train], faults: [], repeats: 1}}
"""


def _plan(tmp_path: Path, workload: str = "ddp-mlp", extra: str = "", runtime: str = "local") -> Any:
    suite = make_suite(SUITE.format(workload=workload, extra=extra, runtime=runtime))
    ((sc, plan),) = Runner(suite, tmp_path).plans()
    assert not isinstance(plan, str), plan
    return plan


def _config(plan: Any) -> dict[str, Any]:
    driver = plan.processes[-1]
    return json.loads(driver.argv[driver.argv.index("--config") + 1])


def test_the_plan_starts_a_head_a_ray_node_per_workload_node_and_the_driver(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert [(p.name, p.role, p.node) for p in plan.processes] == [
        ("ray.head", "head", "head"),
        ("ray.node0", "node", "node0"),
        ("ray.node1", "node", "node1"),
        ("ray.driver", "driver", "head"),
    ]
    head, node0, node1, driver = plan.processes
    gcs = plan.options["gcs_address"]
    assert head.argv[head.argv.index("--port") + 1] == gcs.rsplit(":", 1)[1]
    assert gcs.startswith("127.0.0.1:")
    for p in (node0, node1):
        assert p.argv[p.argv.index("--address") + 1] == gcs
        assert p.argv[p.argv.index("--num-cpus") + 1] == "2"  # ranks per node
    assert head.argv[head.argv.index("--num-cpus") + 1] == "0"
    for p in (head, node0, node1):
        a = p.argv
        # the node's entrypoint makes the short temp-dir link in the node's /tmp, then execs ray start
        assert a[1:3] == ["-m", "chaosbench.launchers.ray_node"]
        assert a[a.index("--temp-link") + 1] == plan.options["temp_dir"]
        assert a[a.index("--temp-target") + 1] == str(
            tmp_path / "ray-plan" / "ray-train__control" / "0" / "ray"
        )
        a = a[a.index("--") + 1 :]
        assert a[1:5] == ["-m", "ray.scripts.scripts", "start", "--block"]
        assert a[a.index("--node-ip-address") + 1] == "127.0.0.1"
        assert "--plasma-directory" not in a  # the host's /dev/shm
        assert a[a.index("--object-store-memory") + 1] == str(100 * 1024 * 1024)
        # a temp dir of its own per node: each node's log monitor forwards every file under its own
        assert a[a.index("--temp-dir") + 1] == f"{plan.options['temp_dir']}/{p.node}"
        assert "--disable-usage-stats" in a
        assert p.env["RAY_USAGE_STATS_ENABLED"] == "0" and p.env["RAY_ADDRESS"] == gcs
        assert p.env["CHAOSBENCH_NODE"] == p.node  # Ray's workers inherit their raylet's environment
    ports = [p.argv[p.argv.index("--dashboard-agent-listen-port") + 1] for p in (head, node0, node1)]
    assert len(set(ports)) == 3  # one host: each node's agent on a port of its own
    assert head.argv[head.argv.index("--include-dashboard") + 1] == "false"
    assert driver.argv[1:3] == ["-m", "chaosbench.launchers.ray_train"]
    assert driver.env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"


def test_on_docker_the_head_shares_node0s_container_and_each_node_gets_its_containers_address(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, runtime="docker")
    assert [(p.name, p.role, p.node) for p in plan.processes] == [
        ("ray.head", "head", "node0"),
        ("ray.node0", "node", "node0"),
        ("ray.node1", "node", "node1"),
        ("ray.driver", "driver", "node0"),
    ]
    gcs = plan.options["gcs_address"]
    assert gcs.startswith("node0:")
    for p, machine in zip(plan.processes[:3], ("node0", "node0", "node1"), strict=True):
        a = p.argv[p.argv.index("--") + 1 :]
        assert a[a.index("--node-ip-address") + 1] == machine  # a name: the entrypoint resolves it at start
        assert a[a.index("--plasma-directory") + 1] == "/tmp"  # the container's tmpfs, not its 64 MB /dev/shm
        assert a[a.index("--node-name") + 1] == p.name.removeprefix("ray.")
    assert _config(plan)["nodes"] == 3  # the head is a Ray node of its own, in node0's container


def test_the_node_entrypoint_links_the_temp_dir_resolves_a_name_and_execs_the_command(tmp_path: Path) -> None:
    link, target = tmp_path / "cbray-x", tmp_path / "run" / "ray"
    link.symlink_to(tmp_path)  # a stale link of an earlier run is replaced
    probe = "import os, sys; print(os.readlink(sys.argv[1]), sys.argv[3], os.getppid())"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaosbench.launchers.ray_node",
            "--temp-link",
            str(link),
            "--temp-target",
            str(target),
            "--",
            sys.executable,
            "-c",
            probe,
            str(link),
            "--node-ip-address",
            "localhost",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out[:2] == [str(target), "127.0.0.1"] and target.is_dir()
    assert int(out[2]) == os.getpid()  # exec'd in the entrypoint's own process: the runtime's handle is Ray's
    assert resolve_node_ip(["ray", "--node-ip-address", "10.1.2.3"]) == [
        "ray",
        "--node-ip-address",
        "10.1.2.3",
    ]
    assert resolve_node_ip(["ray", "start"]) == ["ray", "start"]


def test_the_trainer_gets_the_workloads_world_its_timeout_and_the_runs_checkpoint_dir(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    cfg = _config(plan)
    assert cfg["num_workers"] == 4 and cfg["max_failures"] == 2 and cfg["nodes"] == 3 and cfg["cpus"] == 4
    assert cfg["torch_timeout_s"] == 13  # TorchConfig takes whole seconds: 12.5 rounded up
    assert plan.timeouts["workload_pg_timeout_s"] == 13.0
    ray_run_dir = Path(cfg["storage_path"]) / cfg["name"]
    loop = cfg["loop"]
    # ddp-mlp runs inside the worker and writes its checkpoints into Ray Train's own run directory, which is the
    # run's checkpoint directory
    assert loop["mode"] == "in-process"
    assert loop["argv"][1:3] == ["-m", "chaosbench.workloads.ddp_mlp"]
    assert loop["argv"][loop["argv"].index("--ckpt-dir") + 1] == str(ray_run_dir)
    assert ray_run_dir == tmp_path / "ray-plan" / "ray-train__control" / "0" / "checkpoints"


def test_elastic_worker_counts_and_a_workload_run_as_a_child(tmp_path: Path) -> None:
    cfg = _config(_plan(tmp_path, extra=", min_workers: 2"))
    assert cfg["num_workers"] == [2, 4]
    cfg = _config(_plan(tmp_path / "b", workload="pp-lm"))
    assert cfg["loop"]["mode"] == "subprocess"


def test_timeouts_and_when_ray_train_detects(tmp_path: Path) -> None:
    from chaosbench.registry import FRAMEWORKS

    plan = _plan(tmp_path)
    t = plan.timeouts
    assert t["health_check_interval_s"] == 0.5 and t["worker_health_check_timeout_s"] == 600.0
    assert t["node_dead_after_s"] == 15.0 and t["collective_timeout_s"] is None
    fw = FRAMEWORKS.get("ray-train")("ray-train", FRAMEWORKS.get("ray-train").Options())
    assert fw.predict_detection("crash", t).decided_by == "health_check_interval_s=0.5"
    assert (
        fw.predict_detection("hang", t).decided_by == "workload_pg_timeout_s=13 + health_check_interval_s=0.5"
    )
    assert fw.predict_detection("hang", {**t, "worker_health_check_timeout_s": 5}).decided_by == (
        "worker_health_check_timeout_s=5 + health_check_interval_s=0.5"
    )
    assert fw.predict_detection("desync", t) is None


def test_rays_temp_dir_is_short_enough_for_its_sockets(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 150) / "suite" / "scenario" / "0"
    link = ray_temp_link(deep)
    assert link == ray_temp_link(deep) and link != ray_temp_link(tmp_path)
    # <temp>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store within a socket path's 107 bytes
    assert len(f"{link}/session_2026-12-05_07-31-22_123456_4194304/sockets/plasma_store") <= 107


def test_the_start_counter_numbers_the_worker_group_starts(tmp_path: Path) -> None:
    path = tmp_path / "starts"
    assert [next_attempt(path) for _ in range(3)] == [0, 1, 2]
    assert path.read_text() == "3"


def test_a_bridged_checkpoints_step_comes_from_its_marker_else_its_name(tmp_path: Path) -> None:
    named = tmp_path / "step_00000020"
    named.mkdir()
    assert marked_step(named) == 20
    mark_complete(named, {"step": 25, "world_size": 2})
    assert marked_step(named) == 25
    other = tmp_path / "checkpoint_2026"
    other.mkdir()
    with pytest.raises(RuntimeError, match=f"checkpoint {other}: no {COMPLETE_MARKER} marker"):
        marked_step(other)


def test_the_raylets_dead_worker_line_blames_the_rank_that_started_with_its_pid(tmp_path: Path) -> None:
    from chaosbench.frameworks.ray_train import _WorkerDeathWatch
    from chaosbench.runtimes.base import ProcessSpec, ProcHandle
    from chaosbench.timeline import Event, TimelineWriter, read_events

    timeline = TimelineWriter(tmp_path / "events.jsonl")
    watch = _WorkerDeathWatch("ray-train", timeline)
    driver = ProcHandle(ProcessSpec("ray.driver", ["python"], role="driver"), 1, None)
    # docker: pids of two containers; rank 0 on node0 and rank 1 on node1 both started as pid 98, rank 1 also as 99
    for rank, node, pid in ((0, "node0", 98), (1, "node1", 98), (1, "node1", 99)):
        watch.on_event(Event(1, "rank_start", data={"rank": rank, "node": node, "pid": pid}))
    for pid in (99, 98, 7):
        watch(
            driver,
            "stdout",
            f"(raylet) A worker died or was killed while executing a task by an unexpected "
            f"system error. Worker ID: ab Worker PID: {pid} Worker exit type: SYSTEM_ERROR",
            2,
        )
    timeline.close()
    detects = [e for e in read_events(tmp_path / "events.jsonl") if e.kind == "detect"]
    # 99: only rank 1 started with it; 98: ranks of two nodes did (which one died is not known); 7: no rank's
    assert [(e["pid"], e.get("blame_rank")) for e in detects] == [(99, 1), (98, None), (7, None)]
