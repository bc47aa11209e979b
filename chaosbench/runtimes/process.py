"""What the runtimes share about the processes they run on this host, on psutil: a process's identity, its
tree, signalling and waiting; learning of its exit from the kernel (:class:`ExitPoller`: one thread, the
processes' pidfds); capturing its output line by line into its log file (and to a framework's log
watcher, each line stamped when the process wrote it: :mod:`chaosbench.runtimes.capture`); its ``proc_start``
and ``proc_exit`` events; and ending whole process trees with an escalation (SIGTERM and SIGCONT, a grace,
SIGKILL).

Identity: a process is its pid *and* its start time in clock ticks since boot, as run directories record it
(``pid_ticks``, read by :mod:`chaosbench.procutil`, which ranks use too). :func:`find` checks a recorded
identity once; the :class:`psutil.Process` it returns then carries the identity itself (psutil checks its
creation time before every signal), so a reused pid is never signalled. A zombie (exited, not yet reaped)
counts as gone everywhere here. Nothing here reaps a process behind its ``Popen``'s back: the harness's own
children are reaped through their ``Popen`` (:meth:`ExitPoller.watch_child`), which must get their exit status.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from chaosbench.procutil import start_ticks
from chaosbench.runtimes.base import LineCallback, ProcHandle
from chaosbench.runtimes.capture import ENV_OUTPUT_CAPTURE, TOO_LARGE, Capture, OutputCapture
from chaosbench.runtimes.proc_events import ProcEvents, monotonic_to_wall_ns, open_listener
from chaosbench.timeline import TimelineWriter, now_ns
from chaosbench.waiting import wait_until

#: A process as (pid, start ticks); ticks None: identity not known.
Pid = tuple[int, int | None]
#: psutil's states of a process that has exited.
_EXITED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
#: How often a teardown looks whether the trees have gone (seconds).
_TEARDOWN_POLL_S = 0.02


# ---------------------------------------------------------------------------------------------- identity
def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` is still the same process (its pid not reused) and has not exited (not a zombie)."""
    try:
        return proc.is_running() and proc.status() not in _EXITED
    except psutil.Error:
        return False


def same(proc: psutil.Process, ticks: int | None) -> bool:
    """Whether ``proc`` is the process that started at ``ticks`` (None: any). ``proc`` must have been looked up
    before: a pid that still has those start ticks was never given to another process in between."""
    return ticks is None or start_ticks(proc.pid) == ticks


def find(pid: int, ticks: int | None = None) -> psutil.Process | None:
    """The running process ``pid``, if it is the one that started at ``ticks`` (None: whichever has the pid);
    None when there is none, it is a zombie, or the pid now belongs to another process."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    return proc if running(proc) and same(proc, ticks) else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """Whether the process ``pid`` (with start time ``ticks``, when given) is running."""
    return find(pid, ticks) is not None


def state(pid: int) -> str | None:
    """The process's state as psutil names it (``running``, ``sleeping``, ``stopped``, ``zombie``, ...); None when
    there is no such process."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


def descends_from(proc: psutil.Process, ancestors: set[int]) -> bool:
    """Whether ``proc`` is one of the pids ``ancestors`` or a descendant of one."""
    try:
        return any(p.pid in ancestors for p in (proc, *proc.parents()))
    except psutil.Error:
        return False


def with_descendants(procs: Iterable[psutil.Process]) -> dict[int, psutil.Process]:
    """``procs`` and all their descendants, by pid: those of them that still run."""
    out: dict[int, psutil.Process] = {}
    for proc in procs:
        out.setdefault(proc.pid, proc)
        with contextlib.suppress(psutil.Error):  # it went meanwhile: its descendants have a new parent
            for d in proc.children(recursive=True):
                out.setdefault(d.pid, d)
    return {pid: p for pid, p in out.items() if running(p)}


def tree(roots: Iterable[Pid]) -> dict[int, psutil.Process]:
    """The running ``roots`` (as pid and start ticks) and all their descendants, by pid."""
    return with_descendants(p for p in (find(pid, ticks) for pid, ticks in roots) if p is not None)


