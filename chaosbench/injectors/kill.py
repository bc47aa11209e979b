"""``kill``: a signal (SIGKILL by default) to the target ranks' processes: a crashed rank."""

from __future__ import annotations

import signal
from abc import abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.injectors.base import FaultContext, Injector, P, effect_of
from chaosbench.timeline.schema import FailureMode, FaultClass


def signal_number(name: str | int) -> int:
    if isinstance(name, int):
        return int(signal.Signals(name))
    n = name.upper()
    if not n.startswith("SIG"):
        n = "SIG" + n
    return int(signal.Signals[n])


class KillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: str = Field(default="SIGKILL", description="signal name sent to the target rank's process")

    @field_validator("signal", mode="before")
    @classmethod
    def _known(cls, v: Any) -> str:
        try:
            return signal.Signals(signal_number(v)).name
        except (KeyError, ValueError):
            raise ValueError(f"unknown signal {v!r}") from None


class SignalInjector(Injector[P]):
    """Sends the signal :attr:`signal_name` (a subclass says which, from its params or its own) to each target
    rank's process. ``kill`` and ``sigterm``."""

    role_targets: ClassVar[bool] = True

    #: Signals whose default action neither ends nor stops a process.
    HARMLESS: ClassVar[frozenset[str]] = frozenset({"SIGCONT", "SIGCHLD", "SIGURG", "SIGWINCH"})

    @property
    @abstractmethod
    def signal_name(self) -> str:
        """The signal sent, as ``SIGKILL``."""

    #: Signals whose default action stops the process: it is frozen, not gone.
    STOPPING: ClassVar[frozenset[str]] = frozenset({"SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU"})

    @property
    def failure_mode(self) -> FailureMode | None:
        sig = self.signal_name
        if sig in self.STOPPING:
            return "hang"
        return None if sig in self.HARMLESS else "crash"

    @property
    def fault_class(self) -> FaultClass | None:
        """A stopping signal is a hang, a harmless one no fault of a fleet's, any other a crashed rank."""
        mode = self.failure_mode
        return "hang" if mode == "hang" else "crash" if mode == "crash" else None

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        sig = signal_number(self.signal_name)
        delivered: list[int | None] = []
        for t in ctx.targets:
            if t.pid is None:
                raise ProcessLookupError(f"{t.describe()} has no process")
            delivered.append(ctx.runtime.signal_pid(t.pid, sig, t.pid_ticks, t.node))
        name = signal.Signals(sig).name
        return {"signal": name, **effect_of(delivered, f"{name} delivered")}


class KillInjector(SignalInjector[KillParams]):
    """Sends a signal (SIGKILL by default) to each target rank's process: a crashed rank."""

    name: ClassVar[str] = "kill"
    summary: ClassVar[str] = "send a signal (default SIGKILL) to a rank's process"

    @property
    def signal_name(self) -> str:
        return self.params.signal
