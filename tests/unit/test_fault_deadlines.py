"""A fault's own ``deadline_s``: its runs end there instead of at ``defaults.deadline_s`` (a run of several faults
at the longest of theirs, a control at the suite's); the never-fires check and the wall-time bound use it."""

from __future__ import annotations

import pytest

from chaosbench.errors import SpecError
from chaosbench.planning import RUN_OVERHEAD_S, suite_plan
from tests.conftest import make_suite

SUITE = """
name: d
control: true
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 30}
frameworks: {restart: {}}
faults:
  kill: {injector: kill, target: 1, trigger: {at_step: 5}}
  stall: {injector: hang, target: 1, trigger: {at_step: 5}, deadline_s: 20}
  stall-long: {injector: hang, target: 1, trigger: {at_step: 6}, deadline_s: 90}
matrix:
  frameworks: [restart]
  faults: [kill, stall, [stall, kill], [stall, stall-long]]
  repeats: 2
"""


def test_each_run_gets_its_faults_deadline() -> None:
    suite = make_suite(SUITE)
    got = {(sc.id, sc.repeat): sc.deadline_s for sc in suite.scenarios()}
    assert got == {
        ("restart/control", 0): 60,
        ("restart/kill", 0): 60,
        ("restart/kill", 1): 60,
        ("restart/stall", 0): 20,
        ("restart/stall", 1): 20,
        ("restart/stall+kill", 0): 60,  # kill has none: the suite's counts
        ("restart/stall+kill", 1): 60,
        ("restart/stall+stall-long", 0): 90,
        ("restart/stall+stall-long", 1): 90,
    }
    # the progress line's plan and the run's own deadline agree
    assert [(p.label, p.deadline_s) for p in suite_plan(suite)][:4] == [
        ("restart/control #0", 60),
        ("restart/kill #0", 60),
        ("restart/kill #1", 60),
        ("restart/stall #0", 20),
    ]


def test_the_wall_bound_adds_up_each_runs_own_deadline() -> None:
    suite = make_suite(SUITE)
    deadlines = [60, 60, 60, 20, 20, 60, 60, 90, 90]
    assert suite.wall_bound_s(RUN_OVERHEAD_S) == sum(d + RUN_OVERHEAD_S for d in deadlines)
    # 4 at once: 9 runs are at most 3 rounds of the longest
    assert suite.wall_bound_s(RUN_OVERHEAD_S, jobs=4) == 3 * (90 + RUN_OVERHEAD_S)


def test_without_fault_deadlines_the_bound_is_as_before() -> None:
    suite = make_suite(SUITE.replace(", deadline_s: 20", "").replace(", deadline_s: 90", ""))
    assert suite.wall_bound_s(RUN_OVERHEAD_S) == 9 * (60 + RUN_OVERHEAD_S)
    assert suite.wall_bound_s(RUN_OVERHEAD_S, jobs=2) == 5 * (60 + RUN_OVERHEAD_S)


def test_a_trigger_past_its_faults_deadline_can_never_fire() -> None:
    text = SUITE.replace("trigger: {at_step: 5}, deadline_s: 20", "trigger: {after_s: 25}, deadline_s: 20")
    with pytest.raises(SpecError) as e:
        make_suite(text, "s.yaml")
    assert "fault 'stall': after_s 25: the run's deadline is 20 s; this fault can never fire" in str(e.value)
    # the same trigger within the suite's deadline is fine for a fault without its own
    make_suite(
        SUITE.replace(
            "kill: {injector: kill, target: 1, trigger: {at_step: 5}}",
            "kill: {injector: kill, target: 1, trigger: {after_s: 25}}",
        )
    )


@pytest.mark.parametrize("value", ["0", "-5", "true", "soon"])
def test_a_bad_fault_deadline_is_refused_with_its_line(value: str) -> None:
    with pytest.raises(SpecError) as e:
        make_suite(SUITE.replace("deadline_s: 20", f"deadline_s: {value}"), "s.yaml")
    assert str(e.value).startswith("s.yaml:10: fault 'stall': deadline_s: "), str(e.value)
