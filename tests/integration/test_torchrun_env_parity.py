"""A script sees the same torch elastic variables under chaosbench's ``none`` adapter as under a real torchrun
(``torchrun_worker_env``), with the same values for its place in the job, and can initialize env:// with them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "fixtures" / "foreign" / "dump_elastic_env.py"

#: What torchrun's agent puts in its workers' environment for itself: its reply file (``start_processes``) and the
#: signals it forwards (set in the agent's own environment, inherited); not part of torchrun_worker_env.
AGENT_OWN = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
#: Equal under both for rank r of a 2-rank, 1-node job; the rest differ by nature (addresses, ports, run ids,
#: whether an agent hosts the store).
SAME_VALUES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


def _dumps(d: Path) -> list[dict[str, str]]:
    return [json.loads((d / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_script_sees_torchruns_variables_under_the_none_adapter(
    run_suite, tmp_path: Path, monkeypatch
) -> None:
    under_torchrun = tmp_path / "torchrun"
    under_torchrun.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAOSBENCH_", "TORCHELASTIC_"))}
    env.update(
        ENV_DUMP_DIR=str(under_torchrun), TMPDIR=str(tmp_path)
    )  # torchrun's log directory goes to TMPDIR
    # torchrun itself (the console script is torch.distributed.run's main)
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr

    under_none = tmp_path / "none"
    under_none.mkdir()
    monkeypatch.chdir(ROOT)
    m = run_suite(f"""
    name: worker-env
    seed: 1
    defaults:
      deadline_s: 60
      workload:
        name: command
        ranks: 2
        command: [{sys.executable}, "{{project_dir}}/tests/fixtures/foreign/dump_elastic_env.py"]
        env: {{ENV_DUMP_DIR: "{under_none}"}}
    frameworks:
      none: {{}}
    matrix: {{frameworks: [none], faults: [], repeats: 1}}
    """)["none/control#0"]
    assert m.run_end_outcome == "completed", m.verdict  # the job ended well (no steps: the control "failed")
    run_start = next(e for e in read_events(Path(str(m.run_dir)) / "events.jsonl") if e.kind == "run_start")

    for rank, (real, ours) in enumerate(zip(_dumps(under_torchrun), _dumps(under_none), strict=True)):
        missing = set(real) - AGENT_OWN - set(ours)
        assert missing == set(), f"rank {rank}: torchrun sets {sorted(missing)}, chaosbench does not"
        assert {k: ours[k] for k in SAME_VALUES} == {k: real[k] for k in SAME_VALUES}
        assert ours["RANK"] == str(rank)
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the env:// store, no agent does
        assert ours["TORCHELASTIC_RUN_ID"] == run_start.get("run_id")
