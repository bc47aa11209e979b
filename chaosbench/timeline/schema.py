"""The typed timeline: one pydantic model per event kind (:class:`~chaosbench.timeline.events.EventKind`), its
fields typed and documented, with units in the names of quantities. The harness's side only (pydantic): ranks
check their events against :data:`chaosbench.timeline.kinds.FIELDS`, the standard-library table generated from
these models (``python -m chaosbench.docgen --write``), and the docs' table of events (docs/events.md) is generated from them.

The rules:

- Every event has ``t_ns``, ``kind``, ``src`` and ``host`` (:class:`EventModel`) and the fields of its kind's
  model, nothing else: a field a model does not declare is an error (a typo is caught where it is written), as
  is a required field missing or a value of another type (strict: no coercion; an integer is a valid float).
  A field that is not required may be absent; readers then take the default the model states.
- Written: the probe, the command shim and every other writer check against the table
  (:func:`chaosbench.timeline.events.check_event`); the harness's own writer (:func:`harness_writer`) validates
  each line it writes with the full model (:func:`check_written`): value sets (``Literal``) and nested types too.
- Read: :func:`chaosbench.timeline.read_events` validates every line with :func:`check_obj`; an unknown kind
  or a malformed field raises :class:`~chaosbench.errors.UnknownEventKind` /
  :class:`~chaosbench.errors.MalformedEvent` with the file and the 1-based line. What happens to a timeline
  written by an older chaosbench: :mod:`chaosbench.timeline.reader`.
- Fields a framework's log line gives (the named groups of a :class:`~chaosbench.frameworks.base.LogPattern`)
  are declared here like any other, and typed: :func:`typed_fields` converts the matched text to the declared
  type (``"3"`` -> 3) and :func:`check_fields_declared` refuses, when the watcher is made, a pattern whose groups
  its kind does not declare.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from chaosbench.errors import MalformedEvent, UnknownEventKind
from chaosbench.timeline.events import COMMON_FIELDS, Event, EventKind, EventSource, TimelineWriter

__all__ = [
    "EventKind",
    "EventModel",
    "EventSource",
    "MODELS",
    "check_fields_declared",
    "check_obj",
    "check_written",
    "events_json_schema",
    "harness_writer",
    "model_of",
    "stdlib_table",
    "typed",
    "typed_fields",
    "FaultClass",
    "FailureMode",
]

#: The fleet fault class of a fault, as a fleet's fault mix names them (:data:`chaosbench.analysis.fleet.LLAMA3_MIX`):
#: a crashed rank, a lost node, a hang, silent data corruption. Declared by each injector
#: (:attr:`chaosbench.injectors.base.Injector.fault_class`) and written into its ``fault_inject`` events.
FaultClass = Literal["crash", "node", "hang", "sdc"]
#: What a fault looks like to a detector (:attr:`chaosbench.injectors.base.Injector.failure_mode`).
FailureMode = Literal["crash", "hang", "stall", "desync"]


class EventModel(BaseModel):
    """The fields every event has."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    #: The kind this model is the model of (set on every concrete model).
    KIND: ClassVar[EventKind]
    #: Who writes it, in words (for the docs).
    WRITERS: ClassVar[str] = ""

    t_ns: int = Field(
        description="when it happened: wall-clock ns (`time.time_ns()`) of the host that stamped it"
    )
    kind: str = Field(description="the event kind (`EventKind`)")
    src: EventSource = Field(EventSource.HARNESS, strict=False, description="who wrote it (`EventSource`)")
    host: str = Field(
        "",
        description="the host whose clock stamped `t_ns` (another host's stamps are moved onto "
        "the harness's clock when read)",
    )

    @model_validator(mode="after")
    def _is_its_kind(self) -> EventModel:
        if self.kind != self.KIND.value:
            raise ValueError(f"kind '{self.kind}' validated as {self.KIND.value}")
        return self


# ----------------------------------------------------------------------------------------------- shared fields
class _Rank(EventModel):
    """Written by one rank (the probe adds ``rank`` and ``incarnation`` to each of its events)."""

    rank: int = Field(description="the global rank that wrote it")
    incarnation: int = Field(
        0,
        description="the job's incarnation (0: the first; the harness's restarts plus a "
        "torch elastic agent's)",
    )


class _MaybeRank(EventModel):
    """Written by a rank (through the probe) or by the harness."""

    rank: int | None = Field(None, description="the rank, when a rank wrote it")
    incarnation: int | None = Field(None, description="that rank's incarnation")


class _LogLine(EventModel):
    """Where a framework's log line came from (:class:`~chaosbench.frameworks.base.LogWatcher`)."""

    proc: str | None = Field(None, description="the process that printed the line")
    line: str | None = Field(None, description="the line (at most 400 characters)")
    node: str | None = Field(None, description="that process's node")
    replica_group: int | None = Field(None, description="its TorchFT replica group, for a group's launcher")


class _Framework(EventModel):
    framework: str = Field(description="the framework entry's label")


class _CkptRank(EventModel):
    """A checkpoint event of a rank (the probe, the command shim) or of the filesystem watch (no rank)."""

    rank: int | None = Field(
        None, description="the rank that saved or loaded it (none: seen on the filesystem)"
    )
    incarnation: int | None = Field(None, description="that rank's incarnation")
    step: int | None = Field(None, description="the number of optimizer steps done at that checkpoint")
    path: str | None = Field(
        None, description="its file or directory (the filesystem watch: relative to `dir`)"
    )
    dir: str | None = Field(None, description="the watched directory (filesystem watch)")
    via: Literal["filesystem"] | None = Field(
        None,
        description="`filesystem`: seen by the filesystem watch (`chaosbench.workloads.checkpoint_watch`)",
    )


