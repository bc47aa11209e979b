"""Planted faults without real ranks: the entries the harness writes, and each fault firing inside a process
(a subprocess for those that end it)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chaosbench.errors import SpecError
from chaosbench.injectors.base import RunSetup
from chaosbench.injectors.oom import make_group, memory_root, oom_kills
from chaosbench.probe import Probe
from chaosbench.registry import INJECTORS
from chaosbench.specs import Target
from chaosbench.timeline import read_events
from chaosbench.workloads.planted import ENV_PLANTED, Planted, PlantedFault, plants_from_env
from tests.conftest import make_suite
from tests.helpers import kinds, require


def _setup(tmp_path: Path, target: Target | None = None) -> RunSetup:
    return RunSetup(
        run_id="run-1",
        run_dir=tmp_path,
        ckpt_dir=tmp_path / "ckpt",
        runtime=None,  # type: ignore[arg-type]
        timeline=None,
        rng=random.Random(0),
        ranks=4,
        nodes=2,
        target=target,
    )  # type: ignore[arg-type]


def _planted(tmp_path: Path, env: dict[str, str], rank: int = 1) -> tuple[Planted, Path]:
    events = tmp_path / f"events.rank{rank}.jsonl"
    return Planted(Probe(str(events), rank=rank), {**env, "CHAOSBENCH_RUN_DIR": str(tmp_path)}), events


def _plant(tmp_path: Path, injector: str, target: Target | None = None, **params: Any) -> dict[str, str]:
    setup = _setup(tmp_path, target)
    inj = INJECTORS.get(injector)("f1", INJECTORS.get(injector).Params.model_validate(params))
    inj.prepare(setup)
    return setup.env


def test_entries_carry_fault_injector_ranks_and_params(tmp_path: Path) -> None:
    env = _plant(tmp_path, "sdc", Target(ranks=[1, 3]), at_step=7, kind="scale")
    setup = _setup(tmp_path)
    setup.env = dict(env)
    setup.plant("crash-loop", "boom", at_step=9)
    (sdc, crash) = plants_from_env(setup.env)
    assert (sdc.fault, sdc.injector, sdc.ranks, sdc.at_step) == ("f1", "sdc", {1, 3}, 7)
    assert sdc.params["kind"] == "scale" and sdc.params["where"] == "grad"
    assert (crash.injector, crash.ranks, crash.at_step) == ("crash-loop", None, 9)
    mine, _ = _planted(tmp_path, setup.env, rank=1)
    other, _ = _planted(tmp_path, setup.env, rank=2)
    assert [p.injector for p in mine.plants] == ["sdc", "crash-loop"] and [
        p.injector for p in other.plants
    ] == ["crash-loop"]


def test_crash_loop_fires_in_every_incarnation_sdc_once_per_run(tmp_path: Path) -> None:
    import torch

    env = _plant(tmp_path, "crash-loop", at_step=3)
    env[ENV_PLANTED] = json.dumps(
        json.loads(env[ENV_PLANTED]) + json.loads(_plant(tmp_path, "sdc", at_step=2)[ENV_PLANTED])
    )
    for _incarnation in range(2):
        planted, events = _planted(tmp_path, env)
        w = torch.nn.Parameter(torch.ones(4))
        w.grad = torch.ones(4)
        planted.before_step(2)
        planted.after_backward(2, [w])
        with pytest.raises(PlantedFault):
            planted.before_step(3)
    fired = kinds(read_events(events), "fault_inject")
    assert [e["injector"] for e in fired] == ["sdc", "crash-loop", "crash-loop"]
    assert fired[0]["sdc_kind"] == "nan" and fired[1]["trigger"] == "planted bug at step 3"


def test_crash_loop_from_incarnation_spares_the_first(tmp_path: Path) -> None:
    env = _plant(tmp_path, "crash-loop", at_step=1, from_incarnation=1)
    events = tmp_path / "events.rank1.jsonl"
    for incarnation in range(3):
        planted = Planted(
            Probe(str(events), rank=1, incarnation=incarnation), {**env, "CHAOSBENCH_RUN_DIR": str(tmp_path)}
        )
        if incarnation == 0:
            planted.before_step(1)  # the first incarnation loads
        else:
            with pytest.raises(PlantedFault):
                planted.before_step(1)
    fired = kinds(read_events(events), "fault_inject")
    assert [e["target"][0]["incarnation"] for e in fired] == [1, 2]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_thread_exception_silent_goes_on(tmp_path: Path) -> None:
    planted, events = _planted(tmp_path, _plant(tmp_path, "thread-exception", at_step=4))
    planted.before_step(4)  # returns: the main loop never sees the exception
    planted.before_step(4)  # once per run
    (fired,) = kinds(read_events(events), "fault_inject")
    assert fired["injector"] == "thread-exception" and fired["mode"] == "silent"


@contextmanager
def _heartbeat() -> Iterator[list[float]]:
    """A Python thread ticking every 5 ms while the block runs: its tick times."""
    ticks: list[float] = []
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    th = threading.Thread(target=beat, daemon=True)
    th.start()
    try:
        yield ticks
    finally:
        stop.set()
        th.join()


def test_gil_hold_starves_the_python_threads(tmp_path: Path) -> None:
    planted, events = _planted(tmp_path, _plant(tmp_path, "gil-hold", at_step=2, duration_s=0.4))
    with _heartbeat() as ticks:
        time.sleep(0.05)
        planted.before_step(2)
        time.sleep(0.05)
    gap = max(b - a for a, b in zip(ticks, ticks[1:], strict=False))
    assert gap >= 0.35, f"the heartbeat thread went on while the GIL was held (longest gap {gap:.3f} s)"
    evs = read_events(events)
    assert [e.kind for e in evs if e.kind.startswith("fault_")] == ["fault_inject", "fault_revert"]


def _fire_in_subprocess(tmp_path: Path, env: dict[str, str], step: int) -> tuple[int, list[Any]]:
    code = (
        "import sys; from chaosbench.probe import Probe; from chaosbench.workloads.planted import Planted;"
        f"Planted(Probe(sys.argv[1], rank=1)).before_step({step}); print('survived')"
    )
    events = tmp_path / "sub.jsonl"
    res = subprocess.run(
        [sys.executable, "-c", code, str(events)],
        env={**os.environ, **env, "CHAOSBENCH_RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res.returncode, kinds(read_events(events), "fault_inject") if events.exists() else []


@pytest.mark.parametrize(("injector", "returncode"), [("segfault", -11), ("abort", -6)])
def test_process_level_faults_end_the_process_by_their_signal(
    tmp_path: Path, injector: str, returncode: int
) -> None:
    rc, fired = _fire_in_subprocess(tmp_path, _plant(tmp_path, injector, at_step=5), 5)
    assert rc == returncode and [e["injector"] for e in fired] == [injector]
    rc, fired = _fire_in_subprocess(tmp_path, _plant(tmp_path, injector, at_step=5), 5)
    assert rc == 0, "fired twice in one run"


def test_oom_grows_until_the_kernel_kills_it(tmp_path: Path) -> None:
    found = memory_root()
    require("cgroup", found if isinstance(found, str) else None)
    setup = _setup(tmp_path)
    setup.timeline = None  # type: ignore[assignment]
    group = make_group(f"unit-{os.getpid()}.oom", 64)
    try:
        setup.plant("oom", "f1", at_step=3, limit_mb=64, cgroup=str(group))
        rc, fired = _fire_in_subprocess(tmp_path, setup.env, 3)
        assert rc == -9 and [e["injector"] for e in fired] == ["oom"]
        assert oom_kills(group) == 1
    finally:
        group.rmdir()


SUITE = """\
name: x
defaults:
  runtime: {runtime}
  workload: {workload}
