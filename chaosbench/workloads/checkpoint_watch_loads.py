"""The checkpoint loads the watcher sees (:class:`LoadTracker`): a checkpoint's files opened and closed without
a write, by anyone but the watcher itself, outside that checkpoint's own save; the reads of one checkpoint
until it has been quiet are one load (the rules of :mod:`chaosbench.workloads.checkpoint_watch`: "Loads")."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from chaosbench.workloads.checkpoint_watch_saves import STAGED_MAX, SaveTracker
from chaosbench.workloads.checkpoint_watch_timeline import WatchRecorder


@dataclass
class PendingLoad:
    """A read of a checkpoint in progress (``key``: the file or checkpoint directory, absolute)."""

    root: str
    key: str
    first_ns: int
    last_ns: int
    last_mono: float
    step: int | None  # the step its last save before the read was written with
    files: set[str] = field(default_factory=set)


class LoadTracker:
    """The opens not closed yet, the watcher's own reads to come, and the loads in progress; where a read
    belongs and whether its checkpoint is being saved is asked of ``saves``. Writes each load through
    ``recorder`` when it ends. Not thread-safe: every method is called holding the watcher's lock."""

    def __init__(self, saves: SaveTracker, recorder: WatchRecorder, quiet_s: float) -> None:
        self._saves = saves
        self._recorder = recorder
        self._quiet_s = quiet_s
        self._loads: dict[str, PendingLoad] = {}
        self._opens: OrderedDict[str, list[int]] = OrderedDict()  # path -> stamps of its opens not closed yet
        self._own_reads: dict[str, int] = {}  # path -> the watcher's own reads (its judging) still to come

    def own_read(self, path: str) -> None:
        """The watcher itself is about to open and close ``path`` once without a write: no load."""
        self._own_reads[path] = self._own_reads.get(path, 0) + 1

    def opened(self, path: str, t: int) -> None:
        """``path`` was opened at ``t`` (wall-clock ns); the last 4096 paths' stamps are kept."""
        self._opens.setdefault(path, []).append(t)
        self._opens.move_to_end(path)
        while len(self._opens) > STAGED_MAX:
            self._opens.popitem(last=False)

    def open_stamp(self, path: str) -> int | None:
        """The stamp of the oldest open of ``path`` not closed yet (and forget it)."""
        stamps = self._opens.get(path)
        if not stamps:
            return None
        t = stamps.pop(0)
        if not stamps:
            del self._opens[path]
        return t

    def read(self, path: str, t: int, mono: float) -> None:
        """A file was closed without a write: a read. Reads of a checkpoint's files (not the watcher's own, not
        during its save) are a load of it, from the first open to the last close of a burst."""
        opened = self.open_stamp(path)
        if self._own_reads.get(path):
            self._own_reads[path] -= 1
            return
        p = self._saves.place(path, is_dir=False)
        if p is None or p.kind not in ("unit", "file") or self._saves.pending(p.key):
            return
        load = self._loads.get(p.key)
        first = t if opened is None else min(opened, t)
        if load is None:
            load = self._loads[p.key] = PendingLoad(
                p.root, p.key, first, t, mono, self._saves.saved_step(p.key)
            )
        load.first_ns, load.last_ns, load.last_mono = min(load.first_ns, first), max(load.last_ns, t), mono
        load.files.add(path)

    def end_due(self, mono: float) -> float | None:
        """End every load quiet long enough by ``mono``; returns when the next may be due (monotonic
        seconds), None: none pending."""
        next_due: float | None = None
        for load in list(self._loads.values()):
            due = load.last_mono + self._quiet_s
            if due <= mono:
                self._end(load)
            else:
                next_due = due if next_due is None else min(next_due, due)
        return next_due

    def end_all(self) -> None:
        """End every load in progress now, oldest first (the watcher is stopping)."""
        for load in sorted(self._loads.values(), key=lambda x: x.first_ns):
            self._end(load)
        self._loads.clear()

    def _end(self, load: PendingLoad) -> None:
        self._loads.pop(load.key, None)
        self._recorder.load(load.root, load.key, load.first_ns, load.last_ns, len(load.files), load.step)
