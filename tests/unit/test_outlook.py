"""Timeout sanity: from the timeouts each framework puts in force, when it can detect each fault, which timeout
decides, and which configurations cannot work; computed before anything runs."""

from __future__ import annotations

from chaosbench.runner import Runner, describe_outlook
from tests.conftest import make_suite

SUITE = """
name: outlook
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 30, pg_timeout_s: %s}
frameworks:
  none: {}
  restart: {heartbeat_timeout_s: %s}
  torchrun: {}
  nvrx: {}
  torchft: {quorum_timeout_s: 2, workload: {name: ft-mlp, steps: 30}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 5}}
  hang: {injector: hang, target: 1, trigger: {at_step: 5}, params: {duration_s: %s}}
matrix: {frameworks: [none, restart, torchrun, nvrx, torchft], faults: [kill, hang]}
"""


def _outlook(pg: str = "10", hb: str = "5", duration: str = "null") -> tuple[dict, dict]:
    recs, problems = Runner(make_suite(SUITE % (pg, hb, duration)), "/tmp/cb-outlook").outlook()
    return {(r["framework"], r["fault"]): r for r in recs}, problems


def test_each_framework_names_the_timeout_that_decides() -> None:
    recs, problems = _outlook()
    assert recs[("restart", "kill")]["expected_s"] == 0.05
    assert recs[("restart", "hang")]["decided_by"] == "heartbeat_timeout_s=5 + monitor_interval_s=0.05"
    hang = recs[("torchrun", "hang")]
    assert hang["expected_s"] == 10.1 and hang["resume_floor_s"] == 40.1  # + torchrun's 30 s SIGTERM grace
    assert describe_outlook(hang) == (
        "torchrun x hang: detect ~ 10.1 s (workload_pg_timeout_s=10 + "
        "monitor_interval_s=0.1), resume >= 40.1 s"
    )
    assert recs[("none", "hang")]["expected_s"] is None
    assert describe_outlook(recs[("none", "kill")]).startswith("none x kill: cannot detect it")
    assert (
        recs[("torchft", "hang")]["decided_by"]
        == "lighthouse_heartbeat_timeout_s=5 + lighthouse_quorum_tick_s=0.1"
    )
    # torchrun cannot resume from a hang before the 60 s deadline? it can (40.1 s): no problem
    assert hang["problems"] == []
    # nvrx without a step section: the process-group timeout always wins
    assert recs[("nvrx", "hang")]["decided_by"].startswith("workload_pg_timeout_s=10")
    assert any("rank monitor never decides" in p for p in problems["nvrx"])
    # TorchFT: a quorum timeout shorter than the Lighthouse heartbeat
    assert any(
        p.startswith("quorum_timeout_s (2 s) < lighthouse_heartbeat_timeout_s (5 s)")
        for p in problems["torchft"]
    )


def test_configurations_that_cannot_work_are_flagged() -> None:
    recs, problems = _outlook(pg="1800", hb="3000")
    # restart's heartbeat longer than the process-group timeout: the heartbeat never decides
    assert any(
        "heartbeat_timeout_s (3000 s) >= workload_pg_timeout_s (1800 s)" in p for p in problems["restart"]
    )
    assert recs[("restart", "hang")]["expected_s"] == 1800.05
    torchrun = recs[("torchrun", "hang")]["problems"]
    assert torchrun == [
        "torchrun cannot detect hang before the run's deadline (60 s): expected 1800.1 s after the "
        "fault (workload_pg_timeout_s=1800 + monitor_interval_s=0.1)"
    ]


def test_a_hang_shorter_than_detection_and_grace() -> None:
    recs, _ = _outlook(duration="3")
    assert any(
        "ends after 3 s, before torchrun can detect it" in p for p in recs[("torchrun", "hang")]["problems"]
    )
    recs, _ = _outlook(duration="20")
    assert (
        recs[("torchrun", "hang")]["resume_floor_s"] == 20
    )  # the stopped rank acts on SIGTERM once continued


LOST = """
name: lost-node
defaults:
  deadline_s: 150
  workload: {name: ddp-mlp, ranks: 2, nodes: 2, steps: 30}
frameworks:
  restart: {}
  torchrun: {}
  elastic: {adapter: torchrun-elastic, min_nodes: 1}
  elastic-fixed: {adapter: torchrun-elastic, min_nodes: 2}
  elastic-spare: {adapter: torchrun-elastic, min_nodes: 2, spares: 1}
faults:
  lose-node1: {injector: node-kill, target: {node: node1}, trigger: {at_step: 5}}
  lose-node0: {injector: node-kill, target: {node: node0}, trigger: {at_step: 5}}
  lose-any: {injector: node-kill, target: {node: random}, trigger: {at_step: 5}}
matrix: {frameworks: [restart, torchrun, elastic, elastic-fixed, elastic-spare], faults: [lose-node1, lose-node0, lose-any]}
"""


def test_a_fixed_size_rendezvous_waits_its_join_timeout_for_a_lost_node() -> None:
    """Measured on the compare suite (2026-12-06): torchrun and nvrx each lost node1 and waited at the rendezvous
    until the 150 s deadline; the elastic form with min_nodes 1 and restart recovered. node0 hosts the rendezvous
    store: its loss ends the rendezvous for every node at once, no wait."""
    recs, _ = Runner(make_suite(LOST), "/tmp/cb-outlook").outlook()
    by = {(r["framework"], r["fault"]): r for r in recs}
    lost = by[("torchrun", "lose-node1")]
    assert lost["resume_floor_s"] == 600.1  # detection (monitor_interval_s=0.1) + torch's join timeout
    assert lost["problems"] == [
        "torchrun cannot resume from lose-node1 before the run's deadline (150 s): not before 600.1 s after the "
        "fault (the next rendezvous waits rdzv_join_timeout_s=600 for the lost node)"
    ]
    assert by[("elastic-fixed", "lose-node1")]["resume_floor_s"] == 600.1  # its join_timeout_s (default 600)
    for fw, fault in [
        ("torchrun", "lose-node0"),
        ("torchrun", "lose-any"),
        ("elastic", "lose-node1"),
        ("elastic-spare", "lose-node1"),
        ("restart", "lose-node1"),
    ]:
        assert by[(fw, fault)]["resume_floor_s"] is None and by[(fw, fault)]["problems"] == [], (fw, fault)
