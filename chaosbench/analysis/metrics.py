"""Recovery metrics of one run, computed only from its timeline (and its control run's timeline).

:func:`compute_metrics` indexes the timeline once (:class:`~chaosbench.analysis.timeline_index.TimelineIndex`)
and assembles :class:`RunMetrics` from the metric families: :mod:`~chaosbench.analysis.timing` (fault time,
detection, resume, lost work, badput, step times), :mod:`~chaosbench.analysis.fidelity` (final state, replicas,
contamination), :mod:`~chaosbench.analysis.attribution` (the harness's share, blame, detection episodes,
claimed restarts, predictions, crash loops), :mod:`~chaosbench.analysis.goodput` (wall and productive time,
checkpoint cost) and :mod:`~chaosbench.analysis.checkpoint_outcome`.

Definitions (normative; all times in seconds on the timeline's one clock, ``fault`` = the first
``fault_inject`` event's stamp, taken just before the injector acted; each fault of a run is also measured on its
own, ``faults`` below):

- ``time_to_detect_s``: first framework reaction (a ``detect`` event, or a ``give_up`` before any: a framework
  that stopped trying noticed the failure) at or after the fault, minus the fault time. Neither before the run
  ended: missing, and ``detected`` is False.
- ``time_to_resume_s``: first completed training step after recovery, minus the fault time. When a newer
  incarnation than the one running at the fault started after it, that is the newer incarnation's first
  step (steps the faulted incarnation still completed after the fault were in flight and count as completed
  before it); otherwise (recovery in place, e.g. a hang that ended) the first step beyond every step
  completed before the fault.
  Per-step commit (the timeline has ``step_skipped`` events or steps marked ``committed``: TorchFT): nothing
  is rolled back and survivors that keep committing are the job, so it is the first committed step, by any
  incarnation, with an index beyond every step completed before the fault, completed after the framework's
  first reaction to it (a survivor's step in flight at the fault commits at once: that is no recovery; the
  same holds for ``time_to_catch_up_s``).
- ``time_to_rejoin_s``: first completed step of an incarnation newer than the faulted one (the restarted rank,
  replica group or node is training again), minus the fault time; missing when nothing restarted. Per-step
  commit (each replica group numbers its incarnations): the first step in whose quorum a rank of an incarnation
  begun after the fault took part.
- ``time_to_catch_up_s``: first completion, after the fault, of a step index beyond every step completed
  before the fault (new progress), minus the fault time.
- ``lost_steps``: steps completed before the fault that had to be recomputed: (highest step completed
  before the fault, in-flight ones included) - (step the recovered job restarted from; the first step after
  recovery minus one). Per-step commit: plus ``skipped_steps``, the distinct step indices computed but not
  committed after the fault and before the next one (``step_skipped``): their work was discarded although
  nothing rolled back.
- ``lost_work_s``: the seconds those lost steps had taken the first time: stamp of the highest step
  completed before the fault minus the stamp of the step recovery restarted from (in the faulted
  incarnation; its first event when it restarted from scratch). Per-step commit: plus, for each skipped step
  index, the shortest ``duration_s`` (compute thrown away, without the wait in the failed collective) reported
  for it; missing when none of a skipped step's reports gives one (a user's script whose line only says the
  step did not commit).
- ``world_size_before`` / ``_after`` / ``_final`` and ``global_batch_before`` / ``_after`` / ``_final``: the
  world size (``rank_start``) of the incarnation running at the fault, of the one that resumed training and of
  the one that finished it; the global batch (samples per optimizer step) from the resuming step's
  ``global_batch`` or else that incarnation's ``rank_start``, when the workload reports it. An elastic job that
  shrank trains on a different batch, data split and schedule afterwards; fidelity compares against a control
  that never did.
- ``restart_count``: restarts the ranks show over the whole run: per replica group (TorchFT's restart on their
  own; a job without groups is one), the incarnations it started in beyond its first, summed. Each fault's own
  (incarnations begun from it to its resume) are its ``faults[].restarts``.
- ``checkpoint_age_s``: fault time minus the newest complete checkpoint save (``ckpt_save_end`` with
  ``complete``) before it. Missing when no checkpoint had completed.
- ``checkpoint_save_s``: median duration of complete checkpoint saves (begin to end, per rank).
- ``checkpoint_interval_s``: median seconds between consecutive complete checkpoints of one incarnation (the
  first complete save of each step: ranks saving the same step, or a file and its copy, are one).
- ``wall_s``: ``run_end`` minus ``run_start``.
- ``harness_cpu_s`` / ``harness_cpu_share``: CPU seconds the harness process itself used during the run (all its
  threads: timeline follower, log readers, fault controllers; not the ranks or the container engine), and that
  over ``wall_s`` (1.0 = one core busy). With ``--jobs`` the harness serves several runs at once and the figure
  counts all of them (``run_end``'s ``concurrent_runs`` says how many; the share is then missing).
- ``productive_s``: for every step index, the compute time of its last execution (the one that survived
  into the final state): the step's own ``duration_s`` when the workload reports it, else the interval
  since the rank's previous step or checkpoint event of that incarnation (an incarnation's first step after
  its ranks' start has none: start-up is not compute). ``goodput`` = productive_s / wall_s.
- ``extra_wall_s``: wall_s minus the control run's wall_s (same framework, no fault).
- badput by stage (after the fault): ``badput_detect_s`` = time to detect; ``badput_restart_init_s`` =
  detection (the fault, if undetected) to the start of the restore in the new incarnation (its first
  ``ckpt_load_begin``, else its first step's start); ``badput_restore_s`` = checkpoint load in the new
  incarnation (earliest begin to latest end); ``badput_recompute_s`` = end of the restore to the
  completion, again, of the highest step completed before the fault. Recovery in place has no restart,
  restore or recompute (0). Per-step commit: restart+init is detection to the start of the resumed step (the
  wait for a new quorum); restore and recompute are 0 (a restarted group heals from a peer while the others
  train).
- the four stages of a recovery (``stage_*_s``), from the fault to ``time_to_recover_s``, each from the end of
  the one before (the fault for the first):

  - ``stage_detect_s``: to the detection (= ``time_to_detect_s``);
  - ``stage_reschedule_s``: to the replacement capacity being there: the last ``rank_start`` of the incarnation
    that resumed training, every rank of the new world placed (whether on a rebooted node, a spare or fewer
    nodes); per-step commit (TorchFT), the last ``rank_start`` of the lost replica group's replacement (started
    before the next fault: a later one is that fault's restart).
    ``stage_reschedule_runtime_s`` is the share of it the runtime measured (it may start before the detection):
    the scheduler's ``scheduler_delay_s`` (Slurm), else the node replacement (``node_exit`` of a node to the
    ``node_start`` of its reboot, of the spare that took it over, or of a framework's spare node: docker), else
    a framework's spare start (``proc_exit`` of a killed agent to the ``proc_start`` of a ``*.spare`` agent:
    ``torchrun-elastic``); missing, with the reason, otherwise;
  - ``stage_reshard_or_replace_s``: to the end of the restore (the latest ``ckpt_load_end`` of that
    incarnation: onto a smaller world it is a reshard; without a load, the start of its first step) or, per-step
    commit, of the replacement's heal (its latest ``heal_end``);
  - ``stage_resume_s``: to the first completion of a step beyond the step reached at the fault (catch-up: the
    recomputed steps and one more); per-step commit with a replacement, the replacement's first committed such
    step of the job (a step it committed alone from stale state is not).

  Identity: the stages present add up to ``time_to_recover_s`` (fault to the end of ``stage_resume_s``). It equals
  ``time_to_catch_up_s`` unless, under per-step commit, a replacement joined: then the job caught up without
  waiting for it and the stages follow the replacement. A stage that does not apply is 0 with a note in
  ``notes`` (recovery in place, or a job that continued without the lost replica: nothing rescheduled or
  restored); a stage whose end is not on the timeline is missing (with the reason) and the next one is measured
  from the end before it (undetected: reschedule from the fault); an end stamped before the previous one counts
  as that one (0, noted).
- ``fidelity``: ``exact`` when the final digest equals the control's, ``diverged`` when it differs or training
  ended at another step (``loss_diff`` = final loss - control's). The digest is the final artifact's
  (``artifact_digest``: the tensors of the suite's ``fidelity_from``) when the run has one, else the final
  ``train_end``'s (rank 0 in the last incarnation). Missing when either run did not finish training, or either
  has no digest (a digest missing on both sides is not a match), with the reason. ``fidelity_reason``: why a divergence was expected: the run
  trained on another world size and global batch than the control (``world size 4 -> 2: global batch 32 -> 16``:
  a shrunken job trains on another batch, data split and schedule); still ``diverged`` (an SLO
  ``fidelity == exact`` fails), and the verdict says it was expected. A world size that changed while the global
  batch stayed the same (TorchFT's ``global`` batch mode) is no excuse: the workload promises the same state.
- ``fault_count``: ``fault_inject`` events (a repeating trigger or a planted bug fires more than once).
- ``detected_by``: who wrote the first detection (a framework name, or ``loss-check`` for the workload's guard).
  ``detected_via``: what noticed the failure (``process exit``, ``process-group timeout`` (a peer's collective
  timed out and it exited), ``step watchdog``, ``framework heartbeat``, ``quorum change``, ``collective error``,
  ``scheduler job state``, ``loss guard``; see :func:`~chaosbench.analysis.attribution.detection_mechanism`).
- ``gave_up``: the framework said it stopped trying (``give_up``), as opposed to looping until the deadline.
- ``crash_loop``: two or more incarnations each failed after reaching the same last step (a deterministic
  failure: restarting cannot help); ``failure_class`` is ``deterministic`` then, ``transient`` when a
  restart recovered, else None. ``time_burned_s``: run end minus the fault time when not recovered.
- ``ranks_agree``: every rank's final digest (its newest ``train_end``) is the same (False exposes silent
  corruption that made replicas diverge); missing when fewer than two ranks reported one.
- ``step_time_s``: median interval between consecutive step completions over the whole run (same
  incarnation); ``fault_step_time_s``: the mean of the intervals overlapping the fault window (fault_inject's
  effect to the start of its revert, or the run's end: the job's time per step while the fault certainly lasted,
  a stall in full); ``slowdown``: how many times longer those same steps took than in the control run (the
  sum of the window's intervals over the sum of the control's intervals of the same step indices, so a
  checkpoint save in the window is matched by the control's).
- ``verdict``: one line saying what the framework did (recovered after N restarts / in place, not detected,
  gave up, crash loop, diverged silently, ...), derived from the fields above.
- ``faults``: every fault of the run (each ``fault_inject``, in the order they took effect) measured on its
  own (:mod:`chaosbench.analysis.faults`): its detection, blame, resume, lost work and restarts within its window
  (to the next fault), and how it ended: ``recovered``, ``outlasted`` (the job went on with no framework
  reaction), ``interrupted`` (the next fault hit before its job resumed; that recovery is the next one's) or
  ``not_recovered``. The run-level fault figures (fault time, detection, resume, lost work, stages, badput, ...)
  are the first fault's; ``fault_count`` is how many there were.
- ``outcome``: ``completed`` (control finished), ``recovered`` (the faults fired, the framework reacted and
  training finished), ``outlasted`` (training finished and no fault drew any framework reaction: a hang that
  ended by itself, a held GIL, an ignored signal; its cost is its stall, not a recovery), ``not_recovered`` (a
  fault fired and training did not finish before the run ended), ``fault_not_fired``, ``failed`` (a control
  that did not finish). A run that did not recover has no figure of a recovery
  (:data:`RECOVERY_METRICS`: resume, catch-up, rejoin, lost work, badput after detection, the stages after
  detection, world after): each is missing with the reason.

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
  completed. Without a ``train_end`` (a script with no closing line) training ended when the job ended by
  itself with every rank exiting 0 (``run_end`` ``completed``), at the last step its newest stepping incarnation
  completed. Training finished when it ended at the workload's total (``total_steps``) or beyond;
  ``steps_short``: how many steps short of it a job that ended by itself stopped (the verdict says so, with
  the step counting in force, ``notes["steps"]``: a 0-based counter read as 1-based ends one short).
- Steps: a job step is done once every rank that reports steps in its incarnation has reported it or a later
  one (ranks that log at other cadences, or only the main process logging, hold nothing up:
  :class:`~chaosbench.analysis.timeline_index.JobSteps`); step triggers count the same way.
- ``contaminated``: the run started from state it did not write: a rank loaded a checkpoint before this run had
  saved any, or the first incarnation's first step (per-step commit: the job's first committed step) is beyond
  the start of training. Such a run is not measured
  (outcome ``contaminated``, the reason in ``verdict``).
- ``blamed`` / ``blame``: the ranks the framework named as failed in its first reaction to the fault (the
  ``detect`` events from the fault to its first ``restart``: a ``blame_rank``, a torchrun ``local_rank`` on a
  node, a ``blame_node`` or TorchFT ``blame_groups``, resolved to ranks through the ``rank_start`` events);
  ``correct`` when every rank named is a target of the fault, ``imprecise`` when the targets are among more
  (a whole node or every rank named for one rank's fault), ``wrong`` when none is, ``none`` when the framework
  detected the fault without naming anyone. Missing when nothing was detected.
- ``false_detections``: detection episodes (``detect`` events not separated by a ``restart``) in a control run
  or a run whose fault never fired, or, in a fault run, episodes no fault explains: begun before the first fault,
  or after a fault's job had resumed and before the next fault (flaps after the recovery). ``clean`` (controls): completed with no restart and no detection.
- ``restarts_claimed``: restarts the framework itself reported (``restart`` events, most by any one process: an
  agent, a replica group's launcher, the scheduler); ``restart_count`` is what the ranks' incarnations show. A
  difference is named in the verdict.
- ``fault_class``: the fleet fault class of the first fault (``crash``, ``node``, ``hang``, ``sdc``; see
  :func:`chaosbench.analysis.fleet.fault_class`), for the fleet projection. ``rollback``: the recovery restarted from
  a checkpoint (False: per-step commit, or recovered in place).
- ``predicted_detect_s`` / ``predicted_by``: when the timeouts in force let the framework detect this fault
  (``detection_prediction`` event written before the run by the framework adapter: the deciding timeout plus the
  interval that polls it), and those timeouts; missing when the adapter has no model for the fault.

Serving runs (the timeline has ``load_start``: replicas behind a balancer under a load) are measured by
:mod:`~chaosbench.analysis.serving`: requests, failed and retried requests, error rate and error-budget burn, latency
quantiles before, during and after the fault, capacity lost (replica-seconds a replica could not serve);
``time_to_detect_s`` (the balancer marking
the faulted replica down, or the first failed request), ``time_to_recover_s`` (the error rate back under the SLO for
a recovery window), ``detected``, ``recovered`` and ``outcome`` by its definitions; their training metrics (steps,
lost work, fidelity, the recovery stages) stay None, with the reason. ``serving`` is True for them.

A metric that cannot be measured is None, with the reason in ``missing``; a value that needs saying (a stage that
does not apply is 0) has a note in ``notes``. ``workload`` and ``strategy`` (the framework entry's recovery
strategy: ``restart-in-place``, ``hot-spare``, ``shrink``, ``continue``) come from the run's configuration.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from chaosbench.analysis import attribution, fidelity, goodput, serving, timing
from chaosbench.analysis import faults as per_fault
from chaosbench.analysis.checkpoint_outcome import MODEL_LOADS, classify_checkpoint_outcome, undamaged_reason
from chaosbench.analysis.fleet import fault_class
from chaosbench.analysis.serving import ServingRecord
from chaosbench.analysis.timeline_index import TimelineIndex, ns_to_s
from chaosbench.timeline import Event
from chaosbench.timeline.clocks import offset_bound_s, uncorrected_hosts


@dataclass
class TrainingRecord:
    """The fields of :class:`RunMetrics` before a serving run's (:class:`.serving.ServingRecord`): which run
    it is and its context, its outcome, detection and recovery (every run has them), and a training run's own
    metrics (definitions: the module docstring)."""

    suite: str | None = None
    scenario: str | None = None
    framework: str | None = None
    fault: str | None = None
    repeat: int | None = None
    control: bool = False
    workload: str | None = None
    strategy: str | None = None
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
    checkpoint_interval_s: float | None = None
    wall_s: float | None = None
    harness_cpu_s: float | None = None
    harness_cpu_share: float | None = None
    productive_s: float | None = None
    goodput: float | None = None
    extra_wall_s: float | None = None
    badput_detect_s: float | None = None
    badput_restart_init_s: float | None = None
    badput_restore_s: float | None = None
    badput_recompute_s: float | None = None
    stage_detect_s: float | None = None
    stage_reschedule_s: float | None = None
    stage_reschedule_runtime_s: float | None = None
    stage_reshard_or_replace_s: float | None = None
    stage_resume_s: float | None = None
    time_to_recover_s: float | None = None
    fault_count: int | None = None
    detected_by: str | None = None
    detected_via: str | None = None
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
    fidelity_reason: str | None = None
    loss_diff: float | None = None
    world_size_before: int | None = None
    world_size_after: int | None = None
    world_size_final: int | None = None
    global_batch_before: int | None = None
    global_batch_after: int | None = None
    global_batch_final: int | None = None
    final_step: int | None = None
    total_steps: int | None = None
    steps_short: int | None = None
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
    capture_limit: str | None = None
    startup_failure: str | None = None
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    timeouts: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunMetrics(ServingRecord, TrainingRecord):
    """One run's metrics, as ``metrics.json`` and the results table hold them: the fields of
    :class:`TrainingRecord`, then those of :class:`~chaosbench.analysis.serving.ServingRecord` (a serving
    run's, declared there), then every fault's figures. A dataclass takes its bases' fields in reverse method
    resolution order: ServingRecord is named first so that TrainingRecord's fields come first (the keys'
    order)."""

    # Every fault of the run, each measured on its own (chaosbench.analysis.faults.FaultFigures as dicts).
    faults: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunMetrics:
        """The metrics as :meth:`to_dict` wrote them (``metrics.json``); unknown keys (an older or newer
        chaosbench) are left out."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


