"""The kernel's own stamp of a process's exit: the proc connector (``NETLINK_CONNECTOR``, group ``CN_IDX_PROC``).

For every task (thread) that exits, anywhere on the host, the kernel multicasts one ``PROC_EVENT_EXIT`` whose
``timestamp_ns`` it read (``CLOCK_MONOTONIC``) in the exiting task's own ``do_exit``, right after the task's exit
notification (the moment a pidfd of its process becomes readable when it was the last thread). So the stamp does
not depend on when anyone reads it: a harness thread that wakes late (its CPU taken, another thread holding the
GIL) still gets the moment of the exit. A process has exited when its last thread has: its exit is the latest
event of its thread group once its pidfd is readable (:class:`chaosbench.runtimes.process.ExitPoller`).

Listening needs ``CAP_NET_ADMIN`` in the initial user namespace (root on the host, not in a container): elsewhere
:func:`open_listener` returns None and exits are stamped when the poller wakes. Events are lost when the reader
falls behind the whole host's exits (``ENOBUFS``: :meth:`ProcEvents.read` says so); pids are those of the initial pid
namespace (a container's processes by their host pids). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import time

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
#: nlmsghdr (16 bytes), then cn_msg (20), then proc_event: what, cpu, timestamp_ns (at 8), event_data (at 16).
_HEADERS = struct.Struct("=IHHII")
_EVENT = struct.Struct("=IIQ")
_EXIT = struct.Struct("=II")  # process_pid (the task), process_tgid (its process)
_EVENT_AT = 16 + 20
_EXIT_AT = _EVENT_AT + 16
#: Receive buffer asked for (bytes): ~10,000 events of backlog while the reader is held up.
RECEIVE_BUFFER_BYTES = 4 << 20
_SO_RCVBUFFORCE = 33


class ProcEvents:
    """A subscription to the host's task exits. :meth:`read` drains what has arrived without blocking."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        try:
            with contextlib.suppress(OSError):  # only CAP_NET_ADMIN may exceed net.core.rmem_max
                sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
            sock.bind((0, CN_IDX_PROC))
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            cn_msg = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            # EPERM here (the kernel refuses the listen) comes back on this send
            sock.send(_HEADERS.pack(16 + len(cn_msg), NLMSG_DONE, 0, 0, 0) + cn_msg)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> tuple[list[tuple[int, int, int]], bool]:
        """The exits that arrived since the last read, as (task pid, process tgid, ``CLOCK_MONOTONIC`` ns), and
        whether the kernel dropped some meanwhile (its buffer overflowed: any exit since may be missing)."""
        out: list[tuple[int, int, int]] = []
        lost = False
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the buffer overflowed; what is still queued is read on
                    lost = True
                    continue
                raise
            at = 0
            while at + _EXIT_AT + _EXIT.size <= len(data):
                length = _HEADERS.unpack_from(data, at)[0]
                what, _, ts = _EVENT.unpack_from(data, at + _EVENT_AT)
                if what == PROC_EVENT_EXIT:
                    pid, tgid = _EXIT.unpack_from(data, at + _EXIT_AT)
                    out.append((pid, tgid, ts))
                if length <= 0:
                    break
                at += (length + 3) & ~3
        return out, lost

    def close(self) -> None:
        self._sock.close()


def open_listener() -> ProcEvents | None:
    """A subscription, or None where the kernel refuses one (no ``CAP_NET_ADMIN``, no proc connector, no
    netlink)."""
    try:
        return ProcEvents()
    except (OSError, AttributeError):
        return None


def monotonic_to_wall_ns(ts_ns: int) -> int:
    """A ``CLOCK_MONOTONIC`` reading on the wall clock (``time.time_ns``), by the two clocks' offset now: the
    closest of three back-to-back pairs (a pair split by a preemption is off by its length)."""
    best: tuple[int, int] | None = None
    for _ in range(3):
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, w - (m0 + m1) // 2)
    assert best is not None
    return ts_ns + best[1]
