"""The framework-adapter interface: how the job is launched and supervised, and what counts as a reaction.

An adapter first makes a :class:`LaunchPlan` (plain data: processes, log patterns, timeouts, versions), which
``chaosbench run --dry-run`` prints; then :meth:`Framework.supervise` runs the plan until the job ends, the
adapter gives up, the run's deadline passes or the harness is interrupted.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from chaosbench.injectors.base import Role
from chaosbench.plugin_options import adopt_model
from chaosbench.probe import ENV_RESTART_COUNT_COUNTED
from chaosbench.runtimes.base import ProcessSpec, ProcHandle, Runtime
from chaosbench.signatures import AGENT_ONLY, error_line, rank_error
from chaosbench.timeline import TimelineFollower, TimelineWriter
from chaosbench.timeline.schema import check_fields_declared, typed_fields
from chaosbench.workloads.base import RunPaths

if TYPE_CHECKING:
    from chaosbench.spec_model import Scenario
    from chaosbench.workloads.base import Workload


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def base_versions() -> dict[str, str | None]:
    from chaosbench import __version__

    return {
        "chaosbench": __version__,
        "python": sys.version.split()[0],
        "torch": package_version("torch"),
    }


#: torch.distributed's default process-group timeout for gloo (NCCL's is 10 minutes), in force when a script
#: passes no ``timeout`` to ``init_process_group``.
TORCH_DEFAULT_PG_TIMEOUT_S = 1800.0


@dataclass
class Prediction:
    """When a framework can detect a fault, from the timeouts in force.

    ``expected_s``: seconds after the fault (None: the framework cannot detect it at all): the deciding timeout
    plus the polling interval that notices it; a real detection also pays what the model leaves out (the step in
    flight before a collective starts waiting, the harness reading the log line), so measured values scatter
    around it; ``decided_by``: the terms of the sum (``"workload_pg_timeout_s=10 + monitor_interval_s=0.1"``);
    ``resume_floor_s``: the earliest the job can train again (detection plus fixed waits such as torchrun's 30 s
    SIGTERM grace), when the adapter knows it; ``note``: why, in words."""

    expected_s: float | None
    decided_by: str
    resume_floor_s: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "expected_s": self.expected_s,
            "decided_by": self.decided_by,
            "resume_floor_s": self.resume_floor_s,
            "note": self.note,
        }


def chain(*terms: tuple[str, float | None]) -> tuple[float, str]:
    """Sum of named timeouts and the text naming them: ``chain(("a", 10), ("b", 0.1))`` -> (10.1, "a=10 + b=0.1")."""
    total = sum(float(v) for _, v in terms if v is not None)
    return total, " + ".join(f"{k}={v:g}" for k, v in terms if v is not None)


def pg_timeout(timeouts: dict[str, Any]) -> tuple[str, float]:
    """The workload's process-group timeout as a named term; torch's default when the script sets none."""
    v = timeouts.get("workload_pg_timeout_s")
    if v is None:  # the script sets none: torch's default is in force
        return "torch_default_pg_timeout_s", TORCH_DEFAULT_PG_TIMEOUT_S
    return "workload_pg_timeout_s", float(v)


@dataclass
class LogPattern:
    """A log line of the framework that means something: ``kind`` is the event written when ``regex``
    matches a line of a process with role ``role`` (named groups become event fields: each must be a field of the
    kind's model, :mod:`chaosbench.timeline.schema`, and is converted to its type)."""

    kind: str  # detect | restart | give_up | log
    regex: str
    role: str = "*"
    #: For a ``detect``: what noticed the failure (``exit``: a process's exit; ``heartbeat``: a missed
    #: heartbeat of the framework's own), written as the event's ``via``.
    via: str = ""

    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)


#: The role torchrun gives every worker (``--role``'s default): one role, so role ranks are global ranks.
TORCHRUN_ROLE_NAME = "default"


