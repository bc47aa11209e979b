"""The CI gate proves itself: workload variants with planted recovery bugs fail the SLOs (CLI exit code,
JUnit, the pytest plugin) and are found and shrunk by fuzzing; a correct workload passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from chaosbench.fuzz import Fuzzer
from chaosbench.rundir import RunDir
from chaosbench.specs import load_suite
from tests.conftest import make_suite

pytestmark = pytest.mark.integration

GATE = """
name: gate
seed: 3
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.02, pg_timeout_s: 10BUG}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 5}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 15}}
slos:
  fidelity: exact
  lost_steps: {max: 10}
  time_to_resume_s: {max: 30}
matrix: {frameworks: [restart], faults: [kill], repeats: 1}
"""

CLI = [sys.executable, "-m", "chaosbench.cli"]


def _suite(tmp: Path, bug: str | None) -> Path:
    p = tmp / f"gate-{bug or 'ok'}.yaml"
    p.write_text(GATE.replace("BUG", f", bug: {bug}" if bug else ""))
    return p


def test_cli_gate_passes_a_correct_workload_and_fails_a_forgetful_one(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            *CLI,
            "run",
            str(_suite(tmp_path, None)),
            "--out",
            str(tmp_path / "ok"),
            "--junit",
            str(tmp_path / "ok.xml"),
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [
            *CLI,
            "run",
            str(_suite(tmp_path, "forget-rng")),
            "--out",
            str(tmp_path / "bad"),
            "--junit",
            str(tmp_path / "bad.xml"),
            "--summary",
            str(tmp_path / "bad.md"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 3, bad.stderr
    assert 'SLO missed: restart/kill #0: fidelity = diverged (want == "exact")' in bad.stderr
    suite = ET.parse(tmp_path / "bad.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failure = suite.find("testcase/failure")
    assert failure is not None and "fidelity = diverged" in (failure.text or "")
    assert "run directory:" in (failure.text or "")
    assert "MISSED" in (tmp_path / "bad.md").read_text()
    # the good run as a baseline: the forgetful run's fidelity fell (exact -> diverged), but one run a side decides
    # nothing at alpha 0.05 (the smallest one-sided p is 1/2): the comparison says so and asks for more repeats;
    # the SLO above is what fails it
    base = tmp_path / "baseline.csv"
    subprocess.run(
        [*CLI, "baseline", str(tmp_path / "ok" / "gate"), "--to", str(base)], check=True, capture_output=True
    )
    cmp = subprocess.run(
        [*CLI, "compare", str(base), str(tmp_path / "bad" / "gate")], capture_output=True, text=True
    )
    row = next(
        line for line in cmp.stdout.splitlines() if line.startswith("| restart/kill | fidelity exact |")
    )
    assert cmp.returncode == 0 and "| 1/1 | 0/1 | -100 pp |" in row and "| undecided |" in row, row
    assert "not decidable with 1 vs 1 repeats (smallest possible p 0.5 > 0.05)" in row, row


def test_pytest_plugin_items_fail_with_measured_value_bound_and_run_dir(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "forget-data-position")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--chaos-suite",
            str(suite),
            "--chaos-out",
            str(tmp_path / "out"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "1 failed, 1 passed" in out
    assert "gate::restart/kill#0" in out and 'fidelity = diverged (want == "exact")' in out
    assert "run directory:" in out


def test_fuzzing_finds_and_shrinks_a_non_atomic_checkpoint(tmp_path: Path) -> None:
    """A torn save looks complete with the non-atomic-ckpt bug: some schedule must kill a rank during a save;
    fuzzing finds one and shrinks it to that single fault."""
    suite = make_suite(GATE.replace("BUG", ", bug: non-atomic-ckpt"))
    fuzzer = Fuzzer(
        suite,
        "restart",
        tmp_path / "fz",
        max_examples=10,
        max_runs=14,
        max_faults=2,
        seed=4,
        kinds=("kill", "torn-write"),
    )
    res = fuzzer.fuzz()
    assert res.schedule is not None, f"no failure found in {res.runs} runs"
    assert res.runs <= 14
    assert len(res.schedule) == 1 and res.schedule[0]["params"]["mode"] == "torn-write"
    repro = fuzzer.reproducer(res.schedule, tmp_path / "repro.yaml")
    doc = yaml.safe_load(repro.read_text())
    assert doc["workload" if "workload" in doc else "defaults"]["workload"]["bug"] == "non-atomic-ckpt"
    assert load_suite(repro).matrix.faults == [["f0"]]  # valid, loadable suite
    # replaying the reproducer misses its SLOs again
    replay = subprocess.run(
        [*CLI, "run", str(repro), "--out", str(tmp_path / "replay")], capture_output=True, text=True
    )
    assert replay.returncode == 3, replay.stderr


def test_cli_repeats_until_decided_stops_once_an_slo_is_missed(tmp_path: Path) -> None:
    """A forgetful workload misses the fidelity SLO in every run: with ``repeats: {max: 3, until: decided}`` its
    SLO verdict is settled by the first miss, and without a baseline nothing else is to decide, so it stops at
    min (2 repeats), says so on stderr, in repeats.json and in the summary, and the gate exits 3."""
    suite = tmp_path / "gate-until.yaml"
    suite.write_text(
        GATE.replace("BUG", ", bug: forget-rng").replace("repeats: 1}", "repeats: {max: 3, until: decided}}")
    )
    res = subprocess.run(
        [*CLI, "run", str(suite), "--out", str(tmp_path / "out"), "--summary", str(tmp_path / "s.md")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 3, res.stderr
    why = "restart/kill: decided after 2 of at most 3 repeats (an SLO missed)"
    assert f"repeats: {why}" in res.stderr
    assert "restart/kill: 2 to 3 repeats, 2 looks" in res.stderr
    doc = json.loads((tmp_path / "out" / "gate" / "repeats.json").read_text())
    assert (
        doc["restart/kill"]["repeats"] == 2
        and doc["restart/kill"]["decided"]
        and doc["restart/kill"]["why"] == why
    )
    assert not RunDir.at(tmp_path / "out" / "gate", "restart/kill", 2).path.exists()  # the third was not made
    assert why in (tmp_path / "s.md").read_text()
