"""The CI gate on hand-made results: every exit code and their order, the files it writes, and the three callers
(``chaosbench run``, the pytest plugin, the fuzzer) judging the same runs the same way."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import pandas as pd
import pytest

from chaosbench import cli
from chaosbench.analysis.metrics import RunMetrics
from chaosbench.frameworks.base import JobResult
from chaosbench.fuzz import Fuzzer
from chaosbench.gate import (
    COMPARISON_FILE,
    EXIT_HARNESS,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_SLO,
    SUMMARY_FILE,
    Comparison,
    Gate,
    harness_errors,
    missed_slos,
)
from chaosbench.pytest_plugin import BaselineItem, ChaosFailure, ChaosItem
from tests.conftest import make_suite

MISS = "lost_steps = 12 (want <= 10.0)"


def run(repeat: int, **kw) -> RunMetrics:
    m = RunMetrics(
        scenario="restart/kill",
        framework="restart",
        fault="kill",
        repeat=repeat,
        outcome="recovered",
        fidelity="exact",
        run_dir=f"/r/{repeat}",
    )
    for k, v in kw.items():
        setattr(m, k, v)
    return m


def ok_run(repeat: int = 0) -> RunMetrics:
    return run(repeat, slo_ok=True, verdict="recovered after 1 restart")


def missed_run(repeat: int = 1) -> RunMetrics:
    return run(repeat, slo_ok=False, slo_failures=[MISS], lost_steps=12)


def result_set(path: Path, resume_s: list[float]) -> Path:
    """A results CSV (a baseline) or, for a directory, a suite directory holding one."""
    rows = [
        {
            "scenario": "restart/kill",
            "fault": "kill",
            "control": False,
            "outcome": "recovered",
            "fidelity": "exact",
            "time_to_resume_s": v,
        }
        for v in resume_s
    ]
    if path.suffix != ".csv":
        path.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(path / "results.csv", index=False)
    else:
        pd.DataFrame(rows).to_csv(path, index=False)
    return path


BASE = [3.0, 3.1, 3.2]
SLOWER = [5.0, 5.1, 5.2]  # +60 %, p = 0.05 with 3 repeats each: a regression


@pytest.fixture
def regressed(tmp_path: Path) -> Comparison:
    return Comparison.of(result_set(tmp_path / "base.csv", BASE), result_set(tmp_path / "now", SLOWER))


@pytest.fixture
def unchanged(tmp_path: Path) -> Comparison:
    return Comparison.of(result_set(tmp_path / "base.csv", BASE), result_set(tmp_path / "same", BASE))


# ----------------------------------------------------------------------------------------------- exit codes
def test_all_met_is_ok_and_no_slos_is_ok_whatever_the_outcome() -> None:
    assert Gate("ci", [ok_run(0), ok_run(1)]).exit_code() == EXIT_OK
    no_slos = run(0, outcome="not_recovered", fidelity=None)  # slo_ok None: the suite has no SLOs
    assert Gate("ci", [no_slos]).exit_code() == EXIT_OK
    assert Gate("ci", []).exit_code() == EXIT_OK


def test_a_missed_slo_is_exit_3() -> None:
    gate = Gate("ci", [ok_run(0), missed_run(1)])
    assert gate.exit_code() == EXIT_SLO == 3
    assert [m.repeat for m in gate.misses] == [1]


def test_a_regression_is_exit_4_and_beats_a_missed_slo(regressed: Comparison, unchanged: Comparison) -> None:
    assert [d.metric for d in regressed.regressions] == ["time_to_resume_s"]
    assert Gate("ci", [ok_run()], comparison=regressed).exit_code() == EXIT_REGRESSION == 4
    assert Gate("ci", [missed_run()], comparison=regressed).exit_code() == EXIT_REGRESSION
    assert unchanged.regressions == []
    assert Gate("ci", [ok_run()], comparison=unchanged).exit_code() == EXIT_OK
    assert Gate("ci", [missed_run()], comparison=unchanged).exit_code() == EXIT_SLO


def test_a_harness_error_or_an_interruption_is_exit_1_and_beats_everything(regressed: Comparison) -> None:
    errors = {"/r/2": "harness exploded"}
    assert Gate("ci", [ok_run()], errors).exit_code() == EXIT_HARNESS == 1
    assert Gate("ci", [missed_run()], errors, comparison=regressed).exit_code() == EXIT_HARNESS
    assert Gate("ci", [ok_run()], interrupted=True).exit_code() == EXIT_HARNESS
    assert Gate("ci", [missed_run()], comparison=regressed, interrupted=True).exit_code() == EXIT_HARNESS


def test_too_few_repeats_is_undecided_not_a_regression(tmp_path: Path) -> None:
    cmp = Comparison.of(result_set(tmp_path / "base.csv", BASE[:2]), result_set(tmp_path / "now", SLOWER[:2]))
    assert cmp.regressions == []
    assert [d.metric for d in cmp.notes] == [d.metric for d in cmp.undecided] == ["time_to_resume_s"]
    assert cmp.notes[0].note.startswith("not decidable with 2 vs 2 repeats")
    assert cmp.verdict().startswith(
        "0 regressions, 1 comparisons undecidable with these repeats; Holm over a "
        "family of 0 comparisons at alpha 0.05"
    )
    # undecided is not a regression: the exit code is what the SLOs say
    assert Gate("ci", [ok_run()], comparison=cmp).exit_code() == EXIT_OK
    assert Gate("ci", [missed_run()], comparison=cmp).exit_code() == EXIT_SLO
    gate = Gate("ci", [ok_run()], comparison=cmp)
    gate.write_junit(tmp_path / "j.xml")
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("2", "0", "1")
    skipped = root.findall("testcase")[1].find("skipped")
    assert skipped is not None and "not decidable with 2 vs 2 repeats" in (skipped.get("message") or "")
    md = gate.summary_markdown()
    assert "### Undecidable with these repeats (not failed)" in md and "1 comparisons undecidable" in md


def test_harness_errors_are_the_runs_with_status_error() -> None:
    records = [
        SimpleNamespace(run_dir=Path("/r/0"), result=JobResult("completed")),
        SimpleNamespace(run_dir=Path("/r/1"), result=JobResult("error", "no such injector")),
        SimpleNamespace(run_dir=Path("/r/2"), result=JobResult("deadline", "torn down")),
    ]
    assert harness_errors(records) == {"/r/1": "no such injector"}  # type: ignore[arg-type]


def test_missed_slos_only_when_the_verdict_is_a_miss() -> None:
    assert missed_slos(missed_run()) == [MISS]
    assert missed_slos(ok_run()) == []
    assert missed_slos(run(0)) == []


# ----------------------------------------------------------------------------------------------- CI outputs
def test_junit_and_summary(tmp_path: Path, regressed: Comparison) -> None:
    a, b = ok_run(0), missed_run(1)
    c = run(2)
    gate = Gate("ci", [a, b, c], {"/r/2": "harness exploded"}, comparison=regressed)
    gate.write_junit(tmp_path / "j.xml")
    root = ET.parse(tmp_path / "j.xml").getroot()
    # 3 runs and the one comparison tested (time_to_resume_s: a regression); the baseline's noise is twice the
    # interquartile range of 3.0, 3.1, 3.2 (inclusive quartiles 3.05 and 3.15)
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "2", "1")
    cases = root.findall("testcase")
    reg = cases[3]
    assert (reg.get("classname"), reg.get("name")) == ("ci.baseline.restart/kill", "time_to_resume_s")
    props = {p.get("name"): p.get("value") for p in reg.iter("property")}
    assert props == {
        "finding": "regression",
        "baseline": "3.1",
        "now": "5.1",
        "change": "0.6452",
        "p": "0.05",
        "p_holm": "0.05",
        "family": "1",
        "alpha": "0.05",
        "baseline_noise": "0.2",
        "repeats": "3 vs 3",
    }
    failure = reg.find("failure")
    assert failure is not None and failure.get("message") == (
        "restart/kill: time_to_resume_s 3.1 -> 5.1 (+65%), p=0.05, Holm p=0.05: regression"
    )
    fail = cases[1].find("failure")
    assert fail is not None and MISS in (fail.text or "") and "run directory: /r/1" in (fail.text or "")
    err = cases[2].find("error")
    assert err is not None and err.get("message") == "harness exploded"
    assert cases[0].find("failure") is None and cases[0].find("error") is None
    md = Gate("ci", [a, b], comparison=regressed).summary_markdown()
    assert (
        "2 runs, 1 missed an SLO, 1 regressions." in md and "MISSED: lost_steps = 12 (want &lt;= 10.0)" in md
    )
    assert (
        "### Regressions against the baseline" in md and "- restart/kill: time_to_resume_s 3.1 -> 5.1" in md
    )
    assert "1 regressions, 0 comparisons undecidable with these repeats; Holm over a family of 1" in md
    assert "gate power: 3 baseline vs 3 new repeats per scenario" in md


def test_an_error_wins_over_a_miss_in_junit(tmp_path: Path) -> None:
    Gate("ci", [missed_run(1)], {"/r/1": "teardown failed"}).write_junit(tmp_path / "j.xml")
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert (root.get("failures"), root.get("errors")) == ("0", "1")


def test_write_puts_each_file_where_ci_reads_it(tmp_path: Path, regressed: Comparison) -> None:
    suite_dir = tmp_path / "suite"
    suite_dir.mkdir()
    Gate("ci", [ok_run()]).write(suite_dir)
    assert sorted(p.name for p in suite_dir.iterdir()) == [SUMMARY_FILE]
    Gate("ci", [ok_run()], comparison=regressed).write(
        suite_dir, junit=tmp_path / "j.xml", summary=tmp_path / "s.md"
    )
    assert (
        sorted(p.name for p in suite_dir.iterdir())
        == [COMPARISON_FILE, SUMMARY_FILE]
        == ["baseline-comparison.md", "summary.md"]
    )
    assert (tmp_path / "s.md").read_text() == (suite_dir / SUMMARY_FILE).read_text()
    assert "| restart/kill | time_to_resume_s |" in (suite_dir / COMPARISON_FILE).read_text()
    assert ET.parse(tmp_path / "j.xml").getroot().get("tests") == "2"  # the run and the comparison


# ------------------------------------------------------------------------------------------------ callers
def cli_gate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    metrics: list[RunMetrics],
    records: list = (),
    baseline: Path | None = None,
    interrupted: bool = False,
) -> int:  # type: ignore[assignment]
    """``chaosbench run``'s gate over ``metrics`` (as the runner computed them when each run ended)."""
    argv = ["run", "ci.yaml", "--junit", str(tmp_path / "ci.xml"), "--summary", str(tmp_path / "ci.md")]
    args: argparse.Namespace = cli.build_parser().parse_args(
        argv + (["--baseline", str(baseline)] if baseline else [])
    )
    suite_dir = tmp_path / "now"
    suite_dir.mkdir(exist_ok=True)
    return cli._gate(args, suite_dir, "ci", list(records), list(metrics), interrupted)


