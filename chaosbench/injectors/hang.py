"""``hang``: SIGSTOP to the target ranks' processes (a hung rank: a stuck kernel, a deadlocked data loader, a
frozen host), for ``duration_s`` or until the run ends; revert sends SIGCONT."""

from __future__ import annotations

import signal
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import ChaosbenchError
from chaosbench.injectors.base import FaultContext, Injector, effect_of


class HangParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    duration_s: float | None = Field(
        default=None, gt=0, description="seconds until SIGCONT; null: stopped until the run ends"
    )


class HangInjector(Injector[HangParams]):
    """Freezes each target rank's process with SIGSTOP (a hung rank); revert sends SIGCONT."""

    name: ClassVar[str] = "hang"
    summary: ClassVar[str] = "SIGSTOP a rank's process for a duration or for good; revert sends SIGCONT"
    failure_mode = "hang"
    fault_class = "hang"
    role_targets: ClassVar[bool] = True

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        stopped = ctx.state.setdefault("stopped", [])
        delivered: list[int | None] = []
        for t in ctx.targets:
            if t.pid is None:
                raise ProcessLookupError(f"{t.describe()} has no process")
            delivered.append(ctx.runtime.signal_pid(t.pid, signal.SIGSTOP, t.pid_ticks, t.node))
            stopped.append((t.pid, t.pid_ticks, t.node))
        return {"duration_s": self.duration_s, **effect_of(delivered, "SIGSTOP delivered")}

    def revert(self, ctx: FaultContext) -> bool:
        undone = False
        for pid, ticks, node in ctx.state.pop("stopped", []):
            if not ctx.runtime.process_alive(pid, ticks, node):
                continue
            try:
                ctx.runtime.signal_pid(pid, signal.SIGCONT, ticks, node)
                undone = True
            except (ProcessLookupError, ChaosbenchError):  # gone, or no longer ours: nothing to undo
                pass
        return undone