#: Fields of RunMetrics that say which run it is or record its context, rather than measure it.
BOOKKEEPING = frozenset(
    {
        "suite",
        "scenario",
        "framework",
        "fault",
        "repeat",
        "control",
        "run_dir",
        "missing",
        "notes",
        "versions",
        "timeouts",
        "timeout_problems",
        "workload",
        "strategy",
        "serving",
        "capture_limit",
        "startup_failure",
        "total_steps",
    }
)


def metric_names() -> list[str]:
    """Every measured metric (what an SLO, a baseline or a report column can name): the fields of RunMetrics."""
    return [f for f in RunMetrics.__dataclass_fields__ if f not in BOOKKEEPING]


#: Metrics that only exist for a run with a fault.
FAULT_METRICS = (
    "time_to_detect_s",
    "time_to_resume_s",
    "time_to_rejoin_s",
    "time_to_catch_up_s",
    "lost_steps",
    "lost_work_s",
    "checkpoint_age_s",
    "extra_wall_s",
    "badput_detect_s",
    "badput_restart_init_s",
    "badput_restore_s",
    "badput_recompute_s",
    "fault_step_time_s",
    "slowdown",
    "time_burned_s",
    "scheduler_delay_s",
    "injection_latency_s",
    "fault_step",
    "predicted_detect_s",
    "blame",
    "stage_detect_s",
    "stage_reschedule_s",
    "stage_reschedule_runtime_s",
    "stage_reshard_or_replace_s",
    "stage_resume_s",
    "time_to_recover_s",
)

