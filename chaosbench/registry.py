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
    ``aliases`` maps other names of a built-in (kept so that suites written with them still work) to its name.
    An entry point whose name is already taken (by a plugin or an alias) raises instead of replacing it.
    """

    def __init__(
        self, kind: str, group: str, builtins: dict[str, str], aliases: dict[str, str] | None = None
    ) -> None:
        self.kind = kind
        self.group = group
        self._refs: dict[str, Any] = dict(builtins)
        self._builtins = tuple(builtins)
        self._aliases: dict[str, str] = dict(aliases or {})
        for alias, name in self._aliases.items():
            if name not in self._refs or alias in self._refs:
                raise ChaosbenchError(f"{self.kind} alias '{alias}': '{name}' is not a {self.kind} of its own")
        self._loaded: dict[str, type[T]] = {}
        self._eps_merged = False

    def _merge_entry_points(self) -> None:
        if self._eps_merged:
            return
        self._eps_merged = True
        for ep in entry_points(group=self.group):
            if ep.name in self._refs or ep.name in self._aliases:
                raise ChaosbenchError(
                    f"{self.kind} plugin '{ep.name}' from entry point {ep.value} clashes with an existing "
                    f"{self.kind} of that name"
                )
            self._refs[ep.name] = ep

    def names(self) -> list[str]:
        """Every name a suite may use: plugins and aliases."""
        self._merge_entry_points()
        return sorted([*self._refs, *self._aliases])

    def builtins(self) -> list[str]:
        """The names chaosbench itself ships (no plugins, no aliases), in the order declared."""
        return list(self._builtins)

    def aliases(self) -> dict[str, str]:
        """Other names of built-ins (kept so that suites written with them still work) -> the name they stand for."""
        return dict(self._aliases)

    def alias_of(self, name: str) -> str | None:
        """The plugin ``name`` is another name of, or None when it is a plugin of its own (or unknown)."""
        return self._aliases.get(name)

    def register(self, name: str, ref: str | type[T]) -> None:
        """Add a plugin at run time (tests, embedding); refuses to replace one."""
        self._merge_entry_points()
        if name in self._refs or name in self._aliases:
            raise ChaosbenchError(f"{self.kind} '{name}' is already registered")
        self._refs[name] = ref

    def get(self, name: str) -> type[T]:
        """The plugin's class (an alias gives the class of the plugin it names)."""
        self._merge_entry_points()
        name = self._aliases.get(name, name)
        if name in self._loaded:
            return self._loaded[name]
        if name not in self._refs:
            raise UnknownPlugin(self.kind, name, self.names())
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
        "segfault": "chaosbench.injectors.segfault:SegfaultInjector",
        "abort": "chaosbench.injectors.abort:AbortInjector",
        "thread-exception": "chaosbench.injectors.thread_exception:ThreadExceptionInjector",
        "gil-hold": "chaosbench.injectors.gil_hold:GilHoldInjector",
        "collective-hang": "chaosbench.injectors.collective_hang:CollectiveHangInjector",
        "oom": "chaosbench.injectors.oom:OomInjector",
        "sigterm": "chaosbench.injectors.sigterm:SigtermInjector",
        "corrupt-checkpoint": "chaosbench.injectors.corrupt_checkpoint:CorruptCheckpointInjector",
        "stall-fs": "chaosbench.injectors.stall_fs:StallFsInjector",
        "node-kill": "chaosbench.injectors.node_kill:NodeKillInjector",
        "node-pause": "chaosbench.injectors.node_pause:NodePauseInjector",
        "node-cpu": "chaosbench.injectors.node_cpu:NodeCpuInjector",
        "net-delay": "chaosbench.injectors.network:NetDelayInjector",
        "net-loss": "chaosbench.injectors.network:NetLossInjector",
        "net-bandwidth": "chaosbench.injectors.network:NetBandwidthInjector",
        "partition": "chaosbench.injectors.network:PartitionInjector",
    },
    # node-kill asks the runtime to lose the node; these were once one injector per runtime
    aliases={"local-node-kill": "node-kill", "slurm-node-down": "node-kill"},
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
        "balancer": "chaosbench.frameworks.balancer:BalancerFramework",
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
        "pp-lm": "chaosbench.workloads.pp_lm:PpLmWorkload",
        "command": "chaosbench.workloads.command:CommandWorkload",
        "serve": "chaosbench.workloads.serve:Serve",
    },
)
