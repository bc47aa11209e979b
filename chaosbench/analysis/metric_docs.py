"""What each field of :class:`~chaosbench.analysis.metrics.RunMetrics` means, in the words of the docs' metric
tables, which are generated from here (:mod:`chaosbench.docgen`): one source for the tables and the fields' docs.

Each :class:`MetricRow` documents one or more fields together, named in its ``label`` as the docs write them
(``world_size_{before,after,final}`` stands for three fields: :func:`expand`). Every field of ``RunMetrics`` is in
a row (a unit test fails for one that is not, and for a row naming a field ``RunMetrics`` does not have); a
field may be in both the training and the serving table when it means something else there. The normative
definitions are the docstrings of :mod:`chaosbench.analysis.metrics` and :mod:`chaosbench.analysis.serving`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricRow:
    """One row of a metric table: the fields it documents (``label``: backquoted names, ``{a,b}`` alternatives)
    and what they mean."""

    label: str
    meaning: str

    @property
    def fields(self) -> tuple[str, ...]:
        """The RunMetrics fields the row documents, in the label's order."""
        return tuple(f for name in re.findall(r"`([^`]+)`", self.label) for f in expand(name))


def expand(name: str) -> list[str]:
    """``latency_p{50,99}_ms`` -> ``["latency_p50_ms", "latency_p99_ms"]`` (every ``{a,b}``, left to right)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if m is None:
        return [name]
    return [x for alt in m.group(1).split(",") for x in expand(name[: m.start()] + alt + name[m.end() :])]


#: A training run's metrics: docs/metrics.md's first table.
TRAINING: tuple[MetricRow, ...] = (
    MetricRow(
        "`time_to_detect_s`",
        "first framework reaction after the fault",
    ),
    MetricRow(
        "`time_to_resume_s`",
        "first completed training step after recovery",
    ),
    MetricRow(
        "`time_to_catch_up_s`",
        "first step beyond the progress reached at the fault",
    ),
    MetricRow(
        "`lost_steps`, `lost_work_s`, `skipped_steps`",
        "steps completed before the fault that were recomputed, and their seconds; under per-step commit "
        "(TorchFT) plus the steps computed but not committed (`skipped_steps`)",
    ),
    MetricRow(
        "`time_to_rejoin_s`",
        "first step of the restarted rank, replica group or node (survivors may have resumed earlier)",
    ),
    MetricRow(
        "`world_size_{before,after,final}`, `global_batch_{before,after,final}`",
        "world size and samples per step at the fault, after recovery, at the end (an elastic job that "
        "shrank trains differently)",
    ),
    MetricRow(
        "`restart_count`",
        "incarnations after the first",
    ),
    MetricRow(
        "`checkpoint_age_s`, `checkpoint_save_s`, `checkpoint_interval_s`",
        "age of the newest complete checkpoint at the fault; save cost; median interval between complete "
        "checkpoints of one incarnation",
    ),
    MetricRow(
        "`wall_s`, `productive_s`, `goodput`",
        "wall time; compute time of the steps that survived; their ratio",
    ),
    MetricRow(
        "`extra_wall_s`",
        "wall time beyond the fault-free control run of the same framework",
    ),
    MetricRow(
        "`badput_{detect,restart_init,restore,recompute}_s`",
        "the recovery split by stage",
    ),
    MetricRow(
        "`stage_{detect,reschedule,reshard_or_replace,resume}_s`, `stage_reschedule_runtime_s`, `time_to_recover_s`",
        "the four stages of a recovery: to the framework's reaction, to the replacement capacity's first "
        "rank start (`stage_reschedule_runtime_s`: the share the runtime measured, a scheduler delay, a "
        "node's reboot or a spare's takeover), to the end of the restore or heal, to the first step past "
        "the fault's; they add up to `time_to_recover_s`",
    ),
    MetricRow(
        "`harness_cpu_s`, `harness_cpu_share`",
        "CPU the harness process itself used during the run, and that over the run's wall time",
    ),
    MetricRow(
        "`fidelity`, `loss_diff`, `fidelity_reason`",
        "final digest (of the `train_end` line, or of the final artifact's tensors: `fidelity_from`) "
        "equal to the control's (`exact`) or `diverged`; missing when either side has none, or when the "
        "control began an incarnation after its first completed step (its final state is a recovery's; not "
        "under per-step commit, whose restarted group heals from a live peer); why a divergence was expected "
        "(a changed world size and global batch)",
    ),
    MetricRow(
        "`final_step`, `steps_short`",
        "where training ended (`train_end`, or the last step when the ranks exited 0 by themselves); how "
        "many steps short of `steps` a job that exited 0 stopped",
    ),
    MetricRow(
        "`slowdown`, `fault_step_time_s`",
        "the job's time per step while the fault certainly lasted (from its effect to the start of its "
        "revert; a stall in full), and how many times longer those same steps took than in the control",
    ),
    MetricRow(
        "`detected_by`, `gave_up`, `crash_loop`, `failure_class`, `time_burned_s`",
        "who noticed; retry limit or loop; deterministic or transient",
    ),
    MetricRow(
        "`detected_via`",
        "what noticed it: `process exit`, `process-group timeout` (a peer's collective timed out, then it"
        " exited: told by the gloo/NCCL timeout line the harness watches for in every process's output, a"
        " `rank_error` event), `step watchdog`, `framework heartbeat`, `quorum change`, `collective "
        "error`, `scheduler job state`, `loss guard`",
    ),
    MetricRow(
        "`blame`, `blamed`",
        "whom the framework named in its first reaction (restart's watchdog, torchrun's `local_rank`, "
        "nvrx's rank monitor, TorchFT's quorum, ...), judged against the injector's target: `correct` "
        "(only faulted ranks), `imprecise` (the faulted among others: a whole node or every rank for one "
        "rank's fault), `wrong`, `none` (detected without naming anyone)",
    ),
    MetricRow(
        "`false_detections`, `clean`",
        "detections no fault explains: in a fault-free control or a run whose fault never fired, before "
        "the first fault, or after a fault's job resumed (a flap); a control is clean when it completed "
        "with no restart and no detection; one that is not names its first detection, whether it came after "
        "the job's last step, and the failed process's first error line (a C++ `terminate called ...` "
        "included)",
    ),
    MetricRow(
        "`restarts_claimed`",
        "restarts the framework itself reported (its restart lines), cross-checked against "
        "`restart_count`; a mismatch is named in the verdict",
    ),
    MetricRow(
        "`predicted_detect_s`, `predicted_by`, `timeout_problems`",
        "when the timeouts in force let the framework detect this fault, and which ones decide it; "
        "configurations that cannot detect a fault before the deadline, or whose timeouts are ordered so "
        "that one never decides",
    ),
    MetricRow(
        "`injection_latency_s`, `fault_step`, `trigger_step`",
        "when the fault took effect after the injector began (a signal through `srun` on Slurm: ~0.1 s), "
        "the job step at which it landed, the step its trigger asked for; recovery is measured from the "
        "effect",
    ),
    MetricRow(
        "`contaminated`",
        "the run started from state it did not write (a checkpoint loaded before it saved one, or a first"
        " step further in than its steps are apart, a counted line's cadence included): outcome"
        " `contaminated`, not measured",
    ),
    MetricRow(
        "`fault_class`, `rollback`",
        "the fleet fault class (`crash`, `node`, `hang`, `sdc`); whether recovery rolled back to a "
        "checkpoint",
    ),
    MetricRow(
        "`ranks_agree`, `checkpoint_outcome`",
        "replicas' final digests agree; what happened to a damaged checkpoint",
    ),
    MetricRow(
        "`outcome`, `verdict`",
        "`recovered`, `outlasted` (training finished and no fault drew a framework reaction: a hang that "
        "ended by itself, a held GIL, a slowed rank; its cost is its stall, not a recovery), "
        "`not_recovered`, `fault_not_fired` (fault runs); `completed`, `failed` (controls); "
        "`contaminated`; one line on what happened. A run that did not recover has no figure of a "
        "recovery (resume, catch-up, rejoin, lost work, the stages after detection): each is missing with"
        " the reason",
    ),
)

#: A serving run's metrics (workload ``serve``): docs/metrics.md's second table.
SERVING: tuple[MetricRow, ...] = (
    MetricRow(
        "`time_to_detect_s`, `detected_via`",
        "to the balancer's DOWN of a faulted replica or the first failed request, whichever first",
    ),
    MetricRow(
        "`time_to_recover_s`",
        "to the start of the first `recovery_window_s` span after the fault in which every window's error"
        " rate is at most the SLO's `error_rate`, and stays so for the load's `request_timeout_s` after "
        "it (a request begun in the span that times out is counted when it ends)",
    ),
    MetricRow(
        "`requests`, `failed_requests`, `retried_requests`, `error_rate`",
        "over the whole load; retried: haproxy's retries and redispatches (its stats socket)",
    ),
    MetricRow(
        "`error_budget_burn`, `budget_request_rate_per_s`",
        "failed requests over the SLO window's error budget (`(1 - availability)` x request rate x "
        "`window_days`; the rate of the control run's load, else this run's before the fault): the share "
        "of the budget this incident used",
    ),
    MetricRow(
        "`latency_p{50,99}_ms`, `latency_p{50,99}_{before,during,after}_ms`",
        "successful requests' latency quantiles, whole load and before the fault, during it (to the later"
        " of the recovery and the fault's revert), after",
    ),
    MetricRow(
        "`throughput_during_share`",
        "requests per second during the fault over before it: a hung replica left in rotation holds each "
        "user it gets until the request timeout, and the pace collapses while few requests fail",
    ),
    MetricRow(
        "`capacity_lost_replica_s`, `capacity_lost_share`",
        "replica-seconds a replica could not serve during the load (from the fault or its exit or DOWN "
        "until the balancer's UP), and their share of all replica-seconds",
    ),
)

#: The rest of ``metrics.json``: which run it is, its context and the intermediate figures: docs/metrics.md's third table.
RECORDED: tuple[MetricRow, ...] = (
    MetricRow(
        "`suite`, `scenario`, `framework`, `fault`, `repeat`, `control`, `run_dir`",
        "which run it is: the suite, the scenario id, the framework entry, the fault (none: a control), "
        "the repeat's index, whether it is a control, its directory",
    ),
    MetricRow(
        "`workload`, `strategy`",
        "the workload's name and the framework entry's recovery strategy (`restart-in-place`, "
        "`hot-spare`, `shrink`, `continue`), from the run's configuration",
    ),
    MetricRow(
        "`detected`, `recovered`",
        "a framework reaction came after the fault; training (or, serving, the error rate) recovered",
    ),
    MetricRow(
        "`run_end_outcome`",
        "how the job itself ended (`run_end`: `completed`, `failed`, `gave_up`, `deadline`, "
        "`interrupted`, `error`)",
    ),
    MetricRow(
        "`fault_count`",
        "`fault_inject` events (a repeating trigger or a planted bug fires more than once)",
    ),
    MetricRow(
        "`fault_t_s`, `detect_t_s`, `resume_t_s`",
        "when the fault took effect, was detected and training resumed, in seconds since `run_start`",
    ),
    MetricRow(
        "`step_time_s`",
        "median interval between consecutive step completions of one incarnation over the whole run",
    ),
    MetricRow(
        "`total_steps`",
        "the workload's total steps (training finished when it ended there or beyond)",
    ),
    MetricRow(
        "`final_loss`, `digest`",
        "the final loss and the final digest fidelity compares (the final artifact's, else the last "
        "`train_end`'s)",
    ),
    MetricRow(
        "`scheduler_delay_s`",
        "from the first `restart` after the fault to the scheduler running the job again (the next "
        "`sched_state` `running`): the scheduler's share of `badput_restart_init_s`",
    ),
    MetricRow(
        "`clock_offset_bound_s`",
        "the largest uncertainty of the node clock offsets measured (`clock_offset`): every other host's "
        "stamp was moved onto the harness's clock within it",
    ),
    MetricRow(
        "`slo_ok`, `slo_failures`",
        "every SLO of the suite held for this run; the ones that did not, one line each",
    ),
    MetricRow(
        "`capture_limit`",
        "a process printed that a write was refused for its size while its output went through a socket "
        "(`capture_limit`): perhaps its own output was lost",
    ),
    MetricRow(
        "`startup_failure`",
        "a process that exited by itself with an error before the job's first step (and before any fault): its "
        "name, exit status and first error line (`proc_error`): a failure outside the system under test (a "
        "framework's helper, a rank that failed at import); the verdict ends with it",
    ),
    MetricRow(
        "`serving`, `replicas`",
        "a serving run (workload `serve`); how many replicas served it",
    ),
    MetricRow(
        "`faults`",
        "every fault of the run measured on its own, in the order they took effect (its `status`: `recovered`, "
        "`outlasted`, `interrupted`, `not_recovered`; its time to detect and resume, lost work, restarts, ...; "
        "`chaosbench/analysis/faults.py`): the run's figures are its first fault's",
    ),
    MetricRow(
        "`missing`, `notes`",
        "metric -> why it could not be measured; metric -> what needs saying about its value (a stage "
        "that does not apply is 0)",
    ),
    MetricRow(
        "`versions`, `timeouts`",
        "the versions (package -> version) and every timeout in force (seconds) the run ran with",
    ),
)

#: The tables, by the name of their generated region in docs/metrics.md.
TABLES: dict[str, tuple[MetricRow, ...]] = {
    "metrics": TRAINING,
    "serving-metrics": SERVING,
    "run-record": RECORDED,
}


def metric_docs() -> dict[str, str]:
    """Field -> what it means (a field in both the training and the serving table: its training meaning)."""
    out: dict[str, str] = {}
    for rows in TABLES.values():
        for row in rows:
            for f in row.fields:
                out.setdefault(f, row.meaning)
    return out
