"""Lines in a rank's output that tell why its collective failed, whatever the script or framework printed them:
``collective_timeout`` (its process-group timeout fired: gloo's, NCCL's watchdog), ``collective_mismatch`` (the
ranks called different collectives: gloo's size check, the process group's debug checks), ``rendezvous_lost``
(an elastic agent lost the store its rendezvous lives in: only an agent's own lines count, see
:data:`AGENT_ONLY`) and ``peer_lost`` (a peer's connection went, as when
the peer died). Standard library only: the ranks import it too."""

from __future__ import annotations

import re

RANK_ERROR_SIGNATURES: dict[str, re.Pattern[str]] = {
    "collective_timeout": re.compile(
        r"Timed out waiting \d+ ?ms for \w+ operation|Watchdog caught collective operation timeout"
        r"|ProcessGroupNCCL.*[Tt]imeout"
    ),
    "collective_mismatch": re.compile(
        r"Is there a distributed collective mismatch|Detected mismatch between collectives"
    ),
    "rendezvous_lost": re.compile(
        r"failed to send a keep-alive heartbeat to the rendezvous|The connection to the C10d store has failed"
        r"|TCPStore\.cpp.*\] \[c10d\] \w+ failed on SocketImpl"
    ),
    "peer_lost": re.compile(r"Connection closed by peer|Connection reset by peer"),
}


def rank_error(line: str) -> str | None:
    """The signature ``line`` shows (a key of :data:`RANK_ERROR_SIGNATURES`), or None."""
    for signature, rx in RANK_ERROR_SIGNATURES.items():
        if rx.search(line):
            return signature
    return None


#: Signatures that mean something only in an agent's own lines (a rank losing its store is a peer's doing).
AGENT_ONLY = frozenset({"rendezvous_lost"})


#: A line that states an error: a Python exception's line (``ModuleNotFoundError: No module named 'x'``; a bare
#: ``KeyboardInterrupt``), ``error:``/``fatal:``/``panic:`` at the start of a line (any case, ``error[E0]:`` too),
#: a Rust panic or C++'s ``std::terminate`` (``terminate called without an active exception``: a process exiting
#: without destroying its gloo process group, pytorch/pytorch#190489), each also behind an agent's ``[rank<r>]:``
#: prefix.
ERROR_LINE = re.compile(
    r"^(?:\[(?:default)?rank\d+\]:\s*)?"
    r"(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::\s|$)"
    r"|(?i:error|fatal|panic)(?:\[\w+\])?:\s"
    r"|thread '[^']*' panicked at"
    r"|terminate called (?:without an active exception|after throwing an instance of))"
)


def error_line(line: str) -> bool:
    """Whether ``line`` states an error (:data:`ERROR_LINE`)."""
    return ERROR_LINE.match(line) is not None
