"""One exception root for everything chaosbench raises on purpose."""

from __future__ import annotations


class ChaosbenchError(Exception):
    """Base of all chaosbench errors; the CLI prints its message as one line, without a traceback."""


class SpecError(ChaosbenchError):
    """A suite or fault definition is invalid. The message names the file, the line and the problem."""


class UnknownPlugin(ChaosbenchError):
    """No injector, framework, runtime or workload of that name is registered."""


class Unsupported(ChaosbenchError):
    """The combination asked for cannot work (e.g. a runtime that cannot do what a fault needs)."""


class MissingEngine(ChaosbenchError):
    """An engine a runtime needs (Docker daemon, Slurm cluster, FUSE) is not available."""


class HarnessInterrupted(ChaosbenchError):
    """The harness was asked to stop (SIGINT/SIGTERM); runs are torn down and results kept."""


class InvalidEvent(ChaosbenchError):
    """A timeline event that does not match its kind's model (:mod:`chaosbench.timeline.schema`), refused when
    written or when read. ``path``: the timeline file (None when unknown); ``line``: the 1-based line of the file
    (None on the write side); ``kind``: the event's kind as written; ``field``: the field at fault (None for the
    event as a whole); ``problem``: what is wrong, in words."""

    def __init__(self, kind: str, problem: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:  # fmt: skip
        self.kind = kind
        self.problem = problem
        self.path = path
        self.line = line
        self.field = field
        where = "" if path is None else (f"{path}:{line}: " if line is not None else f"{path}: ")
        super().__init__(f"{where}event '{kind}': {problem}")


class UnknownEventKind(InvalidEvent):
    """An event whose ``kind`` is not an :class:`~chaosbench.timeline.events.EventKind`."""


class MalformedEvent(InvalidEvent):
    """An event of a known kind with a field missing, unknown or of the wrong type (or a line that is not an event
    at all: not JSON, not an object, no ``t_ns``)."""
