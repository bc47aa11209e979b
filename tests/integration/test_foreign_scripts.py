"""Users' own, unmodified training scripts (tests/fixtures/foreign/: none imports chaosbench; their own checkpoint
formats, log lines and default process-group timeouts) under restart and torchrun, with a killed and a hung rank.

Each figure is checked against what really happened: the kill lands after step 15 with a checkpoint at step 10,
so 5 steps (6 with one in flight) are recomputed; a hang is caught by restart's step watchdog (whom it blames
depends on which ranks log steps) and never by torchrun, whose only detector for it is the process-group timeout
(torch's 30-minute default in these scripts): the run ends at the deadline, undetected, whatever torchrun says
while the harness tears it down.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from tests.conftest import ROOT
from tests.helpers.truth import assert_torchrun_blamed_by_the_logs, lost_steps_by_the_logs

pytestmark = pytest.mark.integration

FOREIGN = ROOT / "tests" / "fixtures" / "foreign"


@dataclass
class Script:
    name: str
    workload: str  # YAML of the workload's command/env/patterns (indented under `workload:`)
    every_rank_logs: bool  # restart's watchdog can only blame a rank that reports steps
    # torchrun x hang runs to the deadline (the scripts keep torch's 30-minute timeout): once is enough for CI
    torchrun_hang: bool = False


SCRIPTS = [
    Script(
        "ddp_env",
        f"""
        command: [{sys.executable}, "{{project_dir}}/tests/fixtures/foreign/ddp_env.py"]
        env: {{CKPT_DIR: "{{ckpt_dir}}", TOTAL_STEPS: "30", STEP_SLEEP: "0.03"}}
        patterns:
          step: '\\[rank \\d+\\] step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
          ckpt_save_end: 'saved checkpoint step (?P<step>\\d+)'
          ckpt_load_end: 'resumed from checkpoint at step (?P<step>\\d+)'
          train_end: 'final checksum (?P<digest>[0-9a-f]+)'
        """,
        every_rank_logs=True,
        torchrun_hang=True,
    ),
    Script(
        "trainer_style",
        f"""
        command: [{sys.executable}, "{{project_dir}}/tests/fixtures/foreign/trainer_style.py", --max-steps, "30",
                  --step-sleep, "0.03"]
        patterns:
          step: '\\bstep (?P<step>\\d+)/\\d+ \\| loss (?P<loss>[-+0-9.eE]+|nan|inf) \\|'
          ckpt_save_end: '\\bStep (?P<step>\\d+) \\| Training snapshot saved at'
          ckpt_load_end: '\\bResuming training from snapshot at Step (?P<step>\\d+)'
          train_end: '\\bTraining complete \\| final loss (?P<loss>[-+0-9.eE]+|nan|inf) \\| params sha256 (?P<digest>[0-9a-f]{{64}})'
        """,
        every_rank_logs=False,
    ),
    Script(
        "dcp_resume",
        f"""
        command: [{sys.executable}, "{{project_dir}}/tests/fixtures/foreign/dcp_resume.py", --ckpt-dir, "{{ckpt_dir}}",
                  --resume, --steps, "30", --sleep, "0.03"]
        patterns:
          step: '\\[rank\\d+\\] INFO step=(?P<step>\\d+) loss=(?P<loss>[-+0-9.eE]+|nan|inf)'
          ckpt_save_end: '\\[rank\\d+\\] INFO saved checkpoint step=(?P<step>\\d+)'
          ckpt_load_end: '\\[rank\\d+\\] INFO resumed from checkpoint step=(?P<step>\\d+)'
          train_end: '\\[rank\\d+\\] INFO training finished at step=(?P<step>\\d+) digest=(?P<digest>[0-9a-f]{{64}})'
        """,
        every_rank_logs=True,
    ),
]


def _suite(script: Script) -> str:
    workload = textwrap.indent(textwrap.dedent(script.workload).strip(), " " * 8)
    return f"""
    name: foreign-{script.name}
    seed: 3
    defaults:
      deadline_s: 30
      workload:
        name: command
        ranks: 2
        steps: 30
{workload}
    frameworks:
      restart: {{heartbeat_timeout_s: 4}}
      torchrun: {{share_rdzv_tcp_store: false}}
    faults:
      kill: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: 15}}}}
      hang: {{injector: hang, target: {{rank: 1}}, trigger: {{at_step: 15}}}}
    matrix:
      frameworks: [restart, torchrun]
      faults: [kill]
      include: [{{frameworks: [restart{", torchrun" if script.torchrun_hang else ""}], faults: [hang]}}]
    """


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_foreign_script_under_restart_and_torchrun(run_suite, script: Script, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # {project_dir}: where chaosbench is started
    res = run_suite(_suite(script))
    for fw in ("restart", "torchrun"):
        ctl = res[f"{fw}/control#0"]
        assert ctl.outcome == "completed" and ctl.clean, ctl.verdict
        assert ctl.final_step == 30 and ctl.digest and not ctl.contaminated

        kill = res[f"{fw}/kill#0"]
        assert kill.outcome == "recovered", (kill.verdict, kill.missing)
        if (
            fw == "torchrun"
        ):  # torch names the first failure it polled: the killed rank, or a peer that failed
            assert_torchrun_blamed_by_the_logs(kill, rank=1)
        else:
            assert kill.detected and kill.blame == "correct" and kill.blamed == "rank 1", kill.verdict
        assert kill.restart_count == 1 and kill.restarts_claimed == 1
        # checkpoint at 10, killed after 15 (16 in flight): as the scripts' own lines say
        assert kill.lost_steps == lost_steps_by_the_logs(kill), kill.lost_steps
        assert kill.fault_step == kill.trigger_step == 15
        assert kill.injection_latency_s is not None and 0 <= kill.injection_latency_s < 0.05
        assert kill.fidelity == "exact", kill.verdict
        assert kill.predicted_detect_s is not None and kill.time_to_detect_s is not None
        assert (
            kill.time_to_detect_s < 1.0 and kill.time_to_resume_s is not None and kill.time_to_resume_s < 20
        )

    hang = res["restart/hang#0"]
    assert hang.outcome == "recovered" and hang.fidelity == "exact", hang.verdict
    assert hang.predicted_detect_s == pytest.approx(4.05)
    assert hang.time_to_detect_s is not None and 3.0 < hang.time_to_detect_s < 6.0
    # The step watchdog blames the rank whose last step is oldest. When every rank logs steps, the stopped rank
    # and its peer (blocked in the next collective) logged their last step at the same moment: either may be
    # named (a race, measured 3 of 4 correct in the smoke suite). When only rank 0 logs, it can only see rank 0
    # stall, and blames it every time.
    if script.every_rank_logs:
        assert hang.blame in ("correct", "wrong") and hang.blamed in ("rank 0", "rank 1"), hang.verdict
    else:
        assert hang.blame == "wrong" and hang.blamed == "rank 0", hang.verdict

    if not script.torchrun_hang:
        return
    hang = res["torchrun/hang#0"]
    assert hang.outcome == "not_recovered" and hang.run_end_outcome == "deadline"
    assert not hang.detected and hang.time_to_detect_s is None, hang.verdict
    assert hang.verdict.startswith("not detected"), hang.verdict
    assert hang.predicted_detect_s == pytest.approx(1800.1)  # torch's gloo default: the scripts set none
    assert any("sets no process-group timeout" in p for p in hang.timeout_problems)
    # torchrun did write "Sending process ... closing signal": in reaction to the harness's teardown, not the hang.
    events = read_events(Path(str(hang.run_dir)) / "events.jsonl")
    teardown = next(e for e in events if e.kind == "teardown_begin")
    assert teardown.get("reason") == "deadline"
    assert [e for e in events if e.kind == "detect" and e.t_ns >= teardown.t_ns], (
        "expected torchrun's teardown lines"
    )
    assert "after the harness began tearing the run down" in hang.missing["time_to_detect_s"]


def test_checkpoint_from_outside_the_run_is_flagged_contaminated(
    run_suite, tmp_path: Path, monkeypatch
) -> None:
    """A script that saves into its working directory, run with one shared working directory (``cwd`` set, the
    way chaosbench ran every script before runs got their own): the control leaves snapshot.pt behind, the next
    run resumes from it at the last step and finishes at once. That run is flagged, not measured."""
    monkeypatch.chdir(ROOT)
    shared = tmp_path / "shared-cwd"
    workload = textwrap.indent(textwrap.dedent(SCRIPTS[1].workload).strip(), " " * 8)
    res = run_suite(f"""
    name: contaminated
    defaults:
      deadline_s: 30
      workload:
        name: command
        ranks: 2
        steps: 30
        cwd: {shared}
{workload}
    frameworks: {{restart: {{heartbeat_timeout_s: 4}}}}
    faults:
      kill: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: 15}}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 1}}
    """)
    assert res["restart/control#0"].outcome == "completed"
    m = res["restart/kill#0"]
    assert m.outcome == "contaminated" and m.contaminated, m.verdict
    assert m.verdict.startswith("contaminated: rank") and "before this run had saved one" in m.verdict
    assert m.time_to_resume_s is None and m.fidelity is None
    assert (shared / "snapshot.pt").is_file()


def test_every_run_has_its_own_checkpoint_and_working_directory(run_suite, monkeypatch) -> None:
    """The env/cwd placeholders are substituted and each run writes only below its own run directory."""
    monkeypatch.chdir(ROOT)
    workload = textwrap.indent(textwrap.dedent(SCRIPTS[0].workload).strip(), " " * 8)
    res = run_suite(f"""
    name: isolated
    control: true
    defaults:
      deadline_s: 30
      workload:
        name: command
        ranks: 2
        steps: 30
{workload}
    frameworks: {{none: {{}}}}
    faults:
      hang: {{injector: hang, target: 1, trigger: {{at_step: 5}}, params: {{duration_s: 0.5}}}}
    matrix: {{frameworks: [none], faults: [hang], repeats: 1}}
    """)
    dirs = [Path(str(m.run_dir)) for m in res.values()]
    for d in dirs:
        # both runs finished training and match: the default keep_checkpoints (failed) removed the files,
        # their names and sizes stay on record
        listing = json.loads((d / "checkpoints.json").read_text())
        assert listing["kept"] is False and not (d / "checkpoints").exists()
        assert [c["path"] for c in listing["checkpoints"]] == ["checkpoints/checkpoint.pt"]
        assert listing["checkpoints"][0]["bytes"] > 0
        assert (d / "work").is_dir()
        config = json.loads((d / "config.json").read_text())
        assert config["scenario"]["project_dir"] == str(ROOT)
    assert not (ROOT / "{ckpt_dir}").exists()
    # a 0.5 s hang under none ends by itself: outlasted
    assert res["none/hang#0"].outcome == "outlasted" and res["none/hang#0"].fidelity == "exact"