# ------------------------------------------------------------------------------------------------- the harness
class RunStart(EventModel):
    """The run begins: which scenario it is. The harness writes every field; a hand-written timeline may lack
    them (a reader then has None)."""

    KIND = EventKind.RUN_START
    WRITERS = "harness"
    suite: str | None = Field(None, description="the suite's name")
    scenario: str | None = Field(None, description="the scenario id (`<framework>/<fault|control>`)")
    framework: str | None = Field(None, description="the framework entry's label")
    adapter: str | None = Field(None, description="the framework adapter's name")
    fault: str | None = Field(None, description="the fault's name (null: a control run)")
    repeat: int | None = Field(None, description="the repeat's index")
    control: bool | None = Field(None, description="a fault-free control run")
    seed: int | None = Field(None, description="the workload's seed")
    run_id: str | None = Field(None, description="the run's unique id (labels everything it creates)")
    runtime: str | None = Field(None, description="the runtime's name")
    ranks: int | None = Field(None, description="ranks of the workload")
    nodes: int | None = Field(None, description="nodes of the workload")
    timeline_version: int | None = Field(
        None,
        description="the timeline contract it was written under "
        "(`TIMELINE_VERSION`; none: an older chaosbench)",
    )


class RunEnd(EventModel):
    """The run ended (its processes are torn down)."""

    KIND = EventKind.RUN_END
    WRITERS = "harness"
    outcome: Literal["completed", "failed", "gave_up", "deadline", "interrupted", "error"] = Field(
        description="how supervision ended"
    )
    reason: str | None = Field(None, description="why, in words")
    leftover_pids: list[int] = Field(
        default_factory=list,
        description="pids of the run's processes still alive after its cleanup (none should be)",
    )
    leftover_objects: list[str] = Field(
        default_factory=list,
        description="containers, networks or jobs of the run still there after its cleanup",
    )
    harness_cpu_s: float | None = Field(
        None, description="CPU seconds the harness process used during the run"
    )
    concurrent_runs: int | None = Field(None, description="runs the harness was serving at once (`--jobs`)")


class TeardownBegin(EventModel):
    """The harness starts tearing the run down: nothing a framework does after it counts as its own reaction."""

    KIND = EventKind.TEARDOWN_BEGIN
    WRITERS = "harness"
    reason: Literal["end", "deadline", "interrupted", "error"] = Field(
        description="`end`: the job ended by itself; else the harness stopped it"
    )


