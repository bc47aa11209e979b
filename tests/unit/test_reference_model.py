"""compute_metrics held to the metrics' definitions on generated runs (tests/helpers/histories.py): 1-6 ranks on
1-3 hosts with clock offsets, per-rank log cadences, checkpoints (some torn), 0-3 faults of every kind, false
detections, restarts during a restart, digests present, absent, equal and different; and per-step commit
(TorchFT): replica groups each with its own incarnations, a killed group's survivors' in-flight step skipped, the
quorum stalled until the lighthouse reacts, the replacement healing and rejoining (or back with stale state first,
or never), a group restarted before any fault. Every generated event is valid against its kind's model. Each
run's expected figures come from what the simulation did, not from its events; counts must be equal, times within
1 us (the timeline's stamps are ns, the simulation's us).

The bounded profile runs in the unit tier; the long one by hand:
``CHAOSBENCH_PROPERTY_EXAMPLES=10000 python -m pytest tests/unit/test_reference_model.py``. Every failure
hypothesis shrank to is kept below as an explicit example."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, example, given, settings

from chaosbench.analysis.metrics import compute_metrics
from chaosbench.timeline.clocks import correct
from chaosbench.timeline.schema import typed
from tests.helpers.histories import (
    FaultPlan,
    FtFaultPlan,
    FtPlan,
    Plan,
    expected,
    expected_ft,
    ft_plans,
    plans,
    simulate,
    simulate_ft,
)

EXAMPLES = int(os.environ.get("CHAOSBENCH_PROPERTY_EXAMPLES", "150"))
US = 1e-6


def _close(a: float | None, b: int | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b * US) <= 1e-6


def _plan(
    faults: tuple[FaultPlan, ...],
    ranks: int = 1,
    every: tuple[int | None, ...] = (1,),
    steps: int = 10,
    ckpt_every: int = 0,
    torn: frozenset[int] = frozenset(),
    cut: float | None = None,
) -> Plan:
    return Plan(ranks, 1, (0,), every, steps, 2000, 50000, ckpt_every, torn, faults, "a", "a", cut)


def _f(kind: str, at: int) -> FaultPlan:
    return FaultPlan(kind, at, 1000, 100000, 10000)


#: Every failure hypothesis shrank to while the engine was held to the model (issue 24), kept as examples.
SHRUNK = [
    # a checkpoint is complete when its last rank's save ended, not its first's
    _plan(
        (_f("false", 9), _f("crash", 18)),
        ranks=2,
        every=(1, 1),
        steps=27,
        ckpt_every=3,
        torn=frozenset({3, 6, 9, 12, 15, 21, 24, 27}),
    ),
    # a restart after the next fault is that fault's: the first was outlasted in place, not interrupted
    _plan((_f("outlast", 1), _f("crash", 2))),
    # an in-place fault interrupted before its job logged progress rolled nothing back: it lost nothing
    _plan((_f("crash", 1), _f("outlast", 2), _f("crash", 3)), every=(2,)),
    # a false restart after an outlasted fault's in-place progress is not its recovery
    _plan((_f("crash", 1), _f("outlast", 2), _f("false", 3))),
    # ...but without logged progress the job resumed through that restart: a reaction in its window
    _plan((_f("crash", 1), _f("outlast", 2), _f("false", 3)), every=(2,)),
    # a rank whose first line comes later still holds the incarnation's job steps up
    _plan((_f("crash", 1), _f("outlast", 4)), ranks=2, every=(5, 1)),
    # a detection after the job resumed in place is no detection of the fault (a false one)
    _plan((_f("outlast", 1), _f("false", 2))),
    # training finished (the closing line) before the deadline, the exit did not come in time
    _plan((_f("crash", 1),), cut=0.9375),
]


def _examples(fn):  # type: ignore[no-untyped-def]
    for plan in reversed(SHRUNK):
        fn = example(plan)(fn)
    return fn


def _measured(sim: Any, model: Any, plan: Any) -> tuple[Any, Any]:
    """compute_metrics on the plan's run (and its control) as ``sim`` plays it, beside the figures ``model``
    states; every generated event valid, and the outcome and each fault's status already equal."""
    events, rec = sim(plan)
    ctl_events, ctl = sim(plan, control=True)
    for e in events:
        typed(e)  # every generated event is a valid one of its kind
    want = model(rec, ctl)
    m = compute_metrics(
        correct(sorted(events, key=lambda e: e.t_ns)),
        control=correct(sorted(ctl_events, key=lambda e: e.t_ns)),
        total_steps=plan.steps,
    )
    assert m.outcome == want.outcome, (m.verdict, want)
    assert m.fault_count == (len(want.statuses) or None), m.fault_count
    assert [f["status"] for f in m.faults] == want.statuses, (m.faults, want)
    return m, want


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
@_examples
def test_compute_metrics_equals_the_definitions(plan: Plan) -> None:
    m, want = _measured(simulate, expected, plan)
    for f, ttd, ttr, lost, restarts in zip(
        m.faults, want.time_to_detect_us, want.time_to_resume_us, want.lost_steps, want.restarts, strict=True
    ):
        assert _close(f["time_to_detect_s"], ttd), (f, ttd)
        assert _close(f["time_to_resume_s"], ttr), (f, ttr)
        assert f["lost_steps"] == lost, (f, lost, m.faults)
        assert f["restarts"] == restarts, (f, restarts)
    assert m.restart_count == want.restart_count
    if want.statuses:
        assert m.false_detections == want.false_detections, (m.false_detections, want)
        assert _close(m.checkpoint_age_s, want.checkpoint_age_us), (
            m.checkpoint_age_s,
            want.checkpoint_age_us,
        )
    assert m.final_step == want.final_step
    assert m.fidelity == want.fidelity, (m.fidelity, m.missing.get("fidelity"))


