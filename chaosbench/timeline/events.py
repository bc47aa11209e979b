"""Timeline events: the event kinds, the :class:`Event` record, appending to a run's ``events.jsonl``
(:class:`TimelineWriter`) and parsing its lines. Standard-library only: the probe imports it inside training
processes (and the command shim inside users' containers).

Each kind has one model in :mod:`chaosbench.timeline.schema` (pydantic: the harness's side), which says what its
fields are, their types and units. Inside ranks the models are not importable, so the writer checks each event
against :data:`chaosbench.timeline.kinds.FIELDS`, a standard-library table generated from the models (every
field with whether it is required and its JSON types; a unit test keeps it equal to the models): an unknown kind,
an unknown field, a required field missing or a field of the wrong JSON type is refused with
:class:`~chaosbench.errors.InvalidEvent` before anything is written. The harness's own writer checks with the full
models (:func:`chaosbench.timeline.schema.harness_writer`: value sets, nested types). How a timeline is read, and
what happens to one written by an older chaosbench: :mod:`chaosbench.timeline.reader`."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from chaosbench.errors import MalformedEvent, UnknownEventKind
from chaosbench.timeline import kinds

#: The version of the timeline contract a harness writes into its ``run_start`` (``timeline_version``): 1 is the
#: first typed one (every event valid against its model). A timeline whose ``run_start`` has none was written
#: by an older chaosbench (:mod:`chaosbench.timeline.reader`).
TIMELINE_VERSION = 1


class EventKind(str, Enum):
    """Every kind of timeline event; each has one model in :mod:`chaosbench.timeline.schema` (its fields, their
    types and units, who writes it), and the docs' table of events (docs/events.md) is generated from those models."""

    RUN_START = "run_start"
    RUN_END = "run_end"
    TEARDOWN_BEGIN = "teardown_begin"
    FRAMEWORK_INFO = "framework_info"
    DETECTION_PREDICTION = "detection_prediction"
    PROC_START = "proc_start"
    PROC_EXIT = "proc_exit"
    HELPER_START = "helper_start"
    RANK_START = "rank_start"
    RANK_EXIT = "rank_exit"
    STEP = "step"
    CKPT_SAVE_BEGIN = "ckpt_save_begin"
    CKPT_SAVE_END = "ckpt_save_end"
    CKPT_LOAD_BEGIN = "ckpt_load_begin"
    CKPT_LOAD_END = "ckpt_load_end"
    CKPT_LOAD_FAILED = "ckpt_load_failed"
    PREEMPT_SAVE = "preempt_save"
    TRAIN_END = "train_end"
    STEP_COUNTING = "step_counting"
    ARTIFACT_DIGEST = "artifact_digest"
    FAULT_INJECT = "fault_inject"
    FAULT_REVERT = "fault_revert"
    FAULT_SKIPPED = "fault_skipped"
    DETECT = "detect"
    CAPTURE_LIMIT = "capture_limit"
    RANK_ERROR = "rank_error"
    PROC_ERROR = "proc_error"
    RESTART = "restart"
    GIVE_UP = "give_up"
    LOG = "log"
    NODE_START = "node_start"
    NODE_EXIT = "node_exit"
    NODE_PAUSE = "node_pause"
    NODE_UNPAUSE = "node_unpause"
    STEP_SKIPPED = "step_skipped"
    QUORUM = "quorum"
    HEAL_BEGIN = "heal_begin"
    HEAL_END = "heal_end"
    HEAL_SEND = "heal_send"
    RENDEZVOUS = "rendezvous"
    CLOCK_OFFSET = "clock_offset"
    NODE_MAP = "node_map"
    SIGNAL_SENT = "signal_sent"
    SCHED_SUBMIT = "sched_submit"
    SCHED_STATE = "sched_state"
    # serving runs (workload ``serve``, framework ``balancer``)
    MODEL_LOAD_BEGIN = "model_load_begin"
    MODEL_LOAD_END = "model_load_end"
    REPLICA_READY = "replica_ready"
    LOAD_START = "load_start"
    LOAD_WINDOW = "load_window"
    LOAD_END = "load_end"
    BALANCER_DOWN = "balancer_down"
    BALANCER_UP = "balancer_up"
    BALANCER_STATS = "balancer_stats"
    BALANCER_EXIT = "balancer_exit"


class EventSource(str, Enum):
    """Who wrote an event (its ``src``)."""

    HARNESS = "harness"  # the harness itself: the runner and the runtime's process records
    RANK = "rank"  # a training or serving process, through the probe (or the command shim)
    FRAMEWORK = "framework"  # a framework adapter: its supervision loop or a log line of the framework's
    INJECTOR = "injector"  # a fault's controller or injector
    RUNTIME = "runtime"  # a runtime's own observations (container engine events, signals on Slurm nodes)
    WATCHER = (
        "watcher"  # the filesystem watch of a user's checkpoints (chaosbench.workloads.checkpoint_watch)
    )
    LOAD = "load"  # the load generator of a serving run