#: Figures of a recovery: a run that did not recover has none of them (missing, with the reason).
RECOVERY_METRICS = (
    "time_to_resume_s",
    "time_to_catch_up_s",
    "time_to_rejoin_s",
    "lost_steps",
    "lost_work_s",
    "skipped_steps",
    "badput_restart_init_s",
    "badput_restore_s",
    "badput_recompute_s",
    "stage_reschedule_s",
    "stage_reschedule_runtime_s",
    "stage_reshard_or_replace_s",
    "stage_resume_s",
    "time_to_recover_s",
    "world_size_after",
    "global_batch_after",
)

#: The four stages of a recovery, in order: they add up to ``time_to_recover_s``.
STAGE_METRICS = tuple(f"stage_{name}_s" for name in timing.STAGE_NAMES)


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
    text = serving_verdict(m) if m.serving else _training_verdict(m)
    if "clocks" in m.notes:
        text += f"; {m.notes['clocks']}"
    if m.capture_limit:
        text += f"; a process's write was refused for its size ({m.capture_limit})"
    if m.startup_failure:
        text += f"; {m.startup_failure}"
    return text


def _ended_after_training(m: RunMetrics) -> str:
    """How a job whose training finished ended, where that was not a clean exit."""
    if m.run_end_outcome == "deadline":  # wall_s and extra_wall_s then include the wait for the deadline
        return "; training finished but the job did not exit before the deadline"
    if m.run_end_outcome not in (None, "completed"):
        return f"; training finished but the job ended {m.run_end_outcome}"
    return ""


