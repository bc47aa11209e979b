"""Triggers and targets of the fault controller, on synthetic event streams (no processes)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from chaosbench.fault_control import FaultController
from chaosbench.injectors.base import RunSetup
from chaosbench.injectors.kill import KillInjector, KillParams
from chaosbench.runtimes.base import RunInfo
from chaosbench.specs import FaultSpec
from chaosbench.testing.fakes import RecordingRuntime
from chaosbench.timeline import Event, TimelineWriter, read_events


def controller(tmp_path: Path, fault: dict, ranks: int = 4, nodes: int = 2, seed: int = 5):
    writer = TimelineWriter(tmp_path / "events.jsonl")
    rt = RecordingRuntime(RunInfo("r", tmp_path, writer))
    spec = FaultSpec.model_validate({"injector": "kill", **fault})
    setup = RunSetup(
        "r", tmp_path, tmp_path / "ck", rt, writer, random.Random(seed), ranks, nodes, spec.target
    )
    c = FaultController("f", spec, KillInjector("f", KillParams()), setup, seed)
    return c, rt, writer


def ev(kind: str, t: int = 0, **data) -> Event:
    return Event(t_ns=t, kind=kind, src="rank", data=data)


def start(c: FaultController, inc: int = 0, ranks: int = 4, per_node: int = 2) -> None:
    for r in range(ranks):
        c(
            ev(
                "rank_start",
                rank=r,
                pid=1000 + 10 * inc + r,
                world_size=ranks,
                node=f"node{r // per_node}",
                incarnation=inc,
            )
        )


def steps(c: FaultController, lo: int, hi: int, inc: int = 0) -> None:
    for s in range(lo, hi + 1):
        c(ev("step", step=s, rank=0, incarnation=inc))


def fired_pids(rt: RecordingRuntime) -> list[int]:
    return [pid for pid, sig in rt.signals if sig == signal.SIGKILL]


def test_at_step_fires_once_at_the_current_incarnation(tmp_path: Path) -> None:
    c, rt, _ = controller(tmp_path, {"target": 1, "trigger": {"at_step": 5}})
    start(c)
    steps(c, 1, 4)
    assert rt.signals == []
    steps(c, 5, 9)
    start(c, inc=1)
    steps(c, 1, 9, inc=1)
    assert fired_pids(rt) == [1001]


def test_at_step_with_max_fires_hits_each_incarnation(tmp_path: Path) -> None:
    c, rt, _ = controller(tmp_path, {"target": 1, "trigger": {"at_step": 5, "max_fires": 2}})
    for inc in range(3):
        start(c, inc=inc)
        steps(c, 1, 6, inc=inc)
    assert fired_pids(rt) == [1001, 1011]


def test_every_steps_and_targets(tmp_path: Path) -> None:
    c, rt, _ = controller(tmp_path, {"target": {"node": "node1"}, "trigger": {"every_steps": 3}})
    start(c)
    steps(c, 1, 9)
    assert fired_pids(rt) == [1002, 1003] * 3  # steps 3, 6, 9; both ranks of node1
    c2, rt2, _ = controller(tmp_path / "b", {"target": [0, 3], "trigger": {"every_steps": 4, "max_fires": 1}})
    start(c2)
    steps(c2, 1, 12)
    assert fired_pids(rt2) == [1000, 1003]
    c3, rt3, _ = controller(tmp_path / "c", {"target": "all", "trigger": {"at_step": 1}})
    start(c3)
    steps(c3, 1, 1)
    assert sorted(fired_pids(rt3)) == [1000, 1001, 1002, 1003]


def test_on_event_with_filters(tmp_path: Path) -> None:
    c, rt, _ = controller(
        tmp_path, {"target": 2, "trigger": {"on_event": {"kind": "ckpt_save_begin", "step": 20}}}
    )
    start(c)
    c(ev("ckpt_save_begin", step=10, rank=0, incarnation=0))
    assert rt.signals == []
    c(ev("ckpt_save_begin", step=20, rank=0, incarnation=0))
    c(ev("ckpt_save_begin", step=20, rank=1, incarnation=0))
    assert fired_pids(rt) == [1002]


def test_start_of_incarnation_and_delay(tmp_path: Path) -> None:
    c, rt, w = controller(
        tmp_path,
        {
            "target": 0,
            "trigger": {"on_event": {"kind": "rank_start", "incarnation": 1, "rank": 0}, "delay_s": 0.2},
        },
    )
    start(c)
    assert rt.signals == []
    start(c, inc=1)
    assert rt.signals == []  # delayed
    time.sleep(0.4)
    assert fired_pids(rt) == [1010]
    w.close()
    inject = [e for e in read_events(tmp_path / "events.jsonl") if e.kind == "fault_inject"]
    assert len(inject) == 1 and "+ 0.2 s" in inject[0]["trigger"]


def test_random_target_is_seeded(tmp_path: Path) -> None:
    picks = []
    for i in range(2):
        c, rt, _ = controller(tmp_path / str(i), {"target": "random", "trigger": {"every_steps": 1}}, seed=42)
        start(c)
        steps(c, 1, 8)
        picks.append(fired_pids(rt))
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


def test_poisson_schedule_replays_for_the_same_seed(tmp_path: Path) -> None:
    def schedule(sub: str, seed: int) -> list[float]:
        c, rt, w = controller(
            tmp_path / sub, {"target": 0, "trigger": {"poisson": {"mtbf_s": 0.05}, "max_fires": 5}}, seed=seed
        )
        start(c)
        steps(c, 1, 1)
        time.sleep(1.0)
        c.close()
        w.close()
        t = [e.t_ns for e in read_events(tmp_path / sub / "events.jsonl") if e.kind == "fault_inject"]
        assert len(t) == 5
        return [(b - a) / 1e9 for a, b in zip(t, t[1:], strict=False)]

    a, b = schedule("a", 9), schedule("b", 9)
    assert a == pytest.approx(b, abs=0.03)  # same gaps, up to timer jitter
    gaps = random.Random(9)
    expected = [gaps.expovariate(1 / 0.05) for _ in range(5)][1:]
    assert a == pytest.approx(expected, abs=0.03)


def test_missing_rank_is_skipped_not_crashed(tmp_path: Path) -> None:
    c, rt, w = controller(tmp_path, {"target": 3, "trigger": {"at_step": 1}})
    c(ev("rank_start", rank=0, pid=1, world_size=4, node="node0", incarnation=0))
    steps(c, 1, 1)
    w.close()
    skipped = [e for e in read_events(tmp_path / "events.jsonl") if e.kind == "fault_skipped"]
    assert rt.signals == [] and "rank 3 has not reported" in skipped[0]["reason"]


def test_step_trigger_waits_until_every_stepping_rank_reported(tmp_path: Path) -> None:
    c, rt, _ = controller(tmp_path, {"target": 1, "trigger": {"at_step": 3}}, ranks=2, nodes=1)
    start(c, ranks=2)
    for s in (1, 2):
        for r in (0, 1):
            c(ev("step", step=s, rank=r, incarnation=0))
    c(ev("step", step=3, rank=0, incarnation=0))
    assert rt.signals == []  # rank 1 has not finished step 3: not a job step yet
    c(ev("step", step=3, rank=1, incarnation=0))
    assert fired_pids(rt) == [1001]


def test_on_phase_waits_for_another_faults_recovery(tmp_path: Path) -> None:
    c, rt, _ = controller(tmp_path, {"target": 1, "trigger": {"on_phase": "restore"}})
    start(c)
    c(ev("ckpt_load_begin", step=10, rank=1, incarnation=0))  # a load before any fault: no recovery
    c(ev("fault_inject", fault="f", injector="kill"))  # its own firing is no other fault's
    c(ev("ckpt_load_begin", step=10, rank=1, incarnation=0))
    assert rt.signals == []
    c(ev("fault_inject", fault="first", injector="kill"))
    start(c, inc=1)
    c(ev("ckpt_load_begin", step=10, rank=0, incarnation=1))
    c(ev("ckpt_load_begin", step=10, rank=1, incarnation=1))
    assert fired_pids(rt) == [1011]  # once: the newest incarnation's rank 1
    c2, rt2, _ = controller(tmp_path / "b", {"target": 0, "trigger": {"on_phase": "rendezvous"}})
    start(c2)
    c2(ev("fault_inject", fault="first", injector="kill"))
    c2(ev("detect", framework="restart"))
    assert rt2.signals == []
    start(c2, inc=1)
    assert fired_pids(rt2) == [1010]


def test_on_phase_needs_another_fault_and_heal_needs_torchft() -> None:
    from chaosbench.errors import SpecError
    from tests.conftest import make_suite

    suite = """\
