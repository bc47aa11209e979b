"""One run's life cycle, from its fresh directory to its teardown (:class:`RunLifecycle`): its faults prepared,
its plan made and recorded, its runtime provisioned, the framework's supervision, and every cleanup, each
registered on a :class:`_Teardown` as soon as what it undoes exists. Also the runs going on now
(:class:`LiveRuns`), which a requested stop interrupts. What a run leaves is :mod:`chaosbench.run_results`'.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.errors import ChaosbenchError, MissingEngine
from chaosbench.fault_control import FaultController
from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    ProcErrorWatcher,
    RankErrorWatcher,
    RunControl,
)
from chaosbench.injectors.base import Injector, RunSetup
from chaosbench.planning import build_framework, build_injector, build_runtime, detection_outlook, job_context
from chaosbench.run_results import CleanupFailure, RunRecord, SuiteHalt
from chaosbench.rundir import RunDir, write_atomic
from chaosbench.runtimes.base import RunInfo, Runtime
from chaosbench.specs import Scenario
from chaosbench.timeline import TIMELINE_VERSION, Event, TimelineFollower, TimelineWriter
from chaosbench.timeline.schema import harness_writer

if TYPE_CHECKING:
    from chaosbench.workloads.checkpoint_watch import CheckpointWatcher


class LiveRuns:
    """The controls of the runs going on now (several with ``--jobs``), so that a stop requested from a signal
    handler reaches every one (:meth:`interrupt_all`). Its lock is reentrant: the signal handler takes it in the
    main thread, which may hold it already (a run added or released there)."""

    def __init__(self) -> None:
        self._controls: set[RunControl] = set()
        self._lock = threading.RLock()

    def add(self, control: RunControl) -> None:
        with self._lock:
            self._controls.add(control)

    def discard(self, control: RunControl) -> None:
        with self._lock:
            self._controls.discard(control)

    def interrupt_all(self) -> None:
        """Every live run's ``interrupted`` set: each ends promptly, with its teardown and reverts."""
        with self._lock:
            for control in self._controls:
                control.interrupt()

    def count(self) -> int:
        """How many runs are live now."""
        return len(self._controls)


