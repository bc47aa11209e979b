"""A user's own model server behind the balancer (workload ``serve-command``): tests/fixtures/foreign/model_server.py
(http.server + a tiny torch model; it imports nothing of chaosbench, answers ``GET /healthz`` and ``POST
/v1/predict``, logs with the logging module) as 2 replicas behind a real haproxy under real locust load, the
requests declared in the suite (a malformed input expecting 422 among them), replica 1 SIGKILLed 3 s into the
10 s load, health checks every 200 ms (fall 2, rise 2) and a supervisor that restarts it.

Every figure is checked against the run's own logs: the server's (its pid, when it listened, its access lines),
haproxy's (its DOWN and UP lines) and the load's counts; and the metrics against the events they come from.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.timeline_index import TimelineIndex
from chaosbench.analysis.timing import fault_effect_ns
from chaosbench.timeline import Event
from tests.helpers import events_of, require, run_suite_text, serve_problem

pytestmark = pytest.mark.integration

require("serve", serve_problem())

INPUT = "[0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8]"
SUITE = f"""
name: own-server
seed: 3
control: false
defaults:
  deadline_s: 90
  workload:
    name: serve-command
    ranks: 2
    command: [{sys.executable}, "{{project_dir}}/tests/fixtures/foreign/model_server.py", --host, "{{host}}",
              --port, "{{port}}", --replica, "{{rank}}"]
    ready: {{path: /healthz, expect_status: 200, interval_s: 0.1, timeout_s: 1}}
    load:
      users: 4
      spawn_rate: 100
      duration_s: 10
      request_timeout_s: 3
      requests:
        - {{name: predict, method: POST, path: /v1/predict, body: {{inputs: [{INPUT}]}}, weight: 8}}
        - {{name: health, method: GET, path: /healthz, weight: 1}}
        - {{name: bad-input, method: POST, path: /v1/predict, body: {{inputs: nope}}, expect_status: 422, weight: 1}}
    slo: {{availability: 0.999, window_days: 30, error_rate: 0.01, recovery_window_s: 2}}
frameworks:
  supervised: {{adapter: balancer, check_interval_ms: 200, fall: 2, rise: 2, supervisor: true}}
faults:
  kill-replica1: {{injector: kill, target: {{rank: 1}}, trigger: {{after_s: 3}}}}
matrix: {{frameworks: [supervised], faults: [kill-replica1], repeats: 1}}
"""

#: The server's logging lines: ``2026-12-05 07:30:01,123 model_server INFO <message>`` (local time, ms). A record
#: may follow another thread's unfinished line: socketserver reports a request's error (haproxy's health checks
#: reset their connections) with ``print``, which writes the text and its newline apart and takes no lock, so a
#: record that lands in between is glued to it (seen: ``-----...-----2026-12-05 15:16:38,250 model_server INFO
#: "POST /v1/predict HTTP/1.1" 200 -``): the record is searched for, not matched at the line's start.
LOG_RE = re.compile(r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) model_server INFO (?P<msg>.*)$")
LISTENING_RE = re.compile(
    r"listening on http://(?P<host>[\d.]+):(?P<port>\d+) \(replica (?P<replica>\d+), "
    r"pid (?P<pid>\d+)\)"
)
ACCESS_RE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/1\.[01]" (?P<status>\d{3})')


def _server_log(run_dir: Path, name: str) -> list[tuple[int, str]]:
    """The server's own lines in a replica's log (the shim forwards them to its stdout): (ns since the epoch,
    message); the stamp is the server's own asctime, to the millisecond, floored."""
    out = []
    for line in (run_dir / "logs" / f"{name}.out").read_text().splitlines():
        if m := LOG_RE.search(line):
            t = time.mktime(time.strptime(m["date"], "%Y-%m-%d %H:%M:%S"))
            out.append((int(t) * 1_000_000_000 + int(m["ms"]) * 1_000_000, m["msg"]))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunMetrics:
    runs = run_suite_text(SUITE, tmp_path_factory.mktemp("own-server"), "own-server.yaml")
    (m,) = runs.values()
    return m