class FrameworkInfo(_Framework):
    """What the framework runs with: versions, the timeouts in force and the adapter's options."""

    KIND = EventKind.FRAMEWORK_INFO
    WRITERS = "harness"
    versions: dict[str, str | None] = Field(
        default_factory=dict, description="package -> version (null: not installed)"
    )
    timeouts: dict[str, Any] = Field(
        default_factory=dict, description="every timeout in force, in seconds (null: none)"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the adapter's options")
    timeout_problems: list[str] = Field(
        default_factory=list,
        description="timeouts ordered so that one never "
        "decides, or that cannot detect a fault: one line each",
    )


class DetectionPrediction(_Framework):
    """When the timeouts in force let the framework detect a fault of the run (written before it starts)."""

    KIND = EventKind.DETECTION_PREDICTION
    WRITERS = "harness"
    fault: str = Field(description="the fault's name")
    injector: str = Field(description="its injector")
    mode: str | None = Field(None, description="its failure mode (`crash`, `hang`, `stall`)")
    expected_s: float | None = Field(
        None, description="seconds after the fault it can be detected (null: never, or not modelled)"
    )
    decided_by: str = Field(
        "", description="the terms of that sum (`workload_pg_timeout_s=10 + monitor_interval_s=0.1`)"
    )
    resume_floor_s: float | None = Field(
        None, description="the earliest the job can train again, seconds after the fault"
    )
    modelled: bool = Field(True, description="false: the adapter has no model for this fault")
    note: str = Field("", description="why, in words")
    problems: list[str] = Field(
        default_factory=list, description="why it cannot detect or resume before the deadline, one line each"
    )


class ProcStart(EventModel):
    """A process the runtime started (a rank, an agent, a job step, a helper of an injector)."""

    KIND = EventKind.PROC_START
    WRITERS = "runtime (harness), injector"
    proc: str = Field(description="the process's name in the run")
    pid: int = Field(description="its pid, on its node")
    role: str = Field(description="`rank`, `agent`, `job`, `watchdog`, `lighthouse`, `injector`, ...")
    pid_ticks: int | None = Field(
        None, description="its start time in clock ticks since boot (a pid's identity)"
    )
    node: str | None = Field(None, description="the workload node it runs on")
    incarnation: int | None = Field(None, description="the incarnation it belongs to")
    output_stamp: str | None = Field(
        None,
        description="how its output lines are stamped (`write`: the kernel's "
        "stamp of each write; `read`: when read)",
    )
    output_stamp_reason: str | None = Field(None, description="why they are stamped when read (docker)")
    container: str | None = Field(None, description="its node's container (docker)")
    container_pid: int | None = Field(None, description="its pid inside the container (docker)")
    rerun: bool | None = Field(None, description="started again after its node was lost (docker)")
    slurm_node: str | None = Field(None, description="the Slurm node it runs on")
    job_name: str | None = Field(None, description="its Slurm job's name")


class ProcExit(EventModel):
    """A process the runtime started has exited."""

    KIND = EventKind.PROC_EXIT
    WRITERS = "runtime (harness), injector"
    proc: str = Field(description="the process's name in the run")
    pid: int = Field(description="its pid")
    returncode: int = Field(description="its exit status (negative: killed by that signal)")
    exit_stamp: Literal["kernel", "pidfd", "wait"] | None = Field(
        None,
        description="how `t_ns` was taken: `kernel`: the kernel's own stamp of the exit (its proc connector); "
        "`pidfd`: when the harness woke to the process's pidfd; `wait`: when a wait returned, or seen after the fact",
    )
    role: str | None = Field(None, description="its role")
    node: str | None = Field(None, description="its node")
    incarnation: int | None = Field(None, description="its incarnation")
    node_lost: bool | None = Field(None, description="its node was lost under it (docker)")
    slurm_node: str | None = Field(None, description="the Slurm node it ran on")
    job_id: int | None = Field(None, description="its Slurm job")
    srun_returncode: int | None = Field(
        None, description="what srun itself returned, when the job's state said otherwise"
    )
    slurm_state: str | None = Field(None, description="the job's Slurm state, when it decided `returncode`")
    reason: str | None = Field(None, description="the job's Slurm reason")


class ArtifactDigest(EventModel):
    """The digest of the final artifact the suite names (`fidelity_from`), taken once the run's processes
    ended."""

    KIND = EventKind.ARTIFACT_DIGEST
    WRITERS = "harness"
    path: str = Field(description="the artifact (a file or a directory)")
    files: list[str] = Field(default_factory=list, description="the files whose tensors were read")
    tensors: int | None = Field(None, description="how many tensors")
    bytes: int | None = Field(None, description="their size in bytes")
    digest: str | None = Field(None, description="sha256 of the tensors (names, dtypes, shapes and data)")
    skipped: dict[str, str] = Field(default_factory=dict, description="file -> why it was not read")
    error: str | None = Field(None, description="why there is no digest")


class RankError(EventModel):
    """A process printed a collective's timeout or mismatch, a lost rendezvous or peer: its first such line (the
    harness watches every process's output, whatever the framework)."""

    KIND = EventKind.RANK_ERROR
    WRITERS = "harness"
    proc: str = Field(description="the process")
    pid: int = Field(description="its pid")
    role: str = Field(description="its role")
    signature: Literal["collective_timeout", "collective_mismatch", "rendezvous_lost", "peer_lost"] = Field(
        description="which error (`chaosbench.signatures`)"
    )
    line: str = Field(description="the line (at most 400 characters)")
    rank: int | None = Field(
        None, description="the rank (its environment, or an agent's `[rank<r>]:` prefix)"
    )
    node: str | None = Field(None, description="the process's node")
    replica_group: int | None = Field(None, description="its TorchFT replica group")


class ProcError(EventModel):
    """A process printed its first error line: an exception's line (`ModuleNotFoundError: No module named 'x'`,
    also behind an agent's `[rank<r>]:` prefix), a line beginning `error:`, `fatal:` or `panic:`, or a Rust panic
    (`chaosbench.signatures.error_line`). The harness watches every process's output, whatever the framework, so a
    process that died before the job made progress says why (`startup_failure`)."""

    KIND = EventKind.PROC_ERROR
    WRITERS = "harness"
    proc: str = Field(description="the process that printed it")
    pid: int = Field(description="its pid")
    role: str = Field(description="the process's role")
    stream: str = Field(description="`stdout` or `stderr`")
    line: str = Field(description="the line (at most 400 characters)")


class CaptureLimit(EventModel):
    """A process printed that a write was refused for its size (EMSGSIZE, ENOBUFS) while its output went through
    a socket (`output_capture: socket`): perhaps its own output."""

    KIND = EventKind.CAPTURE_LIMIT
    WRITERS = "runtime (harness)"
    proc: str = Field(description="the process")
    pid: int = Field(description="its pid")
    stream: str = Field(description="`stdout` or `stderr`")
    line: str = Field(description="the line (at most 400 characters)")


# --------------------------------------------------------------------------------------------------- the ranks
class HelperStart(_Rank):
    """A helper process a framework's own launcher started announces itself, for a role target (nvrx's bridge)."""

    KIND = EventKind.HELPER_START
    WRITERS = "probe (a helper)"
    proc: str = Field(description="its name")
    pid: int = Field(description="its pid")
    role: str = Field(description="the role it plays (`bridge`)")
    pid_ticks: int | None = Field(None, description="its start time in clock ticks since boot")
    node: str | None = Field(None, description="its node")


class RankStart(_Rank):
    """A rank started: its pid (what injectors target), world and place. Extra fields of a workload go where the
    model declares them."""

    KIND = EventKind.RANK_START
    WRITERS = "probe"
    pid: int = Field(description="the rank's pid (under the command shim: the user's script's)")
    world_size: int = Field(description="ranks in this incarnation's world")
    pid_ticks: int | None = Field(None, description="its start time in clock ticks since boot")
    local_rank: int | None = Field(None, description="its rank on its node")
    node: str | None = Field(None, description="its workload node")
    global_batch: int | None = Field(
        None, description="samples per optimizer step over all ranks, when the workload reports it"
    )
    replica_group: int | None = Field(None, description="its TorchFT replica group")
    group_rank: int | None = Field(None, description="its rank within the replica group")
    group_world_size: int | None = Field(None, description="ranks per replica group")
    batch_mode: str | None = Field(None, description="`ft-mlp`'s batch mode (`global`, `per-group`)")
    stage: int | None = Field(None, description="its pipeline stage (`pp-lm`)")
    replica: int | None = Field(None, description="its data-parallel replica (`pp-lm`; null: an idle rank)")
    stages: int | None = Field(None, description="pipeline stages (`pp-lm`)")
    dp: int | None = Field(None, description="data-parallel replicas (`pp-lm`)")
    address: str | None = Field(None, description="the address a serving replica binds")
    port: int | None = Field(None, description="its port")


class RankExit(_Rank):
    """The user's script exited (written by the command shim)."""

    KIND = EventKind.RANK_EXIT
    WRITERS = "command shim"
    pid: int = Field(description="the script's pid")
    returncode: int = Field(description="its exit status (negative: killed by that signal)")


class Step(_Rank):
    """A rank completed an optimizer step."""

    KIND = EventKind.STEP
    WRITERS = "probe, command shim"
    step: int = Field(description="1-based count of completed optimizer steps")
    loss: float | None = Field(None, description="the step's loss (may be NaN)")
    duration_s: float | None = Field(
        None,
        description="seconds of the step's own compute (forward, backward, "
        "optimizer); absent: the metrics use the interval since the rank's previous "
        "event",
    )
    participants: int | None = Field(
        None, description="replica groups in the quorum that committed it (TorchFT)"
    )
    quorum_id: int | None = Field(None, description="that quorum's id (TorchFT)")
    committed: bool | None = Field(None, description="committed by a per-step vote (TorchFT)")
    global_batch: int | None = Field(None, description="samples in this step over all ranks")
    every: int | None = Field(
        None,
        description="a counted line's cadence (the command workload's `step_every`): "
        "the script prints every K-th step without its number, so this step stands for "
        "the K steps up to it",
    )


class CkptSaveBegin(_CkptRank):
    """A checkpoint save begins (the filesystem watch: its first write seen)."""

    KIND = EventKind.CKPT_SAVE_BEGIN
    WRITERS = "probe, command shim, filesystem watch"
    step_from: Literal["name", "timeline"] | None = Field(
        None, description="where the watch took `step` from: the checkpoint's name or the job's step then"
    )


class CkptSaveEnd(_CkptRank):
    """A checkpoint save ended (the filesystem watch: its last write, close or rename seen; the event may be
    written `quiet_s` or more later)."""

    KIND = EventKind.CKPT_SAVE_END
    WRITERS = "probe, command shim, filesystem watch"
    complete: bool = Field(
        description="the checkpoint is whole (every rank finished and marked it; the watch: "
        "whole by its format)"
    )
    step_from: Literal["name", "timeline"] | None = Field(
        None, description="where the watch took `step` from"
    )
    files: int | None = Field(None, description="files in it (filesystem watch)")
    bytes: int | None = Field(None, description="their size in bytes (filesystem watch)")
    incomplete: str | None = Field(None, description="why it is not complete (filesystem watch)")


class CkptLoadBegin(_CkptRank):
    """A checkpoint load begins (the filesystem watch: the first open of its files)."""

    KIND = EventKind.CKPT_LOAD_BEGIN
    WRITERS = "probe, command shim, filesystem watch"
    step_from: Literal["name", "save"] | None = Field(
        None, description="where the watch took `step` from: the name or the save it saw"
    )


class CkptLoadEnd(_CkptRank):
    """A checkpoint load ended (the filesystem watch: the last close of its files)."""

    KIND = EventKind.CKPT_LOAD_END
    WRITERS = "probe, command shim, filesystem watch"
    step_from: Literal["name", "save"] | None = Field(None, description="where the watch took `step` from")
    files: int | None = Field(None, description="files read (filesystem watch)")


class CkptLoadFailed(_Rank):
    """The workload rejected a checkpoint and tries an older one."""

    KIND = EventKind.CKPT_LOAD_FAILED
    WRITERS = "probe"
    step: int = Field(description="the checkpoint's step")
    path: str = Field(description="its path")
    error: str = Field(description="why it was rejected")


class PreemptSave(_Rank):
    """After a preemption notice (SIGTERM) the ranks agreed to save at this step's end (`save_on_sigterm`)."""

    KIND = EventKind.PREEMPT_SAVE
    WRITERS = "probe"
    step: int = Field(description="the step at whose end they save")
    noticed: bool = Field(description="this rank got the SIGTERM")
    saved_already: bool = Field(description="the step was saved already")


class TrainEnd(_Rank):
    """Training finished on this rank."""

    KIND = EventKind.TRAIN_END
    WRITERS = "probe, command shim"
    step: int | None = Field(
        None, description="the number of steps done (the command shim: as the line named it)"
    )
    loss: float | None = Field(None, description="the final loss")
    digest: str | None = Field(None, description="sha256 of the final parameters")


class StepCounting(_Rank):
    """How the user's script's step numbers count (the command shim)."""

    KIND = EventKind.STEP_COUNTING
    WRITERS = "command shim"
    base: Literal[0, 1] = Field(description="the first step is numbered 0 or 1")
    how: str = Field(
        description="declared, detected from the first step printed, or as an earlier incarnation counted"
    )


class StepSkipped(_Rank):
    """A step computed but not committed under per-step commit (TorchFT): no rollback."""

    KIND = EventKind.STEP_SKIPPED
    WRITERS = "probe, command shim"
    step: int = Field(description="the step index attempted")
    reason: str = Field(description="why it was not committed")
    duration_s: float | None = Field(None, description="seconds of compute thrown away")
    collective_s: float | None = Field(None, description="seconds in the failed reduction and vote")
    participants: int | None = Field(None, description="replica groups in the quorum")
    quorum_id: int | None = Field(None, description="the quorum's id")


class HealBegin(_Rank):
    """A replica group fetches the live state from a peer (TorchFT)."""

    KIND = EventKind.HEAL_BEGIN
    WRITERS = "probe, command shim"
    step: int | None = Field(None, description="the step it heals to")
    src_replica_rank: int | None = Field(None, description="the peer's replica rank")


class HealEnd(_Rank):
    """The fetched state is applied (TorchFT)."""

    KIND = EventKind.HEAL_END
    WRITERS = "probe, command shim"
    step: int | None = Field(None, description="the step it healed to")
    duration_s: float | None = Field(None, description="seconds from the fetch's start")


class HealSend(_Rank):
    """This rank serves its live state to healing peers (TorchFT)."""

    KIND = EventKind.HEAL_SEND
    WRITERS = "probe"
    step: int | None = Field(None, description="the step it serves")
    dst_replica_ranks: list[int] = Field(default_factory=list, description="the peers' replica ranks")


# ---------------------------------------------------------------------------------------------------- injectors
class FaultInject(_MaybeRank):
    """A fault was applied (a planted fault: by the rank, just before it acts). `t_ns` is when the injector began
    to act."""

    KIND = EventKind.FAULT_INJECT
    WRITERS = "injector, probe (planted faults)"
    fault: str = Field(description="the fault's name")
    injector: str = Field(description="its injector")
    target: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the processes it acted on (`rank`, `pid`, `node`, `incarnation`, `role`)",
    )
    trigger: str | None = Field(None, description="what fired it, in words")
    index: int | None = Field(None, description="the firing's index within its fault")
    params: dict[str, Any] | None = Field(None, description="the injector's parameters")
    details: dict[str, Any] | None = Field(None, description="what the injector reports it did")
    trigger_step: int | None = Field(None, description="the step a step trigger fired at")
    effect_t_ns: int | None = Field(None, description="when it took effect, ns on the harness's clock")
    effect: str | None = Field(None, description="what that moment is")
    injection_latency_s: float | None = Field(None, description="`effect_t_ns` - `t_ns`, in seconds")
    step: int | None = Field(None, description="the step it fired before (planted)")
    mode: str | None = Field(None, description="the planted fault's mode (`silent`, `stall`, `block`, ...)")
    desync: str | None = Field(None, description="how a collective goes wrong (`skip`, `shape`, `op`)")
    duration_s: float | None = Field(None, description="seconds it lasts (planted)")
    cgroup: str | None = Field(None, description="the memory cgroup it runs in (`oom`)")
    limit_mb: int | None = Field(None, description="that cgroup's limit in MiB (`oom`)")
    sdc_kind: str | None = Field(None, description="the corruption (`nan`, `scale`, `bitflip`)")
    where: str | None = Field(None, description="what it corrupts (`grad`, `param`, `save`)")
    checkpoint_step: int | None = Field(None, description="the step of the checkpoint it corrupts")
    fault_class: FaultClass | None = Field(
        None,
        description="the fleet fault class its injector declares (`crash`, "
        "`node`, `hang`, `sdc`; null: none). Absent from timelines written "
        "before injectors declared it: see `chaosbench.injectors.legacy`",
    )
    failure_mode: FailureMode | None = Field(
        None,
        description="what it looks like to a detector, as its injector "
        "declares it (`crash`, `hang`, `stall`, `desync`; null: none of them)",
    )
    damages_checkpoint: bool | None = Field(
        None,
        description="it damaged a checkpoint that recovery may load "
        "(its injector says so; absent from older timelines)",
    )


