"""What an injector declares about its fault (fleet fault class, failure mode, checkpoint damage), how it reaches
the ``fault_inject`` event, and how events written before the declarations are read
(:mod:`chaosbench.injectors.legacy`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.checkpoint_outcome import corruption_fault
from chaosbench.analysis.fleet import fault_class
from chaosbench.fault_control import FaultController
from chaosbench.injectors.base import RunSetup
from chaosbench.injectors.kill import KillInjector, KillParams
from chaosbench.injectors.legacy import DECLARED_FIELDS, declared, legacy_fault_class
from chaosbench.probe import Probe
from chaosbench.registry import INJECTORS
from chaosbench.runtimes.base import RunInfo
from chaosbench.specs import FaultSpec
from chaosbench.testing.fakes import RecordingRuntime
from chaosbench.timeline import Event, TimelineWriter, read_events
from chaosbench.workloads.planted import Planted, PlantedFault

#: Parameters that make each built-in injector's options valid (the rest default).
PARAMS: dict[str, dict[str, Any]] = {
    "abort": {"at_step": 1},
    "collective-hang": {"at_step": 1},
    "crash-loop": {"at_step": 1},
    "gil-hold": {"at_step": 1, "duration_s": 1},
    "oom": {"at_step": 1},
    "sdc": {"at_step": 1},
    "segfault": {"at_step": 1},
    "thread-exception": {"at_step": 1},
    "net-bandwidth": {"rate": "1mbit"},
    "net-delay": {"delay_ms": 10},
    "net-loss": {"percent": 10},
    "partition": {"groups": [["node0"], ["node1"]]},
}


def _injector(name: str, **params: Any) -> Any:
    cls = INJECTORS.get(name)
    return cls("f", cls.Params.model_validate({**PARAMS.get(name, {}), **params}))


def _plugins() -> list[str]:
    return [n for n in INJECTORS.names() if INJECTORS.alias_of(n) is None]


@pytest.mark.parametrize("name", _plugins())
def test_every_injector_declares_what_legacy_analysis_read_from_its_name(name: str) -> None:
    """With its default options every built-in declares the class the name table gave it: old and new runs of
    the same fault land in the same class of the fleet projection."""
    inj = _injector(name)
    assert inj.fault_class == legacy_fault_class(name, inj.params.model_dump())
    assert set(inj.declared()) == set(DECLARED_FIELDS)


@pytest.mark.parametrize(
    ("sig", "mode", "cls"),
    [
        ("SIGKILL", "crash", "crash"),
        ("SIGTERM", "crash", "crash"),
        ("SIGSEGV", "crash", "crash"),
        ("SIGSTOP", "hang", "hang"),
        ("SIGTSTP", "hang", "hang"),
        ("SIGTTIN", "hang", "hang"),
        ("SIGTTOU", "hang", "hang"),
        ("SIGCONT", None, None),
    ],
)
def test_kill_declares_its_failure_mode_and_class_from_its_signal(
    sig: str, mode: str | None, cls: str | None
) -> None:
    inj = KillInjector("f", KillParams(signal=sig))
    assert (inj.failure_mode, inj.fault_class) == (mode, cls)


@pytest.mark.parametrize("sig", ["SIGTTIN", "SIGTTOU"])
def test_a_stopping_signal_the_name_table_missed_is_a_hang_once_declared(sig: str) -> None:
    """The drift this fixes: analysis re-implemented kill's failure mode by name and took SIGTTIN/SIGTTOU (which
    stop a process, as the injector always said) for a crash. An event written now carries the hang; a legacy
    event is still read as it was, so old runs' figures do not move."""
    inj = KillInjector("f", KillParams(signal=sig))
    event = {"injector": "kill", "params": inj.params.model_dump(), **inj.declared()}
    assert fault_class(event) == "hang"
    legacy = {"injector": "kill", "params": inj.params.model_dump()}
    assert fault_class(legacy) == "crash"


def test_thread_exception_stall_declares_a_hang_silent_none() -> None:
    assert (
        _injector("thread-exception", mode="stall").fault_class,
        _injector("thread-exception").fault_class,
    ) == ("hang", None)
    assert _injector("thread-exception", mode="stall").failure_mode == "stall"


