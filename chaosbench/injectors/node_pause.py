"""``node-pause``: a hung host on a runtime whose nodes are containers: ``docker pause`` (cgroup freezer) stops
every process on the node at once, sockets stay open, peers see silence (no reset). Revert: ``docker unpause``."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import FaultContext, Injector, target_nodes
from chaosbench.runtimes.base import engine_effect, node_control
from chaosbench.timeline import now_ns


class NodePauseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    duration_s: float | None = Field(
        default=None, gt=0, description="seconds until unpause; null: till the end"
    )


class NodePauseInjector(Injector[NodePauseParams]):
    """Freezes every process of the target node (``docker pause``); revert unpauses it."""

    name: ClassVar[str] = "node-pause"
    failure_mode = "hang"
    fault_class = "hang"
    summary: ClassVar[str] = "freeze a node (docker pause) for a duration or for good; revert unpauses"
    needs_node_control: ClassVar[bool] = True

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        paused = ctx.state.setdefault("paused", [])
        since = now_ns()
        containers = []
        for n in target_nodes(ctx):
            containers.append(rt.pause_node(n))
            paused.append(n)
        return {
            "nodes": list(paused),
            "duration_s": self.duration_s,
            **engine_effect(rt, containers, "pause", since, "the engine froze the container"),
        }

    def revert(self, ctx: FaultContext) -> bool:
        rt = node_control(ctx.runtime, self.name)
        undone = False
        for n in ctx.state.pop("paused", []):
            undone = rt.unpause_node(n) or undone
        return undone