def _training_verdict(m: RunMetrics) -> str:
    if m.outcome == "contaminated":
        return f"contaminated: {m.missing.get('contaminated', 'started from state it did not write')}"
    if m.control:
        if m.outcome != "completed":
            return (
                f"control failed: {_short(m)}" if m.steps_short else f"control failed ({m.run_end_outcome})"
            )
        text = "completed"
        if m.clean is False:
            text += f", but not clean: {m.restart_count or 0} restarts and {m.false_detections or 0} detections without a fault"
            text += f" (the first: {m.notes['clean']})" if m.notes.get("clean") else ""
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
    elif m.outcome == "outlasted":
        stall = "" if m.time_to_resume_s is None else f" a {m.time_to_resume_s:.2f} s stall,"
        text = f"outlasted: the job went on after{stall} with no framework reaction" + _ended_after_training(
            m
        )
    elif m.recovered:
        text = f"recovered after {restarts} {plural}" if restarts else "recovered in place"
        if not m.detected:
            text += ", not detected"
        text += _ended_after_training(m)
    elif m.gave_up:
        text = f"gave up after {restarts} {plural}"
    elif m.steps_short:
        text = f"{'detected' if m.detected else 'not detected'}, not recovered: {_short(m)}"
    elif m.detected:
        text = f"detected, not recovered ({m.run_end_outcome})"
    else:
        text = f"not detected, not recovered ({m.run_end_outcome})"
    if m.detected and m.detected_via:
        text += f"; detected by {m.detected_via}"
    if m.blame == "wrong":
        text += f"; blamed {m.blamed}, not the faulted rank"
    elif m.blame == "imprecise":
        text += f"; blamed {m.blamed}: the faulted rank among others"
    if m.false_detections:
        text += f"; {m.false_detections} detection(s) before the fault"
    if m.fidelity == "diverged":
        text += (
            f"; final state diverged (expected: {m.fidelity_reason})"
            if m.fidelity_reason
            else "; final state diverged"
        )
    if m.ranks_agree is False:
        text += "; replicas disagree"
    if m.checkpoint_outcome:
        text += f"; checkpoint: {m.checkpoint_outcome.replace('_', ' ')}"
    if len(m.faults) > 1:
        text += "; faults: " + ", ".join(_fault_words(f) for f in m.faults)
    if m.trigger_step is not None and m.fault_step is not None and m.fault_step > m.trigger_step:
        late = m.fault_step - m.trigger_step
        text += (
            f"; fault landed at step {m.fault_step}, {late} step{'s' if late > 1 else ''} after its trigger "
            f"(step {m.trigger_step})"
        )
        if m.injection_latency_s is not None:
            text += f", injection latency {m.injection_latency_s * 1e3:.0f} ms"
    return text + _restart_claim_note(m)


def _fault_words(f: dict[str, Any]) -> str:
    """One fault of several, in words: ``kill interrupted by kill-2``, ``kill-2 recovered in 1.50 s``."""
    status = str(f.get("status"))
    if status == "interrupted":
        return f"{f.get('fault')} interrupted by {f.get('interrupted_by')}"
    resume = f.get("time_to_resume_s")
    tail = f" in {resume:.2f} s" if isinstance(resume, float) and status in ("recovered", "outlasted") else ""
    return f"{f.get('fault')} {status.replace('_', ' ')}{tail}"


def _short(m: RunMetrics) -> str:
    """A job that exited 0 before its last step, in words, with what to check."""
    counted = m.notes.get("steps")
    return (
        f"the job exited 0 at step {m.final_step} of {m.total_steps} ({m.steps_short} short); check the "
        f"workload's steps and how the step pattern counts (step_base{': ' + counted if counted else ''})"
    )


