"""Node faults for runtimes whose nodes are containers (``docker``): ``node-kill``, ``node-pause``, ``node-cpu``.

Targets are nodes: ``target: {node: node1}`` (or a rank, whose node is used). A node fault needs a runtime
with node control (:class:`NodeControl`); on any other runtime the run fails before launch with a one-line
reason.

- ``node-kill``: ``docker kill`` of the node's container, i.e. every process on the node dies at once, its
  network endpoint disappears and nothing on it gets to say goodbye. There is nothing to revert: the node is
  lost. What brings it back is the runtime's ``lost_node`` policy, applied when something needs the node
  (``reboot``: the same container is started again; ``spare``: a hot spare takes over the node's name;
  ``none``: it stays lost), so the same fault measures "requeue after reboot" against "hot spare" against
  "no replacement". Killing node0 under torchrun ends the rendezvous host with it (see FIELD-NOTES).
- ``node-pause``: ``docker pause`` (cgroup freezer): every process on the node stops at once, sockets stay
  open, peers see silence (no reset), like a hung host. Revert: ``docker unpause``.
- ``node-cpu``: ``docker update --cpus`` (live): the node keeps only ``cpus`` CPUs; revert restores the limit.
"""

from __future__ import annotations

import signal
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.errors import Unsupported
from chaosbench.injectors.base import FaultContext, Injector, RunSetup
from chaosbench.runtimes.base import Runtime
from chaosbench.timeline import now_ns


@runtime_checkable
class NodeControl(Protocol):
    """What node and network faults need from a runtime (implemented by the ``docker`` runtime)."""

    def node_names(self) -> list[str]: ...
    def kill_node(self, name: str, sig: str = "SIGKILL", reason: str = "node-kill") -> str: ...
    def pause_node(self, name: str) -> str: ...
    def engine_event_ns(self, container: str, action: str, since_ns: int, timeout_s: float = 5.0) -> int | None: ...
    def unpause_node(self, name: str) -> bool: ...
    def set_node_cpus(self, name: str, cpus: float | None) -> float | None: ...
    def node_state(self, name: str) -> str: ...
    def node_pid(self, name: str) -> int: ...
    def node_ip(self, name: str) -> str: ...


def node_control(runtime: Runtime, fault: str) -> NodeControl:
    if not isinstance(runtime, NodeControl):
        raise Unsupported(f"{fault} needs a runtime whose nodes are containers (docker), not '{runtime.name}'")
    return runtime


def engine_effect(rt: NodeControl, containers: list[str], action: str, since_ns: int, what: str) -> dict[str, Any]:
    """``effect_t_ns``/``effect`` of a node fault: the engine's own stamp of the last container's ``action`` (it
    arrives on the runtime's event stream shortly after the call), else the moment the calls returned."""
    stamps = [rt.engine_event_ns(c, action, since_ns) for c in containers]
    if stamps and all(t is not None for t in stamps):
        return {"effect_t_ns": max(t for t in stamps if t is not None), "effect": f"the engine's '{action}' event: {what}"}
    return {"effect_t_ns": now_ns(), "effect": f"the engine call returned ({what}; no '{action}' event seen)"}


def target_nodes(ctx: FaultContext) -> list[str]:
    """The distinct nodes of the fault's resolved targets, in order."""
    out: list[str] = []
    for t in ctx.targets:
        if t.node not in out:
            out.append(t.node)
    return out


class NodeKillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: str = Field(default="SIGKILL", description="signal docker sends to the node's container")

    @field_validator("signal")
    @classmethod
    def _known(cls, v: str) -> str:
        name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {v!r}")
        return name


class NodeKillInjector(Injector):
    """Kills the target node's container: a lost node (see the module docstring for what happens next)."""

    name: ClassVar[str] = "node-kill"
    failure_mode = "crash"  # type: ignore[assignment]
    summary: ClassVar[str] = "kill a node's container (a lost node); the runtime's lost_node policy replaces it"
    Params = NodeKillParams  # type: ignore[assignment]

    def prepare(self, setup: RunSetup) -> None:
        node_control(setup.runtime, self.name)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        since = now_ns()
        killed = {n: rt.kill_node(n, self.params.signal) for n in target_nodes(ctx)}  # type: ignore[attr-defined]
        return {"containers": killed, "signal": self.params.signal,  # type: ignore[attr-defined]
                **engine_effect(rt, list(killed.values()), "die", since, "the container died")}


class NodePauseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    duration_s: float | None = Field(default=None, gt=0, description="seconds until unpause; null: till the end")


class NodePauseInjector(Injector):
    """Freezes every process of the target node (``docker pause``); revert unpauses it."""

    name: ClassVar[str] = "node-pause"
    failure_mode = "hang"  # type: ignore[assignment]
    summary: ClassVar[str] = "freeze a node (docker pause) for a duration or for good; revert unpauses"
    Params = NodePauseParams  # type: ignore[assignment]

    @property
    def duration_s(self) -> float | None:
        return self.params.duration_s  # type: ignore[attr-defined, no-any-return]

    def prepare(self, setup: RunSetup) -> None:
        node_control(setup.runtime, self.name)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        paused = ctx.state.setdefault("paused", [])
        since = now_ns()
        containers = []
        for n in target_nodes(ctx):
            containers.append(rt.pause_node(n))
            paused.append(n)
        return {"nodes": list(paused), "duration_s": self.duration_s,
                **engine_effect(rt, containers, "pause", since, "the engine froze the container")}

    def revert(self, ctx: FaultContext) -> bool:
        rt = node_control(ctx.runtime, self.name)
        undone = False
        for n in ctx.state.pop("paused", []):
            undone = rt.unpause_node(n) or undone
        return undone


class NodeCpuParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(default=0.1, gt=0, description="CPUs the node keeps (docker update --cpus)")
    duration_s: float | None = Field(default=None, gt=0, description="window length; null: till the end")


class NodeCpuInjector(Injector):
    """Cuts the target node's CPU limit live (a slow node: every collective waits for it)."""

    name: ClassVar[str] = "node-cpu"
    summary: ClassVar[str] = "limit a node's CPUs live (docker update --cpus) for a window; revert restores"
    Params = NodeCpuParams  # type: ignore[assignment]

    @property
    def duration_s(self) -> float | None:
        return self.params.duration_s  # type: ignore[attr-defined, no-any-return]

    def prepare(self, setup: RunSetup) -> None:
        node_control(setup.runtime, self.name)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        before = ctx.state.setdefault("before", {})
        for n in target_nodes(ctx):
            before[n] = rt.set_node_cpus(n, self.params.cpus)  # type: ignore[attr-defined]
        return {"cpus": self.params.cpus, "previous": dict(before)}  # type: ignore[attr-defined]

    def revert(self, ctx: FaultContext) -> bool:
        rt = node_control(ctx.runtime, self.name)
        undone = False
        for n, cpus in ctx.state.pop("before", {}).items():
            if rt.node_state(n) in ("up", "paused"):
                rt.set_node_cpus(n, cpus)
                undone = True
        return undone
