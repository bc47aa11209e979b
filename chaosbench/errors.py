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