def serving_verdict(m: RunMetrics) -> str:
    """One line on what happened to a serving run, from its metrics."""
    served = f"{_count(m.requests)} requests, {_count(m.failed_requests)} failed"
    if m.control:
        if m.outcome != "completed":
            return f"control failed: the load did not end ({m.run_end_outcome}); {served}"
        text = f"completed: {served}"
        if m.clean is False:
            text += f"; not clean: {m.restart_count or 0} restarts, {m.failed_requests or 0} failed requests"
        return text
    if m.outcome == "fault_not_fired":
        return f"fault did not fire; {served}"
    burn = "" if m.error_budget_burn is None else f" ({m.error_budget_burn * 100:.3g} % of the error budget)"
    if m.recovered:
        text = f"recovered after {m.time_to_recover_s:.2f} s: {served}{burn}"
    else:
        text = f"not recovered before the load ended: {served}{burn}"
    if m.time_to_detect_s is not None:
        text += f"; detected by {m.detected_via} after {m.time_to_detect_s:.2f} s"
    else:
        text += "; not detected"
    if m.restart_count:
        text += f"; {m.restart_count} replica restart{'s' if m.restart_count > 1 else ''}"
    if m.retried_requests:
        text += f"; {m.retried_requests} retried by the balancer"
    if m.checkpoint_outcome:
        text += f"; model file: {m.checkpoint_outcome.replace('_', ' ')}"
    if m.gave_up:
        text += "; the supervisor gave up on a replica (capacity lost to the end)"
    return text


def _count(v: int | None) -> str:
    return "?" if v is None else str(v)


def _restart_claim_note(m: RunMetrics) -> str:
    if m.restarts_claimed is None or m.restart_count is None or m.restarts_claimed == m.restart_count:
        return ""
    return (
        f"; restart count mismatch: the ranks show {m.restart_count}, the framework reported "
        f"{m.restarts_claimed}"
    )


def _compute(events: list[Event], control: list[Event] | None, total_steps: int | None) -> RunMetrics:
    """The metrics of one run (:func:`compute_metrics`, before its verdict): what every run has, then a serving
    run's (:func:`_serving_run`) or a training run's (:func:`_training_run`)."""
    m = RunMetrics()
    whole = TimelineIndex(events)
    start = whole.first("run_start")
    if start is None:
        m.missing["wall_s"] = "no run_start event"
        m.outcome = "error"
        return m
    _identity(m, whole, start)
    end = whole.last("run_end")
    _wall_and_harness(m, whole, end)
    if end is not None and end.get("outcome") == "error" and not whole.has("proc_start"):
        m.outcome = "error"  # the run erred before any of its processes started (an engine gone): nothing ran
        return m
    ix, caused = attribution.harness_cut(whole)
    harness_reactions = sum(1 for e in caused if e.kind in ("detect", "restart", "give_up"))
    ctl = attribution.harness_cut(TimelineIndex(control))[0] if control is not None else None
    final = _final_state(m, ix, end, total_steps)
    if whole.has("load_start"):
        _serving_run(m, whole, ix, ctl, end, harness_reactions)
        return m
    _training_run(m, ix, ctl, final, start, end, harness_reactions)
    return m


def _identity(m: RunMetrics, whole: TimelineIndex, start: Event) -> None:
    """What the run was (suite, scenario, framework, fault, repeat, control) from its ``run_start``; the
    framework's versions, timeouts and timeout problems; a capture limit the run broke on; a startup failure."""
    m.suite = start.get("suite")
    m.scenario = start.get("scenario")
    m.framework = start.get("framework")
    m.fault = start.get("fault")
    m.repeat = start.get("repeat")
    m.control = bool(start.get("control"))
    info = whole.first("framework_info")
    if info is not None:
        m.versions = dict(info.get("versions") or {})
        m.timeouts = dict(info.get("timeouts") or {})
    m.timeout_problems = attribution.timeout_problems(
        whole, (info.get("timeout_problems") or []) if info else []
    )
    limit = whole.first("capture_limit")
    if limit is not None:
        m.capture_limit = (
            f"'{limit.get('proc')}' printed {str(limit.get('line'))[:120]!r}: if that was a write to "
            "its own output, the run broke on the socket capture's limit of one write; rerun with "
            "runtime option output_capture: pipe"
        )
    m.startup_failure = attribution.startup_failure(whole)


def _wall_and_harness(m: RunMetrics, whole: TimelineIndex, end: Event | None) -> None:
    """From the ``run_end`` event (``end``): its outcome, the wall time, the harness's CPU time and its share of
    the wall time (none when runs shared the harness)."""
    miss = m.missing
    if end is None:
        miss["wall_s"] = "no run_end event (harness killed?)"
        return
    m.run_end_outcome = end.get("outcome")
    m.wall_s = goodput.wall_s(whole)
    cpu = end.get("harness_cpu_s")
    if cpu is None:
        miss["harness_cpu_s"] = "not recorded (a run of an older chaosbench)"
        return
    m.harness_cpu_s = float(cpu)
    if int(end.get("concurrent_runs") or 1) > 1:
        miss["harness_cpu_share"] = f"{end.get('concurrent_runs')} runs shared the harness (--jobs)"
    elif m.wall_s:
        m.harness_cpu_share = m.harness_cpu_s / m.wall_s


def _final_state(
    m: RunMetrics, ix: TimelineIndex, end: Event | None, total_steps: int | None
) -> fidelity.FinalState:
    """Where training ended (final step, loss, digest, steps short), how steps were counted, the restarts seen
    and claimed, and the final world size; returns the :class:`~chaosbench.analysis.fidelity.FinalState`."""
    miss = m.missing
    final = fidelity.final_state(ix, end)
    m.final_step, m.final_loss, m.digest = final.step, final.loss, final.digest
    m.total_steps = total_steps
    m.steps_short = final.short_of(total_steps)
    counting = ix.first("step_counting")
    if counting is not None:
        m.notes["steps"] = f"counted from {counting.get('base')} ({counting.get('how')})"
    if m.final_step is None:
        miss["final_step"] = (
            "train_end names no step and no step was reported"
            if final.ended
            else "training did not end (no train_end, and the job did not exit 0 by itself)"
        )
    if m.digest is None and final.no_digest:
        miss["digest"] = final.no_digest
    m.restart_count = ix.restart_count
    if ix.has("restart"):
        m.restarts_claimed = attribution.restarts_claimed(ix.of("restart"))
    else:
        miss["restarts_claimed"] = "the framework reported no restart (no restart line of it was recognised)"
    if final.incarnation is not None:
        m.world_size_final, m.global_batch_final = ix.world(final.incarnation)
    return final


