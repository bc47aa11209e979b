"""A user's unchanged training script validated through log-line patterns."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT
from tests.helpers.truth import lost_steps_by_the_logs

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "fixtures" / "user_train.py"


def test_user_script_kill_and_restart_measured_from_log_lines(run_suite) -> None:
    res = run_suite(f"""
    name: cmd
    seed: 1
    defaults:
      deadline_s: 90
      workload:
        name: command
        ranks: 2
        steps: 30
        command: [{sys.executable}, {SCRIPT}, --ckpt-dir, "{{ckpt_dir}}", --iters, "30"]
        patterns:
          step: 'iter (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
          ckpt_save_begin: 'saving checkpoint iter (?P<step>\\d+)'
          ckpt_save_end: 'saved checkpoint iter (?P<step>\\d+)'
          ckpt_load_end: 'resumed from iter (?P<step>\\d+)'
          train_end: 'done iter (?P<step>\\d+) loss (?P<loss>[\\d.]+) digest (?P<digest>[0-9a-f]+)'
    frameworks:
      restart: {{heartbeat_timeout_s: 5}}
    faults:
      kill: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: 15}}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 1}}
    """)
    ctl, m = res["restart/control#0"], res["restart/kill#0"]
    assert ctl.outcome == "completed" and ctl.final_step == 30 and ctl.digest
    assert m.outcome == "recovered", m.missing
    assert m.detected and m.restart_count == 1
    assert m.lost_steps == lost_steps_by_the_logs(m)  # saved at 10, killed after 15 (16 in flight): 5 or 6
    assert m.checkpoint_age_s is not None and m.checkpoint_age_s > 0
    assert m.fidelity == "exact"