def test_cli_prints_what_it_gates_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    result_set(tmp_path / "now", SLOWER)
    base = result_set(tmp_path / "base.csv", BASE)
    records = [SimpleNamespace(run_dir="/r/2", result=JobResult("error", "harness exploded"))]
    code = cli_gate(tmp_path, monkeypatch, [ok_run(0), missed_run(1)], records, baseline=base)
    err = capsys.readouterr().err
    assert code == EXIT_HARNESS
    assert "chaosbench: error: /r/2: harness exploded" in err
    assert f"SLO missed: restart/kill #1: {MISS} (/r/1)" in err
    assert (
        "regression: restart/kill: time_to_resume_s 3.1 -> 5.1 (+65%), p=0.05, Holm p=0.05: regression" in err
    )
    assert "baseline: 1 regressions, 0 comparisons undecidable" in err
    assert (tmp_path / "now" / "baseline-comparison.md").is_file() and (
        tmp_path / "now" / "summary.md"
    ).is_file()
    assert ET.parse(tmp_path / "ci.xml").getroot().get("failures") == "2"  # the SLO miss and the regression
    assert cli_gate(tmp_path, monkeypatch, [ok_run(0), missed_run(1)], baseline=base) == EXIT_REGRESSION
    assert cli_gate(tmp_path, monkeypatch, [ok_run(0), missed_run(1)]) == EXIT_SLO
    assert cli_gate(tmp_path, monkeypatch, [ok_run(0)]) == EXIT_OK
    assert cli_gate(tmp_path, monkeypatch, [ok_run(0)], interrupted=True) == EXIT_HARNESS
    assert "interrupted; finished runs are kept and reported" in capsys.readouterr().err


