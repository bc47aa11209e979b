"""A checkpoint save the watcher has seen begin (:class:`PendingSave`) and how it is judged: when it may end by
being quiet, whether a file in it is still changing, and whether what it left on disk is complete (the rules of
:mod:`chaosbench.workloads.checkpoint_watch`: "Completeness"). The format of one file is judged by a function
the caller passes (``whole``), so the caller decides which reads of the files are its own."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from chaosbench.injectors.corrupt_checkpoint.formats import DCP_SUFFIX, METADATA_FILE
from chaosbench.workloads.checkpoint_watch_paths import CheckpointLayout, is_dcp_name

#: ``whole(path, open_for_write)``: why the file at ``path`` is not whole, None when it is
#: (``open_for_write``: written and not closed since, as far as the watcher saw).
WholeCheck = Callable[[str, bool], str | None]


@dataclass
class PendingSave:
    """A save in progress (``key``: the file or checkpoint directory, absolute; ``root``: its watched
    directory). Stamps: ``first_ns``/``last_ns`` wall-clock ns of its first and last activity seen,
    ``last_mono`` monotonic seconds of the last."""

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


def file_stat(path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of a regular file; None: gone or not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def judge_file(save: PendingSave, whole: WholeCheck) -> tuple[list[str], int, int]:
    """(problems, files, bytes) of a checkpoint file's save."""
    st = file_stat(save.key)
    if st is None:
        return ["vanished before it was judged"], 0, 0
    problem = whole(save.key, save.key in save.written)
    return ([problem] if problem else []), 1, st[0]


def judge_dir(
    save: PendingSave, layout: CheckpointLayout, whole: WholeCheck
) -> tuple[list[str], int, int, bool]:
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
            METADATA_FILE in names and (file_stat(os.path.join(here, METADATA_FILE)) or (0, 0))[0] > 0
        ):
            problems.append(f"{layout.rel(save.key, here)}: *{DCP_SUFFIX} files without a {METADATA_FILE}")
        for name in sorted(names):
            path = os.path.join(here, name)
            st = file_stat(path)
            if st is None:
                continue
            files += 1
            nbytes += st[0]
            holds = holds or layout.counts(save.root, path)
            problem = whole(path, path in save.written)
            if problem:
                problems.append(f"{layout.rel(save.key, path)}: {problem}")
    return problems, files, nbytes, holds


def quiet_due(save: PendingSave, quiet_s: float, empty_hold_s: float) -> float | None:
    """When a save may end by being quiet (monotonic seconds); None: not before another event."""
    if save.written or (not save.is_dir and not save.created):
        return None
    due = save.last_mono + quiet_s
    for created_mono, st in save.created.values():
        if st is not None and st[0] == 0:  # created empty: its writer may not have begun to write
            due = max(due, created_mono + empty_hold_s)
    return due


def created_changed(save: PendingSave, mono: float) -> bool:
    """Whether a file created in the save and not written since (as far as inotify said) changed: a write
    still under way (one long write() reports nothing until it returns). Records the change (and ``mono`` as
    the save's last activity)."""
    changed = False
    for path, (created_mono, st) in list(save.created.items()):
        now = file_stat(path)
        if now is not None and now != st:
            save.created[path] = (created_mono, now)
            changed = True
    if changed:
        save.last_mono = mono
    return changed
