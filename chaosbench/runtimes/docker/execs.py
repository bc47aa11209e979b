"""The docker runtime's processes: started in a node with ``docker exec``, their output handed to the harness's
captures through the output launcher (stamped by the kernel when written) or read from the exec's own stream
(stamped when read), their exits stamped from the host pid's pidfd with the exit code from the engine, and the
node's entrypoint roles run again when their node comes back (see the package's docstring)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosbench.errors import ChaosbenchError, EngineError
from chaosbench.runtimes import process
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, RunInfo
from chaosbench.runtimes.docker import pids
from chaosbench.runtimes.docker.launcher import FALLBACK
from chaosbench.runtimes.docker.nodes import NodePool
from chaosbench.runtimes.docker.options import DockerOptions
from chaosbench.runtimes.docker.output import CAPTURE_RECORD, Offer, OutputHandover
from chaosbench.runtimes.process import (
    ProcessTrees,
    close_captures,
    open_captures,
    record_exit,
    record_start,
    start_pumps,
)
from chaosbench.timeline import now_ns
from chaosbench.waiting import wait_until

#: Environment of the harness passed on to processes in the nodes (the rest of it stays on the host).
PASS_ENV_PREFIXES = (
    "TORCH_",
    "TORCHELASTIC_",
    "NCCL_",
    "GLOO_",
    "OMP_",
    "MKL_",
    "PYTHON",
    "LC_",
    "LANG",
    "TZ",
)
#: How the launcher's line saying it could not take the capture sockets starts (on the exec's stderr).
LAUNCHER_FALLBACK = FALLBACK.encode()
#: Longest wait for a started process's launcher to take its capture sockets (seconds; Python's start-up, a
#: frozen node): then its lines are stamped when read, and the launcher, connecting later, falls back.
HANDOVER_WAIT_S = 10.0
#: Exit codes of ``docker exec`` above 128 mean "killed by signal (code - 128)"; reported like Popen does.
SIGNAL_EXIT_BASE = 128


class ExecHandle(ProcHandle):
    """A process started with ``docker exec``: ``pid`` is its host pid, ``container_pid`` the pid inside."""

    def __init__(self, spec: ProcessSpec, pid: int, ticks: int | None) -> None:
        super().__init__(spec, pid, ticks)
        self.exec_id = ""
        self.container_id = ""
        self.container_pid: int | None = None
        self.exit_watch: process.ExitWatch | None = None
        self.runs = 0

    @property
    def pid_on_node(self) -> int | None:
        return self.container_pid


def _decode_exit(code: int | None) -> int:
    if code is None:
        return -signal.SIGKILL
    if SIGNAL_EXIT_BASE < code <= SIGNAL_EXIT_BASE + 64:
        return -(code - SIGNAL_EXIT_BASE)
    return int(code)


class Execs:
    """The processes of run ``run`` in the nodes of ``pool``, through the engine's ``stream_client()``.
    ``read_stamp_reason``: why lines are stamped when read (None: the launcher hands the captures over, once
    :meth:`open_handover` made the handover)."""

    def __init__(
        self,
        run: RunInfo,
        opts: DockerOptions,
        pool: NodePool,
        stream_client: Callable[[], Any],
        closing: threading.Event,
    ) -> None:
        self.run, self.opts, self.pool, self._stream_client, self.closing = (
            run,
            opts,
            pool,
            stream_client,
            closing,
        )
        self.logs_dir = Path(run.run_dir) / "logs"
        self.lock = threading.Lock()
        self.handles: list[ExecHandle] = []
        self.threads: list[threading.Thread] = []
        self.trees = ProcessTrees()
        self.handover: OutputHandover | None = None
        self.read_stamp_reason: str | None = None
        if opts.output_capture == "pipe":
            self.read_stamp_reason = "output_capture: pipe"
        elif self.launcher_python() is None:
            self.read_stamp_reason = (
                f"image {opts.image} without runtime_options.python: no interpreter known "
                "there to run the capture launcher"
            )

    def open_handover(self) -> None:
        """The output capture's handover into the nodes (at provision), or why lines are stamped when read."""
        if self.read_stamp_reason is None:
            try:
                self.handover = OutputHandover(Path(self.run.run_dir) / CAPTURE_RECORD)
            except OSError as exc:
                self.read_stamp_reason = f"no capture socket on this host: {exc}"

    def launcher_python(self) -> str | None:
        """The node's interpreter that runs the output launcher: the harness's own in the default image, the
        ``python`` option in a user's image; None when a user's image names none."""
        if self.opts.python:
            return self.opts.python
        return sys.executable if self.opts.image is None else None

    def _env(self, spec: ProcessSpec, iface: str = "eth0") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV_PREFIXES)}
        env.pop("PYTHONHOME", None)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if self.opts.image is None:
            # The built-in image carries the harness's interpreter and virtualenv at their host paths: a user's
            # command saying `python` (or torchrun) finds them first, as it does on the local runtime
            path = f"{os.path.dirname(sys.executable)}:{path}"
        env.update({"PATH": path, "HOME": "/tmp", "GLOO_SOCKET_IFNAME": iface, "PYTHONUNBUFFERED": "1"})
        env.update(self.opts.env)
        env.update(spec.env)
        return env

    def _argv(self, argv: list[str]) -> list[str]:
        if self.opts.python and argv and argv[0] == sys.executable:
            return [self.opts.python, *argv[1:]]
        return list(argv)

    def start(self, spec: ProcessSpec, on_line: LineCallback | None) -> ExecHandle:
        handle = ExecHandle(spec, 0, None)
        self._exec(handle, on_line, rerun=False)
        with self.lock:
            self.handles.append(handle)
        w = threading.Thread(target=self._wait, args=(handle, on_line), daemon=True, name=f"wait-{spec.name}")
        w.start()
        self.threads.append(w)
        return handle

    def _exec(self, handle: ExecHandle, on_line: LineCallback | None, rerun: bool) -> None:
        spec = handle.spec
        node = self.pool.ready(spec.node)
        api = self._stream_client()
        iface = "eth0"
        with contextlib.suppress(ProcessLookupError, OSError, ChaosbenchError):
            iface = self.pool.iface(spec.node)
        env = self._env(spec, iface)
        if rerun:  # the node's entrypoint again: a new incarnation of whatever it runs
            env["CHAOSBENCH_INCARNATION"] = str(spec.incarnation + handle.runs)
        argv = self._argv(spec.argv)
        offer: Offer | None = None
        launcher_python = self.launcher_python()
        if self.handover is not None and launcher_python is not None:
            offer = self.handover.offer(open_captures("socket", env))
            argv = self.handover.launcher_argv(launcher_python, offer, argv)
        try:
            ex = api.exec_create(
                node.cid, argv, stdout=True, stderr=True, stdin=False, environment=env, workdir=spec.cwd
            )
            stream = api.exec_start(ex["Id"], stream=True, demux=True)
        except Exception as exc:  # noqa: BLE001 - the engine's refusal, as one line
            if offer is not None:
                offer.fail("the exec did not start")
                close_captures(offer.captures)
            raise EngineError("docker", f"cannot start '{spec.name}' on {spec.node}: {exc}") from None

        def started() -> dict[str, Any] | None:  # the exec's inspect data once it has a pid, or an exit code
            info: dict[str, Any] = api.exec_inspect(ex["Id"])
            done = info.get("Pid") or not info.get("Running", True) and info.get("ExitCode") is not None
            return info if done else None

        info = wait_until(started, 10, interval_s=0.005) or {}
        t_start = (
            now_ns()
        )  # proc_start's moment: the process runs (the handover below takes its launcher's start-up)
        pid = int(info.get("Pid") or 0)
        handle.pid = pid
        handle.ticks = process.start_ticks(pid) if pid else None
        # the launcher execs the command in its own process: this pid and these ticks are the command's
        handle.exit_watch = process.EXITS.watch_pid(pid, handle.ticks) if pid else None
        handle.exec_id = ex["Id"]
        handle.container_id = node.cid
        ns = pids.nspid(pid) if pid else []
        handle.container_pid = ns[-1] if ns else None
        handle.runs += 1
        if pid:
            self.trees.add(pid, handle.ticks)
        # the exec's own stream: everything before the launcher took the sockets, or all of it when it could not
        t = threading.Thread(
            target=self._pump, args=(handle, stream, on_line, offer), daemon=True, name=f"pump-{spec.name}"
        )
        t.start()
        self.threads.append(t)
        stamp: dict[str, Any] = {"output_stamp": "read", "output_stamp_reason": self.read_stamp_reason}
        if offer is not None:
            if offer.wait(HANDOVER_WAIT_S):
                stamp = {"output_stamp": offer.captures["stdout"].stamp}
            else:
                close_captures(offer.captures)
                stamp["output_stamp_reason"] = offer.reason
        record_start(
            self.run.timeline,
            handle,
            t_ns=t_start,
            container=node.container.name,
            container_pid=handle.container_pid,
            rerun=rerun,
            **stamp,
        )
        if offer is not None and offer.handed:
            self.threads += start_pumps(handle, offer.captures, self.logs_dir, on_line)

    def _pump(
        self, handle: ExecHandle, stream: Any, on_line: LineCallback | None, offer: Offer | None
    ) -> None:
        """The exec's own stream, stamped when read. With an ``offer``, the launcher's line saying it could not
        take the capture sockets, or the stream's end before they were taken, settles the offer as failed."""
        paths = {
            "stdout": self.logs_dir / f"{handle.name}.out",
            "stderr": self.logs_dir / f"{handle.name}.err",
        }
        files = {k: p.open("ab") for k, p in paths.items()}
        bufs = {"stdout": b"", "stderr": b""}
        try:
            with contextlib.suppress(Exception):
                for out, err in stream:
                    t = now_ns()
                    for name, chunk in (("stdout", out), ("stderr", err)):
                        if not chunk:
                            continue
                        data = bufs[name] + chunk
                        *lines, bufs[name] = data.split(b"\n")
                        for raw in lines:
                            if offer is not None and name == "stderr" and raw.startswith(LAUNCHER_FALLBACK):
                                offer.fail(raw[len(LAUNCHER_FALLBACK) :].decode(errors="replace"))
                            self._line(handle, name, raw + b"\n", files[name], on_line, t)
            for name, rest in bufs.items():
                if rest:
                    self._line(handle, name, rest, files[name], on_line, now_ns())
        finally:
            if offer is not None:
                offer.fail("the process's exec stream ended before it took the capture sockets")
            for f in files.values():
                f.close()

    @staticmethod
    def _line(
        handle: ProcHandle, stream: str, raw: bytes, out: Any, on_line: LineCallback | None, t: int
    ) -> None:
        out.write(raw)
        out.flush()
        if on_line is not None:
            with contextlib.suppress(Exception):
                on_line(handle, stream, raw.decode(errors="replace").rstrip("\n"), t)

    def _exit_code(self, handle: ExecHandle) -> tuple[int, bool]:
        """The exec's exit status and whether its node went down with it."""
        api = self._stream_client()

        def ended() -> dict[str, Any] | None:  # the exec's inspect data once it has an exit code
            with contextlib.suppress(Exception):
                info: dict[str, Any] = api.exec_inspect(handle.exec_id)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return info
            return None

        info = wait_until(ended, 3, interval_s=0.02)
        code = int(info["ExitCode"]) if info is not None else None
        rc = _decode_exit(code)
        # Killed with its node? The node's init (PID 1 of its pid namespace) dies first when a container
        # is killed, and the kernel then kills the rest; the engine's own state lags behind.
        node_lost = code is None or (rc == -signal.SIGKILL and not self.pool.init_alive(handle.container_id))
        return rc, node_lost

    def _wait(self, handle: ExecHandle, on_line: LineCallback | None) -> None:
        while True:
            # not the harness's child: the watch never reaps it; the exit code comes from the engine
            status = handle.exit_watch.wait() if handle.exit_watch is not None else None
            t_exit, exit_stamp = (status.t_ns, status.stamp) if status is not None else (now_ns(), "wait")
            rc, node_lost = self._exit_code(handle)
            rerun = (
                node_lost
                and handle.spec.role in self.opts.rerun_roles
                and self.opts.lost_node != "none"
                and not self.closing.is_set()
            )
            record_exit(self.run.timeline, handle, rc, t_exit, exit_stamp, node_lost=node_lost)
            if rerun:
                try:
                    self._exec(handle, on_line, rerun=True)
                    continue
                except ChaosbenchError as exc:
                    self.run.timeline.emit(
                        "log", src="runtime", proc=handle.name, line=f"not run again: {exc}"
                    )
            self.run.exits.settle(handle, rc, t_exit)
            return

    # ------------------------------------------------------------------ teardown
    @staticmethod
    def roots(handles: list[ExecHandle]) -> list[tuple[int, int | None]]:
        return [(h.pid, h.ticks) for h in handles if h.pid and not h.exited.is_set()]

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        ours = [h for h in handles if isinstance(h, ExecHandle)]
        self.trees.terminate(lambda: self.roots(ours), grace_s)
        for h in ours:
            # A process on a paused node dies only once the node is unpaused: do not wait for it here.
            if self.pool.provisioned and self.pool.paused(h.container_id):
                continue
            h.exited.wait(timeout=10)

    def close(self, grace_s: float) -> list[ProcHandle]:
        """Every process ended (terminated, then what is left of their trees killed); returns their handles."""
        with self.lock:
            handles: list[ProcHandle] = list(self.handles)
        self.terminate(handles, grace_s)
        self.trees.kill_known()
        return handles

    def join(self, handles: list[ProcHandle]) -> None:
        """Wait a little for the ended processes' exits and their output to be read."""
        for h in handles:
            h.exited.wait(timeout=5)
        for t in self.threads:
            t.join(timeout=5)

    def leftovers(self) -> list[int]:
        """Host pids of this run's processes still alive."""
        with self.lock:
            handles = list(self.handles)
        return self.trees.alive(self.roots(handles))
