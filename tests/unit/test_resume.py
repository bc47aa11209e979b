"""The harness's own guard rails and bookkeeping without real ranks: suite size limits, ``--resume``'s notion of
a finished run, a changed suite refused, the checkpoint keeping policy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.cli import main
from chaosbench.errors import ResultsError
from chaosbench.frameworks.base import JobResult
from chaosbench.post_run import checkpoint_retention
from chaosbench.rundir import RunDir
from chaosbench.runner import MAX_RUNS, RUN_OVERHEAD_S, Runner, RunRecord, suite_limits
from tests.conftest import ROOT, make_suite

SUITE = """
name: guard
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 20}
frameworks: {restart: {}, none: {}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 5}}
matrix: {frameworks: [restart, none], faults: [kill], repeats: %d}
"""


def test_limits_count_runs_without_building_them() -> None:
    n, bound_s, over = suite_limits(make_suite(SUITE % 3))
    assert n == 2 * (1 + 3) and bound_s == n * (60 + RUN_OVERHEAD_S) and over == []
    t = time.monotonic()
    n, bound_s, over = suite_limits(make_suite(SUITE % 100_000_000))
    assert time.monotonic() - t < 1.0
    assert n == 2 * (1 + 100_000_000) and len(over) == 2 and f"limit {MAX_RUNS}" in over[0]


SIZED = """
name: sized
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: %d, nodes: %d, steps: %d}
matrix: {frameworks: [restart]}
"""


def test_limits_cover_the_size_of_a_run_ranks_nodes_and_steps() -> None:
    assert suite_limits(make_suite(SIZED % (4096, 1024, 1_000_000)))[2] == []
    t = time.monotonic()
    over = suite_limits(make_suite(SIZED % (10**12, 1, 60)))[2]
    assert time.monotonic() - t < 1.0
    assert over == ["defaults.workload: 1000000000000 ranks a run (limit 4096)"]
    assert suite_limits(make_suite(SIZED % (2048, 2048, 60)))[2] == [
        "defaults.workload: 2048 nodes a run (limit 1024)"
    ]
    assert suite_limits(make_suite(SIZED % (2, 1, 10**7)))[2] == [
        "defaults.workload: 10000000 steps a run (limit 1000000)"
    ]
    own = make_suite(SIZED % (2, 1, 60) + "frameworks: {restart: {workload: {ranks: 8192}}}\n")
    assert suite_limits(own)[2] == ["framework 'restart' workload: 8192 ranks a run (limit 4096)"]


def test_a_world_of_a_trillion_ranks_is_refused_at_once(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "ranks.yaml"
    suite.write_text(SIZED % (10**12, 1, 60))
    assert (
        main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    )  # no plan per rank is built
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"chaosbench: error: {suite}: suite 'sized' is too large: defaults.workload: 1000000000000 ranks a run "
        "(limit 4096) (check matrix.repeats, defaults.deadline_s and the workloads' ranks, nodes and steps); pass "
        "--yes to run it anyway"
    )


def test_dry_run_warns_when_a_runs_own_numbers_cannot_finish_before_its_deadline(
    tmp_path: Path, capsys
) -> None:
    suite = tmp_path / "slow.yaml"
    suite.write_text(
        "name: slow\ndefaults:\n  deadline_s: 60\n  workload: {name: ddp-mlp, ranks: 2, steps: 30, "
        "step_sleep_s: 3, pg_timeout_s: 1.0e+18}\nmatrix: {frameworks: [none]}\n"
    )
    assert main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    want = [
        "30 steps x step_sleep_s 3 s = 90 s: a run cannot finish before its deadline of 60 s",
        "workload_pg_timeout_s (1e+18 s) is longer than the run's deadline (60 s): a wait on it ends only at the "
        "deadline",
    ]
    assert json.loads(captured.out)["timeout_problems"] == {"none": want}
    assert [f"  warning: none: {w}" for w in want] == [
        ln for ln in captured.err.splitlines() if "warning" in ln
    ]
    suite.write_text(
        suite.read_text().replace(
            "step_sleep_s: 3, pg_timeout_s: 1.0e+18", "step_sleep_s: 1, pg_timeout_s: 10"
        )
    )
    assert main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert json.loads(capsys.readouterr().out)["timeout_problems"] == {"none": []}


def test_a_typo_sized_suite_is_refused_in_a_dry_run_too(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "huge.yaml"
    suite.write_text(SUITE % 100_000_000)
    t = time.monotonic()
    assert main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert time.monotonic() - t < 5.0
    err = capsys.readouterr().err
    assert "200000002 runs" in err and "too large" in err and "--yes" in err
    assert not (tmp_path / "o").exists()


def test_dry_run_states_the_count_and_the_bound(tmp_path: Path, capsys) -> None:
    assert main(["run", str(ROOT / "suites" / "smoke.yaml"), "--dry-run", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["runs_total"] == len(doc["runs"]) == 15
    assert doc["wall_bound_s"] == 15 * (120 + RUN_OVERHEAD_S)
    assert "15 runs, at most 37m30s" in captured.err


def _finished_run(runner: Runner, index: int, status: str) -> RunDir:
    sc = runner.suite.scenarios()[index]
    rd = RunDir.of(runner.suite_dir, sc)
    rd.path.mkdir(parents=True)
    rd.metrics.write_text(json.dumps(RunMetrics(scenario=sc.id, outcome="recovered").to_dict()))
    rd.result.write_text(json.dumps({"status": status, "reason": "", "leftover_pids": []}))
    return rd


def test_resume_keeps_finished_runs_and_refuses_a_changed_suite(tmp_path: Path) -> None:
    runner = Runner(make_suite(SUITE % 2), tmp_path)
    runner.prepare()
    scs = runner.suite.scenarios()
    _finished_run(runner, 0, "completed")
    _finished_run(runner, 1, "interrupted")
    torn = RunDir.of(runner.suite_dir, scs[2])
    torn.path.mkdir(parents=True)
    torn.result.write_text('{"status": "compl')  # a harness killed mid-write (not possible with write_atomic)
    resumed = Runner(make_suite(SUITE % 2), tmp_path)
    resumed.prepare(resume=True)
    done = resumed._finished(scs[0])
    assert done is not None and done.result.status == "completed" and done.metrics is not None
    assert done.metrics.outcome == "recovered"
    assert resumed._finished(scs[1]) is None  # interrupted: run again
    assert resumed._finished(scs[2]) is None  # unreadable: run again
    assert resumed._finished(scs[3]) is None  # never started
    with pytest.raises(
        ResultsError, match=r"cannot resume: suite 'guard' has changed since .*\(in matrix\)"
    ) as err:
        Runner(make_suite(SUITE % 3), tmp_path).prepare(resume=True)
    assert err.value.problem.startswith(
        "cannot resume: suite 'guard' has changed since those runs (in matrix)"
    )


@pytest.mark.parametrize(
    ("policy", "outcome", "fidelity", "kept"),
    [
        ("failed", "recovered", "exact", False),
        ("failed", "recovered", "diverged", True),
        ("failed", "not_recovered", None, True),
        ("all", "recovered", "exact", True),
        ("none", "not_recovered", None, False),
    ],
)
def test_checkpoints_kept_by_policy_and_always_listed(
    tmp_path: Path, policy: str, outcome: str, fidelity: str | None, kept: bool
) -> None:
    runner = Runner(make_suite(SUITE % 1 + f"keep_checkpoints: {policy}\n"), tmp_path)
    rd = RunDir(tmp_path / "run")
    (rd.checkpoints / "step_00000010").mkdir(parents=True)
    (rd.checkpoints / "step_00000010" / "__0_0.distcp").write_bytes(b"x" * 100)
    rd.ckpt_backing.mkdir()
    (rd.ckpt_backing / "c.pt").write_bytes(b"y" * 7)
    m = RunMetrics(outcome=outcome, fidelity=fidelity)
    assert checkpoint_retention(rd, m, runner.suite) == {"checkpoints_kept": kept}
    listing = json.loads(rd.checkpoint_list.read_text())
    assert listing["kept"] is kept and listing["policy"] == policy
    assert listing["files"] == 2 and listing["bytes"] == 107
    assert {c["path"] for c in listing["checkpoints"]} == {
        "checkpoints/step_00000010/__0_0.distcp",
        "ckpt-backing/c.pt",
    }
    assert rd.checkpoints.exists() is kept and rd.ckpt_backing.exists() is kept


def test_a_finished_run_is_recorded_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``result.json`` is written after metrics.json and the post-run hooks (checkpoints.json, the plot): its
    presence means the rest is there. The hooks run in order, each given the run, its metrics and the suite,
    and what they return goes into ``result.json``."""
    import chaosbench.analysis.results as results

    order: list[str] = []
    metrics = RunMetrics(outcome="completed")

    def hook(name: str):  # noqa: ANN202 - a post-run hook that records its call
        def run(rd: RunDir, m: RunMetrics, suite: object) -> dict[str, object]:
            assert rd.read_result() is None and m is metrics and suite is runner.suite
            order.append(name)
            return {name: len(order)}

        return run

    runner = Runner(make_suite(SUITE % 1), tmp_path, post_run=[hook("retain"), hook("plot")])
    sc = runner.suite.scenarios()[0]
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    monkeypatch.setattr(results, "run_metrics", lambda run, control: order.append("metrics") or metrics)
    runner.finish(RunRecord(sc, rd.path, JobResult("completed")), elapsed_s=1.5)
    assert order == ["metrics", "retain", "plot"]
    res = rd.read_result()
    assert res is not None and res["status"] == "completed" and res["elapsed_s"] == 1.5
    assert (res["retain"], res["plot"]) == (2, 3)
    assert list(res)[-1] == "cleanup_failures"


