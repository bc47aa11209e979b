"""The harness's end of the docker runtime's output capture: each line a node's process writes is stamped by the
kernel in the writer's own ``write(2)``, as for a local process, not when the harness reads the exec stream.

The ``docker exec`` stream carries no stamp of the write: a line stamped when the harness's reader got to it is
late by the harness's scheduling (13 ms at p99 on a loaded 2-core machine, for pipes). So the captures of a
process on a node are the local runtime's (:class:`chaosbench.runtimes.capture.Capture`: ``SOCK_SEQPACKET``
socket pairs whose reading ends have ``SO_TIMESTAMPNS``), created here, and their writing ends are handed into the
container: :class:`OutputHandover` listens on a ``SOCK_SEQPACKET`` socket in a host directory that every node
container has bind-mounted (read-only: connecting to a socket needs no write access to its file system) at
:data:`NODE_DIR`; the exec runs :mod:`chaosbench.runtimes.docker.launcher` first, which connects, names its
process by a one-time token, receives the two writing ends (``SCM_RIGHTS``), makes them its stdout and stderr
and execs the command. Containers share the host's kernel, so the kernel's stamp is on the harness's clock.

An :class:`Offer` is settled once: handed over (the lines are stamped at the write), or failed with the reason
(the launcher said it could not connect, the exec ended first, nobody connected in time): the process's output
then comes through the exec stream, stamped when read, and ``proc_start`` says so (``output_stamp: read``,
``output_stamp_reason``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from chaosbench.runtimes.capture import Capture
from chaosbench.runtimes.docker import launcher

#: Where the harness's capture directory is mounted in every node container.
NODE_DIR = "/run/chaosbench-capture"
#: How the host directory's name starts (``chaosbench cleanup`` removes a crashed run's, found by its mounts).
CAPTURE_DIR_PREFIX = "chaosbench-capture-"
#: The file in the run directory that names the run's capture directory, written before the directory is made
#: (and removed once it is gone), so that `chaosbench cleanup` finds it whenever the harness was killed.
CAPTURE_RECORD = "docker-capture-dir"
#: The listening socket's name in that directory.
SOCKET_NAME = "capture.sock"
#: The launcher's source, given to the node's interpreter with ``-c`` (nothing to install in an image).
LAUNCHER_SOURCE = Path(launcher.__file__).read_text()
#: How long a connected launcher may take to name its process (seconds).
_TOKEN_TIMEOUT_S = 5.0


class Offer:
    """The two captures (``stdout``, ``stderr``) waiting for one process's launcher to take them."""

    def __init__(self, token: str, captures: dict[str, Capture]) -> None:
        self.token = token
        self.captures = captures
        #: Why the output was not handed over (None: it was, or it is not settled yet).
        self.reason: str | None = None
        self.handed = False
        self._lock = threading.Lock()
        self._sending = False
        self._settled = threading.Event()

    def wait(self, timeout_s: float) -> bool:
        """Whether the offer was handed over, waiting up to ``timeout_s`` for it to be settled; one not settled by
        then fails (a launcher connecting later finds nothing and falls back)."""
        if not self._settled.wait(timeout_s):
            self.fail(f"no launcher took the output sockets within {timeout_s:g} s")
            self._settled.wait()  # a handover under way when the time ran out ends at once
        return self.handed

    def fail(self, reason: str) -> None:
        """Settle as not handed over, with ``reason``, unless it was handed over or is being handed now."""
        with self._lock:
            if self._settled.is_set() or self._sending:
                return
            self.reason = reason
            self._settled.set()

    def hand_over(self, conn: socket.socket) -> None:
        """Send the two captures' writing ends to the launcher at the other end of ``conn`` (``SCM_RIGHTS``),
        unless the offer is settled already (the launcher then gets none and falls back); settles it."""
        with self._lock:
            if self._settled.is_set():
                return
            self._sending = True  # fail() must not settle it while the descriptors are on their way
        fds = [self.captures["stdout"].child_fd, self.captures["stderr"].child_fd]
        error: str | None = None
        try:
            socket.send_fds(conn, [b"ok"], fds)
        except OSError as exc:
            error = f"cannot hand the output sockets over: {exc}"
        with self._lock:
            self._sending = False
            self.handed = error is None
            self.reason = error
            self._settled.set()


class OutputHandover:
    """The listening socket of a run's docker nodes (see the module docstring) and the thread that hands each
    launcher its process's captures. :attr:`host_dir` is bind-mounted into every node at :data:`NODE_DIR`;
    :meth:`close` removes it. Raises OSError when the socket cannot be made here."""

    def __init__(self, record: Path | None = None) -> None:
        # Named first, recorded in ``record`` (the run directory's CAPTURE_RECORD), then made: a harness killed at
        # any point leaves a name that `chaosbench cleanup` reads (CI: a harness killed between a temporary
        # directory's creation and the network that names it left one that nothing named).
        self.host_dir = os.path.join(tempfile.gettempdir(), CAPTURE_DIR_PREFIX + secrets.token_hex(6))
        self._record = record
        if record is not None:
            record.write_text(self.host_dir + "\n")
        try:
            os.mkdir(self.host_dir, 0o700)  # never one that was there: a name taken is not ours to remove
        except OSError:
            if record is not None:
                record.unlink(missing_ok=True)
            raise
        try:
            os.chmod(
                self.host_dir, 0o711
            )  # a node's process of any user may reach the socket, not list the directory
            path = os.path.join(self.host_dir, SOCKET_NAME)
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._sock.bind(path)
            os.chmod(path, 0o666)  # a token, not the file's mode, says which process may take which output
            self._sock.listen(64)
        except OSError:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            if record is not None:
                record.unlink(missing_ok=True)
            raise
        self._offers: dict[str, Offer] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="docker-output-handover")
        self._thread.start()

    @property
    def node_path(self) -> str:
        """The listening socket's path inside a node."""
        return f"{NODE_DIR}/{SOCKET_NAME}"

    def launcher_argv(self, python: str, offer: Offer, argv: list[str]) -> list[str]:
        """``argv`` run through the launcher under the node's ``python``, taking ``offer``'s captures."""
        return [python, "-I", "-S", "-c", LAUNCHER_SOURCE, self.node_path, offer.token, "--", *argv]

    def offer(self, captures: dict[str, Capture]) -> Offer:
        """Wait for a launcher to take ``captures`` (until the offer is settled: :meth:`Offer.wait`)."""
        offer = Offer(secrets.token_hex(16), captures)
        with self._lock:
            self._offers[offer.token] = offer
        return offer

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            with conn:
                self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(_TOKEN_TIMEOUT_S)
            token = conn.recv(128).decode(errors="replace")
        except OSError:
            return
        with self._lock:
            offer = self._offers.pop(token, None)
        if offer is not None:  # an unknown token gets no descriptors: that launcher falls back
            offer.hand_over(conn)

    def close(self) -> None:
        """Stop handing over (pending offers fail) and remove the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            offers = list(self._offers.values())
            self._offers.clear()
        for offer in offers:
            offer.fail("the run is being torn down")
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.host_dir, ignore_errors=True)
        if self._record is not None:
            self._record.unlink(missing_ok=True)