# ---------------------------------------------------------------------------------------------- signals, waits
def send_signal(proc: psutil.Process, sig: int) -> None:
    """``sig`` to ``proc``, only while it is the same process; ProcessLookupError when it is gone (or its pid
    was reused), PermissionError when it is not ours to signal."""
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        raise ProcessLookupError(proc.pid) from None
    except psutil.AccessDenied:
        raise PermissionError(proc.pid) from None


def signal_stamped(proc: psutil.Process, sig: int) -> int:
    """:func:`send_signal`, returning when the signal was sent: the clock read right before ``kill(2)``, which
    queues the signal microseconds after it is entered. Not the moment it returned: a signal that wakes its
    target lets the scheduler switch the caller out on the way back: on a busy 2-core machine that stamp came up
    to 2 ms after a watchdog had already seen the killed process gone. Raises as :func:`send_signal` does.

    The process is pinned by a pidfd first (opened, then checked to be ``proc`` still: a pid that is still
    ``proc`` after its pidfd was opened is the pidfd's process), so that only the clock read stands between the
    stamp and the signal. psutil's own check of the pid reads /proc, which lets another harness thread take the
    GIL: with the clock read before it, a CI run stamped a kill 0.8 ms before the killed server's last log line.
    Where the kernel has no pidfds, the clock is read before psutil's checked kill."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        raise
    except (OSError, AttributeError):
        t = now_ns()
        send_signal(proc, sig)
        return t
    try:
        if not proc.is_running():  # the pid was given to another process since proc was looked up
            raise ProcessLookupError(proc.pid)
        t = now_ns()
        signal.pidfd_send_signal(fd, sig)
        return t
    finally:
        os.close(fd)


def send(procs: Iterable[psutil.Process], sig: int) -> None:
    """``sig`` to each of ``procs`` that is still running as the same process; the others are skipped."""
    for proc in procs:
        if running(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send_signal(proc, sig)


def wait_exit(proc: psutil.Process, stop: threading.Event | None = None) -> None:
    """Block until ``proc`` has exited (a pidfd where the kernel has them) or ``stop`` is set. Meant for processes
    that are not the harness's children (psutil's ``wait`` would reap a child, taking its exit status away from
    its ``Popen``); a zombie counts as exited."""
    fd = -1
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(proc.pid)
    try:
        # The pidfd was opened before this check: if ``proc`` still runs, the pidfd is of ``proc``.
        while running(proc) and not (stop is not None and stop.is_set()):
            if fd >= 0:
                ready, _, _ = select.select([fd], [], [], 0.5)
                if ready:
                    return
            else:
                time.sleep(0.02)
    finally:
        if fd >= 0:
            os.close(fd)


# ---------------------------------------------------------------------------------------------- exits
#: How a ``proc_exit`` was stamped: ``kernel``: the kernel's own stamp of the exit (the proc connector's
#: ``PROC_EVENT_EXIT`` of the process's last thread: :mod:`chaosbench.runtimes.proc_events`); ``pidfd``: when the
#: one :class:`ExitPoller` thread woke to the process's pidfd becoming readable (no proc connector here: the
#: harness lacks ``CAP_NET_ADMIN``, or the kernel's event did not come); ``wait``: when a wait for it returned or
#: the exit was seen after the fact (no pidfds here, or the process had already exited when its watch began).
ExitStamp = Literal["kernel", "pidfd", "wait"]
#: Longest wait, once a pidfd is readable, for the kernel's event of that exit to be read (seconds): it is queued
#: microseconds after the pidfd's wake-up, by the exiting task itself.
KERNEL_EVENT_WAIT_S = 0.05


@dataclass(frozen=True)
class ExitStatus:
    """How a watched process ended. ``returncode``: its status as ``Popen`` reports it (negative: killed by that
    signal); None for a process that is not the harness's child (its own parent reaps it). ``t_ns``: when, on
    the wall clock; ``stamp``: how that moment was taken."""

    returncode: int | None
    t_ns: int
    stamp: ExitStamp


class ExitWatch:
    """One process watched for its exit: :meth:`wait` blocks until it has exited (a child of the harness: and
    has been reaped) and says how and when. Made by :meth:`ExitPoller.watch_child` / :meth:`ExitPoller.watch_pid`."""

    def __init__(
        self,
        pid: int,
        child: subprocess.Popen[bytes] | None = None,
        fallback: Callable[[], ExitStatus] | None = None,
    ) -> None:
        self.pid = pid
        #: When the watch began (``CLOCK_MONOTONIC`` ns): the kernel's exit events before it are another process's.
        self.since_mono_ns = time.monotonic_ns()
        #: The pidfd was readable when the watch began: the poller's wake-up is not the exit.
        self.late = False
        #: The latest kernel exit event of the process's threads since :attr:`since_mono_ns` (monotonic ns), and
        #: whether its main thread's (every exit has one) has come; ``tainted``: events may have been lost.
        self.kernel_ns: int | None = None
        self.leader_exited = False
        self.tainted = False
        self._child = child
        self._fallback = fallback  # no pidfd: the waiting thread waits itself
        self._status: ExitStatus | None = None
        self._done = threading.Event()
        self._fallback_lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> ExitStatus | None:
        """The process's :class:`ExitStatus` once it has exited; None when ``timeout`` (seconds) passed first."""
        if self._fallback is not None:
            with self._fallback_lock:  # a waiter without pidfds blocks (one at a time); no timeout there
                if self._status is None:
                    self._status = self._fallback()
            return self._status
        if not self._done.wait(timeout):
            return None
        return self._status

    def kernel_event(self, task_pid: int, ts_mono_ns: int) -> None:
        """One of the process's threads exited at ``ts_mono_ns`` (the kernel's stamp). Called by the poller."""
        if ts_mono_ns < self.since_mono_ns:
            return  # an earlier process that had this pid
        self.kernel_ns = ts_mono_ns if self.kernel_ns is None else max(self.kernel_ns, ts_mono_ns)
        self.leader_exited = self.leader_exited or task_pid == self.pid

    def settle(self, t_ns: int, stamp: ExitStamp) -> None:
        """The process has exited at ``t_ns`` (wall ns), stamped as ``stamp`` says: reap a child, record the
        status, wake :meth:`wait`. Called once, by :class:`ExitPoller`."""
        rc: int | None = None
        try:
            if self._child is not None:
                # readable: the child is a zombie, so this waitpid(WNOHANG) reaps it (poll() answers None only
                # while another thread holds its Popen's wait lock; then wait() returns as soon as it is reaped)
                rc = self._child.poll()
                if rc is None:
                    rc = self._child.wait()
        finally:
            self._status = ExitStatus(rc, t_ns, stamp)
            self._done.set()


