"""Each runtime, given a real target its run did not start, refuses to act on it and leaves it unharmed:

- local: a ``sleep`` the test started (a child of the harness's own process, not of the runtime);
- docker: a container the test started from the runtime's node image, without the run's label, both named as a
  node and put where a node's container would be (the mix-up the label check exists for);
- slurm: a job the test submitted (``sbatch --wrap 'sleep 60'``) on the node where the run's own job runs, and
  one named like the run's jobs but not submitted by it, on another node.

No training ranks: each builds its runtime directly from a RunInfo. Docker and Slurm tests are skipped without an
engine or cluster, unless ``CHAOSBENCH_REQUIRE`` names it (``bash scripts/docker-up``, ``bash scripts/slurm-local
up``). Everything a test starts is removed at its end."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_support import require_docker

from chaosbench import procutil
from chaosbench.errors import ForeignTarget
from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup
from chaosbench.injectors.network import NetLossInjector, NetLossParams
from chaosbench.injectors.node_pause import NodePauseInjector, NodePauseParams
from chaosbench.runtimes import process
from chaosbench.runtimes.base import ProcessSpec, RunInfo, Runtime
from chaosbench.runtimes.local import LocalNodeLossOptions, LocalRuntime
from chaosbench.timeline import TimelineWriter
from tests.helpers import require, slurm_problem

pytestmark = pytest.mark.integration


def _info(tmp_path: Path, prefix: str) -> RunInfo:
    return RunInfo(f"{prefix}-{os.urandom(4).hex()}", tmp_path, TimelineWriter(tmp_path / "events.jsonl"))


def _ctx(tmp_path: Path, rt: Runtime, node: str) -> FaultContext:
    setup = RunSetup(
        run_id=rt.run.run_id,
        run_dir=tmp_path,
        ckpt_dir=tmp_path,
        runtime=rt,
        timeline=rt.run.timeline,
        rng=random.Random(0),
        ranks=1,
        nodes=1,
    )
    return FaultContext(
        rt, rt.run.timeline, [ResolvedTarget(0, None, None, node, 0)], random.Random(0), setup
    )


def _wait_for(cond: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------- local
def test_local_refuses_a_process_the_test_started(tmp_path: Path) -> None:
    rt = LocalRuntime(_info(tmp_path, "tg-local"))
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        own = rt.start(ProcessSpec("own", ["sleep", "60"], node="node0"))
        ticks = procutil.start_ticks(stranger.pid)
        for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
            with pytest.raises(ForeignTarget) as err:
                rt.signal_pid(stranger.pid, sig, ticks, "node0")
            assert (err.value.subject, err.value.reason, err.value.doing) == (
                f"pid {stranger.pid}",
                "was not started by this run",
                "signalling it",
            )
        with pytest.raises(ProcessLookupError):  # no node holds it: losing a node never reaches it
            rt.lose_nodes(["node1"], LocalNodeLossOptions(), [])
        assert rt.lose_nodes(["node0"], LocalNodeLossOptions(), [])["pids"] == {"node0": [own.pid]}
        assert own.exited.wait(5) and own.returncode == -signal.SIGKILL
        rt.cleanup(grace_s=1)
        assert stranger.poll() is None and process.state(stranger.pid) in ("sleeping", "running")
        assert rt.leftovers() == []
    finally:
        rt.cleanup(grace_s=1)
        stranger.kill()
        stranger.wait()


# ---------------------------------------------------------------------------------------------- docker
@pytest.fixture
def docker_pair(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A docker runtime with one node, and a container the test started from the same image without the run's
    label (removed at the end)."""
    require_docker()
    from chaosbench.runtimes.docker import DockerRuntime
    from chaosbench.runtimes.docker.image import default_mounts, init_command

    rt = DockerRuntime(_info(tmp_path, "tg-docker"))
    foreign = None
    try:
        rt.provision(1)
        foreign = rt.client.containers.run(
            rt.image,
            init_command(),
            detach=True,
            network_mode="none",
            name=f"tg-foreign-{os.urandom(4).hex()}",
            mounts=[m.to_docker() for m in default_mounts()],
            labels={"chaosbench.test": "target-guard"},
            tmpfs={"/tmp": "rw,size=16m"},
            stop_signal="SIGKILL",
        )
        foreign.reload()
        assert foreign.status == "running"
        yield rt, foreign
    finally:
        rt.cleanup(grace_s=1)
        if foreign is not None:
            foreign.reload()
            still_running = foreign.status == "running"
            foreign.remove(force=True)
            assert still_running, "the run's teardown touched a container that is not the run's"


