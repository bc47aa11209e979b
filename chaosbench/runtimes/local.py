"""The ``local`` runtime: every process a subprocess of the harness, in its own session/process group.

A "node" is a label (:attr:`ProcessSpec.node`) on the processes a framework adapter started: node1's torchrun
agent, its workers and anything they forked. Losing a node (:meth:`LocalRuntime.lose_nodes`, the ``node-kill``
fault) means all of them die at once and nothing on it reacts; peers on other nodes see their connections
reset, as when a host dies. Nothing brings such a node back (an adapter's spare policy, e.g.
``torchrun-elastic``'s ``spares``, may start a replacement).

Targets. The runtime acts only on processes of this run (:meth:`LocalRuntime._refuse_foreign`, called before
every signal and every node loss): a live process it started, a descendant of one, or a process once seen in
those trees that still runs as the same process (a worker orphaned when its agent was killed). Anything else
(a pid the harness or the test started, a pid from a timeline written by someone else) is refused with a
:class:`~chaosbench.errors.ChaosbenchError` naming the pid, and nothing is signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, ClassVar

import psutil
from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import EngineError, ForeignTarget, TargetNotFound, Unsupported
from chaosbench.runtimes import process
from chaosbench.runtimes.base import LineCallback, NoOptions, ProcessSpec, ProcHandle, Runtime, bindable
from chaosbench.runtimes.capture import OUTPUT_CAPTURE_HELP, OutputCapture
from chaosbench.runtimes.process import (
    CaptureLimitWatcher,
    ProcessTrees,
    close_captures,
    open_captures,
    record_exit,
    record_start,
    start_pumps,
)

_PR_SET_PDEATHSIG = 1


class LocalOptions(NoOptions):
    """Options of the ``local`` runtime (``defaults.runtime_options`` in a suite)."""

    output_capture: OutputCapture = Field(default="socket", description=OUTPUT_CAPTURE_HELP)


class LocalNodeLossOptions(BaseModel):
    """Losing a node on the local runtime takes no options: every process of the node is frozen, then SIGKILLed."""

    model_config = ConfigDict(extra="forbid")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


#: The kernel's ephemeral port range: the ports it picks for ``bind(0)`` and for outgoing connections.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def listen_port_range() -> tuple[int, int] | None:
    """Ports for listeners chaosbench starts: from 20000 up to just below the kernel's ephemeral range (Linux's
    default 32768-60999: 20000-32767), or, when that range starts below 21000, above its end; None when
    neither leaves 1000 ports."""
    try:
        lo, hi = (int(x) for x in Path(EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    if lo > 21000:
        return 20000, lo - 1
    return (hi + 1, 65535) if hi < 64535 else None


class LocalRuntime(Runtime[LocalOptions]):
    """Processes on this machine. Output is captured per process, each line stamped when it was written
    (:mod:`chaosbench.runtimes.capture`); each exit stamped when the kernel reported it (the pidfd poller:
    :class:`~chaosbench.runtimes.process.ExitPoller`); teardown escalates SIGTERM -> SIGKILL.

    Processes started from the main thread get PR_SET_PDEATHSIG=SIGKILL, so a harness that is killed
    outright takes its direct children with it; their own children are found as descendants at teardown.
    """

    name: ClassVar[str] = "local"
    ranks_on_harness_host: ClassVar[bool] = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.opts = self.options if isinstance(self.options, LocalOptions) else LocalOptions()
        if self.opts.output_capture == "socket":
            self.line_observers.append(CaptureLimitWatcher(self.run.timeline))
        self._handles: list[ProcHandle] = []
        self._threads: list[threading.Thread] = []
        self._trees = ProcessTrees()
        self._lock = threading.Lock()
        self._ports_given: set[int] = set()
        self.logs_dir = Path(self.run.run_dir) / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def concurrent_slots(cls, options: dict[str, Any], jobs: int, nodes: int) -> list[dict[str, Any]]:
        """Refused: every run of the local runtime shares this machine's CPUs (``--timings-may-interfere`` runs
        them at once anyway, for correctness only)."""
        raise Unsupported(
            f"the local runtime runs every rank on this machine's shared CPUs: {jobs} runs at once "
            "would time each other; pass --timings-may-interfere to run them anyway (outcomes "
            "only: their timings are not comparable)"
        )

    def free_port(self) -> int:
        """A port nothing listens on, below the kernel's ephemeral range (:func:`listen_port_range`): a port the
        kernel hands out for ``bind(("", 0))`` could go to another process (another run's server, an outgoing
        connection) between this call and the bind of the process it is for. Seen: torchrun's agent, hosting
        its rendezvous store, found the port taken, took that for a store hosted elsewhere, and waited 60 s on
        a stranger's listener. Outside that range only a process that chose a port on purpose can take it.

        A port this runtime gave out before is never given again: a run asks for all its ports before any is
        bound (CI: two serving replicas of one run were given the same port, and the second could not bind)."""
        span = listen_port_range()
        with self._lock:
            if span is not None:
                pick = random.SystemRandom()
                for _ in range(256):
                    port = pick.randint(*span)
                    if port not in self._ports_given and bindable("0.0.0.0", port):
                        self._ports_given.add(port)
                        return port
            for _ in range(256):  # no such range, or full: the kernel's pick
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", 0))
                    port = int(s.getsockname()[1])
                if port not in self._ports_given:
                    self._ports_given.add(port)
                    return port
        raise EngineError("local", "no free port left: 256 picks were all taken or given to this run before")

    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        on_line = self.observed(on_line)
        env = dict(os.environ)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        in_main = threading.current_thread() is threading.main_thread()
        captures = open_captures(self.opts.output_capture, env)
        try:
            popen = subprocess.Popen(
                spec.argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=captures["stdout"].child_fd,
                stderr=captures["stderr"].child_fd,
                start_new_session=True,
                preexec_fn=_die_with_parent if in_main else None,
            )
        except OSError as exc:
            close_captures(captures)
            raise EngineError(
                "local", f"cannot start process '{spec.name}' ({spec.argv[0]}): {exc.strerror}"
            ) from None
        exit_watch = process.EXITS.watch_child(
            popen
        )  # at once: nothing else may reap it before its pidfd is open
        handle = ProcHandle(spec, popen.pid, process.start_ticks(popen.pid))
        with self._lock:
            self._handles.append(handle)
        self._trees.add(handle.pid, handle.ticks)
        record_start(self.run.timeline, handle, output_stamp=captures["stdout"].stamp)
        self._threads += start_pumps(handle, captures, self.logs_dir, on_line)
        w = threading.Thread(
            target=self._wait, args=(handle, exit_watch), daemon=True, name=f"wait-{spec.name}"
        )
        w.start()
        self._threads.append(w)
        return handle

    def _wait(self, handle: ProcHandle, exit_watch: process.ExitWatch) -> None:
        status = exit_watch.wait()
        assert status is not None and status.returncode is not None  # a child's watch reaps it: never None
        record_exit(self.run.timeline, handle, status.returncode, status.t_ns, status.stamp)
        self.run.exits.settle(handle, status.returncode, status.t_ns)

    def _ours(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` is a live process this run started, a descendant of one, or a process once seen in
        this run's trees that is still the same process (psutil compares pid and creation time)."""
        with self._lock:
            roots = {h.pid for h in self._handles if not h.exited.is_set()}
        return process.descends_from(proc, roots) or self._trees.knows(proc)

    def _refuse_foreign(self, procs: list[psutil.Process], doing: str) -> None:
        """The one rule before this runtime acts on a process (a signal, a node loss): every process of
        ``procs`` that still runs must be this run's (:meth:`_ours`). Raises ChaosbenchError naming the first
        one that is not (:class:`~chaosbench.errors.ForeignTarget`), before anything is done to any of them; ``doing`` says what would have been done
        ("signalling it")."""
        for proc in procs:
            if process.running(proc) and not self._ours(proc):
                raise ForeignTarget(f"pid {proc.pid}", "was not started by this run", doing)

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        proc = process.find(pid)
        if proc is None:
            raise ProcessLookupError(pid)
        if not process.same(proc, ticks):
            raise ForeignTarget(f"pid {pid}", "now belongs to another process", "signalling it")
        self._refuse_foreign([proc], "signalling it")
        # its children now, while they are still its: a killed agent's workers outlive it, reparented to init,
        # where no tree walk from a root finds them at teardown
        self._trees.scan([(proc.pid, ticks)])
        # kill(2) queues the signal; SIGKILL/SIGSTOP act before the target runs again
        return process.signal_stamped(proc, sig)

    def _roots(self, handles: list[ProcHandle]) -> list[tuple[int, int | None]]:
        return [(h.pid, h.ticks) for h in handles if not h.exited.is_set()]

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        self._trees.terminate(lambda: self._roots(handles), grace_s)
        for h in handles:
            h.exited.wait(timeout=10)

    def cleanup(self, grace_s: float = 5.0) -> None:
        with self._lock:
            handles = list(self._handles)
        self.terminate(handles, grace_s)
        self._trees.kill_known()  # orphans that outlived their parents
        for t in self._threads:
            t.join(timeout=5)

    def node_handles(self, node: str) -> list[ProcHandle]:
        """Live processes this runtime started on ``node`` (for node-level faults)."""
        with self._lock:
            return [h for h in self._handles if h.spec.node == node and not h.exited.is_set()]

    # ------------------------------------------------------------------ node loss (NodeLoss)
    @classmethod
    def node_loss_options(cls) -> type[BaseModel]:
        return LocalNodeLossOptions

    def lose_nodes(self, nodes: list[str], options: BaseModel, restorable: list[str]) -> dict[str, Any]:
        """Freeze, then SIGKILL, every process of each node (each process started there and its descendants);
        details: ``nodes`` and ``pids`` (node -> the pids killed). Raises ProcessLookupError when a node has no
        live process. Nothing is restorable."""
        killed = {node: self._kill_node_trees(node) for node in nodes}
        if not any(killed.values()):
            raise TargetNotFound(
                ", ".join(nodes), "nothing to kill", message=f"nothing to kill on {', '.join(nodes)}"
            )
        return {"nodes": list(nodes), "pids": killed}

    def _kill_node_trees(self, node: str) -> list[int]:
        """Every process of ``node`` is first frozen (SIGSTOP: no agent sees its workers die and restarts
        them, no worker gets to say goodbye), then SIGKILLed; returns the pids killed."""
        roots = self.node_handles(node)
        if not roots:
            raise ProcessLookupError(f"no live process on {node}")
        live = process.tree((h.pid, h.ticks) for h in roots)
        self._refuse_foreign(list(live.values()), f"killing it with {node}")
        process.send(live.values(), signal.SIGSTOP)
        # Children forked between the scan and the freeze are caught by a second scan of the frozen trees (the
        # rule is applied as a filter there: refusing now would leave the frozen ones frozen).
        late = {
            pid: p
            for pid, p in process.with_descendants(live.values()).items()
            if pid not in live and self._ours(p)
        }
        process.send(late.values(), signal.SIGSTOP)
        live.update(late)
        process.send(live.values(), signal.SIGKILL)
        return sorted(live)

    def leftovers(self) -> list[int]:
        """Pids of processes of this run that are still alive (for tests and the cleanup check)."""
        with self._lock:
            handles = list(self._handles)
        return self._trees.alive(self._roots(handles))
