"""Timeline writing, concurrent appends, and the follower that feeds triggers."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from chaosbench.registry import Registry
from chaosbench.timeline import TimelineFollower, TimelineWriter, read_events


def _writer(path: str, rank: int, n: int) -> None:
    w = TimelineWriter(path, src="rank")
    for i in range(n):
        w.emit("step_skipped", rank=rank, step=i, reason="x" * 200)  # a long line
    w.close()


def test_concurrent_appends_from_processes_never_interleave(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    procs = [mp.get_context("fork").Process(target=_writer, args=(str(p), r, 500)) for r in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    ev = read_events(p)
    assert len(ev) == 2000
    for r in range(4):
        assert sorted(e["step"] for e in ev if e["rank"] == r) == list(range(500))


def test_follower_dispatches_new_events_in_order(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    w = TimelineWriter(p)
    w.emit("run_start")
    seen: list[str] = []
    f = TimelineFollower(p, poll_s=0.002)
    f.subscribe(lambda e: seen.append(e.kind))
    f.start()
    w.emit("step", src="rank", rank=0, step=1)
    w.emit("restart", src="framework", framework="restart", attempt=1)
    w.emit("run_end", outcome="completed")
    t = time.monotonic()
    while len(seen) < 4 and time.monotonic() - t < 2:
        time.sleep(0.005)
    f.stop()
    assert seen == ["run_start", "step", "restart", "run_end"]


def test_registry_adds_but_never_replaces() -> None:
    reg: Registry[object] = Registry("thing", "chaosbench.test-none", {"a": "chaosbench.timeline:Event"})
    assert reg.names() == ["a"]
    reg.register("b", dict)
    assert reg.get("b") is dict
    try:
        reg.register("a", dict)
    except Exception as exc:  # noqa: BLE001
        assert "already registered" in str(exc)
    else:
        raise AssertionError("replaced a plugin")
    try:
        reg.get("zz")
    except Exception as exc:  # noqa: BLE001
        assert str(exc) == "unknown thing 'zz' (known: a, b)"
