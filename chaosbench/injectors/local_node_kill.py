"""``local-node-kill``: lose a whole node on the ``local`` runtime.

On the local runtime a "node" is a label (:attr:`ProcessSpec.node`) on the processes the framework adapter
started: node1's torchrun agent, its workers and anything they forked. Losing the node means all of them die at
once and nothing on it reacts: every process of the node's trees is first frozen (SIGSTOP, so no agent can see
its workers die and restart them, and no worker can say goodbye), then SIGKILLed. Peers on other nodes see
their connections reset, as when a host dies. There is nothing to revert: the node stays lost (an adapter's
spare policy, e.g. ``torchrun-elastic``'s ``spares``, may bring a replacement).

Targets are nodes: ``target: {node: node1}`` (or ranks, whose nodes are used). Only processes this run's
runtime started, and their descendants, are touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError, Unsupported
from chaosbench.injectors.base import FaultContext, Injector, RunSetup
from chaosbench.runtimes.base import NodeProcesses, ProcHandle, Runtime


def node_handles(runtime: Runtime, node: str) -> list[ProcHandle]:
    """Live processes the runtime started on ``node`` (the local runtime's own records)."""
    if not isinstance(runtime, NodeProcesses):
        raise Unsupported(f"local-node-kill cannot list the processes of runtime '{runtime.name}'")
    return runtime.node_handles(node)


def kill_local_node(runtime: Runtime, node: str) -> list[int]:
    """Freeze then SIGKILL every process of ``node`` (each started process and its descendants).

    Returns the pids killed; raises ProcessLookupError when nothing of the node is alive."""
    roots = node_handles(runtime, node)
    if not roots:
        raise ProcessLookupError(f"no live process on {node}")
    cmap = procutil.children_map()
    tree: dict[int, int | None] = {}
    for h in roots:
        tree[h.pid] = h.ticks
        for d in procutil.descendants(h.pid, cmap):
            tree[d] = procutil.start_ticks(d)
    live = {p: t for p, t in tree.items() if procutil.alive(p, t)}
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    # Children forked between the scan and the freeze are caught by a second scan of the frozen trees.
    cmap = procutil.children_map()
    for pid in list(live):
        for d in procutil.descendants(pid, cmap):
            if d not in live:
                live[d] = procutil.start_ticks(d)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(d, signal.SIGSTOP)
    for pid, ticks in live.items():
        if procutil.alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return sorted(live)


class LocalNodeKillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalNodeKillInjector(Injector):
    """Kills every process of the target node on the local runtime (a lost node)."""

    name: ClassVar[str] = "local-node-kill"
    failure_mode = "crash"  # type: ignore[assignment]
    summary: ClassVar[str] = "kill every process of a node on the local runtime (a lost host); nothing to revert"
    Params = LocalNodeKillParams  # type: ignore[assignment]

    def prepare(self, setup: RunSetup) -> None:
        if setup.runtime.name != "local":
            raise Unsupported(f"local-node-kill needs the local runtime, not '{setup.runtime.name}' (use node-kill)")

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        nodes: list[str] = []
        for t in ctx.targets:
            if t.node not in nodes:
                nodes.append(t.node)
        killed: dict[str, list[int]] = {}
        for node in nodes:
            killed[node] = kill_local_node(ctx.runtime, node)
        if not any(killed.values()):
            raise ChaosbenchError(f"nothing to kill on {', '.join(nodes)}")
        return {"nodes": nodes, "pids": killed}
