"""Every runtime refuses to act on a target its run did not start, with fakes where the real thing needs an engine:
local (real processes: a pid the test started, a foreign process slipped into a node's tree), docker (fake
containers, one without the run's label, and node names that are not the run's), slurm (a fake cluster with
jobs of others and a job named like the run's but not commented as its). The real engines are in
tests/integration/test_foreign_targets.py."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError, ForeignTarget
from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup
from chaosbench.injectors.network import NetLossInjector, NetLossParams
from chaosbench.injectors.node_kill import NodeKillInjector, NodeKillParams
from chaosbench.injectors.node_pause import NodePauseInjector, NodePauseParams
from chaosbench.runtimes import process
from chaosbench.runtimes.base import ProcessSpec, RunInfo, Runtime
from chaosbench.runtimes.docker import DockerNodeLossOptions, DockerRuntime
from chaosbench.runtimes.docker.nodes import Node
from chaosbench.runtimes.local import LocalNodeLossOptions, LocalRuntime
from chaosbench.runtimes.slurm import SlurmCommands, SlurmNodeLossOptions, SlurmOptions, SlurmRuntime
from chaosbench.runtimes.slurm import cleanup as slurm_cleanup
from chaosbench.runtimes.slurm import runtime as slurm_runtime
from chaosbench.runtimes.slurm.commands import run_comment
from chaosbench.timeline import TimelineWriter

RUN = "run-1"


def _info(tmp_path: Path) -> RunInfo:
    return RunInfo(RUN, tmp_path, TimelineWriter(tmp_path / "events.jsonl"))


def _ctx(tmp_path: Path, runtime: Runtime, *nodes: str) -> FaultContext:
    setup = RunSetup(
        run_id=RUN,
        run_dir=tmp_path,
        ckpt_dir=tmp_path / "ckpt",
        runtime=runtime,
        timeline=runtime.run.timeline,
        rng=random.Random(0),
        ranks=2,
        nodes=2,
    )
    targets = [
        ResolvedTarget(rank=i, pid=None, pid_ticks=None, node=n, incarnation=0) for i, n in enumerate(nodes)
    ]
    return FaultContext(
        runtime=runtime, timeline=runtime.run.timeline, targets=targets, rng=random.Random(0), setup=setup
    )


def _wait_for(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _refused(err: ForeignTarget, subject: str, reason: str, doing: str, target: str | None = None) -> None:
    """The guard's error says what it refused, why and what it would have done, as fields."""
    assert (err.subject, err.reason, err.doing, err.target) == (subject, reason, doing, target)


# ---------------------------------------------------------------------------------------------- local
@pytest.fixture
def stranger() -> Any:
    """A process the test started, not the run."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_local_refuses_a_pid_it_did_not_start(tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    rt = LocalRuntime(_info(tmp_path))
    try:
        own = rt.start(ProcessSpec("own", ["sleep", "30"]))
        ticks = procutil.start_ticks(stranger.pid)
        with pytest.raises(ForeignTarget) as err:
            rt.signal_pid(stranger.pid, signal.SIGKILL, ticks)
        _refused(err.value, f"pid {stranger.pid}", "was not started by this run", "signalling it")
        assert str(err.value) == f"pid {stranger.pid} was not started by this run; not signalling it"
        with pytest.raises(ForeignTarget) as err:
            rt.signal_pid(stranger.pid, signal.SIGKILL)  # without the start time too
        _refused(err.value, f"pid {stranger.pid}", "was not started by this run", "signalling it")
        assert stranger.poll() is None and process.state(stranger.pid) != "stopped"
        assert rt.signal_pid(own.pid, signal.SIGSTOP, own.ticks) is not None  # its own: acted on
        rt.signal_pid(own.pid, signal.SIGCONT, own.ticks)
    finally:
        rt.cleanup(grace_s=1)
    assert stranger.poll() is None  # teardown left it alone as well


def test_local_signals_a_worker_orphaned_by_a_kill_it_made(tmp_path: Path) -> None:
    """A worker whose agent the run killed (reparented to init) is still the run's: it was seen in its tree."""
    rt = LocalRuntime(_info(tmp_path))
    try:
        agent = rt.start(ProcessSpec("agent", ["sh", "-c", "sleep 30 & wait"], role="agent"))
        _wait_for(lambda: len(process.tree([(agent.pid, agent.ticks)])) > 1)
        worker = next(pid for pid in process.tree([(agent.pid, agent.ticks)]) if pid != agent.pid)
        rt.signal_pid(agent.pid, signal.SIGKILL, agent.ticks)
        assert agent.exited.wait(5)
        _wait_for(lambda: psutil.Process(worker).ppid() != agent.pid)
        assert rt.signal_pid(worker, signal.SIGKILL, procutil.start_ticks(worker)) is not None
        _wait_for(lambda: not process.alive(worker))
    finally:
        rt.cleanup(grace_s=1)