class ExitPoller:
    """The exits of every process the harness started, learned from the kernel: each watched process's pidfd
    (``os.pidfd_open``, Linux 5.3+) in one epoll set, waited on by one thread. Where the harness may listen to
    the kernel's proc connector (:mod:`chaosbench.runtimes.proc_events`: root on the host), that socket is in the
    same set and an exit is stamped with the kernel's own moment of it (``kernel``), however late this thread
    woke; otherwise with the moment epoll returned (``pidfd``), read before any other work, so late only by this
    thread's wake-up and its GIL, never by a per-process waiter's turn or by the reaping. Then a child is reaped
    through its ``Popen`` (``waitpid``). Where pidfds are missing (``pidfd_open`` absent or refused), a watch
    falls back to waiting in the caller's thread (``Popen.wait``; for a process that is not a child, polling its
    state), stamped when the wait returned (``wait``). Holds no run state: one instance (:data:`EXITS`) serves
    every runtime of the process."""

    def __init__(self) -> None:
        self._reset()
        # a forked child has no poller thread, and its parent's processes are not its children: start afresh
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._epoll: Any = None
        self._kernel: ProcEvents | None = None
        self._watches: dict[int, ExitWatch] = {}  # pidfd -> watch
        self._by_pid: dict[int, ExitWatch] = {}  # pid -> watch, until settled

    @property
    def kernel_stamps(self) -> bool:
        """Whether exits are stamped by the kernel (the proc connector listens); known after the first watch."""
        return self._kernel is not None

    def watch_child(self, child: subprocess.Popen[bytes]) -> ExitWatch:
        """Watch a child of the harness, right after its ``Popen`` returned (before any other thread may reap it,
        so its pid still names it); the watch reaps it once it has exited."""
        fd = _pidfd(child.pid) if child.returncode is None else -1
        if fd < 0:
            return ExitWatch(child.pid, child, lambda: _waited(child.wait()))
        return self._add(fd, ExitWatch(child.pid, child))

    def watch_pid(self, pid: int, ticks: int | None) -> ExitWatch:
        """Watch a process that is not the harness's child (a ``docker exec``'d process on this host: its parent
        reaps it), ``pid`` with start ``ticks`` (None: whichever has the pid). A pid that no longer names that
        process (exited, or reused) gives a watch that is done at once, stamped now (``wait``)."""
        watch = ExitWatch(pid)
        fd = _pidfd(pid)
        if fd < 0:
            proc = find(pid, ticks)
            return ExitWatch(pid, None, lambda: _waited(None) if proc is None else _wait_gone(proc))
        # The pidfd was opened before this check: while the start ticks match, the pidfd names that process.
        if ticks is not None and start_ticks(pid) != ticks:
            os.close(fd)
            watch.settle(now_ns(), "wait")
            return watch
        return self._add(fd, watch)

    def _add(self, fd: int, watch: ExitWatch) -> ExitWatch:
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                self._kernel = open_listener()
                if self._kernel is not None:
                    self._epoll.register(self._kernel.fileno(), select.EPOLLIN)
                threading.Thread(
                    target=self._run, args=(self._epoll,), daemon=True, name="exit-poller"
                ).start()
            # known by pid before the readable check: an exit after the check has its kernel events attributed
            self._by_pid[watch.pid] = watch
        watch.late = _readable(fd)
        with self._lock:
            self._watches[fd] = watch
            # epoll_ctl from another thread takes effect while the poller is blocked in epoll_wait
            self._epoll.register(fd, select.EPOLLIN)
        return watch

    def _absorb(self) -> None:
        """Hand the kernel's exit events that have arrived to their watches (poller thread only)."""
        assert self._kernel is not None
        events, lost = self._kernel.read()
        with self._lock:
            for task_pid, tgid, ts in events:
                watch = self._by_pid.get(tgid)
                if watch is not None:
                    watch.kernel_event(task_pid, ts)
            if lost:  # any watch's last thread's event may be among the lost ones
                for watch in self._by_pid.values():
                    watch.tainted = True

    def _stamp(self, watch: ExitWatch, woke_ns: int) -> tuple[int, ExitStamp]:
        if watch.late:
            return woke_ns, "wait"
        if self._kernel is not None and not watch.tainted:
            deadline = time.monotonic() + KERNEL_EVENT_WAIT_S
            while not watch.leader_exited and time.monotonic() < deadline:
                select.select([self._kernel], [], [], KERNEL_EVENT_WAIT_S / 5)
                self._absorb()
            # once more: the last thread's event is queued microseconds after the pidfd's wake-up, by that thread
            self._absorb()
            if watch.leader_exited and not watch.tainted and watch.kernel_ns is not None:
                return monotonic_to_wall_ns(watch.kernel_ns), "kernel"
        return woke_ns, "pidfd"

    def _run(self, epoll: Any) -> None:
        kernel_fd = self._kernel.fileno() if self._kernel is not None else -1
        while True:
            try:
                events = epoll.poll()
            except InterruptedError:
                continue
            # The clock first: epoll_wait returned because the kernel woke the pidfds' waiters when the process
            # finished exiting (its exit notification, the moment it became a zombie), so this is that moment
            # plus only this thread's wake-up and its GIL; the lock, the reaping and the callbacks come after.
            woke_ns = now_ns()
            if self._kernel is not None:
                self._absorb()  # first: the events of the exits whose pidfds are readable now
            done: list[tuple[int, ExitWatch]] = []
            with self._lock:
                for fd, _ in events:
                    if fd == kernel_fd:
                        continue
                    watch = self._watches.pop(fd, None)
                    if watch is not None:
                        epoll.unregister(fd)
                        done.append((fd, watch))
            for fd, watch in done:
                stamped: tuple[int, ExitStamp] = (woke_ns, "wait" if watch.late else "pidfd")
                try:
                    stamped = self._stamp(watch, woke_ns)
                except Exception:  # noqa: BLE001, S110 - the poller must outlive any one process's events
                    pass
                finally:
                    with self._lock:
                        self._by_pid.pop(watch.pid, None)
                    os.close(fd)
                with contextlib.suppress(
                    Exception
                ):  # settle() records the status whatever the reaping raised
                    watch.settle(*stamped)


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid``, or -1 where the kernel or Python has none (or the process is gone)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def _readable(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)


