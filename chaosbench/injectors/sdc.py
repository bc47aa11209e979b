"""``sdc``: silent data corruption planted in the workload: NaN, scaled values or a flipped exponent bit in one
rank's gradients or parameters at step N. It fires from inside the workload (:mod:`chaosbench.workloads.planted`).
``where: save``: in the parameters right before the first checkpoint save at or after step N, so the damage is
written into the checkpoint that recovery will load (``faults/poisoned-checkpoint.yaml``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector

if TYPE_CHECKING:
    from chaosbench.workloads.base import Workload


class SdcParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="step whose update is corrupted (once per run)")
    kind: Literal["nan", "scale", "bitflip"] = Field(
        default="nan", description="NaN, x scale, or an exponent flip"
    )
    where: Literal["grad", "param", "save"] = Field(
        default="grad",
        description="gradients before the update, parameters after it, or parameters right before "
        "the first checkpoint save at or after at_step (a poisoned checkpoint)",
    )
    scale: float = Field(default=1000.0, description="factor for kind=scale")
    loss_check: bool = Field(default=False, description="turn on the workload's non-finite loss guard")


class SdcInjector(PlantedInjector[SdcParams]):
    """Silent data corruption on the target ranks at one step: NaN, scaled values or a flipped exponent bit in
    their gradients or parameters. Measured: detected (by the framework or a loss check) or propagated into the
    final state (fidelity, ranks' digests disagreeing)."""

    name: ClassVar[str] = "sdc"
    summary: ClassVar[str] = "silent data corruption in one rank's gradients or parameters at step N"
    fault_class = "sdc"

    @property
    def damages_checkpoint(self) -> bool:
        """``where: save`` poisons the checkpoint that recovery will load."""
        return self.params.where == "save"

    @classmethod
    def check_workload(cls, workload: type[Workload], params: SdcParams) -> str | None:
        problem = super().check_workload(workload, params)
        if problem is None and params.where == "save" and not workload.checkpoints:
            return f"sdc where: save poisons a checkpoint; workload '{workload.name}' writes none"
        return problem
