"""Serving metrics on hand-built timelines with known answers: a control and fault runs of three replicas behind
a balancer, under a load of 100 requests per 1 s window (every metric checked against the arithmetic), a run
that does not recover, a run without balancer_down (detection by the first failed request), the error budget's
arithmetic, the SLO names for the gate, and the report section on a tiny result set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.latency import LATENCY_BUCKETS, LATENCY_EDGES_MS, latency_bucket, quantile_ms
from chaosbench.analysis.metrics import RunMetrics, compute_metrics, metric_names
from chaosbench.analysis.serving import error_budget_burn, per_second
from chaosbench.analysis.slo import evaluate
from chaosbench.timeline import Event

T0 = 1_700_000_000_000_000_000  # run_start, ns
S = 1_000_000_000
LOAD = T0 + 2 * S  # load_start
SLO = {"availability": 0.999, "window_days": 30, "error_rate": 0.01, "recovery_window_s": 3.0}
FAST, SLOW = latency_bucket(10.0), latency_bucket(20.0)  # the buckets holding 10 ms and 20 ms
FAST_LO, FAST_HI = LATENCY_EDGES_MS[FAST - 1], LATENCY_EDGES_MS[FAST]
SLOW_LO, SLOW_HI = LATENCY_EDGES_MS[SLOW - 1], LATENCY_EDGES_MS[SLOW]


def _hist(fast: int = 0, slow: int = 0) -> list[int]:
    h = [0] * LATENCY_BUCKETS
    h[FAST] += fast
    h[SLOW] += slow
    return h


def _server(rank: int) -> dict[str, Any]:
    """A ``balancer_down``/``balancer_up`` event's fields for replica ``rank``."""
    return {"framework": "balancer", "rank": rank, "server": f"r{rank}"}


def _window(k: int, requests: int = 100, failures: int = 0, slow: bool = False) -> Event:
    ok = requests - failures
    return Event(
        LOAD + k * S,
        "load_window",
        src="load",
        data={
            "window_s": 1.0,
            "requests": requests,
            "failures": failures,
            "errors": {"502": failures} if failures else {},
            "latency_hist": _hist(slow=ok) if slow else _hist(fast=ok),
            "p50_ms": None,
            "p99_ms": None,
            "max_ms": SLOW_HI if slow else FAST_HI,
        },
    )