def _waited(returncode: int | None) -> ExitStatus:
    return ExitStatus(returncode, now_ns(), "wait")


def _wait_gone(proc: psutil.Process) -> ExitStatus:
    wait_exit(proc)
    return _waited(None)


#: The process's one exit poller (its thread starts with the first watch).
EXITS = ExitPoller()


# ---------------------------------------------------------------------------------------------- events, output
def record_start(timeline: TimelineWriter, handle: ProcHandle, **extra: Any) -> None:
    """The ``proc_start`` event of a started process: its identity (pid, ``pid_ticks``), role, node, incarnation
    and what the runtime adds (``extra``)."""
    timeline.emit(
        "proc_start",
        proc=handle.name,
        pid=handle.pid,
        pid_ticks=handle.ticks,
        role=handle.spec.role,
        node=handle.spec.node,
        incarnation=handle.spec.incarnation,
        **extra,
    )


def record_exit(
    timeline: TimelineWriter,
    handle: ProcHandle,
    returncode: int,
    t_ns: int,
    exit_stamp: ExitStamp,
    **extra: Any,
) -> None:
    """The ``proc_exit`` event of a started process (``returncode`` negative: killed by that signal), stamped
    ``t_ns``; ``exit_stamp`` says how that moment was taken (:data:`ExitStamp`)."""
    timeline.emit(
        "proc_exit",
        t_ns=t_ns,
        proc=handle.name,
        pid=handle.pid,
        returncode=returncode,
        role=handle.spec.role,
        node=handle.spec.node,
        incarnation=handle.spec.incarnation,
        exit_stamp=exit_stamp,
        **extra,
    )