def test_local_node_loss_refuses_a_tree_holding_a_foreign_process_and_touches_nothing(
    tmp_path: Path, stranger: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = LocalRuntime(_info(tmp_path))
    try:
        own = rt.start(ProcessSpec("agent1", ["sleep", "30"], node="node1"))
        real_tree = process.tree

        def tree_with_stranger(roots: Any) -> dict[int, psutil.Process]:  # a scan gone wrong
            return {**real_tree(roots), stranger.pid: psutil.Process(stranger.pid)}

        monkeypatch.setattr(process, "tree", tree_with_stranger)
        with pytest.raises(ForeignTarget) as err:
            rt.lose_nodes(["node1"], LocalNodeLossOptions(), [])
        _refused(err.value, f"pid {stranger.pid}", "was not started by this run", "killing it with node1")
        assert process.state(own.pid) != "stopped" and own.poll() is None  # nothing was frozen first
        assert process.state(stranger.pid) != "stopped" and stranger.poll() is None
    finally:
        rt.cleanup(grace_s=1)


# ---------------------------------------------------------------------------------------------- docker
class FakeContainer:
    """A container as the Docker SDK shows it, recording what is done to it."""

    def __init__(self, name: str, labels: dict[str, str], pid: int = 0) -> None:
        self.name = name
        self.id = name + "-id"
        self.status = "running"
        self.attrs: dict[str, Any] = {"Config": {"Labels": labels}, "State": {"Pid": pid}, "HostConfig": {}}
        self.calls: list[str] = []

    def reload(self) -> None:
        pass

    def pause(self) -> None:
        self.calls.append("pause")
        self.status = "paused"

    def unpause(self) -> None:
        self.calls.append("unpause")
        self.status = "running"

    def kill(self, signal: str = "SIGKILL") -> None:
        self.calls.append(f"kill {signal}")


def _docker(tmp_path: Path) -> tuple[DockerRuntime, FakeContainer, FakeContainer]:
    rt = DockerRuntime(_info(tmp_path))
    ours = FakeContainer("cb-x-node0", {"chaosbench.run": RUN, "chaosbench.node": "node0"})
    foreign = FakeContainer("someone-elses", {"chaosbench.run": "another-run"})
    foreign.status = "paused"
    rt.pool.provisioned = (
        True  # provisioned with these two as its nodes: node1's is the mix-up the guard is for
    )
    rt.pool.nodes = {"node0": Node("node0", ours), "node1": Node("node1", foreign)}
    return rt, ours, foreign


def test_docker_refuses_every_action_on_a_container_without_the_runs_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, ours, foreign = _docker(tmp_path)

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"ran {args[0] if args else kwargs.get('args')}")

    monkeypatch.setattr(subprocess, "run", no_process)  # no nsenter either
    monkeypatch.setattr(subprocess, "Popen", no_process)
    refusal = f"container someone-elses has no label chaosbench.run={RUN}; not "
    actions = {
        "pausing it": lambda: rt.pause_node("node1"),
        "unpausing it": lambda: rt.unpause_node("node1"),
        "killing it": lambda: rt.kill_node("node1"),
        "changing its CPU limit": lambda: rt.set_node_cpus("node1", 0.1),
        "entering its namespaces": lambda: rt.node_pid("node1"),
        "signalling it": lambda: rt.signal_pid(1, signal.SIGKILL, None, "node1"),
    }
    for doing, act in actions.items():
        with pytest.raises(ForeignTarget) as err:
            act()
        target = "pid 1" if doing == "signalling it" else None
        _refused(err.value, "container someone-elses", f"has no label chaosbench.run={RUN}", doing, target)
        assert str(err.value) == ("pid 1: " if target else "") + refusal + doing
    with pytest.raises(ChaosbenchError, match=refusal + "killing it"):
        rt.lose_nodes(["node1"], DockerNodeLossOptions(), [])
    with pytest.raises(
        ChaosbenchError, match=refusal + "signalling it"
    ):  # searched in every node: still refused
        rt.signal_pid(7, signal.SIGKILL)
    # through the injectors
    with pytest.raises(ChaosbenchError, match=refusal + "pausing it"):
        NodePauseInjector("pause", NodePauseParams()).inject(_ctx(tmp_path, rt, "node1"))
    with pytest.raises(ChaosbenchError, match=refusal + "killing it"):
        NodeKillInjector("lose", NodeKillParams()).inject(_ctx(tmp_path, rt, "node1"))
    with pytest.raises(ChaosbenchError, match=refusal + "entering its namespaces"):
        NetLossInjector("loss", NetLossParams(percent=50)).inject(_ctx(tmp_path, rt, "node1"))
    assert foreign.calls == [] and ours.calls == []
    assert rt.process_alive(1, None, "node1") is False  # a question, not an action: no, none of ours


