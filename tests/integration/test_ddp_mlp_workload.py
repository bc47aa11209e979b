"""The DDP MLP workload: real 2-rank gloo runs, a SIGKILL mid-run and a resume that must be bit-identical."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from tests.helpers import Baseline, CheckpointingProgram, of_kind

pytestmark = pytest.mark.integration

WORLD_SIZE = 2
STEPS = 30
CKPT_EVERY = 10
RUN_TIMEOUT_S = 120.0


PROGRAM = CheckpointingProgram(
    "chaosbench.workloads.ddp_mlp", [], STEPS, CKPT_EVERY, RUN_TIMEOUT_S, WORLD_SIZE
)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """An uninterrupted 30-step run, checkpointing every 10 steps."""
    return PROGRAM.baseline(tmp_path_factory.mktemp("ddp_mlp_baseline"))


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
    # The sleep gives the poller ~0.25 s between step 15 and the step-20 checkpoint; it changes no numbers.
    PROGRAM.kill_at(tmp_path, kill_step=15, step_sleep_s=0.05)
    PROGRAM.assert_resumed_exactly(tmp_path, baseline, from_step=10)


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

    PROGRAM.run_to_end(tmp_path, ckpt_dir, events_path)
    events = read_events(events_path)
    assert sorted((e["rank"], e["step"]) for e in of_kind(events, "ckpt_load_begin")) == [(0, 10), (1, 10)]
    assert PROGRAM.final_digest(events) == baseline.digest
    for step in (20, 30):
        assert (ckpt_dir / f"step_{step:08d}" / "COMPLETE").is_file()
    assert not (garbage / "COMPLETE").exists()
