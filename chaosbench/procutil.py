"""A process's identity as run directories record it: its pid and its start time in clock ticks since boot
(``/proc/<pid>/stat`` field 22), the ``pid_ticks`` of ``proc_start`` and ``rank_start`` events. Linux only.

Standard library only: ranks (through the probe), a user's script under the command shim and the stall-fs
server read it, inside users' containers too. Everything else about processes (trees, signals, waits) is
:mod:`chaosbench.runtimes.process`, on psutil, on the harness's side."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return raw[raw.rindex(")") + 2 :].split()  # [0] is field 3 (state)


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): with the pid, a unique identity; None when
    there is no such process."""
    f = _stat_fields(pid)
    return int(f[19]) if f else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """True while the process exists, is not a zombie and (if given) still has the same start time."""
    f = _stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return False
    return ticks is None or int(f[19]) == ticks
