"""Damaged checkpoints with real ranks: what the ddp-mlp workload under the restart framework does with a torn
write, a silently flipped weight and a truncated shard, and how a relaunch fails on a missing file."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from chaosbench.analysis.checkpoint_outcome import classify_checkpoint_outcome, corruption_fault
from chaosbench.analysis.metrics import RunMetrics
from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup
from chaosbench.injectors.corrupt_checkpoint import CorruptCheckpointInjector
from chaosbench.timeline import Event, read_events
from tests.helpers import RankJob, launch_ranks
from tests.helpers.truth import lost_steps_by_the_logs

pytestmark = pytest.mark.integration

SEED = 11

# step_sleep_s leaves ~0.25 s between the step-25 trigger and the step-30 checkpoint: the kill lands first.
SUITE = f"""
name: corrupt
seed: {SEED}
defaults:
  deadline_s: 90
  workload: {{name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.05, pg_timeout_s: 10}}
frameworks:
  restart: {{max_restarts: 2, heartbeat_timeout_s: 10}}
faults:
  torn: {{injector: corrupt-checkpoint, target: 1, trigger: {{on_event: {{kind: ckpt_save_begin, step: 20}}}},
          params: {{mode: torn-write}}}}
  flip: {{injector: corrupt-checkpoint, target: 1, trigger: {{at_step: 25}},
          params: {{mode: bitflip, bits: 8, tensors: 'model.*', kill_after: true}}}}
  cut: {{injector: corrupt-checkpoint, target: 1, trigger: {{at_step: 25}},
         params: {{mode: truncate, kill_after: true}}}}
matrix: {{frameworks: [restart], faults: [torn, flip, cut], repeats: 1}}
keep_checkpoints: all  # the control's are relaunched below
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[RunMetrics, list[Event]]]:
    from chaosbench.analysis.results import collect
    from chaosbench.runner import Runner
    from tests.conftest import make_suite

    runner = Runner(make_suite(SUITE), tmp_path_factory.mktemp("corrupt"))
    for rec in runner.run():
        assert rec.leftovers == [], f"{rec.scenario.id}: processes left running: {rec.leftovers}"
    out = {}
    for m in collect(runner.suite_dir):
        assert m.run_dir is not None
        out[str(m.scenario)] = (m, read_events(Path(m.run_dir) / "events.jsonl"))
    return out


def details(events: list[Event]) -> dict:
    fault = corruption_fault(events)
    assert fault is not None, [e.get("reason") for e in events if e.kind == "fault_skipped"]
    return dict(fault.get("details") or {})


def test_torn_write_falls_back_to_the_previous_checkpoint(results) -> None:
    ctl = results["restart/control"][0]
    m, events = results["restart/torn"]
    d = details(events)
    assert d["step"] == 20 and d["killed"][0]["rank"] == 1
    assert d.get("marker_at_kill") is False, d  # the kill landed inside the save
    assert m.outcome == "recovered" and m.restart_count == 1, m.missing
    loads = sorted({e["step"] for e in events if e.kind == "ckpt_load_end"})
    assert loads == [10]
    assert classify_checkpoint_outcome(events, control=m.control) == "fell_back"
    # back to step 10 from step 20; 9 when the trigger was rank 0's save and rank 1 died before it reported
    # step 20 (then step 20 is not a completed job step)
    assert m.lost_steps in (9, 10) and m.fidelity == "exact" and m.digest == ctl.digest


def test_bitflip_in_weights_loads_silently_and_fidelity_exposes_it(results) -> None:
    m, events = results["restart/flip"]
    d = details(events)
    assert (
        d["step"] == 20
        and d["mode"] == "bitflip"
        and d["killed"] == [{"rank": 1, "pid": d["killed"][0]["pid"]}]
    )
    flips = [f for rec in d["files"] for f in rec["flips"]]
    assert len(flips) == 8 and all(f["tensor"].startswith("model.") for f in flips)
    assert all(rec["file"].endswith("step_00000020/__1_0.distcp") for rec in d["files"])
    assert m.outcome == "recovered" and m.restart_count == 1, m.missing
    assert classify_checkpoint_outcome(events, control=m.control) == "loaded_silently"
    assert m.fidelity == "diverged"


