"""The FSDP2 LM workload: real 2-rank gloo runs, one shard file per rank, a SIGKILL mid-run and a bit-identical
resume."""

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

MODULE = "chaosbench.workloads.fsdp_lm"
WORLD_SIZE = 2
STEPS = 20
CKPT_EVERY = 10
RUN_TIMEOUT_S = 180.0
#: A rank's shard file must hold at least this much: its slice of the parameters and of the AdamW moments.
MIN_SHARD_BYTES = 10_000
#: The two ranks' shard files may differ in size by at most this factor (replicated values land on one rank).
MAX_SHARD_RATIO = 3.0


def launch(tmp: Path, ckpt_dir: Path, events: Path, *extra: str, incarnation: int = 0) -> RankJob:
    args = [
        "--ckpt-dir",
        str(ckpt_dir),
        "--backend",
        "gloo",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(CKPT_EVERY),
    ]
    args += ["--pg-timeout-s", "60", *extra]
    return launch_ranks(MODULE, args, WORLD_SIZE, events, tmp, ckpt_dir.name, incarnation)


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
    """An uninterrupted 20-step run, checkpointing every 10 steps."""
    tmp = tmp_path_factory.mktemp("fsdp_lm_baseline")
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
        step_events = [e for e in of_kind(events, "step") if e["rank"] == rank]
        assert [e["step"] for e in step_events] == list(range(1, STEPS + 1))
        assert all(e["duration_s"] > 0 for e in step_events)
        # The synthetic language is learnable: the loss must clearly fall from about ln(vocab) = 4.85.
        first, last = step_events[0]["loss"], step_events[-1]["loss"]
        assert first > 4.0 and last < first - 0.5, (first, last)
        saves = [e for e in of_kind(events, "ckpt_save_end") if e["rank"] == rank]
        assert [(e["step"], e["complete"]) for e in saves] == [(10, True), (20, True)]
    for step in (10, 20):
        d = baseline.ckpt_dir / f"step_{step:08d}"
        assert (d / "COMPLETE").is_file() and (d / ".metadata").is_file()
    for log in baseline.job.logs:
        text = log.read_text()
        assert f"step {STEPS} loss " in text
        assert f"final digest {baseline.digest}" in text


def test_each_rank_writes_its_own_shard(baseline: Baseline) -> None:
    """FSDP2 state is sharded: every rank writes one file holding its slice of every parameter."""
    from torch.distributed.checkpoint import FileSystemReader

    d = baseline.ckpt_dir / f"step_{CKPT_EVERY:08d}"
    shards = sorted(p.name for p in d.glob("*.distcp"))
    assert shards == [f"__{rank}_0.distcp" for rank in range(WORLD_SIZE)]
    sizes = [(d / name).stat().st_size for name in shards]
    assert min(sizes) > MIN_SHARD_BYTES, sizes
    assert max(sizes) <= MAX_SHARD_RATIO * min(sizes), sizes

    metadata = FileSystemReader(str(d)).read_metadata()
    keys = set(metadata.state_dict_metadata)
    assert any(k.startswith("model.blocks.0.") for k in keys)
    assert any(k.startswith("optim.state.blocks.0.") for k in keys)
    assert {"progress.step", "progress.data_position", "rng.rank0.cpu", "rng.rank1.cpu"} <= keys
    files_of: dict[str, set[str]] = {}
    for index, info in metadata.storage_data.items():
        files_of.setdefault(index.fqn, set()).add(info.relative_path)
    params = [k for k in keys if k.startswith("model.")]
    moments = [k for k in keys if k.startswith("optim.state.") and k.endswith((".exp_avg", ".exp_avg_sq"))]
    assert params and len(moments) == 2 * len(params)
    sharded = params + moments
    for fqn in sharded:  # no rank holds a whole parameter or moment: each one is split across both files
        assert files_of[fqn] == set(shards), (fqn, files_of[fqn])
    assert files_of["rng.rank0.cpu"] == {"__0_0.distcp"}
    assert files_of["rng.rank1.cpu"] == {"__1_0.distcp"}


def test_kill_and_resume_is_bit_identical(baseline: Baseline, tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    events_path = tmp_path / "events.jsonl"
    # The sleep gives the poller ~0.5 s between step 15 and the step-20 checkpoint; it changes no numbers.
    job = launch(tmp_path, ckpt_dir, events_path, "--step-sleep-s", "0.1")
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
    assert not (ckpt_dir / "step_00000020" / "COMPLETE").exists()

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
    (ckpt_dir / "step_00000020" / "COMPLETE").unlink()
    garbage = ckpt_dir / "step_00000030"
    garbage.mkdir()
    (garbage / ".metadata").write_bytes(b"not a checkpoint")
    (garbage / "__0_0.distcp").write_bytes(b"")
    events_path = tmp_path / "events.jsonl"

    run_to_end(tmp_path, ckpt_dir, events_path)
    events = read_events(events_path)
    assert sorted((e["rank"], e["step"]) for e in of_kind(events, "ckpt_load_begin")) == [(0, 10), (1, 10)]
    assert final_digest(events) == baseline.digest
    assert (ckpt_dir / "step_00000020" / "COMPLETE").is_file()
    assert not (garbage / "COMPLETE").exists()


def test_fsdp_lm_through_the_runner_kill_and_sdc(run_suite) -> None:
    """The registered ``fsdp-lm`` workload under ``restart``: a kill recovers exactly from the sharded
    checkpoint; a NaN planted in rank 1's gradient shard is caught by the loss guard and recomputed."""
    res = run_suite("""
    name: fsdp
    seed: 5
    defaults:
      deadline_s: 120
      workload: {name: fsdp-lm, ranks: 2, steps: 20, checkpoint_every: 10, step_sleep_s: 0.05, pg_timeout_s: 10}
    frameworks:
      restart: {heartbeat_timeout_s: 20}
    faults:
      kill: {injector: kill, target: 1, trigger: {at_step: 13}}
      nan: {injector: sdc, target: 1, params: {at_step: 13, kind: nan, where: grad, loss_check: true}}
    matrix: {frameworks: [restart], faults: [kill, nan], repeats: 1}
    """)
    ctl = res["restart/control#0"]
    assert ctl.outcome == "completed" and ctl.final_step == 20
    for fault in ("kill", "nan"):
        m = res[f"restart/{fault}#0"]
        assert m.outcome == "recovered", (fault, m.verdict, m.missing)
        assert m.restart_count == 1 and m.fidelity == "exact", (fault, m.verdict)
    assert res["restart/nan#0"].detected_by == "loss-check"
