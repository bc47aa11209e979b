"""A third-party injector installed as a package is listed and used through its entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaosbench.timeline import read_events
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def test_entry_point_injector_is_listed_and_used(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(ROOT / "tests" / "fixtures" / "plugin_pkg"),
        ],
        check=True,
        cwd=tmp_path,
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    cli = [sys.executable, "-m", "chaosbench.cli"]
    listed = subprocess.run([*cli, "faults"], env=env, capture_output=True, text=True, check=True).stdout
    assert "touch: write a marker file into the run directory (test plugin)" in listed
    assert "filename (default 'touched')" in listed
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: plug\ncontrol: false\n"
        "defaults: {workload: {name: ddp-mlp, ranks: 2, steps: 12, checkpoint_every: 0}}\n"
        "faults: {t: {injector: touch, target: 1, trigger: {at_step: 3}, params: {filename: hit}}}\n"
        "matrix: {frameworks: [none], faults: [t]}\n"
    )
    run = subprocess.run(
        [*cli, "run", str(suite), "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    run_dir = tmp_path / "out" / "plug" / "none__t" / "0"
    assert (run_dir / "hit").read_text() == "1"
    inject = [e for e in read_events(run_dir / "events.jsonl") if e.kind == "fault_inject"]
    assert inject and inject[0]["injector"] == "touch"
    # without the package the suite is rejected up front, naming the injector
    bad = subprocess.run(
        [*cli, "run", str(suite), "--dry-run"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert bad.returncode == 2 and "unknown injector 'touch'" in bad.stderr
