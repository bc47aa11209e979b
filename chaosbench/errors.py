"""One exception root for everything chaosbench raises on purpose.

The tree (an error that has a context carries it as fields, so that callers and tests read the fields, not the
text; the message is built from them)::

    ChaosbenchError                     everything chaosbench raises on purpose (the CLI prints one line)
    ├── SpecError(problem, file, line, obj)
    │                                   a suite, fault definition or option is invalid (found when it loads, or
    │                                   when a plugin plans a run with it)
    ├── PluginError(kind, name, problem, source)
    │   │                               a plugin that cannot be registered or loaded (not a subclass of its kind's
    │   │                               base, a malformed name, options that are not a model, a name taken)
    │   └── UnknownPlugin(kind, name, known)
    │                                   no injector, framework, runtime or workload of that name
    ├── Unsupported                     a combination that cannot work (a runtime that cannot do what a fault needs)
    ├── MissingEngine                   an engine a runtime needs (Docker, Slurm, FUSE) is not there
    ├── EngineCommandFailed(argv, rc, stderr)
    │                                   an engine's command (a Slurm client, a tool in a node's namespace) failed
    ├── EngineError(engine, problem)    an engine did not do what it was asked, with no command's exit status to
    │                                   show (a container that did not start, a FUSE mount that did not come up)
    ├── ResultsError(path, problem)     a results directory, result set, baseline or manifest that is not there
    │                                   or cannot be used
    ├── TargetRefused(target, reason)   a load target outside the run's own addresses (also a ValueError)
    ├── TargetNotFound(target, reason)  a fault's target that is not there when it fires (no such role, no live
    │                                   process of it, a rank that has not started, a node that is down, a
    │                                   checkpoint with nothing of what the fault damages): it does not fire
    ├── ForeignTarget(subject, reason, doing, target)
    │                                   the target guard refused to act on what this run did not create (a pid it
    │                                   did not start, a container without its label, a Slurm node or job of others)
    ├── HarnessInterrupted              the harness was asked to stop; runs are torn down, results kept
    └── InvalidEvent(kind, problem, path, line, field)
        ├── UnknownEventKind            a timeline event of no known kind
        └── MalformedEvent              a known kind with a field missing, unknown or of the wrong type

The root itself is raised only for a call that the run's own state forbids (a start after the docker runtime
was cleaned up or while it is torn down, a Slurm start planned before the runtime resolved its nodes) and for a
fuzzing session whose fault-free control failed.

Foreign exceptions are translated at the boundary where they arise (a pydantic ValidationError into a
SpecError naming the YAML line, a failed ``subprocess`` into an EngineCommandFailed).
"""

from __future__ import annotations


class ChaosbenchError(Exception):
    """Base of all chaosbench errors; the CLI prints its message as one line, without a traceback."""


class SpecError(ChaosbenchError):
    """A suite or fault definition is invalid. ``problem``: what is wrong, in words; ``file`` and ``line``: where
    (None when the error is not about a place in a file: a command-line option); ``obj``: the user's object it is
    about (``fault 'kill-rank1'``, ``framework 'ft'``; None when none). The message is
    ``file:line: obj: problem``, each part present when known."""

    def __init__(
        self, problem: str, *, file: str | None = None, line: int | None = None, obj: str | None = None
    ) -> None:
        self.problem = problem
        self.file = file
        self.line = line
        self.obj = obj
        where = "" if file is None else (f"{file}:{line}: " if line is not None else f"{file}: ")
        super().__init__(f"{where}{obj + ': ' if obj else ''}{problem}")


class PluginError(ChaosbenchError):
    """A plugin that cannot be registered or loaded. ``kind``: which registry (``injector``, ...); ``name``: the
    name it is registered under; ``problem``: what is wrong, in words; ``source``: where the plugin comes from
    (``entry point 'touch = chaosbench_touch:TouchInjector' (group chaosbench.injectors)``, a ``module:attr``
    built-in, a class registered at run time), None when it is not about a plugin's code. ``message``: the one
    line shown, when the caller words it (default: ``kind 'name' (source): problem``)."""

    def __init__(
        self, kind: str, name: str, problem: str, *, source: str | None = None, message: str | None = None
    ) -> None:
        self.kind = kind
        self.name = name
        self.problem = problem
        self.source = source
        if message is None:
            message = f"{kind} '{name}'{f' ({source})' if source else ''}: {problem}"
        super().__init__(message)


