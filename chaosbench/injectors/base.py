"""The injector interface: one kind of fault with ``inject`` and a guaranteed, idempotent ``revert``.

Life cycle within one run (the harness guarantees the order and the calls in ``finally`` blocks):

1. ``prepare(setup)`` before the job is launched: set up what the fault needs (a FUSE mount over the
   checkpoint directory, environment for a planted bug in ``setup.env``, ...).
2. ``inject(ctx)`` each time the trigger fires; ``revert(ctx)`` after ``duration_s`` (if any), at the end of
   the run and when the harness is interrupted, at most once per firing that is still in force.
3. ``cleanup()`` after every process of the run is gone: undo what ``prepare`` did. Idempotent.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from chaosbench.plugin_options import adopt_model
from chaosbench.runtimes.base import Runtime, node_control_problem
from chaosbench.timeline import Event, TimelineWriter
from chaosbench.timeline.schema import FailureMode, FaultClass
from chaosbench.workloads.planted import ENV_PLANTED

if TYPE_CHECKING:
    from chaosbench.spec_model import Target, Trigger
    from chaosbench.workloads.base import Workload


def effect_of(delivered: list[int | None], what: str) -> dict[str, Any]:
    """The ``effect_t_ns``/``effect`` details of a signal sent to every target: in effect once the last one was
    delivered (as the runtime reports it; nothing when it cannot tell, and the controller then takes the moment
    the injection returned)."""
    if not delivered or any(t is None for t in delivered):
        return {}
    return {"effect_t_ns": max(t for t in delivered if t is not None), "effect": f"{what} (runtime's stamp)"}


@dataclass
class ResolvedTarget:
    """A target resolved from the timeline at injection time: a rank's current process, or (``role``) the
    process that plays that role (``rank`` None unless it is a rank)."""

    rank: int | None
    pid: int | None
    pid_ticks: int | None
    node: str
    incarnation: int
    role: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "pid": self.pid, "node": self.node, "incarnation": self.incarnation}
        return {**out, "role": self.role} if self.role else out

    def describe(self) -> str:
        return f"the {self.role}" if self.role and self.rank is None else f"rank {self.rank}"


@dataclass(frozen=True)
class Role:
    """How a framework's role (:data:`chaosbench.specs.ROLES`) is found in the timeline: a rank's process
    (``rank``, from its ``rank_start``) or a process the framework started (``proc_role``, from its
    ``proc_start``: the newest live one, on the target's node, else on ``node``, else the first started)."""

    description: str
    rank: int | None = None
    proc_role: str | None = None
    node: str | None = None


@dataclass
class RunSetup:
    """What ``prepare`` may use and change before launch. ``env`` is added to every rank's environment."""

    run_id: str
    run_dir: Path
    ckpt_dir: Path
    runtime: Runtime
    timeline: TimelineWriter
    rng: random.Random
    ranks: int
    nodes: int
    target: Target | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: The framework's roles (:attr:`chaosbench.frameworks.base.Framework.roles`), for a ``role`` target.
    roles: dict[str, Role] = field(default_factory=dict)

    def plant(
        self, injector: str, fault: str, at_step: int, declared: dict[str, Any] | None = None, **params: Any
    ) -> None:
        """Add a planted fault's entry for the target ranks to the ranks' environment (read by
        :class:`chaosbench.workloads.planted.Planted`). ``declared``: what the injector declares about the fault
        (:meth:`Injector.declared`), which the rank writes into its ``fault_inject`` event."""
        ranks = self.target_ranks()
        entries = json.loads(self.env.get(ENV_PLANTED) or "[]")
        entry = {
            "fault": fault,
            "injector": injector,
            "at_step": at_step,
            "ranks": "all" if ranks is None else ",".join(str(r) for r in ranks),
            **params,
        }
        if declared is not None:
            entry["declared"] = declared
        entries.append(entry)
        self.env[ENV_PLANTED] = json.dumps(entries)

    def target_ranks(self) -> list[int] | None:
        """Ranks named by the fault's target, resolved before launch (None: all ranks)."""
        t = self.target
        if t is None or t.all:
            return None
        if t.ranks is not None:
            return list(t.ranks)
        per_node = max(1, self.ranks // self.nodes)
        if t.node is not None:
            node = self.rng.randrange(self.nodes) if t.node == "random" else int(t.node.removeprefix("node"))
            return list(range(node * per_node, (node + 1) * per_node))
        if t.rank == "random" or t.rank is None:
            return [self.rng.randrange(self.ranks)]
        return [int(t.rank)]


@dataclass
class FaultContext:
    """One firing of a fault. ``state`` is the injector's own memory of this firing (what to revert)."""

    runtime: Runtime
    timeline: TimelineWriter
    targets: list[ResolvedTarget]
    rng: random.Random
    setup: RunSetup
    events: list[Event] = field(default_factory=list)
    index: int = 0
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> ResolvedTarget:
        return self.targets[0]


class NoParams(BaseModel):
    """The params of an injector that takes none."""

    model_config = ConfigDict(extra="forbid")


#: An injector's params model: ``class KillInjector(Injector[KillParams])`` makes ``self.params`` a KillParams.
P = TypeVar("P", bound=BaseModel)


class Injector(ABC, Generic[P]):
    """One kind of fault, typed by its params model ``P`` (``class KillInjector(Injector[KillParams])``): that
    model is its ``Params`` (the injector's own schema, validated before the run starts) and ``self.params`` is
    an instance of it.

    ``inject`` returns details for the ``fault_inject`` event and raises ProcessLookupError (or a
    ChaosbenchError) when it could not act, which is recorded as ``fault_skipped``. Two details have a meaning of
    their own: ``effect_t_ns`` (ns on the harness's clock) is when the fault took effect, where the injector knows
    it better than "when ``inject`` returned" (a signal delivered on a remote node), and ``effect`` says what that
    moment is; the metrics measure recovery from it."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    #: False for faults that do not act on a process (checkpoint corruption, planted bugs): the harness then
    #: does not wait for the target rank's process before firing.
    needs_process: ClassVar[bool] = True
    #: False for planted faults that fire from inside the workload (their params say when).
    requires_trigger: ClassVar[bool] = True
    #: True for faults that act on a node through the runtime (:class:`~chaosbench.runtimes.base.NodeControl`):
    #: a suite on a runtime without it fails when it loads.
    needs_node_control: ClassVar[bool] = False
    #: True for faults the training program plants in itself (:class:`PlantedInjector`).
    planted: ClassVar[bool] = False
    #: True for faults that act on any process by its pid (a signal): they can target a ``role``.
    role_targets: ClassVar[bool] = False

    #: The params model: the type argument ``P`` (set from it when a subclass is made), or one set explicitly.
    Params: ClassVar[type[BaseModel]] = NoParams

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_model(cls, Injector, "Params")

    def __init__(self, fault_name: str, params: P) -> None:
        self.fault_name = fault_name
        self.params: P = params

    @classmethod
    def check_target(cls, target: Target, trigger: Trigger | None) -> str | None:
        """A problem with this target/trigger combination for this injector, or None (``trigger`` None: a fault
        that fires from inside the workload, :attr:`requires_trigger` False).

        Args:
            target: The fault's target, as the suite gives it.
            trigger: The fault's trigger; None for a fault without one.

        Returns:
            The problem, in words; None when the combination is fine (the default).
        """
        return None

    @classmethod
    def role_problem(cls, target: Target) -> str | None:
        """A ``role`` target for an injector that cannot act on any process, or None (asked at load).

        Args:
            target: The fault's target, as the suite gives it.

        Returns:
            The problem, in words, when ``target`` names a role and this injector cannot act on any process by
            its pid (:attr:`role_targets` False); None otherwise.
        """
        if target.role is not None and not cls.role_targets:
            return (
                f"{cls.name} cannot target a role ({target.role}): only faults that signal a process "
                "(kill, sigterm, hang) can"
            )
        return None

    @classmethod
    def check_runtime(cls, runtime: type[Runtime], params: P) -> str | None:
        """A problem with running this fault, with these ``params``, on ``runtime`` (a capability it lacks, an
        option that does not apply there), or None. Asked when the suite loads, so ``--dry-run`` shows it.

        Args:
            runtime: The runtime class the fault would run on.
            params: The fault's params (an instance of :attr:`Params`).

        Returns:
            The problem, in words; None when there is none. The base's only problem: a fault that
            :attr:`needs_node_control` on a runtime without :class:`~chaosbench.runtimes.base.NodeControl`.
        """
        return node_control_problem(runtime, cls.name) if cls.needs_node_control else None

    @classmethod
    def missing_engine(cls) -> str | None:
        """What this fault needs on this machine that is not there (an engine, a tool, a package), naming what
        to install; None when nothing is missing. Asked before a suite runs and in ``--dry-run`` (a warning: the
        suite may be meant for another machine); a run of it fails with the same reason and the suite goes on.

        Returns:
            What is missing, in words, naming what to install; None when nothing is (the default).
        """
        return None

    @classmethod
    def check_workload(cls, workload: type[Workload], params: P) -> str | None:
        """A problem with firing this fault, with these ``params``, in ``workload`` (it cannot be planted there),
        or None. Asked when the suite loads.

        Args:
            workload: The workload class the fault would fire in.
            params: The fault's params (an instance of :attr:`Params`).

        Returns:
            The problem, in words; None when there is none (the default).
        """
        return None

    @property
    def duration_s(self) -> float | None:
        """Seconds after injection at which the harness reverts; None: only at the end of the run. A fault with a
        window has it as its ``duration_s`` option."""
        value = getattr(self.params, "duration_s", None)
        return None if value is None else float(value)

    @property
    def failure_mode(self) -> FailureMode | None:
        """What the fault looks like to a detector: ``crash`` (the target's processes die), ``hang`` (they are
        frozen: no step, no heartbeat, collectives never complete), ``stall`` (alive and heartbeating, their
        native threads running, but no step: the next collective never comes), ``desync`` (a collective that
        goes wrong), or None (neither: slowdowns, damaged files, silent corruption). Framework adapters predict
        their detection time from it; it is written into each ``fault_inject`` event."""
        return None

    @property
    def fault_class(self) -> FaultClass | None:
        """The fleet fault class of this fault (:data:`chaosbench.timeline.schema.FaultClass`: ``crash``,
        ``node``, ``hang``, ``sdc``), or None when a fleet's fault mix has no class for it (a slowdown, a damaged
        file, a network delay). Written into each ``fault_inject`` event; the fleet projection and the serving
        figures read it from there (never from the injector's name)."""
        return None

    @property
    def damages_checkpoint(self) -> bool:
        """Whether a firing damages a checkpoint that recovery may load (its outcome is then classified:
        :mod:`chaosbench.analysis.checkpoint_outcome`). Written into each ``fault_inject`` event."""
        return False

    def declared(self) -> dict[str, Any]:
        """What this fault declares about itself, as ``fault_inject`` event fields: ``fault_class``,
        ``failure_mode`` and ``damages_checkpoint`` (always all three, None included: an event without them
        was written before injectors declared them, :mod:`chaosbench.injectors.legacy`).

        Returns:
            ``{"fault_class": ..., "failure_mode": ..., "damages_checkpoint": ...}`` from the properties of the
            same names.
        """
        return {
            "fault_class": self.fault_class,
            "failure_mode": self.failure_mode,
            "damages_checkpoint": self.damages_checkpoint,
        }

    def prepare(self, setup: RunSetup) -> None:  # noqa: B027 - optional hook
        """Before launch. Default: nothing.

        Args:
            setup: The run as it is before launch; an injector may add to ``setup.env`` (every rank's
                environment) and plant faults (:meth:`RunSetup.plant`).
        """

    @abstractmethod
    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Apply the fault to ``ctx.targets``.

        Args:
            ctx: This firing: the resolved targets, the runtime, the timeline, and ``state``, where the
                injector keeps what :meth:`revert` will need.

        Returns:
            Details for the ``fault_inject`` event; ``effect_t_ns`` (ns on the harness's clock) and ``effect``
            among them where the injector knows when the fault took effect (see the class docstring).

        Raises:
            ProcessLookupError: A target is gone, so the fault could not act (recorded as ``fault_skipped``).
            ChaosbenchError: The injector, the runtime or the platform refused or failed to act (recorded as
                ``fault_skipped``).
            OSError: A system call the injector made failed (also recorded as ``fault_skipped``: the harness
                catches these three, :mod:`chaosbench.fault_control`).
        """

    def revert(self, ctx: FaultContext) -> bool:
        """Undo this firing; returns whether there was anything to undo. Idempotent.

        Args:
            ctx: The firing's context, as :meth:`inject` left it (its ``state`` says what to undo).

        Returns:
            Whether there was anything to undo (the base: never).
        """
        return False

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """After all processes of the run are gone: undo ``prepare``. Idempotent."""

    @classmethod
    def cleanup_crashed(cls, results_dir: Path, run_ids: dict[str, Path]) -> list[str]:
        """``chaosbench cleanup``: undo what this injector left behind below ``results_dir`` when the harness died
        (a FUSE mount, a cgroup named after a run id in ``run_ids``: the unfinished runs' ids -> their
        directories), and only that; one line per action. Default: nothing.

        Args:
            results_dir: The results directory whose crashed runs are cleaned up.
            run_ids: The unfinished runs' ids -> their run directories.

        Returns:
            One line per action taken, in words; empty when there was nothing to do.
        """
        return []


class PlantedInjector(Injector[P]):
    """A fault the training program plants in itself: ``prepare`` adds this fault's entry (its params, ``at_step``
    among them) to the ranks' environment and the workload's hooks fire it from inside
    (:mod:`chaosbench.workloads.planted`), writing the ``fault_inject`` event themselves. Only workloads that
    call those hooks (the built-in programs) can have one: a suite that plants one into another fails when it
    loads."""

    needs_process: ClassVar[bool] = False
    requires_trigger: ClassVar[bool] = False
    planted: ClassVar[bool] = True

    @classmethod
    def check_workload(cls, workload: type[Workload], params: P) -> str | None:
        if workload.plants:
            return None
        return (
            f"{cls.name} is planted from inside chaosbench's own training programs; workload "
            f"'{workload.name}' does not call their hooks, so it cannot fire there"
        )

    def prepare(self, setup: RunSetup) -> None:
        setup.plant(
            self.name, self.fault_name, declared=self.declared(), **self.params.model_dump(mode="json")
        )

    def inject(self, ctx: FaultContext) -> dict[str, Any]:  # pragma: no cover - fires inside the workload
        return {}


def target_nodes(ctx: FaultContext) -> list[str]:
    """The distinct nodes of the fault's resolved targets, in order."""
    out: list[str] = []
    for t in ctx.targets:
        if t.node not in out:
            out.append(t.node)
    return out
