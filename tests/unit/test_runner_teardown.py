"""The runner's teardown: every cleanup of a run runs, last-first, even when one before it raises; a cleanup that
fails is that run's error (its result and its ``run_end`` name the cleanup and say why in one line) and the suite
goes on to its next run, unless the runtime then still lists (or cannot list) processes or objects of the run:
then the suite stops after it, with one line naming the run and what may be left, its finished runs kept. No
rank starts here: the test runtimes refuse to provision, or, where processes must seem alive, say so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.results import RESULTS_CSV
from chaosbench.cli import main
from chaosbench.errors import ChaosbenchError
from chaosbench.gate import EXIT_HARNESS
from chaosbench.injectors.kill import KillInjector
from chaosbench.registry import RUNTIMES
from chaosbench.rundir import RunDir
from chaosbench.runner import Runner
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.timeline import read_events
from tests.conftest import make_suite

#: The order the cleanups ran in, across the test runtimes and the patched injector.
CALLS: list[str] = []
#: A failed cleanup as (step, error): the fields of a :class:`chaosbench.runner.CleanupFailure`.
ENGINE_GONE = ("runtime cleanup", "RuntimeError: the engine went away")


class _BrokenCleanup(LocalRuntime):
    """Refuses its nodes (nothing starts); its cleanup fails once it has done its part."""

    name = "test-broken-cleanup"

    def provision(self, nodes: int | None = None) -> None:
        raise ChaosbenchError("no nodes today")

    def cleanup(self, grace_s: float = 5.0) -> None:
        super().cleanup(grace_s)
        CALLS.append("runtime")
        raise RuntimeError("the engine went away")


class _LeftRunning(_BrokenCleanup):
    """As :class:`_BrokenCleanup`, and after its failed cleanup a process of the run seems alive."""

    name = "test-left-running"

    def leftovers(self) -> list[int]:
        return [4242]


class _CannotList(_BrokenCleanup):
    """As :class:`_BrokenCleanup`, and the engine cannot list what is left either."""

    name = "test-cannot-list"

    def leftover_objects(self) -> list[str]:
        raise RuntimeError("the engine went away")


class _FineCleanup(_BrokenCleanup):
    """Refuses its nodes; its cleanup works."""

    name = "test-fine-cleanup"

    def cleanup(self, grace_s: float = 5.0) -> None:
        LocalRuntime.cleanup(self, grace_s)
        CALLS.append("runtime")


SUITE = """
name: teardown
control: false
defaults:
  runtime: {runtime}
  deadline_s: 30
  workload: {{name: ddp-mlp, ranks: 2, steps: 5}}
frameworks: {{restart: {{}}}}
faults:
  kill: {{injector: kill, target: 1, trigger: {{at_step: 2}}}}
  kill2: {{injector: kill, target: 0, trigger: {{at_step: 3}}}}