def test_the_default_post_run_hooks_keep_checkpoints_then_draw(tmp_path: Path) -> None:
    from chaosbench.post_run import DEFAULT_HOOKS, per_second_plot, timeline_plot

    assert DEFAULT_HOOKS == (checkpoint_retention, timeline_plot, per_second_plot)
    runner = Runner(make_suite(SUITE % 1), tmp_path)
    assert runner.post_run == DEFAULT_HOOKS
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    assert timeline_plot(rd, RunMetrics(outcome="completed"), runner.suite)["timeline_plot"].startswith(
        "no timeline"
    )
    # the per-second plot is a serving run's only: a training run gets no field
    assert per_second_plot(rd, RunMetrics(outcome="completed"), runner.suite) == {}
    assert per_second_plot(rd, RunMetrics(outcome="completed", serving=True), runner.suite) == {
        "per_second_plot": "no timeline"
    }


# ------------------------------------------------------------------------------------------ --jobs slots
def test_local_runs_at_once_only_when_timings_may_interfere(tmp_path: Path) -> None:
    from chaosbench.errors import Unsupported

    runner = Runner(make_suite(SUITE % 1), tmp_path)
    with pytest.raises(Unsupported, match="shared CPUs.*--timings-may-interfere"):
        runner.slots(2)
    assert runner.slots(3, timings_may_interfere=True) == [{}, {}, {}]