def test_docker_acts_on_its_own_container(tmp_path: Path) -> None:
    rt, ours, foreign = _docker(tmp_path)
    assert rt.pause_node("node0") == "cb-x-node0" and rt.unpause_node("node0") is True
    assert rt.kill_node("node0", "SIGTERM") == "cb-x-node0"
    assert ours.calls == ["pause", "unpause", "kill SIGTERM"] and foreign.calls == []


def test_docker_refuses_a_node_that_is_not_the_runs(tmp_path: Path) -> None:
    rt, ours, foreign = _docker(tmp_path)
    with pytest.raises(ForeignTarget) as err:
        rt.signal_pid(1, signal.SIGKILL, None, "someone-elses")  # a container's name given as the node
    _refused(err.value, "'someone-elses'", "is not a node of this run", "signalling it", "pid 1")
    assert str(err.value) == "pid 1: 'someone-elses' is not a node of this run; not signalling it"
    with pytest.raises(ForeignTarget) as err:
        rt.pause_node("node7")
    _refused(err.value, "'node7'", "is not a node of this run", "pausing it")
    assert sorted(rt.pool.nodes) == ["node0", "node1"]  # and no container was created for it
    assert ours.calls == [] and foreign.calls == []


# ---------------------------------------------------------------------------------------------- slurm
class FakeSlurm(SlurmCommands):
    """squeue over jobs held here (id, name, comment, Slurm node), in the formats the runtime asks for."""

    def __init__(self, prefix: str, jobs: list[tuple[int, str, str, str]]) -> None:
        super().__init__({}, 5.0, None, prefix, RUN)
        self.jobs = jobs
        self.commands: list[list[str]] = []

    def command(
        self, argv: list[str], check: bool = True, timeout_s: float | None = None, extra_env: Any = None
    ) -> str:
        self.commands.append(argv)
        if argv[0] == "squeue" and "-w" in argv:
            node = argv[argv.index("-w") + 1]
            return "".join(f"{j}|{name}|{comment}\n" for j, name, comment, n in self.jobs if n == node)
        if argv[0] == "squeue":
            name = next((a.removeprefix("--name=") for a in argv if a.startswith("--name=")), None)
            fmt = argv[argv.index("-o") + 1]
            rows = [(j, n, c) for j, n, c, _ in self.jobs if name is None or n == name]
            if fmt == "%i|%k":
                return "".join(f"{j}|{c}\n" for j, _, c in rows)
            return "".join(f"{j}|{n}|RUNNING|{c}\n" for j, n, c in rows)
        raise AssertionError(f"unexpected command {argv}")


def _slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SlurmRuntime, FakeSlurm]:
    rt = SlurmRuntime(_info(tmp_path))
    ours, p = run_comment(RUN), rt.job_prefix
    fake = FakeSlurm(
        p,
        [
            (11, f"{p}.rank0", ours, "n1"),
            (99, "alice.train", "(null)", "n1"),
            (77, f"{p}.impostor", "(null)", "n2"),  # named like ours, not submitted by this run
        ],
    )
    rt.slurm = fake
    monkeypatch.setattr(rt, "slurm_node_now", {"node0": "n1", "node1": "n2"}.__getitem__)
    return rt, fake