class FaultRevert(_MaybeRank):
    """A fault was reverted, ended by itself, or failed to clean up."""

    KIND = EventKind.FAULT_REVERT
    WRITERS = "injector, probe (planted faults)"
    fault: str = Field(description="the fault's name")
    injector: str | None = Field(None, description="its injector")
    reason: str | None = Field(None, description="why (`duration elapsed`, `cleanup`, ...)")
    index: int | None = Field(None, description="the firing's index")
    undone: bool | None = Field(None, description="the injector undid it")
    error: str | None = Field(None, description="why reverting failed")
    step: int | None = Field(None, description="the step it ended at (planted)")
    began_t_ns: int | None = Field(
        None,
        description="when the injector began reverting it, ns on the harness's clock: the fault's effect ended "
        "between this and the event's time",
    )


class FaultSkipped(_MaybeRank):
    """The trigger fired but the fault could not be applied."""

    KIND = EventKind.FAULT_SKIPPED
    WRITERS = "injector, probe (planted faults)"
    fault: str = Field(description="the fault's name")
    injector: str = Field(description="its injector")
    reason: str = Field(description="why not")
    trigger: str | None = Field(None, description="what fired it")
    index: int | None = Field(None, description="the firing's index")


# -------------------------------------------------------------------------------------------------- frameworks
class Detect(_LogLine, _MaybeRank, _Framework):
    """The framework noticed a failure (its supervision loop, a log line of the framework's, or a rank's own
    guard)."""

    KIND = EventKind.DETECT
    WRITERS = "framework adapter, framework log line, probe"
    reason: str | None = Field(None, description="what it saw, in words")
    via: str | None = Field(
        None,
        description="what noticed it, where the source says (`exit`, `heartbeat`, "
        "`step watchdog`, `lighthouse`, `manager`, `loss guard`, `scheduler`)",
    )
    mechanism: str | None = Field(
        None,
        description="the mechanism, when the writer knows it (`quorum change`, "
        "`process-group timeout`, `framework heartbeat`)",
    )
    by: str | None = Field(None, description="who acted on it (`scheduler`, `harness`: slurm-requeue)")
    blame_rank: int | None = Field(None, description="the rank it named as failed")
    blame_node: str | None = Field(None, description="the node it named as failed")
    blame_groups: list[int | str] | None = Field(
        None, description="the replica groups the new quorum left out (TorchFT's Lighthouse)"
    )
    job_id: int | None = Field(None, description="the Slurm job")
    slurm_state: str | None = Field(None, description="its Slurm state")
    # the named groups of the frameworks' log patterns (frameworks/agent.py, nvrx.py, testing/calibration.py)
    pid: int | None = Field(None, description="the worker the agent signals (torchrun's `Sending process`)")
    signal: str | None = Field(None, description="the signal it sends (`SIGTERM`)")
    exitcode: int | None = Field(
        None, description="a worker's exit code (torchrun, nvrx: `failed (exitcode)`)"
    )
    local_rank: int | None = Field(None, description="that worker's rank on its node")
    section: str | None = Field(None, description="the nvrx section that timed out")
    open_s: float | None = Field(None, description="seconds the section was open, or out of a section (nvrx)")
    heartbeat: Literal["initial", "subsequent"] | None = Field(None, description="the heartbeat nvrx missed")
    waited_s: float | None = Field(None, description="seconds nvrx waited for it")
    dead_ns: int | None = Field(None, description="calibration watchdog: when it saw the rank dead, ns")
    printed_ns: int | None = Field(None, description="calibration watchdog: when it wrote the line, ns")