def test_cli_compare_uses_the_same_comparison(tmp_path: Path, capsys) -> None:
    base, now = result_set(tmp_path / "base.csv", BASE), result_set(tmp_path / "now", SLOWER)
    assert cli.main(["compare", str(base), str(now), "--out", str(tmp_path / "cmp.md")]) == EXIT_OK
    out = capsys.readouterr().out
    assert (
        out.strip()
        == Comparison.of(base, now).markdown().strip()
        == (tmp_path / "cmp.md").read_text().strip()
    )
    assert f"## {now} against {base}" in out and "| **regression** |" in out
    other = tmp_path / "other.csv"
    pd.DataFrame([{"scenario": "torchrun/hang", "control": False, "time_to_resume_s": 1.0}]).to_csv(other)
    assert cli.main(["compare", str(base), str(other)]) == EXIT_HARNESS
    assert "have no scenario in common" in capsys.readouterr().err


class _State:
    """What a plugin item asks of its suite: one finished run, and where the results are."""

    def __init__(self, rec: object, m: RunMetrics, suite_dir: Path | None = None) -> None:
        self.rec, self.m = rec, m
        self.suite = SimpleNamespace(name="ci", source="ci.yaml")
        self.runner = SimpleNamespace(suite_dir=suite_dir)

    def run(self, scenario: object) -> tuple[object, RunMetrics]:
        return self.rec, self.m