name: x
defaults: {{workload: {{name: ddp-mlp, ranks: 2}}}}
frameworks: {{restart: {{}}}}
faults:
  kill: {{injector: kill, target: 1, trigger: {{at_step: 5}}}}
  again: {{injector: kill, target: 1, trigger: {{on_phase: {phase}}}}}
matrix: {{frameworks: [restart], faults: [{faults}]}}
"""
    with pytest.raises(
        SpecError,
        match=r"suites/x.yaml:.*fault 'again' fires on the restore phase of another "
        r"fault's recovery; run it with one",
    ):
        make_suite(suite.format(phase="restore", faults="again"), "suites/x.yaml")
    with pytest.raises(SpecError, match="heal phase, which framework 'restart' does not have"):
        make_suite(suite.format(phase="heal", faults="[kill, again]"), "suites/x.yaml")
    make_suite(suite.format(phase="restore", faults="[kill, again]"), "suites/x.yaml")


def test_role_targets_resolve_to_the_frameworks_processes(tmp_path: Path) -> None:
    from chaosbench.frameworks.torchrun import TorchrunFramework

    c, rt, _ = controller(tmp_path, {"target": {"role": "agent"}, "trigger": {"at_step": 2}})
    c.setup.roles = dict(TorchrunFramework.roles)
    for pid, node in ((500, "node0"), (501, "node1")):
        c(ev("proc_start", proc=f"agent.{node}", pid=pid, role="agent", node=node, incarnation=0))
    start(c)
    steps(c, 1, 2)
    assert fired_pids(rt) == [500]  # node0's agent by default
    c2, rt2, _ = controller(
        tmp_path / "b", {"target": {"role": "agent", "node": "node1"}, "trigger": {"at_step": 2}}
    )
    c2.setup.roles = dict(TorchrunFramework.roles)
    c2(ev("proc_start", proc="agent.node1", pid=501, role="agent", node="node1", incarnation=0))
    c2(ev("proc_start", proc="agent.node0", pid=500, role="agent", node="node0", incarnation=0))
    start(c2)
    steps(c2, 1, 2)
    assert fired_pids(rt2) == [501]
    c3, rt3, w3 = controller(tmp_path / "c", {"target": {"role": "rank0"}, "trigger": {"at_step": 2}})
    c3.setup.roles = dict(TorchrunFramework.roles)
    start(c3)
    steps(c3, 1, 2)
    w3.close()
    assert fired_pids(rt3) == [1000]
    (inject,) = [e for e in read_events(tmp_path / "c" / "events.jsonl") if e.kind == "fault_inject"]
    assert inject["target"] == [{"rank": 0, "pid": 1000, "node": "node0", "incarnation": 0, "role": "rank0"}]
    from chaosbench.frameworks.nvrx import NvrxFramework

    c4, rt4, _ = controller(
        tmp_path / "d", {"target": {"role": "bridge", "node": "node1"}, "trigger": {"at_step": 2}}
    )
    c4.setup.roles = dict(NvrxFramework.roles)
    for pid, rank, node in ((700, 0, "node0"), (702, 2, "node1"), (703, 3, "node1")):
        c4(
            ev(
                "helper_start",
                pid,
                proc=f"bridge.rank{rank}",
                pid=pid,
                role="bridge",
                node=node,
                rank=rank,
                incarnation=0,
            )
        )
    start(c4)
    steps(c4, 1, 2)
    assert fired_pids(rt4) == [703]  # node1's newest bridge


@pytest.mark.parametrize(
    ("framework", "fault", "problem"),
    [
        (
            "restart",
            "{injector: kill, target: {role: lighthouse}, trigger: {at_step: 5}}",
            "fault 'f': framework 'restart' has no lighthouse (its roles: rank0, rendezvous-host)",
        ),
        (
            "torchrun",
            "{injector: straggler, target: {role: agent}, trigger: {at_step: 5}}",
            "fault 'f': straggler cannot target a role (agent): only faults that signal a process",
        ),
        (
            "torchrun",
            "{injector: kill, target: {role: agent, rank: 1}, trigger: {at_step: 5}}",
            "role takes node only",
        ),
    ],
)
def test_role_targets_refused_where_there_is_no_such_role(framework: str, fault: str, problem: str) -> None:
    from chaosbench.errors import SpecError
    from tests.conftest import make_suite

    text = f"""\
name: x
defaults: {{workload: {{name: ddp-mlp, ranks: 2, nodes: 2}}}}
frameworks: {{{framework}: {{}}}}
faults: {{f: {fault}}}
matrix: {{frameworks: [{framework}], faults: [f]}}
"""
    with pytest.raises(SpecError, match="suites/x.yaml:") as exc:
        make_suite(text, "suites/x.yaml")
    assert problem in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    ("target", "looked_for", "reason"),
    [
        ({"node": "node5"}, "node node5", "no rank started"),
        ({"role": "agent"}, "role agent", "no such role"),
    ],
)
def test_a_target_not_there_is_an_error_naming_what_was_looked_for(
    tmp_path: Path, target: dict, looked_for: str, reason: str
) -> None:
    from chaosbench.errors import TargetNotFound

    c, rt, _ = controller(tmp_path, {"target": target, "trigger": {"at_step": 5}})
    start(c)
    with pytest.raises(TargetNotFound) as err:
        c._resolve()
    assert (err.value.target, err.value.reason) == (looked_for, reason)
    assert rt.signals == []