def pump(
    handle: ProcHandle,
    stream: str,
    lines: Iterable[tuple[bytes, int]],
    path: Path,
    on_line: LineCallback | None,
) -> None:
    """Append every line of ``lines`` (each with its stamp) to ``path`` and hand it to ``on_line`` (a framework's
    watcher: its failure never stops the capture)."""
    with path.open("ab") as out:
        for raw, t in lines:
            out.write(raw)
            out.flush()
            if on_line is not None:
                with contextlib.suppress(Exception):
                    on_line(handle, stream, raw.decode(errors="replace").rstrip("\n"), t)


def open_captures(mode: OutputCapture, env: dict[str, str]) -> dict[str, Capture]:
    """The ``stdout`` and ``stderr`` captures of a process about to start, in ``mode``; its environment ``env`` is
    told the mode, so the command shim captures a user's command the same way. Give them to
    :func:`start_pumps` once it started, or :func:`close_captures` if it could not be started."""
    env[ENV_OUTPUT_CAPTURE] = mode
    return {"stdout": Capture(mode), "stderr": Capture(mode)}


def close_captures(captures: dict[str, Capture]) -> None:
    for capture in captures.values():
        capture.close()


def start_pumps(
    handle: ProcHandle, captures: dict[str, Capture], logs_dir: Path, on_line: LineCallback | None
) -> list[threading.Thread]:
    """One capture thread per stream of a started process (``stdout`` -> ``<name>.out``, ``stderr`` ->
    ``<name>.err``); each closes its :class:`~chaosbench.runtimes.capture.Capture` at its end."""
    threads = []
    for stream, capture in captures.items():
        capture.spawned()
        path = logs_dir / f"{handle.name}.{'out' if stream == 'stdout' else 'err'}"

        def run(capture: Capture = capture, stream: str = stream, path: Path = path) -> None:
            try:
                pump(handle, stream, capture.lines(), path, on_line)
            finally:
                capture.close()

        t = threading.Thread(target=run, daemon=True, name=f"pump-{handle.name}")
        t.start()
        threads.append(t)
    return threads


