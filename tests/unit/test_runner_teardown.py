"""The runner's teardown runs every step even when one raises: a runtime whose cleanup fails still has its run's
injectors cleaned up (their mounts, rules and cgroups), its ``run_end`` written and its timeline closed, and the
failure is raised once all of that is done. No process is started here: the runtime refuses to provision."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosbench.errors import ChaosbenchError
from chaosbench.injectors.kill import KillInjector
from chaosbench.registry import RUNTIMES
from chaosbench.runner import Runner
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.timeline import read_events
from tests.conftest import make_suite


class _BrokenCleanup(LocalRuntime):
    name = "test-broken-cleanup"

    def provision(self, nodes: int) -> None:
        raise ChaosbenchError("no nodes today")

    def cleanup(self, grace_s: float = 5.0) -> None:
        super().cleanup(grace_s)
        raise RuntimeError("the engine went away")


SUITE = """
name: teardown
defaults:
  runtime: test-broken-cleanup
  deadline_s: 30
  workload: {name: ddp-mlp, ranks: 2, steps: 5}
frameworks: {restart: {}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 2}}
matrix: {frameworks: [restart], faults: [kill], repeats: 1}
"""


def test_a_failing_runtime_cleanup_skips_no_other_teardown_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if _BrokenCleanup.name not in RUNTIMES.names():
        RUNTIMES.register(_BrokenCleanup.name, _BrokenCleanup)
    cleaned: list[str] = []
    monkeypatch.setattr(KillInjector, "cleanup", lambda self: cleaned.append(self.fault_name))
    suite = make_suite(SUITE)
    (sc,) = [s for s in suite.scenarios() if not s.control]
    runner = Runner(suite, tmp_path)
    with pytest.raises(RuntimeError, match="the engine went away"):
        runner.run_one(sc, follow=False)
    assert cleaned == ["kill"]  # the injector's cleanup ran after the runtime's failed
    (run_dir,) = [p.parent for p in tmp_path.rglob("events.jsonl")]
    events = read_events(run_dir / "events.jsonl")
    (end,) = [e for e in events if e.kind == "run_end"]
    assert end.get("outcome") == "error" and end.get("reason") == "no nodes today"
    assert events[-1].kind == "run_end"  # nothing after it: the timeline was closed
