"""A run's timeline indexed once for the metric families: its events by kind (in timeline order), the job's step
completions, and the lookups every family asks of them (first or last event of a kind, an incarnation's
``rank_start`` events, the final ``train_end``, a world size).

Built in one pass over the events (grouping them by kind); the step completions and each view of several kinds
at once (``of("detect", "restart")``) cost one further pass, made the first time they are asked for. Nothing
here interprets a fault: that is the families' business
(:mod:`~chaosbench.analysis.timing`, :mod:`~chaosbench.analysis.fidelity`,
:mod:`~chaosbench.analysis.attribution`, :mod:`~chaosbench.analysis.goodput`)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from chaosbench.timeline import Event


def ns_to_s(ns: int) -> float:
    """Nanoseconds on the timeline's clock as seconds."""
    return ns / 1e9


def incarnation(ev: Event) -> int:
    """The incarnation an event belongs to (0 when it names none)."""
    return int(ev.get("incarnation", 0))


@dataclass
class JobSteps:
    """Job step completions per (incarnation, step index).

    A step of the job is complete once every rank that reports steps in that incarnation has reported it or a
    later one (ranks may log at different cadences, or only the main process logs: a rank that reported step 10
    has done step 7 too); its stamp is the moment the last of those ranks got there. The steps are the indices
    some rank reported, each rank's first report of an index counting (a bar redrawn, a loss line beside it).
    A step one rank finished while another was killed or stopped before it is not a completed job step. Its
    duration is the shortest of the reporting ranks' own ``duration_s`` (a rank that waited in a collective for
    a stopped peer reports the wait; the fastest rank's time is the compute), else the interval since that
    rank's previous step or checkpoint event of the incarnation (none for a rank's first step after its start:
    a script's imports and set-up are no step's compute).

    Per-step commit (TorchFT: steps reported ``committed``, each replica group its own incarnation): the job is
    whoever took part in the step's commit, not every rank ever seen. A committed step that names its quorum
    (``quorum_id``, ``participants`` = replica groups in it) is complete once every rank of that quorum reported
    it (``participants`` x the group's ranks, ``group_world_size`` of the ranks' ``rank_start``), stamped at the
    last of those reports and keyed by the newest incarnation among them; when the same index is committed again
    by another quorum (a group that came back with stale state and trained alone), the first completion is the
    job's. A committed step without quorum information is complete at the first group's commit."""

    t: dict[tuple[int, int], int] = field(default_factory=dict)
    duration: dict[tuple[int, int], float] = field(default_factory=dict)
    #: (rank, incarnation) of every rank in the quorum that committed a step (per-step commit with quorum
    #: information: the key names only the newest incarnation among them)
    committers: dict[tuple[int, int], frozenset[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def from_events(cls, events: Sequence[Event]) -> JobSteps:
        out = cls()
        prev: dict[tuple[int, int], int] = {}  # (incarnation, rank) -> last event stamp
        # incarnation -> rank -> (stamp, step) of every step report, in timeline order
        reports: dict[int, dict[int, list[tuple[int, int]]]] = {}
        first: dict[
            tuple[int, int], dict[int, tuple[int, float | None]]
        ] = {}  # (inc, step) -> rank -> 1st report
        committed: set[tuple[int, int]] = set()  # per-step commit without quorum information
        group_size: dict[int, int] = {}  # rank -> ranks in its replica group
        quorum: dict[
            tuple[Any, int], list[tuple[int, int, int, float | None]]
        ] = {}  # (quorum, step) -> reports
        by_quorum: set[int] = (
            set()
        )  # step indices a quorum completed: another quorum's later commit is not the job's
        for ev in events:
            if ev.src != "rank":
                continue
            data = ev.data  # the fields, read directly: this loop sees every rank event of the run
            kind = ev.kind
            inc, rank = int(data.get("incarnation", 0)), int(data.get("rank", 0))
            if kind == "rank_start" and data.get("group_world_size"):
                group_size[rank] = int(data["group_world_size"])
            if kind == "step":
                d = data.get("duration_s")
                if d is None and (inc, rank) in prev:
                    d = ns_to_s(ev.t_ns - prev[(inc, rank)])
                dur = None if d is None else float(d)
                step = int(data["step"])
                if data.get("committed") and data.get("participants") is not None:
                    expected = int(data["participants"]) * group_size.get(rank, 1)
                    got = quorum.setdefault((data.get("quorum_id"), step), [])
                    got.append((ev.t_ns, inc, rank, dur))
                    key = (max(i for _, i, _, _ in got), step)
                    if len({r for _, _, r, _ in got}) == expected and step not in by_quorum:
                        by_quorum.add(step)
                        out.t[key] = ev.t_ns
                        out.committers[key] = frozenset((r, i) for _, i, r, _ in got)
                        ds = [x for *_, x in got if x is not None]
                        if ds:
                            out.duration[key] = min(ds)
                else:
                    reports.setdefault(inc, {}).setdefault(rank, []).append((ev.t_ns, step))
                    first.setdefault((inc, step), {}).setdefault(rank, (ev.t_ns, dur))
                    if data.get("committed"):
                        committed.add((inc, step))
            if kind in ("step", "ckpt_save_end", "ckpt_load_end"):  # not rank_start: start-up is no compute
                prev[(inc, rank)] = ev.t_ns
        reached = {
            inc: {rank: _reach(items) for rank, items in by_rank.items()} for inc, by_rank in reports.items()
        }
        for key, by_rank in first.items():
            if key in committed:
                out.t[key] = min(t for t, _ in by_rank.values())
            else:
                stamps = [_first_at_or_beyond(r, key[1]) for r in reached[key[0]].values()]
                if any(t is None for t in stamps):
                    continue
                out.t[key] = max(t for t in stamps if t is not None)
            ds = [d for _, d in by_rank.values() if d is not None]
            if ds:
                out.duration[key] = min(ds)
        return out

    @cached_property
    def _in_time_order(self) -> list[tuple[int, tuple[int, int]]]:
        return sorted((t, k) for k, t in self.t.items())

    def before(self, t_ns: int) -> list[tuple[int, int]]:
        """Steps completed at or before ``t_ns``."""
        return [k for k, t in self.t.items() if t <= t_ns]

    def after(self, t_ns: int) -> list[tuple[int, tuple[int, int]]]:
        """(stamp, step) of the completions after ``t_ns``, earliest first."""
        ordered = self._in_time_order
        return ordered[bisect.bisect_right(ordered, t_ns, key=lambda item: item[0]) :]

    @cached_property
    def by_incarnation(self) -> dict[int, list[tuple[int, int]]]:
        """(step index, stamp) of every completion, per incarnation, in step order."""
        out: dict[int, list[tuple[int, int]]] = {}
        for (inc, idx), t in self.t.items():
            out.setdefault(inc, []).append((idx, t))
        for items in out.values():
            items.sort()
        return out

    def indices_of(self, inc: int) -> list[int]:
        """Step indices incarnation ``inc`` completed."""
        return [idx for (n, idx) in self.t if n == inc]


def _reach(items: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """A rank's step reports (stamp, step) in timeline order as (stamps, highest step reported by then)."""
    stamps, highest = [], []
    top = 0
    for t, step in items:
        top = max(top, step)
        stamps.append(t)
        highest.append(top)
    return stamps, highest


def _first_at_or_beyond(reach: tuple[list[int], list[int]], step: int) -> int | None:
    """When a rank had first reported ``step`` or a later one (None: never)."""
    stamps, highest = reach
    i = bisect.bisect_left(highest, step)
    return stamps[i] if i < len(highest) else None


class TimelineIndex:
    """The events of one timeline by kind, in timeline order, with the lookups the metric families share.

    ``events`` is the timeline as given (sorted by stamp when read with ``read_events``); every lookup answers
    exactly what the same scan over ``events`` would."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = list(events)
        by_kind: defaultdict[str, list[Event]] = defaultdict(list)
        for ev in self.events:
            by_kind[ev.kind].append(ev)
        self.by_kind: dict[str, list[Event]] = dict(by_kind)
        self._merged: dict[tuple[str, ...], list[Event]] = {}

    def of(self, *kinds: str) -> list[Event]:
        """The events of these kinds, in timeline order."""
        if len(kinds) == 1:
            return self.by_kind.get(kinds[0], [])
        if kinds not in self._merged:
            wanted = set(kinds)
            self._merged[kinds] = [e for e in self.events if e.kind in wanted]
        return self._merged[kinds]

    def has(self, kind: str) -> bool:
        """Whether the timeline has an event of ``kind``."""
        return kind in self.by_kind

    def count(self, kind: str) -> int:
        """How many events of ``kind`` the timeline has."""
        return len(self.by_kind.get(kind, []))

    def first(self, kind: str, after_ns: int | None = None, **match: Any) -> Event | None:
        """The first event of ``kind`` stamped at or after ``after_ns`` whose fields equal ``match``."""
        for ev in self.by_kind.get(kind, []):
            if after_ns is not None and ev.t_ns < after_ns:
                continue
            if all(ev.get(k) == v for k, v in match.items()):
                return ev
        return None

    def last(self, kind: str) -> Event | None:
        """The last event of ``kind``."""
        evs = self.by_kind.get(kind)
        return evs[-1] if evs else None

    @cached_property
    def steps(self) -> JobSteps:
        """The job's step completions (from the ranks' events)."""
        return JobSteps.from_events([e for e in self.events if e.src == "rank"])

    @cached_property
    def per_step_commit(self) -> bool:
        """The job commits every step on its own (``step_skipped`` events, or steps marked ``committed``:
        TorchFT); nothing is rolled back."""
        return self.has("step_skipped") or any(e.get("committed") for e in self.of("step"))

    @cached_property
    def _rank_starts_by_incarnation(self) -> dict[int, list[Event]]:
        out: dict[int, list[Event]] = {}
        for e in self.of("rank_start"):
            out.setdefault(incarnation(e), []).append(e)
        return out

    def rank_starts_of(self, inc: int) -> list[Event]:
        """The ``rank_start`` events of incarnation ``inc``."""
        return self._rank_starts_by_incarnation.get(inc, [])

    def incarnations(self) -> list[int]:
        """Every incarnation a rank started in, ascending."""
        return sorted(self._rank_starts_by_incarnation)

    @property
    def max_incarnation(self) -> int:
        """The highest incarnation a rank started in (0: never restarted)."""
        return max(self._rank_starts_by_incarnation, default=0)

    @cached_property
    def restart_count(self) -> int:
        """Restarts the ranks show: per unit that restarts on its own, the incarnations it started in beyond its
        first, summed. A unit is a replica group (TorchFT's groups number their incarnations each from 0), a
        serving replica (a timeline with ``load_start``: each replica is restarted alone), else the whole job."""
        serving = self.has("load_start")
        by_group: dict[Any, set[int]] = {}
        for e in self.of("rank_start"):
            unit = e.get("replica_group")
            if unit is None and serving:
                unit = ("replica", int(e.get("rank", 0)))
            by_group.setdefault(unit, set()).add(incarnation(e))
        return sum(len(incs) - 1 for incs in by_group.values())

    @cached_property
    def final(self) -> Event | None:
        """``train_end`` of the highest incarnation that reached it: rank 0's, else the first rank's that wrote
        one."""
        ends = self.of("train_end")
        if not ends:
            return None
        last = max(incarnation(e) for e in ends)
        ends = [e for e in ends if incarnation(e) == last]
        return min(ends, key=lambda e: (int(e.get("rank", 0)) != 0, e.t_ns))

    def world(self, inc: int | None, step: Event | None = None) -> tuple[int | None, int | None]:
        """(world size, global batch) of an incarnation, from its ``rank_start`` events (and ``step``'s
        ``global_batch``)."""
        if inc is None:
            return None, None
        starts = self.rank_starts_of(inc)
        ws = max((int(e["world_size"]) for e in starts if e.get("world_size") is not None), default=None)
        gb = step.get("global_batch") if step is not None else None
        if gb is None:
            gb = next((e.get("global_batch") for e in starts if e.get("global_batch") is not None), None)
        return ws, None if gb is None else int(gb)

    def step_event(self, t_ns: int, inc: int) -> Event | None:
        """The first ``step`` event of incarnation ``inc`` stamped ``t_ns``."""
        return next((e for e in self.of("step") if e.t_ns == t_ns and incarnation(e) == inc), None)
