"""Following a live timeline: a background tail that hands every new event to subscribers (triggers,
heartbeat monitors)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chaosbench.errors import InvalidEvent
from chaosbench.timeline.events import Event, parse_lines

logger = logging.getLogger("chaosbench.timeline")


def _check(obj: Mapping[str, Any], path: str | None, line: int | None) -> None:
    from chaosbench.timeline.schema import check_obj

    check_obj(obj, path, line)


class TimelineFollower:
    """Tails a timeline file in a background thread and hands each new event to the subscribers.

    Subscribers are called from the follower thread, in file order, with every complete line written
    after the follower started reading (it reads the file from the beginning). ``poll_s`` bounds how late
    a subscriber sees an event; triggers and heartbeat monitors rely on it being small.

    Each line is validated against its kind's model (:mod:`chaosbench.timeline.schema`): a line that is not a
    valid event is handed to no subscriber; its :class:`~chaosbench.errors.InvalidEvent` (with the file and the
    line) is kept in :attr:`errors` and logged.
    """

    def __init__(self, path: str | os.PathLike[str], poll_s: float = 0.005) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._subs: list[Callable[[Event], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: list[BaseException] = []
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        with self._lock:
            self._subs.append(fn)

    def start(self) -> TimelineFollower:
        self._thread = threading.Thread(target=self._run, name="timeline-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._drain_once_more()

    @property
    def errors(self) -> list[BaseException]:
        return list(self._errors)

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def _dispatch(self, ev: Event) -> None:
        with self._lock:
            self.events.append(ev)
            subs = list(self._subs)
        for fn in subs:
            try:
                fn(ev)
            except BaseException as exc:  # noqa: BLE001 - a broken subscriber must not stop the tail
                self._errors.append(exc)

    _pos = 0
    _buf = b""
    _line = 0  # complete lines read so far

    def _read_new(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        self._pos += len(chunk)
        data = self._buf + chunk
        *complete, self._buf = data.split(b"\n")
        for raw in complete:
            self._line += 1
            try:
                events = parse_lines(
                    [raw.decode(errors="replace") + "\n"], self.path, check=_check, first_line=self._line
                )
            except InvalidEvent as exc:
                self._errors.append(exc)
                logger.warning("%s", exc)
                continue
            for ev in events:
                self._dispatch(ev)

    def _drain_once_more(self) -> None:
        self._read_new()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read_new()
            self._stop.wait(self.poll_s)