def test_truncated_shard_crash_loops_the_restart_framework(results) -> None:
    m, events = results["restart/cut"]
    d = details(events)
    (rec,) = d["files"]
    assert rec["size_after"] == rec["size_before"] // 2
    assert m.outcome == "not_recovered" and m.restart_count == 2
    assert any(e.kind == "give_up" for e in events)
    # every relaunch began loading the damaged step-20 checkpoint and none finished
    begins = {(e.get("incarnation"), e["step"]) for e in events if e.kind == "ckpt_load_begin"}
    assert begins == {(1, 20), (2, 20)}
    assert not any(e.kind == "ckpt_load_end" for e in events)
    assert classify_checkpoint_outcome(events, control=m.control) == "crash_looped"


# --------------------------------------------------------------------------- a relaunch on a damaged copy


def _launch(ckpt_dir: Path, work: Path) -> RankJob:
    """Two ranks of ddp-mlp resuming from ``ckpt_dir`` (no harness), their output and events under ``work``."""
    args = ["--ckpt-dir", str(ckpt_dir), "--steps", "30", "--checkpoint-every", "10", "--seed", str(SEED)]
    return launch_ranks(
        "chaosbench.workloads.ddp_mlp",
        [*args, "--pg-timeout-s", "10"],
        2,
        work / "events.jsonl",
        work,
        "relaunch",
    )


def test_relaunch_on_a_missing_file_fails_naming_it(results, tmp_path: Path) -> None:
    """Both damages relaunched at once (4 processes) to keep the test short on a small machine."""
    ctl = results["restart/control"][0]
    assert ctl.run_dir is not None
    cases = {"delete-shard": "__1_0.distcp", "delete-metadata": ".metadata"}
    jobs = {}
    try:
        for mode in cases:
            work = tmp_path / mode
            ckpt = work / "ckpt"
            shutil.copytree(Path(ctl.run_dir) / "checkpoints", ckpt)
            shutil.rmtree(ckpt / "step_00000030")
            setup = RunSetup(
                run_id="t",
                run_dir=work,
                ckpt_dir=ckpt,
                runtime=None,
                timeline=None,  # type: ignore[arg-type]
                rng=random.Random(0),
                ranks=2,
                nodes=1,
            )
            target = ResolvedTarget(1, None, None, "node0", 0)
            ctx = FaultContext(None, None, [target], random.Random(0), setup)  # type: ignore[arg-type]
            inj = CorruptCheckpointInjector(
                "c", CorruptCheckpointInjector.Params.model_validate({"mode": mode})
            )
            assert inj.inject(ctx)["step"] == 20
            jobs[mode] = _launch(ckpt, work)
    finally:
        codes = {mode: job.finish(90) for mode, job in jobs.items()}
    for mode, missing in cases.items():
        output = jobs[mode].output()
        assert all(c is not None and c != 0 for c in codes[mode]), output
        assert f"step_00000020/{missing}" in output and "final digest" not in output


def test_workload_with_load_fallback_falls_back_past_a_truncated_shard(run_suite) -> None:
    """With ``load_fallback`` the workload rejects the damaged step-20 checkpoint, loads step 10 and ends
    exactly where the control ends."""
    res = run_suite(
        SUITE.replace("step_sleep_s: 0.05,", "step_sleep_s: 0.05, load_fallback: true,").replace(
            "faults: [torn, flip, cut]", "faults: [cut]"
        )
    )
    m = res["restart/cut#0"]
    assert m.checkpoint_outcome == "fell_back", m.verdict
    assert m.outcome == "recovered" and m.fidelity == "exact"
    assert m.lost_steps == lost_steps_by_the_logs(m) and m.lost_steps >= 15  # back to step 10 from step 25
    assert "checkpoint: fell back" in (m.verdict or "")
