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
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
from chaosbench.injectors.corrupt_checkpoint.formats import (
    DCP_SUFFIX,
    METADATA_FILE,
    step_of,
    torch_save_complete,
)
from chaosbench.timeline.events import TimelineWriter, now_ns

logger = logging.getLogger(__name__)

#: The ``src`` of the watcher's events.
SRC = "watcher"
#: Their ``via``.
VIA = "filesystem"
#: The ``proc`` of its ``log`` events.
LOG_PROC = "checkpoint-watch"
#: Suffixes of checkpoint files (the default of ``names``).
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", DCP_SUFFIX)
#: Suffixes whose zip files are torch.save archives.
TORCH_SAVE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
#: The names DCP gives its files besides ``*.distcp`` (FileSystemWriter renames ``.metadata.tmp`` when done).
DCP_NAMES = (METADATA_FILE, METADATA_FILE + ".tmp")

_CHECKPOINT_DIR_WORD = re.compile(r"^\d+$|step|ckpt|checkpoint|iter|epoch|snapshot", re.IGNORECASE)
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
#: First-write stamps kept for files and temporary directories that may be renamed into a checkpoint's name.
_STAGED_MAX = 4096
_ERRORS_LOGGED_MAX = 20
#: How long stop() waits for the events already queued to be handled.
_DRAIN_S = 1.0
_JOIN_S = 5.0


def is_temporary_name(name: str) -> bool:
    """Whether a file or directory name is a temporary one (written, then renamed or removed)."""
    return name.startswith(".") or name.endswith((".tmp", ".part", "~")) or ".tmp" in name


def is_dcp_name(name: str) -> bool:
    """Whether a file name is one that torch.distributed.checkpoint writes."""
    return name in DCP_NAMES or name.endswith(DCP_SUFFIX)


def is_checkpoint_dir_name(name: str) -> bool:
    """Whether a directory's name marks it a checkpoint directory: a trailing step number and a number or a
    checkpoint word (``checkpoint-300``, ``step_20``, ``global_step40``, ``20``; not ``version_0``)."""
    return (
        not is_temporary_name(name) and step_of(name) is not None and bool(_CHECKPOINT_DIR_WORD.search(name))
    )


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


