"""A userspace packet delayer on a netfilter queue (NFQUEUE): latency and jitter where the kernel has no netem.

Run it inside a network namespace (``nsenter -t PID -n python -m chaosbench.injectors.network.delayer --queue 7 --delay-ms
50``) and send packets to it with ``iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 7 --queue-bypass``.
Every queued packet is accepted ``delay_ms`` (plus a uniform draw from ``[-jitter_ms, +jitter_ms]``,
never below zero) after it arrived, like ``netem delay D J``; with jitter, packets can overtake each other,
as with netem, and TCP takes the reordering for loss (measured on a 2-rank gloo job, 50 +- 5 ms: one step
stalled 2.5 s where steps took 0.2-0.5 s without jitter). Only packet metadata is copied to userspace (no payload), GSO packets are queued whole.

It speaks the nfnetlink_queue protocol over an ``AF_NETLINK`` socket with the standard library only: the
Python bindings on PyPI (NetfilterQueue) ship as a source distribution that needs a compiler and
libnetfilter-queue headers. Standard-library only, like the probe.

Safety: the queue is configured fail-open (a full queue accepts instead of dropping) and the iptables rule
should carry ``--queue-bypass`` (no listener: packets pass). On SIGTERM/SIGINT every packet still held is
accepted at once before the socket closes. ``--parent-pid`` makes it exit when that process is gone
(checked at least every 0.2 s; not PR_SET_PDEATHSIG, which fires when the parent *thread* exits: a fault
triggered from a short-lived thread, as a serving run's ``after_s`` is, lost its delayer after the first packet
and the delay never happened).
Prints ``ready`` on stdout once bound; counters as JSON on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQA_CFG_F_GSO = 4
NFQNL_COPY_META = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLMSG_DONE = 3
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")
_NLATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def _message(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return (
        _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body
    )


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, msg_type, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            return
        yield msg_type, data[off + _NLMSGHDR.size : off + length]
        off += _align(length)


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    off = 0
    while off + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, off)
        if length < _NLATTR.size:
            break
        out[kind & 0x3FFF] = data[off + _NLATTR.size : off + length]
        off += _align(length)
    return out


class NfQueue:
    """One bound netfilter queue in the caller's network namespace."""

    def __init__(self, queue: int, maxlen: int = 65536) -> None:
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        with contextlib.suppress(OSError):
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        for opt in (33, socket.SO_RCVBUF):  # SO_RCVBUFFORCE (root), else the capped one
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
                break
        self._seq = 0
        self._request(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
        self._request(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
        self._request(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)))
        flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO
        self._request(
            _attr(NFQA_CFG_MASK, struct.pack("!I", flags)) + _attr(NFQA_CFG_FLAGS, struct.pack("!I", flags))
        )

    def _request(self, attrs: bytes) -> None:
        """Send a config message and wait for the kernel's ack; an error raises OSError."""
        self._seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_REQUEST | NLM_F_ACK))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for msg_type, body in _messages(self.sock.recv(65536)):
                if msg_type == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", body)
                    if err:
                        raise OSError(-err, f"nfqueue config: {os.strerror(-err)}")
                    return
        raise TimeoutError("no ack from nfnetlink_queue")

    def packets(self) -> list[int]:
        """Packet ids of whatever the kernel has queued (non-blocking after a select)."""
        ids: list[int] = []
        while True:
            try:
                data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return ids
            except OSError:  # ENOBUFS: the kernel dropped messages; fail-open keeps traffic flowing
                return ids
            for msg_type, body in _messages(data):
                if msg_type == ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET):
                    hdr = _attrs(body[_NFGENMSG.size :]).get(NFQA_PACKET_HDR)
                    if hdr is not None:
                        ids.append(struct.unpack_from("!I", hdr)[0])

    def accept(self, ids: list[int]) -> None:
        """Accept these packets; one send for many verdicts."""
        if not ids:
            return
        msgs = b"".join(
            _message(
                NFQNL_MSG_VERDICT, self.queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, i)), 0
            )
            for i in ids
        )
        for off in range(0, len(msgs), 1 << 15):  # chunks of whole messages (each is 32 bytes)
            with contextlib.suppress(OSError):
                self.sock.send(msgs[off : off + (1 << 15)])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(
                _message(
                    NFQNL_MSG_CONFIG,
                    self.queue,
                    _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, 0)),
                    0,
                )
            )
        self.sock.close()


def run(queue: int, delay_ms: float, jitter_ms: float, seed: int, parent_pid: int | None) -> dict[str, float]:
    """Delay every packet of ``queue`` until stopped; returns counters."""
    rng = random.Random(seed)
    stop = {"now": False}

    def on_signal(_sig: int, _frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    nfq = NfQueue(queue)
    print("ready", flush=True)
    held: list[tuple[float, int, int]] = []  # (due monotonic, arrival order, packet id)
    n = 0
    delay_s, jitter_s = delay_ms / 1000.0, jitter_ms / 1000.0
    while not stop["now"]:
        now = time.monotonic()
        due = []
        while held and held[0][0] <= now:
            due.append(heapq.heappop(held)[2])
        nfq.accept(due)
        timeout = min(0.2, max(0.0, held[0][0] - now)) if held else 0.2
        try:
            readable, _, _ = select.select([nfq.sock], [], [], timeout)
        except InterruptedError:
            continue
        if readable:
            t = time.monotonic()
            for pid in nfq.packets():
                d = delay_s + (rng.uniform(-jitter_s, jitter_s) if jitter_s else 0.0)
                heapq.heappush(held, (t + max(0.0, d), n, pid))
                n += 1
        if parent_pid is not None and not os.path.exists(f"/proc/{parent_pid}"):
            break
    nfq.accept([p for _, _, p in held])  # nothing held back once the fault is reverted
    nfq.close()
    return {"packets": n, "released_at_stop": len(held)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaosbench.injectors.network.delayer", description=__doc__.splitlines()[0]
    )
    p.add_argument("--queue", type=int, required=True, help="netfilter queue number")
    p.add_argument("--delay-ms", type=float, required=True, help="added latency per packet (ms)")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +- jitter (ms)")
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter draws")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = p.parse_args(argv)
    counters = run(args.queue, args.delay_ms, args.jitter_ms, args.seed, args.parent_pid)
    print(json.dumps(counters), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
