"""A Ray node's entrypoint under the ``ray-train`` adapter (the head's and every worker node's), on every runtime:

    python -m chaosbench.launchers.ray_node --temp-link LINK --temp-target DIR -- python -m ray.scripts.scripts start ...

It makes ``LINK`` a symbolic link to ``DIR`` (creating ``DIR``), then replaces itself with the ``ray start``
command (``exec``: the runtime's handle is Ray's node process). ``LINK`` is a short path in this node's ``/tmp``
that the command's ``--temp-dir`` lies under: Ray's Unix sockets live in its temp dir, and a socket's path may not
exceed 107 bytes; ``DIR`` is in the run directory, so Ray's logs stay with the run. Each node makes the link in its
own ``/tmp``: on docker a container has a ``/tmp`` of its own (a tmpfs, empty again after a reboot); on local the
nodes share the host's, and the link is replaced atomically, so nodes that make it at once agree.

A ``--node-ip-address`` given as a name is resolved to its IPv4 address first (Ray takes only an address there):
on docker the node's own name, which the engine's DNS resolves to the container's address on the run's network.
Exits 2, starting nothing, when the name does not resolve or the link cannot be made.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path

EXIT_SETUP_FAILED = 2


def link_temp_dir(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target`` (created if missing), replacing whatever link was there."""
    target.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f"{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)  # rename(2): atomic, and it replaces the link itself, not what it points to


def resolve_node_ip(argv: list[str]) -> list[str]:
    """``argv`` with the value of its ``--node-ip-address`` resolved to an IPv4 address when it is a name.
    Raises OSError when the name does not resolve."""
    out = list(argv)
    if "--node-ip-address" not in out:
        return out
    i = out.index("--node-ip-address") + 1
    try:
        ipaddress.ip_address(out[i])
    except ValueError:
        out[i] = str(socket.getaddrinfo(out[i], None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaosbench.launchers.ray_node")
    ap.add_argument(
        "--temp-link", required=True, type=Path, help="the short path Ray's --temp-dir lies under"
    )
    ap.add_argument("--temp-target", required=True, type=Path, help="the directory the link points to")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the ray start command line")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command after --")
    try:
        link_temp_dir(args.temp_link, args.temp_target)
        command = resolve_node_ip(command)
    except OSError as exc:
        print(f"chaosbench ray node: {exc}", file=sys.stderr, flush=True)
        return EXIT_SETUP_FAILED
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