frameworks:
  restart: {{}}
faults:
  boom: {{injector: {injector}, params: {{at_step: 5}}}}
matrix:
  frameworks: [restart]
  faults: [boom]
"""


@pytest.mark.parametrize(
    ("runtime", "workload", "injector", "problem"),
    [
        (
            "local",
            "{name: command, ranks: 2, command: 'python train.py'}",
            "segfault",
            "fault 'boom': segfault is planted from inside chaosbench's own training programs; workload 'command'",
        ),
        (
            "local",
            "{name: command, ranks: 2, command: 'python train.py'}",
            "crash-loop",
            "fault 'boom': crash-loop is planted from inside",
        ),
        (
            "docker",
            "{name: ddp-mlp, ranks: 2, nodes: 2}",
            "oom",
            "fault 'boom': oom needs ranks on the harness's own host, where it makes the memory cgroup",
        ),
    ],
)
def test_planted_faults_refused_where_they_cannot_fire(
    runtime: str, workload: str, injector: str, problem: str
) -> None:
    with pytest.raises(SpecError) as exc:
        make_suite(SUITE.format(runtime=runtime, workload=workload, injector=injector), "suites/x.yaml")
    assert problem in str(exc.value), str(exc.value)
    assert str(exc.value).startswith("suites/x.yaml:"), str(exc.value)
    make_suite(
        SUITE.format(runtime="local", workload="{name: ddp-mlp, ranks: 2}", injector=injector), "s.yaml"
    )


def test_collective_hang_block_stops_the_main_loop_only(tmp_path: Path) -> None:
    planted, events = _planted(tmp_path, _plant(tmp_path, "collective-hang", at_step=2, duration_s=0.4))
    assert not planted.desyncs and planted.sync_fault(2) is None
    with _heartbeat() as ticks:
        t0 = time.monotonic()
        planted.before_step(2)
        blocked = time.monotonic() - t0
    gap = max(b - a for a, b in zip(ticks, ticks[1:], strict=False))
    assert blocked >= 0.4 and gap < 0.2, f"blocked {blocked:.3f} s, heartbeat gap {gap:.3f} s"
    evs = [e for e in read_events(events) if e.kind.startswith("fault_")]
    assert [e.kind for e in evs] == ["fault_inject", "fault_revert"] and evs[0]["mode"] == "block"
    t0 = time.monotonic()
    planted.before_step(2)  # once per run
    assert time.monotonic() - t0 < 0.1


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        ({"mode": "skip"}, "skip"),
        ({"mode": "mismatch"}, "shape"),
        ({"mode": "mismatch", "mismatch": "op"}, "op"),
    ],
)
def test_collective_desync_is_due_once_at_its_step(tmp_path: Path, params: dict[str, Any], kind: str) -> None:
    env = _plant(tmp_path, "collective-hang", Target(ranks=[1]), at_step=3, **params)
    planted, events = _planted(tmp_path, env)
    assert planted.desyncs and not _planted(tmp_path, env, rank=0)[0].desyncs
    planted.before_step(3)  # a desync does not act before the step
    assert [planted.sync_fault(s) for s in (2, 3, 3)] == [None, kind, None]
    (fired,) = kinds(read_events(events), "fault_inject")
    assert fired["desync"] == kind and fired["step"] == 3


def test_collective_hang_params_and_failure_modes() -> None:
    cls = INJECTORS.get("collective-hang")
    for bad, problem in [
        ({"mode": "skip", "duration_s": 3}, "duration_s applies to mode block only"),
        ({"mode": "block", "mismatch": "op"}, "mismatch applies to mode mismatch only"),
    ]:
        with pytest.raises(ValueError, match=problem):
            cls.Params.model_validate({"at_step": 4, **bad})
    modes = {
        m: cls("f", cls.Params.model_validate({"at_step": 4, "mode": m})).failure_mode
        for m in ("block", "skip", "mismatch")
    }
    assert modes == {"block": "stall", "skip": "desync", "mismatch": "desync"}


@pytest.mark.parametrize(
    ("workload", "params", "problem"),
    [
        (
            "{name: fsdp-lm, ranks: 2}",
            "{at_step: 5, mode: mismatch}",
            "collective-hang shape needs a workload that changes its own gradient collective; 'fsdp-lm' cannot (it can: skip)",
        ),
        (
            "{name: command, ranks: 2, command: 'python train.py'}",
            "{at_step: 5}",
            "collective-hang is planted from inside chaosbench's own training programs; workload 'command'",
        ),
    ],
)
def test_collective_desyncs_refused_where_the_workload_cannot(
    workload: str, params: str, problem: str
) -> None:
    suite = SUITE.replace("params: {{at_step: 5}}", f"params: {params.replace('{', '{{').replace('}', '}}')}")
    with pytest.raises(SpecError, match="suites/x.yaml:") as exc:
        make_suite(
            suite.format(runtime="local", workload=workload, injector="collective-hang"), "suites/x.yaml"
        )
    assert problem in str(exc.value), str(exc.value)
    make_suite(
        suite.format(runtime="local", workload="{name: ddp-mlp, ranks: 2}", injector="collective-hang"),
        "s.yaml",
    )
    make_suite(
        SUITE.format(runtime="local", workload="{name: fsdp-lm, ranks: 2}", injector="collective-hang"),
        "s.yaml",
    )
