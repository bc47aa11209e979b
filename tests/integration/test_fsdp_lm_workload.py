"""The FSDP2 LM workload: real 2-rank gloo runs, one shard file per rank, a SIGKILL mid-run and a bit-identical
resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from tests.helpers import Baseline, CheckpointingProgram, events_of, of_kind

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


PROGRAM = CheckpointingProgram(MODULE, ["--backend", "gloo"], STEPS, CKPT_EVERY, RUN_TIMEOUT_S, WORLD_SIZE)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """An uninterrupted 20-step run, checkpointing every 10 steps."""
    return PROGRAM.baseline(tmp_path_factory.mktemp("fsdp_lm_baseline"))


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
    # The sleep gives the poller ~0.5 s between step 15 and the step-20 checkpoint; it changes no numbers.
    PROGRAM.kill_at(tmp_path, kill_step=15, step_sleep_s=0.1)
    PROGRAM.assert_resumed_exactly(tmp_path, baseline, from_step=10)


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

    PROGRAM.run_to_end(tmp_path, ckpt_dir, events_path)
    events = read_events(events_path)
    assert sorted((e["rank"], e["step"]) for e in of_kind(events, "ckpt_load_begin")) == [(0, 10), (1, 10)]
    assert PROGRAM.final_digest(events) == baseline.digest
    assert (ckpt_dir / "step_00000020" / "COMPLETE").is_file()
    assert not (garbage / "COMPLETE").exists()


def test_fsdp_lm_through_the_runner_kill_and_sdc(run_suite) -> None:
    """The registered ``fsdp-lm`` workload under ``restart``: a kill recovers exactly from the sharded
    checkpoint; a NaN planted in rank 1's gradient shard is caught by the loss guard and recomputed; a skipped
    gradient reduce-scatter hangs the group until its process-group timeout."""
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
      skip: {injector: collective-hang, target: 1, params: {at_step: 13, mode: skip}}
    matrix: {frameworks: [restart], faults: [kill, nan, skip], repeats: 1}
    """)
    ctl = res["restart/control#0"]
    assert ctl.outcome == "completed" and ctl.final_step == 20
    for fault in ("kill", "nan"):
        m = res[f"restart/{fault}#0"]
        assert m.outcome == "recovered", (fault, m.verdict, m.missing)
        assert m.restart_count == 1 and m.fidelity == "exact", (fault, m.verdict)
    assert res["restart/nan#0"].detected_by == "loss-check"
    # rank 1 leaves FSDP's reduce-scatters of step 13 out: the group's collectives no longer pair up and hang
    # until the process-group timeout (10 s, before the 20 s watchdog); back to the step-10 checkpoint
    skip = res["restart/skip#0"]
    fired = [e for e in events_of(skip) if e.kind == "fault_inject"]
    assert [e.get("desync") for e in fired] == ["skip"] and fired[0].get("step") == 13, skip.verdict
    assert skip.detected_via == "process-group timeout" and skip.outcome == "recovered", skip.verdict
    assert skip.fidelity == "exact", skip.verdict