def _training_run(
    m: RunMetrics,
    ix: TimelineIndex,
    ctl: TimelineIndex | None,
    final: fidelity.FinalState,
    start: Event,
    end: Event | None,
    harness_reactions: int,
) -> None:
    """The metrics of a training run, in ``m``: checkpoints and goodput; then, unless it was contaminated, its
    health against the control run and its outcome: a control run's, a run whose fault never fired, or a fault
    run's (:func:`_fault_run`)."""
    miss = m.missing
    finished = final.finished(m.total_steps)
    _checkpoints_and_goodput(m, ix)
    dirty = fidelity.contamination(ix)
    m.contaminated = dirty is not None
    if dirty is not None:
        m.outcome = "contaminated"
        miss["contaminated"] = dirty
        for k in (*FAULT_METRICS, "fidelity", "blame", "false_detections"):
            miss[k] = f"contaminated: {dirty}"
        return
    _training_health(m, ix, ctl, final)
    fault = ix.first("fault_inject")
    m.checkpoint_outcome = classify_checkpoint_outcome(ix.events, control=m.control)
    undamaged = undamaged_reason(ix.events)
    if undamaged is not None:
        miss["checkpoint_outcome"] = undamaged
    if m.control:
        m.outcome = "completed" if finished else "failed"
        m.false_detections = attribution.detection_episodes(ix)
        m.clean = m.outcome == "completed" and m.false_detections == 0 and m.restart_count == 0
        if not m.clean and m.false_detections:
            m.notes["clean"] = attribution.first_detection(ix, m.total_steps)
        for k in FAULT_METRICS:
            miss[k] = "control run (no fault)"
        return
    if fault is None:
        m.outcome = "fault_not_fired"
        m.false_detections = attribution.detection_episodes(
            ix
        )  # no fault to explain any (one may end the run)
        skipped = ix.first("fault_skipped")
        why = f"fault skipped: {skipped.get('reason')}" if skipped else "the trigger never fired"
        for k in ("time_to_detect_s", "time_to_resume_s", "lost_steps"):
            miss[k] = why
        return
    _fault_run(m, ix, ctl, ix.of("fault_inject"), start.t_ns, end, finished, harness_reactions)


def _checkpoints_and_goodput(m: RunMetrics, ix: TimelineIndex) -> None:
    """The median checkpoint save, the interval between checkpoints, the productive time and the goodput."""
    miss = m.missing
    saves = goodput.checkpoint_save_durations(ix)
    if saves:
        m.checkpoint_save_s = statistics.median(saves)
    else:
        renamed = any(e.src == "watcher" and e.get("complete") for e in ix.of("ckpt_save_end"))
        miss["checkpoint_save_s"] = (
            "the checkpoint saves were seen on the filesystem only as whole files renamed "
            "into place: their writing, and so their cost, was not seen"
            if renamed
            else "no complete checkpoint save with its begin and end on the timeline"
        )
    m.checkpoint_interval_s = goodput.checkpoint_interval_s(ix)
    if m.checkpoint_interval_s is None:
        miss["checkpoint_interval_s"] = "fewer than two complete checkpoints in one incarnation"
    m.productive_s = goodput.productive_s(ix.steps)
    if m.productive_s is not None:
        if m.wall_s:
            m.goodput = m.productive_s / m.wall_s
    else:
        miss["productive_s"] = miss["goodput"] = "no step durations on the timeline"


def _training_health(
    m: RunMetrics, ix: TimelineIndex, ctl: TimelineIndex | None, final: fidelity.FinalState
) -> None:
    """Fidelity against the control run (not for a control run itself), whether the ranks agree, the step time,
    a give-up, the clocks, a crash loop and the wall time beyond the control run's."""
    miss = m.missing
    resumed = fidelity.resumed_incarnations(ctl) if ctl is not None and not m.control else 0
    if resumed:
        # its final state is itself a recovery's (seen: a Hugging Face Trainer script whose rank aborted at exit
        # was restarted, resumed from its last checkpoint and trained a step beyond max_steps)
        miss["fidelity"] = (
            f"the control run restarted ({resumed}): its final state is no fault-free reference"
        )
    elif not m.control:
        ctl_final = fidelity.final_state(ctl, ctl.last("run_end")) if ctl is not None else None
        fid = fidelity.fidelity(final, ctl_final, m.total_steps, ix, ctl)
        m.fidelity, m.loss_diff, m.fidelity_reason = fid.fidelity, fid.loss_diff, fid.reason
        if fid.missing is not None:
            miss["fidelity"] = fid.missing
    m.ranks_agree, why = fidelity.ranks_agree(ix)
    if why is not None:
        miss["ranks_agree"] = why
    m.step_time_s = timing.median_step_interval(ix.steps, None, None)
    m.gave_up = ix.has("give_up")
    _clocks(m, ix)
    m.crash_loop = attribution.crash_loop(ix)
    if ctl is not None:
        control_wall_s = goodput.wall_s(ctl)
        if m.wall_s is not None and control_wall_s is not None:
            m.extra_wall_s = m.wall_s - control_wall_s
        else:
            miss["extra_wall_s"] = "control run has no wall time"
    elif not m.control:
        miss["extra_wall_s"] = "no control run"


def _clocks(m: RunMetrics, ix: TimelineIndex) -> None:
    """``clock_offset_bound_s``, or why there is none: one host and one clock, or a node whose clock could not
    be measured (a ``clock_offset`` with an ``error``: its stamps stay uncorrected, and the verdict says so)."""
    failed = [e for e in ix.of("clock_offset") if e.get("error")]
    uncorrected = uncorrected_hosts(ix.events)
    if failed or uncorrected:
        nodes = sorted(
            {str(e.get("node") or e.get("slurm_node") or e.host) for e in failed} | set(uncorrected)
        )
        first = failed[0].get("error") if failed else "no clock measurement"
        m.missing["clock_offset_bound_s"] = (
            f"the clock of {', '.join(nodes)} could not be measured ({first}): its stamps are uncorrected"
        )
        m.notes["clocks"] = m.missing["clock_offset_bound_s"]
        return
    m.clock_offset_bound_s = offset_bound_s(ix.of("clock_offset"))
    if m.clock_offset_bound_s is None:
        m.missing["clock_offset_bound_s"] = "no clock_offset events (one host, one clock)"


#: Training metrics a serving run does not have.
TRAINING_METRICS = (
    "time_to_resume_s",
    "time_to_catch_up_s",
    "time_to_rejoin_s",
    "lost_steps",
    "lost_work_s",
    "fidelity",
    "productive_s",
    "goodput",
    "final_step",
    "checkpoint_age_s",
    "slowdown",
)