def _ft(
    faults: tuple[FtFaultPlan, ...],
    groups: int = 2,
    per_group: int = 1,
    steps: int = 8,
    cut: float | None = None,
    early: int | None = None,
) -> FtPlan:
    return FtPlan(groups, per_group, 1, (0,), steps, 10_000, 50_000, 5_000, faults, "a", "a", cut, early)


def _kill(at: int, kind: str = "kill", group: int = 0) -> FtFaultPlan:
    return FtFaultPlan(kind, at, group, 1000, 0, 1000, 10000, 20000, 1)


#: Per-step commit: every failure hypothesis shrank to, kept as examples.
SHRUNK_FT = [
    # a fault's skipped steps are those of its window: the next fault's skipped step is the next fault's
    _ft((_kill(1), _kill(8)), groups=3, steps=10),
    # restarts are counted per replica group: group 1's first restart while group 0 is in its second incarnation;
    # and the first fault's stages follow its own group's replacement, not group 1's of the same number
    _ft((_kill(1), _kill(2)), groups=3, steps=6),
    # a stale group's second commit of an old step (alone, in a quorum of its own) is not the job's, nor the end of
    # its replacement's reshard_or_replace stage (it never healed before the run ended)
    _ft((_kill(1, "stale"),), steps=6),
    # a group restarted at its start (incarnation 1) and then killed: the survivor's steps alone are keyed by its
    # incarnation 0, which is no first incarnation that resumed from elsewhere (was: contaminated)
    _ft((_kill(1),), steps=6, early=0),
    # the killed group's replacement (its incarnation 1) rejoins a quorum keyed by the other group's restart at
    # its start (also 1): it rejoined all the same (was: time_to_rejoin_s missing)
    _ft((_kill(1),), steps=10, early=1),
    # the stages follow the lost group's replacement: not the next fault's, where the first group's launcher gave up
    _ft((_kill(1, "lost"), _kill(3)), groups=3, steps=12),
    # ...and not the next fault's restart of the same group: a hang loses no group (the lighthouse's false
    # detection after it is its reaction: per-step commit takes the first in its window)
    FtPlan(
        2,
        1,
        1,
        (0,),
        6,
        2000,
        10000,
        1000,
        (FtFaultPlan("hang", 1, hold_us=10000), _kill(2, "flap"), _kill(3)),
        "a",
        "a",
    ),
    # a hang of a group in the quorum while another group's replacement is on its way: that replacement's start
    # (its group's incarnation 1, the number of the group restarted at its start) is a new incarnation in the hang's
    # window, a reaction (was: outlasted, with 1 restart)
    FtPlan(
        3,
        1,
        1,
        (0,),
        6,
        2000,
        10000,
        1000,
        (
            FtFaultPlan("kill", 1, 0, 1000, 0, 1000, 79378, 20000, 1),
            FtFaultPlan("hang", 2, hold_us=57854),
            _kill(3),
        ),
        "a",
        "a",
        early=1,
    ),
    # a stale group's commit of an index the job had completed (alone, in a quorum of its own) inside another
    # group's hang is no new quorum of the job's: the hang was outlasted (was: recovered, undetected, 0 restarts)
    FtPlan(
        3,
        1,
        1,
        (0,),
        6,
        2000,
        10000,
        1000,
        (
            FtFaultPlan("stale", 1, 0, 1000, 0, 1000, 17004, 20000, 1),
            FtFaultPlan("hang", 2, hold_us=10000),
            _kill(3),
        ),
        "a",
        "a",
    ),
]