def _unharmed(foreign: Any, init_pid: int, init_ticks: int | None) -> None:
    foreign.reload()
    assert foreign.status == "running"
    assert process.alive(init_pid, init_ticks) and process.state(init_pid) != "stopped"
    host = foreign.attrs["HostConfig"]
    assert not host.get("NanoCpus") and not host.get("CpuQuota")  # no CPU limit was set on it


def test_docker_refuses_a_container_without_the_runs_label(
    tmp_path: Path, docker_pair: tuple[Any, Any]
) -> None:
    rt, foreign = docker_pair
    init_pid = int(foreign.attrs["State"]["Pid"])
    init_ticks = procutil.start_ticks(init_pid)
    # named as the node
    for act in (
        lambda: rt.signal_pid(1, signal.SIGKILL, None, foreign.name),
        lambda: rt.pause_node(foreign.name),
    ):
        with pytest.raises(ForeignTarget) as err:
            act()
        assert (err.value.subject, err.value.reason) == (repr(foreign.name), "is not a node of this run")
    # put where node0's container would be: every action is refused by the engine's own labels
    node = rt.pool.nodes["node0"]
    own = node.container
    node.container = foreign
    try:
        actions = {
            "signalling it": lambda: rt.signal_pid(1, signal.SIGKILL, None, "node0"),
            "pausing it": lambda: rt.pause_node("node0"),
            "killing it": lambda: rt.kill_node("node0"),
            "changing its CPU limit": lambda: rt.set_node_cpus("node0", 0.1),
            "entering its namespaces": lambda: rt.node_pid("node0"),
        }
        label = f"has no label chaosbench.run={rt.run.run_id}"
        for doing, act in actions.items():
            with pytest.raises(ForeignTarget) as err:
                act()
            assert (err.value.subject, err.value.reason, err.value.doing) == (
                f"container {foreign.name}",
                label,
                doing,
            )
        for doing, injector in (
            ("pausing it", NodePauseInjector("pause", NodePauseParams())),
            ("entering its namespaces", NetLossInjector("loss", NetLossParams(percent=100))),
        ):
            with pytest.raises(ForeignTarget) as err:
                injector.inject(_ctx(tmp_path, rt, "node0"))
            assert (err.value.subject, err.value.doing) == (f"container {foreign.name}", doing)
        _unharmed(foreign, init_pid, init_ticks)
    finally:
        node.container = own
    if shutil.which("nsenter") and shutil.which("tc"):  # no qdisc landed in its network namespace either
        shown = subprocess.run(
            ["nsenter", "-t", str(init_pid), "-n", "tc", "qdisc", "show"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        assert "netem" not in shown
    # the run's own node, as a control: the same calls act on it
    assert rt.pause_node("node0") == own.name and rt.unpause_node("node0") is True
    _unharmed(foreign, init_pid, init_ticks)


# ---------------------------------------------------------------------------------------------- slurm
def _sbatch(node: str, name: str) -> int:
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N1",
            "-n1",
            "-w",
            node,
            f"--job-name={name}",
            "-o",
            "/dev/null",
            "-t",
            "5:00",
            "--wrap",
            "sleep 60",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout.strip().split(";")[0])


def _job_state(job: int) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def _sleep_pid(job: int, node: str) -> int | None:
    """The pid of the job's ``sleep`` (the local cluster's nodes run on this host)."""
    out = subprocess.run(
        ["scontrol", "listpids", str(job), node], capture_output=True, text=True, timeout=30
    ).stdout
    for line in out.splitlines()[1:]:
        pid = int(line.split()[0])
        if pid <= 0:  # a step whose process slurmd has not recorded yet lists as -1
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0].endswith(b"sleep"):
                    return pid
        except FileNotFoundError:  # ended between the listing and here
            continue
    return None