def _of(evs: list[Event], kind: str, **match: object) -> list[Event]:
    return [e for e in evs if e.kind == kind and all(e.get(k) == v for k, v in match.items())]


def test_the_servers_own_pid_is_the_replica_the_kill_hit(run: RunMetrics) -> None:
    evs = events_of(run)
    run_dir = Path(str(run.run_dir))
    starts = {(e["rank"], e["incarnation"]): e for e in _of(evs, "rank_start")}
    assert sorted(starts) == [(0, 0), (1, 0), (1, 1)]
    for (rank, inc), start in starts.items():
        listening = [LISTENING_RE.search(msg) for _, msg in _server_log(run_dir, f"replica{rank}.i{inc}")]
        (m,) = [x for x in listening if x]
        assert (int(m["pid"]), int(m["replica"]), int(m["port"])) == (start["pid"], rank, start["port"])
    (fault,) = _of(evs, "fault_inject")
    assert [t["pid"] for t in fault["target"]] == [starts[(1, 0)]["pid"]]
    # the restarted server is a new process on the same port
    assert starts[(1, 1)]["pid"] != starts[(1, 0)]["pid"] and starts[(1, 1)]["port"] == starts[(1, 0)]["port"]
    # the killed server wrote nothing after the kill (its last line is stamped by its own clock, floored to ms)
    last_ns = _server_log(run_dir, "replica1.i0")[-1][0]
    assert last_ns <= fault_effect_ns(TimelineIndex(evs), fault)


def test_ready_comes_from_the_health_path_after_the_server_listened(run: RunMetrics) -> None:
    evs = events_of(run)
    run_dir = Path(str(run.run_dir))
    for e in _of(evs, "replica_ready"):
        rank, inc = e["rank"], e["incarnation"]
        log = _server_log(run_dir, f"replica{rank}.i{inc}")
        listened_ns = next(t for t, msg in log if LISTENING_RE.search(msg))
        # the shim's poll is the first HTTP/1.1 GET the server answered (haproxy's checks speak HTTP/1.0, and the
        # load's requests reach a replica only once haproxy has it UP, after it was ready); the server logs an
        # answer as it sends it, so before the shim has it, stamped to the ms, floored
        polled_ns, polled = next((t, msg) for t, msg in log if '"GET /healthz HTTP/1.1"' in msg)
        assert polled.endswith('"GET /healthz HTTP/1.1" 200 -'), polled
        assert listened_ns <= polled_ns <= e.t_ns
        assert e["url"] == f"http://127.0.0.1:{e['port']}/healthz"
    assert sorted((e["rank"], e["incarnation"]) for e in _of(evs, "replica_ready")) == [
        (0, 0),
        (1, 0),
        (1, 1),
    ]


def test_haproxy_took_the_replica_out_and_back_as_its_log_says(run: RunMetrics) -> None:
    evs = events_of(run)
    haproxy = (Path(str(run.run_dir)) / "logs" / "haproxy.out").read_text().splitlines()
    downs = [line for line in haproxy if re.search(r"Server replicas/r\d+ is DOWN", line)]
    ups = [line for line in haproxy if re.search(r"Server replicas/r\d+ is UP", line)]
    # exactly replica 1 went down once (a connection refused) and came back once; replica 0 never left: the
    # checks GET the declared /healthz (the server answers 404 on /health)
    assert len(downs) == 1 and "replicas/r1 is DOWN" in downs[0] and "Layer4 connection problem" in downs[0]
    assert len(ups) == 1 and "replicas/r1 is UP" in ups[0]
    (down,), (up,) = _of(evs, "balancer_down"), _of(evs, "balancer_up")
    # the events come from whichever copy of the line haproxy wrote first: its raw log (stdout) or the same text
    # on stderr after "[WARNING]  (pid) : "
    assert (down["rank"], up["rank"]) == (1, 1)
    assert downs[0].startswith(down["line"].split(" : ", 1)[-1])
    assert ups[0].startswith(up["line"].split(" : ", 1)[-1])
    (restart,) = _of(evs, "restart")
    (ready1,) = _of(evs, "replica_ready", rank=1, incarnation=1)
    (fault,) = _of(evs, "fault_inject")
    # the supervisor restarts the replica when its process exits, whether or not haproxy has it DOWN yet; haproxy
    # puts it back only after the new incarnation answered
    assert fault.t_ns < down.t_ns < up.t_ns and fault.t_ns < restart.t_ns < ready1.t_ns < up.t_ns


