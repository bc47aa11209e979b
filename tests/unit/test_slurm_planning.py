"""Planning on the slurm runtime is pure: ``--dry-run`` runs nothing on any cluster (no Slurm needed), ports are
chosen without asking anyone, and what only the cluster knows is a placeholder until the run starts."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaosbench.cli import main
from chaosbench.errors import ChaosbenchError, EngineCommandFailed
from chaosbench.runtimes.base import ProcessSpec, RunInfo
from chaosbench.runtimes.slurm import SlurmRuntime
from chaosbench.runtimes.slurm.runtime import PORT_RANGE, UNRESOLVED_MASTER_ADDR
from chaosbench.timeline import TimelineWriter

SUITE = """
name: slurm-plan
seed: 3
control: true
defaults:
  runtime: slurm
  runtime_options: {partition: batch, nodes: {node0: c1}}
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, nodes: 2, steps: 20, checkpoint_every: 5, pg_timeout_s: 5}
frameworks:
  none: {}
  restart: {}
  torchrun: {}
  torchrun-elastic: {}
  nvrx: {}
  torchft: {workload: {name: ft-mlp}}
  slurm-requeue: {max_restarts: 2}
faults:
  kill: {injector: kill, target: {rank: 1}, trigger: {at_step: 8}}
  down: {injector: slurm-node-down, target: {node: node1}, trigger: {at_step: 8}}
matrix:
  frameworks: [none, restart, torchrun, torchrun-elastic, nvrx, torchft, slurm-requeue]
  faults: [kill, down]
  repeats: 1
"""


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any process started from here on fails the test (subprocess.run goes through Popen too)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        argv = args[0] if args else kwargs.get("args")
        raise AssertionError(f"planning ran a process: {argv}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)


def _dry_run(suite: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["run", str(suite), "--dry-run", "--out", str(out)]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_dry_run_of_a_slurm_suite_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_subprocess: None
) -> None:
    suite = tmp_path / "slurm-plan.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    out = tmp_path / "out"
    doc = _dry_run(suite, out, capsys)
    runs = {r["scenario"]: r for r in doc["runs"]}
    assert len(runs) == 7 * 3  # a control and two faults per framework
    assert not out.exists() or not list(out.iterdir())  # a dry run writes nothing

    # per-process frameworks: the master's address is a placeholder until the run starts, ports are planned
    none = runs["none/kill"]["plan"]["processes"]
    assert {p["env"]["MASTER_ADDR"] for p in none} == {UNRESOLVED_MASTER_ADDR}
    port = int(none[0]["env"]["MASTER_PORT"])
    assert PORT_RANGE[0] <= port < PORT_RANGE[1]
    torchrun = runs["torchrun/kill"]["plan"]["processes"][0]["argv"]
    assert f"{UNRESOLVED_MASTER_ADDR}:" in torchrun[torchrun.index("--rdzv-endpoint") + 1]
    assert runs["torchft/kill"]["plan"]["processes"][0]["role"] == "lighthouse"

    # slurm-requeue: the scheduler's settings are read when the run starts, not when it is planned
    requeue = runs["slurm-requeue/down"]["plan"]
    assert requeue["processes"][0]["argv"][:2] == ["sbatch", "--requeue"]
    assert requeue["versions"]["slurm"] is None
    assert requeue["timeouts"]["scheduler_requeue_hold_s"] is None
    assert requeue["timeouts"]["poll_interval_s"] == 0.2

    # pure: the same suite plans the same ports every time
    assert _dry_run(suite, out, capsys) == doc


def _runtime(tmp_path: Path, run_id: str = "r1") -> SlurmRuntime:
    writer = TimelineWriter(tmp_path / f"{run_id}.jsonl")
    return SlurmRuntime(RunInfo(run_id, tmp_path, writer))


def test_ports_are_a_sequence_of_the_run(tmp_path: Path, no_subprocess: None) -> None:
    a, b, c = _runtime(tmp_path), _runtime(tmp_path), _runtime(tmp_path, "r2")
    ports = [a.free_port() for _ in range(5)]
    assert ports == [b.free_port() for _ in range(5)]  # chosen from the run id alone
    assert len(set(ports)) == 5 and all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports)
    assert c.free_port() not in ports[:1]  # another run starts elsewhere
    assert a.master_addr == UNRESOLVED_MASTER_ADDR and a.scheduler == {}


def test_a_process_planned_unresolved_is_refused(tmp_path: Path, no_subprocess: None) -> None:
    rt = _runtime(tmp_path)
    spec = ProcessSpec("rank0.i0", ["python", "train.py"], env={"MASTER_ADDR": rt.master_addr})
    with pytest.raises(ChaosbenchError, match="before the slurm runtime was resolved"):
        rt.start(spec)


def test_a_signal_step_ended_with_its_job_after_its_clock_reading_counts_as_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper step overlaps a job of the run on the node; a SIGKILL of that job's own task ends the job and
    Slurm ends the step under the helper ("task 0: Terminated"). The helper printed its clock before the kill, so
    the kill counts as sent at that reading (it was reported as a failure and the fault as skipped, while the rank
    had died of it). Without the reading, it is a failure."""
    rt = _runtime(tmp_path)
    monkeypatch.setattr(rt, "slurm_node_now", lambda node: "n1")
    monkeypatch.setattr(rt.slurm, "our_jobs_on", lambda *a: [86, 87])
    monkeypatch.setattr(rt, "clock_offset_ns", lambda snode: 0)  # n1's clock measured equal to the harness's
    answers = [
        (143, "1796193874415254688\n", "srun: error: n1: task 0: Terminated\n"),
        (143, "", "srun: error: n1: task 0: Terminated\n"),
    ]

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        rc, out, err = answers.pop(0)
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(subprocess, "run", run)
    assert rt.signal_pid(29211, signal.SIGKILL, 803342, "node1") == 1796193874415254688
    with pytest.raises(EngineCommandFailed) as err:
        rt.signal_pid(29211, signal.SIGKILL, 803342, "node1")
    assert (err.value.rc, err.value.stderr) == (143, "srun: error: n1: task 0: Terminated")
    assert str(err.value) == "signalling pid 29211 on n1 failed: srun: error: n1: task 0: Terminated"
