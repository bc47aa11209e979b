"""The regression gate's rules on hand-built result sets (issue 30): every outcome-level figure compared with an
exact test, a figure no longer measured, the whole verdict's false-alarm rate under Holm's correction, the noise
floor, what the repeats cannot decide, and the power statement checked against exact computations.

Each blind-spot test below failed on the gate before these rules (the old ``compare``: recovery compared only
when the baseline recovered every time, fidelity only when every baseline run had one, a figure missing now
skipped, detection, blame and false detections never compared), as did the false-alarm test (the old gate's
whole-verdict rate on the same draws: 0.246).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.baseline import Status, compare, load_rows, noise
from chaosbench.analysis.power import power, share_power, suite_repeats
from chaosbench.specs import load_suite

ROOT = Path(__file__).resolve().parents[2]
CI_BASELINE = (
    ROOT / "tests/fixtures/baselines/ci.csv"
)  # hand-built in the shape of a results.csv of suites/ci.yaml


def row(scenario: str = "restart/kill", **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "scenario": scenario,
        "fault": "kill",
        "control": False,
        "outcome": "recovered",
        "detected": True,
        "fidelity": "exact",
        "blame": "correct",
        "false_detections": 0,
        "gave_up": False,
        "contaminated": False,
    }
    r.update(kw)
    return r


def failed(base: list[dict[str, Any]], now: list[dict[str, Any]]) -> dict[str, Any]:
    return {d.metric: d for d in compare(base, now) if d.regression}


# ------------------------------------------------------------------------------------------- blind spots
def test_a_recovery_drop_from_an_imperfect_baseline_is_a_regression() -> None:
    """8 of 10 recovered before, 0 of 10 now: the old gate compared recovery only after a perfect baseline."""
    base = [row(time_to_resume_s=3.0 + i / 10) for i in range(8)] + [
        row(outcome="not_recovered", fidelity=None)
    ] * 2
    now = [row(outcome="not_recovered", fidelity=None)] * 10
    regs = failed(base, now)
    assert "recovered" in regs
    d = regs["recovered"]
    # Fisher's one-sided p of 8/10 -> 0/10: the most extreme table, C(10,8) / C(20,8)
    assert d.p_worse == pytest.approx(math.comb(10, 8) / math.comb(20, 8))
    assert (d.a_count, d.n_a, d.b_count, d.n_b) == (8, 10, 0, 10)


def test_with_3_repeats_2_of_3_to_0_of_3_is_undecided_not_passed_silently() -> None:
    base = [row(), row(), row(outcome="not_recovered")]
    now = [row(outcome="not_recovered")] * 3
    d = {x.metric: x for x in compare(base, now)}["recovered"]
    assert not d.regression and d.status is Status.UNDECIDED
    # the best 3 new repeats could do against 2/3: C(3,2)/C(6,2) = 0.2; 2/3 -> 0/n reaches 0.05 at n = 9
    assert d.note == (
        "not decidable with 3 vs 3 repeats (smallest possible p 0.2 > 0.05): needs 9 new repeats "
        "against the baseline's 3"
    )
    assert math.comb(3, 2) / math.comb(3 + 9, 2) <= 0.05 < math.comb(3, 2) / math.comb(3 + 8, 2)


def test_outlasted_is_not_recovered() -> None:
    base = [row() for _ in range(10)]
    now = [row(outcome="outlasted", detected=False) for _ in range(10)]
    d = {x.metric: x for x in compare(base, now)}["recovered"]
    assert d.regression and (d.a_count, d.b_count) == (10, 0)


def test_exact_to_diverged_with_a_baseline_run_without_fidelity() -> None:
    base = [row() for _ in range(9)] + [row(fidelity=None)]
    now = [row(fidelity="diverged") for _ in range(10)]
    regs = failed(base, now)
    assert any(m.startswith("fidelity") for m in regs)
    assert regs["fidelity exact"].p_worse == pytest.approx(1 / math.comb(19, 9))


def test_a_figure_the_baseline_had_and_the_new_results_lack_is_a_regression() -> None:
    base = [row(time_to_detect_s=0.5 + i / 100, time_to_resume_s=3.0) for i in range(3)]
    now = [row(time_to_resume_s=3.0) for _ in range(3)]
    regs = failed(base, now)
    assert list(regs) == ["time_to_detect_s"]
    d = regs["time_to_detect_s"]
    assert (
        d.status is Status.NO_LONGER_MEASURED and d.note == "measured in 3/3 baseline runs, in none of 3 now"
    )


def test_measured_in_some_baseline_runs_only_is_a_note_not_a_regression() -> None:
    base = [row(time_to_detect_s=0.5), row(time_to_detect_s=0.6), row()]
    now = [row() for _ in range(3)]
    d = {x.metric: x for x in compare(base, now)}["time_to_detect_s"]
    assert not d.regression and d.note == "measured in 2/3 baseline runs, in none of 3 now: not compared"


@pytest.mark.parametrize(
    ("field", "before", "after", "figure"),
    [
        ("detected", True, False, "detected"),
        ("blame", "correct", "wrong", "blame correct"),
        ("false_detections", 0, 2, "false detection"),
        ("gave_up", False, True, "gave up"),
        ("contaminated", False, True, "contaminated"),
    ],
)
def test_every_outcome_level_figure_is_compared(field: str, before: Any, after: Any, figure: str) -> None:
    base = [row(**{field: before}) for _ in range(10)]
    now = [row(**{field: after}) for _ in range(10)]
    regs = failed(base, now)
    assert figure in regs
    assert regs[figure].p_worse == pytest.approx(1 / math.comb(20, 10))


# ------------------------------------------------------------------------------------ noise floor, Holm
def test_a_timing_change_inside_the_baselines_noise_does_not_count() -> None:
    # one slow run among ten: the quartiles (inclusive) are 2.675 and 3.65, the noise twice their distance,
    # 1.95, around a median of 3.2; the range would be 6.0
    values = (2.0, 2.3, 2.6, 2.9, 3.1, 3.3, 3.5, 3.7, 3.9, 8.0)  # no ties: the exact test
    base = [row(time_to_resume_s=v) for v in values]
    assert noise(values) == pytest.approx(1.95)
    # +0.8 s (+25 %): over the 20 % threshold (0.64) but inside the noise
    now = [row(time_to_resume_s=v + 0.8) for v in values]
    d = {x.metric: x for x in compare(base, now)}["time_to_resume_s"]
    assert not d.regression and d.status is Status.WITHIN_NOISE and d.noise == pytest.approx(1.95)
    assert d.p_worse is not None and d.p_worse < 0.05  # significant, but no bigger than the baseline's noise
    # +2.1 s: beyond the noise though inside the baseline's range (2.0 .. 8.0), which was the floor before and
    # let a planted +2 s restart delay through (benchmarks/gate_power.py)
    later = [row(time_to_resume_s=v + 2.1) for v in values]
    assert failed(base, later).keys() == {"time_to_resume_s"}
    # +25 % beyond a tight baseline's noise counts
    tight = [row(time_to_resume_s=3.0 + i / 100) for i in range(10)]
    slower = [row(time_to_resume_s=(3.0 + i / 100) * 1.25) for i in range(10)]
    assert failed(tight, slower).keys() == {"time_to_resume_s"}


def test_the_noise_does_not_grow_with_the_baselines_repeats() -> None:
    """One slow run more in a larger baseline widens its range for good; its interquartile range barely moves."""
    ten = [3.0 + i / 10 for i in range(10)]
    assert noise(ten) == pytest.approx(0.9)  # twice 0.45
    assert noise([*ten, 9.0]) == pytest.approx(1.0)  # the range would go from 0.9 to 6.0
    assert noise([3.0]) == 0.0 and noise([]) == 0.0
    # with two or three repeats the quartiles are halfway to the ends: the noise is the range
    assert noise([3.0, 4.0]) == pytest.approx(1.0) and noise([3.0, 3.5, 4.0]) == pytest.approx(1.0)


def test_holm_corrects_over_every_comparison_of_the_verdict() -> None:
    """Two scenarios each with p = 0.05 (3 vs 3, complete separation): alone each would be a regression; in a
    family of two, Holm's adjusted p is 0.1 and neither is, and 3 repeats cannot decide them."""
    base = [row(s, time_to_resume_s=3.0 + i / 10) for s in ("a/kill", "b/kill") for i in range(3)]
    now = [row(s, time_to_resume_s=5.0 + i / 10) for s in ("a/kill", "b/kill") for i in range(3)]
    diffs = [d for d in compare(base, now) if d.metric == "time_to_resume_s"]
    assert not any(d.regression for d in diffs)
    assert [(d.p_worse, d.p_holm) for d in diffs] == [pytest.approx((0.05, 0.1))] * 2
    assert all(d.status is Status.UNDECIDED and not d.regression for d in diffs)
    assert diffs[0].note.endswith(
        "needs 5 new repeats against the baseline's 3"
    )  # 1/C(8,3) = 1/56 <= 0.025 < 1/35
    assert failed(base[:3], now[:3]).keys() == {"time_to_resume_s"}  # one scenario: family of one


