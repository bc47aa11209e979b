"""Processes of a node's pid namespace seen from the engine's host (``/proc``): the docker runtime runs there."""

from __future__ import annotations

import os
from pathlib import Path

from chaosbench.runtimes import process

PF_EXITING = 0x4  # task flag in /proc/<pid>/stat field 9


def ns_inode(pid: int, ns: str = "pid") -> str | None:
    """The namespace ``ns`` of host process ``pid`` (``pid:[4026532...]``); None: no such process."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{ns}")
    except OSError:
        return None


def nspid(pid: int) -> list[int]:
    """Host process ``pid``'s pid in each nested pid namespace, outermost first (``NSpid``); [] if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def in_namespace(init: int, cpid: int) -> int | None:
    """The host pid of the process ``cpid`` of the pid namespace whose init is host pid ``init`` (None: none
    such; the caller checks first that ``init``'s namespace can be seen, :func:`ns_inode`)."""
    ns = ns_inode(init)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_inode(int(entry)) == ns:
            found = nspid(int(entry))
            if found and found[-1] == cpid:
                return int(entry)
    return None


def init_alive(init: tuple[int, int | None] | None) -> bool:
    """Whether a container's init (host pid, start ticks; None: not known) still lives and is not exiting. The
    kernel kills the rest of a pid namespace while its init exits (PF_EXITING set, not yet a zombie), before the
    engine notices."""
    if init is None:
        return True
    if not process.alive(*init):
        return False
    try:
        raw = Path(f"/proc/{init[0]}/stat").read_text()
        flags = int(raw[raw.rindex(")") + 2 :].split()[6])
    except (OSError, ValueError, IndexError):
        return False
    return not flags & PF_EXITING