class CaptureLimitWatcher:
    """A line observer of a runtime that captures output through sockets: the first line of each process that
    says a write was refused for its size (:data:`~chaosbench.runtimes.capture.TOO_LARGE`) becomes a
    ``capture_limit`` event, so a run whose script broke on the capture's limit says so (its verdict), rather
    than passing for the system's own failure."""

    def __init__(self, timeline: TimelineWriter) -> None:
        self.timeline = timeline
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        if not TOO_LARGE.search(line):
            return
        with self._lock:
            if handle.name in self._seen:
                return
            self._seen.add(handle.name)
        self.timeline.emit(
            "capture_limit", t_ns=t_ns, proc=handle.name, pid=handle.pid, stream=stream, line=line[:400]
        )


# ---------------------------------------------------------------------------------------------- trees
#: How long a teardown waits for SIGKILLed processes to be gone (seconds): the kernel ends one at once, but a big
#: process takes a moment to exit (its memory freed), and a leftover check made in that moment would count it
#: (a Ray worker that had not finished its graceful exit within the grace was still running 10 ms after SIGKILL).
KILL_WAIT_S = 5.0


def _kill_and_wait(procs: Iterable[psutil.Process]) -> None:
    """SIGKILL each of ``procs`` still running, then wait up to :data:`KILL_WAIT_S` for them to be gone."""
    procs = [p for p in procs if running(p)]
    send(procs, signal.SIGKILL)
    wait_until(lambda: not any(running(p) for p in procs), KILL_WAIT_S, interval_s=_TEARDOWN_POLL_S)


class ProcessTrees:
    """The process trees a runtime started on this host. ``known`` remembers every process ever seen in them, so
    orphans that outlived their parents are still found at cleanup."""

    def __init__(self) -> None:
        self.known: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def add(self, pid: int, ticks: int | None) -> None:
        """Remember a root just started (nothing when it is already gone)."""
        proc = find(pid, ticks)
        if proc is not None:
            with self._lock:
                self.known[pid] = proc

    def knows(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` (the same process: pid and creation time) was seen in these trees."""
        with self._lock:
            return self.known.get(proc.pid) == proc

    def scan(self, roots: Iterable[Pid]) -> dict[int, psutil.Process]:
        """The running ``roots`` and all their descendants (:func:`tree`), remembered in ``known``."""
        found = tree(roots)
        with self._lock:
            self.known.update(found)
        return found

    def terminate(self, roots: Callable[[], list[Pid]], grace_s: float) -> None:
        """SIGTERM (and SIGCONT, so a stopped process can act on it) to the trees of ``roots()``, up to
        ``grace_s`` for them to go (children forked meanwhile included), then SIGKILL. Safe to call twice."""
        procs = self.scan(roots())
        if not procs:
            return
        send(procs.values(), signal.SIGTERM)
        send(procs.values(), signal.SIGCONT)

        # Not psutil.wait_procs: it reaps the harness's own children (their Popen would read exit status 0) and
        # waits for zombies to be reaped by their parents, where exited is what counts.
        def gone() -> bool:
            procs.update(self.scan(roots()))
            return not any(running(p) for p in procs.values())

        wait_until(gone, grace_s, interval_s=_TEARDOWN_POLL_S)
        procs.update(self.scan(roots()))
        _kill_and_wait(procs.values())

    def kill_known(self) -> None:
        """SIGKILL every process ever seen in the trees that still runs (orphans included)."""
        with self._lock:
            known = list(self.known.values())
        _kill_and_wait(known)

    def alive(self, roots: Iterable[Pid]) -> list[int]:
        """Pids of the trees' processes (known, and the running ``roots``' trees) that still run."""
        found = self.scan(roots)
        with self._lock:
            known = {**self.known, **found}
        return [pid for pid, proc in known.items() if running(proc)]
