"""The workload interface: the training program and how one rank of it is started."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from chaosbench.specs import WorkloadSpec


@dataclass(frozen=True)
class RunPaths:
    """What a workload needs to know about the run it trains in: where it is, where its checkpoints go, its
    seed, and the user's directories (for a command workload's placeholders)."""

    run_dir: Path
    ckpt_dir: Path
    seed: int
    project_dir: str = "."
    suite_dir: str = "."


class Workload(ABC):
    """A training program. Every rank runs the same ``argv``; its rank comes from the environment
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), set by the framework adapter."""

    name: ClassVar[str]

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, spec: WorkloadSpec, options: BaseModel) -> None:
        self.spec = spec
        self.options = options

    @abstractmethod
    def argv(self, run: RunPaths) -> list[str]:
        """The full command line of one rank (first element: the executable)."""

    def env(self, run: RunPaths) -> dict[str, str]:
        """Extra environment for every rank."""
        return {}

    @property
    def pg_timeout_s(self) -> float | None:
        """The process-group timeout the workload sets, when known (a detection knob)."""
        return None

    @property
    def total_steps(self) -> int | None:
        return None
