"""Where a path under the checkpoint watcher's directories belongs: the names of checkpoint files, checkpoint
directories, DCP files and temporary files, and :class:`CheckpointLayout`, which places a path in one watched
directory as part of a checkpoint directory's save, of a temporary directory, as a checkpoint file, or nowhere.
The rules are those of :mod:`chaosbench.workloads.checkpoint_watch` ("What is one save")."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from chaosbench.injectors.corrupt_checkpoint.formats import DCP_SUFFIX, METADATA_FILE, step_of

#: Suffixes of checkpoint files (the default of ``names``).
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", DCP_SUFFIX)
#: The names DCP gives its files besides ``*.distcp`` (FileSystemWriter renames ``.metadata.tmp`` when done).
DCP_NAMES = (METADATA_FILE, METADATA_FILE + ".tmp")

_CHECKPOINT_DIR_WORD = re.compile(r"^\d+$|step|ckpt|checkpoint|iter|epoch|snapshot", re.IGNORECASE)


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


@dataclass(frozen=True)
class Place:
    """Where a path belongs: to the save of a checkpoint directory (``unit``: ``key`` is that directory), to a
    temporary directory (``staging``: ``key`` is it), as a checkpoint file (``file``), or nowhere (``other``)."""

    root: str
    kind: Literal["unit", "staging", "file", "other"]
    key: str


class CheckpointLayout:
    """The watched directories (absolute, deepest first) and which names are checkpoint files in them.

    ``names``: regexes searched in the path relative to its watched directory, instead of the default suffixes;
    raises ValueError naming the pattern that is no valid regex. Immutable after construction; pure functions
    of paths (and of the pending directory saves :meth:`place` is told about)."""

    def __init__(self, dirs: Sequence[str | os.PathLike[str]], names: Sequence[str] | None) -> None:
        self.roots = sorted({os.path.abspath(os.fspath(d)) for d in dirs}, key=len, reverse=True)
        # a directory inside another watched one is seen through that one's recursive watch, once
        self.watch_roots = [r for r in self.roots if not any(r.startswith(o + os.sep) for o in self.roots)]
        self._names: list[re.Pattern[str]] | None = None
        if names is not None:
            self._names = []
            for rx in names:
                try:
                    self._names.append(re.compile(rx))
                except re.error as exc:
                    raise ValueError(f"checkpoint name pattern {rx!r} is not a valid regex: {exc}") from None

    def root_of(self, path: str) -> str | None:
        """The deepest watched directory holding ``path`` (or being it); None: outside them all."""
        for root in self.roots:  # deepest first
            if path == root or path.startswith(root + os.sep):
                return root
        return None

    @staticmethod
    def rel(root: str, path: str) -> str:
        """``path`` relative to ``root`` (POSIX separators), ``.`` for ``root`` itself."""
        return "." if path == root else Path(os.path.relpath(path, root)).as_posix()

    def looks_like_checkpoint(self, rel: str, name: str) -> bool:
        """Whether a file (``rel``: relative to its watched directory; ``name``: its own name) is named like a
        checkpoint: by ``names`` when given, else by its suffix."""
        if self._names is not None:
            return any(rx.search(rel) for rx in self._names)
        return name.lower().endswith(CHECKPOINT_SUFFIXES)

    def counts(self, root: str, path: str) -> bool:
        """Whether a file inside a checkpoint directory makes it one (a checkpoint file or a DCP file)."""
        name = os.path.basename(path)
        return is_dcp_name(name) or (
            not is_temporary_name(name) and self.looks_like_checkpoint(self.rel(root, path), name)
        )

    def place(self, path: str, is_dir: bool, pending_dir: Callable[[str], bool]) -> Place | None:
        """Where ``path`` (absolute) belongs; None: outside the watched directories, or one of them.
        ``pending_dir(d)``: whether a directory save of ``d`` is pending (any file in it is part of that
        save); asked only of a file's parent below its watched directory."""
        root = self.root_of(path)
        if root is None or path == root:
            return None
        parts = path[len(root) + 1 :].split(os.sep)
        acc = root
        for name in parts if is_dir else parts[:-1]:
            acc = acc + os.sep + name
            if is_temporary_name(name):
                return Place(root, "staging", acc)
            if is_checkpoint_dir_name(name):
                return Place(root, "unit", acc)
        if is_dir:
            return Place(root, "other", path)
        name = parts[-1]
        parent = os.path.dirname(path)
        pending = pending_dir(parent) if parent != root else False  # the watched dir: only its DCP files
        if is_dcp_name(name) or pending:
            return Place(root, "unit", parent)
        if not is_temporary_name(name) and self.looks_like_checkpoint(self.rel(root, path), name):
            return Place(root, "file", path)
        return Place(root, "other", path)

    @staticmethod
    def name_step(root: str, key: str) -> int | None:
        """The step in the name of a checkpoint (file or directory ``key``); None for the watched directory
        itself or a name without one."""
        return None if key == root else step_of(os.path.basename(key))