#: The fields every event has, beside its kind-specific ones (see :class:`Event`).
COMMON_FIELDS = ("t_ns", "kind", "src", "host")


def now_ns() -> int:
    """Current wall-clock time in nanoseconds: the one clock of a timeline."""
    return time.time_ns()


_HOST = socket.gethostname()


@dataclass(frozen=True)
class Event:
    """One timeline event: ``t_ns`` (wall-clock ns of the writer's host when it happened), ``kind`` (an
    :class:`EventKind` value), ``src`` (an :class:`EventSource` value), ``host`` (the host whose clock stamped
    it) and ``data``, the kind-specific fields (their model: :mod:`chaosbench.timeline.schema`). A plain record:
    constructing one checks nothing; writing and reading do."""

    t_ns: int
    kind: str
    src: str = "harness"
    host: str = _HOST
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def t_s(self) -> float:
        return self.t_ns / 1e9

    def to_obj(self) -> dict[str, Any]:
        """The event as the JSON object of its line (common fields first)."""
        obj: dict[str, Any] = {"t_ns": self.t_ns, "kind": self.kind, "src": self.src, "host": self.host}
        obj.update(self.data)
        return obj

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), separators=(",", ":"), default=str)

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Event:
        """The event of a decoded line (checks nothing; ``src`` defaults to ``harness``, ``host`` to "").
        Raises KeyError without ``t_ns`` or ``kind``, ValueError when ``t_ns`` is not a number."""
        obj = dict(obj)
        t_ns = int(obj.pop("t_ns"))
        kind = str(obj.pop("kind"))
        src = str(obj.pop("src", "harness"))
        host = str(obj.pop("host", ""))
        return cls(t_ns=t_ns, kind=kind, src=src, host=host, data=obj)


# ------------------------------------------------------------------------------------- the standard-library check
_SOURCES = frozenset(s.value for s in EventSource)


def json_type(value: Any) -> str:
    """The JSON type ``value`` is written as (``json.dumps(..., default=str)``): ``null``, ``bool``, ``int``,
    ``float``, ``str``, ``list``, ``dict``; anything else is written as its ``str``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return "str"


_EXACT = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    list: "list",
    tuple: "list",
    dict: "dict",
}


def _accepted(types: tuple[str, ...]) -> frozenset[str]:
    out = set(types)
    if "float" in out:
        out.add("int")  # an integer is a valid float
    if "any" in out:
        out |= set(_EXACT.values())
    return frozenset(out)


#: kind -> (field -> the JSON types accepted, the required fields): :data:`kinds.FIELDS`, ready for checking.
_CHECKS: dict[str, tuple[dict[str, frozenset[str]], tuple[str, ...]]] = {
    kind: (
        {name: _accepted(types) for name, (_, types) in spec.items()},
        tuple(name for name, (required, _) in spec.items() if required),
    )
    for kind, spec in kinds.FIELDS.items()
}


def check_fields(
    kind: str,
    src: Any,
    t_ns: Any,
    fields: Mapping[str, Any],
    path: str | None = None,
    line: int | None = None,
) -> None:
    """Check one event against :data:`chaosbench.timeline.kinds.FIELDS` (standard library: what ranks can do).
    Raises :class:`~chaosbench.errors.UnknownEventKind` for a kind that is not an :class:`EventKind`, and
    :class:`~chaosbench.errors.MalformedEvent` for a ``t_ns`` that is not an integer, an unknown ``src``, an
    unknown field, a required field missing or a field of another JSON type than its model's."""
    check = _CHECKS.get(kind)
    if check is None:
        raise UnknownEventKind(kind, "unknown kind", path=path, line=line)
    accepted, required = check
    if type(t_ns) is not int and json_type(t_ns) != "int":
        raise MalformedEvent(
            kind, f"t_ns must be an integer (ns), not {t_ns!r}", path=path, line=line, field="t_ns"
        )
    if src not in _SOURCES:
        raise MalformedEvent(
            kind,
            f"unknown src {src!r} (known: {', '.join(sorted(_SOURCES))})",
            path=path,
            line=line,
            field="src",
        )
    for name, value in fields.items():
        ok = accepted.get(name)
        if ok is None:
            raise MalformedEvent(
                kind,
                f"unknown field '{name}' (known: {', '.join(accepted)})",
                path=path,
                line=line,
                field=name,
            )
        t = _EXACT.get(type(value)) or json_type(value)
        if t not in ok:
            raise MalformedEvent(
                kind,
                f"field '{name}' must be {' or '.join(kinds.FIELDS[kind][name][1])}, not {t} {value!r:.80}",
                path=path,
                line=line,
                field=name,
            )
    for name in required:
        if name not in fields:
            raise MalformedEvent(
                kind, f"required field '{name}' is missing", path=path, line=line, field=name
            )