def _draw(rng: random.Random, n: int, scenarios: tuple[str, ...]) -> list[dict[str, Any]]:
    """A result set from one fixed distribution: recovered with probability 0.7 (resume time lognormal, sigma
    0.5, only then), detected with probability 0.9 (detection time lognormal)."""
    out = []
    for s in scenarios:
        for _ in range(n):
            recovered = rng.random() < 0.7
            detected = rng.random() < 0.9
            out.append(
                row(
                    s,
                    outcome="recovered" if recovered else "not_recovered",
                    detected=detected,
                    time_to_resume_s=3.0 * math.exp(rng.gauss(0, 0.5)) if recovered else None,
                    time_to_detect_s=0.5 * math.exp(rng.gauss(0, 0.5)) if detected else None,
                )
            )
    return out


def test_the_whole_verdicts_false_alarm_rate_is_at_most_alpha() -> None:
    """2,000 pairs of result sets drawn from the same distribution (2 scenarios x 8 repeats a side: every
    comparison decidable), each judged as the gate does: the share of verdicts with any regression is <= alpha
    (0.05). Measured: 0.017 (34 of 2,000) with twice the baseline's interquartile range as its noise (once: 46;
    its whole range: 28); the old gate on the same draws (per comparison at 0.05, no correction): 0.246 (492 of
    2,000)."""
    rng = random.Random(30)
    scenarios = ("restart/kill", "torchrun/kill")
    alarms = 0
    pairs = 2000
    for _ in range(pairs):
        if any(d.regression for d in compare(_draw(rng, 8, scenarios), _draw(rng, 8, scenarios))):
            alarms += 1
    assert alarms / pairs <= 0.05
    assert alarms == 34  # the seeded figure the docstring states