def torchrun_worker_env(
    *,
    rank: int | str,
    local_rank: int | str,
    group_rank: int | str,
    world_size: int,
    local_world_size: int,
    group_world_size: int,
    master_addr: str,
    master_port: int | str,
    run_id: str,
    restart_count: int | str,
    max_restarts: int,
    inherited: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """torchrun's worker environment, for a rank chaosbench launches itself (``none``, ``restart``,
    ``slurm-requeue``), so that a script that works under torchrun works unchanged there.

    The variables are those torch 2.13's ``LocalElasticAgent._start_workers`` sets for every worker, with the
    values torchrun would give this rank: ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK`` (the node's index),
    ``ROLE_RANK`` (= ``RANK``: one role), ``ROLE_NAME`` (``default``), ``WORLD_SIZE``, ``ROLE_WORLD_SIZE``
    (= ``WORLD_SIZE``), ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE`` (nodes), ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_RESTART_COUNT`` (the adapter's restarts before this rank's incarnation),
    ``TORCHELASTIC_MAX_RESTARTS`` (the adapter's retry limit; 0 when it never restarts), ``TORCHELASTIC_RUN_ID``
    (the run id, as the agent adapters pass it to ``--rdzv-id``), ``TORCHELASTIC_USE_AGENT_STORE`` (``False``: no
    agent hosts a store, rank 0 does, as env:// does without torchrun; ``True`` would make torch's env:// init
    connect to a store nobody serves) and ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (``inherited``'s value, the
    environment the rank would otherwise inherit, default the harness's: else ``1``, as the agent takes it from
    its own). Also ``CHAOSBENCH_RESTART_COUNT_COUNTED`` = the restart count: it is already counted in
    ``CHAOSBENCH_INCARNATION``, so the probe does not add it again (:func:`chaosbench.probe.incarnation_from_env`).

    Left out, as the agent's own business: ``TORCHELASTIC_ERROR_FILE`` (the agent's reply file, which nothing
    here reads; without it torch's ``@record`` logs the error instead), ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (the
    signals the agent forwards, in its own environment, which its workers inherit) and ``CUDA_VISIBLE_DEVICES``
    (the agent only passes its own on). ``OMP_NUM_THREADS`` is in every rank's environment already
    (:meth:`JobContext.rank_env`). An ``int | str`` value may be a shell expression (``"$SLURM_PROCID"``) for a
    batch script to expand; it is passed through as is."""
    env = dict(os.environ) if inherited is None else inherited
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": TORCHRUN_ROLE_NAME,
        "WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_WORLD_SIZE": str(group_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(False),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ENV_RESTART_COUNT_COUNTED: str(restart_count),
    }


@dataclass
class JobContext:
    """Everything an adapter needs to plan a run."""

    scenario: Scenario
    run_id: str
    run_dir: Path
    ckpt_dir: Path
    events_path: Path
    workload: Workload
    runtime: Runtime
    extra_env: dict[str, str] = field(default_factory=dict)  # from injectors' prepare()

    @property
    def paths(self) -> RunPaths:
        """What the workload is told about the run."""
        sc = self.scenario
        return RunPaths(self.run_dir, self.ckpt_dir, sc.seed, sc.project_dir, sc.suite_dir)

    def workload_argv(self) -> list[str]:
        """The command line of one rank of the workload."""
        return self.workload.argv(self.paths)

    @property
    def ranks(self) -> int:
        return self.scenario.workload.ranks

    @property
    def nodes(self) -> int:
        return self.scenario.workload.nodes

    @property
    def ranks_per_node(self) -> int:
        return self.scenario.workload.ranks_per_node

    def node_name(self, index: int) -> str:
        return f"node{index}"

    def rank_env(self, incarnation: int, node: str = "node0") -> dict[str, str]:
        """Environment every training process gets, whoever launches it."""
        env = {
            "CHAOSBENCH_EVENTS": str(self.events_path),
            "CHAOSBENCH_RUN_ID": self.run_id,
            "CHAOSBENCH_RUN_DIR": str(self.run_dir),
            "CHAOSBENCH_NODE": node,
            "CHAOSBENCH_INCARNATION": str(incarnation),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(self.workload.env(self.paths))
        env.update(self.extra_env)
        return env


@dataclass
class LaunchPlan:
    """Plain data describing how the job will be run; printable and testable without running it."""

    framework: str
    adapter: str
    processes: list[ProcessSpec]
    patterns: list[LogPattern] = field(default_factory=list)
    timeouts: dict[str, float | None] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "adapter": self.adapter,
            "processes": [p.to_dict() for p in self.processes],
            "patterns": [{"kind": p.kind, "regex": p.regex, "role": p.role} for p in self.patterns],
            "timeouts": self.timeouts,
            "versions": self.versions,
            "options": self.options,
            "notes": self.notes,
        }


@dataclass
class JobResult:
    """How supervision ended: ``completed`` (all ranks exited 0), ``failed`` (the job died and nothing
    restarted it), ``gave_up`` (retry limit reached), ``deadline`` or ``interrupted``."""

    status: str
    reason: str = ""


class RunControl:
    """The harness side of a live run, handed to :meth:`Framework.supervise`."""

    def __init__(
        self,
        runtime: Runtime,
        timeline: TimelineWriter,
        follower: TimelineFollower,
        deadline_monotonic: float,
    ) -> None:
        self.runtime = runtime
        self.timeline = timeline
        self.follower = follower
        self.deadline_monotonic = deadline_monotonic
        self.interrupted = threading.Event()

    def stop_reason(self) -> str | None:
        if self.interrupted.is_set():
            return "interrupted"
        if time.monotonic() >= self.deadline_monotonic:
            return "deadline"
        return None

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, never past the deadline; the harness's stop ends it early."""
        self.interrupted.wait(max(0.0, min(seconds, self.deadline_monotonic - time.monotonic())))

    def interrupt(self) -> None:
        """Stop the run: :meth:`stop_reason` says ``interrupted`` from now on, and every wait ends."""
        self.interrupted.set()
        self.runtime.run.exits.wake()

    def wait(self, seconds: float, exits_seen: int | None = None) -> None:
        """:meth:`sleep`, also ended by any exit of the run's processes after the ``exits_seen``-th (the run's
        :class:`~chaosbench.runtimes.base.ExitQueue` count when the caller last looked); None: only the
        stop ends it early."""
        if exits_seen is None:
            self.sleep(seconds)
            return
        timeout = max(0.0, min(seconds, self.deadline_monotonic - time.monotonic()))
        self.runtime.run.exits.wait(exits_seen, timeout, self.interrupted)


@dataclass(frozen=True)
class Stopped:
    """The harness stopped the run before the job had a result: ``reason`` is ``deadline`` or ``interrupted``."""

    reason: str

    def result(self, detail: str | None = None) -> JobResult:
        """The job's result: the stop, and ``detail`` (default: the harness stopped the run)."""
        return JobResult(self.reason, detail or f"harness stopped the run ({self.reason})")


R = TypeVar("R")


def supervise_loop(
    control: RunControl, step: Callable[[], R | None], interval_s: float, *, wake_on_exit: bool = True
) -> R | Stopped:
    """The loop every adapter supervises its job with. ``step()`` looks at the job (its processes' exits, a
    watchdog, the scheduler's state, spares to start) and returns what ends the watch (a :class:`JobResult`, or a
    failure the adapter acts on), or None; then the harness's stop (deadline, interrupt) ends it as
    :class:`Stopped`; else the loop waits up to ``interval_s`` and steps again.

    The wait is on the run's exit queue (:class:`~chaosbench.runtimes.base.ExitQueue`). With ``wake_on_exit``
    an exit of any of the run's processes since the step began wakes it at once: a launcher that exits is seen
    when it does (the adapters watching launchers, whose interval is only the harness's own pace). Without, the
    loop steps every ``interval_s`` and no sooner: for adapters whose interval is the modelled framework's
    polling (the plain restart loop's and the balancer supervisor's ``monitor_interval_s``, the Slurm poll),
    which their detection time includes by design, as the predictions say. The stop ends either wait."""
    exits = control.runtime.run.exits
    while True:
        seen = exits.count
        out = step()
        if out is not None:
            return out
        stop = control.stop_reason()
        if stop:
            return Stopped(stop)
        control.wait(interval_s, seen if wake_on_exit else None)


def supervise_job(
    control: RunControl,
    step: Callable[[], JobResult | None],
    interval_s: float,
    *,
    wake_on_exit: bool = True,
) -> JobResult:
    """:func:`supervise_loop` until ``step`` returns the job's result; the harness's stop is the result then."""
    out = supervise_loop(control, step, interval_s, wake_on_exit=wake_on_exit)
    return out.result() if isinstance(out, Stopped) else out


def process_context(handle: ProcHandle) -> dict[str, Any]:
    """Where a log line came from, for resolving whom it names: the process's node (a torchrun agent's
    ``local_rank`` is a rank on its own node) and, for a TorchFT replica group's launcher, its group."""
    ctx: dict[str, Any] = {"node": handle.spec.node}
    group = handle.spec.env.get("REPLICA_GROUP_ID")
    if group is not None:
        ctx["replica_group"] = int(group)
    return ctx


class LogWatcher:
    """Turns matching log lines into timeline events, stamped when the line was read. Each event also carries
    the emitting process's context (:func:`process_context`), so a ``local_rank`` it names can be resolved to the
    global rank the framework blamed.

    A pattern's named groups become fields of its kind's model (:mod:`chaosbench.timeline.schema`), converted to
    the types it declares (``(?P<local_rank>\\d+)`` gives an int): a pattern whose kind is unknown or whose groups
    its kind does not declare is refused here, when the watcher is made (:class:`~chaosbench.errors.InvalidEvent`),
    not at the first line it matches."""

    def __init__(self, framework: str, patterns: list[LogPattern], timeline: TimelineWriter) -> None:
        self.framework = framework
        self.timeline = timeline
        self._patterns = [(p, p.compiled()) for p in patterns]
        for p, rx in self._patterns:
            check_fields_declared(p.kind, rx.groupindex, f"(a named group of the pattern {p.regex!r})")

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        for pat, rx in self._patterns:
            if pat.role not in ("*", handle.spec.role):
                continue
            m = rx.search(line)
            if m:
                groups = typed_fields(pat.kind, {k: v for k, v in m.groupdict().items() if v is not None})
                fields = {**process_context(handle), **groups}
                if pat.via:
                    fields["via"] = pat.via
                self.timeline.emit(
                    pat.kind,
                    t_ns=t_ns,
                    src="framework",
                    framework=self.framework,
                    proc=handle.name,
                    line=line[:400],
                    **fields,
                )


_RANK_PREFIX = re.compile(r"\[(?:default)?rank(\d+)\]:")


class RankErrorWatcher:
    """The harness's own watch on every process's output (a runtime's line observer): the first line of each
    kind in :data:`~chaosbench.signatures.RANK_ERROR_SIGNATURES` a rank prints becomes a ``rank_error`` event
    (``signature``, the line, the rank and the process's context), whichever framework runs it. The metrics
    name what detected a failure from them (a peer's exit after its process-group timeout fired)."""

    def __init__(self, timeline: TimelineWriter) -> None:
        self.timeline = timeline
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        signature = rank_error(line)
        if signature is None:
            return
        # an agent (torchrun) passes its workers' lines on, each prefixed with ``[rank<r>]:``
        prefixed = _RANK_PREFIX.match(line)
        if signature in AGENT_ONLY and (handle.spec.role != "agent" or prefixed):
            return
        rank = handle.spec.env.get("RANK") or (prefixed.group(1) if prefixed else None)
        with self._lock:
            key = (f"{handle.name}:{handle.pid}:{rank}", signature)
            if key in self._seen:
                return
            self._seen.add(key)
        fields: dict[str, Any] = {**process_context(handle), **({"rank": int(rank)} if rank else {})}
        self.timeline.emit(
            "rank_error",
            t_ns=t_ns,
            proc=handle.name,
            pid=handle.pid,
            role=handle.spec.role,
            signature=signature,
            line=line[:400],
            **fields,
        )


class ProcErrorWatcher:
    """The harness's own watch on every process's output (a runtime's line observer): the first line of each
    process that states an error (:func:`~chaosbench.signatures.error_line`) becomes a ``proc_error`` event, so
    a process that died before the job made progress (a framework's helper, a rank that failed at import) is
    named with why in its run's verdict (``startup_failure``), whichever framework runs it."""

    def __init__(self, timeline: TimelineWriter) -> None:
        self.timeline = timeline
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        key = (handle.name, handle.pid)
        if key in self._seen or not error_line(line):
            return
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self.timeline.emit(
            "proc_error",
            t_ns=t_ns,
            proc=handle.name,
            pid=handle.pid,
            role=handle.spec.role,
            stream=stream,
            line=line[:400],
        )


class NoOptions(BaseModel):
    """The options of a framework that takes none."""

    model_config = ConfigDict(extra="forbid")


#: A framework's options model: ``class NoneFramework(Framework[NoneOptions])`` makes ``self.options`` a NoneOptions.
O = TypeVar("O", bound=BaseModel)  # noqa: E741 - the options' type parameter, as in the issue's Framework[O]


class Framework(ABC, Generic[O]):
    """One fault-tolerance system under test, typed by its options model ``O``
    (``class TorchftFramework(Framework[TorchftOptions])``): that model is its ``Options`` and ``self.options``
    an instance of it."""

    name: ClassVar[str]
    #: The processes a fault can target by role (``target: {role: ...}``), and how each is found.
    roles: ClassVar[dict[str, Role]] = {"rank0": Role("rank 0's process", rank=0)}
    #: Whether a recovery under this framework heals a restarted replica group from a live peer (``heal_begin``
    #: on the timeline), so that a fault can fire on the ``heal`` phase of another's recovery.
    heals: ClassVar[bool] = False

    #: The options model: the type argument ``O`` (set from it when a subclass is made), or one set explicitly.
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_model(cls, Framework, "Options")

    def __init__(self, label: str, options: O) -> None:
        self.label = label
        self.options: O = options

    @classmethod
    def missing_engine(cls, options: O, runtime: type[Runtime]) -> str | None:
        """What this adapter, with ``options`` on ``runtime``, needs on this machine and lacks (a program, a
        package), naming what to install; None when nothing is missing. A warning before a suite runs and in
        ``--dry-run``; a run fails with the same reason and the suite goes on.

        Args:
            options: The adapter's options (an instance of its ``Options``).
            runtime: The runtime class the run would go to.

        Returns:
            What is missing, in words, naming what to install; None when nothing is (the default).
        """
        return None

    @abstractmethod
    def plan(self, job: JobContext) -> LaunchPlan:
        """Describe the launch; no side effects.

        Args:
            job: The run to plan: scenario, workload, runtime, paths and the injectors' extra environment.

        Returns:
            The plan: the processes to start, the log patterns to watch, the timeouts in force, the versions.
        """

    @abstractmethod
    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        """Run the plan to its end. Must return promptly once ``control.stop_reason()`` is set, leaving
        teardown of what is still running to the caller (``runtime.cleanup``). The adapters watch their job with
        :func:`supervise_job` (or :func:`supervise_loop`), woken by the run's process exits.

        Args:
            job: The run, as it was planned.
            plan: What :meth:`plan` returned for ``job``.
            control: The harness's side of the run: its runtime, timeline, deadline and interruption.

        Returns:
            How supervision ended (``completed``, ``failed``, ``gave_up``, ``deadline`` or ``interrupted``) and
            why, in words.
        """

    def cleanup(self, job: JobContext) -> None:
        """Remove what the adapter made on the harness's host besides processes (Ray's temp-dir link), once the
        run's processes are gone (the runner calls it after the runtime's cleanup, also after a failed run);
        safe to call twice. Nothing by default.

        Args:
            job: The run, as it was planned.
        """

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        """Every timeout in force that shapes detection and recovery, in seconds (None: no timeout).

        Args:
            job: The run whose timeouts are asked for (the base reads its workload's process-group timeout).

        Returns:
            Timeout name (``workload_pg_timeout_s``, the adapter's own) -> seconds, or None where none applies.
        """
        return {"workload_pg_timeout_s": job.workload.pg_timeout_s}

    def node_loss_wait(
        self, nodes: int, node: str | None, timeouts: dict[str, Any]
    ) -> tuple[str, float] | None:
        """When ``node``, one of the job's ``nodes``, is lost for good (its processes killed, nothing started in its
        place): the wait after which the adapter gives up on it, named as in ``timeouts`` (a fixed-size rendezvous
        waiting for the node to rejoin: ``("rdzv_join_timeout_s", 600.0)``); None when the adapter goes on
        without the node, a spare takes its place, it relaunches the whole job, or it is not known which node
        goes (the default).

        Args:
            nodes: The job's node count.
            node: The lost node's name (``node1``); None when the fault picks it as the run goes.
            timeouts: The timeouts in force, as :meth:`timeouts` gives them in the plan.

        Returns:
            The deciding timeout's name and seconds; None when no such wait follows a lost node.
        """
        return None

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        """When the adapter can detect a fault of this ``mode`` (``crash``, ``hang`` or ``stall``, see
        :attr:`chaosbench.injectors.base.Injector.failure_mode`) under ``timeouts`` (its own, as in the plan);
        None when the adapter has no model for it.

        Args:
            mode: The fault's failure mode: ``crash``, ``hang`` or ``stall``.
            timeouts: The timeouts in force, as :meth:`timeouts` gives them in the plan.

        Returns:
            When the fault can be detected and what decides it; None when the adapter has no model for ``mode``
            (the default).
        """
        return None

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        """Timeouts ordered so that one can never decide (a heartbeat longer than the process-group timeout),
        or settings that make a fault undetectable in practice: one line each.

        Args:
            timeouts: The timeouts in force, as :meth:`timeouts` gives them in the plan.

        Returns:
            One line per problem, in words; empty when there is none (the default).
        """
        return []

    def versions(self) -> dict[str, str | None]:
        """The versions of what the run depends on, recorded in the plan.

        Returns:
            Package -> version (None: not installed); the base gives chaosbench, python and torch, adapters
            add their framework's.
        """
        return base_versions()

    def launch_plan(
        self,
        job: JobContext,
        processes: list[ProcessSpec],
        patterns: list[LogPattern] | None = None,
        options: dict[str, Any] | None = None,
        notes: list[str] | None = None,
        versions: dict[str, str | None] | None = None,
    ) -> LaunchPlan:
        """This adapter's plan: its label, name, timeouts and versions, with ``options`` (default: the adapter's
        options as given) and the rest as passed.

        Args:
            job: The run being planned (for :meth:`timeouts`).
            processes: The processes to start.
            patterns: The log patterns to watch; None: none.
            options: The options to record; None: the adapter's own options, dumped.
            notes: Notes to print with the plan; None: none.
            versions: The versions to record; None: :meth:`versions`.

        Returns:
            The plan, with ``framework`` this adapter's label and ``adapter`` its name.
        """
        return LaunchPlan(
            framework=self.label,
            adapter=self.name,
            processes=processes,
            patterns=list(patterns or []),
            timeouts=self.timeouts(job),
            versions=self.versions() if versions is None else versions,
            options=self.options.model_dump() if options is None else options,
            notes=list(notes or []),
        )