class Restart(_LogLine, _Framework):
    """The framework relaunches the job, a worker group or a replica."""

    KIND = EventKind.RESTART
    WRITERS = "framework adapter, framework log line"
    attempt: int | None = Field(None, description="the restart's count (1: the first)")
    reason: str | None = Field(None, description="why")
    rank: int | None = Field(None, description="the replica restarted (balancer)")
    incarnation: int | None = Field(None, description="its new incarnation (balancer)")
    by: str | None = Field(None, description="who restarts it (`scheduler`, `harness`: slurm-requeue)")
    job_id: int | None = Field(None, description="the Slurm job")
    action: str | None = Field(None, description="what the harness did (`scontrol requeue`)")
    # log pattern groups
    attempts_left: int | None = Field(None, description="restarts the agent had left before this one")
    max_restarts: int | None = Field(None, description="the agent's restart limit")
    waiting_nodes: int | None = Field(None, description="nodes that joined the rendezvous (elastic)")
    group_rank: int | None = Field(None, description="the agent's node index (elastic)")


class GiveUp(_LogLine, _Framework):
    """The framework stopped trying."""

    KIND = EventKind.GIVE_UP
    WRITERS = "framework adapter, framework log line"
    reason: str | None = Field(None, description="why")
    via: str | None = Field(
        None,
        description="what noticed the failure it gave up on, where the source says "
        "(`exit`): a give-up before any detection is the framework's reaction",
    )