# ------------------------------------------------------------------------------------------------- power
def _fisher_p(good_a: int, n_a: int, good_b: int, n_b: int) -> float:
    """One-sided Fisher's p that B is worse, from the hypergeometric tail written out."""
    k, n = good_a + good_b, n_a + n_b
    return sum(
        math.comb(k, x) * math.comb(n - k, n_a - x) for x in range(good_a, min(k, n_a) + 1)
    ) / math.comb(n, n_a)


def test_share_power_against_exact_computation() -> None:
    # 3 repeats, one comparison at 0.05: 100 % -> 0 % detectable (p = 1/20), 100 % -> 33 % is not (p = 4/20)
    sp = share_power(3, 3, 0.05)
    assert sp.detectable_at_most == 0 and sp.p == pytest.approx(_fisher_p(3, 3, 0, 3)) == pytest.approx(0.05)
    assert _fisher_p(3, 3, 1, 3) == pytest.approx(0.2)
    # 10 repeats at 0.05 / 20: detectable down to k good of 10, exactly where the exact p crosses the level
    level = 0.05 / 20
    sp10 = share_power(10, 10, level)
    k = sp10.detectable_at_most
    assert k is not None and _fisher_p(10, 10, k, 10) <= level < _fisher_p(10, 10, k + 1, 10)
    # 3 vs 3 at 0.05 / 68 cannot even tell 100 % from 0 %: n new repeats can when 1 / C(3 + n, 3) <= the level
    sp3 = share_power(3, 3, 0.05 / 68)
    assert sp3.detectable_at_most is None and sp3.needs == 19 and sp3.needs_each == 7
    assert 1 / math.comb(22, 3) <= 0.05 / 68 < 1 / math.comb(21, 3)
    assert 1 / math.comb(14, 7) <= 0.05 / 68 < 1 / math.comb(12, 6)


