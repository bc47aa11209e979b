"""``node-kill``: a lost node on a runtime whose nodes are containers (``docker``): ``docker kill`` of the
node's container, i.e. every process on the node dies at once, its network endpoint disappears and nothing on it
gets to say goodbye. There is nothing to revert: the node is lost. What brings it back is the runtime's
``lost_node`` policy, applied when something needs the node (``reboot``: the same container is started again;
``spare``: a hot spare takes over the node's name; ``none``: it stays lost), so the same fault measures "requeue
after reboot" against "hot spare" against "no replacement". Killing node0 under torchrun ends the rendezvous host
with it (see FIELD-NOTES). Targets are nodes: ``target: {node: node1}`` (or a rank, whose node is used); on a
runtime without node control the run fails before launch with a one-line reason. On the local runtime a lost
node is ``local-node-kill``.
"""

from __future__ import annotations

import signal
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.injectors.base import FaultContext, Injector, RunSetup, engine_effect, target_nodes
from chaosbench.runtimes.base import node_control
from chaosbench.timeline import now_ns


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
