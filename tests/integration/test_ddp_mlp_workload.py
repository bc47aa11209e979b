"""The DDP MLP workload: real 2-rank gloo runs, a SIGKILL mid-run and a resume that must be bit-identical."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaosbench.timeline import Event, read_events
from tests.helpers import RankJob, launch_ranks

pytestmark = pytest.mark.integration

WORLD_SIZE = 2
STEPS = 30
CKPT_EVERY = 10
RUN_TIMEOUT_S = 120.0


def launch(
    tmp: Path, ckpt_dir: Path, events: Path, *extra: str, incarnation: int = 0, steps: int = STEPS
) -> RankJob:
    args = ["--ckpt-dir", str(ckpt_dir), "--steps", str(steps), "--checkpoint-every", str(CKPT_EVERY)]
    args += ["--pg-timeout-s", "60", *extra]
    return launch_ranks(
        "chaosbench.workloads.ddp_mlp", args, WORLD_SIZE, events, tmp, ckpt_dir.name, incarnation
    )


def run_to_end(tmp: Path, ckpt_dir: Path, events: Path, *extra: str, incarnation: int = 0) -> RankJob:
    job = launch(tmp, ckpt_dir, events, *extra, incarnation=incarnation)
    try:
        codes = job.wait(RUN_TIMEOUT_S)
    finally:
        job.kill()
    assert codes == [0] * WORLD_SIZE, job.output()
    return job


def of_kind(events: list[Event], kind: str, incarnation: int | None = None) -> list[Event]:
    return [
        e for e in events if e.kind == kind and (incarnation is None or e.get("incarnation") == incarnation)
    ]


def final_digest(events: list[Event], incarnation: int = 0) -> str:
    ends = of_kind(events, "train_end", incarnation)
    assert sorted(e["rank"] for e in ends) == list(range(WORLD_SIZE))
    digests = {e["digest"] for e in ends}
    assert len(digests) == 1, f"ranks disagree on the final parameters: {digests}"
    assert all(e["step"] == STEPS for e in ends)
    return digests.pop()


@dataclass
class Baseline:
    digest: str
    ckpt_dir: Path
    events: list[Event]
    job: RankJob


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """An uninterrupted 30-step run, checkpointing every 10 steps."""
    tmp = tmp_path_factory.mktemp("ddp_mlp_baseline")
    ckpt_dir = tmp / "ckpt"
    job = run_to_end(tmp, ckpt_dir, tmp / "events.jsonl")
    events = read_events(tmp / "events.jsonl")
    return Baseline(final_digest(events), ckpt_dir, events, job)


def test_uninterrupted_run(baseline: Baseline) -> None:
    events = baseline.events
    starts = of_kind(events, "rank_start")
    assert sorted(e["rank"] for e in starts) == [0, 1]
    assert [e["pid"] for e in sorted(starts, key=lambda e: e["rank"])] == [p.pid for p in baseline.job.procs]
    assert of_kind(events, "ckpt_load_begin") == []
    for rank in range(WORLD_SIZE):
        steps = [e["step"] for e in of_kind(events, "step") if e["rank"] == rank]
        assert steps == list(range(1, STEPS + 1))
        saves = [e for e in of_kind(events, "ckpt_save_end") if e["rank"] == rank]
        assert [(e["step"], e["complete"]) for e in saves] == [(10, True), (20, True), (30, True)]
    for step in (10, 20, 30):
        d = baseline.ckpt_dir / f"step_{step:08d}"
        assert (d / "COMPLETE").is_file() and (d / ".metadata").is_file()
    for log in baseline.job.logs:
        text = log.read_text()
        assert "step 30 loss " in text
        assert f"final digest {baseline.digest}" in text


def test_kill_and_resume_is_bit_identical(baseline: Baseline, tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    events_path = tmp_path / "events.jsonl"
    # The sleep gives the poller ~0.25 s between step 15 and the step-20 checkpoint; it changes no numbers.
    job = launch(tmp_path, ckpt_dir, events_path, "--step-sleep-s", "0.05")
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any(e["step"] >= 15 for e in of_kind(read_events(events_path), "step")):
            assert time.monotonic() < deadline, "step 15 never appeared\n" + job.output()
            assert all(p.poll() is None for p in job.procs), "a rank exited early\n" + job.output()
            time.sleep(0.01)
        job.procs[1].send_signal(signal.SIGKILL)
        assert job.procs[1].wait(timeout=10) == -signal.SIGKILL
        try:  # the survivor should fail on its next collective; give it a moment, then kill it
            job.procs[0].wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    finally:
        job.kill()
    events = read_events(events_path)
    assert of_kind(events, "train_end") == []
    assert max(e["step"] for e in of_kind(events, "step")) < 20

    run_to_end(tmp_path, ckpt_dir, events_path, incarnation=1)
    events = read_events(events_path)
    loads = of_kind(events, "ckpt_load_begin", incarnation=1)
    assert sorted((e["rank"], e["step"]) for e in loads) == [(0, 10), (1, 10)]
    assert len(of_kind(events, "ckpt_load_end", incarnation=1)) == WORLD_SIZE
    for rank in range(WORLD_SIZE):
        steps = [e["step"] for e in of_kind(events, "step", incarnation=1) if e["rank"] == rank]
        assert steps == list(range(11, STEPS + 1))
    assert final_digest(events, incarnation=1) == baseline.digest


def test_incomplete_checkpoints_are_ignored(baseline: Baseline, tmp_path: Path) -> None:
    """Directories without COMPLETE (even with garbage in them) are skipped, and rewritten when reached."""
    ckpt_dir = tmp_path / "ckpt"
    shutil.copytree(baseline.ckpt_dir, ckpt_dir)
    (ckpt_dir / "step_00000030" / "COMPLETE").unlink()
    (ckpt_dir / "step_00000020" / "COMPLETE").unlink()
    garbage = ckpt_dir / "step_00000040"
    garbage.mkdir()
    (garbage / ".metadata").write_bytes(b"not a checkpoint")
    (garbage / "__0_0.distcp").write_bytes(b"")
    events_path = tmp_path / "events.jsonl"

    run_to_end(tmp_path, ckpt_dir, events_path)
    events = read_events(events_path)
    assert sorted((e["rank"], e["step"]) for e in of_kind(events, "ckpt_load_begin")) == [(0, 10), (1, 10)]
    assert final_digest(events) == baseline.digest
    for step in (20, 30):
        assert (ckpt_dir / f"step_{step:08d}" / "COMPLETE").is_file()
    assert not (garbage / "COMPLETE").exists()
