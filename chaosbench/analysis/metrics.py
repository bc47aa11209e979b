"""Recovery metrics of one run, computed only from its timeline (and its control run's timeline).

Definitions (normative; all times in seconds on the timeline's one clock, ``fault`` = the first
``fault_inject`` event's stamp, taken just before the injector acted):

- ``time_to_detect_s``: first framework reaction (a ``detect`` event) at or after the fault, minus the
  fault time. No ``detect`` event before the run ended: missing, and ``detected`` is False.
- ``time_to_resume_s``: first completed training step after recovery, minus the fault time. When a newer
  incarnation than the one running at the fault started after it, that is the newer incarnation's first
  step (steps the faulted incarnation still completed after the fault were in flight and count as completed
  before it); otherwise (recovery in place, e.g. a hang that ended) the first step beyond every step
  completed before the fault.
  Per-step commit (the timeline has ``step_skipped`` events or steps marked ``committed``: TorchFT): nothing
  is rolled back and survivors that keep committing are the job, so it is the first committed step, by any
  incarnation, with an index beyond every step completed before the fault.
- ``time_to_rejoin_s``: first completed step of an incarnation newer than the faulted one (the restarted rank,
  replica group or node is training again), minus the fault time; missing when nothing restarted.
- ``time_to_catch_up_s``: first completion, after the fault, of a step index beyond every step completed
  before the fault (new progress), minus the fault time.
- ``lost_steps``: steps completed before the fault that had to be recomputed: (highest step completed
  before the fault, in-flight ones included) - (step the recovered job restarted from; the first step after
  recovery minus one). Per-step commit: plus ``skipped_steps``, the distinct step indices computed but not
  committed after the fault (``step_skipped``): their work was discarded although nothing rolled back.
- ``lost_work_s``: the seconds those lost steps had taken the first time: stamp of the highest step
  completed before the fault minus the stamp of the step recovery restarted from (in the faulted
  incarnation; its first event when it restarted from scratch). Per-step commit: plus, for each skipped step
  index, the shortest ``duration_s`` (compute thrown away, without the wait in the failed collective) reported
  for it.
- ``world_size_before`` / ``_after`` / ``_final`` and ``global_batch_before`` / ``_after`` / ``_final``: the
  world size (``rank_start``) of the incarnation running at the fault, of the one that resumed training and of
  the one that finished it; the global batch (samples per optimizer step) from the resuming step's
  ``global_batch`` or else that incarnation's ``rank_start``, when the workload reports it. An elastic job that
  shrank trains on a different batch, data split and schedule afterwards; fidelity compares against a control
  that never did.
- ``restart_count``: highest incarnation seen in ``rank_start`` events (0: never restarted).
- ``checkpoint_age_s``: fault time minus the newest complete checkpoint save (``ckpt_save_end`` with
  ``complete``) before it. Missing when no checkpoint had completed.
- ``checkpoint_save_s``: median duration of complete checkpoint saves (begin to end, per rank).
- ``wall_s``: ``run_end`` minus ``run_start``.
- ``productive_s``: for every step index, the compute time of its last execution (the one that survived
  into the final state): the step's own ``duration_s`` when the workload reports it, else the interval
  since the rank's previous event of that incarnation. ``goodput`` = productive_s / wall_s.
- ``extra_wall_s``: wall_s minus the control run's wall_s (same framework, no fault).
- badput by stage (after the fault): ``badput_detect_s`` = time to detect; ``badput_restart_init_s`` =
  detection (the fault, if undetected) to the start of the restore in the new incarnation (its first
  ``ckpt_load_begin``, else its first step's start); ``badput_restore_s`` = checkpoint load in the new
  incarnation (earliest begin to latest end); ``badput_recompute_s`` = end of the restore to the
  completion, again, of the highest step completed before the fault. Recovery in place has no restart,
  restore or recompute (0). Per-step commit: restart+init is detection to the start of the resumed step (the
  wait for a new quorum); restore and recompute are 0 (a restarted group heals from a peer while the others
  train).
- ``fidelity``: ``exact`` when the final parameter digest (``train_end`` of rank 0 in the last
  incarnation) equals the control's, ``diverged`` otherwise (``loss_diff`` = final loss - control's);
  missing when either run did not finish training.
- ``fault_count``: ``fault_inject`` events (a repeating trigger or a planted bug fires more than once).
- ``detected_by``: who wrote the first detection (a framework name, or ``loss-check`` for the workload's guard).
- ``gave_up``: the framework said it stopped trying (``give_up``), as opposed to looping until the deadline.
- ``crash_loop``: two or more incarnations each failed after reaching the same last step (a deterministic
  failure: restarting cannot help); ``failure_class`` is ``deterministic`` then, ``transient`` when a
  restart recovered, else None. ``time_burned_s``: run end minus the fault time when not recovered.
- ``ranks_agree``: every rank's final digest (its newest ``train_end``) is the same (False exposes silent
  corruption that made replicas diverge); missing when fewer than two ranks reported one.
- ``step_time_s``: median interval between consecutive step completions over the whole run (same
  incarnation); ``fault_step_time_s``: the same over the intervals overlapping the fault window (fault_inject
  to fault_revert or run end); ``slowdown``: fault_step_time_s / the control's step_time_s.
- ``verdict``: one line saying what the framework did (recovered after N restarts / in place, not detected,
  gave up, crash loop, diverged silently, ...), derived from the fields above.
- ``outcome``: ``completed`` (control finished), ``recovered`` (the fault fired and training finished),
  ``not_recovered`` (the fault fired and training did not finish before the run ended), ``fault_not_fired``,
  ``failed`` (a control that did not finish).

- ``scheduler_delay_s``: for the first ``restart`` at or after the fault, seconds until the scheduler ran the
  job again (the next ``sched_state`` event with state ``running``): the scheduler's share of
  ``badput_restart_init_s`` (requeue hold, scheduling pass, node allocation). Missing when no scheduler
  state was recorded (the framework restarts processes itself).
- ``clock_offset_bound_s``: the largest uncertainty of the node clock offsets the runtime measured
  (``clock_offset`` events); every stamp written on another host was moved onto the harness's clock within
  this bound when the timeline was read. Missing on a timeline without clock measurements (one clock).

Attribution, truth and detection quality:

- The harness's own actions are events: ``teardown_begin`` marks the moment the harness starts tearing the run
  down (the job ended, the deadline passed, an interrupt, an error). Nothing a rank or a framework wrote at or
  after it counts: a framework reacting to the harness's SIGTERM has not detected the fault.
- Fault time: when the fault took effect (``effect_t_ns`` of ``fault_inject``: the signal delivered on the node,
  the engine's event for the container, ...; but no later than its first consequence, a process exit or a
  detection after the injector began), else when the injector began to act. ``injection_latency_s`` = effect - start of the
  injection; ``fault_step`` = the highest job step completed when it took effect; ``trigger_step`` = the step a
  step trigger fired at (a fault that landed later says so in the verdict).
- ``final_step``: the step of the final ``train_end``; when the line has none, the last step its incarnation
  completed.
- ``contaminated``: the run started from state it did not write: a rank loaded a checkpoint before this run had
  saved any, or the first incarnation's first step is beyond the start of training. Such a run is not measured
  (outcome ``contaminated``, the reason in ``verdict``).
- ``blamed`` / ``blame``: the ranks the framework named as failed in its first reaction to the fault (the
  ``detect`` events from the fault to its first ``restart``: a ``blame_rank``, a torchrun ``local_rank`` on a
  node, a ``blame_node`` or TorchFT ``blame_groups``, resolved to ranks through the ``rank_start`` events);
  ``correct`` when they include a target of the fault, ``wrong`` when they do not, ``none`` when the framework
  detected the fault without naming anyone. Missing when nothing was detected.
- ``false_detections``: detection episodes (``detect`` events not separated by a ``restart``) in a control run,
  or before the fault in a fault run. ``clean`` (controls): completed with no restart and no detection.
- ``restarts_claimed``: restarts the framework itself reported (``restart`` events, most by any one process: an
  agent, a replica group's launcher, the scheduler); ``restart_count`` is what the ranks' incarnations show. A
  difference is named in the verdict.
- ``fault_class``: the fleet fault class of the first fault (``crash``, ``node``, ``hang``, ``sdc``; see
  :data:`chaosbench.analysis.fleet.FAULT_CLASSES`), for the fleet projection. ``rollback``: the recovery restarted from
  a checkpoint (False: per-step commit, or recovered in place).
- ``predicted_detect_s`` / ``predicted_by``: when the timeouts in force let the framework detect this fault
  (``detection_prediction`` event written before the run by the framework adapter: the deciding timeout plus the
  interval that polls it), and those timeouts; missing when the adapter has no model for the fault.

A metric that cannot be measured is None, with the reason in ``missing``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from chaosbench.analysis.checkpoint_outcome import classify_checkpoint_outcome
from chaosbench.analysis.fleet import fault_class
from chaosbench.timeline import Event
from chaosbench.timeline.clocks import offset_bound_s


@dataclass
class RunMetrics:
    suite: str | None = None
    scenario: str | None = None
    framework: str | None = None
    fault: str | None = None
    repeat: int | None = None
    control: bool = False
    run_dir: str | None = None
    outcome: str | None = None
    run_end_outcome: str | None = None
    detected: bool | None = None
    recovered: bool | None = None
    time_to_detect_s: float | None = None
    time_to_resume_s: float | None = None
    time_to_catch_up_s: float | None = None
    time_to_rejoin_s: float | None = None
    lost_steps: int | None = None
    lost_work_s: float | None = None
    skipped_steps: int | None = None
    restart_count: int | None = None
    checkpoint_age_s: float | None = None
    checkpoint_save_s: float | None = None
    wall_s: float | None = None
    productive_s: float | None = None
    goodput: float | None = None
    extra_wall_s: float | None = None
    badput_detect_s: float | None = None
    badput_restart_init_s: float | None = None
    badput_restore_s: float | None = None
    badput_recompute_s: float | None = None
    fault_count: int | None = None
    detected_by: str | None = None
    gave_up: bool | None = None
    crash_loop: bool | None = None
    failure_class: str | None = None
    time_burned_s: float | None = None
    ranks_agree: bool | None = None
    step_time_s: float | None = None
    fault_step_time_s: float | None = None
    slowdown: float | None = None
    checkpoint_outcome: str | None = None
    verdict: str | None = None
    fidelity: str | None = None
    loss_diff: float | None = None
    world_size_before: int | None = None
    world_size_after: int | None = None
    world_size_final: int | None = None
    global_batch_before: int | None = None
    global_batch_after: int | None = None
    global_batch_final: int | None = None
    final_step: int | None = None
    final_loss: float | None = None
    digest: str | None = None
    slo_ok: bool | None = None
    slo_failures: list[str] = field(default_factory=list)
    scheduler_delay_s: float | None = None
    clock_offset_bound_s: float | None = None
    fault_t_s: float | None = None
    detect_t_s: float | None = None
    resume_t_s: float | None = None
    injection_latency_s: float | None = None
    fault_step: int | None = None
    trigger_step: int | None = None
    fault_class: str | None = None
    rollback: bool | None = None
    contaminated: bool | None = None
    blame: str | None = None
    blamed: str | None = None
    false_detections: int | None = None
    clean: bool | None = None
    restarts_claimed: int | None = None
    predicted_detect_s: float | None = None
    predicted_by: str | None = None
    timeout_problems: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    timeouts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Fields of RunMetrics that say which run it is or record its context, rather than measure it.
BOOKKEEPING = frozenset({"suite", "scenario", "framework", "fault", "repeat", "control", "run_dir", "missing",
                         "versions", "timeouts", "timeout_problems"})  # fmt: skip


def metric_names() -> list[str]:
    """Every measured metric (what an SLO, a baseline or a report column can name): the fields of RunMetrics."""
    return [f for f in RunMetrics.__dataclass_fields__ if f not in BOOKKEEPING]


#: Metrics that only exist for a run with a fault.
FAULT_METRICS = (
    "time_to_detect_s", "time_to_resume_s", "time_to_rejoin_s", "time_to_catch_up_s", "lost_steps", "lost_work_s",
    "checkpoint_age_s", "extra_wall_s", "badput_detect_s", "badput_restart_init_s", "badput_restore_s",
    "badput_recompute_s", "fault_step_time_s", "slowdown", "time_burned_s", "scheduler_delay_s",
    "injection_latency_s", "fault_step", "predicted_detect_s", "blame",
)  # fmt: skip


def _s(ns: int) -> float:
    return ns / 1e9


@dataclass
class _Steps:
    """Job step completions per (incarnation, step index).

    A step of the job is complete when every rank that reports steps in that incarnation has reported it;
    its stamp is the last of those reports (a step one rank finished while another was killed or stopped is
    not a completed job step). Its duration is the shortest of the ranks' own ``duration_s`` (a rank that
    waited in a collective for a stopped peer reports the wait; the fastest rank's time is the compute),
    else the interval since that rank's previous event of the incarnation.

    Per-step commit (TorchFT: steps reported ``committed``, each replica group its own incarnation): the job is
    whoever took part in the step's commit, not every rank ever seen. A committed step that names its quorum
    (``quorum_id``, ``participants`` = replica groups in it) is complete once every rank of that quorum reported
    it (``participants`` x the group's ranks, ``group_world_size`` of the ranks' ``rank_start``), stamped at the
    last of those reports and keyed by the newest incarnation among them; when the same index is committed again
    by another quorum (a group that came back with stale state and trained alone), the first completion is the
    job's. A committed step without quorum information is complete at the first group's commit."""

    t: dict[tuple[int, int], int] = field(default_factory=dict)
    duration: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def from_events(cls, events: list[Event]) -> _Steps:
        out = cls()
        prev: dict[tuple[int, int], int] = {}  # (incarnation, rank) -> last event stamp
        reports: dict[tuple[int, int], dict[int, tuple[int, float | None]]] = {}
        stepping: dict[int, set[int]] = {}
        committed: set[tuple[int, int]] = set()  # per-step commit without quorum information
        group_size: dict[int, int] = {}  # rank -> ranks in its replica group
        quorum: dict[tuple[Any, int], list[tuple[int, int, int, float | None]]] = {}  # (quorum, step) -> reports
        for ev in events:
            if ev.src != "rank":
                continue
            inc, rank = int(ev.get("incarnation", 0)), int(ev.get("rank", 0))
            if ev.kind == "rank_start" and ev.get("group_world_size"):
                group_size[rank] = int(ev["group_world_size"])
            if ev.kind == "step":
                d = ev.get("duration_s")
                if d is None and (inc, rank) in prev:
                    d = _s(ev.t_ns - prev[(inc, rank)])
                dur = None if d is None else float(d)
                step = int(ev["step"])
                if ev.get("committed") and ev.get("participants") is not None:
                    expected = int(ev["participants"]) * group_size.get(rank, 1)
                    got = quorum.setdefault((ev.get("quorum_id"), step), [])
                    got.append((ev.t_ns, inc, rank, dur))
                    key = (max(i for _, i, _, _ in got), step)
                    if len({r for _, _, r, _ in got}) == expected and key not in out.t:
                        out.t[key] = ev.t_ns
                        ds = [x for *_, x in got if x is not None]
                        if ds:
                            out.duration[key] = min(ds)
                else:
                    reports.setdefault((inc, step), {})[rank] = (ev.t_ns, dur)
                    stepping.setdefault(inc, set()).add(rank)
                    if ev.get("committed"):
                        committed.add((inc, step))
            if ev.kind in ("rank_start", "step", "ckpt_save_end", "ckpt_load_end"):
                prev[(inc, rank)] = ev.t_ns
        for key, by_rank in reports.items():
            if key in committed:
                out.t[key] = min(t for t, _ in by_rank.values())
            elif stepping[key[0]] <= set(by_rank):
                out.t[key] = max(t for t, _ in by_rank.values())
            else:
                continue
            ds = [d for _, d in by_rank.values() if d is not None]
            if ds:
                out.duration[key] = min(ds)
        return out

    def before(self, t_ns: int) -> list[tuple[int, int]]:
        return [k for k, t in self.t.items() if t <= t_ns]

    def after(self, t_ns: int) -> list[tuple[int, tuple[int, int]]]:
        return sorted((t, k) for k, t in self.t.items() if t > t_ns)


def _first(events: list[Event], kind: str, after_ns: int | None = None, **match: Any) -> Event | None:
    for ev in events:
        if ev.kind != kind or (after_ns is not None and ev.t_ns < after_ns):
            continue
        if all(ev.get(k) == v for k, v in match.items()):
            return ev
    return None


def _world(events: list[Event], incarnation: int | None, step: Event | None = None) -> tuple[int | None, int | None]:
    """(world size, global batch) of an incarnation, from its rank_start events (and ``step``'s global_batch)."""
    if incarnation is None:
        return None, None
    starts = [e for e in events if e.kind == "rank_start" and int(e.get("incarnation", 0)) == incarnation]
    ws = max((int(e["world_size"]) for e in starts if e.get("world_size") is not None), default=None)
    gb = step.get("global_batch") if step is not None else None
    if gb is None:
        gb = next((e.get("global_batch") for e in starts if e.get("global_batch") is not None), None)
    return ws, None if gb is None else int(gb)


def _final(events: list[Event]) -> Event | None:
    """train_end of the highest incarnation that reached it: rank 0's, else the first rank's that wrote one."""
    ends = [e for e in events if e.kind == "train_end"]
    if not ends:
        return None
    last = max(int(e.get("incarnation", 0)) for e in ends)
    ends = [e for e in ends if int(e.get("incarnation", 0)) == last]
    return min(ends, key=lambda e: (int(e.get("rank", 0)) != 0, e.t_ns))


def _final_step(final: Event, steps: _Steps) -> int | None:
    """The step training ended at: the train_end's own, else the last step its incarnation completed."""
    if final.get("step") is not None:
        return int(final["step"])
    inc = int(final.get("incarnation", 0))
    done = [idx for (n, idx) in steps.t if n == inc]
    return max(done) if done else None


def _harness_cut(events: list[Event]) -> tuple[list[Event], list[Event]]:
    """(events before the harness began tearing the run down, rank/framework events it caused afterwards).

    Everything the harness does itself (process exits it caused, reverts, ``run_end``) is kept; what ranks and
    frameworks wrote once the teardown began is a reaction to the harness, not to the fault."""
    td = _first(events, "teardown_begin")
    if td is None:
        return events, []
    keep: list[Event] = []
    caused: list[Event] = []
    for e in events:
        (caused if e.t_ns >= td.t_ns and e.src in ("rank", "framework") else keep).append(e)
    return keep, caused


def contamination(events: list[Event], steps: _Steps) -> str | None:
    """Why this run started from state it did not write (a checkpoint of another run), or None."""
    starts = [int(e.get("incarnation", 0)) for e in events if e.kind == "rank_start"]
    first_inc = min(starts, default=0)
    saves = [e.t_ns for e in events if e.kind == "ckpt_save_end" and e.src == "rank"]
    first_save = min(saves, default=None)
    for e in events:
        if e.kind not in ("ckpt_load_begin", "ckpt_load_end") or e.src != "rank":
            continue
        # A load by the first incarnation cannot be of this run's own checkpoint; a later one can, unless the run
        # reported saves and none came before it (a script whose saves no pattern reports: not judged).
        if int(e.get("incarnation", 0)) == first_inc or (first_save is not None and e.t_ns < first_save):
            at = f" (step {e.get('step')})" if e.get("step") is not None else ""
            return (f"rank {e.get('rank', 0)} loaded a checkpoint{at} before this run had saved one: "
                    "state from outside the run")  # fmt: skip
        break
    if not starts:
        return None
    idx = sorted(i for (n, i) in steps.t if n == first_inc)
    if len(idx) >= 2:
        spacing = min(b - a for a, b in zip(idx, idx[1:], strict=False) if b > a) if idx[-1] > idx[0] else 1
        if idx[0] > max(1, spacing):
            return (f"its first incarnation's first step was {idx[0]} (steps every {spacing}): it resumed from "
                    "state this run did not write")  # fmt: skip
    elif not idx:
        end = next((e for e in events if e.kind == "train_end" and int(e.get("incarnation", 0)) == first_inc), None)
        if end is not None and (end.get("step") or 0) > 0:
            return f"it finished at step {end.get('step')} without completing a single step: it resumed from elsewhere"
    return None


def _episodes(events: list[Event]) -> list[list[Event]]:
    """``detect`` events grouped into episodes: a new one starts after each ``restart`` or ``give_up``."""
    out: list[list[Event]] = []
    current: list[Event] = []
    for e in events:
        if e.kind == "detect":
            current.append(e)
        elif e.kind in ("restart", "give_up") and current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def blamed_ranks(ev: Event, events: list[Event]) -> set[int] | None:
    """The ranks a detection names as failed, resolved through the ``rank_start`` events written before it;
    None when it names nobody."""
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
        same = [e for e in starts if int(e.get("local_rank", -1)) == int(ev["local_rank"])
                and all(str(e.get(k)) == str(ev[k]) for k in keys)]  # fmt: skip
        if same:
            return {int(same[-1].get("rank", 0))}
    return None


def restarts_claimed(events: list[Event]) -> int:
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


def _blame(m: RunMetrics, events: list[Event], fault: Event, tf: int) -> None:
    """Whom the framework blamed in its first reaction (detections from the fault to its first restart)."""
    restart = _first(events, "restart", after_ns=tf)
    first = [e for e in events if e.kind == "detect" and e.t_ns >= tf and (restart is None or e.t_ns <= restart.t_ns)]
    for ev in first:
        blamed = blamed_ranks(ev, events)
        if blamed is None:
            continue
        m.blamed = ", ".join(f"rank {r}" for r in sorted(blamed)) or "no known rank"
        targets = fault_targets(fault)
        if not targets:
            m.missing["blame"] = "the fault names no target rank"
            return
        m.blame = "correct" if blamed & targets else "wrong"
        return
    m.blame = "none"


def compute_metrics(
    events: list[Event],
    control: list[Event] | None = None,
    total_steps: int | None = None,
) -> RunMetrics:
    """Metrics of one run from its sorted events; ``control`` is the control run's events (optional)."""
    m = _compute(events, control, total_steps)
    m.verdict = verdict(m)
    return m


def verdict(m: RunMetrics) -> str:
    """One line on what happened, from the metrics alone."""
    if m.outcome == "contaminated":
        return f"contaminated: {m.missing.get('contaminated', 'started from state it did not write')}"
    if m.control:
        if m.outcome != "completed":
            return f"control failed ({m.run_end_outcome})"
        text = "completed"
        if m.clean is False:
            text += f", but not clean: {m.restart_count or 0} restarts and {m.false_detections or 0} detections without a fault"
        return text + _restart_claim_note(m)
    if m.outcome == "fault_not_fired":
        return "fault did not fire"
    restarts = m.restart_count or 0
    plural = "restart" if restarts == 1 else "restarts"
    if m.crash_loop:
        if m.gave_up:
            text = f"crash loop: gave up after {restarts} {plural}"
        else:
            text = f"crash loop until the run ended ({restarts} {plural})"
    elif m.recovered:
        text = f"recovered after {restarts} {plural}" if restarts else "recovered in place"
        if not m.detected:
            text += ", not detected"
        if m.run_end_outcome == "deadline":  # wall_s and extra_wall_s then include the wait for the deadline
            text += "; training finished but the job did not exit before the deadline"
    elif m.gave_up:
        text = f"gave up after {restarts} {plural}"
    elif m.detected:
        text = f"detected, not recovered ({m.run_end_outcome})"
    else:
        text = f"not detected, not recovered ({m.run_end_outcome})"
    if m.blame == "wrong":
        text += f"; blamed {m.blamed}, not the faulted rank"
    if m.false_detections:
        text += f"; {m.false_detections} detection(s) before the fault"
    if m.fidelity == "diverged":
        text += "; final state diverged"
    if m.ranks_agree is False:
        text += "; replicas disagree"
    if m.checkpoint_outcome:
        text += f"; checkpoint: {m.checkpoint_outcome.replace('_', ' ')}"
    if m.trigger_step is not None and m.fault_step is not None and m.fault_step > m.trigger_step:
        late = m.fault_step - m.trigger_step
        text += (f"; fault landed at step {m.fault_step}, {late} step{'s' if late > 1 else ''} after its trigger "
                 f"(step {m.trigger_step})")  # fmt: skip
        if m.injection_latency_s is not None:
            text += f", injection latency {m.injection_latency_s * 1e3:.0f} ms"
    return text + _restart_claim_note(m)


def _restart_claim_note(m: RunMetrics) -> str:
    if m.restarts_claimed is None or m.restart_count is None or m.restarts_claimed == m.restart_count:
        return ""
    return (f"; restart count mismatch: the ranks show {m.restart_count}, the framework reported "
            f"{m.restarts_claimed}")  # fmt: skip


def _compute(events: list[Event], control: list[Event] | None, total_steps: int | None) -> RunMetrics:
    m = RunMetrics()
    miss = m.missing
    start = _first(events, "run_start")
    if start is None:
        miss["wall_s"] = "no run_start event"
        m.outcome = "error"
        return m
    m.suite = start.get("suite")
    m.scenario = start.get("scenario")
    m.framework = start.get("framework")
    m.fault = start.get("fault")
    m.repeat = start.get("repeat")
    m.control = bool(start.get("control"))
    info = _first(events, "framework_info")
    if info is not None:
        m.versions = dict(info.get("versions") or {})
        m.timeouts = dict(info.get("timeouts") or {})
        m.timeout_problems = list(info.get("timeout_problems") or [])
    for pred in (e for e in events if e.kind == "detection_prediction"):
        m.timeout_problems += [p for p in pred.get("problems") or [] if p not in m.timeout_problems]
    end = next((e for e in reversed(events) if e.kind == "run_end"), None)
    t0 = start.t_ns
    if end is not None:
        m.run_end_outcome = end.get("outcome")
        m.wall_s = _s(end.t_ns - t0)
    else:
        miss["wall_s"] = "no run_end event (harness killed?)"
    events, caused = _harness_cut(events)
    harness_reactions = sum(1 for e in caused if e.kind in ("detect", "restart", "give_up"))
    if control is not None:
        control, _ = _harness_cut(control)

    steps = _Steps.from_events(events)
    final = _final(events)
    if final is not None:
        m.final_step = _final_step(final, steps)
        m.final_loss = final.get("loss")
        m.digest = final.get("digest") or None
    finished = final is not None and m.final_step is not None and (total_steps is None or m.final_step >= total_steps)
    if final is not None and m.final_step is None:
        miss["final_step"] = "train_end names no step and no step was reported"
    m.restart_count = max((int(e.get("incarnation", 0)) for e in events if e.kind == "rank_start"), default=0)
    if any(e.kind == "restart" for e in events):
        m.restarts_claimed = restarts_claimed(events)
    else:
        miss["restarts_claimed"] = "the framework reported no restart (no restart line of it was recognised)"
    if final is not None:
        m.world_size_final, m.global_batch_final = _world(events, int(final.get("incarnation", 0)))

    saves = _save_durations(events)
    if saves:
        m.checkpoint_save_s = statistics.median(saves)
    else:
        miss["checkpoint_save_s"] = "no complete checkpoint save with its begin and end on the timeline"

    # productive time: last execution of each step index
    last_exec: dict[int, tuple[int, int]] = {}
    for (inc, idx), t in steps.t.items():
        if idx not in last_exec or t > steps.t[last_exec[idx]]:
            last_exec[idx] = (inc, idx)
    durations = [steps.duration[k] for k in last_exec.values() if k in steps.duration]
    if durations:
        m.productive_s = sum(durations)
        if m.wall_s:
            m.goodput = m.productive_s / m.wall_s
    else:
        miss["productive_s"] = miss["goodput"] = "no step durations on the timeline"

    dirty = contamination(events, steps)
    m.contaminated = dirty is not None
    if dirty is not None:
        m.outcome = "contaminated"
        miss["contaminated"] = dirty
        for k in (*FAULT_METRICS, "fidelity", "blame", "false_detections"):
            miss[k] = f"contaminated: {dirty}"
        return m

    _fidelity(m, final, control)
    # Each rank's final digest (its newest train_end: TorchFT's replica groups end in different incarnations).
    latest: dict[int, Event] = {}
    for e in events:
        if e.kind == "train_end" and e.get("digest"):
            r = int(e.get("rank", 0))
            if r not in latest or int(e.get("incarnation", 0)) >= int(latest[r].get("incarnation", 0)):
                latest[r] = e
    if len(latest) >= 2:
        m.ranks_agree = len({e.get("digest") for e in latest.values()}) == 1
    elif latest:
        miss["ranks_agree"] = "only one rank reported a final digest"
    m.step_time_s = _median_interval(steps, None, None)
    m.gave_up = any(e.kind == "give_up" for e in events)
    m.clock_offset_bound_s = offset_bound_s(events)
    if m.clock_offset_bound_s is None:
        miss["clock_offset_bound_s"] = "no clock_offset events (one host, one clock)"
    m.crash_loop = _crash_loop(events, steps)
    if control is not None:
        c_start, c_end = _first(control, "run_start"), next(
            (e for e in reversed(control) if e.kind == "run_end"), None
        )
        if m.wall_s is not None and c_start and c_end:
            m.extra_wall_s = m.wall_s - _s(c_end.t_ns - c_start.t_ns)
        else:
            miss["extra_wall_s"] = "control run has no wall time"
    elif not m.control:
        miss["extra_wall_s"] = "no control run"

    fault = _first(events, "fault_inject")
    m.checkpoint_outcome = classify_checkpoint_outcome(events, control=m.control)
    if m.control:
        m.outcome = "completed" if finished else "failed"
        m.false_detections = len(_episodes(events))
        m.clean = m.outcome == "completed" and m.false_detections == 0 and m.restart_count == 0
        for k in FAULT_METRICS:
            miss[k] = "control run (no fault)"
        return m
    if fault is None:
        m.outcome = "fault_not_fired"
        skipped = _first(events, "fault_skipped")
        why = f"fault skipped: {skipped.get('reason')}" if skipped else "the trigger never fired"
        for k in ("time_to_detect_s", "time_to_resume_s", "lost_steps"):
            miss[k] = why
        return m

    effect = fault.get("effect_t_ns")
    tf = int(effect) if effect is not None else fault.t_ns
    # A stamp taken when an engine call returned, or when the engine reported it, may come after the fault's
    # first consequence (a docker kill: the rank's exec exits 35 ms in, the engine's die event at 72 ms): the
    # fault took effect no later than the first process exit or framework detection after the injector began.
    seen = [e.t_ns for e in events if e.kind in ("proc_exit", "detect") and fault.t_ns <= e.t_ns < tf]
    if seen:
        tf = min(seen)
    if effect is not None:
        m.injection_latency_s = _s(tf - fault.t_ns)
    else:
        miss["injection_latency_s"] = "the injector recorded no moment of effect"
    if fault.get("trigger_step") is not None:
        m.trigger_step = int(fault["trigger_step"])
    m.fault_class = fault_class(fault.get("injector"), fault.get("params"))
    m.fault_t_s = _s(tf - t0)
    m.fault_count = sum(1 for e in events if e.kind == "fault_inject")
    m.false_detections = len(_episodes([e for e in events if e.t_ns < fault.t_ns]))
    revert = _first(events, "fault_revert", after_ns=tf)
    t_win_end = revert.t_ns if revert is not None else (end.t_ns if end is not None else events[-1].t_ns)
    m.fault_step_time_s = _median_interval(steps, tf, t_win_end)
    c_step = _median_interval(_Steps.from_events(control), None, None) if control is not None else None
    if m.fault_step_time_s is not None and c_step:
        m.slowdown = m.fault_step_time_s / c_step
    else:
        miss["slowdown"] = "no steps in the fault window" if m.fault_step_time_s is None else "no control run"
    if end is not None and not finished:
        m.time_burned_s = _s(end.t_ns - tf)
    fault_inc = max(
        (int(e.get("incarnation", 0)) for e in events if e.kind == "rank_start" and e.t_ns <= tf), default=0
    )
    m.checkpoint_age_s = checkpoint_age(events, tf)
    if m.checkpoint_age_s is None:
        miss["checkpoint_age_s"] = "no checkpoint had completed before the fault"
    before = steps.before(tf)
    max_before = max((idx for _, idx in before), default=0)
    m.fault_step = max((idx for inc, idx in before if inc == fault_inc), default=max_before)
    restarted = [e.t_ns for e in events if e.kind == "rank_start" and e.t_ns > tf
                 and int(e.get("incarnation", 0)) > fault_inc]  # fmt: skip
    if restarted:
        # Steps the faulted incarnation still completed after the fault (in flight when it hit) were lost too.
        max_before = max([max_before] + [i for (n, i), t in steps.t.items() if n == fault_inc and t < min(restarted)])

    prediction = next((e for e in events if e.kind == "detection_prediction" and e.get("fault") == fault.get("fault")),
                      None)  # fmt: skip
    if prediction is not None and prediction.get("expected_s") is not None:
        m.predicted_detect_s = float(prediction["expected_s"])
        m.predicted_by = str(prediction.get("decided_by") or "")
    else:
        miss["predicted_detect_s"] = (str(prediction.get("note")) if prediction is not None and prediction.get("note")
                                      else "no detection model for this framework and fault")  # fmt: skip

    detect = _first(events, "detect", after_ns=tf)
    m.detected = detect is not None
    if detect is not None:
        m.detected_by = str(detect.get("framework") or detect.src)
        m.time_to_detect_s = _s(detect.t_ns - tf)
        m.detect_t_s = _s(detect.t_ns - t0)
        m.badput_detect_s = m.time_to_detect_s
        _blame(m, events, fault, tf)
    else:
        why = f"no detection by framework '{m.framework}' before the run ended"
        if harness_reactions:
            why += f" (it reacted {harness_reactions} time(s) only after the harness began tearing the run down)"
        miss["time_to_detect_s"] = miss["blame"] = why

    requeue = _first(events, "restart", after_ns=tf)
    back = _first(events, "sched_state", after_ns=requeue.t_ns, state="running") if requeue is not None else None
    if requeue is not None and back is not None:
        m.scheduler_delay_s = _s(back.t_ns - requeue.t_ns)
    else:
        miss["scheduler_delay_s"] = "no scheduler state after a restart (not a scheduler-driven framework)"

    per_step_commit = any(e.kind == "step_skipped" or (e.kind == "step" and e.get("committed")) for e in events)
    if per_step_commit:  # nothing rolls back: a survivor's step after the fault is progress, not in-flight work
        max_before = max((idx for _, idx in before), default=0)
    m.world_size_before, m.global_batch_before = _world(events, fault_inc)
    rejoin = next((t for t, (inc, _) in steps.after(tf) if inc > fault_inc), None)
    if rejoin is not None:
        m.time_to_rejoin_s = _s(rejoin - tf)
    else:
        miss["time_to_rejoin_s"] = "nothing restarted after the fault"
    resume_key = None
    for t, (inc, idx) in steps.after(tf):
        if (idx > max_before) if per_step_commit else (inc > fault_inc or (not restarted and idx > max_before)):
            resume_key, resume_t = (inc, idx), t
            break
    m.recovered = bool(finished and resume_key is not None)
    m.outcome = "recovered" if m.recovered else "not_recovered"
    m.failure_class = "deterministic" if m.crash_loop else ("transient" if m.recovered else None)
    if resume_key is None:
        reason = f"no training step completed after the fault (run ended: {m.run_end_outcome})"
        for k in ("time_to_resume_s", "time_to_catch_up_s", "lost_steps", "lost_work_s"):
            miss[k] = reason
        for k in ("badput_restart_init_s", "badput_restore_s", "badput_recompute_s"):
            miss[k] = reason
        return m
    m.time_to_resume_s = _s(resume_t - tf)
    resume_step = next((e for e in events if e.kind == "step" and e.t_ns == resume_t
                        and int(e.get("incarnation", 0)) == resume_key[0]), None)  # fmt: skip
    m.world_size_after, m.global_batch_after = _world(events, resume_key[0], resume_step)
    m.resume_t_s = _s(resume_t - t0)
    catch = next(((t, k) for t, k in steps.after(tf) if k[1] > max_before), None)
    if catch is not None:
        m.time_to_catch_up_s = _s(catch[0] - tf)
    else:
        miss["time_to_catch_up_s"] = "the job never got beyond the step reached at the fault"

    restored = resume_key[1] - 1
    m.lost_steps = max(0, max_before - restored)
    skipped_s = 0.0
    if per_step_commit:
        skipped_by_index: dict[int, float] = {}
        for e in events:
            if e.kind == "step_skipped" and e.t_ns >= tf:
                i = int(e["step"])
                d = float(e.get("duration_s") or 0.0)
                skipped_by_index[i] = min(skipped_by_index[i], d) if i in skipped_by_index else d
        m.skipped_steps = len(skipped_by_index)
        skipped_s = sum(skipped_by_index.values())
    if m.lost_steps == 0:
        m.lost_work_s = skipped_s
    else:
        t_hi = steps.t.get((fault_inc, max_before))
        t_lo = steps.t.get((fault_inc, restored))
        if t_lo is None:  # restarted from scratch: from the faulted incarnation's first rank event
            first = _first(events, "rank_start", incarnation=fault_inc)
            t_lo = first.t_ns if first else None
        if t_hi is not None and t_lo is not None:
            m.lost_work_s = _s(t_hi - t_lo) + skipped_s
        else:
            miss["lost_work_s"] = "the lost steps are not on the timeline"

    m.lost_steps += m.skipped_steps or 0
    new_inc = resume_key[0]
    m.rollback = not per_step_commit and new_inc != fault_inc
    if per_step_commit:  # survivors never stopped: the stall is waiting for a new quorum; healing is elsewhere
        react = detect.t_ns if detect is not None else tf
        started = resume_t - int(steps.duration.get(resume_key, 0.0) * 1e9)
        m.badput_restart_init_s = max(0.0, _s(started - react))
        m.badput_restore_s = m.badput_recompute_s = 0.0
        return m
    if new_inc == fault_inc:  # recovered in place: nothing restarted, restored or recomputed
        m.badput_restart_init_s = m.badput_restore_s = m.badput_recompute_s = 0.0
        return m
    react = detect.t_ns if detect is not None else tf
    loads_b = [e.t_ns for e in events if e.kind == "ckpt_load_begin" and e.get("incarnation") == new_inc]
    loads_e = [e.t_ns for e in events if e.kind == "ckpt_load_end" and e.get("incarnation") == new_inc]
    if loads_b and loads_e:
        restore_b, restore_e = min(loads_b), max(loads_e)
        m.badput_restore_s = _s(restore_e - restore_b)
    else:
        first_dur = steps.duration.get(resume_key, 0.0)
        restore_b = restore_e = resume_t - int(first_dur * 1e9)
        m.badput_restore_s = 0.0
    m.badput_restart_init_s = _s(restore_b - react)
    redo = steps.t.get((new_inc, max_before))
    if m.lost_steps == 0:
        m.badput_recompute_s = 0.0
    elif redo is not None:
        m.badput_recompute_s = _s(redo - restore_e)
    else:
        miss["badput_recompute_s"] = "the recovered job did not redo the lost steps"
    return m


def _median_interval(steps: _Steps, t_from: int | None, t_to: int | None) -> float | None:
    """Median seconds between consecutive step completions of one incarnation, over the intervals that overlap
    the window (so a stall spanning the whole window still counts)."""
    by_inc: dict[int, list[tuple[int, int]]] = {}
    for (inc, idx), t in steps.t.items():
        by_inc.setdefault(inc, []).append((idx, t))
    gaps = []
    for items in by_inc.values():
        items.sort()
        for (i0, t_a), (i1, t_b) in zip(items, items[1:], strict=False):
            if i1 != i0 + 1:
                continue
            if (t_from is None or t_b > t_from) and (t_to is None or t_a < t_to):
                gaps.append(_s(t_b - t_a))
    return statistics.median(gaps) if gaps else None


def _crash_loop(events: list[Event], steps: _Steps) -> bool:
    """Two or more incarnations that failed after reaching the same last step."""
    finals = {int(e.get("incarnation", 0)) for e in events if e.kind == "train_end"}
    incs = sorted({int(e.get("incarnation", 0)) for e in events if e.kind == "rank_start"})
    last_steps = []
    for inc in incs:
        if inc in finals:
            continue
        idx = [i for (n, i) in steps.t if n == inc]
        last_steps.append(max(idx) if idx else 0)
    counts: dict[int, int] = {}
    for ls in last_steps:
        counts[ls] = counts.get(ls, 0) + 1
    return any(c >= 2 for c in counts.values())


def _save_durations(events: list[Event]) -> list[float]:
    begins: dict[tuple[int, int, int], int] = {}
    out = []
    for ev in events:
        key = (int(ev.get("incarnation", 0)), int(ev.get("rank", 0)), int(ev.get("step") or 0))
        if ev.kind == "ckpt_save_begin":
            begins[key] = ev.t_ns
        elif ev.kind == "ckpt_save_end" and ev.get("complete") and key in begins:
            out.append(_s(ev.t_ns - begins[key]))
    return out


def _fidelity(m: RunMetrics, final: Event | None, control: list[Event] | None) -> None:
    if m.control:
        return
    if control is None:
        m.missing["fidelity"] = "no control run"
        return
    c_final = _final(control)
    if c_final is None:
        m.missing["fidelity"] = "the control run did not finish training"
        return
    if final is None:
        m.missing["fidelity"] = "this run did not finish training"
        return
    if final.get("step") != c_final.get("step"):
        m.fidelity = "diverged"
    else:
        m.fidelity = "exact" if final.get("digest") == c_final.get("digest") else "diverged"
    if final.get("loss") is not None and c_final.get("loss") is not None:
        m.loss_diff = float(final["loss"]) - float(c_final["loss"])


def checkpoint_age(events: list[Event], t_ns: int) -> float | None:
    """Seconds since the newest complete checkpoint save before ``t_ns`` (None: none completed)."""
    done = [e.t_ns for e in events if e.kind == "ckpt_save_end" and e.get("complete") and e.t_ns <= t_ns]
    return _s(t_ns - max(done)) if done else None