def _serving_run(
    m: RunMetrics,
    whole: TimelineIndex,
    ix: TimelineIndex,
    ctl: TimelineIndex | None,
    end: Event | None,
    harness_reactions: int,
) -> None:
    """The metrics of a serving run (its timeline has ``load_start``), in ``m``: requests, error budget, latency
    and capacity (:mod:`~chaosbench.analysis.serving`), and detection, recovery and outcome by the serving
    definitions; its training metrics stay None."""
    miss = m.missing
    m.serving = True
    for k in TRAINING_METRICS:
        miss[k] = "serving run (no training)"
    m.gave_up = ix.has("give_up")
    _clocks(m, ix)
    m.crash_loop = serving.crash_loop(ix)
    m.checkpoint_outcome = classify_checkpoint_outcome(ix.events, control=m.control, load_kinds=MODEL_LOADS)
    if ctl is not None:
        control_wall_s = goodput.wall_s(ctl)
        if m.wall_s is not None and control_wall_s is not None:
            m.extra_wall_s = m.wall_s - control_wall_s
    fault = None if m.control else ix.first("fault_inject")
    tf = timing.fault_effect_ns(ix, fault) if fault is not None else None
    s = serving.serving_metrics(whole, ctl, fault, tf)
    for name in serving.SERVING_FIELDS:
        setattr(m, name, getattr(s, name))
    miss.update(s.missing)
    m.notes.update(s.notes)
    if m.control:
        m.outcome = "completed" if s.completed else "failed"
        m.false_detections = attribution.detection_episodes(ix)
        m.clean = (
            m.outcome == "completed"
            and m.false_detections == 0
            and m.restart_count == 0
            and not m.failed_requests
            and not ix.has("balancer_down")
        )
        for k in serving.SERVING_FAULT_METRICS:
            miss[k] = "control run (no fault)"
        return
    if fault is None or tf is None:
        m.outcome = "fault_not_fired"
        skipped = ix.first("fault_skipped")
        why = f"fault skipped: {skipped.get('reason')}" if skipped else "the trigger never fired"
        for k in serving.SERVING_FAULT_METRICS:
            miss[k] = why
        return
    start = whole.first("run_start")
    t0 = start.t_ns if start is not None else whole.events[0].t_ns
    if fault.get("effect_t_ns") is not None:
        m.injection_latency_s = ns_to_s(tf - fault.t_ns)
    m.fault_class = fault_class(fault)
    m.fault_t_s = ns_to_s(tf - t0)
    m.fault_count = ix.count("fault_inject")
    m.false_detections = attribution.detection_episodes(ix, before_ns=fault.t_ns)
    m.detected = s.time_to_detect_s is not None
    m.time_to_detect_s, m.detected_via, m.detected_by = s.time_to_detect_s, s.detected_via, s.detected_by
    if s.detect_t_ns is not None:
        m.detect_t_s = ns_to_s(s.detect_t_ns - t0)
    elif harness_reactions:
        miss["time_to_detect_s"] += (
            f" (the framework reacted {harness_reactions} time(s) only after the harness "
            "began tearing the run down)"
        )
    if ix.first("detect", after_ns=tf) is not None:
        blame = attribution.first_blame(ix, fault, tf)
        m.blamed, m.blame = blame.blamed, blame.blame
        if blame.missing is not None:
            miss["blame"] = blame.missing
    else:
        miss["blame"] = "the framework wrote no detect event after the fault"
    m.recovered = bool(s.recovered)
    m.time_to_recover_s = s.time_to_recover_s
    m.outcome = "recovered" if m.recovered else "not_recovered"
    m.failure_class = "deterministic" if m.crash_loop else ("transient" if m.recovered else None)
    if not m.recovered and end is not None:
        m.time_burned_s = ns_to_s(end.t_ns - tf)


def _fault_run(
    m: RunMetrics,
    ix: TimelineIndex,
    ctl: TimelineIndex | None,
    faults: list[Event],
    t0: int,
    end: Event | None,
    finished: bool,
    harness_reactions: int,
) -> None:
    """The metrics of a run whose faults fired (``faults``: its ``fault_inject`` events), in ``m``: every fault's
    own figures in ``m.faults``, the run's figures from its first fault, its outcome from all of them."""
    measured = per_fault.measure_all(ix, faults, finished, t0, m.framework)
    m.faults = [x.figures.to_dict() for x in measured]
    first = measured[0]
    _first_fault(m, ix, first, measured)
    _fault_window(m, ix, ctl, first.t_ns, end)
    if end is not None and not finished:
        m.time_burned_s = ns_to_s(end.t_ns - first.t_ns)
    m.checkpoint_age_s = timing.checkpoint_age(ix.of("ckpt_save_end"), first.t_ns)
    if m.checkpoint_age_s is None:
        m.missing["checkpoint_age_s"] = "no checkpoint had completed before the fault"
    m.fault_step = first.point.step
    _detection(m, ix, first, t0, harness_reactions)
    m.scheduler_delay_s = timing.scheduler_delay_s(ix, first.t_ns)
    if m.scheduler_delay_s is None:
        m.missing["scheduler_delay_s"] = (
            "no scheduler state after a restart (not a scheduler-driven framework)"
        )
    m.world_size_before, m.global_batch_before = ix.world(first.point.incarnation)
    m.outcome = per_fault.run_outcome(measured, finished)
    m.recovered = m.outcome == "recovered"
    m.failure_class = "deterministic" if m.crash_loop else ("transient" if m.recovered else None)
    if m.outcome == "not_recovered" or first.figures.status in ("interrupted", "not_recovered"):
        _not_recovered(m, first)
        return
    _recovery(m, ix, first, t0)


def _first_fault(
    m: RunMetrics, ix: TimelineIndex, first: per_fault.Measured, measured: list[per_fault.Measured]
) -> None:
    """The first fault's injection latency, trigger step, class and time; how many faults fired and the
    detections none of them explains."""
    fault, tf = first.event, first.t_ns
    if fault.get("effect_t_ns") is not None:
        m.injection_latency_s = ns_to_s(tf - fault.t_ns)
    else:
        m.missing["injection_latency_s"] = "the injector recorded no moment of effect"
    if fault.get("trigger_step") is not None:
        m.trigger_step = int(fault["trigger_step"])
    m.fault_class = first.figures.fault_class
    m.fault_t_s = first.figures.fault_t_s
    m.fault_count = len(measured)
    m.false_detections = attribution.false_detections(
        ix, [(x.t_ns, x.resume[0] if x.resume else None) for x in measured]
    )


