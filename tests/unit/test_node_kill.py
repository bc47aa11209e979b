"""``node-kill``, the one node-loss injector: its other names, which options each runtime takes (refused when the
suite loads and again before launch), and each runtime's node loss: local processes really frozen and killed,
docker's engine stamp (engine calls stubbed), Slurm's down/drain/kill/resume against a small fake cluster
(the Slurm client commands answered in their own output format)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.fleet import fault_class
from chaosbench.cli import main
from chaosbench.errors import ChaosbenchError, SpecError, Unsupported
from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup
from chaosbench.injectors.node_kill import NodeKillInjector, NodeKillParams
from chaosbench.registry import INJECTORS, RUNTIMES, Registry
from chaosbench.runtimes import process
from chaosbench.runtimes.base import NodeLoss, NodeRestore, ProcessSpec, ProcHandle, RunInfo, Runtime
from chaosbench.runtimes.docker import DockerNodeLossOptions, DockerRuntime
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.runtimes.slurm import SlurmCommands, SlurmNodeLossOptions, SlurmRuntime
from chaosbench.runtimes.slurm.node_loss import down_nodes, resume_nodes
from chaosbench.timeline import TimelineWriter
from tests.conftest import make_suite

NAMES = ("node-kill", "local-node-kill", "slurm-node-down")


# ---------------------------------------------------------------------------------------------- the names
def test_the_old_names_are_aliases_of_node_kill() -> None:
    assert {INJECTORS.get(n) for n in NAMES} == {NodeKillInjector}
    assert INJECTORS.alias_of("local-node-kill") == INJECTORS.alias_of("slurm-node-down") == "node-kill"
    assert INJECTORS.alias_of("node-kill") is None and INJECTORS.alias_of("kill") is None
    assert set(NAMES) <= set(INJECTORS.names())


def test_faults_listing_says_which_names_are_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "local-node-kill: alias of node-kill" in lines and "slurm-node-down: alias of node-kill" in lines
    at = next(i for i, ln in enumerate(lines) if ln.startswith("node-kill: "))
    options = {ln.split()[0] for ln in lines[at + 1 :] if ln.startswith("    ")}
    assert {"signal", "state", "kill_tasks", "allow_foreign_jobs", "duration_s"} <= options


@pytest.mark.parametrize("name", NAMES)
def test_every_name_of_a_lost_node_is_the_node_fault_class(name: str) -> None:
    assert fault_class({"injector": name}) == "node"  # a legacy event, without its declared class
    assert INJECTORS.get(name)("lose", NodeKillParams()).fault_class == "node"


def test_an_alias_is_neither_replaced_nor_dangling() -> None:
    reg: Registry[object] = Registry(
        "thing", "chaosbench.test-none", {"a": "chaosbench.timeline:Event"}, {"b": "a"}
    )
    assert reg.names() == ["a", "b"] and reg.get("b") is reg.get("a")
    with pytest.raises(ChaosbenchError, match="already registered"):
        reg.register("b", dict)
    with pytest.raises(ChaosbenchError, match="alias 'c'"):
        Registry("thing", "chaosbench.test-none", {"a": "chaosbench.timeline:Event"}, {"c": "nope"})


# ---------------------------------------------------------------------------------------------- options
def _suite(runtime: str, injector: str, params: dict[str, Any]) -> str:
    shown = "{" + ", ".join(f"{k}: {v}" for k, v in params.items()) + "}"
    return f"""\
    name: n
    defaults:
      runtime: {runtime}
      workload: {{name: ddp-mlp, ranks: 2, nodes: 2, steps: 20}}
    faults:
      lose:
        injector: {injector}
        target: {{node: node1}}
        trigger: {{at_step: 5}}
        params: {shown}
    matrix: {{frameworks: [restart], faults: [lose]}}
    """


@pytest.mark.parametrize(
    ("runtime", "injector", "params"),
    [
        ("local", "local-node-kill", {}),
        ("local", "node-kill", {}),
        ("docker", "node-kill", {"signal": "term"}),
        (
            "slurm",
            "slurm-node-down",
            {"state": "drain", "kill_tasks": "true", "duration_s": 5, "allow_foreign_jobs": "true"},
        ),
        ("slurm", "node-kill", {"state": "down"}),
    ],
)
def test_each_runtime_takes_its_own_options(runtime: str, injector: str, params: dict[str, Any]) -> None:
    make_suite(_suite(runtime, injector, params))


@pytest.mark.parametrize(
    ("runtime", "injector", "params", "problem"),
    [
        (
            "slurm",
            "slurm-node-down",
            {"signal": "SIGTERM"},
            "node-kill on the slurm runtime takes no option 'signal'; "
            "its options: state, kill_tasks, allow_foreign_jobs, duration_s",
        ),
        (
            "docker",
            "node-kill",
            {"state": "drain"},
            "node-kill on the docker runtime takes no option 'state'; its options: signal",
        ),
        (
            "docker",
            "node-kill",
            {"duration_s": 5},
            "node-kill on the docker runtime takes no option 'duration_s' (a node it lost is not restored); "
            "its options: signal",
        ),
        (
            "docker",
            "node-kill",
            {"signal": "SIGNOPE"},
            "node-kill on the docker runtime: signal: unknown signal 'SIGNOPE'",
        ),
        (
            "local",
            "local-node-kill",
            {"kill_tasks": "true"},
            "node-kill on the local runtime takes no option 'kill_tasks'; its options: none",
        ),
        (
            "local",
            "local-node-kill",
            {"signal": "SIGKILL"},
            "node-kill on the local runtime takes no option 'signal'; its options: none",
        ),
    ],
)
def test_an_option_of_another_runtime_fails_the_suite_in_one_line(
    runtime: str, injector: str, params: dict[str, Any], problem: str
) -> None:
    with pytest.raises(SpecError) as err:
        make_suite(_suite(runtime, injector, params))
    assert str(err.value) == f"test.yaml:10: fault 'lose': {problem}"


def test_a_value_no_runtime_takes_is_refused_where_it_is_written() -> None:
    with pytest.raises(SpecError) as err:
        make_suite(_suite("slurm", "node-kill", {"state": "off"}))
    assert str(err.value) == "test.yaml:10: fault 'lose': state: Input should be 'down' or 'drain'"


class _NoNodes(Runtime):
    """A runtime without node loss (nothing here is ever started)."""

    name = "test-no-node-loss"

    def free_port(self) -> int:
        return 0

    def start(self, spec: ProcessSpec, on_line: Any = None) -> ProcHandle:
        raise NotImplementedError

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        raise NotImplementedError

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        pass

    def cleanup(self, grace_s: float = 5.0) -> None:
        pass


def test_a_runtime_that_cannot_lose_nodes_fails_the_suite() -> None:
    if _NoNodes.name not in RUNTIMES.names():
        RUNTIMES.register(_NoNodes.name, _NoNodes)
    assert not issubclass(_NoNodes, NodeLoss)
    with pytest.raises(SpecError) as err:
        make_suite(_suite(_NoNodes.name, "local-node-kill", {}))
    assert str(err.value) == (
        "test.yaml:10: fault 'lose': node-kill needs a runtime that can lose a node, "
        "and runtime 'test-no-node-loss' cannot"
    )


def _setup(tmp_path: Path, runtime: Runtime) -> RunSetup:
    return RunSetup(
        run_id="run-1",
        run_dir=tmp_path,
        ckpt_dir=tmp_path / "ckpt",
        runtime=runtime,
        timeline=runtime.run.timeline,
        rng=random.Random(0),
        ranks=2,
        nodes=2,
    )


def _info(tmp_path: Path) -> RunInfo:
    return RunInfo("run-1", tmp_path, TimelineWriter(tmp_path / "events.jsonl"))


def test_prepare_refuses_what_the_runtime_it_gets_does_not_take(tmp_path: Path) -> None:
    injector = NodeKillInjector("lose", NodeKillParams(signal="SIGTERM"))
    with pytest.raises(Unsupported) as err:
        injector.prepare(_setup(tmp_path, SlurmRuntime(_info(tmp_path))))
    assert str(err.value) == (
        "fault 'lose': node-kill on the slurm runtime takes no option 'signal'; "
        "its options: state, kill_tasks, allow_foreign_jobs, duration_s"
    )
    with pytest.raises(Unsupported, match="fault 'lose': node-kill needs a runtime that can lose a node"):
        NodeKillInjector("lose", NodeKillParams()).prepare(_setup(tmp_path, _NoNodes(_info(tmp_path))))


def test_runtime_defaults_apply_to_options_left_out() -> None:
    assert SlurmNodeLossOptions() == SlurmNodeLossOptions(
        state="down", kill_tasks=None, allow_foreign_jobs=False
    )
    assert (
        DockerNodeLossOptions().signal == "SIGKILL"
        and DockerNodeLossOptions(signal="term").signal == "SIGTERM"
    )
    assert NodeKillInjector("lose", NodeKillParams(duration_s=3)).duration_s == 3
    assert NodeKillInjector("lose", NodeKillParams()).failure_mode == "crash"


def _ctx(tmp_path: Path, runtime: Runtime, *nodes: str) -> FaultContext:
    targets = [
        ResolvedTarget(rank=i, pid=None, pid_ticks=None, node=n, incarnation=0) for i, n in enumerate(nodes)
    ]
    return FaultContext(
        runtime=runtime,
        timeline=runtime.run.timeline,
        targets=targets,
        rng=random.Random(0),
        setup=_setup(tmp_path, runtime),
    )


# ---------------------------------------------------------------------------------------------- local
def _wait_for(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_local_node_loss_freezes_and_kills_the_whole_tree_of_that_node_only(tmp_path: Path) -> None:
    rt = LocalRuntime(_info(tmp_path))
    try:
        agent = rt.start(ProcessSpec("agent1", ["sh", "-c", "sleep 30 & wait"], role="agent", node="node1"))
        other = rt.start(
            ProcessSpec("agent0", [sys.executable, "-c", "import time; time.sleep(30)"], node="node0")
        )
        _wait_for(lambda: len(process.tree([(agent.pid, agent.ticks)])) > 1)
        child = next(pid for pid in process.tree([(agent.pid, agent.ticks)]) if pid != agent.pid)
        injector = INJECTORS.get("local-node-kill")("lose", NodeKillParams())
        injector.prepare(_setup(tmp_path, rt))
        ctx = _ctx(tmp_path, rt, "node1", "node1")
        details = injector.inject(ctx)
        assert details == {"nodes": ["node1"], "pids": {"node1": sorted([agent.pid, child])}}
        assert agent.exited.wait(5) and agent.returncode == -9
        _wait_for(lambda: not process.alive(child))
        assert other.poll() is None  # node0 is untouched
        assert injector.revert(ctx) is False  # nothing brings a local node back
        with pytest.raises(ProcessLookupError):
            injector.inject(_ctx(tmp_path, rt, "node1"))
    finally:
        rt.cleanup(grace_s=1)
    assert rt.leftovers() == []


# ---------------------------------------------------------------------------------------------- docker
def test_docker_node_loss_kills_the_container_and_takes_the_engines_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = DockerRuntime(_info(tmp_path))
    killed: list[tuple[str, str]] = []
    monkeypatch.setattr(rt, "kill_node", lambda name, sig: killed.append((name, sig)) or f"cb-{name}")
    monkeypatch.setattr(
        rt, "engine_event_ns", lambda c, action, since, timeout_s=5.0: 1234 if action == "die" else None
    )
    injector = NodeKillInjector("lose", NodeKillParams(signal="term"))
    injector.prepare(_setup(tmp_path, rt))
    ctx = _ctx(tmp_path, rt, "node1")
    assert injector.inject(ctx) == {
        "containers": {"node1": "cb-node1"},
        "signal": "SIGTERM",
        "effect_t_ns": 1234,
        "effect": "the engine's 'die' event: the container died",
    }
    assert killed == [("node1", "SIGTERM")]
    assert not isinstance(rt, NodeRestore) and injector.revert(ctx) is False
    monkeypatch.setattr(rt, "engine_event_ns", lambda c, action, since, timeout_s=5.0: None)
    details = NodeKillInjector("lose", NodeKillParams()).inject(_ctx(tmp_path, rt, "node0"))
    assert details["signal"] == "SIGKILL" and "no 'die' event seen" in details["effect"]


# ---------------------------------------------------------------------------------------------- slurm
class FakeCluster(SlurmCommands):
    """Slurm's client commands over a few nodes and jobs held here, answering in Slurm's own formats."""

    def __init__(
        self, prefix: str, jobs: list[tuple[int, str, str]], nodes: tuple[str, ...] = ("n1", "n2")
    ) -> None:
        super().__init__({}, 5.0, None, prefix)
        self.jobs = jobs  # (job id, job name, Slurm node)
        self.nodes = {n: {"State": "ALLOCATED", "Reason": "None"} for n in nodes}
        self.updates: list[list[str]] = []
        self.sruns: list[list[str]] = []
        self.refuse_update: set[str] = set()

    def command(
        self, argv: list[str], check: bool = True, timeout_s: float | None = None, extra_env: Any = None
    ) -> str:
        if argv[0] == "squeue":
            node = argv[argv.index("-w") + 1]
            return "".join(f"{j}|{name}\n" for j, name, n in self.jobs if n == node)
        if argv[:3] == ["scontrol", "show", "node"]:
            return "".join(
                f"NodeName={n} Arch=x86_64 State={self.nodes[n]['State']} Partitions=debug "
                f"Reason={self.nodes[n]['Reason']}\n"
                for n in argv[4].split(",")
            )
        if argv[:2] == ["scontrol", "update"]:
            kv = dict(a.split("=", 1) for a in argv[2:])
            node = kv["nodename"]
            if node in self.refuse_update:
                raise ChaosbenchError("'scontrol update nodename' failed: Invalid user for SlurmUser")
            self.updates.append(argv)
            if kv["state"] == "RESUME":
                self.nodes[node] = {"State": "IDLE", "Reason": "None"}
            else:
                self.nodes[node] = {
                    "State": {"DOWN": "DOWN", "DRAIN": "ALLOCATED+DRAIN"}[kv["state"]],
                    "Reason": f"{kv['reason']} [slurm@2026-11-30T10:00:00]",
                }
            return ""
        if argv[0] == "srun":
            self.sruns.append(argv)
            return "4242\n4243\n1764500000000000000\n"
        raise AssertionError(f"unexpected command {argv}")


def _slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: list[tuple[int, str, str]]) -> SlurmRuntime:
    rt = SlurmRuntime(_info(tmp_path))
    rt.slurm = FakeCluster(
        rt.job_prefix, [(j, name.replace("OURS", rt.job_prefix), n) for j, name, n in jobs]
    )
    monkeypatch.setattr(rt, "slurm_node_now", {"node0": "n1", "node1": "n2"}.__getitem__)
    return rt


def test_slurm_node_down_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = _slurm(tmp_path, monkeypatch, [(11, "OURS.rank0", "n1"), (12, "OURS.rank1", "n2")])
    fake = rt.slurm
    assert isinstance(fake, FakeCluster) and isinstance(rt, NodeRestore)
    injector = INJECTORS.get("slurm-node-down")("lose", NodeKillParams(duration_s=2))
    injector.prepare(_setup(tmp_path, rt))
    assert injector.duration_s == 2
    ctx = _ctx(tmp_path, rt, "node1")
    details = injector.inject(ctx)
    assert details == {
        "slurm_nodes": ["n2"],
        "state": "down",
        "killed": {},
        "before": {"n2": "ALLOCATED"},
        "after": {"n2": "DOWN"},
    }
    assert fake.updates == [["scontrol", "update", "nodename=n2", "state=DOWN", "reason=chaosbench run-1"]]
    assert fake.sruns == []  # down: the scheduler's own node-failure handling, no kill first
    assert injector.revert(ctx) is True
    assert fake.updates[-1] == ["scontrol", "update", "nodename=n2", "state=RESUME"]
    assert injector.revert(ctx) is False and len(fake.updates) == 2  # idempotent


def test_slurm_drain_kills_the_runs_tasks_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = _slurm(tmp_path, monkeypatch, [(12, "OURS.rank1", "n2"), (13, "OURS.agent1", "n2")])
    fake = rt.slurm
    assert isinstance(fake, FakeCluster)
    details = NodeKillInjector("lose", NodeKillParams(state="drain")).inject(_ctx(tmp_path, rt, "node1"))
    assert details["killed"] == {"n2": [4242, 4243]} and details["after"] == {"n2": "ALLOCATED+DRAIN"}
    (srun,) = fake.sruns
    assert srun[:8] == ["srun", "-Q", "--jobid=13", "--overlap", "-w", "n2", "-N1", "-n1"] and srun[-3:] == [
        "n2",
        "12",
        "13",
    ]
    # and not when told so
    rt2 = _slurm(tmp_path, monkeypatch, [(12, "OURS.rank1", "n2")])
    NodeKillInjector("lose", NodeKillParams(state="drain", kill_tasks=False)).inject(
        _ctx(tmp_path, rt2, "node1")
    )
    assert isinstance(rt2.slurm, FakeCluster) and rt2.slurm.sruns == []


def test_slurm_refuses_a_node_that_is_not_ours_to_break(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = _slurm(
        tmp_path, monkeypatch, [(11, "OURS.rank0", "n1"), (12, "OURS.rank1", "n2"), (99, "alice.train", "n2")]
    )
    fake = rt.slurm
    assert isinstance(fake, FakeCluster)
    with pytest.raises(
        ChaosbenchError, match=r"Slurm node n2 also runs jobs of others \(\[99\]\); not touching it"
    ):
        NodeKillInjector("lose", NodeKillParams()).inject(_ctx(tmp_path, rt, "node0", "node1"))
    assert fake.updates == []  # every node is checked before any is touched: n1 is not down either
    details = NodeKillInjector("lose", NodeKillParams(allow_foreign_jobs=True)).inject(
        _ctx(tmp_path, rt, "node1")
    )
    assert details["after"] == {"n2": "DOWN"}
    idle = _slurm(tmp_path, monkeypatch, [(11, "OURS.rank0", "n1")])
    with pytest.raises(ChaosbenchError, match="Slurm node n2 runs no job of this run; not touching it"):
        NodeKillInjector("lose", NodeKillParams()).inject(_ctx(tmp_path, idle, "node1"))


def test_slurm_resumes_only_while_our_reason_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = _slurm(tmp_path, monkeypatch, [(11, "OURS.rank0", "n1"), (12, "OURS.rank1", "n2")])
    fake = rt.slurm
    assert isinstance(fake, FakeCluster)
    injector = NodeKillInjector("lose", NodeKillParams())
    ctx = _ctx(tmp_path, rt, "node1")
    injector.inject(ctx)
    fake.nodes["n2"]["Reason"] = "bad DIMM [root@2026-11-30T10:01:00]"  # an operator took over the node
    assert injector.revert(ctx) is False
    assert fake.updates[-1][-1] != "state=RESUME"


def test_slurm_restores_what_was_down_before_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCluster("p", [(11, "p.rank0", "n1"), (12, "p.rank1", "n2")])
    fake.refuse_update.add("n2")
    restorable: list[str] = []
    with pytest.raises(ChaosbenchError, match="Invalid user"):
        down_nodes(fake, ["n1", "n2"], SlurmNodeLossOptions(), "run-1", restorable)
    assert restorable == ["n1"] and fake.nodes["n1"]["State"] == "DOWN"
    assert resume_nodes(fake, restorable, "run-1") is True and fake.nodes["n1"]["State"] == "IDLE"
