"""``abort``: the target ranks call ``abort(3)`` at step N (once per run) and die of SIGABRT, as a failed C++
assertion or ``std::terminate`` ends a process. It fires from inside the workload
(:mod:`chaosbench.workloads.planted`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector


class AbortParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the rank aborts before computing this step (once per run)")


class AbortInjector(PlantedInjector[AbortParams]):
    """A rank dies of SIGABRT (``abort(3)``: a failed native assertion, ``std::terminate``)."""

    name: ClassVar[str] = "abort"
    failure_mode = "crash"
    fault_class = "crash"
    summary: ClassVar[str] = "a rank dies of SIGABRT (abort(3), as a failed native assertion) at step N"
