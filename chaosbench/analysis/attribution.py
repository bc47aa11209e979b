"""Who did what: which reactions count as the framework's (not the harness's), whom the framework blamed against
whom the fault hit, its detection episodes, the restarts it claimed, what its timeouts predicted, whether it
looped on a deterministic failure, and which process died before the job began (outside the system under test). Definitions: :mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chaosbench.analysis.timeline_index import TimelineIndex, incarnation
from chaosbench.timeline import Event


def harness_cut(ix: TimelineIndex) -> tuple[TimelineIndex, list[Event]]:
    """(the timeline before the harness began tearing the run down, rank/framework events it caused afterwards).

    Everything the harness does itself (process exits it caused, reverts, ``run_end``) is kept; what ranks and
    frameworks wrote once the teardown began is a reaction to the harness, not to the fault. Without a
    ``teardown_begin`` the index itself is returned."""
    td = ix.first("teardown_begin")
    if td is None:
        return ix, []
    keep: list[Event] = []
    caused: list[Event] = []
    for e in ix.events:
        (caused if e.t_ns >= td.t_ns and e.src in ("rank", "framework") else keep).append(e)
    return TimelineIndex(keep), caused


def detection_episodes(ix: TimelineIndex, before_ns: int | None = None) -> int:
    """``detect`` events grouped into episodes (a new one starts after each ``restart`` or ``give_up``), counting
    only events stamped before ``before_ns`` when given."""
    episodes = 0
    current = False
    for e in ix.of("detect", "restart", "give_up"):
        if before_ns is not None and e.t_ns >= before_ns:
            continue
        if e.kind == "detect":
            current = True
        elif current:
            episodes += 1
            current = False
    return episodes + current


def first_detection(ix: TimelineIndex, total_steps: int | None) -> str:
    """What the run's first ``detect`` says, with the failed process's first error line when it printed one
    (``proc_error``) and whether the job had finished its last step before (a rank that aborts at exit: a
    script that never destroys its process group, pytorch/pytorch#190489)."""
    det = ix.first("detect")
    if det is None:
        return ""
    text = str(det.get("reason") or "a detection")
    exits = [e for e in ix.of("proc_exit") if e.t_ns <= det.t_ns and e.get("returncode") not in (0, None)]
    failed = exits[-1] if exits else None
    if failed is not None:
        inc = int(failed.get("incarnation") or 0)
        done = [idx for n, idx in ix.steps.before(det.t_ns) if n == inc]
        if total_steps and done and max(done) >= total_steps:
            text += f", after the job's last step ({total_steps})"
        said = ix.first("proc_error", proc=failed.get("proc"), pid=failed.get("pid"))
        if said is not None:
            text += f"; {failed.get('proc')} printed {str(said.get('line'))[:160]!r}"
    return text


def false_detections(ix: TimelineIndex, recoveries: Sequence[tuple[int, int | None]]) -> int:
    """Detection episodes (``detect`` events not separated by a ``restart`` or ``give_up``) that no fault
    explains: begun before the first fault took effect, or after a fault's job had resumed and before the next
    one (a flap after the recovery). ``recoveries``: each fault's (effect, resume) stamps in order, the resume
    None when its job never resumed (then everything up to the next fault is its recovery)."""
    windows = []
    for i, (tf, resumed) in enumerate(recoveries):
        nxt = recoveries[i + 1][0] if i + 1 < len(recoveries) else None
        windows.append((tf, resumed if resumed is not None else nxt))
    episodes = 0
    current = False
    for e in ix.of("detect", "restart", "give_up"):
        if e.kind != "detect":
            current = False
            continue
        if current:
            continue
        current = True
        if not any(tf <= e.t_ns and (end is None or e.t_ns <= end) for tf, end in windows):
            episodes += 1
    return episodes


def blamed_ranks(ev: Event, events: Sequence[Event]) -> set[int] | None:
    """The ranks a detection names as failed, resolved through the ``rank_start`` events (of ``events``) written
    before it; None when it names nobody."""
    starts = [e for e in events if e.kind == "rank_start" and e.t_ns <= ev.t_ns]
    latest: dict[int, Event] = {}
    for e in starts:
        latest[int(e.get("rank", 0))] = e
    if ev.get("blame_rank") is not None:
        return {int(ev["blame_rank"])}
    if ev.get("blame_groups"):
        groups = {str(g) for g in ev["blame_groups"]}
        return {r for r, e in latest.items() if str(e.get("replica_group")) in groups}
    if ev.get("blame_node") is not None:
        return {r for r, e in latest.items() if e.get("node") == ev["blame_node"]}
    if ev.get("local_rank") is not None and ev.get("node") is not None:
        # A launcher's local_rank on its node (and, for a TorchFT group's launcher, in its replica group).
        keys = ("node", "replica_group") if ev.get("replica_group") is not None else ("node",)
        same = [
            e
            for e in starts
            if int(e.get("local_rank", -1)) == int(ev["local_rank"])
            and all(str(e.get(k)) == str(ev[k]) for k in keys)
        ]
        if same:
            return {int(same[-1].get("rank", 0))}
    return None


def restarts_claimed(events: Sequence[Event]) -> int:
    """Restarts the framework reported itself: ``restart`` events, the most written by any one process (each
    agent of a multi-node job reports the same restart; a replica group's launcher reports its own)."""
    by_proc: dict[str, int] = {}
    for e in events:
        if e.kind == "restart":
            key = str(e.get("proc") or e.get("framework") or e.src)
            by_proc[key] = by_proc.get(key, 0) + 1
    return max(by_proc.values(), default=0)


def fault_targets(fault: Event) -> set[int]:
    """The ranks a ``fault_inject`` event says it hit (its ground truth)."""
    targets = fault.get("target") or []
    if isinstance(targets, dict):
        targets = [targets]
    return {int(t["rank"]) for t in targets if isinstance(t, dict) and t.get("rank") is not None}


#: What a framework's blame was worth (``blame``): exactly the faulted ranks, or some of them (``correct``); the
#: faulted ones and others as well, say a whole node or every rank for one rank's fault (``imprecise``: named,
#: but not singled out); none of them (``wrong``); nobody named (``none``).
BLAME_VALUES = ("correct", "imprecise", "wrong", "none")


def blame_of(blamed: set[int], targets: set[int]) -> str:
    """``correct`` when every blamed rank is a target, ``imprecise`` when the targets are among more, else
    ``wrong`` (:data:`BLAME_VALUES`)."""
    if blamed and blamed <= targets:
        return "correct"
    return "imprecise" if blamed & targets else "wrong"


@dataclass(frozen=True)
class Blame:
    """Whom the framework named in its first reaction: ``blamed`` (the ranks, in words), ``blame`` (``correct``,
    ``wrong`` or ``none``), ``missing`` (why ``blame`` could not be judged)."""

    blamed: str | None = None
    blame: str | None = None
    missing: str | None = None


def first_blame(ix: TimelineIndex, fault: Event, tf: int) -> Blame:
    """Whom the framework blamed in its first reaction (detections from the fault ``tf`` to its first restart),
    judged against the fault's targets."""
    restart = ix.first("restart", after_ns=tf)
    first = [e for e in ix.of("detect") if e.t_ns >= tf and (restart is None or e.t_ns <= restart.t_ns)]
    starts = ix.of("rank_start")
    for ev in first:
        blamed = blamed_ranks(ev, starts)
        if blamed is None:
            continue
        named = ", ".join(f"rank {r}" for r in sorted(blamed)) or "no known rank"
        targets = fault_targets(fault)
        if not targets:
            return Blame(named, None, "the fault names no target rank")
        return Blame(named, blame_of(blamed, targets))
    return Blame(blame="none")


@dataclass(frozen=True)
class Prediction:
    """When the timeouts in force let the framework detect the fault (``expected_s``), the timeouts that decide
    it (``decided_by``), or why there is no prediction (``missing``)."""

    expected_s: float | None = None
    decided_by: str | None = None
    missing: str | None = None


def detection_prediction(ix: TimelineIndex, fault: Event) -> Prediction:
    """The framework adapter's ``detection_prediction`` for this fault, written before the run."""
    pred = next((e for e in ix.of("detection_prediction") if e.get("fault") == fault.get("fault")), None)
    if pred is not None and pred.get("expected_s") is not None:
        return Prediction(float(pred["expected_s"]), str(pred.get("decided_by") or ""))
    if pred is not None and pred.get("note"):
        return Prediction(missing=str(pred.get("note")))
    return Prediction(missing="no detection model for this framework and fault")


def timeout_problems(ix: TimelineIndex, known: Sequence[str]) -> list[str]:
    """``known`` followed by the problems every ``detection_prediction`` names that are not among them yet."""
    out = list(known)
    for pred in ix.of("detection_prediction"):
        out += [p for p in pred.get("problems") or [] if p not in out]
    return out


def crash_loop(ix: TimelineIndex) -> bool:
    """Two or more incarnations that failed (no ``train_end``) after reaching the same last step: a
    deterministic failure that restarting cannot help."""
    finals = {incarnation(e) for e in ix.of("train_end")}
    counts: dict[int, int] = {}
    for inc in ix.incarnations():
        if inc in finals:
            continue
        idx = ix.steps.indices_of(inc)
        last = max(idx) if idx else 0
        counts[last] = counts.get(last, 0) + 1
    return any(c >= 2 for c in counts.values())


#: A ``detect`` event's ``via`` -> what noticed the failure, in the report's words.
DETECTION_MECHANISMS = {
    "exit": "process exit",
    "scheduler": "scheduler job state",
    "heartbeat": "framework heartbeat",
    "health check": "node health check",
    "step watchdog": "step watchdog",
    "loss guard": "loss guard",
    "manager": "collective error",
    "lighthouse": "framework heartbeat",
}


@dataclass
class Mechanism:
    name: str | None
    missing: str | None = None


def detection_mechanism(ix: TimelineIndex, detect: Event, tf: int) -> Mechanism:
    """What noticed the failure that ``detect`` reports: the source's own ``mechanism`` where it names one; for
    a process's exit (or the scheduler's job state that follows one, or a collective that failed under TorchFT's
    Manager), what a rank printed between the fault and the detection (a ``rank_error``), when it says why:
    ``process-group timeout`` (the exit was that timeout's doing, not the fault's own), else ``collective
    mismatch check``, else ``rendezvous store lost`` (an agent stopped its workers when its store went); else
    what its ``via`` stands for (:data:`DETECTION_MECHANISMS`)."""
    named = detect.get("mechanism")
    if named:
        return Mechanism(str(named))
    via = detect.get("via") or ("loss guard" if detect.get("framework") == "loss-check" else None)
    if via in ("exit", "scheduler", "manager"):
        seen = {e.get("signature") for e in ix.of("rank_error") if tf <= e.t_ns <= detect.t_ns}
        for signature, name in (
            ("collective_timeout", "process-group timeout"),
            ("collective_mismatch", "collective mismatch check"),
            ("rendezvous_lost", "rendezvous store lost"),
        ):
            if signature in seen:
                return Mechanism(name)
    if via in DETECTION_MECHANISMS:
        return Mechanism(DETECTION_MECHANISMS[str(via)])
    return Mechanism(
        None, f"the detection's source does not say what noticed the failure (via: {via or 'none'})"
    )


def startup_failure(ix: TimelineIndex) -> str | None:
    """The first process that exited by itself with an error (``proc_exit`` with a positive ``returncode``; a
    signal's exit is a kill) before the job's first ``step``, before any fault and before the harness's teardown,
    in words: its name, its exit status and its first error line (``proc_error``), or that its output had none.
    Such a process (a framework's helper, a rank that failed at import) failed before the system under test was
    tried at all; None when there is none."""
    bounds = [
        e.t_ns
        for e in (ix.first("step"), ix.first("fault_inject"), ix.first("teardown_begin"))
        if e is not None
    ]
    before_ns = min(bounds, default=None)
    for e in ix.of("proc_exit"):
        if before_ns is not None and e.t_ns >= before_ns:
            break
        if int(e.get("returncode") or 0) <= 0:
            continue
        said = next(
            (
                p
                for p in ix.of("proc_error")
                if p.get("pid") == e.get("pid") and p.get("proc") == e.get("proc")
            ),
            None,
        )
        head = f"'{e.get('proc')}' exited {e.get('returncode')} before the job's first step"
        if said is None:
            return f"{head}, with no error line in its output (logs/{e.get('proc')}.err)"
        return f"{head}: {str(said.get('line')).strip()[:300]}"
    return None
