"""``collective-hang``: the target ranks stay alive (their threads, heartbeats and the harness's probe keep
running) while their process group's collectives go wrong, at step N (once per run). It fires from inside the
workload (:mod:`chaosbench.workloads.planted`), so it works on every runtime.

- ``block``: the rank's main loop waits before entering the step's first collective, for ``duration_s`` or (no
  ``duration_s``) for good. Unlike ``hang`` (SIGSTOP: the whole process frozen), only the training thread stops:
  a liveness check sees a healthy process; its peers wait in their next collective.
- ``skip``: the rank skips the step's gradient allreduce (it updates from its own gradients); from then on its
  collectives pair with its peers' collectives of another step.
- ``mismatch``: the rank calls the step's gradient collective with a different shape (``mismatch: shape``: one
  element fewer) or op (``mismatch: op``: MAX where its peers SUM).

``skip`` and ``mismatch`` need a workload that can change its own gradient collective (``Workload.desyncs``): a
suite that plants one where it cannot fails when it loads."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chaosbench.injectors.base import PlantedInjector
from chaosbench.timeline.schema import FailureMode
from chaosbench.workloads.planted import desync_of

if TYPE_CHECKING:
    from chaosbench.workloads.base import Workload


class CollectiveHangParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="the fault acts at this step's collectives (once per run)")
    mode: Literal["block", "skip", "mismatch"] = Field(
        default="block",
        description="block: wait before the collective; skip: leave one gradient allreduce out; "
        "mismatch: call it with another shape or op",
    )
    duration_s: float | None = Field(
        default=None, gt=0, description="block: how long the rank waits (none: for good)"
    )
    mismatch: Literal["shape", "op"] | None = Field(
        default=None, description="mismatch: one element fewer (shape, the default) or MAX for SUM (op)"
    )

    @model_validator(mode="after")
    def _mode_options(self) -> CollectiveHangParams:
        if self.duration_s is not None and self.mode != "block":
            raise ValueError(f"duration_s applies to mode block only (mode is {self.mode})")
        if self.mismatch is not None and self.mode != "mismatch":
            raise ValueError(f"mismatch applies to mode mismatch only (mode is {self.mode})")
        return self

    @property
    def desync(self) -> str | None:
        """The change to the gradient collective (``skip``, ``shape`` or ``op``); None for ``block``."""
        return desync_of(self.mode, self.mismatch)


class CollectiveHangInjector(PlantedInjector[CollectiveHangParams]):
    """A live rank whose collectives go wrong: blocked before one (a live hang) or out of step with its peers."""

    name: ClassVar[str] = "collective-hang"
    summary: ClassVar[str] = (
        "a live rank blocks before its next collective, skips a gradient allreduce or calls it with another "
        "shape or op"
    )

    @property
    def failure_mode(self) -> FailureMode | None:
        # block: alive, heartbeating, no step. skip/mismatch: a desynchronised group, which may hang, fail or
        # compute on silently: no framework has a detection model for it.
        return "stall" if self.params.mode == "block" else "desync"

    @classmethod
    def check_workload(cls, workload: type[Workload], params: CollectiveHangParams) -> str | None:
        problem = super().check_workload(workload, params)
        if problem is not None:
            return problem
        desync = params.desync
        if desync is not None and desync not in workload.desyncs:
            can = ", ".join(sorted(workload.desyncs)) or "none"
            return (
                f"collective-hang {desync} needs a workload that changes its own gradient collective; "
                f"'{workload.name}' cannot (it can: {can})"
            )
        return None
