"""``node-cpu``: a slow node on a runtime whose nodes are containers: ``docker update --cpus`` (live) leaves it only
``cpus`` CPUs for a window (every collective waits for it); revert restores the limit."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import FaultContext, Injector, target_nodes
from chaosbench.runtimes.base import node_control


class NodeCpuParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(default=0.1, gt=0, description="CPUs the node keeps (docker update --cpus)")
    duration_s: float | None = Field(default=None, gt=0, description="window length; null: till the end")


class NodeCpuInjector(Injector[NodeCpuParams]):
    """Cuts the target node's CPU limit live (a slow node: every collective waits for it)."""

    name: ClassVar[str] = "node-cpu"
    summary: ClassVar[str] = "limit a node's CPUs live (docker update --cpus) for a window; revert restores"
    needs_node_control: ClassVar[bool] = True

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        before = ctx.state.setdefault("before", {})
        for n in target_nodes(ctx):
            before[n] = rt.set_node_cpus(n, self.params.cpus)
        return {"cpus": self.params.cpus, "previous": dict(before)}

    def revert(self, ctx: FaultContext) -> bool:
        rt = node_control(ctx.runtime, self.name)
        undone = False
        for n, cpus in ctx.state.pop("before", {}).items():
            if rt.node_state(n) in ("up", "paused"):
                rt.set_node_cpus(n, cpus)
                undone = True
        return undone
