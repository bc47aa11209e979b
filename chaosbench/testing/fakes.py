"""Fakes for unit tests of the harness's own logic: a runtime that records signals instead of sending them."""

from __future__ import annotations

from typing import ClassVar

from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime


class RecordingRuntime(Runtime):
    """Starts nothing; ``signal_pid`` records ``(pid, signal)`` in ``signals``."""

    name: ClassVar[str] = "recording"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.signals: list[tuple[int, int]] = []

    def free_port(self) -> int:
        return 29500

    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        raise NotImplementedError("RecordingRuntime starts nothing")

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        self.signals.append((pid, sig))
        return None  # nothing was delivered anywhere: no moment of effect to report

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        pass

    def cleanup(self, grace_s: float = 5.0) -> None:
        pass