class UnknownPlugin(PluginError):
    """No injector, framework, runtime or workload of that name is registered. ``kind``: which registry
    (``injector``, ...); ``name``: the name asked for; ``known``: every name it has."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.known = list(known)
        super().__init__(
            kind, name, "unknown", message=f"unknown {kind} '{name}' (known: {', '.join(self.known)})"
        )


class Unsupported(ChaosbenchError):
    """The combination asked for cannot work (e.g. a runtime that cannot do what a fault needs)."""


class MissingEngine(ChaosbenchError):
    """An engine a runtime needs (Docker daemon, Slurm cluster, FUSE) is not available."""


class EngineCommandFailed(ChaosbenchError):
    """A command of an engine chaosbench drives (a Slurm client command, a host tool run in a node's namespace)
    exited non-zero. ``argv``: the command; ``rc``: its exit status; ``stderr``: what it said (stripped; its
    stdout where it said nothing on stderr). ``message``: the one line shown, when the caller words it (default:
    the command's first words and the last line it said)."""

    def __init__(self, argv: list[str], rc: int, stderr: str, *, message: str | None = None) -> None:
        self.argv = list(argv)
        self.rc = rc
        self.stderr = stderr
        if message is None:
            said = (stderr.splitlines() or [f"exit code {rc}"])[-1]
            message = f"'{' '.join(self.argv[:3])}' failed: {said}"
        super().__init__(message)


class EngineError(ChaosbenchError):
    """An engine chaosbench drives did not do what it was asked, and there is no command's exit status to show
    (that is :class:`EngineCommandFailed`): a container or process that did not start, a FUSE mount that did not
    come up or go away, a Slurm node that gave no answer. ``engine``: which (``docker``, ``slurm``, ``fuse``,
    ``nfqueue``, ``local``: the operating system the local runtime drives); ``problem``: what went wrong, in words.
    ``message``: the one line shown, when the caller words it (default: the problem)."""

    def __init__(self, engine: str, problem: str, *, message: str | None = None) -> None:
        self.engine = engine
        self.problem = problem
        super().__init__(message if message is not None else problem)


class ResultsError(ChaosbenchError):
    """A results directory, result set, baseline or manifest that is not there or cannot be used (no such
    directory, no results in it, an unreadable manifest, a directory that is not chaosbench's). ``path``: the
    file or directory; ``problem``: what is wrong with it, in words. ``message``: the one line shown, when the
    caller words it (default: ``path: problem``)."""

    def __init__(self, path: str, problem: str, *, message: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(message if message is not None else f"{path}: {problem}")


class TargetRefused(ChaosbenchError, ValueError):
    """A load generator's target that it refuses to send to (not loopback, not in an allowed network, not
    ``http://host:port``), or an allowed network that is not one. ``target``: the URL (None when the problem is
    the allowed networks); ``reason``: why, in words."""

    def __init__(self, target: str | None, reason: str) -> None:
        self.target = target
        self.reason = reason
        super().__init__(reason if target is None else f"target {target!r}: {reason}")


class TargetNotFound(ChaosbenchError):
    """A fault's target that cannot be resolved when the fault fires, so nothing is done; also a node a run asks
    for that is not there (down with no spare, not one of the run's). ``target``: what was looked for (``rank
    1``, ``role agent``, ``node node1``, a checkpoint's path); ``reason``: why it is not there, in words.
    ``message``: the one line shown, when the caller words it (default: ``target: reason``)."""

    def __init__(self, target: str, reason: str, *, message: str | None = None) -> None:
        self.target = target
        self.reason = reason
        super().__init__(message if message is not None else f"{target}: {reason}")


class ForeignTarget(ChaosbenchError):
    """The target guard of a runtime refused to act, and did nothing: what it would have acted on is not this
    run's own. ``subject``: what was found not to be the run's (``pid 12``, ``container x``, ``Slurm node n2``,
    ``Slurm job 41``); ``reason``: why, in words (``was not started by this run``); ``doing``: what would have
    been done (``signalling it``); ``target``: what the action was aimed at when that is not the subject itself
    (``pid 12`` in a node whose container is not the run's), else None. The message is
    ``[target: ]subject reason; not doing``."""

    def __init__(self, subject: str, reason: str, doing: str, *, target: str | None = None) -> None:
        self.subject = subject
        self.reason = reason
        self.doing = doing
        self.target = target
        super().__init__(f"{target + ': ' if target else ''}{subject} {reason}; not {doing}")


class HarnessInterrupted(ChaosbenchError):
    """The harness was asked to stop (SIGINT/SIGTERM); runs are torn down and results kept."""


class InvalidEvent(ChaosbenchError):
    """A timeline event that does not match its kind's model (:mod:`chaosbench.timeline.schema`), refused when
    written or when read. ``path``: the timeline file (None when unknown); ``line``: the 1-based line of the file
    (None on the write side); ``kind``: the event's kind as written; ``field``: the field at fault (None for the
    event as a whole); ``problem``: what is wrong, in words."""

    def __init__(
        self,
        kind: str,
        problem: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
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
