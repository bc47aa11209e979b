"""Every fault of a run, measured on its own: when it took effect, whether and how fast the framework reacted,
whom it blamed, when training resumed, the work it lost, and how that fault ended. Definitions:
:mod:`chaosbench.analysis.metrics` (the run's figures are its first fault's; its outcome is all of theirs).

Each ``fault_inject`` of the run, in the order they took effect, is one fault (a repeating trigger or a planted
bug that fires in every incarnation makes several). A fault's window runs from when it took effect to when the
next one did (or the run's end): its detection is the first ``detect`` in it, or a ``give_up`` before any (a
framework that stopped trying had noticed the failure: ft_launcher that lost its rendezvous store ends at once,
saying so, with no line of its own before that), its resume the first step after
recovery in it; a fault whose job had not resumed when the next one hit is ``interrupted`` by it, and the
recovery that followed is the next fault's (its lost work is still its own: from where its incarnation stood to
the point the job finally resumed from). How a fault ended (``status``):

- ``recovered``: training resumed after the framework reacted (a detection, a restart or a new incarnation in
  its window), and, for the last fault, training finished;
- ``outlasted``: training went on in the same incarnation with no reaction at all (a hang that ended by itself,
  a held GIL, a signal the job ignored, a slowed rank): its cost is its stall, not a recovery;
- ``interrupted``: the next fault took effect before this one's job resumed;
- ``not_recovered``: training did not resume, or (the last fault) did not finish.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from chaosbench.analysis import attribution, timing
from chaosbench.analysis.fleet import fault_class
from chaosbench.analysis.timeline_index import TimelineIndex, incarnation, ns_to_s
from chaosbench.timeline import Event

#: How a fault ended (module docstring).
FAULT_STATUSES = ("recovered", "outlasted", "interrupted", "not_recovered")
#: The outcomes of a fault run whose fault fired (:func:`run_outcome`).
FIRED_OUTCOMES = ("recovered", "outlasted", "not_recovered")


@dataclass
class FaultFigures:
    """One fault's figures (seconds from when it took effect; None: ``missing`` says why)."""

    fault: str | None
    injector: str | None
    fault_class: str | None
    fault_t_s: float
    status: str
    interrupted_by: str | None = None
    detected: bool = False
    time_to_detect_s: float | None = None
    detected_via: str | None = None
    blame: str | None = None
    blamed: str | None = None
    time_to_resume_s: float | None = None
    lost_steps: int | None = None
    lost_work_s: float | None = None
    restarts: int = 0
    rollback: bool | None = None
    missing: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Measured:
    """A fault's figures and what they were taken from (its effect time, where the job stood, its detection and
    resume), for the run-level figures of the first fault."""

    figures: FaultFigures
    event: Event
    t_ns: int
    until_ns: int | None
    point: timing.FaultPoint
    detect: Event | None
    resume: tuple[int, tuple[int, int]] | None
    #: The job went on in place while the fault was still in effect, then failed: steps after it, no resume.
    went_on: bool = False


def reaction_in(ix: TimelineIndex, t_from: int, t_to: int | None) -> bool:
    """Whether the framework reacted between ``t_from`` and ``t_to``: a detection, a restart, a give-up, a new
    incarnation of a unit that restarts on its own (a replica group under per-step commit: TorchFT's number their
    incarnations each from 0; a job without groups is one), or (per-step commit) a new quorum (a ``quorum``
    event, or a step of the job's committed by a quorum other than the last one before ``t_from``; a stale
    group's commit of an index the job had completed already is not the job's)."""

    def inside(e: Event) -> bool:
        return e.t_ns >= t_from and (t_to is None or e.t_ns <= t_to)

    if any(inside(e) for e in ix.of("detect", "restart", "give_up", "quorum")):
        return True
    # new for its own group: another group's number, as high or higher, says nothing of it
    running: dict[Any, int] = {}
    for e in ix.of("rank_start"):
        if e.t_ns < t_from:
            unit = e.get("replica_group")
            running[unit] = max(running.get(unit, 0), incarnation(e))
    if any(
        inside(e) and incarnation(e) > running.get(e.get("replica_group"), 0) for e in ix.of("rank_start")
    ):
        return True
    # the job's commits only: a group back with stale state that commits an index the job had completed already,
    # alone in a quorum of its own, changes no quorum of the job's
    done: dict[int, int] = {}  # step index -> when the job completed it
    for (_, step), t in ix.steps.t.items():
        done[step] = min(t, done.get(step, t))

    def jobs(e: Event) -> bool:
        return bool(e.get("committed")) and not done.get(int(e["step"]), e.t_ns) < e.t_ns

    quorums = [e.get("quorum_id") for e in ix.of("step") if jobs(e) and e.t_ns < t_from]
    last = quorums[-1] if quorums else None
    return any(inside(e) and jobs(e) and e.get("quorum_id") not in (None, last) for e in ix.of("step"))


