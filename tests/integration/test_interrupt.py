"""Interrupting the harness mid-fault keeps finished results and leaves nothing running or stopped."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaosbench import procutil
from chaosbench.runtimes import process
from chaosbench.timeline import read_events

pytestmark = pytest.mark.integration

SUITE = """
name: intr
seed: 2
defaults:
  deadline_s: 300
  workload: {name: ddp-mlp, ranks: 2, steps: 400, checkpoint_every: 10, step_sleep_s: 0.01}
frameworks:
  torchrun: {share_rdzv_tcp_store: false}
faults:
  hang: {injector: hang, target: {rank: 1}, trigger: {at_step: 5}}
matrix: {frameworks: [torchrun], faults: [hang], repeats: 1}
"""


def test_sigint_mid_fault_tears_down_and_keeps_results(tmp_path: Path) -> None:
    # the control finishes first (a result to keep), then the faulted run hangs until interrupted
    (tmp_path / "s.yaml").write_text(SUITE)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaosbench.cli", "run", str(tmp_path / "s.yaml"), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    events_path = out / "intr" / "torchrun__hang" / "0" / "events.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if events_path.exists() and any(e.kind == "fault_inject" for e in read_events(events_path)):
                break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        else:
            pytest.fail("the fault never fired")
        ev = read_events(events_path)
        stopped_pid = next(e for e in ev if e.kind == "fault_inject")["target"][0]["pid"]
        assert process.state(stopped_pid) == "stopped"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            from chaosbench.cleanup import cleanup

            cleanup(out)  # the harness was killed outright: end what it left, as a user would
    assert proc.returncode == 1, output
    assert "interrupted" in output
    ev = read_events(events_path)
    kinds = [e.kind for e in ev]
    assert "fault_revert" in kinds
    end = [e for e in ev if e.kind == "run_end"][-1]
    assert end["outcome"] == "interrupted" and end["leftover_pids"] == []
    pids = {(e["pid"], e.get("pid_ticks")) for e in ev if e.kind in ("proc_start", "rank_start")}
    assert pids and not [p for p, t in pids if procutil.alive(p, t)]
    # the finished control run is in the results table, and so is the interrupted one
    with (out / "intr" / "results.csv").open() as f:
        rows = {r["scenario"]: r for r in csv.DictReader(f)}
    assert rows["torchrun/control"]["outcome"] == "completed"
    assert rows["torchrun/hang"]["run_end_outcome"] == "interrupted"
    assert (out / "intr" / "report.html").exists()
