"""Plugin registries: built-ins merged with entry points; a plugin adds, never silently replaces.

Each registry checks a plugin when it is registered (a class) or first loaded (a built-in, an entry point): its
name is lower-case words joined by ``-``, it subclasses its kind's base class (:class:`Injector`,
:class:`Framework`, :class:`Runtime`, :class:`Workload`) and its options model (``Params`` of an injector,
``Options`` of the others: the base's type argument) is a pydantic model. A plugin that fails raises
:class:`~chaosbench.errors.PluginError` naming it and where it came from.
"""

from __future__ import annotations

import importlib
import re
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from chaosbench.errors import PluginError, UnknownPlugin
from chaosbench.plugin_options import model_argument

if TYPE_CHECKING:
    from chaosbench.frameworks.base import Framework
    from chaosbench.injectors.base import Injector
    from chaosbench.runtimes.base import Runtime
    from chaosbench.workloads.base import Workload

T = TypeVar("T")

#: A well-formed plugin name: lower-case words (letters and digits) joined by ``-``, as ``crash-loop``.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def _described(obj: Any) -> str:
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}"
    return repr(obj)


class Registry(Generic[T]):
    """Maps a plugin name to its class, loading modules only when a plugin is asked for.

    ``builtins`` maps names to ``"module:attr"`` strings; entry points of ``group`` are merged in.
    ``aliases`` maps other names of a built-in (kept so that suites written with them still work) to its name.
    An entry point whose name is already taken (by a plugin or an alias) raises instead of replacing it.
    ``base`` (``"module:attr"``, imported when the first plugin is checked) is the class every plugin subclasses
    and ``model`` the attribute that holds its options model; without a ``base`` only names are checked.

    Args:
        kind: What the registry holds, in words (``injector``, ``framework``, ...), used in errors.
        group: The entry-point group whose plugins are merged in (``chaosbench.injectors``, ...).
        builtins: Built-in name -> ``"module:attr"`` of its class.
        aliases: Other name of a built-in -> its name; None: none.
        base: ``"module:attr"`` of the base class every plugin subclasses; None: only names are checked.
        model: The class attribute that holds a plugin's options model (``Options``, an injector's ``Params``).

    Raises:
        PluginError: An alias names no built-in, or is itself the name of one.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: dict[str, str],
        aliases: dict[str, str] | None = None,
        *,
        base: str | None = None,
        model: str = "Options",
    ) -> None:
        self.kind = kind
        self.group = group
        self._base_ref = base
        self._model = model
        self._refs: dict[str, str | type[T] | EntryPoint] = dict(builtins)
        self._builtins = tuple(builtins)
        self._aliases: dict[str, str] = dict(aliases or {})
        for alias, name in self._aliases.items():
            if name not in self._refs or alias in self._refs:
                raise PluginError(
                    kind,
                    alias,
                    f"an alias of '{name}', which is not a {kind} of its own",
                    message=f"{kind} alias '{alias}': '{name}' is not a {kind} of its own",
                )
        self._loaded: dict[str, type[T]] = {}
        self._eps_merged = False

    def _merge_entry_points(self) -> None:
        if self._eps_merged:
            return
        self._eps_merged = True
        for ep in entry_points(group=self.group):
            if ep.name in self._refs or ep.name in self._aliases:
                raise PluginError(
                    self.kind,
                    ep.name,
                    f"clashes with an existing {self.kind} of that name",
                    source=self._source(ep),
                    message=f"{self.kind} plugin '{ep.name}' from entry point {ep.value} clashes with an existing "
                    f"{self.kind} of that name",
                )
            self._refs[ep.name] = ep

    def _source(self, ref: str | type | EntryPoint) -> str:
        """Where a plugin comes from, in words."""
        if isinstance(ref, EntryPoint):
            return f"entry point '{ref.name} = {ref.value}' (group {ref.group})"
        return ref if isinstance(ref, str) else _described(ref)

    def check(self, name: str, plugin: Any, source: str | None = None) -> type[T]:
        """``plugin`` as a plugin of this registry named ``name``; raises :class:`PluginError` naming it (and
        ``source``, where it came from: default the class itself) when the name is malformed, it is not a
        subclass of the base, its options model is not a pydantic model or is not the base's type argument.

        Args:
            name: The name the plugin is registered under.
            plugin: The object to check (a class, when it is right).
            source: Where the plugin comes from, in words, for the error; None: the plugin itself, described.

        Returns:
            ``plugin``, unchanged (typed as this registry's class).

        Raises:
            PluginError: ``name`` or the class's own ``name`` is not lower-case words joined by ``-``, the plugin
                is not a subclass of the base, or its options model is not a pydantic model or not the base's
                type argument. (A registry without a ``base`` checks only ``name``.)
        """
        source = source or _described(plugin)

        def refuse(problem: str) -> PluginError:
            return PluginError(self.kind, name, problem, source=source)

        if not NAME_PATTERN.fullmatch(name):
            raise refuse("the name is not lower-case words joined by '-'")
        if self._base_ref is None:
            return plugin  # an unchecked registry (tests): anything goes
        mod, _, attr = self._base_ref.partition(":")
        base = getattr(importlib.import_module(mod), attr)
        if not (isinstance(plugin, type) and issubclass(plugin, base)):
            raise refuse(f"{_described(plugin)} is not a subclass of {_described(base)}")
        own_name = getattr(plugin, "name", None)
        if not (isinstance(own_name, str) and NAME_PATTERN.fullmatch(own_name)):
            raise refuse(f"its class's name {own_name!r} is not lower-case words joined by '-'")
        model = getattr(plugin, self._model, None)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise refuse(f"its {self._model} ({_described(model)}) is not a pydantic model")
        argument = model_argument(plugin, base)
        if argument is not None and not (isinstance(argument, type) and issubclass(model, argument)):
            raise refuse(
                f"its {self._model} ({_described(model)}) is not its type argument {_described(argument)}"
            )
        return plugin

    def names(self) -> list[str]:
        """Every name a suite may use: plugins and aliases.

        Returns:
            The names, sorted: built-ins, entry points, plugins registered at run time and aliases.

        Raises:
            PluginError: An entry point's name clashes with a plugin or alias already there (the first call that
                merges the entry points raises it).
        """
        self._merge_entry_points()
        return sorted([*self._refs, *self._aliases])

    def builtins(self) -> list[str]:
        """The names chaosbench itself ships (no plugins, no aliases), in the order declared.

        Returns:
            The built-in names (a new list).
        """
        return list(self._builtins)

    def aliases(self) -> dict[str, str]:
        """Other names of built-ins (kept so that suites written with them still work) -> the name they stand for.

        Returns:
            Alias -> the name it stands for (a copy).
        """
        return dict(self._aliases)

    def alias_of(self, name: str) -> str | None:
        """The plugin ``name`` is another name of, or None when it is a plugin of its own (or unknown).

        Args:
            name: The name to look up.

        Returns:
            The name ``name`` stands for, or None.
        """
        return self._aliases.get(name)

    def register(self, name: str, ref: str | type[T]) -> None:
        """Add a plugin at run time (tests, embedding); refuses to replace one. A class is checked now
        (:meth:`check`), a ``"module:attr"`` reference when it is first loaded.

        Args:
            name: The name to register it under.
            ref: The plugin's class, or ``"module:attr"`` of it (imported and checked by :meth:`get`).

        Raises:
            PluginError: ``name`` is already a plugin or an alias, ``name`` is malformed, a class fails
                :meth:`check`, or an entry point clashes with an existing name (merged on the first call).
        """
        self._merge_entry_points()
        if name in self._refs or name in self._aliases:
            raise PluginError(
                self.kind,
                name,
                "already registered",
                source=self._source(ref),
                message=f"{self.kind} '{name}' is already registered",
            )
        if isinstance(ref, str):
            if not NAME_PATTERN.fullmatch(name):
                raise PluginError(
                    self.kind, name, "the name is not lower-case words joined by '-'", source=ref
                )
        else:
            self.check(name, ref)
        self._refs[name] = ref

    def get(self, name: str) -> type[T]:
        """The plugin's class (an alias gives the class of the plugin it names), checked when first loaded.

        Args:
            name: A plugin's name or an alias.

        Returns:
            The plugin's class (the same object on every call: loaded once).

        Raises:
            UnknownPlugin: No plugin or alias of that name (its ``known`` lists every name there is).
            PluginError: An entry point cannot be imported, the loaded object fails :meth:`check`, or an entry
                point clashes with an existing name (merged on the first call). A ``"module:attr"`` reference
                (a built-in, or one registered at run time) that cannot be imported raises the ImportError or
                AttributeError itself, untranslated.
        """
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
        elif isinstance(ref, EntryPoint):
            try:
                obj = ref.load()
            except (ImportError, AttributeError) as exc:
                raise PluginError(
                    self.kind, name, f"cannot be loaded: {exc}", source=self._source(ref)
                ) from exc
        else:
            obj = ref
        plugin = self.check(name, obj, self._source(ref))
        self._loaded[name] = plugin
        return plugin


INJECTORS: Registry[Injector[Any]] = Registry(
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
    base="chaosbench.injectors.base:Injector",
    model="Params",
)

FRAMEWORKS: Registry[Framework[Any]] = Registry(
    "framework",
    "chaosbench.frameworks",
    {
        "none": "chaosbench.frameworks.none:NoneFramework",
        "restart": "chaosbench.frameworks.restart:RestartFramework",
        "torchrun": "chaosbench.frameworks.torchrun:TorchrunFramework",
        "torchrun-elastic": "chaosbench.frameworks.torchrun_elastic:ElasticFramework",
        "torchft": "chaosbench.frameworks.torchft:TorchftFramework",
        "nvrx": "chaosbench.frameworks.nvrx:NvrxFramework",
        "ray-train": "chaosbench.frameworks.ray_train:RayTrainFramework",
        "slurm-requeue": "chaosbench.frameworks.slurm_requeue:SlurmRequeueFramework",
        "balancer": "chaosbench.frameworks.balancer:BalancerFramework",
    },
    base="chaosbench.frameworks.base:Framework",
)

RUNTIMES: Registry[Runtime[Any]] = Registry(
    "runtime",
    "chaosbench.runtimes",
    {
        "local": "chaosbench.runtimes.local:LocalRuntime",
        "docker": "chaosbench.runtimes.docker:DockerRuntime",
        "slurm": "chaosbench.runtimes.slurm:SlurmRuntime",
    },
    base="chaosbench.runtimes.base:Runtime",
)

WORKLOADS: Registry[Workload[Any]] = Registry(
    "workload",
    "chaosbench.workloads",
    {
        "ddp-mlp": "chaosbench.workloads.ddp_mlp:DdpMlpWorkload",
        "ft-mlp": "chaosbench.workloads.ft_mlp:FtMlpWorkload",
        "fsdp-lm": "chaosbench.workloads.fsdp_lm:FsdpLmWorkload",
        "pp-lm": "chaosbench.workloads.pp_lm:PpLmWorkload",
        "command": "chaosbench.workloads.command:CommandWorkload",
        "serve": "chaosbench.workloads.serve:Serve",
        "serve-command": "chaosbench.workloads.serve_command:ServeCommand",
    },
    base="chaosbench.workloads.base:Workload",
)