def plugin_failure(request: pytest.FixtureRequest, m: RunMetrics, status: str = "completed") -> str | None:
    """The failure message of the plugin's item for one run, None when it passes."""
    rec = SimpleNamespace(
        run_dir=m.run_dir, result=JobResult(status, "harness exploded" if status == "error" else "")
    )
    scenario = SimpleNamespace(id=m.scenario, repeat=m.repeat)
    item = ChaosItem.from_parent(
        request.session, name=f"ci::{m.scenario}#{m.repeat}-{status}", state=_State(rec, m), scenario=scenario
    )
    try:
        item.runtest()
    except ChaosFailure as exc:
        return str(exc)
    return None


def fuzz_violations(m: RunMetrics, tmp_path: Path) -> list[str]:
    suite = make_suite("""
        name: ci
        frameworks: {restart: {}}
        faults: {kill: {injector: kill, target: 1, trigger: {at_step: 5}}}
        slos: {lost_steps: {max: 10}}
        matrix: {frameworks: [restart], faults: [kill]}
    """)
    return Fuzzer(suite, "restart", tmp_path / "fz").violations(m)


@pytest.mark.parametrize("case", ["met", "missed", "no slos", "harness error"])
def test_the_three_callers_agree(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    m = {"met": ok_run(0), "missed": missed_run(0), "no slos": run(0), "harness error": ok_run(0)}[case]
    status = "error" if case == "harness error" else "completed"
    records = [SimpleNamespace(run_dir=m.run_dir, result=JobResult(status, "harness exploded"))]
    code = cli_gate(tmp_path, monkeypatch, [m], records)
    message = plugin_failure(request, m, status)
    assert (
        code == {"met": EXIT_OK, "missed": EXIT_SLO, "no slos": EXIT_OK, "harness error": EXIT_HARNESS}[case]
    )
    assert (message is None) == (code == EXIT_OK)
    if case == "missed":
        assert (
            message is not None
            and message.startswith(f"restart/kill #0: {MISS}")
            and "run directory: /r/0" in message
        )
    if case == "harness error":
        assert message == "harness error: harness exploded (run directory: /r/0)"
    if status != "error":  # the fuzzer runs no harness: its SLO verdict is the gate's
        assert fuzz_violations(m, tmp_path) == missed_slos(m) == ([MISS] if code == EXIT_SLO else [])


@pytest.mark.parametrize("now", ["slower", "same"])
def test_cli_and_the_plugins_baseline_item_agree(
    now: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    suite_dir = result_set(tmp_path / "now", SLOWER if now == "slower" else BASE)
    base = result_set(tmp_path / "base.csv", BASE)
    code = cli_gate(tmp_path, monkeypatch, [ok_run()], baseline=base)
    item = BaselineItem.from_parent(
        request.session,
        name=f"ci::baseline-{now}",
        state=_State(None, ok_run(), suite_dir),
        baseline=str(base),
        threshold=0.2,
        alpha=0.05,
    )
    failure = None
    try:
        item.runtest()
    except ChaosFailure as exc:
        failure = str(exc)
    assert code == (EXIT_REGRESSION if now == "slower" else EXIT_OK)
    assert (failure is None) == (code == EXIT_OK)
    if failure is not None:
        assert failure == (
            f"regressions against {base}:\n  restart/kill: time_to_resume_s 3.1 -> 5.1 (+65%), p=0.05, "
            "Holm p=0.05: regression"
        )