def test_the_loads_counts_add_up_and_match_the_servers_access_lines(run: RunMetrics) -> None:
    evs = events_of(run)
    run_dir = Path(str(run.run_dir))
    windows = _of(evs, "load_window")
    (end,) = _of(evs, "load_end")
    assert run.requests == end["requests"] == sum(w["requests"] for w in windows)
    assert run.failed_requests == end["failures"] == sum(w["failures"] for w in windows)
    by = end["by_request"]
    assert sorted(by) == ["bad-input", "health", "predict"]
    assert sum(c["requests"] for c in by.values()) == end["requests"]
    assert sum(c["failures"] for c in by.values()) == end["failures"]
    # the load's failures are the balancer's answers for the dead replica (503: no server; 502: it died while
    # answering) or a connection it dropped (seen: RemoteDisconnected), never an answer of the server's own (a 422
    # is what bad-input expects)
    errors: dict[str, int] = {}
    for w in windows:
        for kind, n in w["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    assert sum(errors.values()) == end["failures"], errors
    assert {k for k in errors if k.isdigit()} <= {"502", "503"}, errors
    # every request the load counted a success was answered by a replica, which logged it as it answered; a
    # logged answer the load did not count is one it began and never finished: unfinished at the load's end,
    # or cut off by the kill (then counted a failure)
    access = [
        ACCESS_RE.search(msg)
        for name in ("replica0.i0", "replica1.i0", "replica1.i1")
        for _, msg in _server_log(run_dir, name)
    ]
    logged = {"predict": 0, "bad-input": 0}
    for m in access:
        if m and m["method"] == "POST" and m["path"] == "/v1/predict":
            logged["predict" if m["status"] == "200" else "bad-input"] += 1
            assert m["status"] in ("200", "422"), m.group(0)
    for name, count in logged.items():
        c = by[name]
        ok = c["requests"] - c["failures"]
        assert ok <= count <= ok + c["unfinished"] + c["failures"], (name, count, c)
    assert by["bad-input"]["requests"] > 0 and by["predict"]["requests"] > 0


def test_the_serving_metrics_are_the_events(run: RunMetrics) -> None:
    evs = events_of(run)
    ix = TimelineIndex(evs)
    (fault,) = _of(evs, "fault_inject")
    tf = fault_effect_ns(ix, fault)
    (down,), (up,) = _of(evs, "balancer_down"), _of(evs, "balancer_up")
    window_ns = 100_000_000
    failed = [w for w in _of(evs, "load_window") if w["failures"]]
    assert failed, "the kill failed no request"
    first_failed_end = min(
        w.t_ns + round(w["window_s"] * 1e9) for w in failed if w.t_ns + w["window_s"] * 1e9 > tf
    )
    detect = min(down.t_ns, first_failed_end)
    assert run.time_to_detect_s == pytest.approx((detect - tf) / 1e9, abs=1e-9)
    assert run.detected_via == (
        "balancer health check" if down.t_ns <= first_failed_end else "failed request"
    )
    # requests fail only from the kill until haproxy took the replica out (a request counts in the window it
    # ended in: one refused just before the DOWN may end in the window after it)
    assert all(w.t_ns + w["window_s"] * 1e9 > tf and w.t_ns <= down.t_ns + window_ns for w in failed), failed
    assert run.outcome == "recovered" and run.time_to_recover_s is not None
    # replica 1 was out from the kill until haproxy put its restarted incarnation back; replica 0 never
    assert run.capacity_lost_replica_s == pytest.approx((up.t_ns - tf) / 1e9, abs=1e-9)
    assert run.replicas == 2 and run.restart_count == 1
