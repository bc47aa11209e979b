"""What the checkpoint watcher writes into the timeline (:class:`WatchRecorder`): ``ckpt_save_begin`` and
``ckpt_save_end`` of a save, ``ckpt_load_begin`` and ``ckpt_load_end`` of a load, and ``log`` events for its
own errors; the fields are those of :mod:`chaosbench.workloads.checkpoint_watch` ("Events", "Loads",
"Failures")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from chaosbench.timeline.events import TimelineWriter
from chaosbench.workloads.checkpoint_watch_judge import PendingSave
from chaosbench.workloads.checkpoint_watch_paths import CheckpointLayout

logger = logging.getLogger("chaosbench.workloads.checkpoint_watch")

#: The ``src`` of the watcher's events.
SRC = "watcher"
#: Their ``via``.
VIA = "filesystem"
#: The ``proc`` of its ``log`` events.
LOG_PROC = "checkpoint-watch"
_ERRORS_LOGGED_MAX = 20


class WatchRecorder:
    """Writes the watcher's events to ``timeline`` (``src="watcher"``, no ``rank``) and asks ``current_step``
    for the job's latest step. ``lock``: the watcher's lock (counts the errors written); the other methods are
    called holding it."""

    def __init__(
        self, timeline: TimelineWriter, current_step: Callable[[], int | None], lock: threading.Condition
    ) -> None:
        self._timeline = timeline
        self._current_step = current_step
        self._lock = lock
        self._errors = 0

    def report(self, what: str, exc: BaseException) -> None:
        """Log an error of the watcher's (``what`` it was doing) and write it as a ``log`` event, the first
        20 of them; never raises (a timeline that cannot be written is left to the log)."""
        logger.warning("checkpoint watcher: error %s", what, exc_info=exc)
        with self._lock:
            self._errors += 1
            n = self._errors
        if n > _ERRORS_LOGGED_MAX:
            return
        more = " (further errors are not written)" if n == _ERRORS_LOGGED_MAX else ""
        try:
            self._timeline.emit(
                "log",
                src=SRC,
                proc=LOG_PROC,
                line=f"checkpoint watcher: error {what}: {type(exc).__name__}: {exc}{more}",
            )
        except Exception:  # noqa: BLE001 - the timeline itself failing (closed): only the log is left
            logger.exception("checkpoint watcher: cannot write to the timeline")

    def step(self) -> int | None:
        """``current_step()`` as an int; None when it has none or raised (reported)."""
        try:
            value = self._current_step()
            return None if value is None else int(value)
        except Exception as exc:  # noqa: BLE001 - the caller's callback
            self.report("calling current_step()", exc)
            return None

    def root_removed(self, path: str) -> None:
        """A ``log`` event: the watched directory ``path`` was removed."""
        self._timeline.emit(
            "log",
            src=SRC,
            proc=LOG_PROC,
            line=f"checkpoint watcher: the watched directory {path} was removed",
        )

    @staticmethod
    def _fields(save: PendingSave, step: int | None) -> dict[str, object]:
        step_from = "name" if save.name_step is not None else ("timeline" if step is not None else None)
        return {
            "path": CheckpointLayout.rel(save.root, save.key),
            "dir": save.root,
            "step": step,
            "step_from": step_from,
            "via": VIA,
        }

    def save_begin(self, save: PendingSave) -> None:
        """Write the save's ``ckpt_save_begin`` (stamped with its first activity) and mark it begun."""
        save.begun = True
        step = save.name_step if save.name_step is not None else self.step()
        self._timeline.emit("ckpt_save_begin", t_ns=save.first_ns, src=SRC, **self._fields(save, step))

    def end_step(self, save: PendingSave) -> int | None:
        """The step of a save's end: from its name, else the timeline's at its last close or rename seen,
        else the timeline's now."""
        if save.name_step is not None:
            return save.name_step
        return save.timeline_step if save.sampled else self.step()

    def save_end(
        self,
        save: PendingSave,
        step: int | None,
        *,
        complete: bool,
        files: int,
        nbytes: int,
        incomplete: str | None,
    ) -> None:
        """Write the save's ``ckpt_save_end`` (stamped with its last activity); ``incomplete``: why it is not
        complete, written only when given."""
        extra: dict[str, object] = {"complete": complete, "files": files, "bytes": nbytes}
        if incomplete is not None:
            extra["incomplete"] = incomplete
        self._timeline.emit("ckpt_save_end", t_ns=save.last_ns, src=SRC, **self._fields(save, step), **extra)

    def load(
        self, root: str, key: str, first_ns: int, last_ns: int, files: int, saved_step: int | None
    ) -> None:
        """Write ``ckpt_load_begin`` (at ``first_ns``) and ``ckpt_load_end`` (at ``last_ns``, with ``files``
        read) of a load of the checkpoint ``key``; its step from the name, else ``saved_step`` (the step its
        last save here was written with)."""
        name_step = CheckpointLayout.name_step(root, key)
        step = name_step if name_step is not None else saved_step
        fields = {
            "path": CheckpointLayout.rel(root, key),
            "dir": root,
            "step": step,
            "step_from": "name" if name_step is not None else ("save" if step is not None else None),
            "via": VIA,
        }
        self._timeline.emit("ckpt_load_begin", t_ns=first_ns, src=SRC, **fields)
        self._timeline.emit("ckpt_load_end", t_ns=last_ns, src=SRC, files=files, **fields)
