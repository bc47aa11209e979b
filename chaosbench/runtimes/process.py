"""What the runtimes share about the processes they run on this host: capturing a process's output line by line
into its log file (and to a framework's log watcher, stamped when read), and ending whole process trees with an
escalation (SIGTERM and SIGCONT, a grace, SIGKILL) that only ever touches processes identified by pid *and* start
time, so a reused pid is never signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from chaosbench import procutil
from chaosbench.runtimes.base import LineCallback, ProcHandle
from chaosbench.timeline import TimelineWriter, now_ns

#: A process as (pid, start ticks); ticks None: identity not known.
Pid = tuple[int, int | None]


def record_exit(timeline: TimelineWriter, handle: ProcHandle, returncode: int, t_ns: int, **extra: Any) -> None:
    """The ``proc_exit`` event of a started process (``returncode`` negative: killed by that signal)."""
    timeline.emit(
        "proc_exit", t_ns=t_ns, proc=handle.name, pid=handle.pid, returncode=returncode, role=handle.spec.role,
        node=handle.spec.node, incarnation=handle.spec.incarnation, **extra,
    )  # fmt: skip


def pump(handle: ProcHandle, stream: str, lines: Iterable[bytes], path: Path, on_line: LineCallback | None) -> None:
    """Append every line of ``lines`` to ``path`` and hand it to ``on_line`` (a framework's watcher: its failure
    never stops the capture)."""
    with path.open("ab") as out:
        for raw in lines:
            t = now_ns()
            out.write(raw)
            out.flush()
            if on_line is not None:
                with contextlib.suppress(Exception):
                    on_line(handle, stream, raw.decode(errors="replace").rstrip("\n"), t)


def start_pumps(handle: ProcHandle, pipes: dict[str, IO[bytes] | None], logs_dir: Path,
                on_line: LineCallback | None) -> list[threading.Thread]:  # fmt: skip
    """One capture thread per pipe (``stdout`` -> ``<name>.out``, ``stderr`` -> ``<name>.err``); each closes its
    pipe at its end."""
    threads = []
    for stream, pipe in pipes.items():
        assert pipe is not None
        path = logs_dir / f"{handle.name}.{'out' if stream == 'stdout' else 'err'}"

        def run(pipe: IO[bytes] = pipe, stream: str = stream, path: Path = path) -> None:
            pump(handle, stream, iter(pipe.readline, b""), path, on_line)
            pipe.close()

        t = threading.Thread(target=run, daemon=True, name=f"pump-{handle.name}")
        t.start()
        threads.append(t)
    return threads


class ProcessTrees:
    """The process trees a runtime started on this host. ``known`` remembers every pid ever seen in them (with its
    start ticks), so orphans that outlived their parents are still found at cleanup."""

    def __init__(self) -> None:
        self.known: dict[int, int | None] = {}
        self._lock = threading.Lock()

    def add(self, pid: int, ticks: int | None) -> None:
        with self._lock:
            self.known[pid] = ticks

    def scan(self, roots: Iterable[Pid]) -> dict[int, int | None]:
        """The live ``roots`` and all their descendants (one scan of /proc), remembered in ``known``."""
        cmap = procutil.children_map()
        tree: dict[int, int | None] = {}
        for pid, ticks in roots:
            if not procutil.alive(pid, ticks):
                continue
            tree[pid] = ticks
            for d in procutil.descendants(pid, cmap):
                tree[d] = procutil.start_ticks(d)
        with self._lock:
            self.known.update(tree)
        return tree

    @staticmethod
    def send(tree: dict[int, int | None], sig: int) -> None:
        """``sig`` to every process of ``tree`` that is still the same process."""
        for pid, ticks in tree.items():
            if procutil.alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def terminate(self, roots: Callable[[], list[Pid]], grace_s: float) -> None:
        """SIGTERM (and SIGCONT, so a stopped process can act on it) to the trees of ``roots()``, up to
        ``grace_s`` for them to go (children forked meanwhile included), then SIGKILL. Safe to call twice."""
        tree = self.scan(roots())
        if not tree:
            return
        self.send(tree, signal.SIGTERM)
        self.send(tree, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            tree.update(self.scan(roots()))
            if not any(procutil.alive(p, t) for p, t in tree.items()):
                break
            time.sleep(0.02)
        tree.update(self.scan(roots()))
        self.send(tree, signal.SIGKILL)

    def kill_known(self) -> None:
        """SIGKILL every process ever seen in the trees that still lives (orphans included)."""
        with self._lock:
            known = dict(self.known)
        self.send(known, signal.SIGKILL)

    def alive(self, roots: Iterable[Pid]) -> list[int]:
        """Pids of the trees' processes (known, and the live ``roots``' trees) that are still alive."""
        tree = self.scan(roots)
        with self._lock:
            known = {**self.known, **tree}
        return [p for p, t in known.items() if procutil.alive(p, t)]
