"""A run that fails before it is planned (its fault's engine missing: FUSE for stall-fs) is that run's result,
recorded with its reason; the suite goes on to its next run. No process is started: every run fails in its
fault's prepare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaosbench.errors import MissingEngine
from chaosbench.injectors.kill import KillInjector
from chaosbench.rundir import RunDir, SuiteDir
from chaosbench.runner import Runner
from tests.conftest import make_suite

SUITE = """
name: nofuse
control: false
defaults:
  deadline_s: 30
  workload: {name: ddp-mlp, ranks: 2, steps: 5}
frameworks: {restart: {}}
faults:
  first: {injector: kill, target: 1, trigger: {at_step: 2}}
  second: {injector: kill, target: 0, trigger: {at_step: 3}}
matrix: {frameworks: [restart], faults: [first, second], repeats: 1}
"""
REASON = "stall-fs needs FUSE: fusermount3 is not installed (apt-get install fuse3)"


def test_a_run_that_cannot_start_is_its_result_and_the_suite_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_engine(self: KillInjector, setup: object) -> None:
        raise MissingEngine(REASON)

    monkeypatch.setattr(KillInjector, "prepare", no_engine)
    runner = Runner(make_suite(SUITE), tmp_path)
    records = runner.run()
    assert [(r.scenario.id, r.result.status, r.result.reason) for r in records] == [
        ("restart/first", "error", REASON),
        ("restart/second", "error", REASON),
    ]
    for r in records:
        rd = RunDir(r.run_dir)
        assert json.loads(rd.result.read_text())["reason"] == REASON
        assert rd.read_config()["plan"] is None and rd.read_config()["scenario"]["scenario"] == r.scenario.id
        assert r.metrics is not None and r.metrics.outcome == "error"
    assert len(SuiteDir(runner.suite_dir).runs()) == 2