class Rendezvous(_LogLine, _Framework):
    """An elastic agent completed a rendezvous round."""

    KIND = EventKind.RENDEZVOUS
    WRITERS = "framework log line"
    world_size: int = Field(description="the round's world size")


class Log(_LogLine):
    """A line worth keeping on the timeline (an injector's counters, a watcher's error, a framework's message)."""

    KIND = EventKind.LOG
    WRITERS = "injector, framework adapter, runtime, filesystem watch"
    framework: str | None = Field(None, description="the framework entry's label")
    fault: str | None = Field(None, description="the fault it is about")
    injector: str | None = Field(None, description="its injector")
    pattern: str | None = Field(None, description="the pattern that matched")
    stats: dict[str, Any] | None = Field(None, description="counters (stall-fs: operations, delays, errors)")
    unmount: str | None = Field(None, description="how the FUSE mount was unmounted (stall-fs)")
    error: str | None = Field(None, description="what went wrong")
    fusefs_returncode: int | None = Field(None, description="the FUSE server's exit status (stall-fs)")


class Quorum(_MaybeRank):
    """A rank's TorchFT Manager joined a new quorum, or the Lighthouse issued one (`via: lighthouse`)."""

    KIND = EventKind.QUORUM
    WRITERS = "probe, framework log line (Lighthouse)"
    quorum_id: int | None = Field(description="the quorum's id (null: the Manager did not say)")
    participants: int = Field(description="replica groups in it")
    previous_participants: int | None = Field(None, description="replica groups in the one before")
    replica_rank: int | None = Field(None, description="this group's rank in it")
    step: int | None = Field(None, description="the Manager's step")
    framework: str | None = Field(None, description="the framework entry's label (Lighthouse)")
    via: Literal["lighthouse"] | None = Field(None, description="`lighthouse`: the Lighthouse issued it")
    replica_groups: list[int | str] | None = Field(None, description="the groups in it (Lighthouse)")


# ------------------------------------------------------------------------------------------------ nodes, Slurm
class _Node(EventModel):
    node: str = Field(description="the workload node")
    container: str | None = Field(None, description="its container")


class NodeStart(_Node):
    """A node's container started."""

    KIND = EventKind.NODE_START
    WRITERS = "runtime"
    spare: bool | None = Field(None, description="a hot spare")
    reason: Literal["provision", "reboot", "takeover", "spare"] | None = Field(
        None, description="why it started"
    )
    replaces: str | None = Field(None, description="the container it took over from (`takeover`)")


class NodeExit(_Node):
    """A node's container stopped."""

    KIND = EventKind.NODE_EXIT
    WRITERS = "runtime"
    exit_code: int | None = Field(None, description="the container's exit code")
    reason: str | None = Field(None, description="`node-kill`, `cleanup`, `died`")


class NodePause(_Node):
    """A node's container was paused (docker pause: every process of the node frozen)."""

    KIND = EventKind.NODE_PAUSE
    WRITERS = "runtime"


class NodeUnpause(_Node):
    """A node's container was unpaused."""

    KIND = EventKind.NODE_UNPAUSE
    WRITERS = "runtime"


class ClockOffset(EventModel):
    """A node's clock measured against the harness's (the Slurm runtime), or why it could not be."""

    KIND = EventKind.CLOCK_OFFSET
    WRITERS = "runtime (Slurm)"
    node: str | None = Field(None, description="the workload node on it")
    slurm_node: str | None = Field(None, description="the Slurm node")
    node_host: str | None = Field(None, description="the node's host name (the `host` its events carry)")
    offset_ns: int | None = Field(None, description="node clock - harness clock, ns")
    bound_ns: int | None = Field(
        None, description="the offset is true within this, ns (half the best round trip)"
    )
    rtt_ns: int | None = Field(None, description="that round trip, ns")
    samples: int | None = Field(None, description="samples taken")
    error: str | None = Field(None, description="why there is no offset")


class NodeMap(EventModel):
    """A workload node placed on, or moved to, a Slurm node."""

    KIND = EventKind.NODE_MAP
    WRITERS = "runtime (Slurm)"
    node: str = Field(description="the workload node")
    slurm_node: str = Field(description="the Slurm node")
    previous: str | None = Field(None, description="the Slurm node it was on")
    reason: str = Field(description="why (`first use`, the previous node's state)")


class SignalSent(EventModel):
    """A signal delivered on a node (Slurm)."""

    KIND = EventKind.SIGNAL_SENT
    WRITERS = "runtime (Slurm)"
    pid: int = Field(description="the process, on its node")
    signal: str = Field(description="the signal's name")
    node: str | None = Field(None, description="the workload node")
    slurm_node: str | None = Field(None, description="the Slurm node")
    node_t_ns: int | None = Field(None, description="the node's clock right before the kill, ns")
    stamp: Literal["node", "harness"] | None = Field(
        None, description="whose clock `t_ns` is from (the node's, corrected by its offset, or the harness's)"
    )


class SchedSubmit(_Framework):
    """A batch job handed to the scheduler."""

    KIND = EventKind.SCHED_SUBMIT
    WRITERS = "framework adapter (slurm-requeue)"
    job_id: int = Field(description="the Slurm job")
    script: str | None = Field(None, description="its batch script")
    slurm_version: str | None = Field(None, description="the scheduler's version")


class SchedState(_Framework):
    """A scheduler state transition, stamped when polled."""

    KIND = EventKind.SCHED_STATE
    WRITERS = "framework adapter (slurm-requeue)"
    job_id: int = Field(description="the Slurm job")
    slurm_state: str = Field(description="its Slurm state (`RUNNING`, `NODE_FAIL`, ...)")
    state: str = Field(description="that state translated (`JobState`: `pending`, `running`, `failed`, ...)")
    reason: str | None = Field(None, description="the scheduler's reason")
    restarts: int | None = Field(None, description="the job's restart count")
    slurm_nodes: list[str] = Field(default_factory=list, description="its nodes")
    exit_code: str | None = Field(None, description="its exit code (`rc:signal`)")


# ----------------------------------------------------------------------------------------------------- serving
class ModelLoadBegin(_Rank):
    """A replica starts loading its model file."""

    KIND = EventKind.MODEL_LOAD_BEGIN
    WRITERS = "probe (serving replica)"
    path: str = Field(description="the model file")