def measure_all(
    ix: TimelineIndex, faults: list[Event], finished: bool, t0: int, framework: str | None
) -> list[Measured]:
    """Every fault of the run, in the order they took effect (module docstring)."""
    effects = sorted(((timing.fault_effect_ns(ix, f), f) for f in faults), key=lambda x: x[0])
    out: list[Measured] = []
    for i, (tf, fault) in enumerate(effects):
        nxt = effects[i + 1] if i + 1 < len(effects) else None
        out.append(_measure(ix, fault, tf, nxt, finished, t0, framework))
    return out


def _measure(
    ix: TimelineIndex,
    fault: Event,
    tf: int,
    nxt: tuple[int, Event] | None,
    finished: bool,
    t0: int,
    framework: str | None,
) -> Measured:
    """One fault's figures: it took effect at ``tf``; ``nxt`` is the next fault (its effect time and event) or
    None for the run's last (module docstring)."""
    until = nxt[0] if nxt is not None else None
    revert = _revert_ns(ix, fault, tf, until)
    fp = timing.fault_point(ix, tf, until, revert)
    fig = FaultFigures(
        fault.get("fault"), fault.get("injector"), fault_class(fault), ns_to_s(tf - t0), "not_recovered"
    )
    miss = fig.missing
    rec = _reaction(ix, fp, tf, nxt, finished, revert)
    detect, resume = rec.detect, rec.resume
    _record_detection(ix, fig, fault, tf, detect, framework, until)
    # the restarts of its recovery: to its resume, or the next fault
    upto = resume[0] if resume is not None else until
    fig.restarts = _restarts(ix, fp, upto)
    if resume is None:
        _record_no_resume(ix, fig, fp, nxt, rec)
        return Measured(fig, fault, tf, until, fp, detect, None, rec.went_on)
    resume_t = resume[0]
    if nxt is None and not finished:
        fig.status = "not_recovered"
        why = "not recovered: training did not finish"
        miss["time_to_resume_s"] = miss["lost_steps"] = why
        return Measured(fig, fault, tf, until, fp, detect, resume)
    fig.status = "recovered" if reaction_in(ix, tf, resume_t) else "outlasted"
    fig.time_to_resume_s = ns_to_s(resume_t - tf)
    _lost(ix, fp, resume, fig, until)
    return Measured(fig, fault, tf, until, fp, detect, resume)


def _revert_ns(ix: TimelineIndex, fault: Event, tf: int, until: int | None) -> int | None:
    """When ``fault`` (in effect from ``tf``) was reverted before the next fault at ``until`` (None: the run's
    end): its first ``fault_revert`` in that window, or None if it was not."""
    return next(
        (
            e.t_ns
            for e in ix.of("fault_revert")
            if e.t_ns >= tf and e.get("fault") == fault.get("fault") and (until is None or e.t_ns < until)
        ),
        None,
    )


@dataclass
class _Reaction:
    """The framework's detection of a fault and the job's resume from it (module docstring).

    ``detect``: the detection (or give-up) credited to it, None if none; ``eventually``: the first step after
    recovery, maybe after the next fault (its time and ``(incarnation, step)`` key); ``resume``: that step when
    it came before the next fault, else None; ``went_on``: see :attr:`Measured.went_on` (then both are None)."""

    detect: Event | None
    eventually: tuple[int, tuple[int, int]] | None
    resume: tuple[int, tuple[int, int]] | None
    went_on: bool


def _reaction(
    ix: TimelineIndex,
    fp: timing.FaultPoint,
    tf: int,
    nxt: tuple[int, Event] | None,
    finished: bool,
    revert: int | None,
) -> _Reaction:
    """The detection of and resume from the fault that took effect at ``tf`` (where the job stood: ``fp``;
    reverted at ``revert``), before the next fault ``nxt`` (None: the run's last)."""
    until = nxt[0] if nxt is not None else None
    # Its detection is the framework's first reaction in its window, and before its job resumed (a detection
    # after that is a flap, not a reaction to it); under per-step commit a survivor's step that was in flight
    # when the fault hit may commit at once: the job has not recovered until the framework reacted, so there the
    # resume comes after the detection instead.
    # A give-up is a reaction too: an agent that ends at once on losing its store names no failure before it.
    detects = [e for e in ix.of("detect", "give_up") if e.t_ns >= tf and (until is None or e.t_ns < until)]
    if ix.per_step_commit:
        detect = detects[0] if detects else None
        eventually = timing.resume_point(
            ix.steps, fp, True, after_ns=detect.t_ns if detect is not None else None
        )
    else:
        eventually = timing.resume_point(ix.steps, fp, False)  # maybe after the next fault
    resume = eventually if eventually is not None and (until is None or eventually[0] < until) else None
    went_on = (
        resume is not None
        and nxt is None
        and not finished
        and (revert is None or revert > resume[0])
        and not ix.per_step_commit
        and not fp.restarted
        and resume[1][0] == fp.incarnation
    )
    if went_on:
        # a fault still in effect (a kill: nothing brings the process back) while its job went on in place, and
        # the job then failed, the run's last fault: those steps were the fault not having bitten yet (a killed
        # rendezvous host is missed at the next store call), no resume from it; the framework's reaction after
        # them is this fault's detection, not a flap (under per-step commit the survivors going on is the
        # recovery; a fault that ended before the job went on, a hang's duration, was outlasted)
        resume = eventually = None
    if not ix.per_step_commit:
        detect = next((e for e in detects if resume is None or e.t_ns <= resume[0]), None)
    return _Reaction(detect, eventually, resume, went_on)