matrix: {{frameworks: [restart], faults: [{faults}]}}
"""


@pytest.fixture(autouse=True)
def _plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in (_BrokenCleanup, _LeftRunning, _CannotList, _FineCleanup):
        if cls.name not in RUNTIMES.names():
            RUNTIMES.register(cls.name, cls)
    CALLS.clear()
    monkeypatch.setattr(KillInjector, "cleanup", lambda self: CALLS.append(f"injector {self.fault_name}"))


def _suite(runtime: str, faults: str = "kill, kill2") -> str:
    return SUITE.format(runtime=runtime, faults=faults)


def _failures(failures: Any) -> list[tuple[str, str]]:
    return [(f.step, f.error) for f in failures]


def _run_end(run_dir: Path) -> dict[str, object]:
    events = read_events(RunDir(run_dir).events)
    assert events[-1].kind == "run_end"  # nothing after it: the timeline was closed
    return {"outcome": events[-1].get("outcome"), "reason": events[-1].get("reason")}


def test_a_failing_runtime_cleanup_is_the_runs_error_and_every_other_cleanup_still_runs(
    tmp_path: Path,
) -> None:
    suite = make_suite(_suite("test-broken-cleanup", "[kill, kill2]"))
    (sc,) = suite.scenarios()
    runner = Runner(suite, tmp_path)
    rec = runner.run_one(sc, follow=False)  # does not raise
    # last-first: the runtime (registered last, before the nodes) first, then the faults' cleanups in reverse
    assert CALLS == ["runtime", "injector kill2", "injector kill"]
    assert _failures(rec.cleanup_failures) == [ENGINE_GONE]
    assert (rec.result.status, rec.result.reason) == (
        "error",
        "no nodes today; cleanup failed: runtime cleanup: RuntimeError: the engine went away",
    )
    assert _run_end(rec.run_dir) == {"outcome": "error", "reason": rec.result.reason}
    assert runner.halted is None  # nothing of the run is left: the suite may go on


def test_a_failing_injector_cleanup_is_the_runs_error_and_the_runtime_and_the_other_fault_still_clean_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cleanup(self: KillInjector) -> None:
        CALLS.append(f"injector {self.fault_name}")
        if self.fault_name == "kill2":
            raise OSError("umount: target is busy")

    monkeypatch.setattr(KillInjector, "cleanup", cleanup)
    suite = make_suite(_suite("test-fine-cleanup", "[kill, kill2]"))
    (sc,) = suite.scenarios()
    rec = Runner(suite, tmp_path).run_one(sc, follow=False)
    assert CALLS == ["runtime", "injector kill2", "injector kill"]
    assert _failures(rec.cleanup_failures) == [("fault 'kill2' cleanup", "OSError: umount: target is busy")]
    assert rec.result.status == "error"
    assert rec.result.reason.endswith(
        "cleanup failed: fault 'kill2' cleanup: OSError: umount: target is busy"
    )
    events = read_events(RunDir(rec.run_dir).events)
    (revert,) = [e for e in events if e.kind == "fault_revert"]
    assert (revert.get("fault"), revert.get("error")) == ("kill2", "OSError: umount: target is busy")
    assert _run_end(rec.run_dir)["outcome"] == "error"


def test_the_suite_goes_on_after_a_failed_cleanup_and_keeps_every_result(tmp_path: Path) -> None:
    runner = Runner(make_suite(_suite("test-broken-cleanup")), tmp_path)
    records = runner.run()  # the old teardown raised the runtime's error here, ending the suite
    assert [(r.scenario.id, _failures(r.cleanup_failures)) for r in records] == [
        ("restart/kill", [ENGINE_GONE]),
        ("restart/kill2", [ENGINE_GONE]),
    ]
    assert all(
        r.result.status == "error" and "runtime cleanup: RuntimeError" in r.result.reason for r in records
    )
    for r in records:
        result = json.loads(RunDir(r.run_dir).result.read_text())
        assert result["cleanup_failures"] == [
            {"step": "runtime cleanup", "error": "RuntimeError: the engine went away"}
        ]
    assert (runner.suite_dir / RESULTS_CSV).exists()
    assert runner.halted is None


@pytest.mark.parametrize(
    ("runtime", "left"),
    [
        ("test-left-running", ["pid 4242"]),
        ("test-cannot-list", ["whatever the runtime could not list (RuntimeError: the engine went away)"]),
    ],
)
def test_a_failed_cleanup_that_may_have_left_the_run_running_stops_the_suite_and_keeps_its_results(
    runtime: str, left: list[str], tmp_path: Path
) -> None:
    runner = Runner(make_suite(_suite(runtime)), tmp_path)
    records = runner.run()
    assert [r.scenario.id for r in records] == ["restart/kill"]  # kill2 would have collided with what is left
    assert runner.halted is not None
    assert (runner.halted.label, runner.halted.run_dir, runner.halted.left) == (
        "restart/kill #0",
        records[0].run_dir,
        left,
    )
    assert ENGINE_GONE in _failures(runner.halted.failures)
    assert RunDir(records[0].run_dir).result.exists() and (runner.suite_dir / RESULTS_CSV).exists()
    assert not RunDir.of(runner.suite_dir, make_suite(_suite(runtime)).scenarios()[1]).events.exists()


def test_the_cli_names_the_run_and_what_may_be_left_in_one_line_and_still_writes_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite_file = tmp_path / "teardown.yaml"
    suite_file.write_text(_suite("test-left-running"))
    assert main(["run", str(suite_file), "--out", str(tmp_path / "out")]) == EXIT_HARNESS
    err = capsys.readouterr().err.splitlines()
    (line,) = [x for x in err if "suite stopped after" in x]
    assert "run restart/kill #0" in line and "runtime cleanup: RuntimeError: the engine went away" in line
    assert "may have left pid 4242 running" in line
    assert (tmp_path / "out" / "teardown" / "manifest.json").exists()


def test_the_pytest_plugin_runs_nothing_after_a_halt_and_says_why(tmp_path: Path) -> None:
    from chaosbench.pytest_plugin import ChaosFailure, _SuiteState

    suite_file = tmp_path / "teardown.yaml"
    suite_file.write_text(_suite("test-left-running"))
    state = _SuiteState(str(suite_file), str(tmp_path / "out"))
    first, second = state.suite.scenarios()
    rec, _ = state.run(first)
    assert rec.result.status == "error" and state.runner.halted is not None
    # timed as chaosbench run times a run (result.json's elapsed_s was null under the plugin)
    elapsed = json.loads(RunDir.of(state.runner.suite_dir, first).result.read_text())["elapsed_s"]
    assert isinstance(elapsed, float) and elapsed > 0
    with pytest.raises(ChaosFailure, match="^not run: suite stopped after run restart/kill #0: "):
        state.run(second)
    assert not RunDir.of(state.runner.suite_dir, second).events.exists()
