"""Process identity helpers over /proc (Linux). Standard-library only: the probe uses them too."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest  # rest[0] is field 3 (state)


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): with the pid, a unique identity."""
    f = _stat_fields(pid)
    return int(f[19]) if f else None


def parent_pid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[1]) if f else None


def state(pid: int) -> str | None:
    """One-letter state: R, S, D, T (stopped), Z (zombie), ..., or None when the process is gone."""
    f = _stat_fields(pid)
    return f[0] if f else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """True while the process exists, is not a zombie and (if given) still has the same start time."""
    f = _stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return False
    return ticks is None or int(f[19]) == ticks


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        ppid = parent_pid(int(entry))
        if ppid is not None:
            out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pid: int, cmap: dict[int, list[int]] | None = None) -> list[int]:
    """All live descendants of ``pid`` (children first), from one scan of /proc."""
    cmap = children_map() if cmap is None else cmap
    out: list[int] = []
    todo = list(cmap.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(cmap.get(p, []))
    return out


def is_descendant_of(pid: int, ancestors: set[int]) -> bool:
    seen = 0
    p: int | None = pid
    while p and p > 1 and seen < 64:
        if p in ancestors:
            return True
        p = parent_pid(p)
        seen += 1
    return False