def _record_detection(
    ix: TimelineIndex,
    fig: FaultFigures,
    fault: Event,
    tf: int,
    detect: Event | None,
    framework: str | None,
    until: int | None,
) -> None:
    """Into ``fig``: the fault's detection ``detect`` (its time from ``tf``, mechanism and blame), or why there
    was none before the next fault at ``until`` (None: the run's end)."""
    miss = fig.missing
    if detect is not None:
        fig.detected = True
        fig.time_to_detect_s = ns_to_s(detect.t_ns - tf)
        mechanism = attribution.detection_mechanism(ix, detect, tf)
        fig.detected_via = mechanism.name
        if mechanism.missing is not None:
            miss["detected_via"] = mechanism.missing
        blame = attribution.first_blame(ix, fault, tf)
        fig.blamed, fig.blame = blame.blamed, blame.blame
        if blame.missing is not None:
            miss["blame"] = blame.missing
    else:
        miss["time_to_detect_s"] = miss["blame"] = f"no detection by framework '{framework}' before " + (
            "the next fault" if until is not None else "the run ended"
        )


def _record_no_resume(
    ix: TimelineIndex,
    fig: FaultFigures,
    fp: timing.FaultPoint,
    nxt: tuple[int, Event] | None,
    rec: _Reaction,
) -> None:
    """Into ``fig``: how a fault whose job did not resume before the next fault ``nxt`` (None: the run's end)
    ended, ``interrupted`` (with the work its rollback lost) or ``not_recovered``, and why its resume is
    missing."""
    miss = fig.missing
    if nxt is not None:
        until = nxt[0]
        fig.status, fig.interrupted_by = "interrupted", str(nxt[1].get("fault"))
        miss["time_to_resume_s"] = (
            f"interrupted: fault '{fig.interrupted_by}' took effect before the job resumed"
        )
        if fp.restarted and rec.eventually is not None:  # the rollback it began is its loss all the same: to
            _lost(ix, fp, rec.eventually, fig, until)  # where the job finally restarted from
        elif not fp.restarted:  # nothing rolled back before the next fault hit: whatever was redone is its
            fig.lost_steps, fig.lost_work_s = 0, 0.0
        else:
            miss["lost_steps"] = miss["time_to_resume_s"]
    else:
        miss["time_to_resume_s"] = miss["lost_steps"] = (
            "not recovered: training did not finish"
            if rec.went_on
            else "not recovered: no training step completed after the fault"
        )


def _restarts(ix: TimelineIndex, fp: timing.FaultPoint, upto: int | None) -> int:
    """The incarnations begun from the fault at ``fp`` to ``upto`` (None: the run's end), per unit that restarts
    on its own (a replica group: TorchFT's number their incarnations each from 0; a job without groups is one),
    each newer than the one that unit was running when the fault hit."""
    running: dict[Any, int] = {}
    for e in ix.of("rank_start"):
        if e.t_ns <= fp.t_ns:
            unit = e.get("replica_group")
            running[unit] = max(running.get(unit, 0), incarnation(e))
    begun = {
        (e.get("replica_group"), incarnation(e))
        for e in ix.of("rank_start")
        if e.t_ns >= fp.t_ns
        and (upto is None or e.t_ns <= upto)
        and incarnation(e) > running.get(e.get("replica_group"), fp.incarnation)
    }
    return len(begun)


def _lost(
    ix: TimelineIndex,
    fp: timing.FaultPoint,
    resume: tuple[int, tuple[int, int]],
    fig: FaultFigures,
    until: int | None,
) -> None:
    """The work the fault at ``fp`` lost, to the point the job resumed from at ``resume`` (and, per-step commit,
    the steps skipped before the next fault at ``until``), into ``fig``."""
    lost = timing.lost_work(ix, fp, resume[1], until)
    fig.lost_steps, fig.lost_work_s = lost.lost_steps, lost.lost_work_s
    if lost.missing is not None:
        fig.missing["lost_work_s"] = lost.missing
    fig.rollback = not ix.per_step_commit and resume[1][0] != fp.incarnation


def run_outcome(measured: list[Measured], finished: bool) -> str:
    """The run's outcome from all its faults: ``not_recovered`` unless training finished; ``outlasted`` when no
    fault drew a reaction (each the job outlasted, or was interrupted by one it outlasted); else ``recovered``."""
    if not finished or not measured or measured[-1].figures.status == "not_recovered":
        return "not_recovered"
    statuses = {m.figures.status for m in measured}
    if statuses <= {"outlasted", "interrupted"} and "outlasted" in statuses:
        return "outlasted"
    return "recovered"