def _stat(path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of a regular file; None: gone or not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


@dataclass(frozen=True)
class _Place:
    """Where a path belongs: to the save of a checkpoint directory (``unit``: ``key`` is that directory), to a
    temporary directory (``staging``: ``key`` is it), as a checkpoint file (``file``), or nowhere (``other``)."""

    root: str
    kind: Literal["unit", "staging", "file", "other"]
    key: str


@dataclass
class _Save:
    """A save in progress (``key``: the file or checkpoint directory, absolute)."""

    root: str
    key: str
    is_dir: bool
    first_ns: int
    last_ns: int
    last_mono: float
    name_step: int | None
    confirmed: bool  # a directory: holds a checkpoint file (a file: always)
    dcp_only: bool = False  # a directory that is one for its DCP files only: its own files are the save
    begun: bool = False
    timeline_step: int | None = None
    sampled: bool = False
    written: set[str] = field(default_factory=set)  # written, not closed since
    created: dict[str, tuple[float, tuple[int, int] | None]] = field(
        default_factory=dict
    )  # created, not written


@dataclass
class _Load:
    """A read of a checkpoint in progress (``key``: the file or checkpoint directory, absolute)."""

    root: str
    key: str
    first_ns: int
    last_ns: int
    last_mono: float
    step: int | None  # the step its last save before the read was written with
    files: set[str] = field(default_factory=set)


@dataclass
class _Staged:
    first_ns: int
    closed: bool = False


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
        self._roots = sorted({os.path.abspath(os.fspath(d)) for d in dirs}, key=len, reverse=True)
        # a directory inside another watched one is seen through that one's recursive watch, once
        self._watch_roots = [r for r in self._roots if not any(r.startswith(o + os.sep) for o in self._roots)]
        self._timeline = timeline
        self._current_step = current_step
        self._quiet_s = float(quiet_s)
        self._empty_hold_s = float(empty_hold_s)
        self._names: list[re.Pattern[str]] | None = None
        if names is not None:
            self._names = []
            for rx in names:
                try:
                    self._names.append(re.compile(rx))
                except re.error as exc:
                    raise ValueError(f"checkpoint name pattern {rx!r} is not a valid regex: {exc}") from None
        self._cond = threading.Condition(threading.RLock())
        self._saves: dict[str, _Save] = {}
        self._loads: dict[str, _Load] = {}
        self._opens: OrderedDict[str, list[int]] = OrderedDict()  # path -> stamps of its opens not closed yet
        self._own_reads: dict[str, int] = {}  # path -> the watcher's own reads (its judging) still to come
        self._saved_step: dict[str, int | None] = {}  # checkpoint -> the step its last save was written with
        self._staged: OrderedDict[str, _Staged] = OrderedDict()
        self._dir_born: OrderedDict[str, int] = OrderedDict()
        self._observer: BaseObserver | None = None
        self._judge: threading.Thread | None = None
        self._started = False
        self._stopping = False
        self._closed = False
        self._errors = 0

    @property
    def dirs(self) -> list[Path]:
        """The watched directories (absolute)."""
        return [Path(r) for r in self._roots]

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
        for root in self._roots:
            os.makedirs(root, exist_ok=True)
        observer = InotifyObserver(generate_full_events=True)
        observer.daemon = True
        handler = _Handler(self._on_event)
        try:
            for root in self._watch_roots:
                observer.schedule(handler, root, recursive=True, event_filter=list(_EVENT_TYPES))
            observer.start()
        except OSError as exc:
            try:
                observer.stop()
            except Exception:  # noqa: BLE001 - already failing; the cause is what matters
                logger.debug("stopping a failed observer", exc_info=True)
            raise Unsupported(
                f"cannot watch {', '.join(self._watch_roots)}: {exc} (inotify watches are limited by "
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
            for save in sorted(self._saves.values(), key=lambda s: s.first_ns):
                try:
                    self._finish(save)
                except Exception as exc:  # noqa: BLE001 - one save's trouble must not lose the others
                    self._report(f"judging {save.key!r} at stop", exc)
            self._saves.clear()
            for load in sorted(self._loads.values(), key=lambda x: x.first_ns):
                self._end_load(load)
            self._loads.clear()
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

    # ------------------------------------------------------------------ errors and steps

    def _report(self, what: str, exc: BaseException) -> None:
        logger.warning("checkpoint watcher: error %s", what, exc_info=exc)
        with self._cond:
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

    def _step(self) -> int | None:
        try:
            value = self._current_step()
            return None if value is None else int(value)
        except Exception as exc:  # noqa: BLE001 - the caller's callback
            self._report("calling current_step()", exc)
            return None

    # ------------------------------------------------------------------ where a path belongs

    def _root_of(self, path: str) -> str | None:
        for root in self._roots:  # deepest first
            if path == root or path.startswith(root + os.sep):
                return root
        return None

    def _rel(self, root: str, path: str) -> str:
        return "." if path == root else Path(os.path.relpath(path, root)).as_posix()

    def _looks_like_checkpoint(self, rel: str, name: str) -> bool:
        if self._names is not None:
            return any(rx.search(rel) for rx in self._names)
        return name.lower().endswith(CHECKPOINT_SUFFIXES)

    def _counts(self, root: str, path: str) -> bool:
        """Whether a file inside a checkpoint directory makes it one (a checkpoint file or a DCP file)."""
        name = os.path.basename(path)
        return is_dcp_name(name) or (
            not is_temporary_name(name) and self._looks_like_checkpoint(self._rel(root, path), name)
        )

    def _place(self, path: str, is_dir: bool) -> _Place | None:
        root = self._root_of(path)
        if root is None or path == root:
            return None
        parts = path[len(root) + 1 :].split(os.sep)
        acc = root
        for name in parts if is_dir else parts[:-1]:
            acc = acc + os.sep + name
            if is_temporary_name(name):
                return _Place(root, "staging", acc)
            if is_checkpoint_dir_name(name):
                return _Place(root, "unit", acc)
        if is_dir:
            return _Place(root, "other", path)
        name = parts[-1]
        parent = os.path.dirname(path)
        pending = self._saves.get(parent) if parent != root else None  # the watched dir: only its DCP files
        if is_dcp_name(name) or (pending is not None and pending.is_dir):
            return _Place(root, "unit", parent)
        if not is_temporary_name(name) and self._looks_like_checkpoint(self._rel(root, path), name):
            return _Place(root, "file", path)
        return _Place(root, "other", path)

    def _name_step(self, root: str, key: str) -> int | None:
        return None if key == root else step_of(os.path.basename(key))

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
            self._report(f"handling {type(event).__name__} {os.fsdecode(event.src_path)!r}", exc)

    def _apply(self, event: FileSystemEvent, t: int, mono: float) -> None:
        src, dest, syn = os.fsdecode(event.src_path), os.fsdecode(event.dest_path), event.is_synthetic
        if isinstance(event, FileOpenedEvent):
            self._opened(src, t)
            return
        if isinstance(event, FileClosedNoWriteEvent):
            self._read(src, t, mono)
            return
        if isinstance(event, FileClosedEvent):
            self._open_stamp(src)  # closed after writing: that open was a write, no read
        if isinstance(event, DirMovedEvent):
            self._dir_moved(src, dest, t, mono, syn)
        elif isinstance(event, FileMovedEvent):
            self._file_moved(src, dest, t, mono, syn)
        elif isinstance(event, DirCreatedEvent):
            self._dir_created(src, t, mono, syn)
        elif isinstance(event, (DirDeletedEvent, FileDeletedEvent)):
            self._gone(src, isinstance(event, DirDeletedEvent), mono, "removed before it was judged")
        elif isinstance(event, FileCreatedEvent):
            self._file_event(src, "create", t, mono, syn)
        elif isinstance(event, FileModifiedEvent):
            self._file_event(src, "modify", t, mono, syn)
        elif isinstance(event, FileClosedEvent):
            self._file_event(src, "close", t, mono, syn)

    def _activity(self, save: _Save, t: int, mono: float, sample: bool) -> None:
        save.last_ns = max(save.last_ns, t)
        save.last_mono = mono
        if sample and save.name_step is None:
            save.timeline_step, save.sampled = self._step(), True

    def _unit(self, p: _Place, t: int, mono: float) -> _Save:
        save = self._saves.get(p.key)
        if save is None or not save.is_dir:
            save = _Save(
                root=p.root,
                key=p.key,
                is_dir=True,
                first_ns=min(t, self._dir_born.get(p.key, t)),
                last_ns=t,
                last_mono=mono,
                name_step=self._name_step(p.root, p.key),
                confirmed=False,
                dcp_only=p.key == p.root or not is_checkpoint_dir_name(os.path.basename(p.key)),
            )
            self._saves[p.key] = save
        return save

    def _confirm(self, save: _Save) -> None:
        if not save.confirmed:
            save.confirmed = True
            self._begin(save)

    def _file_event(self, path: str, what: str, t: int, mono: float, syn: bool) -> None:
        p = self._place(path, is_dir=False)
        if p is None:
            return
        if p.kind == "unit":
            unit = self._saves.get(p.key)
            if unit is None and what == "close":  # closed with no write seen: nothing was written
                return
            unit = self._unit(p, t, mono)
            if self._counts(p.root, path):
                self._confirm(unit)
            self._track(unit, path, what, t, mono, syn)
        elif p.kind == "file":
            save = self._saves.get(path)
            if what == "create" and syn:  # it came with a directory moved in from outside: whole at that move
                if save is None:
                    self._atomic(p, path, t, t, mono)
                return
            if what == "create" and os.path.islink(path):  # a link to a save already counted
                return
            if save is None:
                if what == "close":
                    return
                save = _Save(
                    root=p.root,
                    key=path,
                    is_dir=False,
                    first_ns=t,
                    last_ns=t,
                    last_mono=mono,
                    name_step=step_of(os.path.basename(path)),
                    confirmed=True,
                )
                self._saves[path] = save
                self._begin(save)
            self._track(save, path, what, t, mono, syn)
            if what == "close":
                self._finish(save)
        else:
            self._stage(p.key if p.kind == "staging" else path, t, what, reset=p.kind == "other")

    # ------------------------------------------------------------------ reads (loads)

    def _opened(self, path: str, t: int) -> None:
        self._opens.setdefault(path, []).append(t)
        self._opens.move_to_end(path)
        while len(self._opens) > _STAGED_MAX:
            self._opens.popitem(last=False)

    def _open_stamp(self, path: str) -> int | None:
        """The stamp of the oldest open of ``path`` not closed yet (and forget it)."""
        stamps = self._opens.get(path)
        if not stamps:
            return None
        t = stamps.pop(0)
        if not stamps:
            del self._opens[path]
        return t

    def _read(self, path: str, t: int, mono: float) -> None:
        """A file was closed without a write: a read. Reads of a checkpoint's files (not the watcher's own, not
        during its save) are a load of it, from the first open to the last close of a burst."""
        opened = self._open_stamp(path)
        if self._own_reads.get(path):
            self._own_reads[path] -= 1
            return
        p = self._place(path, is_dir=False)
        if p is None or p.kind not in ("unit", "file") or p.key in self._saves:
            return
        load = self._loads.get(p.key)
        first = t if opened is None else min(opened, t)
        if load is None:
            load = self._loads[p.key] = _Load(p.root, p.key, first, t, mono, self._saved_step.get(p.key))
        load.first_ns, load.last_ns, load.last_mono = min(load.first_ns, first), max(load.last_ns, t), mono
        load.files.add(path)

    def _end_load(self, load: _Load) -> None:
        self._loads.pop(load.key, None)
        name_step = self._name_step(load.root, load.key)
        step = name_step if name_step is not None else load.step
        fields = {
            "path": self._rel(load.root, load.key),
            "dir": load.root,
            "step": step,
            "step_from": "name" if name_step is not None else ("save" if step is not None else None),
            "via": VIA,
        }
        self._timeline.emit("ckpt_load_begin", t_ns=load.first_ns, src=SRC, **fields)
        self._timeline.emit("ckpt_load_end", t_ns=load.last_ns, src=SRC, files=len(load.files), **fields)

    def _track(self, save: _Save, path: str, what: str, t: int, mono: float, syn: bool) -> None:
        if what == "create":
            if syn:  # content of a directory moved in: arrived with the move, already stamped
                save.last_mono = mono
                return
            st = _stat(path)
            if st is not None:  # a link (or a file gone already) is written by no one
                save.created[path] = (mono, st)
            self._activity(save, t, mono, sample=True)
        elif what == "modify":
            save.created.pop(path, None)
            save.written.add(path)
            self._activity(save, t, mono, sample=False)
        else:
            save.created.pop(path, None)
            save.written.discard(path)
            self._activity(save, t, mono, sample=True)

    def _stage(self, key: str, t: int, what: str, reset: bool) -> None:
        rec = self._staged.get(key)
        if what == "close":
            if rec is not None:
                rec.closed = True
            return
        if rec is None or (reset and rec.closed):
            self._staged[key] = _Staged(t)
            self._staged.move_to_end(key)
            while len(self._staged) > _STAGED_MAX:
                self._staged.popitem(last=False)

    def _atomic(self, p: _Place, path: str, begin_ns: int, t: int, mono: float) -> None:
        stale = self._saves.pop(path, None)
        if stale is not None:
            self._vanish(stale, "replaced by a rename before it was closed")
        save = _Save(
            root=p.root,
            key=path,
            is_dir=False,
            first_ns=min(begin_ns, t),
            last_ns=t,
            last_mono=mono,
            name_step=step_of(os.path.basename(path)),
            confirmed=True,
        )
        self._saves[path] = save
        self._begin(save)
        self._activity(save, t, mono, sample=True)
        self._finish(save)

    def _file_moved(self, src: str, dest: str, t: int, mono: float, syn: bool) -> None:
        sp = self._place(src, is_dir=False) if src else None
        dp = self._place(dest, is_dir=False) if dest else None
        begin: int | None = None
        moved: _Save | None = None
        if sp is not None:
            if sp.kind == "file":
                moved = self._saves.pop(src, None)
            elif sp.kind == "unit":
                unit = self._saves.get(sp.key)
                if unit is not None:
                    unit.written.discard(src)
                    unit.created.pop(src, None)
                    unit.last_mono = mono
            elif sp.kind == "staging":
                rec = self._staged.get(sp.key)  # kept: the rest of the directory may follow
                begin = rec.first_ns if rec is not None else None
            else:
                staged = self._staged.pop(src, None)
                begin = staged.first_ns if staged is not None else None
        if dp is not None and dp.kind == "file":
            if moved is not None:  # a save renamed while pending: continues under its new name
                moved.key, moved.root, moved.name_step = dest, dp.root, step_of(os.path.basename(dest))
                moved.written.discard(src)
                moved.created.pop(src, None)
                self._saves[dest] = moved
                if not syn:  # renamed itself: whole at the rename
                    self._activity(moved, t, mono, sample=True)
                    self._finish(moved)
            elif not syn or (sp is not None and sp.kind == "staging") or not src:
                self._atomic(dp, dest, t if begin is None else begin, t, mono)
            return  # else: a directory of checkpoints saved before was renamed; nothing new was written
        if moved is not None:
            self._vanish(
                moved, f"renamed to {dest or 'outside the watched directories'!r} before it was closed"
            )
        if dp is None:
            return
        if dp.kind == "unit":
            unit = self._unit(dp, t, mono)
            if begin is not None and not unit.begun:
                unit.first_ns = min(unit.first_ns, begin)
            if self._counts(dp.root, dest):
                self._confirm(unit)
            unit.written.discard(dest)
            unit.created.pop(dest, None)
            if syn:
                unit.last_mono = mono
            else:
                self._activity(unit, t, mono, sample=True)
        else:
            key = dp.key if dp.kind == "staging" else dest
            if key not in self._staged:
                self._staged[key] = _Staged(t if begin is None else begin, closed=True)

    def _dir_created(self, path: str, t: int, mono: float, syn: bool) -> None:
        if not syn:
            self._dir_born[path] = t
            while len(self._dir_born) > _STAGED_MAX:
                self._dir_born.popitem(last=False)
        p = self._place(path, is_dir=True)
        if p is None:
            return
        if p.kind == "unit":
            if syn:
                unit = self._saves.get(p.key)
                if unit is not None:
                    unit.last_mono = mono
                return
            self._activity(self._unit(p, t, mono), t, mono, sample=False)
        elif p.kind == "staging":
            self._stage(p.key, t, "create", reset=False)

    def _dir_moved(self, src: str, dest: str, t: int, mono: float, syn: bool) -> None:
        if syn:  # a subdirectory of a directory renamed: that rename was handled
            return
        if not dest:
            self._gone(src, True, mono, "moved out of the watched directories before it was judged")
            return
        prefix = src + os.sep if src else None

        def moved_path(x: str) -> str:
            return dest + x[len(src) :] if prefix is not None and (x == src or x.startswith(prefix)) else x

        for key in [k for k in self._saves if prefix is not None and (k == src or k.startswith(prefix))]:
            save = self._saves.pop(key)
            nk = moved_path(key)
            np = self._place(nk, is_dir=save.is_dir)
            save.written = {moved_path(w) for w in save.written}
            save.created = {moved_path(c): v for c, v in save.created.items()}
            if np is not None and np.kind == ("unit" if save.is_dir else "file") and np.key == nk:
                save.key, save.root, save.name_step = nk, np.root, self._name_step(np.root, nk)
                self._saves[nk] = save
                self._activity(save, t, mono, sample=True)
            else:
                self._vanish(
                    save, f"renamed to {self._rel(np.root, nk) if np else nk!r} before it was judged"
                )
        for save in self._saves.values():  # src inside a pending directory save
            if save.is_dir and prefix is not None and src.startswith(save.key + os.sep):
                save.written = {moved_path(w) for w in save.written}
                save.created = {moved_path(c): v for c, v in save.created.items()}
                save.last_mono = mono
        sp = self._place(src, is_dir=True) if src else None
        staged = self._staged.get(sp.key) if sp is not None and sp.kind == "staging" else None
        dp = self._place(dest, is_dir=True)
        if dp is None:
            return
        if dp.kind == "unit":
            unit = self._unit(dp, t, mono)
            if staged is not None and not unit.begun:
                unit.first_ns = min(unit.first_ns, staged.first_ns)
            self._activity(unit, t, mono, sample=True)
        elif dp.kind == "staging" and dp.key not in self._staged:
            self._staged[dp.key] = _Staged(t if staged is None else staged.first_ns)

    def _gone(self, path: str, is_dir: bool, mono: float, reason: str) -> None:
        prefix = path + os.sep
        if is_dir and path in self._roots:
            self._timeline.emit(
                "log",
                src=SRC,
                proc=LOG_PROC,
                line=f"checkpoint watcher: the watched directory {path} was removed",
            )
        for key in [k for k in self._saves if k == path or (is_dir and k.startswith(prefix))]:
            self._vanish(self._saves.pop(key), reason)
        for save in self._saves.values():
            if save.is_dir and path.startswith(save.key + os.sep):
                save.written = {w for w in save.written if w != path and not w.startswith(prefix)}
                save.created = {
                    c: v for c, v in save.created.items() if c != path and not c.startswith(prefix)
                }
                save.last_mono = mono
        self._staged.pop(path, None)
        self._dir_born.pop(path, None)
        if is_dir:
            for table in (self._staged, self._dir_born):
                for key in [k for k in table if k.startswith(prefix)]:
                    del table[key]

    # ------------------------------------------------------------------ judging

    def _fields(self, save: _Save, step: int | None) -> dict[str, object]:
        step_from = "name" if save.name_step is not None else ("timeline" if step is not None else None)
        return {
            "path": self._rel(save.root, save.key),
            "dir": save.root,
            "step": step,
            "step_from": step_from,
            "via": VIA,
        }

    def _begin(self, save: _Save) -> None:
        save.begun = True
        step = save.name_step if save.name_step is not None else self._step()
        self._timeline.emit("ckpt_save_begin", t_ns=save.first_ns, src=SRC, **self._fields(save, step))

    def _vanish(self, save: _Save, reason: str) -> None:
        if save.is_dir and not save.confirmed:
            return
        if not save.begun:
            self._begin(save)
        step = (
            save.name_step
            if save.name_step is not None
            else (save.timeline_step if save.sampled else self._step())
        )
        self._timeline.emit(
            "ckpt_save_end",
            t_ns=save.last_ns,
            src=SRC,
            **self._fields(save, step),
            complete=False,
            files=0,
            bytes=0,
            incomplete=reason,
        )

    def _finish(self, save: _Save) -> None:
        """Judge a save and write its end (and its begin, when not written yet)."""
        self._saves.pop(save.key, None)
        if save.is_dir:
            problems, files, nbytes, holds = self._judge_dir(save)
            if not (save.confirmed or holds):
                return  # a directory with a step in its name that never held a checkpoint
            save.confirmed = True
        else:
            problems, files, nbytes = self._judge_file(save)
        if not save.begun:
            self._begin(save)
        step = (
            save.name_step
            if save.name_step is not None
            else (save.timeline_step if save.sampled else self._step())
        )
        self._saved_step[save.key] = step
        extra: dict[str, object] = {"complete": not problems, "files": files, "bytes": nbytes}
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            extra["incomplete"] = "; ".join(problems[:3]) + more
        self._timeline.emit("ckpt_save_end", t_ns=save.last_ns, src=SRC, **self._fields(save, step), **extra)

    def _whole(self, path: str, open_for_write: bool) -> str | None:
        if path.lower().endswith((SAFETENSORS_SUFFIX, *TORCH_SAVE_SUFFIXES)) and os.path.isfile(path):
            self._own_reads[path] = self._own_reads.get(path, 0) + 1  # format_problem opens it once
        known, problem = format_problem(path)
        if known:
            return problem
        return "still being written when the watcher stopped" if open_for_write else None

    def _judge_file(self, save: _Save) -> tuple[list[str], int, int]:
        st = _stat(save.key)
        if st is None:
            return ["vanished before it was judged"], 0, 0
        problem = self._whole(save.key, save.key in save.written)
        return ([problem] if problem else []), 1, st[0]

    def _judge_dir(self, save: _Save) -> tuple[list[str], int, int, bool]:
        """(problems, files, bytes, whether it holds a checkpoint file) of a checkpoint directory."""
        if not os.path.isdir(save.key):
            return ["vanished before it was judged"], 0, 0, False
        problems: list[str] = []
        files = nbytes = 0
        holds = False
        for here, subdirs, names in os.walk(save.key):
            if save.dcp_only:  # its own files only; in the watched dir itself, only the DCP ones
                subdirs.clear()
                names = [n for n in names if is_dcp_name(n)] if save.key == save.root else names
            dcp = any(n.endswith(DCP_SUFFIX) for n in names)
            if dcp and not (
                METADATA_FILE in names and (_stat(os.path.join(here, METADATA_FILE)) or (0, 0))[0] > 0
            ):
                problems.append(f"{self._rel(save.key, here)}: *{DCP_SUFFIX} files without a {METADATA_FILE}")
            for name in sorted(names):
                path = os.path.join(here, name)
                st = _stat(path)
                if st is None:
                    continue
                files += 1
                nbytes += st[0]
                holds = holds or self._counts(save.root, path)
                problem = self._whole(path, path in save.written)
                if problem:
                    problems.append(f"{self._rel(save.key, path)}: {problem}")
        return problems, files, nbytes, holds

    def _due(self, save: _Save) -> float | None:
        """When a save may end by being quiet (monotonic seconds); None: not before another event."""
        if save.written or (not save.is_dir and not save.created):
            return None
        due = save.last_mono + self._quiet_s
        for created_mono, st in save.created.values():
            if st is not None and st[0] == 0:  # created empty: its writer may not have begun to write
                due = max(due, created_mono + self._empty_hold_s)
        return due

    def _changed(self, save: _Save, mono: float) -> bool:
        """Whether a file created in the save and not written since (as far as inotify said) changed: a write
        still under way (one long write() reports nothing until it returns)."""
        changed = False
        for path, (created_mono, st) in list(save.created.items()):
            now = _stat(path)
            if now is not None and now != st:
                save.created[path] = (created_mono, now)
                changed = True
        if changed:
            save.last_mono = mono
        return changed

    def _judge_loop(self) -> None:
        with self._cond:
            while not self._closed:
                mono = time.monotonic()
                next_due: float | None = None
                for save in list(self._saves.values()):
                    try:
                        due = self._due(save)
                        if due is not None and due <= mono and not self._changed(save, mono):
                            self._finish(save)
                            continue
                        due = self._due(save)
                    except Exception as exc:  # noqa: BLE001 - drop the save rather than fail on it forever
                        self._saves.pop(save.key, None)
                        self._report(f"judging {save.key!r}", exc)
                        continue
                    if due is not None:
                        next_due = due if next_due is None else min(next_due, due)
                for load in list(self._loads.values()):
                    due = load.last_mono + self._quiet_s
                    if due <= mono:
                        self._end_load(load)
                    else:
                        next_due = due if next_due is None else min(next_due, due)
                self._cond.wait(None if next_due is None else max(0.0, next_due - time.monotonic()))