def test_docker_slots_split_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from chaosbench.errors import Unsupported
    from chaosbench.runtimes.docker import DockerRuntime

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    assert DockerRuntime.concurrent_slots({}, 2, 2) == [{"cpuset": "0,1"}, {"cpuset": "2,3"}]
    with pytest.raises(Unsupported, match="6 concurrent runs need a CPU each"):
        DockerRuntime.concurrent_slots({}, 6, 1)
    with pytest.raises(Unsupported, match="pins cpuset"):
        DockerRuntime.concurrent_slots({"cpuset": "0"}, 2, 1)


def test_slurm_slots_give_each_run_nodes_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.errors import Unsupported
    from chaosbench.runtimes.slurm.commands import SlurmCommands
    from chaosbench.runtimes.slurm.runtime import SlurmRuntime

    states = {"n1": "IDLE", "n2": "MIXED", "n3": "IDLE", "n4": "DOWN", "n5": "IDLE"}
    monkeypatch.setattr(
        SlurmCommands, "nodes_info", lambda self: {n: {"State": s} for n, s in states.items()}
    )
    monkeypatch.setattr(SlurmCommands, "partition_nodes", lambda self: list(states))
    slots = SlurmRuntime.concurrent_slots({"exclude": ["n5"]}, 2, 1)
    assert slots == [{"exclude": ["n5", "n2"]}, {"exclude": ["n5", "n1", "n3"]}]  # n4 is down: in no group
    with pytest.raises(Unsupported, match="2 concurrent runs of 2 node\\(s\\) each need 4 usable nodes"):
        SlurmRuntime.concurrent_slots({"exclude": ["n5"]}, 2, 2)


def test_the_pytest_plugin_keeps_the_same_size_guard(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    suite = tmp_path / "ranks.yaml"
    suite.write_text(SIZED % (10**12, 1, 60))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--collect-only",
        "-q",
        "--chaos-suite",
        str(suite),
    ]
    t = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's chaosbench, whatever is installed
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t < 60 and out.returncode == 4  # pytest's usage error, at collection
    assert (
        f"ERROR: {suite}: suite 'sized' is too large: defaults.workload: 1000000000000 ranks a run (limit 4096); "
        "pass --chaos-yes to collect it anyway"
    ) in out.stderr