def test_sdc_damages_a_checkpoint_only_where_save() -> None:
    assert _injector("sdc", where="save").damages_checkpoint and not _injector("sdc").damages_checkpoint
    assert _injector("corrupt-checkpoint").damages_checkpoint and not _injector("kill").damages_checkpoint


def test_the_event_s_own_field_wins_over_the_name() -> None:
    """A declared field, null included, is the event's; the name table is asked only when the field is absent."""
    assert fault_class({"injector": "kill", "fault_class": None}) is None
    assert fault_class({"injector": "someone-elses", "fault_class": "node"}) == "node"
    assert fault_class(Event(0, "fault_inject", data={"injector": "hang"})) == "hang"
    assert fault_class(Event(0, "fault_inject", data={"injector": "hang", "fault_class": "crash"})) == "crash"
    assert declared({"injector": "hang"}, "failure_mode") is None
    with pytest.raises(KeyError):
        declared({"injector": "hang"}, "fault_klass")


def test_corruption_fault_is_the_first_that_declares_checkpoint_damage() -> None:
    def inject(t: int, **data: Any) -> Event:
        return Event(t, "fault_inject", src="injector", data={"fault": f"f{t}", **data})

    legacy = [
        inject(1, injector="kill"),
        inject(2, injector="sdc"),
        inject(3, injector="sdc", checkpoint_step=4),
        inject(4, injector="corrupt-checkpoint"),
    ]
    assert corruption_fault(legacy) is legacy[2]
    assert corruption_fault(legacy[3:]) is legacy[3]
    new = [
        inject(1, injector="corrupt-checkpoint", damages_checkpoint=False),
        inject(2, injector="my-corrupter", damages_checkpoint=True),
    ]
    assert corruption_fault(new) is new[1]


def test_the_controller_writes_the_declaration_into_fault_inject(tmp_path: Path) -> None:
    writer = TimelineWriter(tmp_path / "events.jsonl")
    rt = RecordingRuntime(RunInfo("r", tmp_path, writer))
    spec = FaultSpec.model_validate({"injector": "kill", "target": 1, "trigger": {"at_step": 2}})
    setup = RunSetup("r", tmp_path, tmp_path / "ck", rt, writer, random.Random(0), 2, 1, spec.target)
    c = FaultController("f", spec, KillInjector("f", KillParams(signal="SIGTTOU")), setup, 0)
    for r in range(2):
        c(
            Event(
                0,
                "rank_start",
                src="rank",
                data={"rank": r, "pid": 1000 + r, "world_size": 2, "node": "node0", "incarnation": 0},
            )
        )
    for s in (1, 2):
        c(Event(0, "step", src="rank", data={"step": s, "rank": 0, "incarnation": 0}))
    c.close()
    writer.close()
    (fired,) = [e for e in read_events(tmp_path / "events.jsonl") if e.kind == "fault_inject"]
    assert (fired["fault_class"], fired["failure_mode"], fired["damages_checkpoint"]) == (
        "hang",
        "hang",
        False,
    )


def test_a_planted_fault_writes_its_injector_s_declaration(tmp_path: Path) -> None:
    import torch

    setup = RunSetup(
        run_id="r",
        run_dir=tmp_path,
        ckpt_dir=tmp_path / "ck",
        runtime=None,  # type: ignore[arg-type]
        timeline=None,
        rng=random.Random(0),
        ranks=1,
        nodes=1,
    )  # type: ignore[arg-type]
    _injector("sdc", where="save").prepare(setup)
    _injector("crash-loop", at_step=3).prepare(setup)
    events = tmp_path / "events.rank0.jsonl"
    planted = Planted(Probe(str(events), rank=0), {**setup.env, "CHAOSBENCH_RUN_DIR": str(tmp_path)})
    planted.before_save(2, [torch.nn.Parameter(torch.ones(2))])
    with pytest.raises(PlantedFault):
        planted.before_step(3)
    sdc, crash = [e for e in read_events(events) if e.kind == "fault_inject"]
    assert (sdc["fault_class"], sdc["failure_mode"], sdc["damages_checkpoint"], sdc["checkpoint_step"]) == (
        "sdc",
        None,
        True,
        2,
    )
    assert (crash["fault_class"], crash["failure_mode"], crash["damages_checkpoint"]) == (
        "crash",
        "crash",
        False,
    )