def check_event(ev: Event, line: str | None = None, path: str | None = None) -> None:
    """:func:`check_fields` for an event about to be written (``line``: its JSON line, unused here)."""
    check_fields(ev.kind, ev.src, ev.t_ns, ev.data, path=path)


def check_obj(obj: Mapping[str, Any], path: str | None = None, line: int | None = None) -> None:
    """:func:`check_fields` for a decoded line of a timeline."""
    fields = {k: v for k, v in obj.items() if k not in COMMON_FIELDS}
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise MalformedEvent(str(kind), "no kind", path=path, line=line, field="kind")
    if "host" in obj and not isinstance(obj["host"], str):
        raise MalformedEvent(kind, "host must be a string", path=path, line=line, field="host")
    check_fields(kind, obj.get("src", "harness"), obj.get("t_ns"), fields, path=path, line=line)


#: Checks an event about to be written (the event and its JSON line); raises InvalidEvent.
WriteCheck = Callable[[Event, str, str], None]
#: Checks a decoded line of a timeline (the object, the file, the 1-based line); raises InvalidEvent.
ReadCheck = Callable[[Mapping[str, Any], str | None, int | None], None]


def _check_written(ev: Event, line: str, path: str) -> None:
    check_fields(ev.kind, ev.src, ev.t_ns, ev.data, path)


class TimelineWriter:
    """Appends events to an ``events.jsonl`` file; safe to share between threads and processes.

    Every event is checked before it is written (``check``: by default against the standard-library table,
    :func:`check_event`; the harness's writer, :func:`chaosbench.timeline.schema.harness_writer`, against the
    full models): an invalid one raises :class:`~chaosbench.errors.InvalidEvent` and nothing is written."""

    def __init__(
        self, path: str | os.PathLike[str], src: str = "harness", check: WriteCheck | None = None
    ) -> None:
        self.path = Path(path)
        self.src = src
        self._check = check or _check_written
        self._where = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def emit(self, kind: str, t_ns: int | None = None, src: str | None = None, **data: Any) -> Event:
        """Write one event and return it. ``t_ns`` defaults to now. Raises InvalidEvent for an event its kind's
        model refuses, ValueError once the writer is closed."""
        if isinstance(kind, EventKind):
            kind = kind.value
        ev = Event(t_ns=now_ns() if t_ns is None else t_ns, kind=kind, src=src or self.src, data=data)
        text = ev.to_json()
        self._check(ev, text, self._where)
        line = (text + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"timeline {self.path} is closed")
            os.write(self._fd, line)
        return ev

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> TimelineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_lines(
    lines: Iterable[str],
    path: str | os.PathLike[str] | None = None,
    *,
    strict: bool = True,
    check: ReadCheck | None = None,
    first_line: int = 1,
) -> list[Event]:
    """Parse JSONL lines (as read, with or without their newlines) into events, in file order.

    ``strict`` (the default): every line must be an event valid against its kind's model (``check``: by default
    the standard-library table, :func:`check_obj`; :func:`chaosbench.timeline.read_events` passes the full
    models); a blank line is skipped, anything else raises :class:`~chaosbench.errors.UnknownEventKind` or
    :class:`~chaosbench.errors.MalformedEvent` with ``path`` and ``line`` (1-based, counted from
    ``first_line``). One exception: a torn last line (its writer was killed mid-write: no newline and not
    valid JSON) is skipped. Not ``strict``: lines that do not parse as events are skipped and nothing is checked
    (how timelines of older versions were read)."""
    where = None if path is None else str(path)
    checker = check or check_obj
    items = list(lines)
    out = []
    for i, raw in enumerate(items):
        n = first_line + i
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            if not strict or (i == len(items) - 1 and not raw.endswith("\n")):
                continue  # torn last line
            raise MalformedEvent("?", f"not JSON: {text[:80]!r}", path=where, line=n) from None
        if not isinstance(obj, dict):
            if not strict:
                continue
            raise MalformedEvent("?", f"not a JSON object: {text[:80]!r}", path=where, line=n)
        if strict:
            checker(obj, where, n)
        try:
            out.append(Event.from_obj(obj))
        except (ValueError, KeyError, TypeError, OverflowError):
            if strict:
                raise MalformedEvent(str(obj.get("kind")), "no t_ns or kind", path=where, line=n) from None
            continue
    return out
