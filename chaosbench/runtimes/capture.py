"""Capturing a child's output with each line stamped when the child wrote it, not when the harness read it.

A harness that stamps a line when its reader thread gets to it measures its own scheduling: on a 2-core machine
kept busy the reader thread woke, and got the GIL, up to 13 ms after the write (p99), and that lateness lands
in every time-to-detect that a framework's log line decides. So a child's stdout and stderr are, by default,
one end of a ``SOCK_SEQPACKET`` Unix socket pair (``socket`` capture) whose reading end has ``SO_TIMESTAMPNS``
set: the kernel stamps each record (one ``write(2)``) on the wall clock in the writer's own system call, and
:meth:`Capture.lines` gives every line the stamp of the write that completed it, however late it is read.

What the child sees: a socket instead of a pipe. Writes of any ordinary size behave as on a pipe (a reader that
falls behind blocks the writer; nothing is lost; EPIPE once the harness is gone), but one ``write(2)`` larger than
the socket's send buffer fails with ``EMSGSIZE`` (a record is never split): the buffer is raised to
:data:`SEND_BUFFER_BYTES` (8 MiB; an unprivileged harness gets at most twice ``net.core.wmem_max``), and the
kernel allocates at most ~4 MiB for one record. A script that writes more than that at once can be run with the
runtime option ``output_capture: pipe``: pipes as before, lines stamped when read (stamp ``read``).

Standard-library only: the command shim (:mod:`chaosbench.launchers.command`) uses it inside a rank's process.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import select
import socket
import struct
import termios
import time
from collections.abc import Iterator
from typing import Literal

#: How a child's output is captured: ``socket`` (stamped by the kernel at the write) or ``pipe`` (at the read).
OutputCapture = Literal["socket", "pipe"]
#: What a line's stamp is: ``write`` (the kernel's, in the writer's system call) or ``read`` (the reader's).
Stamp = Literal["write", "read"]

#: How the command shim (in a rank's process) captures the user's command: ``pipe`` or ``socket`` (the default),
#: set by the runtimes from their ``output_capture`` option.
ENV_OUTPUT_CAPTURE = "CHAOSBENCH_OUTPUT_CAPTURE"
#: The runtime option's description (``output_capture`` of the local and slurm runtimes).
OUTPUT_CAPTURE_HELP = (
    "socket: each output line stamped by the kernel when the process wrote it (one write(2) is limited to ~4 MiB); "
    "pipe: plain pipes, lines stamped when the harness reads them (late by the harness's scheduling)"
)
#: What a process prints when a write(2) was refused for its size on a Unix socket (EMSGSIZE, ENOBUFS): with the
#: ``socket`` capture that may be a write to its own stdout or stderr.
TOO_LARGE = re.compile(r"Message too long|No buffer space available")
#: The send buffer asked for on the child's end (bytes): the largest single write the child can make.
SEND_BUFFER_BYTES = 8 << 20
#: Linux's option numbers (the socket module names neither).
_SO_TIMESTAMPNS = 35
_SO_SNDBUFFORCE = 32
_CMSG_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_READ_CHUNK = 65536


class Capture:
    """One output stream of a child process. Give :attr:`child_fd` to the child (``Popen(stdout=...)``), call
    :meth:`spawned` once it has started (the parent's copy of the child's end is closed, so the stream ends when
    the child and every process that inherited it have exited), then iterate :meth:`lines`.

    ``mode`` ``socket`` falls back to ``pipe`` where the platform has no Unix seqpacket sockets or timestamps;
    :attr:`stamp` says which one is in force."""

    def __init__(self, mode: OutputCapture = "socket") -> None:
        self.stamp: Stamp = "read"
        self._sock: socket.socket | None = None
        self._child_sock: socket.socket | None = None
        self._read_fd = -1
        self._child_fd = -1
        self._max_record = _READ_CHUNK
        if mode == "socket":
            with contextlib.suppress(OSError, AttributeError):
                self._open_socket()
        if self._sock is None:
            self._read_fd, self._child_fd = os.pipe()
            os.set_inheritable(self._read_fd, False)

    def _open_socket(self) -> None:
        reader, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            reader.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            try:
                child.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SEND_BUFFER_BYTES)
            except PermissionError:  # only CAP_NET_ADMIN may exceed net.core.wmem_max
                child.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            reader.shutdown(socket.SHUT_WR)
            # a record is at most the writer's send buffer (as granted): a read buffer that size never cuts one
            self._max_record = child.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        except OSError:
            reader.close()
            child.close()
            raise
        self._sock, self._child_sock = reader, child
        self.stamp = "write"

    @property
    def max_write_bytes(self) -> int | None:
        """The largest single ``write(2)`` the child can make (the send buffer as granted, less the kernel's
        32 bytes; the kernel's allocation may cap it lower, at ~4 MiB); None for a pipe (any size)."""
        return self._max_record - 32 if self._sock is not None else None

    @property
    def child_fd(self) -> int:
        """The end the child writes to (its stdout or stderr)."""
        return self._child_sock.fileno() if self._child_sock is not None else self._child_fd

    def spawned(self) -> None:
        """The child has its copy: close the parent's. Idempotent."""
        if self._child_sock is not None:
            self._child_sock.close()
            self._child_sock = None
        if self._child_fd >= 0:
            os.close(self._child_fd)
            self._child_fd = -1

    def close(self) -> None:
        """Close both ends held here (after :meth:`lines` ended, or when the child never started)."""
        self.spawned()
        if self._sock is not None:
            self._sock.close()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1

    def records(self) -> Iterator[tuple[bytes, int]]:
        """What the child writes as it arrives, with its stamp: one item per ``write(2)`` through a socket (its
        kernel stamp), per read through a pipe (the read's), until every writer has closed the stream."""
        return self._records() if self._sock is not None else self._reads()

    def lines(self) -> Iterator[tuple[bytes, int]]:
        """Every line the child writes, with its ``\\n``, and its stamp (wall-clock ns: :attr:`stamp` says
        whether of the write that completed it or of its read), until every writer has closed the stream; a
        last line without a newline comes as it is."""
        records = self.records()
        pending = bytearray()
        t_ns = 0
        for data, t_ns in records:
            cut = data.rfind(b"\n")
            if cut < 0:
                pending += data
                continue
            pending += data[:cut]
            for line in bytes(pending).split(b"\n"):
                yield line + b"\n", t_ns
            pending = bytearray(data[cut + 1 :])
        if pending:
            yield bytes(pending), t_ns

    def _reads(self) -> Iterator[tuple[bytes, int]]:
        while True:
            data = os.read(self._read_fd, _READ_CHUNK)
            if not data:
                return
            yield data, time.time_ns()

    def _records(self) -> Iterator[tuple[bytes, int]]:
        sock = self._sock
        assert sock is not None
        # anonymous memory: only the pages a large record touched are ever resident
        with mmap.mmap(-1, max(_READ_CHUNK, self._max_record)) as buf:
            view = memoryview(buf)
            try:
                while True:
                    n, ancdata, _, _ = sock.recvmsg_into([view], _CMSG_SPACE)
                    if n == 0:
                        if _ended(sock):
                            return
                        continue  # a zero-length write is a record of its own
                    yield view[:n].tobytes(), _stamp(ancdata)
            finally:
                view.release()


def _ended(sock: socket.socket) -> bool:
    """After a zero-length read: whether every writer has closed (rather than one having written nothing)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLHUP)
    hung_up = any(ev & select.POLLHUP for _, ev in poller.poll(0))
    if not hung_up:
        return False
    queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    return bool(queued == 0)  # records still queued after the hang-up are read first


def _stamp(ancdata: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("@qq", data[:16])
            return int(sec * 1_000_000_000 + nsec)
    return time.time_ns()  # no stamp came with the record (never seen on Linux): the read's
