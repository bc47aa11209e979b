"""The injector interface: one kind of fault with ``inject`` and a guaranteed, idempotent ``revert``."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from chaosbench.runtimes.base import Runtime
from chaosbench.timeline import TimelineWriter


@dataclass
class ResolvedTarget:
    """A target resolved from the timeline at injection time: the rank's current process."""

    rank: int
    pid: int
    pid_ticks: int | None
    node: str
    incarnation: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "node": self.node,
            "incarnation": self.incarnation,
        }


@dataclass
class FaultContext:
    runtime: Runtime
    timeline: TimelineWriter
    target: ResolvedTarget
    rng: random.Random


class Injector(ABC):
    """One kind of fault. ``Params`` is the injector's own schema, validated before the run starts.

    ``inject`` returns details for the ``fault_inject`` event. ``revert`` undoes the fault; the harness
    calls it after ``duration_s`` (when the injector has one), at the end of the run, and when it is
    interrupted, so it must be safe to call at any time and more than once."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, fault_name: str, params: BaseModel) -> None:
        self.fault_name = fault_name
        self.params = params

    @property
    def duration_s(self) -> float | None:
        """Seconds after injection at which the harness reverts; None: only at the end of the run."""
        return None

    @abstractmethod
    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Apply the fault. Raise ProcessLookupError if the target is already gone."""

    def revert(self, ctx: FaultContext) -> bool:
        """Undo the fault; returns whether there was anything to undo. Idempotent."""
        return False