def _timeline(
    windows: dict[int, tuple[int, bool]],
    *,
    control: bool = False,
    fault_at_s: float | None = 5.5,
    downs: list[tuple[float, float | None]] | None = None,
    stats: dict[str, Any] | None = None,
    n_windows: int = 20,
    scenario: str = "health/kill-replica",
    back_at_s: float | None = None,
) -> list[Event]:
    """Three replicas; 20 one-second windows of 100 requests from LOAD; ``windows``: k -> (failures, slow) for
    the windows that differ; ``downs``: (balancer_down, balancer_up or None) of replica 1, in seconds after
    LOAD; the fault (kill of replica 1) ``fault_at_s`` after LOAD; ``back_at_s``: its restarted incarnation is
    ready then."""
    ev = [
        Event(
            T0,
            "run_start",
            data={
                "suite": "serving",
                "scenario": scenario,
                "framework": scenario.split("/")[0],
                "fault": None if control else scenario.split("/")[1],
                "repeat": 0,
                "control": control,
            },
        )
    ]
    for r in range(3):
        ev.append(
            Event(
                T0 + S // 10,
                "rank_start",
                src="rank",
                data={"rank": r, "world_size": 3, "incarnation": 0, "pid": 100 + r},
            )
        )
        ev.append(
            Event(T0 + S, "replica_ready", src="rank", data={"rank": r, "incarnation": 0, "port": 9000 + r})
        )
    ev.append(
        Event(
            LOAD,
            "load_start",
            src="load",
            data={"target": "http://127.0.0.1:8000", "users": 10, "window_s": 1.0, "slo": SLO},
        )
    )
    for k in range(n_windows):
        failures, slow = windows.get(k, (0, False))
        ev.append(_window(k, failures=failures, slow=slow))
    if not control and fault_at_s is not None:
        ev.append(
            Event(
                LOAD + int(fault_at_s * S),
                "fault_inject",
                src="injector",
                data={"fault": "kill-replica", "injector": "kill", "target": [{"rank": 1}]},
            )
        )
    if back_at_s is not None:
        ev.append(
            Event(LOAD + int(back_at_s * S), "replica_ready", src="rank", data={"rank": 1, "incarnation": 1})
        )
    for down, up in downs or []:
        ev.append(Event(LOAD + int(down * S), "balancer_down", src="framework", data=_server(1)))
        if up is not None:
            ev.append(Event(LOAD + int(up * S), "balancer_up", src="framework", data=_server(1)))
    failed = sum(f for f, _ in windows.values())
    ev.append(
        Event(
            LOAD + n_windows * S,
            "load_end",
            src="load",
            data={"requests": 100 * n_windows, "failures": failed, "duration_s": n_windows},
        )
    )
    if stats is not None:
        ev.append(
            Event(
                LOAD + n_windows * S + S // 10,
                "balancer_stats",
                src="framework",
                data={"framework": "balancer", **stats},
            )
        )
    ev.append(Event(LOAD + n_windows * S + S // 2, "run_end", data={"outcome": "completed"}))
    return sorted(ev, key=lambda e: e.t_ns)


def control_run() -> list[Event]:
    return _timeline({}, control=True, scenario="health/control")


#: The fault run: replica 1 killed 5.5 s into the load; failures in windows 5-7 (10, 30, 30, their successes
#: slow), 1 failure in window 8 (1 %: healthy); the balancer marks replica 1 down at 6.5 s; its restarted
#: incarnation is ready at 9.0 s, the balancer marks it up at 9.5 s.
FAULT_WINDOWS = {5: (10, True), 6: (30, True), 7: (30, True), 8: (1, False)}


def fault_run(**kw: Any) -> list[Event]:
    kw.setdefault("downs", [(6.5, 9.5)])
    kw.setdefault("back_at_s", 9.0)
    kw.setdefault("stats", {"retries": 7, "redispatches": 2, "servers": {}})
    return _timeline(FAULT_WINDOWS, **kw)


def _q(fast: int, slow: int, q: float) -> float:
    """The q-quantile of ``fast`` latencies in the FAST bucket and ``slow`` ones in the SLOW one, interpolated
    linearly within the bucket."""
    rank = q * (fast + slow)
    if rank <= fast:
        return FAST_LO + (FAST_HI - FAST_LO) * rank / fast
    return SLOW_LO + (SLOW_HI - SLOW_LO) * (rank - fast) / slow


P50_FAST, P99_FAST = _q(1, 0, 0.5), _q(1, 0, 0.99)
P50_SLOW, P99_SLOW = _q(0, 1, 0.5), _q(0, 1, 0.99)


# ------------------------------------------------------------------------------------------------ histogram
def test_histogram_edges_and_quantiles() -> None:
    assert (
        list(LATENCY_EDGES_MS) == sorted(set(LATENCY_EDGES_MS))
        and LATENCY_BUCKETS == len(LATENCY_EDGES_MS) + 1
    )
    assert latency_bucket(LATENCY_EDGES_MS[0] / 2) == 0 and latency_bucket(1e9) == LATENCY_BUCKETS - 1
    assert FAST_LO <= 10.0 < FAST_HI and SLOW_LO <= 20.0 < SLOW_HI and FAST < SLOW
    assert quantile_ms(_hist(fast=100), 0.5) == pytest.approx(FAST_LO + (FAST_HI - FAST_LO) * 0.5)
    assert quantile_ms(_hist(fast=100), 0.99) == pytest.approx(FAST_LO + (FAST_HI - FAST_LO) * 0.99)
    assert quantile_ms(_hist(fast=50, slow=50), 0.75) == pytest.approx(SLOW_LO + (SLOW_HI - SLOW_LO) * 0.5)
    assert quantile_ms(_hist(fast=50, slow=50), 0.5) == pytest.approx(FAST_HI)  # the rank at a bucket's end
    first = [0] * LATENCY_BUCKETS
    first[0] = 4
    assert quantile_ms(first, 0.25) == pytest.approx(LATENCY_EDGES_MS[0] * 0.25)  # bucket 0 starts at 0
    assert quantile_ms([0] * LATENCY_BUCKETS, 0.5) is None
    overflow = [0] * LATENCY_BUCKETS
    overflow[-1] = 3
    assert quantile_ms(overflow, 0.5, max_ms=123456.0) == 123456.0
    assert quantile_ms(overflow, 0.5) == LATENCY_EDGES_MS[-1]


def test_the_load_counts_over_the_same_edges() -> None:
    """One definition of the edges: the load process's histogram is the one the analysis merges."""
    serve_load = pytest.importorskip("chaosbench.workloads.serve_load")
    assert tuple(serve_load.LATENCY_EDGES_MS) == LATENCY_EDGES_MS


def test_error_budget_arithmetic() -> None:
    # 99.9 % over 30 days at 100 requests/s: 0.001 x 100 x 2,592,000 s = 259,200 requests may fail.
    assert error_budget_burn(259_200, 0.999, 100.0, 30) == pytest.approx(1.0)
    assert error_budget_burn(2_592, 0.999, 100.0, 30) == pytest.approx(0.01)
    assert error_budget_burn(10, 0.99, 10.0, 1) == pytest.approx(10 / (0.01 * 10 * 86400))
    assert error_budget_burn(10, 1.0, 100.0, 30) is None  # no budget at all


# ------------------------------------------------------------------------------------------------- metrics
def test_control_run() -> None:
    m = compute_metrics(control_run())
    assert m.serving and m.control and m.outcome == "completed" and m.clean is True
    assert (m.requests, m.failed_requests, m.error_rate) == (2000, 0, 0.0)
    assert m.budget_request_rate_per_s == pytest.approx(100.0)
    assert m.error_budget_burn == 0.0
    assert m.latency_p50_ms == pytest.approx(P50_FAST) and m.latency_p99_ms == pytest.approx(P99_FAST)
    assert m.capacity_lost_replica_s == 0.0 and m.capacity_lost_share == 0.0 and m.replicas == 3
    assert m.time_to_detect_s is None and m.missing["time_to_detect_s"] == "control run (no fault)"
    assert (
        m.lost_steps is None and m.fidelity is None and m.missing["fidelity"] == "serving run (no training)"
    )
    assert m.verdict == "completed: 2000 requests, 0 failed"


def test_fault_run_every_metric() -> None:
    m = compute_metrics(fault_run(), control=control_run())
    assert m.serving and not m.control and m.outcome == "recovered" and m.recovered is True
    assert m.fault_t_s == pytest.approx(7.5)  # 2 s to load_start + 5.5 s
    assert (m.requests, m.failed_requests, m.retried_requests) == (2000, 71, 9)  # 7 retries + 2 redispatches
    assert m.error_rate == pytest.approx(71 / 2000)
    # Rate from the control run: 2000 requests over its 20 s load.
    assert m.budget_request_rate_per_s == pytest.approx(100.0)
    assert m.error_budget_burn == pytest.approx(71 / (0.001 * 100 * 30 * 86400))
    # Detection: the window [5, 6) s had failures: seen by its end, 0.5 s after the fault; the balancer marked
    # replica 1 down only 1.0 s after it.
    assert m.detected is True and m.time_to_detect_s == pytest.approx(0.5)
    assert m.detected_via == "failed request" and m.detected_by == "load"
    assert m.detect_t_s == pytest.approx(8.0)
    # Recovery: spans start at or after 6 s (end of the first failed window); windows 6 and 7 are unhealthy,
    # the span [8, 11) holds windows 8 (1 %: healthy), 9, 10: recovered at 8 s, 2.5 s after the fault.
    assert m.time_to_recover_s == pytest.approx(2.5)
    # Latency: before = windows 0-4 (fast); during = windows 5-7 (slow successes 90 + 70 + 70); after = 8-19.
    assert m.latency_p50_before_ms == pytest.approx(P50_FAST) and m.latency_p99_before_ms == pytest.approx(
        P99_FAST
    )
    assert m.latency_p50_during_ms == pytest.approx(P50_SLOW) and m.latency_p99_during_ms == pytest.approx(
        P99_SLOW
    )
    assert m.latency_p50_after_ms == pytest.approx(P50_FAST) and m.latency_p99_after_ms == pytest.approx(
        P99_FAST
    )
    fast, slow = 500 + 99 + 1100, 230
    assert m.latency_p50_ms == pytest.approx(_q(fast, slow, 0.5))
    assert m.latency_p99_ms == pytest.approx(_q(fast, slow, 0.99))
    # Capacity: replica 1 out from its kill (5.5 s) until the balancer put it back (9.5 s, after it was ready at
    # 9.0 s): 4 replica-s of 3 replicas x 20 s.
    assert m.capacity_lost_replica_s == pytest.approx(4.0) and m.capacity_lost_share == pytest.approx(4 / 60)
    assert m.lost_steps is None and m.time_to_resume_s is None and m.fidelity is None
    assert m.crash_loop is False and m.failure_class == "transient"
    assert m.verdict == (
        "recovered after 2.50 s: 2000 requests, 71 failed (0.0274 % of the error budget); detected by "
        "failed request after 0.50 s; 9 retried by the balancer"
    )


def test_balancer_detects_first() -> None:
    """The balancer marks the replica down 0.3 s after the fault, before the first failed window ends (6 s)."""
    m = compute_metrics(fault_run(downs=[(5.8, 9.5)]), control=control_run())
    assert m.time_to_detect_s == pytest.approx(0.3)
    assert m.detected_via == "balancer health check" and m.detected_by == "balancer"
    assert m.capacity_lost_replica_s == pytest.approx(4.0)  # from the kill, not from the balancer's down


def test_down_of_another_replica_is_no_detection() -> None:
    ev = fault_run(downs=[])
    ev.append(Event(LOAD + int(5.6 * S), "balancer_down", src="framework", data=_server(2)))
    m = compute_metrics(sorted(ev, key=lambda e: e.t_ns), control=control_run())
    assert m.detected_via == "failed request" and m.time_to_detect_s == pytest.approx(0.5)


def test_without_balancer_down_first_failed_request_detects() -> None:
    """No health checks: the balancer never marks the replica down; the first failed request detects it; the
    replica is out from its kill until its restarted incarnation is ready (the balancer sends to it at once)."""
    m = compute_metrics(fault_run(downs=[], stats=None), control=control_run())
    assert (
        m.detected is True and m.time_to_detect_s == pytest.approx(0.5) and m.detected_via == "failed request"
    )
    assert m.capacity_lost_replica_s == pytest.approx(3.5) and m.capacity_lost_share == pytest.approx(
        3.5 / 60
    )
    assert m.retried_requests is None and "no balancer_stats" in m.missing["retried_requests"]
    assert m.time_to_recover_s == pytest.approx(2.5)
    m = compute_metrics(
        fault_run(stats={"missing": "stats socket 127.0.0.1:9: refused"}), control=control_run()
    )
    assert (
        m.missing["retried_requests"]
        == "the balancer's stats name no retries (stats socket 127.0.0.1:9: refused)"
    )


def test_not_recovered() -> None:
    """A dead replica left in rotation: a third of the requests fail until the load ends."""
    windows = {k: (33, False) for k in range(5, 20)}
    m = compute_metrics(_timeline(windows), control=control_run())
    assert m.outcome == "not_recovered" and m.recovered is False and m.time_to_recover_s is None
    assert "no 3 s span after the fault" in m.missing["time_to_recover_s"]
    assert m.failed_requests == 15 * 33 and m.error_budget_burn == pytest.approx(495 / 259_200)
    assert m.latency_p50_after_ms is None and m.missing["latency_p50_after_ms"] == "not recovered"
    assert m.latency_p50_during_ms == pytest.approx(P50_FAST)  # windows 5-19, fast successes
    assert m.time_burned_s == pytest.approx(20.5 - 5.5)  # fault to run_end
    assert m.failure_class is None
    assert m.verdict.startswith("not recovered before the load ended: 2000 requests, 495 failed")


def test_recovery_needs_a_whole_span_before_the_load_ends() -> None:
    """Healthy only in the last 2 windows: a 3 s span does not fit before the load's end."""
    windows = {k: (50, False) for k in range(5, 18)}
    m = compute_metrics(_timeline(windows), control=control_run())
    assert m.recovered is False


def test_budget_rate_without_control_is_the_rate_before_the_fault() -> None:
    """No control: 500 requests in the five windows that ended before the fault, 100 requests/s; a load that
    ramped up (50 requests in its first window) lowers it."""
    m = compute_metrics(fault_run())
    assert m.budget_request_rate_per_s == pytest.approx(100.0)
    assert m.notes["budget_request_rate_per_s"] == "no control run: this run's rate before the fault"
    ev = [
        e
        if not (e.kind == "load_window" and e.t_ns == LOAD)
        else Event(e.t_ns, e.kind, e.src, e.host, {**e.data, "requests": 50})
        for e in fault_run()
    ]
    m = compute_metrics(ev)
    assert m.budget_request_rate_per_s == pytest.approx(450 / 5)
    assert m.error_budget_burn == pytest.approx(71 / (0.001 * 90 * 30 * 86400))
    assert m.notes["requests"] == "load_end counted 2000 requests, the windows 1950"


def test_fault_not_fired() -> None:
    m = compute_metrics(_timeline({}, fault_at_s=None), control=control_run())
    assert m.outcome == "fault_not_fired" and m.requests == 2000
    assert m.missing["time_to_recover_s"] == "the trigger never fired"
    assert m.verdict == "fault did not fire; 2000 requests, 0 failed"


def test_teardown_is_no_incident() -> None:
    """The harness stopping the replicas: balancer_down and failed windows after teardown_begin do not count."""
    ev = _timeline({}, fault_at_s=5.5, n_windows=20)
    ev.append(Event(LOAD + 20 * S + S // 4, "teardown_begin", data={"reason": "end"}))
    ev.append(Event(LOAD + 20 * S + S // 3, "balancer_down", src="framework", data=_server(1)))
    ev.append(_window(21, failures=100))
    m = compute_metrics(sorted(ev, key=lambda e: e.t_ns), control=control_run())
    assert m.failed_requests == 0 and m.detected is False
    # the killed replica never came back: out from the kill (5.5 s) to the load's end (20 s)
    assert m.capacity_lost_replica_s == pytest.approx(14.5)
    assert "no request failed" in m.missing["time_to_detect_s"]
    # Nothing failed: recovered at the first window start after the fault (6 s), 0.5 s after it.
    assert m.recovered is True and m.time_to_recover_s == pytest.approx(0.5)


def test_crash_loop_on_load() -> None:
    ev = fault_run(back_at_s=None)
    for inc in (1, 2, 3):
        ev.append(
            Event(
                LOAD + (6 + inc) * S,
                "rank_start",
                src="rank",
                data={"rank": 1, "world_size": 3, "incarnation": inc, "pid": 200 + inc},
            )
        )
    m = compute_metrics(sorted(ev, key=lambda e: e.t_ns), control=control_run())
    assert m.crash_loop is True and m.failure_class == "deterministic" and m.restart_count == 3


def test_events_from_json_lines() -> None:
    """The same answers from the timeline as written to events.jsonl."""
    from chaosbench.timeline import parse_lines

    m = compute_metrics(
        parse_lines([e.to_json() for e in fault_run()]),
        control=parse_lines([e.to_json() for e in control_run()]),
    )
    assert m.failed_requests == 71 and m.time_to_recover_s == pytest.approx(2.5)


def test_per_second_series() -> None:
    ps = per_second(fault_run())
    assert ps is not None
    assert ps.t_s[:3] == [0.0, 1.0, 2.0] and len(ps.t_s) == 20
    assert ps.ok[5] == 90 and ps.failed[5] == 10 and ps.p99_ms[5] == pytest.approx(P99_SLOW)
    assert (
        per_second([e for e in fault_run() if e.kind not in ("load_start", "load_window", "load_end")])
        is None
    )


def test_training_runs_have_no_serving_metrics() -> None:
    m = compute_metrics(
        [
            Event(T0, "run_start", data={"control": True}),
            Event(T0 + S, "run_end", data={"outcome": "completed"}),
        ]
    )
    assert not m.serving and m.requests is None and m.failed_requests is None


# ----------------------------------------------------------------------------------------------- SLOs, gate
def test_slos_on_serving_metrics() -> None:
    assert {"failed_requests", "error_budget_burn"} <= set(metric_names())
    m = compute_metrics(fault_run(), control=control_run())
    checks = evaluate(m, {"failed_requests": {"max": 50}, "error_budget_burn": {"max": 0.01}})
    assert [(c.metric, c.ok) for c in checks] == [("failed_requests", False), ("error_budget_burn", True)]
    assert checks[0].describe() == "failed_requests = 71 (want <= 50)"
    m2 = RunMetrics.from_dict(json.loads(json.dumps(m.to_dict())))
    assert m2.failed_requests == 71 and m2.serving


def test_fault_accepts_serving_slos() -> None:
    from chaosbench.specs import FaultSpec

    spec = FaultSpec.model_validate(
        {"injector": "kill", "slos": {"failed_requests": {"max": 100}, "error_budget_burn": {"max": 0.05}}}
    )
    assert set(spec.slos) == {"failed_requests", "error_budget_burn"}


def test_gate_junit_shows_serving_figures(tmp_path: Path) -> None:
    from xml.etree import ElementTree as ET

    from chaosbench.gate import EXIT_SLO, Gate

    m = compute_metrics(fault_run(), control=control_run())
    checks = evaluate(m, {"error_budget_burn": {"max": 0.0001}})
    m.slo_ok, m.slo_failures = False, [c.describe() for c in checks if not c.ok]
    gate = Gate("serving", [m])
    assert gate.exit_code() == EXIT_SLO
    gate.write_junit(tmp_path / "junit.xml")
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "junit.xml").iter("property")}
    assert props["failed_requests"] == "71" and props["time_to_recover_s"] == "2.5"
    assert "error_budget_burn" in props and "lost_steps" not in props


# ------------------------------------------------------------------------------------------------- report
def _write_run(suite_dir: Path, scenario: str, repeat: int, events: list[Event], control: bool) -> None:
    from chaosbench.rundir import RunDir

    run = RunDir.at(suite_dir, scenario, repeat)
    run.path.mkdir(parents=True)
    fw, fault = scenario.split("/")
    run.config.write_text(
        json.dumps(
            {
                "scenario": {
                    "suite": "serving",
                    "scenario": scenario,
                    "framework": fw,
                    "fault": None if control else fault,
                    "repeat": repeat,
                    "control": control,
                    "workload": {"name": "serve"},
                    "strategy": None,
                    "slos": {"failed_requests": {"max": 100}, "error_budget_burn": {"max": 0.01}},
                }
            }
        )
    )
    run.events.write_text("".join(e.to_json() + "\n" for e in events))


def test_report_has_the_serving_section(tmp_path: Path) -> None:
    """Two policies: health checks recover (two repeats), no health checks does not (a third of the requests fail
    to the end); the report's section compares them, plots each, and the per-scenario tables show serving
    metrics."""
    from chaosbench.analysis.results import collect, load_results
    from chaosbench.report.writer import write_report

    suite_dir = tmp_path / "serving"
    for fw in ("health", "nocheck"):
        _write_run(suite_dir, f"{fw}/control", 0, _timeline({}, control=True, scenario=f"{fw}/control"), True)
    for repeat in (0, 1):
        _write_run(suite_dir, "health/kill-replica", repeat, fault_run(), False)
    dead = {k: (33, False) for k in range(5, 20)}
    _write_run(suite_dir, "nocheck/kill-replica", 0, _timeline(dead, scenario="nocheck/kill-replica"), False)
    metrics = collect(suite_dir)
    assert {(m.scenario, m.outcome, m.slo_ok) for m in metrics} == {
        ("health/control", "completed", True),
        ("nocheck/control", "completed", True),
        ("health/kill-replica", "recovered", True),
        ("nocheck/kill-replica", "not_recovered", False),
    }
    # the per-second plots are drawn when a run ends (a post-run hook; these runs were written by hand): the
    # report reads no timeline and says how to draw them
    written = write_report(suite_dir, load_results(suite_dir))
    assert not [w for w in written if w.endswith("per_second.png")]
    md = (suite_dir / "report.md").read_text()
    assert md.count("no per-second plot (drawn when the run ends; `chaosbench report --plots missing`") == 2
    # asked to, it draws the absent ones into the run directories, the first repeat's, and shows them
    written = write_report(suite_dir, load_results(suite_dir), plots="missing")
    pngs = ["health__kill-replica/0/per_second.png", "nocheck__kill-replica/0/per_second.png"]
    assert sorted(w for w in written if w.endswith("per_second.png")) == pngs
    assert not (suite_dir / "health__kill-replica/1/per_second.png").exists()
    html = (suite_dir / "report.html").read_text()
    md = (suite_dir / "report.md").read_text()
    assert all(f"]({png})" in md for png in pngs), md
    assert "Serving: recovery policies under load" in html and "Fault: kill-replica" in html
    assert html.count('src="data:image/png;base64,') >= 2
    # from then on the report shows them as they are, drawing nothing
    written = write_report(suite_dir, load_results(suite_dir))
    assert not [w for w in written if w.endswith("per_second.png")]
    assert all(f"]({png})" in (suite_dir / "report.md").read_text() for png in pngs)
    assert "Framework comparison" not in md  # no training runs: no training analysis
    section = md.split("Serving: recovery policies under load", 1)[
        1
    ]  # (the first screen's scorecard has rows too)
    row = next(line for line in section.splitlines() if line.startswith("| health |") and "2/2" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and cells[3].startswith("0.500") and cells[4] == "2 failed request"
    assert cells[5].startswith("2.500") and cells[6].startswith("71")
    nocheck = next(line for line in section.splitlines() if line.startswith("| nocheck |") and "0/1" in line)
    assert "(n=1)" in nocheck
    assert "| failed_requests | 71 |" in md and "| error_budget_burn |" in md  # per-scenario metrics table


def test_run_timeline_marks_serving_events(tmp_path: Path) -> None:
    """A serving run's timeline.png: replicas ready on their lanes, the balancer's marks, the recovery line."""
    from chaosbench.report.plots import draw_run_timeline, run_markers

    m = compute_metrics(fault_run(), control=control_run())
    assert run_markers(m.to_dict()).recover_t_s == pytest.approx(7.5 + 2.5)
    (tmp_path / "events.jsonl").write_text("".join(e.to_json() + "\n" for e in fault_run()))
    path, why = draw_run_timeline(tmp_path, m)
    assert why is None and path is not None and path.stat().st_size > 0


def test_partition_hits_the_replicas_cut_off_from_the_balancer() -> None:
    """A partition's ``target`` is only the rank it resolved by default (rank 0 here); the replicas it hit are
    those on the nodes cut off from the balancer's node: replica 1 on node1."""
    ev = [e for e in fault_run(back_at_s=None) if e.kind != "fault_inject"]
    ev.append(
        Event(T0, "proc_start", data={"proc": "haproxy", "role": "balancer", "node": "node3", "pid": 9})
    )
    for r in range(3):
        ev.append(
            Event(
                T0 + S // 5,
                "rank_start",
                src="rank",
                data={"rank": r, "world_size": 3, "node": f"node{r}", "incarnation": 0, "pid": 100 + r},
            )
        )
    ev.append(
        Event(
            LOAD + int(5.5 * S),
            "fault_inject",
            src="injector",
            data={
                "fault": "cut",
                "injector": "partition",
                "target": [{"rank": 0, "node": "node0"}],
                "params": {"groups": [["node1"], ["node0", "node2", "node3"]], "duration_s": 4},
            },
        )
    )
    ev.append(
        Event(LOAD + int(9.5 * S), "fault_revert", src="injector", data={"fault": "cut", "undone": True})
    )
    m = compute_metrics(sorted(ev, key=lambda e: e.t_ns), control=control_run())
    # detected by the balancer's down of replica 1 at 6.5 s? no: the failed window [5, 6) ends first (0.5 s)
    assert m.time_to_detect_s == pytest.approx(0.5)
    # replica 1 out from the cut (5.5 s) until the balancer put it back (9.5 s); replica 0 was never out
    assert m.capacity_lost_replica_s == pytest.approx(4.0)
    ev2 = [e for e in ev if not (e.kind == "load_window" and e.get("failures"))]
    m = compute_metrics(sorted(ev2, key=lambda e: e.t_ns), control=control_run())
    assert m.detected_via == "balancer health check" and m.time_to_detect_s == pytest.approx(1.0)


def test_latency_during_lasts_the_fault() -> None:
    """A slow-down that fails nothing (windows 5-8 slow, reverted at 9.0 s): recovered at once by error rate, yet
    its latency counts as during until the revert."""
    ev = [e for e in _timeline({k: (0, True) for k in (5, 6, 7, 8)}, downs=[]) if e.kind != "fault_inject"]
    ev.append(
        Event(
            LOAD + int(5.0 * S),
            "fault_inject",
            src="injector",
            data={"fault": "slow", "injector": "net-delay", "target": [{"node": "node1"}]},
        )
    )
    ev.append(
        Event(LOAD + int(9.0 * S), "fault_revert", src="injector", data={"fault": "slow", "undone": True})
    )
    m = compute_metrics(sorted(ev, key=lambda e: e.t_ns), control=control_run())
    assert m.failed_requests == 0 and m.time_to_recover_s == pytest.approx(0.0)
    assert m.latency_p50_during_ms == pytest.approx(P50_SLOW) and m.latency_p50_after_ms == pytest.approx(
        P50_FAST
    )
    assert m.capacity_lost_replica_s == 0.0  # slowed, never out


def test_recovery_waits_out_the_request_timeout() -> None:
    """A hung replica left in rotation: its requests fail when the load's 3 s timeout ends them, in bursts 4 s
    apart (windows 8, 12, 16). Between two bursts lie 3 s clean spans, the SLO's recovery window; they are no
    recovery, since requests begun in them fail 3 s later."""
    bursts = {k: (5, False) for k in (8, 12, 16)}
    ev = _timeline(bursts)
    (start,) = [e for e in ev if e.kind == "load_start"]
    start.data["request_timeout_s"] = 3.0
    # and the pace collapsed: from the fault on, 25 requests a second where there were 100
    ev = [
        e
        if e.kind != "load_window" or e.t_ns < LOAD + 6 * S
        else _window((e.t_ns - LOAD) // S, requests=25, failures=int(e.data["failures"]))
        for e in ev
    ]
    m = compute_metrics(ev, control=control_run())
    assert m.recovered is False and m.time_to_recover_s is None
    assert "request timeout" in m.missing["time_to_recover_s"]
    # windows 0-4 ended before the fault at 5.5 s; window 5 (100) and 6-19 (25 each) are during it
    assert m.throughput_during_share == pytest.approx((100 + 14 * 25) / 15 / 100)
    # without the timeout on record (an older timeline), the gap between bursts still passes, as it did
    start.data.pop("request_timeout_s")
    assert compute_metrics(ev, control=control_run()).recovered is True
