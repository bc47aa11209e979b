"""``thread-exception``: a background thread of the target ranks dies of an exception at step N (once per
run); the main loop never sees it. ``mode: stall``: the main loop then waits for that thread's output for good,
as a training loop waits on a dead data-loading thread: the process stays alive, its other threads (heartbeats,
the process group's) keep running. It fires from inside the workload (:mod:`chaosbench.workloads.planted`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector
from chaosbench.timeline.schema import FailureMode, FaultClass


class ThreadExceptionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the thread dies before this step is computed (once per run)")
    mode: Literal["silent", "stall"] = Field(
        default="silent",
        description="silent: training goes on; stall: the main loop waits for the dead thread",
    )


class ThreadExceptionInjector(PlantedInjector[ThreadExceptionParams]):
    """An exception in a background thread. ``silent``: does anything notice at all (only a traceback on
    stderr)? ``stall``: a live hang, the process and its heartbeats healthy, its next collective never entered."""

    name: ClassVar[str] = "thread-exception"
    summary: ClassVar[str] = (
        "a background thread dies of an exception the main loop never sees (silent or stall)"
    )

    @property
    def failure_mode(self) -> FailureMode | None:
        return "stall" if self.params.mode == "stall" else None

    @property
    def fault_class(self) -> FaultClass | None:
        """A stalled loop is a hang to a fleet; a silent thread death is no fault of a fleet's mix."""
        return "hang" if self.params.mode == "stall" else None
