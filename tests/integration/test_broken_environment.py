"""A run that fails for a reason outside the system under test says why (issue 27, item 5): a user's script that
cannot import a module, under the restart framework, is named in the verdict with its first error line. A tool a
fault needs missing from the machine (issue 31, item 5) costs that fault's run alone, with a one-line reason
naming the tool, and the suite finishes its other runs; so does a port taken by another program (the run says so
with the rank's own error line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chaosbench.rundir import RunDir
from chaosbench.runner import Runner
from chaosbench.runtimes.local import LocalRuntime
from tests.conftest import make_suite
from tests.helpers import local_nodes_runtime, path_without, story

pytestmark = pytest.mark.integration


def test_a_rank_that_fails_at_import_is_named_with_its_error(run_suite, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import no_such_module_of_chaosbench  # a damaged environment\n")
    res = run_suite(f"""
    name: broken-env
    seed: 1
    defaults:
      deadline_s: 60
      workload:
        name: command
        ranks: 1
        steps: 10
        command: [{sys.executable}, {script}]
        patterns:
          step: 'iter (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
    frameworks:
      restart: {{heartbeat_timeout_s: 5, max_restarts: 0}}
    faults:
      kill: {{injector: kill, target: {{rank: 0}}, trigger: {{at_step: 5}}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 1}}
    """)
    ctl, m = res["restart/control#0"], res["restart/kill#0"]
    why = (
        "'rank0.i0' exited 1 before the job's first step: ModuleNotFoundError: No module named "
        "'no_such_module_of_chaosbench'"
    )
    assert ctl.outcome == "failed" and ctl.startup_failure == why, ctl.verdict
    assert ctl.verdict is not None and ctl.verdict.endswith(f"; {why}")
    assert m.outcome == "fault_not_fired" and m.startup_failure == why
    assert m.verdict == f"fault did not fire; {why}"


MISSING_TC = """
name: missing-tool
seed: 1
defaults:
  runtime: test-local-nodes
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 8}
frameworks: {restart: {heartbeat_timeout_s: 5}}
faults:
  delay: {injector: net-delay, target: {rank: 1}, trigger: {at_step: 3}, params: {delay_ms: 50}}
  kill: {injector: kill, target: {rank: 1}, trigger: {at_step: 3}}
matrix: {frameworks: [restart], faults: [delay, kill]}
"""


def test_a_network_fault_without_tc_fails_its_run_alone_naming_the_tool_and_the_suite_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_nodes_runtime()
    path_without("tc", tmp_path, monkeypatch)
    records = Runner(make_suite(MISSING_TC), tmp_path / "out").run()
    why = "network faults need tc on the host (apt-get install iproute2 iptables util-linux)"
    assert [(r.scenario.id, r.result.status) for r in records] == [
        ("restart/control", "completed"),
        ("restart/delay", "error"),
        ("restart/kill", "completed"),
    ]
    delay, kill = records[1], records[2]
    assert delay.result.reason == why and "\n" not in why
    assert json.loads(RunDir(delay.run_dir).result.read_text())["reason"] == why
    assert delay.metrics is not None and delay.metrics.outcome == "error"
    # the run after it ran for real: its ranks started, the fault fired and the job recovered
    assert kill.metrics is not None and kill.metrics.outcome == "recovered", kill.metrics.verdict
    assert records[0].metrics is not None and records[0].metrics.outcome == "completed"


PORT_TAKEN = """
name: port-taken
seed: 1
control: false
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 1, steps: 8}
frameworks: {restart: {heartbeat_timeout_s: 5, max_restarts: 0}}
faults:
  first: {injector: kill, target: {rank: 0}, trigger: {at_step: 3}}
  second: {injector: kill, target: {rank: 0}, trigger: {at_step: 3}}
matrix: {frameworks: [restart], faults: [first, second]}
"""


def test_a_port_taken_by_another_program_fails_each_run_naming_it_and_the_suite_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendezvous port handed to the ranks is taken by another program (here: a listener of the test's, as if
    between the harness's choice and the rank's bind): rank 0's store cannot listen, the rank dies before the
    job's first step and each run says so with the rank's own error line; the suite finishes both runs."""
    import socket

    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    monkeypatch.setattr(LocalRuntime, "free_port", lambda self: port)
    try:
        records = Runner(make_suite(PORT_TAKEN), tmp_path / "out").run()
    finally:
        held.close()
    assert [r.scenario.id for r in records] == ["restart/first", "restart/second"]
    for r in records:
        m = r.metrics
        assert m is not None and m.outcome == "fault_not_fired", story(m) if m else r.result
        # the first error line rank 0 printed: torch's own, naming the port and the errno
        assert m.startup_failure == (
            "'rank0.i0' exited 1 before the job's first step: torch.distributed.DistNetworkError: The server socket "
            f"has failed to listen on any local network address. port: {port}, useIpv6: false, code: -98, name: "
            "EADDRINUSE, message: address already in use"
        ), m.startup_failure
        assert m.verdict == f"fault did not fire; {m.startup_failure}"
        assert r.leftovers == []
