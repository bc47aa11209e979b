"""Plugin registries: built-ins merged with entry points; a plugin adds, never silently replaces."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from chaosbench.errors import ChaosbenchError, UnknownPlugin

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a plugin name to its class, loading modules only when a plugin is asked for.

    ``builtins`` maps names to ``"module:attr"`` strings; entry points of ``group`` are merged in.
    An entry point whose name is already taken raises instead of replacing the existing plugin.
    """

    def __init__(self, kind: str, group: str, builtins: dict[str, str]) -> None:
        self.kind = kind
        self.group = group
        self._refs: dict[str, Any] = dict(builtins)
        self._loaded: dict[str, type[T]] = {}
        self._eps_merged = False

    def _merge_entry_points(self) -> None:
        if self._eps_merged:
            return
        self._eps_merged = True
        for ep in entry_points(group=self.group):
            if ep.name in self._refs:
                raise ChaosbenchError(
                    f"{self.kind} plugin '{ep.name}' from entry point {ep.value} clashes with an existing "
                    f"{self.kind} of that name"
                )
            self._refs[ep.name] = ep

    def names(self) -> list[str]:
        self._merge_entry_points()
        return sorted(self._refs)

    def register(self, name: str, ref: str | type[T]) -> None:
        """Add a plugin at run time (tests, embedding); refuses to replace one."""
        self._merge_entry_points()
        if name in self._refs:
            raise ChaosbenchError(f"{self.kind} '{name}' is already registered")
        self._refs[name] = ref

    def get(self, name: str) -> type[T]:
        self._merge_entry_points()
        if name in self._loaded:
            return self._loaded[name]
        if name not in self._refs:
            raise UnknownPlugin(f"unknown {self.kind} '{name}' (known: {', '.join(self.names())})")
        ref = self._refs[name]
        if isinstance(ref, str):
            mod, _, attr = ref.partition(":")
            obj = getattr(importlib.import_module(mod), attr)
        elif isinstance(ref, type):
            obj = ref
        else:  # an entry point
            obj = ref.load()
        self._loaded[name] = obj
        return obj


INJECTORS: Registry[Any] = Registry(
    "injector",
    "chaosbench.injectors",
    {
        "kill": "chaosbench.injectors.kill:KillInjector",
        "hang": "chaosbench.injectors.hang:HangInjector",
        "straggler": "chaosbench.injectors.straggler:StragglerInjector",
        "crash-loop": "chaosbench.injectors.crash_loop:CrashLoopInjector",
        "sdc": "chaosbench.injectors.sdc:SdcInjector",
        "corrupt-checkpoint": "chaosbench.injectors.corrupt_checkpoint:CorruptCheckpointInjector",
        "local-node-kill": "chaosbench.injectors.local_node_kill:LocalNodeKillInjector",
        "stall-fs": "chaosbench.injectors.stall_fs:StallFsInjector",
        "slurm-node-down": "chaosbench.injectors.slurm_node_down:SlurmNodeDownInjector",
        "node-kill": "chaosbench.injectors.node_kill:NodeKillInjector",
        "node-pause": "chaosbench.injectors.node_pause:NodePauseInjector",
        "node-cpu": "chaosbench.injectors.node_cpu:NodeCpuInjector",
        "net-delay": "chaosbench.injectors.network:NetDelayInjector",
        "net-loss": "chaosbench.injectors.network:NetLossInjector",
        "net-bandwidth": "chaosbench.injectors.network:NetBandwidthInjector",
        "partition": "chaosbench.injectors.network:PartitionInjector",
    },
)

FRAMEWORKS: Registry[Any] = Registry(
    "framework",
    "chaosbench.frameworks",
    {
        "none": "chaosbench.frameworks.none:NoneFramework",
        "restart": "chaosbench.frameworks.restart:RestartFramework",
        "torchrun": "chaosbench.frameworks.torchrun:TorchrunFramework",
        "torchrun-elastic": "chaosbench.frameworks.torchrun_elastic:ElasticFramework",
        "torchft": "chaosbench.frameworks.torchft:TorchftFramework",
        "nvrx": "chaosbench.frameworks.nvrx:NvrxFramework",
        "slurm-requeue": "chaosbench.frameworks.slurm_requeue:SlurmRequeueFramework",
    },
)

RUNTIMES: Registry[Any] = Registry(
    "runtime",
    "chaosbench.runtimes",
    {
        "local": "chaosbench.runtimes.local:LocalRuntime",
        "docker": "chaosbench.runtimes.docker:DockerRuntime",
        "slurm": "chaosbench.runtimes.slurm:SlurmRuntime",
    },
)

WORKLOADS: Registry[Any] = Registry(
    "workload",
    "chaosbench.workloads",
    {
        "ddp-mlp": "chaosbench.workloads.ddp_mlp:DdpMlpWorkload",
        "ft-mlp": "chaosbench.workloads.ft_mlp:FtMlpWorkload",
        "fsdp-lm": "chaosbench.workloads.fsdp_lm:FsdpLmWorkload",
        "command": "chaosbench.workloads.command:CommandWorkload",
    },
)
