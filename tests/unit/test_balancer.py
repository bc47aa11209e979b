"""The balancer adapter's pure parts: the haproxy configuration per policy, its log lines and its stats."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaosbench.frameworks.balancer import (
    BalancerFramework,
    BalancerOptions,
    ReadyWatch,
    StateWatcher,
    haproxy_config,
    read_stats,
)
from chaosbench.runtimes.base import ProcessSpec, ProcHandle
from chaosbench.timeline import Event, TimelineWriter, read_events

FIXTURES = Path(__file__).parent.parent / "fixtures"


def config(**options: object) -> str:
    return haproxy_config(
        BalancerOptions.model_validate(options),
        "127.0.0.1:8080",
        [(0, "127.0.0.1:9000"), (1, "127.0.0.1:9001")],
        "127.0.0.1:9999",
    )


def test_health_checks_with_haproxy_defaults() -> None:
    text = config()
    assert "option httpchk GET /health" in text
    assert "default-server inter 2000ms fall 3 rise 2" in text
    assert "server r0 127.0.0.1:9000 check" in text and "server r1 127.0.0.1:9001 check" in text
    assert "retries 0" in text and "redispatch" not in text
    assert "stats socket ipv4@127.0.0.1:9999" in text
    assert "bind 127.0.0.1:8080" in text


def test_no_health_checks_and_retries() -> None:
    text = config(health_checks=False, retries=3)
    assert "httpchk" not in text and " check" not in text
    assert "retries 3" in text and "option redispatch" in text


def test_liveness_needs_supervisor_and_checks() -> None:
    with pytest.raises(ValidationError, match="liveness_restart_after_s"):
        BalancerOptions(liveness_restart_after_s=5)
    BalancerOptions(supervisor=True, liveness_restart_after_s=5)


def test_state_watcher_one_event_per_change(tmp_path: Path) -> None:
    writer = TimelineWriter(tmp_path / "events.jsonl")
    watch = StateWatcher("health", writer)
    h = ProcHandle(ProcessSpec("haproxy", ["haproxy"], role="balancer"), 1, None)
    down = (
        'Server replicas/r1 is DOWN, reason: Layer4 connection problem, info: "Connection refused", '
        "check duration: 0ms. 1 active and 0 backup servers left."
    )
    watch(h, "stderr", f"[WARNING]  (9178) : {down}", 100)
    watch(h, "stdout", down, 101)  # the same change, on the other stream
    assert watch.down_since_ns == {1: 100}
    watch(h, "stdout", "Server replicas/r1 is UP, reason: Layer7 check passed, code: 200", 200)
    watch(ProcHandle(ProcessSpec("rank1", ["x"], role="rank"), 2, None), "stdout", down, 300)  # not haproxy's
    writer.close()
    evs = [e for e in read_events(tmp_path / "events.jsonl") if e.kind.startswith("balancer_")]
    assert [(e.kind, e.get("rank"), e.t_ns) for e in evs] == [
        ("balancer_down", 1, 100),
        ("balancer_up", 1, 200),
    ]
    assert evs[0].get("reason") == "Layer4 connection problem"
    assert watch.down_since_ns == {}


class _Running(ProcHandle):
    def poll(self) -> int | None:
        return None


def test_liveness_waits_for_the_restarted_replica_and_startup_timeout_bounds_its_load(tmp_path: Path) -> None:
    """Seen: a replica restarted after a kill was killed again by the liveness clock while it still loaded (the
    balancer had held r1 DOWN since the kill), which spent a restart."""
    o = BalancerOptions(supervisor=True, liveness_restart_after_s=2, startup_timeout_s=10)
    fw = BalancerFramework.__new__(BalancerFramework)
    writer = TimelineWriter(tmp_path / "events.jsonl")
    states, ready = StateWatcher("sup", writer), ReadyWatch()
    h = _Running(ProcessSpec("replica1.i1", ["x"], role="rank", incarnation=1), 1, None)
    now = time.time_ns()
    s = 1_000_000_000
    states(
        ProcHandle(ProcessSpec("haproxy", ["haproxy"], role="balancer"), 2, None),
        "stdout",
        "Server replicas/r1 is DOWN, reason: Layer4 connection problem",
        now - 5 * s,
    )
    # loading, 3 s after its start, DOWN for 5 s: no liveness restart, the startup timeout is 10 s
    assert fw._replica_failure(h, 1, states, ready, now - 3 * s, o) is None
    # not ready 11 s after its start: the startup timeout restarts it
    assert fw._replica_failure(h, 1, states, ready, now - 11 * s, o) == (
        "replica1.i1 not ready 10 s after its start",
        "startup_timeout",
    )
    # ready 1 s ago, still DOWN: the liveness clock runs from its ready
    ready(Event(now - 1 * s, "replica_ready", data={"rank": 1, "incarnation": 1}))
    assert fw._replica_failure(h, 1, states, ready, now - 3 * s, o) is None
    ready.ready_ns[(1, 1)] = now - 3 * s
    assert fw._replica_failure(h, 1, states, ready, now - 5 * s, o) == (
        "r1 DOWN at the balancer for 2 s",
        "health_check",
    )
    writer.close()


def test_read_stats_from_show_stat() -> None:
    """haproxy 2.6's ``show stat`` (tests/fixtures: 2 replicas, r1 killed, retries 2 with redispatch)."""
    canned = (FIXTURES / "haproxy_show_stat.csv").read_bytes()
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            assert conn.recv(100) == b"show stat\n"
            conn.sendall(canned)

    t = threading.Thread(target=answer)
    t.start()
    stats = read_stats("127.0.0.1", port)
    t.join()
    srv.close()
    assert stats["retries"] == 0 and stats["redispatches"] == 5
    assert stats["servers"]["r1"]["status"] == "DOWN" and stats["servers"]["r1"]["went_down"] == 1
    assert stats["servers"]["r0"]["status"] == "UP" and stats["servers"]["r0"]["check_failures"] == 0
