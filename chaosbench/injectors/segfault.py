"""``segfault``: a real SIGSEGV from native code in the target ranks at step N (once per run). It fires from
inside the workload (:mod:`chaosbench.workloads.planted`): a read of address 0 through ctypes."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector


class SegfaultParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the rank segfaults before computing this step (once per run)")


class SegfaultInjector(PlantedInjector[SegfaultParams]):
    """A crash in native code: the rank dies of SIGSEGV (no Python exception, no cleanup; faulthandler, when a
    program enables it, prints the stack first). Measured like a killed rank: who noticed, how fast."""

    name: ClassVar[str] = "segfault"
    failure_mode = "crash"
    fault_class = "crash"
    summary: ClassVar[str] = "a real SIGSEGV from native code in a rank at step N"
