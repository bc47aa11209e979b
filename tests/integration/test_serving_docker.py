"""Serving under fire on the docker runtime: 2 replicas, each a container node, behind haproxy on a node of its own
(with the locust load beside it, over that node's loopback), on the run's internal network:

- partition: node1 cut off from the balancer's node for 4 s: the health checks time out, haproxy takes replica 1
  out, the other one serves; when the cut heals, rise 2 checks bring it back;
- net-delay: 50 ms on node1's outgoing packets for 4 s: nothing fails, the requests replica 1 serves get slower
  (100 ms fails the checks: SYN-ACK and response each wait, over the checks' 200 ms timeout, and haproxy takes
  replica 1 out: seen here).

The figures are checked against what happened (the cut's window, the balancer's lines, the windows' latency).
"""

from __future__ import annotations

import pytest
from docker_support import events_of, kinds, require_docker

from chaosbench.analysis.metrics import RunMetrics
from tests.helpers import require, run_suite_text, serve_problem

require_docker()
require("serve", serve_problem())

pytestmark = pytest.mark.integration

SUITE = """
name: serving-docker
seed: 5
control: false
defaults:
  runtime: docker
  runtime_options: {cpus_per_node: 1.0, memory_per_node: 2g}
  deadline_s: 90
  workload:
    name: serve
    ranks: 2
    nodes: 2
    load: {users: 4, spawn_rate: 100, duration_s: 12, request_timeout_s: 3}
    slo: {availability: 0.999, window_days: 30, error_rate: 0.01, recovery_window_s: 2}
frameworks:
  health: {adapter: balancer, check_interval_ms: 200, fall: 2, rise: 2, timeout_server_ms: 2000}
faults:
  partition: {injector: partition, trigger: {after_s: 3}, params: {groups: [[node1], [node0, node2]], duration_s: 4}}
  net-delay: {injector: net-delay, target: {node: node1}, trigger: {after_s: 3},
              params: {delay_ms: 50, jitter_ms: 0, duration_s: 4}}
matrix: {frameworks: [health], faults: [partition, net-delay], repeats: 1}
"""


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunMetrics]:
    return run_suite_text(SUITE, tmp_path_factory.mktemp("serving-docker"), "serving-docker.yaml")


def test_partition_takes_the_cut_replica_out(serving: dict[str, RunMetrics]) -> None:
    m = serving["health/partition"]
    evs = events_of(m)
    cut = kinds(evs, "fault_inject")[0]
    healed = kinds(evs, "fault_revert")[0]
    balancer = kinds(evs, "proc_start", role="balancer")[0]
    assert balancer.get("node") == "node2"  # a node of its own, beside the replicas' node0 and node1
    down = kinds(evs, "balancer_down")
    up = kinds(evs, "balancer_up")
    assert [e.get("rank") for e in down] == [1] and [e.get("rank") for e in up] == [1]
    # fall 2 checks 200 ms apart, each timing out after the interval: out within ~1 s of the cut
    assert 0 < (down[0].t_ns - cut.t_ns) / 1e9 < 1.5
    # back after the cut healed: rise 2 checks
    assert 0 < (up[0].t_ns - healed.t_ns) / 1e9 < 1.5
    assert m.outcome == "recovered"
    assert m.time_to_detect_s is not None and m.time_to_detect_s < 1.5
    # only the requests in flight to node1 when it was cut fail
    assert m.failed_requests is not None and m.failed_requests < 0.05 * (m.requests or 0)
    # replica 1 of 2 out for about the cut's 4 s (to the balancer's up) of a 12 s load
    assert m.capacity_lost_replica_s is not None and 3.5 < m.capacity_lost_replica_s < 6.0, (
        m.capacity_lost_replica_s
    )
    stats = kinds(evs, "balancer_stats")[0]
    assert stats.get("servers", {}).get("r1", {}).get("went_down") == 1, stats.data


def test_net_delay_slows_without_failing(serving: dict[str, RunMetrics]) -> None:
    m = serving["health/net-delay"]
    evs = events_of(m)
    assert not kinds(
        evs, "balancer_down"
    )  # a check waits ~100 ms (SYN-ACK, response), under its 200 ms timeout
    (counters,) = [e for e in kinds(evs, "log") if "netdelay counters" in str(e.get("line"))]
    assert '"packets": 0' not in str(counters.get("line"))  # the delayer held node1's packets
    assert m.failed_requests == 0
    assert m.latency_p99_before_ms is not None and m.latency_p99_during_ms is not None
    # half the requests go to node1 and wait 50 ms more (its response held once)
    assert m.latency_p99_during_ms > m.latency_p99_before_ms + 40, (
        m.latency_p99_before_ms,
        m.latency_p99_during_ms,
    )
    assert m.capacity_lost_replica_s == 0.0
