"""``sdc``: silent data corruption planted in the workload: NaN, scaled values or a flipped exponent bit in one
rank's gradients or parameters at step N. It fires from inside the workload (:mod:`chaosbench.workloads.planted`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector


class SdcParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="step whose update is corrupted (once per run)")
    kind: Literal["nan", "scale", "bitflip"] = Field(default="nan", description="NaN, x scale, or an exponent flip")
    where: Literal["grad", "param"] = Field(default="grad", description="gradients before the update, or parameters")
    scale: float = Field(default=1000.0, description="factor for kind=scale")
    loss_check: bool = Field(default=False, description="turn on the workload's non-finite loss guard")


class SdcInjector(PlantedInjector):
    """Silent data corruption on the target ranks at one step: NaN, scaled values or a flipped exponent bit in
    their gradients or parameters. Measured: detected (by the framework or a loss check) or propagated into the
    final state (fidelity, ranks' digests disagreeing)."""

    name: ClassVar[str] = "sdc"
    summary: ClassVar[str] = "silent data corruption in one rank's gradients or parameters at step N"
    Params = SdcParams  # type: ignore[assignment]
