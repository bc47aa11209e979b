"""Run inside a node container by the docker runtime: take stdout and stderr from the harness, then become the
command.

    python -I -S -c <this file's text> SOCKET TOKEN -- CMD [ARGS...]

It connects to the harness's listening ``SOCK_SEQPACKET`` socket ``SOCKET`` (in a host directory bind-mounted
into every node: :mod:`chaosbench.runtimes.docker.output`), sends ``TOKEN`` (which process this is), receives two
file descriptors (``SCM_RIGHTS``): the writing ends of the harness's two output captures
(:class:`chaosbench.runtimes.capture.Capture`), puts them on fds 1 and 2 and execs ``CMD`` (searched on
``PATH``) in its own process, so the exec's pid stays the command's. The reading ends, on the harness, have
``SO_TIMESTAMPNS``, and a container's processes run on the host's kernel: each ``write(2)`` of the command is
stamped in the writer's own system call, as a local process's is.

When no descriptors come (the socket cannot be reached, the harness no longer expects this token), it says why
on stderr in one line starting with :data:`FALLBACK` (read by the harness from the exec's own stream) and execs
``CMD`` with the exec's stdout and stderr: its lines are then stamped when the harness reads them. A command that
cannot be executed exits 127 (not found) or 126, with the reason on stderr, as a shell does.

Standard library only, and given to the node's interpreter as text (``-c``): that interpreter need not have
chaosbench installed. Python 3.9+ (``socket.recv_fds``).
"""

from __future__ import annotations

import os
import socket
import sys

#: How the launcher's one line starts when it could not take the harness's output sockets.
FALLBACK = "chaosbench-capture: output stamped when read: "
#: Longest wait for the harness to answer (seconds).
CONNECT_TIMEOUT_S = 30.0


def take_output(path: str, token: str) -> None:
    """Put the harness's two output sockets on fds 1 and 2; OSError when none came."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
        sock.send(token.encode())
        _, fds, _, _ = socket.recv_fds(sock, 64, 2)
    try:
        if len(fds) != 2:
            raise OSError(f"the harness sent {len(fds)} descriptors for token {token}, not 2")
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
    finally:
        for fd in fds:
            os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        os.write(2, b"usage: launcher SOCKET TOKEN -- CMD [ARGS...]\n")
        return 2
    path, token, cmd = argv[0], argv[1], argv[3:]
    try:
        take_output(path, token)
    except Exception as exc:  # noqa: BLE001 - whatever the reason, the command still runs (output read from the exec)
        os.write(2, f"{FALLBACK}{path}: {exc}\n".encode())
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        os.write(2, f"{cmd[0]}: {exc.strerror}\n".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