@pytest.fixture
def slurm_jobs(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A slurm runtime whose own job runs on n1, a job of someone else's on n1 and one named like the run's jobs,
    not submitted by it, on n2; every job cancelled at the end."""
    require("slurm", None if (p := slurm_problem()) is None else f"no cluster answers: {p}")
    from chaosbench.runtimes.slurm import SlurmOptions, SlurmRuntime

    opts = SlurmOptions(nodes={"node0": "n1", "node1": "n2"}, measure_clocks=False, time_limit="5:00")
    rt = SlurmRuntime(_info(tmp_path, "tg-slurm"), opts)
    submitted: list[int] = []
    try:
        own = rt.start(ProcessSpec("own", ["sleep", "60"], node="node0"))
        submitted.append(_sbatch("n1", f"tg-foreign-{os.urandom(3).hex()}"))
        submitted.append(_sbatch("n2", f"{rt.job_prefix}.impostor"))
        own_job = _wait_for(lambda: rt.job_id(own), 30, "the run's own job")
        for job in [own_job, *submitted]:
            _wait_for(lambda job=job: _job_state(job) == "RUNNING", 30, f"job {job} to run")
        pids = {
            job: _wait_for(lambda job=job, node=node: _sleep_pid(job, node), 30, f"the sleep of job {job}")
            for job, node in ((own_job, "n1"), (submitted[0], "n1"), (submitted[1], "n2"))
        }
        rt.slurm_node("node1")  # node1 is n2 (pinned), where only the impostor runs
        yield {"rt": rt, "own": own_job, "foreign": submitted[0], "impostor": submitted[1], "pids": pids}
    finally:
        rt.cleanup(grace_s=1)
        alive = {job: _job_state(job) for job in submitted}
        if submitted:
            subprocess.run(["scancel", *map(str, submitted)], capture_output=True, timeout=30)
        assert all(s == "RUNNING" for s in alive.values()), (
            f"the run's teardown touched others' jobs: {alive}"
        )


def test_slurm_refuses_a_job_it_did_not_submit(slurm_jobs: dict[str, Any]) -> None:
    from chaosbench.runtimes.slurm import SlurmNodeLossOptions

    rt, pids = slurm_jobs["rt"], slurm_jobs["pids"]
    foreign, impostor = slurm_jobs["foreign"], slurm_jobs["impostor"]
    ticks = {job: procutil.start_ticks(pid) for job, pid in pids.items()}
    assert rt.process_alive(
        pids[slurm_jobs["own"]], ticks[slurm_jobs["own"]], "node0"
    )  # control: its own is seen
    # a pid of someone else's job on the node where the run's job runs: the node helper finds it in none of ours
    with pytest.raises(ForeignTarget) as err:
        rt.signal_pid(pids[foreign], signal.SIGKILL, ticks[foreign], "node0")
    assert (err.value.subject, err.value.reason) == (
        f"pid {pids[foreign]} on n1",
        "is not in a job of this run",
    )
    # a pid of a job named like the run's, on a node where none of the run's jobs runs: no step is even started
    with pytest.raises(ForeignTarget) as err:
        rt.signal_pid(pids[impostor], signal.SIGKILL, ticks[impostor], "node1")
    assert (err.value.target, err.value.subject, err.value.reason) == (
        f"pid {pids[impostor]}",
        "Slurm node n2",
        "runs no job of this run",
    )
    # node loss: n2 runs no job of the run; n1 runs someone else's too
    with pytest.raises(ForeignTarget) as err:
        rt.lose_nodes(["node1"], SlurmNodeLossOptions(), [])
    assert (err.value.subject, err.value.reason, err.value.doing) == (
        "Slurm node n2",
        "runs no job of this run",
        "touching it",
    )
    with pytest.raises(ForeignTarget) as err:
        rt.lose_nodes(["node0"], SlurmNodeLossOptions(state="drain"), [])
    assert (err.value.subject, err.value.reason) == (
        "Slurm node n1",
        f"also runs jobs of others ([{foreign}])",
    )
    with pytest.raises(ForeignTarget) as err:
        rt.cancel_batch(foreign)
    assert (err.value.subject, err.value.reason) == (f"Slurm job {foreign}", "was not submitted by this run")
    for job in (foreign, impostor):
        assert _job_state(job) == "RUNNING" and process.alive(pids[job], ticks[job])
    states = rt.slurm.nodes_info(["n1", "n2"])
    assert not any(w in states[n].get("State", "") for n in ("n1", "n2") for w in ("DOWN", "DRAIN")), states
    assert impostor not in rt.slurm.our_jobs()  # nor is it counted among the run's jobs (teardown, leftovers)
