"""The timeline: one append-only ``events.jsonl`` per run, on one clock.

Every actor (the harness, the framework adapters, the injectors and the ranks themselves through
:mod:`chaosbench.probe`) appends events to the same file. Each event is one JSON object on one line::

    {"t_ns": 1764467481123456789, "kind": "step", "src": "rank", "host": "h", "rank": 1, "step": 7, ...}

``t_ns`` is wall-clock time in nanoseconds (``time.time_ns()``) taken by the writer when the event happened
(log-line events: when the line was read). All processes of a local run share one host and so one clock.
Across hosts (the slurm runtime), each event's ``host`` names the clock that stamped it; the runtime measures
every node's offset (``clock_offset`` events) and :func:`read_events` moves other hosts' stamps onto the
harness's clock (:mod:`chaosbench.timeline.clocks`).

Writers open the file with ``O_APPEND`` and write each event with a single ``write()`` of one line, which the
kernel does not interleave with other appends on a local filesystem. Readers must therefore sort by ``t_ns``:
the file order is the order of the writes, not of the stamps.

The timeline is a typed contract: each kind (:class:`EventKind`) has one model in
:mod:`~chaosbench.timeline.schema` (its fields, their types and units), and events are validated when written
and when read (an unknown kind or a malformed field is an error naming the file and the line).

The package: :mod:`~chaosbench.timeline.events` (kinds, records, writer, the standard-library check against
:mod:`~chaosbench.timeline.kinds`, the table generated from the models; standard-library only, the probe imports
it inside training processes), :mod:`~chaosbench.timeline.schema` (the models; pydantic, the harness's side,
imported lazily), :mod:`~chaosbench.timeline.reader`, :mod:`~chaosbench.timeline.follower` and
:mod:`~chaosbench.timeline.clocks` (clock offsets and correction).
"""

from chaosbench.timeline.events import (
    TIMELINE_VERSION,
    Event,
    EventKind,
    EventSource,
    TimelineWriter,
    now_ns,
    parse_lines,
)
from chaosbench.timeline.follower import TimelineFollower
from chaosbench.timeline.reader import read_events

__all__ = [
    "TIMELINE_VERSION",
    "Event",
    "EventKind",
    "EventSource",
    "TimelineFollower",
    "TimelineWriter",
    "now_ns",
    "parse_lines",
    "read_events",
]