def test_slurm_knows_its_jobs_by_name_and_comment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt, fake = _slurm(tmp_path, monkeypatch)
    assert fake.jobs_on("n1") == {11: f"{rt.job_prefix}.rank0"} and fake.jobs_on("n2") == {}
    assert fake.foreign_jobs_on("n2") == [77] and fake.foreign_jobs_on("n1") == [99]
    assert fake.our_jobs() == {11: f"{rt.job_prefix}.rank0"}
    assert (
        fake.job_id_named(f"{rt.job_prefix}.impostor") is None
        and fake.job_id_named(f"{rt.job_prefix}.rank0") == 11
    )
    with pytest.raises(ForeignTarget) as err:
        fake.our_jobs_on("n2", "signalling it", "pid 5")
    _refused(err.value, "Slurm node n2", "runs no job of this run", "signalling it", "pid 5")


def test_slurm_refuses_to_signal_where_no_job_of_the_run_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, fake = _slurm(tmp_path, monkeypatch)
    steps: list[list[str]] = []
    monkeypatch.setattr(slurm_runtime.subprocess, "run", lambda argv, **kw: steps.append(argv))
    with pytest.raises(ForeignTarget) as err:
        rt.signal_pid(4321, signal.SIGKILL, None, "node1")
    _refused(err.value, "Slurm node n2", "runs no job of this run", "signalling it", "pid 4321")
    assert str(err.value) == "pid 4321: Slurm node n2 runs no job of this run; not signalling it"
    assert steps == []  # no step was started on the node
    assert rt.process_alive(4321, None, "node1") is False


