"""``gil-hold``: native code in the target ranks holds the GIL for ``duration_s`` at step N (once per run): every
Python thread of the rank starves (a heartbeat thread in Python among them), threads of native code (the process
group's) do not. It fires from inside the workload (:mod:`chaosbench.workloads.planted`): ``usleep`` called through
``ctypes.PyDLL``, which keeps the GIL."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector


class GilHoldParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the GIL is taken before this step is computed (once per run)")
    duration_s: float = Field(gt=0, description="how long native code holds the GIL")


class GilHoldInjector(PlantedInjector[GilHoldParams]):
    """Native code holding the GIL: the rank's Python threads stop for ``duration_s``, then it goes on."""

    name: ClassVar[str] = "gil-hold"
    failure_mode = "stall"
    fault_class = "hang"
    summary: ClassVar[str] = (
        "native code holds a rank's GIL for a while: its Python threads (heartbeats) starve"
    )
