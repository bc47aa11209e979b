"""A run that fails for a reason outside the system under test says why (issue 27, item 5): a user's script that
cannot import a module, under the restart framework, is named in the verdict with its first error line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_rank_that_fails_at_import_is_named_with_its_error(run_suite, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import no_such_module_of_chaosbench  # a damaged environment\n")
    res = run_suite(f"""
    name: broken-env
    seed: 1
    defaults:
      deadline_s: 60
      workload:
        name: command
        ranks: 1
        steps: 10
        command: [{sys.executable}, {script}]
        patterns:
          step: 'iter (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
    frameworks:
      restart: {{heartbeat_timeout_s: 5, max_restarts: 0}}
    faults:
      kill: {{injector: kill, target: {{rank: 0}}, trigger: {{at_step: 5}}}}
    matrix: {{frameworks: [restart], faults: [kill], repeats: 1}}
    """)
    ctl, m = res["restart/control#0"], res["restart/kill#0"]
    why = ("'rank0.i0' exited 1 before the job's first step: ModuleNotFoundError: No module named "
           "'no_such_module_of_chaosbench'")  # fmt: skip
    assert ctl.outcome == "failed" and ctl.startup_failure == why, ctl.verdict
    assert ctl.verdict is not None and ctl.verdict.endswith(f"; {why}")
    assert m.outcome == "fault_not_fired" and m.startup_failure == why
    assert m.verdict == f"fault did not fire; {why}"
