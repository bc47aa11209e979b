"""runtimes/docker/output.py and launcher.py without an engine: the launcher run here, on the host, against the
handover's socket (its host path instead of the node's mount), as a node's process runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from chaosbench.runtimes.base import ProcessSpec, ProcHandle
from chaosbench.runtimes.docker.launcher import FALLBACK
from chaosbench.runtimes.docker.output import (
    CAPTURE_DIR_PREFIX,
    CAPTURE_RECORD,
    LAUNCHER_SOURCE,
    NODE_DIR,
    SOCKET_NAME,
    OutputHandover,
)
from chaosbench.runtimes.process import close_captures, open_captures, start_pumps

#: A command that reports its pid, then the moments around one write of a line to stdout, and one to stderr.
COMMAND = (
    "import os, time; os.write(2, f'pid {os.getpid()}\\n'.encode()); b = time.time_ns(); "
    "os.write(1, b'hello\\n'); a = time.time_ns(); os.write(2, f'{b} {a}\\n'.encode())"
)


def _launch(handover: OutputHandover, token: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """The launcher as a node runs it (its command line: the module's docstring), with the host path of the
    handover's socket instead of the node's mount."""
    host_socket = os.path.join(handover.host_dir, SOCKET_NAME)
    full = [sys.executable, "-I", "-S", "-c", LAUNCHER_SOURCE, host_socket, token, "--", *argv]
    return subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_launcher_command_line_names_the_nodes_socket_and_the_offer() -> None:
    handover = OutputHandover()
    try:
        offer = handover.offer(open_captures("pipe", {}))
        argv = handover.launcher_argv("/py", offer, ["cmd", "--", "x"])
    finally:
        handover.close()
        close_captures(offer.captures)
    assert argv == [
        "/py",
        "-I",
        "-S",
        "-c",
        LAUNCHER_SOURCE,
        f"{NODE_DIR}/{SOCKET_NAME}",
        offer.token,
        "--",
        "cmd",
        "--",
        "x",
    ]


def test_the_launcher_takes_the_captures_and_becomes_the_command(tmp_path: Path) -> None:
    handover = OutputHandover()
    try:
        offer = handover.offer(open_captures("socket", {}))
        child = _launch(handover, offer.token, [sys.executable, "-c", COMMAND])
        assert offer.wait(10) and offer.reason is None
        lines: list[tuple[str, str, int]] = []
        handle = ProcHandle(ProcessSpec("p", []), child.pid, None)
        threads = start_pumps(
            handle, offer.captures, tmp_path, lambda h, s, line, t: lines.append((s, line, t))
        )
        out, err = child.communicate(timeout=30)
        for t in threads:
            t.join(timeout=10)
    finally:
        handover.close()
    assert child.returncode == 0 and out == b"" and err == b""  # nothing through the exec's own stream
    assert offer.captures["stdout"].stamp == "write"
    pid_line, hello, around = sorted(lines, key=lambda x: x[2])
    assert pid_line[:2] == ("stderr", f"pid {child.pid}")  # exec'd in place: the exec's pid is the command's
    before, after = (int(x) for x in around[1].split())
    assert hello[:2] == ("stdout", "hello") and before <= hello[2] <= after  # the kernel's stamp of the write
    assert (tmp_path / "p.out").read_text() == "hello\n"
    assert not Path(handover.host_dir).exists()


def test_an_unknown_token_gets_nothing_and_the_command_runs_on_the_execs_own_stream() -> None:
    handover = OutputHandover()
    try:
        child = _launch(handover, "not-offered", [sys.executable, "-c", "print('plain')"])
        out, err = child.communicate(timeout=30)
    finally:
        handover.close()
    assert child.returncode == 0 and out == b"plain\n"
    assert err.decode().startswith(FALLBACK) and err.count(b"\n") == 1


def test_an_offer_nobody_takes_fails_with_its_reason_and_a_late_launcher_falls_back() -> None:
    handover = OutputHandover()
    try:
        captures = open_captures("socket", {})
        offer = handover.offer(captures)
        t0 = time.monotonic()
        assert not offer.wait(0.05) and offer.reason == "no launcher took the output sockets within 0.05 s"
        assert time.monotonic() - t0 < 5
        close_captures(captures)
        child = _launch(handover, offer.token, [sys.executable, "-c", "print('late')"])
        out, err = child.communicate(timeout=30)
    finally:
        handover.close()
    assert (child.returncode, out) == (0, b"late\n") and err.decode().startswith(FALLBACK)


def test_a_command_that_cannot_be_run_exits_as_a_shell_says() -> None:
    handover = OutputHandover()
    try:
        offer = handover.offer(open_captures("pipe", {}))
        child = _launch(handover, offer.token, ["/nonexistent/command"])
        assert offer.wait(10)
        child.communicate(timeout=30)
    finally:
        handover.close()
        close_captures(offer.captures)
    assert child.returncode == 127


def test_the_capture_directory_is_named_in_the_run_directory_before_it_is_made(tmp_path: Path) -> None:
    """A harness killed at any moment of the handover's life leaves its directory named in the run directory
    (the record is written before the directory is made, removed after it is gone): what `chaosbench cleanup`
    reads for a crashed run."""
    record = tmp_path / CAPTURE_RECORD
    handover = OutputHandover(record)
    try:
        assert record.read_text() == handover.host_dir + "\n"
        assert os.path.isdir(handover.host_dir)
        assert os.path.basename(handover.host_dir).startswith(CAPTURE_DIR_PREFIX)
    finally:
        handover.close()
    assert not os.path.exists(handover.host_dir) and not record.exists()
