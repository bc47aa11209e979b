"""Several hosts' clocks on one timeline: measure each node's offset at start, correct stamps on reading.

A timeline's stamps come from the clock of whoever wrote each event (its ``host`` field): the harness's own
events, log-line events (stamped when the harness read the line) and fault events carry the harness's host;
rank events carry the host the rank ran on. On one host that is one clock. Across hosts, clocks differ by
whatever NTP left (typically 0.1-10 ms, far more on a badly synchronised cluster), which is the same order
as the detection times chaosbench measures.

Measurement (NTP-style, Cristian's algorithm): a tiny echo program runs on the node (started by the runtime,
e.g. through ``srun``) and answers each line the harness sends with its ``time.time_ns()``. For each sample
the harness stamps the send (``t0``) and the receipt (``t1``) of the answer ``r``; the remote stamp was taken
somewhere in ``[t0, t1]``, so ``offset = r - (t0 + t1) / 2`` is off by at most ``bound = (t1 - t0) / 2``.
Of several samples the one with the smallest round trip is kept (queueing only ever adds delay).
Each node gets one ``clock_offset`` event: ``node, node_host, offset_ns, bound_ns, rtt_ns, samples``
(``offset_ns``: the node's clock minus the harness's clock).

Correction (:func:`correct`): each event whose ``host`` is not the harness's host (the host of ``run_start``)
and has a measured offset is moved by ``-offset_ns``; events are then sorted again. Hosts of the harness
are never corrected (one host, one clock, even when several Slurm nodes share it: their measured offsets
are only noise within the bound). A host with no measurement stays as written, and :func:`uncorrected_hosts`
names it, so a report can say so instead of guessing.

Standard-library only (imported by the timeline reader).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from chaosbench.timeline.events import Event

#: The program run on a node: prints its host name, then its clock for each line it reads.
ECHO_PROGRAM = (
    "import socket, sys, time\n"
    "print('host', socket.gethostname(), flush=True)\n"
    "for _ in sys.stdin:\n"
    "    print(time.time_ns(), flush=True)\n"
)


@dataclass(frozen=True)
class ClockSample:
    """One exchange: harness send and receive stamps around the remote clock reading (all ns)."""

    sent_ns: int
    remote_ns: int
    received_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.received_ns - self.sent_ns

    @property
    def offset_ns(self) -> int:
        return self.remote_ns - (self.sent_ns + self.received_ns) // 2


@dataclass(frozen=True)
class ClockOffset:
    """A node's clock relative to the harness's: ``offset_ns`` = node clock - harness clock, true within
    ``bound_ns`` (half the round trip of the best sample)."""

    node: str
    host: str
    offset_ns: int
    bound_ns: int
    rtt_ns: int
    samples: int

    def event_fields(self) -> dict[str, Any]:
        """Fields of the ``clock_offset`` event; the node's host is ``node_host`` (an event's own ``host`` is
        the writer's, the harness's)."""
        d = dataclasses.asdict(self)
        d["node_host"] = d.pop("host")
        return d


def estimate(node: str, host: str, samples: Sequence[ClockSample]) -> ClockOffset:
    """The offset from the sample with the smallest round trip. Raises ValueError without samples."""
    if not samples:
        raise ValueError(f"no clock samples for node {node}")
    best = min(samples, key=lambda s: s.rtt_ns)
    return ClockOffset(
        node=node,
        host=host,
        offset_ns=best.offset_ns,
        bound_ns=(best.rtt_ns + 1) // 2,
        rtt_ns=best.rtt_ns,
        samples=len(samples),
    )


def exchange(stdin: IO[bytes], stdout: IO[bytes], samples: int) -> tuple[str, list[ClockSample]]:
    """Talk to a running :data:`ECHO_PROGRAM`: read its host line, then take ``samples`` samples."""
    first = stdout.readline().decode(errors="replace").split()
    if len(first) != 2 or first[0] != "host":
        raise ValueError(f"unexpected answer from the clock probe: {' '.join(first)!r}")
    host = first[1]
    out = []
    for _ in range(samples):
        t0 = time.time_ns()
        stdin.write(b"t\n")
        stdin.flush()
        line = stdout.readline()
        t1 = time.time_ns()
        if not line:
            raise ValueError("the clock probe ended early")
        out.append(ClockSample(t0, int(line), t1))
    return host, out


def measure(
    argv: list[str], node: str, samples: int = 8, timeout_s: float = 30.0, env: dict[str, str] | None = None
) -> ClockOffset:
    """Run ``argv`` (which must run :data:`ECHO_PROGRAM` on ``node``, e.g. ``srun -w n1 python -c ...``) and
    measure the node's clock offset. Raises ValueError (with the program's stderr) when it cannot."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        import threading

        timer = threading.Timer(timeout_s, proc.kill)
        timer.daemon = True
        timer.start()
        try:
            host, got = exchange(proc.stdin, proc.stdout, samples)
        except (ValueError, OSError) as exc:
            proc.kill()
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise ValueError(
                f"clock probe on {node} failed: {exc}{': ' + err.splitlines()[-1] if err else ''}"
            ) from None
        finally:
            timer.cancel()
        proc.stdin.close()
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    return estimate(node, host, got)


# --------------------------------------------------------------------------- reading


def reference_host(events: Sequence[Event]) -> str | None:
    """The harness's host: where ``run_start`` was written (None without one)."""
    return next((e.host for e in events if e.kind == "run_start"), None)


def host_offsets(events: Sequence[Event]) -> dict[str, ClockOffset]:
    """Per host (other than the harness's), the measured offset with the smallest bound."""
    ref = reference_host(events)
    best: dict[str, ClockOffset] = {}
    for e in events:
        if e.kind != "clock_offset" or e.get("offset_ns") is None:
            continue
        host = str(e.get("node_host"))
        if host == ref:
            continue
        off = ClockOffset(
            node=str(e.get("node")),
            host=host,
            offset_ns=int(e["offset_ns"]),
            bound_ns=int(e.get("bound_ns", 0)),
            rtt_ns=int(e.get("rtt_ns", 0)),
            samples=int(e.get("samples", 0)),
        )
        if host not in best or off.bound_ns < best[host].bound_ns:
            best[host] = off
    return best


def correct(events: Sequence[Event]) -> list[Event]:
    """The events with every other host's stamps moved onto the harness's clock, sorted by the new stamps
    (stable). Events of the harness's host and of hosts without a measurement are unchanged."""
    offsets = host_offsets(events)
    if not offsets:
        return list(events)
    out = []
    for e in events:
        off = offsets.get(e.host)
        out.append(dataclasses.replace(e, t_ns=e.t_ns - off.offset_ns) if off is not None else e)
    out.sort(key=lambda e: e.t_ns)
    return out


def offset_bound_s(events: Sequence[Event]) -> float | None:
    """The largest uncertainty (seconds) of any measured node clock on the timeline; None when no clock was
    measured. Every corrected stamp is within this of the harness's clock."""
    bounds = [
        int(e.get("bound_ns", 0))
        for e in events
        if e.kind == "clock_offset" and e.get("bound_ns") is not None
    ]
    return max(bounds) / 1e9 if bounds else None


def uncorrected_hosts(events: Sequence[Event]) -> list[str]:
    """Hosts other than the harness's that wrote events but have no clock measurement."""
    ref = reference_host(events)
    measured = set(host_offsets(events))
    return sorted({e.host for e in events if e.host and e.host != ref and e.host not in measured})
