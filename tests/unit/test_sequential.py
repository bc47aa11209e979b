"""Repeating a scenario until its verdict is decided (``repeats: {max: N, until: decided}``, issue 30 item 3): the
spec, the stopping rule (:mod:`chaosbench.analysis.sequential`), alpha spent over the looks, the whole verdict's
false-alarm rate over seeded same-distribution simulations stopped by the real rule, and the runner's loop
(serial, ``--jobs``, ``--resume``) with its runs faked."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.baseline import SHARES, compare
from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.sequential import REPEATS_FILE, StoppingRule, recorded_looks
from chaosbench.errors import SpecError
from chaosbench.frameworks.base import JobResult
from chaosbench.rundir import RunDir, write_atomic
from chaosbench.runner import Runner, RunRecord
from chaosbench.specs import Scenario, UntilDecided
from tests.conftest import make_suite
from tests.unit.test_baseline_rules import _draw, row

SUITE = """
name: seq
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 20}
frameworks: {restart: {}, none: {}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 5}}
SLOS
matrix: {frameworks: [restart, none], faults: [kill], repeats: REPEATS}
"""


def _suite(repeats: str = "{max: 5, until: decided}", slos: str = "") -> Any:
    return make_suite(SUITE.replace("REPEATS", repeats).replace("SLOS", slos), "suites/x.yaml")


# ------------------------------------------------------------------------------------------------- the spec
def test_repeats_a_number_or_until_decided() -> None:
    assert _suite("3").matrix.repeats == 3 and _suite("3").until_decided() == {}
    s = _suite()
    d = s.matrix.repeats
    assert isinstance(d, UntilDecided) and (d.max, d.min_repeats, d.looks) == (5, 2, 4)
    assert s.until_decided() == {"restart/kill": d, "none/kill": d}
    assert s.run_count() == 2 * (1 + 5)  # a cell until decided counts its max
    assert _suite("{max: 1, until: decided}").matrix.repeats.min_repeats == 1  # type: ignore[union-attr]
    assert _suite("{max: 6, min: 3, until: decided}").matrix.repeats.looks == 4  # type: ignore[union-attr]
    part = make_suite(
        SUITE.replace("SLOS", "").replace(
            "repeats: REPEATS}",
            "repeats: 2, include: [{frameworks: [none], faults: [kill], repeats: {max: 4, until: decided}}]}",
        )
    )
    assert part.until_decided() == {"none/kill": UntilDecided(max=4, until="decided")}


@pytest.mark.parametrize(
    ("repeats", "message"),
    [
        ("{max: 3, min: 5, until: decided}", "suites/x.yaml:10: matrix: repeats: min (5) is above max (3)"),
        ("{max: 8, until: sometimes}", "suites/x.yaml:10: matrix: repeats.until: Input should be 'decided'"),
        ("{max: 8}", "suites/x.yaml:10: matrix: repeats.until: required key is missing"),
        ("{max: 8, until: decided, mni: 2}", "suites/x.yaml:10: matrix: repeats.mni: unknown key"),
        (
            "{max: 0, until: decided}",
            "suites/x.yaml:10: matrix: repeats.max: Input should be greater than or equal to 1",
        ),
        ("0", "suites/x.yaml:10: matrix: repeats: Input should be greater than or equal to 1"),
    ],
)
def test_bad_repeats_are_one_line_naming_the_field(repeats: str, message: str) -> None:
    with pytest.raises(SpecError) as exc:
        _suite(repeats)
    assert str(exc.value) == message


def test_every_share_has_a_good_and_a_bad_run() -> None:
    for share in SHARES:
        assert share.holds(dict(share.good_run)) is share.good, share.name
        assert share.holds(dict(share.bad_run)) is (not share.good), share.name


# ------------------------------------------------------------------------------------------ the stopping rule
DESIGN = UntilDecided(max=8, until="decided")


def test_nothing_to_decide_runs_max() -> None:
    rule = StoppingRule(None)
    s = rule.settle("a/kill", DESIGN, [row("a/kill")] * 3, has_slos=False)
    assert not s.decided and not s.stops and s.nothing_to_decide
    last = rule.settle("a/kill", DESIGN, [row("a/kill")] * 8, has_slos=False)
    assert (
        last.stops
        and last.describe()
        == "a/kill: max reached: 8 repeats (nothing to decide (no baseline for it, no SLOs))"
    )


def test_an_slo_miss_settles_the_slos_met_ones_do_not() -> None:
    rule = StoppingRule(None)
    met = [row("a/kill", slo_ok=True)] * 7
    assert rule.settle("a/kill", DESIGN, met, has_slos=True).unsettled == ("SLOs (all met so far)",)
    assert rule.settle("a/kill", DESIGN, met + [row("a/kill", slo_ok=True)], True).stops  # max
    missed = [row("a/kill", slo_ok=False)]
    assert not rule.settle("a/kill", DESIGN, missed, True).decided  # before min
    s = rule.settle("a/kill", DESIGN, missed + [row("a/kill", slo_ok=True)], True)
    assert (
        s.decided
        and s.slo_missed
        and s.describe() == "a/kill: decided after 2 of at most 8 repeats (an SLO missed)"
    )


def _clean(rng: random.Random, key: str = "a/kill") -> dict[str, Any]:
    return row(key, time_to_resume_s=3.0 * math.exp(rng.gauss(0, 0.2)))


def test_a_clean_scenario_against_a_large_baseline_stops_early_and_no_continuation_could_fail_it() -> None:
    rng = random.Random(5)
    base = [_clean(rng) for _ in range(12)]
    rule = StoppingRule(base, family_bound=9)  # 8 shares + time_to_resume_s
    design = UntilDecided(max=12, until="decided")
    rows: list[dict[str, Any]] = []
    while not (s := rule.settle("a/kill", design, rows, has_slos=False)).stops:
        rows.append(_clean(rng))
    assert s.decided and s.repeats < design.max and not s.regressions
    # whatever the runs not made had been (here: broken ones, the most adverse), the verdict stays clean
    for _ in range(50):
        more = [
            row(
                "a/kill",
                outcome="not_recovered",
                detected=rng.random() < 0.5,
                fidelity=None,
                time_to_resume_s=None if rng.random() < 0.5 else 100.0 + rng.random(),
            )
            for _ in range(rng.randint(1, design.max - s.repeats))
        ]
        assert not any(d.regression for d in compare(base, rows + more, looks={"a/kill": design.looks}))


def test_a_slower_recovery_is_settled_as_a_regression_before_max() -> None:
    rng = random.Random(6)
    base = [_clean(rng) for _ in range(10)]
    rule = StoppingRule(base, family_bound=9)
    design = UntilDecided(max=14, min=6, until="decided")  # 9 looks
    rows: list[dict[str, Any]] = []
    while not (s := rule.settle("a/kill", design, rows, has_slos=False)).stops:
        rows.append(row("a/kill", time_to_resume_s=20.0 + rng.random()))
    # 12 slower runs: one more, faster than any so far, would still undo it (9 x 9 x p > 0.05); 13: it would not
    assert s.repeats == 13
    assert s.decided and s.repeats < design.max and s.regressions == ("time_to_resume_s",)
    # settled: even every run not made faster than any so far leaves it a regression, in the gate too
    fast = [row("a/kill", time_to_resume_s=0.1 * i) for i in range(1, design.max - s.repeats + 1)]
    for extra in (0, len(fast)):
        found = {
            d.metric
            for d in compare(base, rows + fast[:extra], looks={"a/kill": design.looks})
            if d.regression
        }
        assert found == {"time_to_resume_s"}


def test_a_figure_no_longer_measured_is_settled_only_at_max() -> None:
    base = [row("a/kill", time_to_resume_s=3.0 + i / 10) for i in range(10)]
    rule = StoppingRule(base, family_bound=9)
    design = UntilDecided(max=10, until="decided")
    broken = [row("a/kill", outcome="not_recovered") for _ in range(10)]
    s9 = rule.settle("a/kill", design, broken[:9], has_slos=False)
    assert not s9.decided and "time_to_resume_s" in s9.unsettled and "recovered" not in s9.unsettled
    s10 = rule.settle("a/kill", design, broken, has_slos=False)
    assert s10.stops and not s10.decided and s10.regressions == ("recovered",)
    assert s10.describe() == "a/kill: max reached: 10 repeats (not settled: time_to_resume_s)"
    assert {d.metric for d in compare(base, broken, looks={"a/kill": design.looks}) if d.regression} == {
        "recovered",
        "time_to_resume_s",
    }  # the gate fails it: no longer measured


# ------------------------------------------------------------------------------------------- alpha spending
def test_every_p_of_a_scenario_repeated_until_decided_is_multiplied_by_its_looks() -> None:
    base = [row("a/kill", time_to_resume_s=3.0 + i / 10) for i in range(10)]
    now = [row("a/kill", time_to_resume_s=30.0 + i) for i in range(10)]
    fixed = {d.metric: d for d in compare(base, now)}["time_to_resume_s"]
    spent = {d.metric: d for d in compare(base, now, looks={"a/kill": 7})}["time_to_resume_s"]
    assert fixed.p_worse == spent.p_worse == pytest.approx(1 / math.comb(20, 10))
    assert spent.p_holm == pytest.approx(7 * fixed.p_holm)  # type: ignore[operator]
    assert "x 7 looks" in spent.describe()


def _sequential_verdict(
    rng: random.Random,
    base: list[dict[str, Any]],
    scenarios: tuple[str, ...],
    design: UntilDecided,
    spend: bool,
) -> tuple[bool, int]:
    """One suite against ``base`` from the same distribution, each scenario repeated until the rule stops it:
    whether the final verdict has a regression, and the runs made. ``spend`` False: every look at the full
    alpha, stopping at the first regression (the naive rule the spending corrects)."""
    looks = design.looks if spend else 1
    rule = StoppingRule(base, family_bound=len(scenarios) * 10)
    rows: list[dict[str, Any]] = []
    for key in scenarios:
        mine: list[dict[str, Any]] = []
        while True:
            mine += _draw(rng, 1, (key,))
            if len(mine) >= design.max:
                break
            if spend and len(mine) >= design.min_repeats and rule.settle(key, design, mine, False).stops:
                break
            if not spend and any(d.regression for d in compare(base, mine)):
                break
        rows += mine
    verdict = compare(base, rows, looks={k: looks for k in scenarios})
    return any(d.regression for d in verdict), len(rows)


def test_the_whole_verdicts_false_alarm_rate_with_repeats_until_decided_is_at_most_alpha() -> None:
    """300 suites drawn from the baseline's distribution (2 scenarios, 8 baseline repeats each, repeats
    until decided with max 8: 7 looks), each scenario stopped by the real rule and the whole verdict judged as
    the gate does with every p x 7: the share of verdicts with any regression is <= alpha (0.05). Measured: 0 of
    300, in 2,424 runs against 4,800 with fixed 8 repeats (with once the interquartile range as the noise: 1 of
    300, 2,424 runs; with the whole range: 0 of 300, 2,373 runs). Each look at the full alpha instead, stopping at the
    first regression (no spending), on the same baselines: 46 of 300 (0.15), three times alpha."""
    scenarios = ("restart/kill", "torchrun/kill")
    design = UntilDecided(max=8, until="decided")
    rng = random.Random(30)
    bases = [_draw(rng, 8, scenarios) for _ in range(300)]
    alarms = runs = 0
    for base in bases:
        alarm, n = _sequential_verdict(rng, base, scenarios, design, spend=True)
        alarms += alarm
        runs += n
    assert alarms / len(bases) <= 0.05
    assert (alarms, runs) == (0, 2424)  # the seeded figures the docstring states
    naive = sum(
        _sequential_verdict(random.Random(i), b, scenarios, design, spend=False)[0]
        for i, b in enumerate(bases)
    )
    assert naive == 46 and naive / len(bases) > 0.05


# ------------------------------------------------------------------------------------------- the runner loop
def _fake_runs(monkeypatch: pytest.MonkeyPatch, slo_ok: Any) -> list[str]:
    """Runs faked: each writes its result and metrics (so that --resume finds it); ``slo_ok(sc)`` its SLO
    verdict. Returns the labels run, in order."""
    ran: list[str] = []

    def fake(self: Runner, index: int, sc: Scenario, slot: dict[str, Any], follow: bool) -> None:
        rd = RunDir.of(self.suite_dir, sc)
        rd.path.mkdir(parents=True, exist_ok=True)
        m = RunMetrics(
            scenario=sc.id,
            repeat=sc.repeat,
            control=sc.control,
            outcome="recovered",
            slo_ok=None if sc.control else slo_ok(sc),
        )
        write_atomic(rd.metrics, json.dumps(m.to_dict()))
        write_atomic(rd.result, json.dumps({"status": "completed", "reason": "", "leftover_pids": []}))
        rec = RunRecord(sc, rd.path, JobResult("completed"), metrics=m, index=index)
        with self._finish_lock:
            self.records.append(rec)
        ran.append(f"{sc.id}#{sc.repeat}")

    monkeypatch.setattr(Runner, "_run_in_slot", fake)
    monkeypatch.setattr("chaosbench.analysis.results.write_table", lambda *a: None)
    return ran


SLOS = "slos: {outcome: recovered}"


@pytest.mark.parametrize("jobs", [None, 2])
def test_the_runner_repeats_until_decided(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jobs: int | None
) -> None:
    """restart/kill misses an SLO in its 2nd run: decided after 2 (min); none/kill meets them: max (5)."""
    ran = _fake_runs(monkeypatch, lambda sc: not (sc.framework_label == "restart" and sc.repeat == 1))
    runner = Runner(_suite(slos=SLOS), tmp_path)
    runner._run(False, None if jobs is None else [{}] * jobs)
    assert sorted(ran) == sorted(
        ["restart/control#0", "restart/kill#0", "restart/kill#1", "none/control#0"]
        + [f"none/kill#{i}" for i in range(5)]
    )
    doc = json.loads((runner.suite_dir / REPEATS_FILE).read_text())
    assert doc["restart/kill"]["decided"] and doc["restart/kill"]["repeats"] == 2
    assert doc["restart/kill"]["why"] == "restart/kill: decided after 2 of at most 5 repeats (an SLO missed)"
    assert not doc["none/kill"]["decided"] and doc["none/kill"]["repeats"] == 5
    assert doc["none/kill"]["why"] == "none/kill: max reached: 5 repeats (not settled: SLOs (all met so far))"
    assert recorded_looks(runner.suite_dir) == {"restart/kill": 4, "none/kill": 4}
    # resumed: every run finished earlier is kept, none is made again, and it stops where it stopped
    ran.clear()
    again = Runner(_suite(slos=SLOS), tmp_path)
    again._run(True, None)
    assert ran == [] and json.loads((again.suite_dir / REPEATS_FILE).read_text()) == doc


def test_a_resumed_suite_goes_on_where_an_undecided_scenario_was_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = _fake_runs(monkeypatch, lambda sc: True)
    runner = Runner(_suite(slos=SLOS), tmp_path)
    runner.prepare()
    for sc in [runner.suite.scenario("restart", [], 0), runner.suite.scenario("restart", ["kill"], 0)]:
        runner._run_in_slot(0, sc, {}, follow=False)
    ran.clear()
    Runner(_suite(slos=SLOS), tmp_path)._run(True, None)
    # the controls first (restart's finished earlier), then the fault cells in the suite's order
    assert ran == ["none/control#0"] + [f"restart/kill#{i}" for i in range(1, 5)] + [
        f"none/kill#{i}" for i in range(5)
    ]


def test_a_dry_run_states_each_scenario_repeated_until_decided(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from chaosbench.analysis.baseline import load_rows
    from chaosbench.cli import main
    from tests.unit.test_baseline_rules import CI_BASELINE, ROOT

    text = (
        (ROOT / "suites/ci.yaml").read_text().replace("  repeats: 3", "  repeats: {max: 8, until: decided}")
    )
    suite = tmp_path / "ci.yaml"
    suite.write_text(text)
    assert (
        main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o"), "--baseline", str(CI_BASELINE)])
        == 0
    )
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["runs_total"] == 2 + 4 * 8
    assert doc["repeats_until_decided"]["restart/kill-rank1"] == {"min": 2, "max": 8, "looks": 7}
    assert "suite 'ci': at most 34 runs" in err
    assert (
        "  restart/kill-rank1: 2 to 8 repeats, 7 looks; its SLOs are settled only by a miss (while every run "
        "meets them it runs max)"
    ) in err
    rule = StoppingRule.for_suite(make_suite(text), load_rows(CI_BASELINE))
    assert (
        rule.family_bound == 68
    )  # the power statement's bound: 4 scenarios x 17 figures the baseline measured


def test_every_frameworks_control_runs_before_the_fault_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Sequential runs as ``--jobs``: the controls first, each run keeping its index in the suite's order."""
    ran = _fake_runs(monkeypatch, lambda sc: True)
    runner = Runner(_suite(), tmp_path)
    records = runner.run()
    controls = sum(1 for r in records if r.scenario.control)
    assert ran[:controls] == [f"{fw}/control#0" for fw in runner.suite.matrix.all_frameworks()]
    assert all(not name.endswith("control#0") for name in ran[controls:])
    assert [r.index for r in records] == list(
        range(1, len(records) + 1)
    )  # sorted back into the suite's order
    assert records[0].scenario.control and not records[1].scenario.control