class RunLifecycle:
    """One run of ``sc`` as run ``run_id`` in ``run_dir`` (made afresh), from its directory to its teardown
    (:meth:`run`). ``live``: the suite's live runs, this one among them while it is supervised;
    ``stop_requested``: set, the run starts interrupted; ``on_event``: where its events go as they are written
    (the progress), if anywhere.

    Teardown: each cleanup is registered on a :class:`_Teardown` as soon as what it undoes exists, and they
    run last-first when the run ends, every one even when one before it failed: the fault controllers
    closed (their firings reverted), the runtime's cleanup (every process and container of the run), the
    checkpoint watcher stopped, the injectors' cleanups (mounts, cgroups, rules), the final artifact
    digested, ``run_end`` written, the follower stopped, the timeline closed. A cleanup that fails makes
    this run an ``error`` whose reason names it (``cleanup failed: runtime cleanup: RuntimeError: ...``:
    in its ``run_end``, its result and :attr:`RunRecord.cleanup_failures`); when the runtime then still lists
    processes or objects of the run, or cannot list them, the next run could collide with them (ports,
    containers, GPUs, nodes): :meth:`run` returns a :class:`SuiteHalt` with the record."""

    def __init__(
        self,
        sc: Scenario,
        run_dir: Path,
        run_id: str,
        live: LiveRuns,
        stop_requested: threading.Event,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.run_id = run_id
        self.live = live
        self.stop_requested = stop_requested
        self.on_event = on_event
        #: The run's result so far: supervision's, once it has ended.
        self.result = JobResult("error", "not started")
        #: What the runtime lists as still there after the cleanups (``pid N``, containers, ...).
        self.left: list[str] = []
        #: The run's processes the runtime lists as still there after the cleanups.
        self.pids: list[int] = []

    def run(self) -> tuple[RunRecord, SuiteHalt | None]:
        """The run, torn down: its record, and why the suite must stop after it (None: it need not). Raises only
        a BaseException (KeyboardInterrupt), once every cleanup has run; any other failure is the run's
        ``error``."""
        sc, run_dir = self.sc, self.run_dir
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        cpu_start_s = time.process_time()  # the harness's own CPU (every thread; not its children, the ranks)
        with _Teardown() as teardown:
            timeline, follower, runtime = self._open(teardown)
            # after every cleanup: it lists what they left and says if one failed
            teardown.callback(self._run_end, runtime, timeline, teardown, cpu_start_s)
            # The scenario first, the plan once there is one: a run that fails before it is planned (an engine
            # or a package missing for its fault) still has a config, so it is recorded with its reason and the
            # suite goes on (its metrics read the config).
            self._write_config(None, None)
            try:
                self.result = self._start_and_supervise(runtime, timeline, follower, teardown)
            except ChaosbenchError as exc:
                self.result = JobResult("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - a harness bug must still tear the run down
                self.result = JobResult("error", f"{type(exc).__name__}: {exc}")
            finally:
                # From here on every process exit, log line and reaction is caused by the harness, not by the
                # fault: the metrics credit nothing after this event to the framework
                # (chaosbench.analysis.metrics).
                timeline.emit("teardown_begin", reason=_teardown_reason(self.result))
        # every failure, also of the steps after run_end (the follower's stop, the timeline's close)
        result = _with_cleanup_failures(self.result, teardown.failures)
        rec = RunRecord(sc, run_dir, result, leftovers=self.pids, cleanup_failures=list(teardown.failures))
        halt = None
        if teardown.failures and self.left:
            halt = SuiteHalt(f"{sc.id} #{sc.repeat}", run_dir, list(teardown.failures), self.left)
        return rec, halt

    def _open(self, teardown: _Teardown) -> tuple[TimelineWriter, TimelineFollower, Runtime]:
        """The run's timeline (written), its follower (started) and its runtime, their cleanups registered."""
        timeline = harness_writer(RunDir(self.run_dir).events)  # every event validated with its kind's model
        teardown.cleanup("timeline close", timeline.close)
        follower = TimelineFollower(RunDir(self.run_dir).events)
        if self.on_event is not None:
            follower.subscribe(self.on_event)
        follower.start()
        teardown.cleanup("timeline follower", follower.stop)
        runtime = build_runtime(self.sc, RunInfo(self.run_id, self.run_dir, timeline))
        runtime.line_observers.append(RankErrorWatcher(timeline))
        runtime.line_observers.append(ProcErrorWatcher(timeline))
        return timeline, follower, runtime

    def _run_end(
        self, runtime: Runtime, timeline: TimelineWriter, teardown: _Teardown, cpu_start_s: float
    ) -> None:
        """The ``run_end`` event, after every cleanup: what the runtime still lists (kept in :attr:`pids` and
        :attr:`left`; a listing that fails is a cleanup failure, and what is left then unknown) and the run's
        outcome with its cleanups' failures."""
        try:
            self.pids, objects = runtime.leftovers(), runtime.leftover_objects()
            self.left.extend([f"pid {p}" for p in self.pids] + objects)
        except Exception as exc:  # noqa: BLE001 - recorded; what may be left is then unknown
            teardown.failures.append(CleanupFailure("leftover check", _one_line(exc)))
            objects = []
            self.left.append(f"whatever the runtime could not list ({_one_line(exc)})")
        end = _with_cleanup_failures(self.result, teardown.failures)
        timeline.emit(
            "run_end",
            outcome=end.status,
            reason=end.reason,
            leftover_pids=self.pids,
            leftover_objects=objects,
            concurrent_runs=self.live.count() + 1,
            harness_cpu_s=round(time.process_time() - cpu_start_s, 4),
        )

    def _write_config(self, plan: dict[str, Any] | None, total_steps: int | None) -> None:
        """The run's ``config.json``: its id, scenario, and its plan and total steps once it has them."""
        write_atomic(
            RunDir(self.run_dir).config,
            json.dumps(
                {
                    "run_id": self.run_id,
                    "scenario": self.sc.to_dict(),
                    "plan": plan,
                    "total_steps": total_steps,
                },
                indent=2,
                default=str,
            ),
        )

    def _start_and_supervise(
        self, runtime: Runtime, timeline: TimelineWriter, follower: TimelineFollower, teardown: _Teardown
    ) -> JobResult:
        """The run from its faults' prepare to the end of its supervision, each cleanup registered on
        ``teardown`` as what it undoes comes to exist (see :meth:`run`). Raises what the steps raise."""
        sc = self.sc
        job = job_context(sc, self.run_dir, runtime, self.run_id)
        teardown.cleanup("final artifact digest", _digest_final_artifact, job, timeline)
        framework = build_framework(sc)
        # what the dry-run warned about (missing_engines): the run fails with the same words before it starts
        # anything, whatever step would otherwise have stumbled on it (a launcher's import, a container's start)
        missing = type(runtime).missing_engine() or type(framework).missing_engine(
            framework.options, type(runtime)
        )
        if missing is not None:
            raise MissingEngine(missing)
        controllers = self._prepare_faults(job, framework, runtime, timeline, teardown)
        runtime.resolve()  # what the plan needs from the cluster, looked up now: planning itself runs nothing
        plan = framework.plan(job)
        self._write_config(plan.to_dict(), job.workload.total_steps)
        self._emit_start(timeline, framework, plan)
        # The watcher before the nodes: it stops after the runtime's cleanup, once the last writes are in.
        watcher = _checkpoint_watcher(job, timeline, follower)
        if watcher is not None:
            teardown.cleanup("checkpoint watcher", watcher.stop)
        # after the runtime's: its processes gone
        teardown.cleanup("framework cleanup", framework.cleanup, job)
        teardown.cleanup("runtime cleanup", runtime.cleanup)
        runtime.provision(sc.workload.nodes)  # container nodes: now, after the faults' prepare, all at once
        for controller in controllers:
            follower.subscribe(controller)
            # before the runtime's
            teardown.cleanup(f"fault '{controller.fault_name}' controller", controller.close)
        control = RunControl(runtime, timeline, follower, time.monotonic() + sc.deadline_s)
        self.live.add(control)
        teardown.cleanup("run control", self.live.discard, control)
        if self.stop_requested.is_set():
            control.interrupt()
        return framework.supervise(job, plan, control)

    def _prepare_faults(
        self,
        job: JobContext,
        framework: Framework,
        runtime: Runtime,
        timeline: TimelineWriter,
        teardown: _Teardown,
    ) -> list[FaultController]:
        """Each fault's injector prepared, its cleanup registered, its environment added to the job's; the
        controllers of the faults with a trigger (not yet following the timeline)."""
        sc = self.sc
        controllers: list[FaultController] = []
        for i, (fault_name, fault) in enumerate(sc.faults):
            injector = build_injector(fault_name, fault)
            setup = RunSetup(
                run_id=self.run_id,
                run_dir=self.run_dir,
                ckpt_dir=job.ckpt_dir,
                runtime=runtime,
                timeline=timeline,
                rng=random.Random(sc.rng_seed + i),
                ranks=sc.workload.ranks,
                nodes=sc.workload.nodes,
                target=fault.target,
                roles=dict(framework.roles),
            )
            # before prepare: what a prepare that fails half-way made is undone too
            teardown.cleanup(f"fault '{fault_name}' cleanup", _cleanup_injector, injector, timeline)
            injector.prepare(setup)
            job.extra_env.update(setup.env)
            if fault.trigger is not None:
                controllers.append(FaultController(fault_name, fault, injector, setup, sc.rng_seed + i))
        return controllers

    def _emit_start(self, timeline: TimelineWriter, framework: Framework, plan: LaunchPlan) -> None:
        """The run's ``run_start``, its framework's ``framework_info`` and a ``detection_prediction`` per fault."""
        sc = self.sc
        timeline.emit(
            "run_start",
            suite=sc.suite,
            scenario=sc.id,
            framework=sc.framework_label,
            adapter=sc.adapter,
            fault=sc.fault_name,
            repeat=sc.repeat,
            control=sc.control,
            seed=sc.seed,
            run_id=self.run_id,
            runtime=sc.runtime,
            ranks=sc.workload.ranks,
            nodes=sc.workload.nodes,
            timeline_version=TIMELINE_VERSION,
        )
        timeline.emit(
            "framework_info",
            framework=sc.framework_label,
            versions=plan.versions,
            timeouts=plan.timeouts,
            options=plan.options,
            timeout_problems=framework.timeout_problems(plan.timeouts),
        )
        for rec in detection_outlook(sc, framework, plan.timeouts):
            timeline.emit("detection_prediction", **rec)


def _cleanup_injector(injector: Injector, timeline: TimelineWriter) -> None:
    """An injector's cleanup at teardown; its failure is also recorded as the fault's revert (``fault_revert``
    with its ``error``), then raised to the teardown, which makes it the run's error."""
    try:
        injector.cleanup()
    except Exception as exc:
        timeline.emit(
            "fault_revert", src="injector", fault=injector.fault_name, reason="cleanup", error=_one_line(exc)
        )
        raise


class _Teardown(contextlib.ExitStack):
    """A run's cleanups, each registered (:meth:`cleanup`) when what it undoes comes to exist and run last-first
    when the ``with`` block ends: every one runs even when one before it raised, and a cleanup that raises an
    Exception is recorded in :attr:`failures` (in the order they ran), not raised. A BaseException
    (KeyboardInterrupt) still propagates, once every cleanup has run."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[CleanupFailure] = []

    def cleanup(self, step: str, fn: Callable[..., object], *args: Any) -> None:
        """Register ``fn(*args)`` as the cleanup named ``step``."""
        self.callback(self._run, step, fn, args)

    def _run(self, step: str, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - recorded: the run's error; the other cleanups still run
            self.failures.append(CleanupFailure(step, _one_line(exc)))


def _one_line(exc: BaseException) -> str:
    """``Type: message``, the message's first line, at most 300 characters."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= 300 else text[:299] + "…"


def _with_cleanup_failures(result: JobResult, failures: list[CleanupFailure]) -> JobResult:
    """The run's result once its cleanups ``failures`` are known: an ``error`` (an interrupted run stays
    interrupted: ``--resume`` runs it again) whose reason says which cleanups failed and why, after the reason
    supervision gave, if any; ``result`` itself when none failed."""
    if not failures:
        return result
    why = "cleanup failed: " + "; ".join(f.describe() for f in failures)
    status = "interrupted" if result.status == "interrupted" else "error"
    return JobResult(status, f"{result.reason}; {why}" if result.reason else why)


def _digest_final_artifact(job: JobContext, timeline: TimelineWriter) -> None:
    """The workload's final artifact digested into the timeline (``fidelity_from``), where it names one."""
    artifact = job.workload.final_artifact(job.paths)
    if artifact is not None:
        _digest_artifact(artifact, timeline)


class _LatestStep:
    """The job's step now (a follower's subscriber), for checkpoints whose names carry none: in the newest
    incarnation that reported steps, the step every stepping rank has reached (a rank ahead of the one saving
    does not make the save newer than it is)."""

    def __init__(self) -> None:
        self._reach: dict[int, dict[int, int]] = {}  # incarnation -> rank -> the highest step it reported

    def __call__(self, ev: Event) -> None:
        if ev.kind == "step" and ev.src == "rank":
            reach = self._reach.setdefault(int(ev.get("incarnation", 0)), {})
            rank = int(ev.get("rank", 0))
            reach[rank] = max(reach.get(rank, 0), int(ev.get("step", 0)))

    def latest(self) -> int | None:
        if not self._reach:
            return None
        return min(self._reach[max(self._reach)].values())


def _checkpoint_watcher(
    job: JobContext, timeline: TimelineWriter, follower: TimelineFollower
) -> CheckpointWatcher | None:
    """The run's filesystem watch of checkpoint saves, started, when its workload asks for one."""
    dirs = job.workload.watched_dirs(job.paths)
    if not dirs:
        return None
    from chaosbench.workloads.checkpoint_watch import CheckpointWatcher

    latest = _LatestStep()
    follower.subscribe(latest)
    watcher = CheckpointWatcher(dirs, timeline, current_step=latest.latest)
    watcher.start()
    return watcher


def _digest_artifact(path: str, timeline: TimelineWriter) -> None:
    """The ``artifact_digest`` event of the run's final artifact (its processes have all ended)."""
    from chaosbench.workloads.artifact import digest_artifact

    try:
        record = digest_artifact(path)
    except Exception as exc:  # noqa: BLE001 - a digest that cannot be taken is a missing figure, not a crash
        record = {"path": path, "error": f"{type(exc).__name__}: {exc}"}
    timeline.emit("artifact_digest", **record)


def _teardown_reason(result: JobResult) -> str:
    """Why the harness tears the run down: the job ended by itself (``end``), or the harness stopped it."""
    return result.status if result.status in ("deadline", "interrupted", "error") else "end"
