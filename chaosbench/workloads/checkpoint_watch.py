"""Checkpoint saves and loads seen on the filesystem: ``ckpt_save_begin``/``ckpt_save_end`` and
``ckpt_load_begin``/``ckpt_load_end`` for the ``command`` workload's scripts that print nothing about their
checkpoints, so ``checkpoint_age_s`` and lost work have something to read.

:class:`CheckpointWatcher` watches directories (the run's checkpoint and working directories) recursively with
inotify (watchdog's inotify observer: no polling) and writes what it sees into the timeline, ``src="watcher"``,
no ``rank``. The contract:

**What is one save.**

- *A checkpoint file*: a file in a watched directory, or in a subdirectory of it that is no checkpoint directory,
  whose name looks like a checkpoint (suffix ``.pt .pth .ckpt .safetensors .bin .distcp``; ``names``, regexes
  searched in the path relative to the watched directory, replace that default) and is no temporary name
  (starting with ``.``, ending with ``.tmp``, ``.part`` or ``~``, or containing ``.tmp``). One save each time the file is
  written: from the first write seen (its creation, or the first modification after it was last closed) to its
  close after writing; or one save when a file is renamed into such a name (an atomic save, complete at the
  rename; its begin is the first write seen of the file renamed, else the rename). A file written again
  (``snapshot.pt``, ``last.ckpt``) is a new save each time. A symbolic link is no save (Lightning's ``last.ckpt``
  link points at a save already counted); a file closed with no write seen is none either.
- *A checkpoint directory*: the outermost directory below a watched directory whose name has a step
  (:func:`~chaosbench.injectors.corrupt_checkpoint.formats.step_of` finds a trailing number and the name is a
  number or names a ``step``, ``ckpt``, ``checkpoint``, ``iter``, ``epoch`` or ``snapshot``: ``checkpoint-300``,
  ``step_20``, ``global_step40``, ``iter_0000020``, ``20``; not ``version_0``, ``mp_rank_00``), or else the
  directory holding a DCP file (``.metadata``, ``.metadata.tmp``, ``*.distcp``; the watched directory itself
  too). One save from its creation (or the first write into it) until it has been quiet for ``quiet_s``: no
  write, close or rename in it, no file in it written and not yet closed, and no file in it created but not
  written (seen by its size and mtime) that changed; a file created empty and never written holds it at most
  ``empty_hold_s``. Everything written in it is part of that save, never a save of its own. A directory with
  a step is a save only once it holds a file that looks like a checkpoint (or a DCP file): a ``run_2/`` of
  logs is none. A temporary-named directory renamed into a checkpoint directory's name is one save (begin: its
  first write seen); a pending save renamed keeps going under its new name.
- Only changes after :meth:`CheckpointWatcher.start` count: what exists then is there already, not a save. A
  pending save that is removed (or renamed away) before it is judged ends incomplete (a directory that never
  held a checkpoint file is dropped); removals of judged checkpoints (HF ``save_total_limit``, Lightning's
  ``save_top_k``) write nothing.

**Events** (both: ``path`` relative to the watched directory it is in, ``.`` for that directory itself;
``dir``, that watched directory; ``step``; ``step_from``: ``"name"`` when ``step_of`` of the file's or
directory's name gave it, ``"timeline"`` when ``current_step()`` did, None when neither; ``via:
"filesystem"``):

- ``ckpt_save_begin``, stamped with the watcher's own ``time.time_ns()`` when the first write's inotify event
  reached it; written then (a checkpoint file; a directory once it is known to hold a checkpoint; an atomic
  save, with its end). Its timeline ``step`` is ``current_step()`` when it is written.
- ``ckpt_save_end``, stamped when the last write, close or rename of the save reached the watcher (not when the
  quiet period ran out: a directory's end is written ``quiet_s`` or more after its stamp; timelines are sorted
  when read), with ``complete`` (bool), ``files`` (the number of files in it), ``bytes`` (their total size),
  and ``incomplete`` (why not, only when not complete). Its timeline ``step`` is ``current_step()`` at the last
  close or rename seen (else when it is judged).

**Loads.** A file of a checkpoint (a checkpoint file, or any file in a checkpoint directory) opened and closed
without a write, by anyone but the watcher itself judging a save, outside that checkpoint's own save, is read;
the reads of one checkpoint until it has been quiet for ``quiet_s`` are one load: ``ckpt_load_begin`` stamped at
the first open, ``ckpt_load_end`` at the last close (``files``: how many of its files were read), with ``path``,
``dir``, ``via``, ``step`` (from the name, else the step its last save here was written with: ``step_from``
``"name"`` or ``"save"``; None for a checkpoint that was there before the watcher started). Which incarnation
loaded it is for the metrics to say (by when it happened: between a new incarnation's start and its first step).

**Completeness**, judged from the format when the save ends: a ``.pt .pth .ckpt .bin`` file that is a zip
(a torch.save archive) must pass
:func:`~chaosbench.injectors.corrupt_checkpoint.formats.torch_save_complete`, and one shorter than 4 bytes is
torn; a ``.safetensors`` must have its 8-byte header length, a JSON header of that length that parses and a
size at least the header's largest data end offset; a directory holding ``*.distcp`` files must hold a
non-empty ``.metadata``; a checkpoint directory is complete when every file in it is; any other file is taken
as whole once closed (one still being written when :meth:`CheckpointWatcher.stop` judges it is not).

**Failures.** An exception while handling an event or judging a save (or raised by ``current_step``) is caught
and written as a ``log`` event (``proc: checkpoint-watch``, the error in ``line``; the first 20); the watcher
keeps going. :meth:`CheckpointWatcher.start` raises :class:`~chaosbench.errors.Unsupported` where inotify is
missing or a directory cannot be watched (``fs.inotify.max_user_watches``).

**Where it lives.** This module: the watcher's lifecycle (inotify, its judging thread), the dispatch of
filesystem events and the file formats' completeness (:func:`format_problem`). Beside it:
``checkpoint_watch_paths`` (which names are checkpoints, where a path belongs), ``checkpoint_watch_saves``
(the saves in progress and what events do to them), ``checkpoint_watch_judge`` (a pending save, when it is
quiet, what it left on disk), ``checkpoint_watch_loads`` (reads and loads) and ``checkpoint_watch_timeline``
(the events written).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver

from chaosbench.errors import Unsupported
from chaosbench.injectors.corrupt_checkpoint.formats import torch_save_complete
from chaosbench.timeline.events import TimelineWriter, now_ns
from chaosbench.workloads.checkpoint_watch_loads import LoadTracker
from chaosbench.workloads.checkpoint_watch_paths import (
    CHECKPOINT_SUFFIXES,
    DCP_NAMES,
    CheckpointLayout,
    is_checkpoint_dir_name,
    is_dcp_name,
    is_temporary_name,
)
from chaosbench.workloads.checkpoint_watch_saves import SaveTracker
from chaosbench.workloads.checkpoint_watch_timeline import LOG_PROC, SRC, VIA, WatchRecorder

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DCP_NAMES",
    "LOG_PROC",
    "SAFETENSORS_SUFFIX",
    "SRC",
    "TORCH_SAVE_SUFFIXES",
    "VIA",
    "CheckpointWatcher",
    "format_problem",
    "is_checkpoint_dir_name",
    "is_dcp_name",
    "is_temporary_name",
]

logger = logging.getLogger(__name__)

#: Suffixes whose zip files are torch.save archives.
TORCH_SAVE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"

_ZIP_MAGIC = b"PK\x03\x04"
#: safetensors refuses headers above 100 MB; a larger length is no header.
_SAFETENSORS_HEADER_MAX = 100_000_000
#: Only these reach the handler (writes, renames and removals; opens and closes without a write: reads).
_EVENT_TYPES: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
    FileOpenedEvent,
    FileClosedNoWriteEvent,
]
#: How long stop() waits for the events already queued to be handled.
_DRAIN_S = 1.0
_JOIN_S = 5.0


def format_problem(path: str | os.PathLike[str]) -> tuple[bool, str | None]:
    """(whether the file is in a format known here, why it is not whole: None when it is) of one file, by its
    name and first bytes: torch.save zip archives (``.pt .pth .ckpt .bin``) and ``.safetensors``. A file that
    vanished is not whole. Any other file is (False, None): whole once closed."""
    p = Path(path)
    low = p.name.lower()
    try:
        if low.endswith(SAFETENSORS_SUFFIX):
            return True, _safetensors_problem(p)
        if low.endswith(TORCH_SAVE_SUFFIXES):
            with open(p, "rb") as f:  # one open of the file (the watcher tells its own reads from a load's)
                head = f.read(4)
                if len(head) < 4:
                    return True, f"{len(head)} bytes: torn"
                if head == _ZIP_MAGIC:
                    f.seek(0)
                    return True, None if torch_save_complete(
                        f
                    ) else "a torch.save zip without its end records: torn"
    except FileNotFoundError:
        return True, "vanished before it was judged"
    return False, None


def _safetensors_problem(p: Path) -> str | None:
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes: shorter than the 8-byte header length"
        (n,) = struct.unpack("<Q", head)
        if n > _SAFETENSORS_HEADER_MAX:
            return f"header length {n} is no safetensors header"
        if 8 + n > size:
            return f"{size} bytes: the {n}-byte header runs past the end"
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "the header is not valid JSON"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(entry["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            return f"header entry {name!r} has no data_offsets"
    if size < 8 + n + end:
        return f"{size} bytes: the header's tensors end at byte {8 + n + end}"
    return None


class _Handler(FileSystemEventHandler):
    def __init__(self, on_event: Callable[[FileSystemEvent], None]) -> None:
        self._on_event = on_event

    def dispatch(self, event: FileSystemEvent) -> None:
        self._on_event(event)


class CheckpointWatcher:
    """Writes ``ckpt_save_begin``/``ckpt_save_end`` for the checkpoint saves that appear under ``dirs`` (see the
    module's docstring for what counts and what is written).

    ``timeline``: where the events go (``src="watcher"``). ``current_step``: the job's latest step (the runner
    passes the newest one on its timeline), the step of a save whose name has none; called on the watcher's
    threads under its lock, so it must be quick and must not call the watcher. ``quiet_s``: how long a
    checkpoint directory must be quiet for its save to end. ``names``: regexes (searched in the path relative to
    the watched directory) of checkpoint files, instead of the default suffixes. ``empty_hold_s``: how long a
    file created empty and not written since holds its save open. Thread-safe; nothing global."""

    def __init__(
        self,
        dirs: Sequence[str | os.PathLike[str]],
        timeline: TimelineWriter,
        current_step: Callable[[], int | None] = lambda: None,
        quiet_s: float = 0.5,
        names: Sequence[str] | None = None,
        *,
        empty_hold_s: float = 30.0,
    ) -> None:
        if not dirs:
            raise ValueError("no directories to watch")
        if quiet_s <= 0 or empty_hold_s <= 0:
            raise ValueError("quiet_s and empty_hold_s must be positive")
        self._layout = CheckpointLayout(dirs, names)
        self._cond = threading.Condition(threading.RLock())
        self._recorder = WatchRecorder(timeline, current_step, self._cond)
        self._saves = SaveTracker(
            self._layout, self._recorder, self._whole, float(quiet_s), float(empty_hold_s)
        )
        self._loads = LoadTracker(self._saves, self._recorder, float(quiet_s))
        self._observer: BaseObserver | None = None
        self._judge: threading.Thread | None = None
        self._started = False
        self._stopping = False
        self._closed = False

    @property
    def dirs(self) -> list[Path]:
        """The watched directories (absolute)."""
        return [Path(r) for r in self._layout.roots]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Begin watching (recursively), creating the directories that are missing; what exists now is no save.
        Returns once the watches are in place. Raises RuntimeError when started before (or stopped), and
        :class:`~chaosbench.errors.Unsupported` when inotify cannot watch the directories."""
        with self._cond:
            if self._started or self._stopping:
                raise RuntimeError("a CheckpointWatcher starts once")
            self._started = True
        try:
            from watchdog.observers.inotify import InotifyObserver
        except Exception as exc:  # noqa: BLE001 - no inotify on this platform: whatever its import raises
            raise Unsupported(
                f"the checkpoint watcher needs inotify (Linux): {type(exc).__name__}: {exc}"
            ) from None
        for root in self._layout.roots:
            os.makedirs(root, exist_ok=True)
        observer = InotifyObserver(generate_full_events=True)
        observer.daemon = True
        handler = _Handler(self._on_event)
        try:
            for root in self._layout.watch_roots:
                observer.schedule(handler, root, recursive=True, event_filter=list(_EVENT_TYPES))
            observer.start()
        except OSError as exc:
            try:
                observer.stop()
            except Exception:  # noqa: BLE001 - already failing; the cause is what matters
                logger.debug("stopping a failed observer", exc_info=True)
            raise Unsupported(
                f"cannot watch {', '.join(self._layout.watch_roots)}: {exc} (inotify watches are limited by "
                "fs.inotify.max_user_watches)"
            ) from exc
        self._observer = observer
        self._judge = threading.Thread(target=self._judge_loop, name="checkpoint-watch-judge", daemon=True)
        self._judge.start()

    def stop(self) -> None:
        """Handle the events already queued (up to a second), stop watching, and judge every save still pending
        as of now (ended at its last write seen; a file still being written is not whole). Idempotent; safe
        when never started."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            observer = self._observer
        if observer is not None:
            self._drain(observer)
            observer.stop()
            observer.join(_JOIN_S)
        with self._cond:
            self._closed = True
            self._saves.finish_all()
            self._loads.end_all()
            self._cond.notify_all()
        if self._judge is not None:
            self._judge.join(_JOIN_S)

    def __enter__(self) -> CheckpointWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _drain(observer: BaseObserver) -> None:
        q = observer.event_queue
        deadline = time.monotonic() + _DRAIN_S
        with q.all_tasks_done:
            while q.unfinished_tasks and (left := deadline - time.monotonic()) > 0:
                q.all_tasks_done.wait(left)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: FileSystemEvent) -> None:
        t_ns, mono = now_ns(), time.monotonic()
        try:
            with self._cond:
                if self._closed:
                    return
                self._apply(event, t_ns, mono)
                self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - an exception would end watchdog's dispatching thread
            self._recorder.report(f"handling {type(event).__name__} {os.fsdecode(event.src_path)!r}", exc)

    def _apply(self, event: FileSystemEvent, t: int, mono: float) -> None:
        src, dest, syn = os.fsdecode(event.src_path), os.fsdecode(event.dest_path), event.is_synthetic
        if isinstance(event, FileOpenedEvent):
            self._loads.opened(src, t)
            return
        if isinstance(event, FileClosedNoWriteEvent):
            self._loads.read(src, t, mono)
            return
        if isinstance(event, FileClosedEvent):
            self._loads.open_stamp(src)  # closed after writing: that open was a write, no read
        if isinstance(event, DirMovedEvent):
            self._saves.dir_moved(src, dest, t, mono, syn)
        elif isinstance(event, FileMovedEvent):
            self._saves.file_moved(src, dest, t, mono, syn)
        elif isinstance(event, DirCreatedEvent):
            self._saves.dir_created(src, t, mono, syn)
        elif isinstance(event, (DirDeletedEvent, FileDeletedEvent)):
            self._saves.gone(src, isinstance(event, DirDeletedEvent), mono, "removed before it was judged")
        elif isinstance(event, FileCreatedEvent):
            self._saves.file_event(src, "create", t, mono, syn)
        elif isinstance(event, FileModifiedEvent):
            self._saves.file_event(src, "modify", t, mono, syn)
        elif isinstance(event, FileClosedEvent):
            self._saves.file_event(src, "close", t, mono, syn)

    # ------------------------------------------------------------------ judging

    def _whole(self, path: str, open_for_write: bool) -> str | None:
        """Why the file at ``path`` is not whole (None: it is) by its format; a file of no format known here
        is whole unless still open for writing. Its read here is the watcher's own, no load."""
        if path.lower().endswith((SAFETENSORS_SUFFIX, *TORCH_SAVE_SUFFIXES)) and os.path.isfile(path):
            self._loads.own_read(path)  # format_problem opens it once
        known, problem = format_problem(path)
        if known:
            return problem
        return "still being written when the watcher stopped" if open_for_write else None

    def _judge_loop(self) -> None:
        with self._cond:
            while not self._closed:
                mono = time.monotonic()
                due_saves = self._saves.finish_due(mono)
                due_loads = self._loads.end_due(mono)
                dues = [d for d in (due_saves, due_loads) if d is not None]
                next_due = min(dues) if dues else None
                self._cond.wait(None if next_due is None else max(0.0, next_due - time.monotonic()))
