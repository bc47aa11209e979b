"""What workloads and runtimes declare about themselves, and the frameworks that ask it instead of their names."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from chaosbench.errors import Unsupported
from chaosbench.registry import FRAMEWORKS, RUNTIMES, WORKLOADS
from chaosbench.workloads.base import ServingWorkload, Workload


def _framework(name: str) -> Any:
    cls = FRAMEWORKS.get(name)
    return cls(name, cls.Options())


def test_built_in_workloads_declare_what_they_are() -> None:
    declared = {
        n: (WORKLOADS.get(n).checkpoints, WORKLOADS.get(n).serves, WORKLOADS.get(n).users_script)
        for n in WORKLOADS.names()
    }
    assert declared == {
        "ddp-mlp": (True, False, False),
        "fsdp-lm": (True, False, False),
        "pp-lm": (True, False, False),
        "ft-mlp": (False, False, False),
        "command": (False, False, True),
        "serve": (False, True, False),
        "serve-command": (False, True, True),
    }


def test_only_the_local_runtime_runs_ranks_on_the_harness_host() -> None:
    # the built-in ones: an integration test registers a runtime of its own in the same process
    assert {n for n in RUNTIMES.builtins() if RUNTIMES.get(n).ranks_on_harness_host} == {"local"}


class _Server(ServingWorkload):
    """A server of a plugin's own: the serving interface (its replicas' and its load's command lines)."""

    name: ClassVar[str] = "my-server"

    def argv(self, run: Any) -> list[str]:
        return []

    def load_argv(self, target_url: str, allow_cidrs: Any = ()) -> list[str]:
        return []


class _Script(Workload):
    name: ClassVar[str] = "my-script"
    users_script: ClassVar[bool] = True

    def argv(self, run: Any) -> list[str]:
        return []


def test_the_balancer_runs_any_workload_that_serves() -> None:
    fw = _framework("balancer")
    server = _Server(None, Workload.Options())  # type: ignore[arg-type]
    assert fw._serve(SimpleNamespace(workload=server)) is server
    trainer = WORKLOADS.get("ddp-mlp")(None, WORKLOADS.get("ddp-mlp").Options())
    with pytest.raises(Unsupported, match="workload 'ddp-mlp' is not a server"):
        fw._serve(SimpleNamespace(workload=trainer))


def test_torchft_takes_a_users_script_on_trust_and_refuses_a_built_in_without_replica_groups() -> None:
    fw = _framework("torchft")
    script = _Script(None, Workload.Options())  # type: ignore[arg-type]
    assert fw.groups(SimpleNamespace(workload=script, nodes=2, ranks=4)) == 2
    trainer = WORKLOADS.get("ddp-mlp")(None, WORKLOADS.get("ddp-mlp").Options())
    with pytest.raises(Unsupported, match="does not train through torchft's Manager"):
        fw.groups(SimpleNamespace(workload=trainer, nodes=2, ranks=4))


def test_only_torchft_heals_and_a_heal_phase_fault_loads_under_it() -> None:
    from tests.conftest import make_suite

    assert {n for n in FRAMEWORKS.names() if FRAMEWORKS.get(n).heals} == {"torchft"}
    make_suite(
        """\
name: x
defaults: {workload: {name: ft-mlp, ranks: 2}}
frameworks: {ft: {adapter: torchft}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 5}}
  again: {injector: kill, target: 1, trigger: {on_phase: heal}}
matrix: {frameworks: [ft], faults: [[kill, again]]}
""",
        "suites/x.yaml",
    )


def test_only_the_slurm_runtime_hands_jobs_to_a_batch_scheduler() -> None:
    from chaosbench.runtimes.base import BatchJobs

    assert {n for n in RUNTIMES.names() if issubclass(RUNTIMES.get(n), BatchJobs)} == {"slurm"}
    with pytest.raises(Unsupported, match="slurm-requeue needs the slurm runtime .*, not 'local'"):
        FRAMEWORKS.get("slurm-requeue")._runtime(SimpleNamespace(runtime=SimpleNamespace(name="local")))
