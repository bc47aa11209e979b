"""``node-kill``: lose a whole node, the way the suite's runtime loses one. The injector asks the runtime
(:class:`~chaosbench.runtimes.base.NodeLoss`); what losing a node is, and which options apply, is the runtime's:

- ``docker``: ``docker kill`` of the node's container (``signal``, default SIGKILL): every process on the node
  dies at once, its network endpoint disappears. The moment of effect is the engine's ``die`` event. Nothing is
  reverted; the runtime's ``lost_node`` policy brings the node back when something needs it (``reboot``,
  ``spare``, ``none``), so the same fault measures "requeue after reboot" against "hot spare" against "no
  replacement". Killing node0 under torchrun ends the rendezvous host with it (see FIELD-NOTES).
- ``local``: every process of the node's trees (its agent, workers and their children) frozen, then SIGKILLed;
  nothing to revert (an adapter's spares may replace the node). Details: ``nodes``, ``pids``.
- ``slurm``: ``scontrol update state=DOWN|DRAIN`` of the Slurm node (``state``, ``kill_tasks``,
  ``allow_foreign_jobs``), refused on a node that runs no job of this run or jobs of others; revert (after
  ``duration_s``, at the end of the run, or when the harness is interrupted) ``state=RESUME`` while our reason
  stands. Details: ``slurm_nodes``, ``state``, ``killed``, ``before``, ``after``.

``local-node-kill`` and ``slurm-node-down`` are other names of this injector (registered as aliases). Targets
are nodes: ``target: {node: node1}`` (or ranks, whose nodes are used). An option that does not apply to the
suite's runtime, or a runtime that cannot lose nodes, fails when the suite loads with a one-line reason.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chaosbench.errors import Unsupported
from chaosbench.injectors.base import FaultContext, Injector, RunSetup, target_nodes
from chaosbench.runtimes.base import NodeLoss, NodeRestore, Runtime


class NodeKillParams(BaseModel):
    """Every option any built-in runtime's node loss takes; each runtime accepts only its own (an option left out
    takes the runtime's default)."""

    model_config = ConfigDict(extra="forbid")
    signal: str | None = Field(
        default=None,
        description="docker: the signal the engine sends to the node's container; default SIGKILL",
    )
    state: Literal["down", "drain"] | None = Field(
        default=None, description="slurm: the state the node is put in; default down"
    )
    kill_tasks: bool | None = Field(
        default=None,
        description="slurm: SIGKILL the run's processes on the node first; default: only for drain",
    )
    allow_foreign_jobs: bool | None = Field(
        default=None,
        description="slurm: down the node even when jobs of others run there (they end too); default false",
    )
    duration_s: float | None = Field(
        default=None,
        gt=0,
        description="slurm: seconds until the node is resumed; null: at the end of the run",
    )


def runtime_options(runtime: type[Runtime], params: BaseModel, fault: str) -> BaseModel:
    """The runtime's node-loss options from the params the user gave (``duration_s`` is the injector's own: it
    applies where the runtime restores lost nodes). Unsupported, in one line, when the runtime cannot lose
    nodes, an option given does not apply there, or the runtime refuses its value."""
    if not issubclass(runtime, NodeLoss):
        raise Unsupported(
            f"{fault} needs a runtime that can lose a node, and runtime '{runtime.name}' cannot"
        )
    model = runtime.node_loss_options()
    restores = issubclass(runtime, NodeRestore)
    takes = [*model.model_fields, *(["duration_s"] if restores else [])]
    given = params.model_dump(exclude_unset=True)
    for key in given:
        if key not in takes:
            why = " (a node it lost is not restored)" if key == "duration_s" else ""
            raise Unsupported(
                f"{fault} on the {runtime.name} runtime takes no option '{key}'{why}; "
                f"its options: {', '.join(takes) or 'none'}"
            )
    try:
        return model.model_validate({k: v for k, v in given.items() if k in model.model_fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise Unsupported(
            f"{fault} on the {runtime.name} runtime: {where + ': ' if where else ''}"
            f"{err['msg'].removeprefix('Value error, ')}"
        ) from None


class NodeKillInjector(Injector[NodeKillParams]):
    """Loses the target nodes through the runtime's node loss (see the module docstring)."""

    name: ClassVar[str] = "node-kill"
    failure_mode = "crash"
    fault_class = "node"
    summary: ClassVar[str] = (
        "lose a node the runtime's way: docker kills its container, local freezes and SIGKILLs its processes, "
        "slurm sets it DOWN|DRAIN (revert RESUME)"
    )

    @property
    def p(self) -> NodeKillParams:
        assert isinstance(self.params, NodeKillParams)
        return self.params

    @classmethod
    def check_runtime(cls, runtime: type[Runtime], params: NodeKillParams) -> str | None:
        try:
            runtime_options(runtime, params, cls.name)
        except Unsupported as exc:
            return str(exc)
        return None

    def prepare(self, setup: RunSetup) -> None:
        try:
            runtime_options(type(setup.runtime), self.params, self.name)
        except Unsupported as exc:
            raise Unsupported(f"fault '{self.fault_name}': {exc}") from None

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = ctx.runtime
        options = runtime_options(type(rt), self.params, self.name)  # raises where rt cannot lose nodes
        assert isinstance(rt, NodeLoss)
        return rt.lose_nodes(target_nodes(ctx), options, ctx.state.setdefault("restorable", []))

    def revert(self, ctx: FaultContext) -> bool:
        restorable = ctx.state.pop("restorable", [])
        if not restorable or not isinstance(ctx.runtime, NodeRestore):
            return False
        return ctx.runtime.restore_nodes(restorable)