def _ft_examples(fn):  # type: ignore[no-untyped-def]
    for plan in reversed(SHRUNK_FT):
        fn = example(plan)(fn)
    return fn


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ft_plans())
@_ft_examples
def test_per_step_commit_equals_the_definitions(plan: FtPlan) -> None:
    """TorchFT's per-step commit: replica groups each their own incarnation, a killed group's survivors' in-flight
    step skipped, the quorum stalled until the lighthouse reacts, the replacement healing and rejoining (or
    returning with stale state first, or never), held to the definitions."""
    m, want = _measured(simulate_ft, expected_ft, plan)
    for f, ttd, ttr, lost, restarts in zip(
        m.faults, want.time_to_detect_us, want.time_to_resume_us, want.lost_steps, want.restarts, strict=True
    ):
        assert _close(f["time_to_detect_s"], ttd), (f, ttd)
        assert f["detected"] == (ttd is not None), f
        assert _close(f["time_to_resume_s"], ttr), (f, ttr)
        assert f["lost_steps"] == lost, (f, lost, m.faults)
        assert f["restarts"] == restarts, (f, restarts, m.faults)
        assert f["rollback"] is (None if lost is None else False), f
    assert m.restart_count == want.restart_count, (m.restart_count, want)
    if want.statuses:
        assert m.detected == (want.time_to_detect_us[0] is not None)
        assert _close(m.time_to_detect_s, want.time_to_detect_us[0])
        assert m.false_detections == want.false_detections, (m.false_detections, want)
    if (
        want.outcome == "recovered" and want.statuses[0] != "interrupted"
    ):  # the run's recovery: its first fault's
        assert _close(m.time_to_resume_s, want.time_to_resume_us[0])
        assert _close(m.time_to_catch_up_s, want.time_to_resume_us[0])
        assert m.lost_steps == want.lost_steps[0] and m.skipped_steps == want.skipped_steps, (
            m.lost_steps,
            want,
        )
        assert m.rollback is False
        assert _close(m.time_to_rejoin_s, want.rejoin_us), (m.time_to_rejoin_s, want.rejoin_us)
        if want.stages_us is not None:  # (stated for a recovered first fault)
            got = (m.stage_detect_s, m.stage_reschedule_s, m.stage_reshard_or_replace_s, m.stage_resume_s)
            assert all(_close(a, b) for a, b in zip(got, want.stages_us, strict=True)), (got, want.stages_us)
            assert _close(m.time_to_recover_s, want.recover_us), (m.time_to_recover_s, want.recover_us)
        assert _close(m.badput_restart_init_s, want.restart_init_us), (m.badput_restart_init_s, want)
        assert m.badput_restore_s == 0.0 and m.badput_recompute_s == 0.0, m
    assert m.fault_step == want.fault_step, (m.fault_step, want.fault_step)
    assert _close(m.time_burned_s, want.burned_us), (m.time_burned_s, want.burned_us)
    assert _close(m.productive_s, want.productive_us), (m.productive_s, want.productive_us)
    assert _close(m.wall_s, want.wall_us)
    if want.productive_us is not None:
        assert m.goodput is not None and abs(m.goodput - want.productive_us / want.wall_us) <= 1e-9
    assert m.final_step == want.final_step
    assert m.fidelity == want.fidelity, (m.fidelity, m.missing.get("fidelity"))