class ModelLoadEnd(_Rank):
    """A replica loaded its model file."""

    KIND = EventKind.MODEL_LOAD_END
    WRITERS = "probe (serving replica)"
    path: str = Field(description="the model file")
    bytes: int | None = Field(None, description="its size in bytes")
    duration_s: float | None = Field(None, description="seconds the load took")
    digest: str | None = Field(None, description="sha256 of the loaded parameters")
    finite: bool | None = Field(None, description="every parameter is finite")


class ReplicaReady(_Rank):
    """A replica listens with its model loaded."""

    KIND = EventKind.REPLICA_READY
    WRITERS = "probe (serving replica)"
    address: str | None = Field(None, description="the address it binds")
    port: int | None = Field(None, description="its port")
    url: str | None = Field(None, description="its URL")


class LoadStart(EventModel):
    """The load process starts its traffic."""

    KIND = EventKind.LOAD_START
    WRITERS = "load generator"
    target: str = Field(description="the balancer's URL")
    users: int | None = Field(None, description="concurrent users")
    spawn_rate: float | None = Field(None, description="users started per second")
    duration_s: float | None = Field(None, description="seconds of load")
    window_s: float | None = Field(None, description="seconds per `load_window`")
    mix: dict[str, float] | None = Field(None, description="endpoint (or declared request's name) -> weight")
    requests: list[dict[str, Any]] | None = Field(
        None,
        description="the requests the suite declared "
        "(`serve-command`): name, method, path, body, expect_status, "
        "weight",
    )
    wait_s: float | None = Field(None, description="seconds each user waits between requests")
    request_timeout_s: float | None = Field(None, description="a request's timeout, seconds")
    max_requests: int | None = Field(None, description="the load stops after this many requests")
    slo: dict[str, Any] | None = Field(None, description="the serving SLO")


class LoadWindow(EventModel):
    """One window of the load (`t_ns`: its start); a request counts where it completed."""

    KIND = EventKind.LOAD_WINDOW
    WRITERS = "load generator"
    window_s: float = Field(description="the window's length, seconds")
    requests: int = Field(description="requests completed in it")
    failures: int = Field(description="of which failed")
    errors: dict[str, int] = Field(default_factory=dict, description="error kind -> count")
    latency_hist: list[int] = Field(
        default_factory=list, description="successes per bucket of the load's latency edges"
    )
    p50_ms: float | None = Field(None, description="median latency of its successes, ms")
    p99_ms: float | None = Field(None, description="99th percentile, ms")
    max_ms: float | None = Field(None, description="the slowest success, ms")


class LoadEnd(EventModel):
    """The load ended."""

    KIND = EventKind.LOAD_END
    WRITERS = "load generator"
    requests: int = Field(description="requests completed")
    failures: int = Field(description="of which failed")
    duration_s: float = Field(description="seconds of load")
    reason: str | None = Field(None, description="`duration`, `max_requests` or `signal`")
    by_request: dict[str, dict[str, int]] | None = Field(
        None,
        description="per request name: `requests` completed, `failures` of them, `unfinished` (begun, still "
        "in flight when the load stopped: not counted)",
    )


class _BalancerServer(_Framework):
    rank: int = Field(description="the replica")
    server: str = Field(description="its name in the balancer (`r<rank>`)")
    line: str | None = Field(None, description="the balancer's line")
    reason: str | None = Field(None, description="the balancer's reason")


class BalancerDown(_BalancerServer):
    """The balancer took a replica out of rotation."""

    KIND = EventKind.BALANCER_DOWN
    WRITERS = "framework log line (balancer)"


class BalancerUp(_BalancerServer):
    """The balancer put a replica back."""

    KIND = EventKind.BALANCER_UP
    WRITERS = "framework log line (balancer)"


class BalancerStats(_Framework):
    """The balancer's counters at the end of the load (or why they could not be read)."""

    KIND = EventKind.BALANCER_STATS
    WRITERS = "framework adapter (balancer)"
    retries: int | None = Field(None, description="requests retried on another server")
    redispatches: int | None = Field(None, description="requests redispatched")
    requests: int | None = Field(None, description="requests the backend took")
    connection_errors: int | None = Field(None, description="connection errors")
    response_errors: int | None = Field(None, description="response errors")
    servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="server -> its `status`, `check_failures`, `went_down`, `downtime_s`, `sessions`, ...",
    )
    missing: str | None = Field(None, description="why the counters could not be read")


class BalancerExit(_Framework):
    """The balancer process died."""

    KIND = EventKind.BALANCER_EXIT
    WRITERS = "framework adapter (balancer)"
    reason: str = Field(description="its exit, in words")


# ---------------------------------------------------------------------------------------------------- registry
def _concrete(base: type[EventModel]) -> Iterable[type[EventModel]]:
    seen: set[type[EventModel]] = set()
    todo = list(base.__subclasses__())
    while todo:
        sub = todo.pop(0)
        if sub in seen:
            continue
        seen.add(sub)
        todo += sub.__subclasses__()
        if "KIND" in sub.__dict__:
            yield sub


#: The model of each kind, in the order of :class:`EventKind`.
MODELS: dict[EventKind, type[EventModel]] = {}
for _m in _concrete(EventModel):
    if _m.KIND in MODELS:
        raise TypeError(f"two models of {_m.KIND.value}: {MODELS[_m.KIND].__name__}, {_m.__name__}")
    MODELS[_m.KIND] = _m
MODELS = {k: MODELS[k] for k in EventKind if k in MODELS}
_BY_NAME: dict[str, type[EventModel]] = {k.value: m for k, m in MODELS.items()}


def model_of(kind: str) -> type[EventModel]:
    """The model of ``kind``; raises :class:`~chaosbench.errors.UnknownEventKind`."""
    m = _BY_NAME.get(str(kind))
    if m is None:
        raise UnknownEventKind(str(kind), "unknown kind")
    return m