def test_slurm_checks_the_pid_against_exactly_its_jobs_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, fake = _slurm(tmp_path, monkeypatch)
    steps: list[list[str]] = []

    def helper_says_not_ours(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        steps.append(argv)
        return subprocess.CompletedProcess(argv, 5, "", "")

    monkeypatch.setattr(slurm_runtime.subprocess, "run", helper_says_not_ours)
    with pytest.raises(ForeignTarget) as err:
        rt.signal_pid(4321, signal.SIGKILL, None, "node0")
    _refused(err.value, "pid 4321 on n1", "is not in a job of this run", "signalling it")
    (step,) = steps
    assert step[:4] == ["srun", "-Q", "--jobid=11", "--overlap"]  # a step of our job, not of alice's
    assert step[-2:] == ["n1", "11"]  # and the helper checks the pid against our job only


def test_slurm_node_loss_refuses_a_node_with_only_an_impostor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, fake = _slurm(tmp_path, monkeypatch)
    restorable: list[str] = []
    with pytest.raises(ForeignTarget) as err:
        rt.lose_nodes(["node1"], SlurmNodeLossOptions(state="drain"), restorable)
    _refused(err.value, "Slurm node n2", "runs no job of this run", "touching it")
    with pytest.raises(ForeignTarget) as err:
        rt.lose_nodes(["node0"], SlurmNodeLossOptions(), restorable)
    _refused(err.value, "Slurm node n1", "also runs jobs of others ([99])", "touching it")
    assert restorable == [] and not any(
        c[:2] == ["scontrol", "update"] or c[0] == "srun" for c in fake.commands
    )


def test_slurm_cancels_only_batch_jobs_it_submitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt, fake = _slurm(tmp_path, monkeypatch)
    with pytest.raises(ForeignTarget) as err:
        rt.cancel_batch(99)
    _refused(err.value, "Slurm job 99", "was not submitted by this run", "cancelling it")
    assert not any(c[0] == "scancel" for c in fake.commands)


@pytest.mark.parametrize("arg", ["--comment=mine", "--job-name=x", "-Jx"])
def test_slurm_options_may_not_rename_or_recomment_the_runs_jobs(arg: str) -> None:
    with pytest.raises(ValidationError, match="names and comments every job itself"):
        SlurmOptions(srun_args=[arg])
    with pytest.raises(ValidationError, match="names and comments every job itself"):
        SlurmOptions(sbatch_args=[arg])


def test_slurm_cleanup_of_a_crashed_run_cancels_only_that_runs_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = SlurmRuntime(_info(tmp_path)).job_prefix
    monkeypatch.setattr(slurm_cleanup, "crashed_run_ids", lambda d: {RUN: tmp_path})
    monkeypatch.setattr(slurm_cleanup.shutil, "which", lambda name: "/usr/bin/" + name)
    cancelled: list[list[str]] = []

    def command(self: SlurmCommands, argv: list[str], check: bool = True, **kw: Any) -> str:
        if argv[0] == "scancel":
            cancelled.append(argv)
            return ""
        return f"11|{prefix}.rank0|{run_comment(RUN)}\n77|{prefix}.impostor|(null)\n99|alice.train|(null)\n"

    monkeypatch.setattr(SlurmCommands, "command", command)
    assert slurm_cleanup.cleanup_stale_jobs(tmp_path) == [
        f"scancel Slurm job 11 ({prefix}.rank0) of {tmp_path}"
    ]
    assert cancelled == [["scancel", "11"]]


FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_slurm_cleanup_of_crashed_runs_resumes_only_the_nodes_they_set_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # canned `scontrol show node -o`: n2 DOWN and n3 DRAIN by two crashed runs, n4 DOWN by a run that is not
    # among them (another harness's, still running), n5 drained by an operator, n1 in use
    canned = (FIXTURES / "slurm" / "scontrol_show_node_crashed.txt").read_text().splitlines()
    lines = {line.split()[0].removeprefix("NodeName="): line for line in canned}
    crashed = {
        "crash-slurm-restart__down-0-4f1c2a9e": tmp_path / "down",
        "crash-slurm-restart__drain-0-9b0d7c11": tmp_path / "drain",
    }
    monkeypatch.setattr(slurm_cleanup, "crashed_run_ids", lambda d: crashed)
    monkeypatch.setattr(slurm_cleanup.shutil, "which", lambda name: "/usr/bin/" + name)
    commands: list[list[str]] = []

    def command(self: SlurmCommands, argv: list[str], check: bool = True, **kw: Any) -> str:
        commands.append(argv)
        if argv[:4] == ["scontrol", "show", "node", "-o"]:
            names = argv[4].split(",") if len(argv) > 4 else list(lines)
            return "".join(lines[n] + "\n" for n in names)
        if argv[:2] == ["scontrol", "update"]:
            node = argv[2].removeprefix("nodename=")
            lines[node] = lines[node].split(" Reason=")[0].replace("State=DOWN+NOT_RESPONDING", "State=IDLE")
            return ""
        if argv[0] == "squeue":
            return ""  # no job of theirs left
        raise AssertionError(f"unexpected command {argv}")

    monkeypatch.setattr(SlurmCommands, "command", command)
    actions = SlurmRuntime.cleanup_crashed(tmp_path)
    assert actions == [
        f"scontrol update nodename=n2 state=RESUME (was DOWN+NOT_RESPONDING) of {tmp_path / 'down'}",
        f"scontrol update nodename=n3 state=RESUME (was MIXED+DRAIN) of {tmp_path / 'drain'}",
    ]
    updates = [c for c in commands if c[:2] == ["scontrol", "update"]]
    assert updates == [
        ["scontrol", "update", "nodename=n2", "state=RESUME"],
        ["scontrol", "update", "nodename=n3", "state=RESUME"],
    ]
    # resumed: nothing left to do the second time
    assert SlurmRuntime.cleanup_crashed(tmp_path) == []


def test_slurm_cleanup_leaves_a_node_whose_reason_changed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator took over the node between the listing and the resume: it keeps its state."""
    canned = (FIXTURES / "slurm" / "scontrol_show_node_crashed.txt").read_text().splitlines()
    n2 = next(line for line in canned if line.startswith("NodeName=n2 "))
    monkeypatch.setattr(
        slurm_cleanup, "crashed_run_ids", lambda d: {"crash-slurm-restart__down-0-4f1c2a9e": tmp_path}
    )
    monkeypatch.setattr(slurm_cleanup.shutil, "which", lambda name: "/usr/bin/" + name)
    listings: list[str] = [n2, n2.split(" Reason=")[0] + " Reason=bad fan [root@2026-12-04T14:31:09]"]

    def command(self: SlurmCommands, argv: list[str], check: bool = True, **kw: Any) -> str:
        if argv[:4] == ["scontrol", "show", "node", "-o"]:
            return listings.pop(0) + "\n"
        raise AssertionError(f"unexpected command {argv}")

    monkeypatch.setattr(SlurmCommands, "command", command)
    assert slurm_cleanup.resume_stale_nodes(tmp_path) == [] and listings == []
