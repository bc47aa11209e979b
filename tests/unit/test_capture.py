"""Output capture: each line stamped when the child wrote it, however late the harness reads it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import compute_metrics
from chaosbench.runtimes.base import ProcessSpec, RunInfo
from chaosbench.runtimes.capture import Capture
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.timeline import TimelineWriter, read_events

#: A child that reports, on stderr, the moments around each of its writes to stdout.
CHILD = textwrap.dedent("""
    import os, sys, time
    def w(data):
        before = time.time_ns(); os.write(1, data); after = time.time_ns()
        sys.stderr.write(f"{before} {after}\\n"); sys.stderr.flush()
    w(b"one\\n")
    w(b"par")                        # a line in two writes: stamped by the write that completed it
    time.sleep(0.05)
    w(b"tial\\ntwo\\rstill two\\n")  # two lines in one write; a carriage return does not end a line
    w(b"")                           # a zero-length write does not end the stream
    w(b"x" * int(sys.argv[1]) + b"\\n")  # one large write arrives whole
    w(b"no newline")
""")


def run_child(
    mode: str, read_after_s: float, large: int
) -> tuple[Capture, list[tuple[bytes, int]], list[tuple[int, int]], int]:
    cap = Capture(mode)  # type: ignore[arg-type]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(large)], stdout=cap.child_fd, stderr=subprocess.PIPE
    )
    cap.spawned()
    assert child.stderr is not None
    child.wait(timeout=30)
    time.sleep(read_after_s)  # the reader is late: the stamps must not say so
    read_at = time.time_ns()
    lines = list(cap.lines())
    cap.close()
    writes = [tuple(int(x) for x in ln.split()) for ln in child.stderr.read().decode().splitlines()]
    return cap, lines, writes, read_at  # type: ignore[return-value]


def test_socket_capture_stamps_each_line_inside_the_write_that_completed_it() -> None:
    large = min(2 << 20, Capture("socket").max_write_bytes or 0)  # as large as this machine lets one write be
    cap, lines, writes, read_at = run_child("socket", 0.2, large)
    assert cap.stamp == "write"
    assert [ln[:12] for ln, _ in lines] == [
        b"one\n",
        b"partial\n",
        b"two\rstill tw",
        b"x" * 12,
        b"no newline",
    ]
    assert len(lines[3][0]) == large + 1
    # each line -> the write that completed it ("one", "tial..." twice, the large one, the unterminated tail)
    for (_, t), w in zip(lines, [0, 2, 2, 4, 5], strict=True):
        before, after = writes[w]
        assert before <= t <= after, (t, before, after)
    assert all(t < read_at - 150_000_000 for _, t in lines)  # not the read's time, 200 ms later


def test_pipe_capture_stamps_when_read() -> None:
    cap, lines, writes, read_at = run_child("pipe", 0.1, 1000)  # a pipe holds 64 KiB while nobody reads
    assert cap.stamp == "read"
    assert [ln[:4] for ln, _ in lines] == [b"one\n", b"part", b"two\r", b"xxxx", b"no n"]
    assert all(t >= read_at for _, t in lines)


def test_stream_ends_only_when_every_writer_has_closed() -> None:
    """A grandchild that inherited the stream keeps it open after the child exited, as a pipe would."""
    cap = Capture("socket")
    code = (
        "import os, subprocess, sys, time; os.write(1, b'parent\\n'); "
        "subprocess.Popen([sys.executable, '-c', 'import os, time; time.sleep(0.3); os.write(1, b\"late\\\\n\")'])"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=cap.child_fd)
    cap.spawned()
    child.wait(timeout=30)
    assert [ln for ln, _ in cap.lines()] == [b"parent\n", b"late\n"]
    cap.close()


@pytest.mark.parametrize("mode", ["socket", "pipe"])
def test_a_child_that_never_started_leaves_nothing_open(mode: str) -> None:
    import os

    before = set(os.listdir("/proc/self/fd"))
    cap = Capture(mode)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        subprocess.Popen(["/nonexistent/binary"], stdout=cap.child_fd)
    cap.close()
    cap.close()  # idempotent
    assert set(os.listdir("/proc/self/fd")) == before


def _local(tmp_path: Path, capture: str) -> LocalRuntime:
    options = LocalRuntime.Options.model_validate({"output_capture": capture})
    return LocalRuntime(RunInfo("run-1", tmp_path, TimelineWriter(tmp_path / "events.jsonl")), options)


def test_local_runtime_hands_watchers_the_stamp_of_the_write(tmp_path: Path) -> None:
    rt = _local(tmp_path, "socket")
    seen: list[tuple[str, int]] = []
    code = (
        "import os, sys, time; b = time.time_ns(); os.write(1, b'ready\\n'); a = time.time_ns(); "
        "time.sleep(0.2); print(b, a, file=sys.stderr)"
    )
    try:
        h = rt.start(
            ProcessSpec("p", [sys.executable, "-c", code]), on_line=lambda _h, s, ln, t: seen.append((ln, t))
        )
        assert h.exited.wait(30)
    finally:
        rt.cleanup(grace_s=1)
    (line, t), (bracket, _) = seen
    before, after = (int(x) for x in bracket.split())
    assert line == "ready" and before <= t <= after
    start = next(e for e in read_events(tmp_path / "events.jsonl") if e.kind == "proc_start")
    assert start["output_stamp"] == "write"


@pytest.mark.parametrize("capture", ["socket", "pipe"])
def test_a_write_beyond_the_socket_limit_fails_and_says_so(tmp_path: Path, capture: str) -> None:
    """One write larger than the socket capture allows fails in the child (a pipe takes it); the run's timeline
    gets a ``capture_limit`` event, and the metrics' verdict names it."""
    limit = Capture("socket").max_write_bytes
    assert limit is not None
    rt = _local(tmp_path, capture)
    code = f"import os; os.write(1, b'x' * {limit + 1} + b'\\n')"
    try:
        h = rt.start(ProcessSpec("big", [sys.executable, "-c", code]))
        assert h.exited.wait(30)
    finally:
        rt.cleanup(grace_s=1)
    events = read_events(tmp_path / "events.jsonl")
    limits = [e for e in events if e.kind == "capture_limit"]
    if capture == "pipe":
        assert h.returncode == 0 and not limits
        assert (tmp_path / "logs" / "big.out").stat().st_size == limit + 2
        return
    assert h.returncode == 1
    assert [(e["proc"], e["stream"]) for e in limits] == [("big", "stderr")]
    assert "Message too long" in limits[0]["line"]
    start = TimelineWriter(tmp_path / "t.jsonl")
    start.emit("run_start", suite="s", scenario="x", repeat=0, framework="none", fault="kill", control=False)
    m = compute_metrics([*read_events(tmp_path / "t.jsonl"), *limits])
    assert m.capture_limit is not None and "output_capture: pipe" in m.capture_limit
    assert "refused for its size" in str(m.verdict) and "output_capture: pipe" in str(m.verdict)