def test_the_power_line_for_the_ci_suite() -> None:
    """suites/ci.yaml's real repeats (3 per scenario) against a baseline of 3 repeats: nothing a test decides is
    decidable at the corrected level; only a figure no longer measured fails."""
    reps = suite_repeats(load_suite(ROOT / "suites/ci.yaml"))
    assert reps == {
        "restart/kill-rank1": 3,
        "restart/torn-write": 3,
        "torchrun/kill-rank1": 3,
        "torchrun/torn-write": 3,
    }
    p = power(load_rows(CI_BASELINE), reps)
    lines = p.lines()
    # 4 scenarios x (8 shares + 9 timings the baseline measured)
    assert p.family_max == 68 and p.level == pytest.approx(0.05 / 68)
    assert lines[0] == (
        "gate power: 3 baseline vs 3 new repeats per scenario; alpha 0.05 for the whole verdict, "
        "Holm over at most 68 comparisons (first level 0.05/68 = 0.00074):"
    )
    assert lines[1].endswith(
        "not even 100 % -> 0 % of 3 is detectable (p = 0.05 > 0.00074): needs 19 new repeats "
        "against the baseline's 3, or 7 on both sides"
    )
    assert lines[2] == (
        "  3 vs 3: timings: not detectable (smallest p = 1/C(6,3) = 0.05 > 0.00074): needs 19 new "
        "repeats against the baseline's 3, or 7 on both sides"
    )
    # torchrun/torn-write's detection times 0.07, 0.08, 0.10 s: twice their interquartile range (with three
    # repeats: their range), 0.03 s, over the median 0.08 s: +37 %
    assert "time_to_detect_s +20% to +37%, time_to_resume_s +20% to +22%," in lines[3]
    assert lines[4] == "  a figure measured in every baseline run and in none now fails without statistics"
    # the fixture's shares are the same in every run (all recovered, ...), and of its 9 timings per scenario
    # lost_steps and restart_count too: 4 x 7 = 28 vary; 3 vs 3 decides only in a family of one (1/20 = alpha)
    assert lines[5] == (
        "  the family is known after the runs (a figure the same in every run of both sides is left "
        "out; 28 of the at most 68 vary among the baseline's runs): complete separation of 3 vs 3 "
        "(p = 1/C(6,3)) decides in a family of up to 1"
    )


def test_power_with_enough_repeats_says_what_is_detectable() -> None:
    base = [row(s, time_to_resume_s=3.0) for s in ("a/kill",) for _ in range(10)]
    lines = power(base, {"a/kill": 10}).lines()
    # family: 8 shares + 1 timing = 9; level 0.05/9; 100 % -> k/10 detectable by the exact test
    level = 0.05 / 9
    k = next(k for k in range(10, -1, -1) if _fisher_p(10, 10, k, 10) <= level)
    assert (
        f"100 % -> {k / 10:.0%} of 10 detectable" in lines[1]
        and f"100 % -> {(k + 1) / 10:.0%} is not" in lines[1]
    )
    assert "timings: a change beyond its noise floor is detectable when every new run is worse" in lines[2]


def test_run_with_a_baseline_states_the_power_before_it_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from chaosbench.cli import main

    argv = [
        "run",
        str(ROOT / "suites/ci.yaml"),
        "--dry-run",
        "--out",
        str(tmp_path),
        "--baseline",
        str(CI_BASELINE),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "gate power: 3 baseline vs 3 new repeats per scenario" in err
    assert err.index("gate power:") < err.index(
        "a figure measured in every baseline run and in none now fails"
    )


def test_power_says_when_no_number_of_repeats_up_to_1000_would_do() -> None:
    # a baseline of one run: 1 / (1 + n) <= 0.05 / 200 needs n >= 3,999 new repeats, beyond the search
    lines = power([row("a/kill", time_to_resume_s=3.0)], {"a/kill": 1}, family_size=200).lines()
    assert "needs more than 1000 new repeats against the baseline's 1, or 8 on both sides" in lines[1]
    assert not any("None" in line for line in lines)