def _fault_window(
    m: RunMetrics, ix: TimelineIndex, ctl: TimelineIndex | None, tf: int, end: Event | None
) -> None:
    """The step time while the first fault was in effect (from its effect ``tf`` to the start of its revert,
    else the run's end) and the slowdown against the control run's same steps."""
    miss = m.missing
    revert = ix.first("fault_revert", after_ns=tf)
    if revert is not None:
        t_win_end = timing.revert_began_ns(revert)
    else:
        t_win_end = end.t_ns if end is not None else ix.events[-1].t_ns
    in_window = timing.window_intervals(ix.steps, tf, t_win_end)
    m.fault_step_time_s = statistics.fmean(s for _, s in in_window) if in_window else None
    if not in_window:
        miss["fault_step_time_s"] = miss["slowdown"] = "no steps in the fault window"
    elif ctl is None:
        miss["slowdown"] = "no control run"
    else:
        m.slowdown = timing.same_steps_ratio(in_window, ctl.steps)
        if m.slowdown is None:
            miss["slowdown"] = "the control run did not take the fault window's steps"


def _detection(
    m: RunMetrics, ix: TimelineIndex, first: per_fault.Measured, t0: int, harness_reactions: int
) -> None:
    """The first fault's predicted detection, and its detection: by whom, how, when and whom it blamed, or why
    there was none (saying when the framework reacted only after the harness began tearing the run down)."""
    miss = m.missing
    fig, detect = first.figures, first.detect
    prediction = attribution.detection_prediction(ix, first.event)
    m.predicted_detect_s, m.predicted_by = prediction.expected_s, prediction.decided_by
    if prediction.missing is not None:
        miss["predicted_detect_s"] = prediction.missing

    m.detected = detect is not None
    if detect is not None:
        m.detected_by = str(detect.get("framework") or detect.src)
        m.detected_via, m.time_to_detect_s = fig.detected_via, fig.time_to_detect_s
        if "detected_via" in fig.missing:
            miss["detected_via"] = fig.missing["detected_via"]
        m.detect_t_s = ns_to_s(detect.t_ns - t0)
        m.badput_detect_s = m.time_to_detect_s
        m.blamed, m.blame = fig.blamed, fig.blame
        if "blame" in fig.missing:
            miss["blame"] = fig.missing["blame"]
    else:
        why = fig.missing["time_to_detect_s"]
        if harness_reactions:
            why += (
                f" (it reacted {harness_reactions} time(s) only after the harness began tearing the run down)"
            )
        miss["time_to_detect_s"] = miss["blame"] = miss["detected_via"] = why


def _not_recovered(m: RunMetrics, first: per_fault.Measured) -> None:
    """No recovery figures for a first fault not recovered from (a partial figure would feed medians and
    projections), each saying why; only its detection counts as a stage."""
    fig = first.figures
    if fig.status == "interrupted":
        reason = fig.missing["time_to_resume_s"]
    elif first.resume is None and not first.went_on:
        reason = f"not recovered: no training step completed after the fault (run ended: {m.run_end_outcome})"
    elif m.steps_short:
        reason = f"not recovered: training ended {m.steps_short} step(s) short of {m.total_steps}"
    else:
        reason = f"not recovered: training did not finish (run ended: {m.run_end_outcome})"
    for k in RECOVERY_METRICS:
        m.missing[k] = reason
    m.stage_detect_s = m.time_to_detect_s
    if m.stage_detect_s is None:
        m.missing["stage_detect_s"] = m.missing["time_to_detect_s"]


def _recovery(m: RunMetrics, ix: TimelineIndex, first: per_fault.Measured, t0: int) -> None:
    """The first fault's recovery (it resumed): its stages, rejoin, resume, catch-up, lost work and badput."""
    miss = m.missing
    fig, tf, fp, detect, resume = first.figures, first.t_ns, first.point, first.detect, first.resume
    assert resume is not None  # the first fault resumed
    _stages(m, ix, fp, detect, resume, first.event, first.until_ns)
    rejoin = timing.rejoin_ns(ix, fp)
    if rejoin is not None:
        m.time_to_rejoin_s = ns_to_s(rejoin - tf)
    else:
        miss["time_to_rejoin_s"] = "nothing restarted after the fault"
    resume_t, resume_key = resume
    m.time_to_resume_s = fig.time_to_resume_s
    m.world_size_after, m.global_batch_after = ix.world(resume_key[0], ix.step_event(resume_t, resume_key[0]))
    m.resume_t_s = ns_to_s(resume_t - t0)
    after = detect.t_ns if detect is not None and ix.per_step_commit else None
    catch = timing.catch_up_ns(ix.steps, fp, after)
    if catch is not None:
        m.time_to_catch_up_s = ns_to_s(catch - tf)
    else:
        miss["time_to_catch_up_s"] = "the job never got beyond the step reached at the fault"

    lost = timing.lost_work(ix, fp, resume_key, first.until_ns)
    m.lost_steps, m.lost_work_s, m.skipped_steps = lost.lost_steps, lost.lost_work_s, lost.skipped_steps
    if lost.missing is not None:
        miss["lost_work_s"] = lost.missing
    m.rollback = fig.rollback
    stages = timing.badput(ix, fp, detect, resume, m.lost_steps)
    m.badput_restart_init_s, m.badput_restore_s = stages.restart_init_s, stages.restore_s
    m.badput_recompute_s = stages.recompute_s
    if stages.missing is not None:
        miss["badput_recompute_s"] = stages.missing


def _stages(
    m: RunMetrics,
    ix: TimelineIndex,
    fp: timing.FaultPoint,
    detect: Event | None,
    resume: tuple[int, tuple[int, int]] | None,
    fault: Event | None = None,
    until_ns: int | None = None,
) -> None:
    """The four stages of the recovery, their total and the runtime's share of rescheduling, in ``m``."""
    st = timing.recovery_stages(ix, fp, detect, resume, fault, until_ns)
    for name, metric in zip(timing.STAGE_NAMES, STAGE_METRICS, strict=True):
        setattr(m, metric, st.seconds[name])
        if name in st.missing:
            m.missing[metric] = st.missing[name]
        if name in st.notes:
            m.notes[metric] = st.notes[name]
    m.time_to_recover_s = st.total_s
    if st.total_s is None:
        m.missing["time_to_recover_s"] = st.missing.get("resume", "the last stage did not end")
    share = timing.reschedule_runtime(ix, fp.t_ns, m.scheduler_delay_s)
    m.stage_reschedule_runtime_s = share.seconds
    if share.missing is not None:
        m.missing["stage_reschedule_runtime_s"] = share.missing
    elif share.what is not None:
        m.notes["stage_reschedule_runtime_s"] = share.what
