"""``chaosbench cleanup`` after a harness that was killed outright (SIGKILL: no finally blocks ran)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaosbench import procutil
from chaosbench.cleanup import cleanup, unfinished_runs
from chaosbench.timeline import read_events

pytestmark = pytest.mark.integration

SUITE = """
name: crash
control: false
defaults:
  deadline_s: 300
  workload: {name: ddp-mlp, ranks: 2, steps: 100000, checkpoint_every: 0, step_sleep_s: 0.01}
frameworks:
  torchrun: {share_rdzv_tcp_store: false}
faults:
  hang: {injector: hang, target: 1, trigger: {at_step: 5}}
matrix: {frameworks: [torchrun], faults: [hang]}
"""


def test_cleanup_ends_processes_of_a_killed_harness(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SUITE)
    out = tmp_path / "out"
    harness = subprocess.Popen(
        [sys.executable, "-m", "chaosbench.cli", "run", str(tmp_path / "s.yaml"), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    events = out / "crash" / "torchrun__hang" / "0" / "events.jsonl"
    pids: list[tuple[int, int | None]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if events.exists() and any(e.kind == "fault_inject" for e in read_events(events)):
                break
            time.sleep(0.1)
        else:
            pytest.fail("fault never fired")
        evs = read_events(events)
        pids = [(e["pid"], e.get("pid_ticks")) for e in evs if e.kind in ("proc_start", "rank_start")]
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        time.sleep(0.5)
        # the agent died with the harness (PDEATHSIG); its workers, one of them stopped, outlived it
        survivors = [p for p, t in pids if procutil.alive(p, t)]
        assert survivors, "expected orphaned ranks after SIGKILL of the harness"
        assert unfinished_runs(out) == [events.parent]
        actions = cleanup(out)
        assert any("kill" in a for a in actions)
        time.sleep(0.5)
        assert not [p for p, t in pids if procutil.alive(p, t)]
        assert cleanup(out) == []  # idempotent
    finally:
        if harness.poll() is None:
            harness.kill()
        for p, t in pids:
            if procutil.alive(p, t):
                os.kill(p, signal.SIGKILL)
