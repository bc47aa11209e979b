"""SLO evaluation and the baseline comparison on hand-made results (the CI outputs: test_gate.py)."""

from __future__ import annotations

from chaosbench.analysis.baseline import Status, compare, markdown
from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.slo import evaluate


def run(**kw) -> RunMetrics:
    m = RunMetrics(scenario="restart/kill", framework="restart", fault="kill", repeat=0, outcome="recovered")
    for k, v in kw.items():
        setattr(m, k, v)
    return m


def test_slo_bounds_equalities_and_missing_values() -> None:
    slos = {
        "time_to_resume_s": {"max": 30.0},
        "lost_steps": {"min": 1.0, "max": 10.0},
        "fidelity": "exact",
        "detected": True,
    }
    ok = evaluate(run(time_to_resume_s=5.0, lost_steps=5, fidelity="exact", detected=True), slos)
    assert all(r.ok for r in ok) and len(ok) == 4
    bad = evaluate(
        run(
            time_to_resume_s=31.0,
            lost_steps=0,
            fidelity="diverged",
            detected=None,
            missing={"detected": "no detection"},
        ),
        slos,
    )
    texts = [r.describe() for r in bad if not r.ok]
    assert texts == [
        "time_to_resume_s = 31.0 (want <= 30.0)",
        "lost_steps = 0 (want >= 1.0 and <= 10.0)",
        'fidelity = diverged (want == "exact")',
        "detected = not measured (want == true): no detection",
    ]
    ctl = evaluate(RunMetrics(control=True, outcome="failed"), slos)
    assert [r.ok for r in ctl] == [False]


def rows(scenario: str, values: list[float], **extra) -> list[dict]:
    return [
        {
            "scenario": scenario,
            "fault": "kill",
            "control": False,
            "outcome": "recovered",
            "fidelity": "exact",
            "time_to_resume_s": v,
            **extra,
        }
        for v in values
    ]


def test_regression_needs_threshold_and_confidence() -> None:
    base = rows("restart/kill", [3.0, 3.1, 3.2])
    slower = rows("restart/kill", [5.0, 5.1, 5.2])
    d = {x.metric: x for x in compare(base, slower)}["time_to_resume_s"]
    assert d.regression and d.change > 0.5 and d.p_worse <= 0.05
    # within the threshold: not a regression even if consistent
    d2 = {x.metric: x for x in compare(base, rows("restart/kill", [3.3, 3.4, 3.5]))}["time_to_resume_s"]
    assert not d2.regression
    # 2 repeats each cannot reach p <= 0.05: reported as undecidable, with the repeats it needs, not failed
    d3 = {x.metric: x for x in compare(base[:2], slower[:2])}["time_to_resume_s"]
    assert not d3.regression and d3.status is Status.UNDECIDED and d3.needs == 5
    assert (
        d3.note
        == "not decidable with 2 vs 2 repeats (smallest possible p 0.167 > 0.05): needs 5 new repeats against the baseline's 2"
    )
    # faster is never a regression
    d4 = {x.metric: x for x in compare(slower, base)}["time_to_resume_s"]
    assert not d4.regression and d4.change < 0


def test_broken_recovery_is_a_regression_the_repeats_can_show() -> None:
    """Broken recovery is tested like every share (Fisher's exact test, Holm over the verdict): 5 vs 5 repeats
    show it; 2 vs 2 cannot (the smallest p is 1/6), and only the resume time no longer measured fails then."""
    broken = {
        "scenario": "restart/kill",
        "control": False,
        "outcome": "not_recovered",
        "fidelity": "diverged",
    }
    regs = [d for d in compare(rows("restart/kill", [3.0, 3.1, 3.2, 3.3, 3.4]), [broken] * 5) if d.regression]
    assert {d.metric for d in regs} == {"recovered", "fidelity exact", "time_to_resume_s"}
    assert "| restart/kill | recovered | 5/5 | 0/5 | -100 pp |" in markdown(regs, "t")
    few = {
        d.metric: d
        for d in compare(rows("restart/kill", [3.0, 3.1]), [rows("restart/kill", [3.0])[0], broken])
    }
    assert [m for m, d in few.items() if d.regression] == []
    assert few["recovered"].status is Status.UNDECIDED and few["fidelity exact"].status is Status.UNDECIDED
    gone = {d.metric: d for d in compare(rows("restart/kill", [3.0, 3.1]), [broken] * 2)}
    assert [m for m, d in gone.items() if d.regression] == ["time_to_resume_s"]
    assert gone["time_to_resume_s"].status is Status.NO_LONGER_MEASURED
