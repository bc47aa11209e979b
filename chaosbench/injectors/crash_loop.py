"""``crash-loop``: a deterministic bug planted in the workload: the target ranks raise at step N in every
incarnation (from ``from_incarnation`` on: 1 makes it arrive with the first restart). It fires from inside the
workload (:mod:`chaosbench.workloads.planted`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector


class CrashLoopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(
        ge=1, description="the workload raises when it reaches this step, in every incarnation"
    )
    from_incarnation: int = Field(
        default=0,
        ge=0,
        description="raise only in this incarnation and later ones (1: the bug arrives with the first restart, e.g. "
        "a replica restarted after a kill crash-loops as it loads)",
    )


class CrashLoopInjector(PlantedInjector[CrashLoopParams]):
    """A deterministic bug: the target ranks raise at ``at_step`` in every incarnation, so restarting cannot
    help. Measured: restarts made, seconds burned, whether the framework stopped at its retry limit."""

    name: ClassVar[str] = "crash-loop"
    failure_mode = "crash"
    fault_class = "crash"
    summary: ClassVar[str] = "the workload raises at step N in every incarnation (a deterministic bug)"
