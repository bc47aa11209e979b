"""``sigterm``: a polite preemption notice: SIGTERM to the target ranks' processes, as a scheduler sends before
it takes the nodes back. Does the job checkpoint before it dies? The built-in workloads answer both ways: with
their ``save_on_sigterm`` option the ranks agree at the end of the step in which a notice arrived, all save a
checkpoint, and the noticed ones then die of the SIGTERM; without it, the SIGTERM ends the rank at once."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from chaosbench.injectors.kill import SignalInjector


class SigtermParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SigtermInjector(SignalInjector[SigtermParams]):
    """SIGTERM to each target rank's process: a preemption notice. Measured: lost work (steps since the last
    checkpoint: none when the job saves on the notice) and the time to resume."""

    name: ClassVar[str] = "sigterm"
    summary: ClassVar[str] = (
        "a preemption notice: SIGTERM to a rank (does the job checkpoint before it dies?)"
    )

    @property
    def signal_name(self) -> str:
        return "SIGTERM"
