"""Serving under fire on the local runtime: 3 replicas of the ``serve`` workload behind a real haproxy, real
locust load, replica 1 killed 3 s into the 11 s load, under four recovery policies (the ``balancer`` adapter):

- no-checks: no health checks: haproxy keeps sending a third of the requests to the dead replica until the end;
- health: health checks every 200 ms, fall 2: the replica is out within ~0.4 s, failures stop, capacity stays lost;
- supervised: health checks and a supervisor that restarts the dead replica: it comes back (a new incarnation,
  its model loaded again) and the balancer brings it back after rise 2;
- retries: supervised plus haproxy retries with redispatch: a refused connection is retried on another replica,
  so (almost) no request fails.

Every figure is checked against what happened: the kill's time, the balancer's DOWN line, the failed windows.
"""

from __future__ import annotations

import pytest

from chaosbench.analysis.metrics import RunMetrics
from tests.helpers import events_of, require, run_suite_text, serve_problem

pytestmark = pytest.mark.integration


require("serve", serve_problem())

SUITE = """
name: serving-local
seed: 5
control: false
defaults:
  deadline_s: 90
  workload:
    name: serve
    ranks: 3
    load: {users: 6, spawn_rate: 100, duration_s: 11, request_timeout_s: 5}
    slo: {availability: 0.999, window_days: 30, error_rate: 0.01, recovery_window_s: 2}
frameworks:
  no-checks: {adapter: balancer, health_checks: false}
  health: {adapter: balancer, check_interval_ms: 200, fall: 2, rise: 2}
  supervised: {adapter: balancer, check_interval_ms: 200, fall: 2, rise: 2, supervisor: true}
  retries: {adapter: balancer, check_interval_ms: 200, fall: 2, rise: 2, supervisor: true, retries: 2}
faults:
  kill-replica1: {injector: kill, target: {rank: 1}, trigger: {after_s: 3}}
matrix: {frameworks: [no-checks, health, supervised, retries], faults: [kill-replica1], repeats: 1}
"""


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunMetrics]:
    return run_suite_text(SUITE, tmp_path_factory.mktemp("serving"), "serving-local.yaml")


def _run(runs: dict[str, RunMetrics], framework: str) -> RunMetrics:
    return next(m for m in runs.values() if m.framework == framework)


def _kill_t(m: RunMetrics) -> int:
    return next(e.t_ns for e in events_of(m) if e.kind == "fault_inject")


def test_every_policy_serves_every_request_before_the_fault(serving: dict[str, RunMetrics]) -> None:
    """No control runs (CI time): the 3 s before the kill are each run's fault-free share, and its error budget
    is taken at that rate."""
    for fw in ("no-checks", "health", "supervised", "retries"):
        m = _run(serving, fw)
        windows = [e for e in events_of(m) if e.kind == "load_window" and e.t_ns + 0.1e9 <= _kill_t(m)]
        assert sum(int(e.get("requests", 0)) for e in windows) > 100, fw
        assert sum(int(e.get("failures", 0)) for e in windows) == 0, fw
        assert m.budget_request_rate_per_s and m.budget_request_rate_per_s > 30, (
            fw,
            m.budget_request_rate_per_s,
        )
        assert "before the fault" in m.notes.get("budget_request_rate_per_s", ""), m.notes


def test_no_health_checks_never_recovers(serving: dict[str, RunMetrics]) -> None:
    m = _run(serving, "no-checks")
    evs = events_of(m)
    assert not [e for e in evs if e.kind == "balancer_down"]
    assert m.outcome == "not_recovered" and m.time_to_recover_s is None
    # round robin over 3 replicas, one dead for the last ~8 s of 11: about a third of those requests fail
    assert m.failed_requests and m.requests
    assert 0.1 < m.failed_requests / m.requests < 0.4, (m.failed_requests, m.requests)
    # detected only by the first failed request, right after the kill
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 0.5
    # the dead replica serves nothing from the kill to the end (8 s of 11, one replica of 3: 0.24)
    assert m.capacity_lost_share is not None and 0.18 < m.capacity_lost_share < 0.3, m.capacity_lost_share


def test_health_checks_take_the_replica_out(serving: dict[str, RunMetrics]) -> None:
    m = _run(serving, "health")
    evs = events_of(m)
    down = [e for e in evs if e.kind == "balancer_down"]
    assert [e.get("rank") for e in down] == [1], down
    # fall 2 checks 200 ms apart, the first at most 200 ms after the kill
    assert (down[0].t_ns - _kill_t(m)) / 1e9 < 0.8
    assert m.outcome == "recovered" and m.time_to_recover_s is not None and m.time_to_recover_s < 3.0
    assert m.failed_requests is not None and 0 < m.failed_requests < 0.1 * (m.requests or 0)
    # the replica stays out: a third of the capacity from the kill to the end (8 s of 11: 0.24)
    assert m.capacity_lost_share is not None and 0.18 < m.capacity_lost_share < 0.3, m.capacity_lost_share


def test_supervisor_brings_the_replica_back(serving: dict[str, RunMetrics]) -> None:
    m = _run(serving, "supervised")
    evs = events_of(m)
    assert [e.get("rank") for e in evs if e.kind == "restart"] == [1]
    ready = [e for e in evs if e.kind == "replica_ready" and e.get("rank") == 1]
    assert [e.get("incarnation") for e in ready] == [0, 1]
    ups = [e for e in evs if e.kind == "balancer_up" and e.get("rank") == 1]
    assert ups and ups[0].t_ns > ready[1].t_ns
    assert m.outcome == "recovered"
    health = _run(serving, "health")
    assert m.capacity_lost_share is not None and health.capacity_lost_share is not None
    assert m.capacity_lost_share < health.capacity_lost_share


def test_retries_hide_the_failure(serving: dict[str, RunMetrics]) -> None:
    m = _run(serving, "retries")
    stats = next(e for e in events_of(m) if e.kind == "balancer_stats")
    assert (stats.get("redispatches") or 0) + (stats.get("retries") or 0) > 0, stats.data
    assert m.retried_requests and m.retried_requests > 0
    assert m.failed_requests is not None and m.failed_requests <= 2
    assert m.error_budget_burn is not None
    assert m.error_budget_burn < (_run(serving, "health").error_budget_burn or 0)