def _malformed(kind: str, exc: ValidationError, path: str | None, line: int | None) -> MalformedEvent:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    field = loc[0] if loc else None
    where = ".".join(loc)
    if err.get("type") == "extra_forbidden":
        known = ", ".join(f for f in _BY_NAME[kind].model_fields if f not in COMMON_FIELDS)
        problem = f"unknown field '{where}' (known: {known})"
    elif err.get("type") == "missing":
        problem = f"required field '{where}' is missing"
    else:
        problem = f"field '{where}': {err.get('msg')} (got {err.get('input')!r:.80})"
    more = len(exc.errors()) - 1
    return MalformedEvent(
        kind, problem + (f" (and {more} more)" if more else ""), path=path, line=line, field=field
    )


def check_obj(obj: Mapping[str, Any], path: str | None = None, line: int | None = None) -> EventModel:
    """Validate a decoded timeline line against its kind's model and return the model. Raises
    :class:`~chaosbench.errors.UnknownEventKind` or :class:`~chaosbench.errors.MalformedEvent` (with ``path``
    and ``line``)."""
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise MalformedEvent(str(kind), "no kind", path=path, line=line, field="kind")
    m = _BY_NAME.get(kind)
    if m is None:
        raise UnknownEventKind(kind, "unknown kind", path=path, line=line)
    try:
        return m.model_validate(obj)
    except ValidationError as exc:
        raise _malformed(kind, exc, path, line) from None


def check_written(ev: Event, line: str, path: str | None = None) -> None:
    """The harness's write check: the JSON ``line`` about to be written for ``ev`` validated with its kind's
    model (what a reader will get, values written as ``str`` included)."""
    m = _BY_NAME.get(ev.kind)
    if m is None:
        raise UnknownEventKind(ev.kind, "unknown kind", path=path)
    try:
        m.model_validate_json(line)
    except ValidationError as exc:
        raise _malformed(ev.kind, exc, path, None) from None


def harness_writer(path: str | os.PathLike[str], src: str = "harness") -> TimelineWriter:
    """A :class:`~chaosbench.timeline.events.TimelineWriter` that validates every event with the full models."""
    return TimelineWriter(path, src=src, check=check_written)


def typed(ev: Event) -> EventModel:
    """The model instance of an event (validated; raises as :func:`check_obj`)."""
    return check_obj(ev.to_obj())


# ------------------------------------------------------------------------------------- fields from log patterns
@functools.cache
def _adapter(kind: str, name: str) -> TypeAdapter[Any]:
    annotation = _BY_NAME[kind].model_fields[name].annotation
    assert annotation is not None, (
        f"{kind}.{name} has no annotation"
    )  # every field of the models is annotated
    return TypeAdapter(annotation)


def check_fields_declared(kind: str, names: Iterable[str], what: str = "") -> None:
    """Raise :class:`~chaosbench.errors.MalformedEvent` unless every field in ``names`` (a log pattern's named
    groups, ``what``: the pattern) is declared by ``kind``'s model (UnknownEventKind for an unknown kind)."""
    fields = model_of(kind).model_fields
    for name in names:
        if name not in fields or name in COMMON_FIELDS:
            raise MalformedEvent(
                kind,
                f"field '{name}' {what} is not declared by its model (known: "
                f"{', '.join(f for f in fields if f not in COMMON_FIELDS)})",
                field=name,
            )


def typed_fields(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (text a log line matched) converted to the types ``kind``'s model declares (``"3"`` -> 3,
    ``"1.5"`` -> 1.5); a value that does not convert raises :class:`~chaosbench.errors.MalformedEvent`."""
    model_of(kind)
    out: dict[str, Any] = {}
    for name, value in fields.items():
        check_fields_declared(kind, [name])
        try:
            out[name] = _adapter(kind, name).validate_python(value, strict=False)
        except ValidationError as exc:
            raise MalformedEvent(
                kind, f"field '{name}': {exc.errors()[0].get('msg')} (got {value!r:.80})", field=name
            ) from None
    return out


# ------------------------------------------------------------------------------------------ derived: the table
def _json_types(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a field's JSON schema allows (``any`` when it allows every value)."""
    if "anyOf" in schema:
        return set().union(*(_json_types(s) for s in schema["anyOf"]))
    if "$ref" in schema or schema.get("type") == "object":
        return {"dict"}
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return {_python_json_type(v) for v in values}
    t = schema.get("type")
    names = {
        "integer": "int",
        "number": "float",
        "string": "str",
        "boolean": "bool",
        "array": "list",
        "null": "null",
        "object": "dict",
    }
    if t is None:
        return {"any"}
    return {names[x] for x in ([t] if isinstance(t, str) else t)}


def _python_json_type(v: Any) -> str:
    from chaosbench.timeline.events import json_type

    return json_type(v)


_ORDER = ("null", "bool", "int", "float", "str", "list", "dict", "any")


def stdlib_table() -> dict[str, dict[str, tuple[bool, tuple[str, ...]]]]:
    """The standard-library table of the models (:data:`chaosbench.timeline.kinds.FIELDS`): kind -> field ->
    (required, its JSON types), without the common fields."""
    out: dict[str, dict[str, tuple[bool, tuple[str, ...]]]] = {}
    for kind, m in MODELS.items():
        schema = m.model_json_schema()
        props = schema["properties"]
        required = set(schema.get("required", ()))
        fields: dict[str, tuple[bool, tuple[str, ...]]] = {}
        for name in m.model_fields:
            if name in COMMON_FIELDS:
                continue
            types = _json_types(props[name])
            if "float" in types:
                types.discard("int")  # an integer is a valid float
            fields[name] = (name in required, tuple(t for t in _ORDER if t in types))
        out[kind.value] = fields
    return out


def events_json_schema() -> dict[str, Any]:
    """A JSON schema of one timeline line (any kind), for editors and other tools: ``oneOf`` the kinds'
    models, each with its ``kind`` as a constant."""
    defs: dict[str, Any] = {}
    one_of = []
    for kind, m in MODELS.items():
        s = m.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(s.pop("$defs", {}))
        s["properties"]["kind"] = {"const": kind.value, "description": "the event kind"}
        defs[m.__name__] = s
        one_of.append({"$ref": f"#/$defs/{m.__name__}"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "chaosbench timeline event",
        "oneOf": one_of,
        "$defs": defs,
    }
