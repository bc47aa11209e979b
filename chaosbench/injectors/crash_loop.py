"""``crash-loop``: a deterministic bug planted in the workload: the target ranks raise at step N in every
incarnation. It fires from inside the workload (:mod:`chaosbench.workloads.planted`)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import FaultContext, Injector, RunSetup


class CrashLoopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the workload raises when it reaches this step, in every incarnation")


class CrashLoopInjector(Injector):
    """A deterministic bug: the target ranks raise at ``at_step`` in every incarnation, so restarting cannot
    help. Measured: restarts made, seconds burned, whether the framework stopped at its retry limit."""

    name: ClassVar[str] = "crash-loop"
    failure_mode = "crash"  # type: ignore[assignment]
    summary: ClassVar[str] = "the workload raises at step N in every incarnation (a deterministic bug)"
    Params = CrashLoopParams  # type: ignore[assignment]
    needs_process: ClassVar[bool] = False
    requires_trigger: ClassVar[bool] = False

    def prepare(self, setup: RunSetup) -> None:
        setup.env.update({
            "CHAOSBENCH_FAULT": self.fault_name,
            "CHAOSBENCH_CRASH_AT_STEP": str(self.params.at_step),  # type: ignore[attr-defined]
            "CHAOSBENCH_CRASH_RANKS": setup.planted_ranks(),
        })  # fmt: skip

    def inject(self, ctx: FaultContext) -> dict[str, Any]:  # pragma: no cover - fires inside the workload
        return {}
