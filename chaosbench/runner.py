"""Runs a suite: every scenario in its own run directory (layout: :mod:`chaosbench.rundir`), one timeline each,
guaranteed teardown. Each run's metrics are computed when it ends and its ``result.json`` written last, each
file whole (written aside, then renamed), so a harness killed at any moment keeps every finished run, and
``--resume`` (:meth:`Runner.run`) skips them and runs the rest, the unfinished one again from scratch. The
suite's table is written once, at the end (or by ``chaosbench report``), from the runs' own files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import random
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.sequential import REPEATS_FILE, Settlement, StoppingRule
from chaosbench.errors import ChaosbenchError, MissingEngine, SpecError, Unsupported
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
from chaosbench.progress import PlannedRun
from chaosbench.registry import FRAMEWORKS, INJECTORS, RUNTIMES, WORKLOADS
from chaosbench.rundir import RunDir, SuiteDir, write_atomic
from chaosbench.runtimes.base import RunInfo, Runtime
from chaosbench.specs import FaultSpec, Scenario, Suite, UntilDecided
from chaosbench.timeline import TIMELINE_VERSION, Event, TimelineFollower, TimelineWriter
from chaosbench.timeline.schema import harness_writer
from chaosbench.workloads.base import Workload

if TYPE_CHECKING:
    from chaosbench.workloads.checkpoint_watch import CheckpointWatcher

SUITE_MARKER = SuiteDir.MARKER
#: Allowance per run for setting it up and tearing it down, beyond its deadline, in the suite's wall-time bound.
RUN_OVERHEAD_S = 30.0
#: Above these a suite runs only when told (``--yes``): most likely a typo (``repeats: 100000000``).
MAX_RUNS = 10_000
MAX_WALL_S = 24 * 3600.0
#: Likewise the size of one run: its world size, nodes and steps (``ranks: 1e12`` would build a plan per rank).
MAX_RANKS = 4096
MAX_NODES = 1024
MAX_STEPS = 1_000_000
#: The harness's GIL switch interval while a suite runs (at most; Python's default is 5 ms): see Runner.run.
SWITCH_INTERVAL_S = 0.001


class Progress(Protocol):
    """What the runner tells about its progress (:class:`chaosbench.progress.SuiteProgress` shows it).
    ``concurrency``: how many runs go at once (set by the runner before a concurrent suite starts)."""

    concurrency: int

    def skipped(self, label: str, reason: str) -> None: ...
    def run_started(self, index: int, label: str, deadline_s: float, control: bool) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def run_finished(self, label: str, summary: str, elapsed_s: float) -> None: ...
    def message(self, text: str) -> None: ...


class _Lines:
    """Progress as plain lines to a callable (or nowhere)."""

    def __init__(self, out: Callable[[str], None] | None = None) -> None:
        self.out = out or (lambda s: None)
        self.concurrency = 1

    def skipped(self, label: str, reason: str) -> None:
        self.out(f"{label}: {reason}")

    def run_started(self, index: int, label: str, deadline_s: float, control: bool) -> None:
        self.out(f"[{index}] {label} ...")

    def on_event(self, event: Event) -> None:
        pass

    def run_finished(self, label: str, summary: str, elapsed_s: float) -> None:
        self.out(f"{label} {summary} ({elapsed_s:.1f} s)")

    def message(self, text: str) -> None:
        self.out(text)


def suite_plan(suite: Suite, outlook: Sequence[dict[str, Any]] = ()) -> list[PlannedRun]:
    """Every run of the suite in run order, as the progress's ETA estimates them (:class:`PlannedRun`: a cell
    repeated until decided counts its ``max``); each bounded by its deadline plus :data:`RUN_OVERHEAD_S`, with
    the floor its faults' detection ``outlook`` (:meth:`Runner.outlook`) puts on its cost: per fault, its resume
    floor, else its expected detection."""
    floors: dict[tuple[str, str], float] = {}
    for rec in outlook:
        floor_s = (
            rec.get("resume_floor_s") if rec.get("resume_floor_s") is not None else rec.get("expected_s")
        )
        if floor_s is not None:
            floors[(str(rec.get("framework")), str(rec.get("fault")))] = float(floor_s)
    out: list[PlannedRun] = []
    for fw, names, bound in suite.cells():
        floor_s = sum(floors.get((fw, name), 0.0) for name in names)
        for rep in range(bound):
            sc = suite.scenario(fw, names, rep)
            out.append(
                PlannedRun(
                    len(out) + 1,
                    f"{sc.id} #{sc.repeat}",
                    fw,
                    sc.fault_name or "control",
                    sc.deadline_s + RUN_OVERHEAD_S,
                    floor_s,
                    sc.deadline_s,
                )
            )
    return out


def suite_limits(suite: Suite, jobs: int = 1) -> tuple[int, float, list[str]]:
    """The suite's number of runs, an upper bound of its wall time (every run reaching its deadline, plus
    :data:`RUN_OVERHEAD_S` each; ``jobs`` at once), and what exceeds :data:`MAX_RUNS` / :data:`MAX_WALL_S`, or
    in a run :data:`MAX_RANKS` / :data:`MAX_NODES` / :data:`MAX_STEPS`; builds no run."""
    n = suite.run_count()
    bound_s = suite.wall_bound_s(RUN_OVERHEAD_S, jobs)
    over = []
    if n > MAX_RUNS:
        over.append(f"{n} runs (limit {MAX_RUNS})")
    if bound_s > MAX_WALL_S:
        over.append(f"up to {bound_s / 3600:.1f} h (limit {MAX_WALL_S / 3600:g} h)")
    for fw in suite.matrix.all_frameworks():
        wl = suite.workload_for(fw)
        steps = getattr(WORKLOADS.get(wl.name).Options.model_validate(wl.options), "steps", None)
        label = f"framework '{fw}' workload" if suite.framework_spec(fw).workload else "defaults.workload"
        for what, value, limit in (
            ("ranks", wl.ranks, MAX_RANKS),
            ("nodes", wl.nodes, MAX_NODES),
            ("steps", steps, MAX_STEPS),
        ):
            if value is not None and value > limit:
                over.append(f"{label}: {value} {what} a run (limit {limit})")
    return n, bound_s, list(dict.fromkeys(over))


def missing_engines(suite: Suite) -> dict[str, str]:
    """What the suite needs on this machine and lacks, each naming what to install: its runtime's engine
    (:meth:`~chaosbench.runtimes.base.Runtime.missing_engine`), each framework's programs and packages, each
    fault's (:meth:`~chaosbench.injectors.base.Injector.missing_engine`), keyed ``runtime 'docker'``,
    ``framework 'balancer'``, ``fault 'slow'``."""
    out = {}
    rt = RUNTIMES.get(suite.defaults.runtime)
    if (why := rt.missing_engine()) is not None:
        out[f"runtime '{suite.defaults.runtime}'"] = why
    for fw in suite.matrix.all_frameworks():
        cls = FRAMEWORKS.get(suite.framework_spec(fw).adapter or fw)
        if (
            why := cls.missing_engine(cls.Options.model_validate(suite.framework_spec(fw).options), rt)
        ) is not None:
            out[f"framework '{fw}'"] = why
    for name in sorted({n for names in suite.matrix.fault_names() for n in names}):
        if (why := INJECTORS.get(suite.faults[name].injector).missing_engine()) is not None:
            out[f"fault '{name}'"] = why
    return out


def arithmetic_problems(sc: Scenario, options: Any, timeouts: dict[str, Any]) -> list[str]:
    """What a run's own numbers say it cannot do before its deadline: its steps at ``step_sleep_s`` each take
    longer, or a timeout in force is longer (a wait on it ends only at the deadline). One line each."""
    out = []
    steps, sleep_s = getattr(options, "steps", None), getattr(options, "step_sleep_s", None)
    if steps and sleep_s and steps * sleep_s >= sc.deadline_s:
        out.append(
            f"{steps} steps x step_sleep_s {sleep_s:g} s = {steps * sleep_s:g} s: a run cannot finish "
            f"before its deadline of {sc.deadline_s:g} s"
        )
    for name, value in timeouts.items():
        # A process-group timeout is what a collective with a lost peer waits, a delay what every recovery
        # waits; a limit on a wait that normally ends early (startup, rendezvous join) is no such problem.
        waited = "pg_timeout" in name or name.endswith("delay_s")
        if (
            waited
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and value > sc.deadline_s
        ):
            out.append(
                f"{name} ({value:g} s) is longer than the run's deadline ({sc.deadline_s:g} s): a wait on "
                "it ends only at the deadline"
            )
    return out


def _workload(scenario: Scenario) -> Workload:
    cls = WORKLOADS.get(scenario.workload.name)
    return cls(scenario.workload, cls.Options.model_validate(scenario.workload.options))


def _runtime(scenario: Scenario, info: RunInfo) -> Runtime:
    cls = RUNTIMES.get(scenario.runtime)
    options = cls.Options.model_validate(scenario.runtime_options) if scenario.runtime_options else None
    return cls(info, options)


def _framework(scenario: Scenario) -> Framework:
    cls = FRAMEWORKS.get(scenario.adapter)
    return cls(scenario.framework_label, cls.Options.model_validate(scenario.framework_options))


def _injector(name: str, fault: FaultSpec) -> Injector:
    cls = INJECTORS.get(fault.injector)
    return cls(name, cls.Params.model_validate(fault.params))


def detection_outlook(sc: Scenario, framework: Framework, timeouts: dict[str, Any]) -> list[dict[str, Any]]:
    """For each fault of the scenario: when its framework's timeouts in force let it detect the fault (see
    :meth:`Framework.predict_detection`; ``expected_s`` None: never), and the problems that follow from it (it
    cannot be detected, or the job cannot resume, before the run's deadline; it ends before it can be detected).
    Plain data: printed before a suite runs and written as ``detection_prediction`` events."""
    out = []
    for name, fault in sc.faults:
        injector = _injector(name, fault)
        mode = injector.failure_mode
        role = framework.roles.get(fault.target.role or "")
        # the models are of faults on ranks: the loss of an agent or a Lighthouse is another failure
        modelled = mode is not None and (role is None or role.rank is not None)
        pred = framework.predict_detection(mode, timeouts) if mode and modelled else None
        rec: dict[str, Any] = {
            "fault": name,
            "injector": fault.injector,
            "mode": mode,
            "framework": sc.framework_label,
        }
        if pred is None:
            of_role = mode is not None and not modelled  # a crash or hang of a role without a rank
            what = f"a {mode} of the {fault.target.role}" if of_role else f"a {mode or fault.injector} fault"
            rec.update(
                expected_s=None,
                decided_by="",
                resume_floor_s=None,
                modelled=False,
                note=f"no detection model for {what} under {sc.adapter}",
            )
            rec["problems"] = []
            out.append(rec)
            continue
        duration = injector.duration_s
        lost = injector.fault_class == "node" and mode == "crash" and duration is None  # a node gone for good
        wait = framework.node_loss_wait(sc.workload.nodes, fault.target.node, timeouts) if lost else None
        why_floor = ""
        if wait is not None and pred.expected_s is not None:
            pred.resume_floor_s = max(pred.resume_floor_s or pred.expected_s, pred.expected_s + wait[1])
            why_floor = f" (the next rendezvous waits {wait[0]}={wait[1]:g} for the lost node)"
            pred.note += (
                f"; the lost node does not come back: the next rendezvous waits {wait[0]}={wait[1]:g} for it"
            )
        if duration is not None and pred.expected_s is not None and pred.resume_floor_s is not None:
            # A fixed wait on a stopped process (torchrun's SIGTERM grace) ends once the fault ends and it can act.
            pred.resume_floor_s = max(pred.expected_s, min(pred.resume_floor_s, duration))
        rec.update(pred.to_dict())
        problems = []
        if pred.expected_s is not None and pred.expected_s >= sc.deadline_s:
            problems.append(
                f"{sc.framework_label} cannot detect {name} before the run's deadline ({sc.deadline_s:g} s): "
                f"expected {pred.expected_s:g} s after the fault ({pred.decided_by})"
            )
        elif pred.resume_floor_s is not None and pred.resume_floor_s >= sc.deadline_s:
            problems.append(
                f"{sc.framework_label} cannot resume from {name} before the run's deadline "
                f"({sc.deadline_s:g} s): not before {pred.resume_floor_s:g} s after the fault{why_floor}"
            )
        if duration is not None and pred.expected_s is not None and duration < pred.expected_s:
            problems.append(
                f"{name} ends after {duration:g} s, before {sc.framework_label} can detect it "
                f"({pred.expected_s:g} s): expect an undetected recovery in place"
            )
        rec["problems"] = problems
        out.append(rec)
    return out


def describe_outlook(rec: dict[str, Any]) -> str:
    """One line: ``torchrun x hang-rank1: detect ~ 10.1 s (workload_pg_timeout_s=10 + monitor_interval_s=0.1)``."""
    head = f"{rec['framework']} x {rec['fault']}: "
    if rec.get("expected_s") is None:
        modelled = rec.get("modelled", True)
        return head + (f"cannot detect it ({rec.get('note')})" if modelled else str(rec.get("note")))
    text = head + f"detect ~ {rec['expected_s']:g} s ({rec['decided_by']})"
    if rec.get("resume_floor_s") is not None:
        text += f", resume >= {rec['resume_floor_s']:g} s"
    return text


@dataclass(frozen=True)
class _Cell:
    """A framework x fault schedule of the suite and its repeats: ``bound`` runs at most, from suite index
    ``first_index``; ``design`` when repeated until decided; ``has_slos``: its runs carry SLOs."""

    framework: str
    faults: list[str]
    bound: int
    first_index: int
    design: UntilDecided | None
    has_slos: bool

    @property
    def id(self) -> str:
        return f"{self.framework}/{'+'.join(self.faults) or 'control'}"


@dataclass
class RunRecord:
    scenario: Scenario
    run_dir: Path
    result: JobResult
    metrics: RunMetrics | None = None
    leftovers: list[int] = field(default_factory=list)
    index: int = 0  # 1-based place in the suite's order
    #: The run's cleanups that failed (each also named in ``result.reason``).
    cleanup_failures: list[CleanupFailure] = field(default_factory=list)


class Runner:
    """Runs the scenarios of a suite: every framework's control first, then the fault runs in the suite's order
    (a run's index stays its place in that order). Every fault run is measured against its framework's control,
    a control that cannot run shows a broken framework or environment in the suite's first minutes, and the
    progress's ETA knows each framework's cost from the start (a framework several times slower than the others,
    run last, would otherwise be guessed at their level until then).

    ``request_stop`` (from a signal handler) ends the current run promptly, with teardown and reverts,
    and skips the rest; finished runs and their results are kept.
    """

    def __init__(
        self,
        suite: Suite,
        out_dir: str | Path,
        progress: Progress | Callable[[str], None] | None = None,
        stopping: StoppingRule | None = None,
    ) -> None:
        """``stopping``: when a scenario repeated until decided stops (:mod:`chaosbench.analysis.sequential`;
        default: without a baseline, on its SLOs alone)."""
        self.suite = suite
        self.stopping = stopping or StoppingRule(None)
        #: Scenario id -> why it stopped, for each scenario repeated until decided that has.
        self.settlements: dict[str, Settlement] = {}
        self.out_dir = Path(out_dir).resolve()
        self.suite_dir = self.out_dir / suite.name
        self.progress: Progress = (
            progress if progress is not None and not callable(progress) else _Lines(progress)
        )
        self.stop_requested = threading.Event()
        self._controls: set[RunControl] = set()  # the live runs' (several with --jobs)
        self._lock = (
            threading.RLock()
        )  # _controls (reentrant: the signal handler takes it in the main thread)
        self._finish_lock = threading.Lock()  # records, and one run's metrics at a time
        self.records: list[RunRecord] = []
        #: Set when a run's cleanup failed and left, or may have left, something running that the next run
        #: could collide with: no run starts after it (see :meth:`run_one`).
        self.halted: SuiteHalt | None = None

    def request_stop(self) -> None:
        self.stop_requested.set()
        with self._lock:
            for control in self._controls:
                control.interrupted.set()

    # ------------------------------------------------------------------ planning
    def plans(self) -> list[tuple[Scenario, LaunchPlan | str]]:
        """The launch plan of every scenario, without starting anything (``--dry-run``); where what the plan
        needs is missing on this machine (:class:`MissingEngine`, warned about by :func:`missing_engines`), the
        reason instead."""
        import tempfile

        out: list[tuple[Scenario, LaunchPlan | str]] = []
        with tempfile.TemporaryDirectory(prefix="chaosbench-dry-") as tmp:
            writer = harness_writer(Path(tmp) / "events.jsonl")
            for sc in self.suite.iter_scenarios():
                run_dir = self._run_dir(sc)
                runtime = _runtime(sc, RunInfo(f"dry-{sc.dirname}-{sc.repeat}", Path(tmp), writer))
                job = self._job(sc, run_dir, runtime, "dry-run")
                try:
                    out.append((sc, _framework(sc).plan(job)))
                except MissingEngine as exc:
                    out.append((sc, str(exc)))
                except Unsupported as exc:
                    # What no run of this framework can do is the suite's problem, found before any run starts.
                    raise SpecError(
                        f"{self.suite.framework_where(sc.framework_label)}: framework "
                        f"'{sc.framework_label}': {exc}"
                    ) from None
            writer.close()
        return out

    def outlook(self) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
        """Detection outlook of every distinct framework x fault schedule (first repeat), and each framework's
        timeout problems, from the timeouts its adapter would put in force; starts nothing."""
        import tempfile

        recs: list[dict[str, Any]] = []
        problems: dict[str, list[str]] = {}
        with tempfile.TemporaryDirectory(prefix="chaosbench-outlook-") as tmp:
            writer = harness_writer(Path(tmp) / "events.jsonl")
            for fw, names, _ in self.suite.cells():  # first repeats only: a huge matrix is not built
                sc = self.suite.scenario(fw, names, 0)
                if sc.control and sc.framework_label in problems:
                    continue
                runtime = _runtime(sc, RunInfo(f"outlook-{sc.dirname}", Path(tmp), writer))
                framework = _framework(sc)
                timeouts = framework.timeouts(self._job(sc, self._run_dir(sc), runtime, "outlook"))
                if sc.framework_label not in problems:
                    problems[sc.framework_label] = framework.timeout_problems(timeouts) + arithmetic_problems(
                        sc, _workload(sc).options, timeouts
                    )
                recs += detection_outlook(sc, framework, timeouts)
            writer.close()
        return recs, problems

    def _run_dir(self, sc: Scenario) -> Path:
        return RunDir.of(self.suite_dir, sc).path

    def _job(self, sc: Scenario, run_dir: Path, runtime: Runtime, run_id: str) -> JobContext:
        rd = RunDir(run_dir)
        return JobContext(
            scenario=sc,
            run_id=run_id,
            run_dir=run_dir,
            ckpt_dir=rd.checkpoints,
            events_path=rd.events,
            workload=_workload(sc),
            runtime=runtime,
        )

    # ------------------------------------------------------------------ running
    def prepare(self, resume: bool = False) -> None:
        """Fresh suite directory: earlier results of this suite (and only of a chaosbench suite) go. With
        ``resume`` an earlier one of the same suite definition is kept (after cleaning up what a crashed harness
        left); a different definition is refused."""
        marker = self.suite_dir / SUITE_MARKER
        if self.suite_dir.exists() and not marker.exists():
            raise ChaosbenchError(
                f"{self.suite_dir} exists and is not a chaosbench results directory; choose another --out"
            )
        definition = self.suite.model_dump(mode="json")
        from chaosbench.cleanup import cleanup

        if resume and marker.exists():
            earlier = SuiteDir(self.suite_dir).definition()
            if earlier != definition:
                changed = sorted(
                    k
                    for k in set(earlier or {}) | set(definition)
                    if (earlier or {}).get(k) != definition.get(k)
                )
                raise ChaosbenchError(
                    f"{self.suite_dir}: cannot resume: suite '{self.suite.name}' has changed since those runs "
                    f"(in {', '.join(changed) or 'its definition'}); run without --resume to start over"
                )
            for line in cleanup(
                self.suite_dir
            ):  # what the killed harness left: processes, mounts, containers
                self.progress.message(f"cleanup: {line}")
            for tmp in self.suite_dir.glob(".*.tmp"):  # a table or report it was writing when killed
                tmp.unlink(missing_ok=True)
            return
        if self.suite_dir.exists():
            cleanup(
                self.suite_dir
            )  # a crashed earlier run may have left processes or a live FUSE mount there
            shutil.rmtree(self.suite_dir)
        self.suite_dir.mkdir(parents=True)
        write_atomic(
            marker,
            json.dumps(
                {"suite": self.suite.name, "source": self.suite.source, "definition": definition}, indent=2
            ),
        )

    def finish(self, rec: RunRecord, elapsed_s: float | None = None) -> RunMetrics:
        """A run has ended: its metrics, computed once (against its framework's control, which runs first), go
        into ``metrics.json``, its timeline plot is drawn, its checkpoints kept or not (``keep_checkpoints``),
        and last its ``result.json``: from then on the run counts as finished (``--resume`` skips it).
        ``chaosbench report`` recomputes the metrics from the timelines."""
        from chaosbench.analysis.results import run_metrics

        control = self._control_of(rec.scenario)
        rd = RunDir(rec.run_dir)
        rec.metrics = run_metrics(rd, RunDir(control) if control is not None else None)
        kept = self._checkpoints(rd, rec.metrics)
        from chaosbench.report.plots import draw_run_timeline

        plot = draw_run_timeline(rd.path, rec.metrics)  # once, here: the report links it
        result = {
            "status": rec.result.status,
            "reason": rec.result.reason,
            "leftover_pids": rec.leftovers,
            "outcome": rec.metrics.outcome,
            "elapsed_s": elapsed_s,
            "checkpoints_kept": kept,
            "timeline_plot": plot.reason or "timeline.png",
            "cleanup_failures": [dataclasses.asdict(f) for f in rec.cleanup_failures],
        }
        write_atomic(rd.result, json.dumps(result, indent=2, default=str))
        self.records.append(rec)
        return rec.metrics

    def _control_of(self, sc: Scenario) -> Path | None:
        return next(
            (
                r.run_dir
                for r in self.records
                if r.scenario.control and r.scenario.framework_label == sc.framework_label
            ),
            None,
        )

    def _checkpoints(self, rd: RunDir, m: RunMetrics) -> bool:
        """Record the run's checkpoint files (names, sizes) in ``checkpoints.json``, then delete them unless the
        suite keeps them (``keep_checkpoints``: all; failed: runs that did not recover or diverged). Whether
        they were kept."""
        files = sorted(p for d in rd.checkpoint_dirs() for p in d.rglob("*") if p.is_file())
        listing = [{"path": str(p.relative_to(rd.path)), "bytes": p.stat().st_size} for p in files]
        policy = self.suite.keep_checkpoints
        failed = m.outcome not in ("completed", "recovered", "outlasted") or m.fidelity == "diverged"
        keep = policy == "all" or (policy == "failed" and failed)
        write_atomic(
            rd.checkpoint_list,
            json.dumps(
                {
                    "policy": policy,
                    "kept": keep,
                    "files": len(listing),
                    "bytes": sum(f["bytes"] for f in listing),
                    "checkpoints": listing,
                },
                indent=2,
            ),
        )
        if not keep:
            for d in rd.checkpoint_dirs():
                shutil.rmtree(d, ignore_errors=True)
        return keep

    def _finished(self, sc: Scenario) -> RunRecord | None:
        """The record of a run an earlier harness finished (``result.json``), or None: run it (again)."""
        rd = RunDir.of(self.suite_dir, sc)
        res = rd.read_result()
        if res is None or res["status"] == "interrupted":
            return None
        rec = RunRecord(
            sc,
            rd.path,
            JobResult(res["status"], res.get("reason") or ""),
            leftovers=list(res.get("leftover_pids") or []),
        )
        try:
            rec.metrics = RunMetrics.from_dict(json.loads(rd.metrics.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return rec

    def slots(self, jobs: int, timings_may_interfere: bool = False) -> list[dict[str, Any]]:
        """Runtime options of each of ``jobs`` concurrent slots (:meth:`Runtime.concurrent_slots`); raises
        :class:`~chaosbench.errors.Unsupported` when the runtime cannot keep concurrent runs apart, unless
        ``timings_may_interfere`` and it only shares CPUs (the local runtime)."""
        cls = RUNTIMES.get(self.suite.defaults.runtime)
        nodes = max(self.suite.workload_for(fw).nodes for fw in self.suite.matrix.all_frameworks())
        try:
            return list(cls.concurrent_slots(dict(self.suite.defaults.runtime_options), jobs, nodes))
        except Unsupported:
            if timings_may_interfere and cls.ranks_on_harness_host:
                return [{} for _ in range(jobs)]
            raise

    def run(
        self, resume: bool = False, jobs: int = 1, timings_may_interfere: bool = False
    ) -> list[RunRecord]:
        """Every run of the suite, in order; with ``resume`` the runs an earlier harness finished are kept (same
        seeds and plans) and the others run, an unfinished one from scratch. ``jobs`` > 1: that many runs at once,
        each in a slot of its own (:meth:`slots`; the controls first, then the rest). Ends by writing the
        suite's table."""
        slots = (
            self.slots(jobs, timings_may_interfere) if jobs > 1 else None
        )  # refused before anything is touched
        # A thread woken by a process's exit or output stamps it once it holds the GIL: with the default 5 ms
        # switch interval a busy thread delays it by up to that (p99 of the stamp error 20-28 ms on a loaded
        # 2-core machine, 8 ms with 1 ms: benchmarks/detect_calibration.py).
        switch_s = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_s, SWITCH_INTERVAL_S))
        try:
            return self._run(resume, slots)
        finally:
            sys.setswitchinterval(switch_s)

    def _run(self, resume: bool, slots: list[dict[str, Any]] | None) -> list[RunRecord]:
        from chaosbench.analysis.results import write_table

        self.prepare(resume)
        total = self.suite.run_count()
        cells = self._cells()
        if slots is None:
            left = [total]  # runs not started yet (the indices no longer say it: the controls run first)
            for cell in sorted(
                cells, key=lambda c: bool(c.faults)
            ):  # stable: the controls, then the fault cells
                if not self._run_cell(cell, resume, left):
                    break
        else:
            self._run_cells_concurrently(cells, resume, slots)
        self.records.sort(key=lambda r: r.index)
        self._write_settlements()
        metrics = [r.metrics for r in self.records if r.metrics is not None]
        if metrics:
            write_table(self.suite_dir, metrics)
        return self.records

    def _cells(self) -> list[_Cell]:
        """Every cell of the suite in run order, with the 1-based index of its first run (a cell repeated until
        decided takes the places of its ``max`` runs: the indices stay those of the suite's order)."""
        designs = self.suite.until_decided()
        out, first = [], 1
        for fw, names, bound in self.suite.cells():
            sc = self.suite.scenario(fw, names, 0)
            out.append(_Cell(fw, names, bound, first, designs.get(sc.id), bool(sc.slos) and not sc.control))
            first += bound
        return out

    def _take(self, cell: _Cell, rep: int, resume: bool) -> tuple[int, Scenario] | None:
        """Repeat ``rep`` of ``cell``: None when an earlier harness finished it (``resume``: its record kept),
        else its index and scenario, to run."""
        sc = self.suite.scenario(cell.framework, cell.faults, rep)
        i = cell.first_index + rep
        if resume and (done := self._finished(sc)) is not None:
            done.index = i
            self.records.append(done)
            self.progress.skipped(
                f"{sc.id} #{sc.repeat}", f"finished earlier ({done.metrics.outcome if done.metrics else '?'})"
            )
            return None
        return i, sc

    def _settled(self, cell: _Cell) -> bool:
        """Whether a cell repeated until decided stops now (decided, or ``max`` reached); says so once when it
        does. Always False for a cell of fixed repeats."""
        if cell.design is None or cell.id in self.settlements:
            return cell.id in self.settlements
        rows = [
            r.metrics.to_dict() for r in self.records if r.scenario.id == cell.id and r.metrics is not None
        ]
        done = sum(1 for r in self.records if r.scenario.id == cell.id)
        if done < cell.design.min_repeats:
            return False
        settlement = self.stopping.settle(cell.id, cell.design, rows, cell.has_slos)
        if settlement.stops or done >= cell.design.max:
            self.settlements[cell.id] = settlement
            self.progress.message(f"repeats: {settlement.describe()}")
            return True
        return False

    def _run_cell(self, cell: _Cell, resume: bool, left: list[int]) -> bool:
        """Every repeat of ``cell`` in turn (until decided, for such a cell); False when a stop was requested.
        ``left[0]``: the suite's runs not started yet, counted down."""
        for rep in range(cell.bound):
            if self._settled(cell):
                left[0] -= cell.bound - rep  # the repeats it no longer needs
                return True
            if (todo := self._take(cell, rep, resume)) is None:
                left[0] -= 1
                continue
            i, sc = todo
            if self.stop_requested.is_set():
                self.progress.message(f"stopped: at most {left[0]} runs not started")
                return False
            if self.halted is not None:
                self.progress.message(f"{self.halted.describe()}; at most {left[0]} runs not started")
                return False
            left[0] -= 1
            self._run_in_slot(i, sc, {}, follow=True)
        self._settled(cell)
        return True

    def _run_cells_concurrently(self, cells: list[_Cell], resume: bool, slots: list[dict[str, Any]]) -> None:
        """With ``--jobs``: every run of the fixed cells and the first ``min`` repeats of the cells repeated until
        decided at once (controls first), then rounds of one more repeat of each cell not yet decided."""
        pending = []
        for cell in cells:
            first = cell.bound if cell.design is None else cell.design.min_repeats
            pending += [t for rep in range(first) if (t := self._take(cell, rep, resume)) is not None]
        next_rep = {c.id: c.design.min_repeats for c in cells if c.design is not None}
        while True:
            if pending:
                self._run_concurrently(pending, slots)
            if self.stop_requested.is_set() or self.halted is not None:
                return
            pending = []
            for cell in cells:
                while cell.id in next_rep and not self._settled(cell) and next_rep[cell.id] < cell.bound:
                    rep = next_rep[cell.id]
                    next_rep[cell.id] += 1
                    if (todo := self._take(cell, rep, resume)) is not None:
                        pending.append(todo)
                        break
            if not pending:
                break
        for cell in cells:
            self._settled(cell)

    def _write_settlements(self) -> None:
        """``repeats.json`` in the suite directory: per scenario repeated until decided, how many repeats ran,
        its looks and why it stopped (the gate multiplies its p-values by its looks)."""
        if self.settlements:
            write_atomic(
                self.suite_dir / REPEATS_FILE,
                json.dumps({key: s.to_dict() for key, s in self.settlements.items()}, indent=2),
            )

    def _run_in_slot(self, index: int, sc: Scenario, slot: dict[str, Any], follow: bool) -> None:
        label = f"{sc.id} #{sc.repeat}"
        if slot:
            sc = dataclasses.replace(sc, runtime_options={**sc.runtime_options, **slot})
        self.progress.run_started(index, label, sc.deadline_s, sc.control)
        t = time.monotonic()
        rec = self.run_one(sc, follow=follow)
        rec.index = index
        with self._finish_lock:
            self.finish(rec, time.monotonic() - t)
        self.progress.run_finished(label, summarize(rec), time.monotonic() - t)

    def _run_concurrently(self, pending: list[tuple[int, Scenario]], slots: list[dict[str, Any]]) -> None:
        """``pending`` runs, as many at once as there are ``slots``, each run in a free slot; the controls first
        (every fault run is measured against its framework's)."""
        from concurrent.futures import ThreadPoolExecutor

        free: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        for slot in slots:
            free.put(slot)
        self.progress.concurrency = len(slots)

        def one(index: int, sc: Scenario) -> None:
            if self.stop_requested.is_set() or self.halted is not None:
                return
            slot = free.get()
            try:
                if not self.stop_requested.is_set() and self.halted is None:
                    self._run_in_slot(index, sc, slot, follow=False)  # several runs' phases would mix
            finally:
                free.put(slot)

        for batch in ([p for p in pending if p[1].control], [p for p in pending if not p[1].control]):
            with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="run") as pool:
                for future in [pool.submit(one, i, sc) for i, sc in batch]:
                    future.result()
        started = {r.index for r in self.records}
        if self.stop_requested.is_set() and (left := [i for i, _ in pending if i not in started]):
            self.progress.message(f"stopped: {len(left)} runs not started")
        elif self.halted is not None and (left := [i for i, _ in pending if i not in started]):
            self.progress.message(f"{self.halted.describe()}; {len(left)} runs not started")

    def run_one(self, sc: Scenario, follow: bool = True) -> RunRecord:
        """One run, from its fresh directory to its teardown (``follow``: its events go to the progress).

        Teardown: each cleanup is registered on a :class:`_Teardown` as soon as what it undoes exists, and they
        run last-first when the run ends, every one even when one before it failed: the fault controllers
        closed (their firings reverted), the runtime's cleanup (every process and container of the run), the
        checkpoint watcher stopped, the injectors' cleanups (mounts, cgroups, rules), the final artifact
        digested, ``run_end`` written, the follower stopped, the timeline closed. A cleanup that fails makes
        this run an ``error`` whose reason names it (``cleanup failed: runtime cleanup: RuntimeError: ...``:
        in its ``run_end``, its result and :attr:`RunRecord.cleanup_failures`), and the suite goes on, unless
        the runtime then still lists processes or objects of the run, or cannot list them: the next run could
        collide with them (ports, containers, GPUs, nodes), so the suite stops after this one
        (:attr:`halted`)."""
        run_dir = self._run_dir(sc)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        run_id = f"{self.suite.name}-{sc.dirname}-{sc.repeat}-{uuid.uuid4().hex[:8]}"
        cpu_start_s = time.process_time()  # the harness's own CPU (every thread; not its children, the ranks)
        result = JobResult("error", "not started")
        left: list[str] = []  # what the runtime lists as still there after the cleanups
        pids: list[int] = []
        with _Teardown() as teardown:
            timeline = harness_writer(RunDir(run_dir).events)  # every event validated with its kind's model
            teardown.cleanup("timeline close", timeline.close)
            follower = TimelineFollower(RunDir(run_dir).events)
            if follow:
                follower.subscribe(self.progress.on_event)
            follower.start()
            teardown.cleanup("timeline follower", follower.stop)
            runtime = _runtime(sc, RunInfo(run_id, run_dir, timeline))
            runtime.line_observers.append(RankErrorWatcher(timeline))
            runtime.line_observers.append(ProcErrorWatcher(timeline))

            def run_end() -> None:
                nonlocal pids
                try:
                    pids, objects = runtime.leftovers(), runtime.leftover_objects()
                    left.extend([f"pid {p}" for p in pids] + objects)
                except Exception as exc:  # noqa: BLE001 - recorded; what may be left is then unknown
                    teardown.failures.append(CleanupFailure("leftover check", _one_line(exc)))
                    objects = []
                    left.append(f"whatever the runtime could not list ({_one_line(exc)})")
                end = _with_cleanup_failures(result, teardown.failures)
                timeline.emit(
                    "run_end",
                    outcome=end.status,
                    reason=end.reason,
                    leftover_pids=pids,
                    leftover_objects=objects,
                    concurrent_runs=len(self._controls) + 1,
                    harness_cpu_s=round(time.process_time() - cpu_start_s, 4),
                )

            teardown.callback(run_end)  # after every cleanup: it lists what they left and says if one failed
            # The scenario first, the plan once there is one: a run that fails before it is planned (an engine or a
            # package missing for its fault) still has a config, so it is recorded with its reason and the suite
            # goes on (its metrics read the config).
            write_atomic(
                RunDir(run_dir).config,
                json.dumps(
                    {"run_id": run_id, "scenario": sc.to_dict(), "plan": None, "total_steps": None},
                    indent=2,
                    default=str,
                ),
            )
            try:
                result = self._start_and_supervise(sc, run_id, run_dir, runtime, timeline, follower, teardown)
            except ChaosbenchError as exc:
                result = JobResult("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - a harness bug must still tear the run down
                result = JobResult("error", f"{type(exc).__name__}: {exc}")
            finally:
                # From here on every process exit, log line and reaction is caused by the harness, not by the
                # fault: the metrics credit nothing after this event to the framework (chaosbench.analysis.metrics).
                timeline.emit("teardown_begin", reason=_teardown_reason(result))
        # every failure, also of the steps after run_end (the follower's stop, the timeline's close)
        result = _with_cleanup_failures(result, teardown.failures)
        rec = RunRecord(sc, run_dir, result, leftovers=pids, cleanup_failures=list(teardown.failures))
        if teardown.failures and left:
            halt = SuiteHalt(f"{sc.id} #{sc.repeat}", run_dir, list(teardown.failures), left)
            with self._lock:
                self.halted = self.halted or halt
        return rec

    def _start_and_supervise(
        self,
        sc: Scenario,
        run_id: str,
        run_dir: Path,
        runtime: Runtime,
        timeline: TimelineWriter,
        follower: TimelineFollower,
        teardown: _Teardown,
    ) -> JobResult:
        """The run from its faults' prepare to the end of its supervision, each cleanup registered on
        ``teardown`` as what it undoes comes to exist (see :meth:`run_one`). Raises what the steps raise."""
        job = self._job(sc, run_dir, runtime, run_id)
        teardown.cleanup("final artifact digest", _digest_final_artifact, job, timeline)
        framework = _framework(sc)
        # what the dry-run warned about (missing_engines): the run fails with the same words before it starts
        # anything, whatever step would otherwise have stumbled on it (a launcher's import, a container's start)
        missing = type(runtime).missing_engine() or type(framework).missing_engine(
            framework.options, type(runtime)
        )
        if missing is not None:
            raise MissingEngine(missing)
        controllers: list[FaultController] = []
        for i, (fault_name, fault) in enumerate(sc.faults):
            injector = _injector(fault_name, fault)
            setup = RunSetup(
                run_id=run_id,
                run_dir=run_dir,
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
        runtime.resolve()  # what the plan needs from the cluster, looked up now: planning itself runs nothing
        plan = framework.plan(job)
        write_atomic(
            RunDir(run_dir).config,
            json.dumps(
                {
                    "run_id": run_id,
                    "scenario": sc.to_dict(),
                    "plan": plan.to_dict(),
                    "total_steps": job.workload.total_steps,
                },
                indent=2,
                default=str,
            ),
        )
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
            run_id=run_id,
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
        # The watcher before the nodes: it stops after the runtime's cleanup, once the last writes are in.
        watcher = _checkpoint_watcher(job, timeline, follower)
        if watcher is not None:
            teardown.cleanup("checkpoint watcher", watcher.stop)
        teardown.cleanup(
            "framework cleanup", framework.cleanup, job
        )  # after the runtime's: its processes gone
        teardown.cleanup("runtime cleanup", runtime.cleanup)
        runtime.provision(sc.workload.nodes)  # container nodes: now, after the faults' prepare, all at once
        for controller in controllers:
            follower.subscribe(controller)
            teardown.cleanup(
                f"fault '{controller.fault_name}' controller", controller.close
            )  # before the runtime's
        control = RunControl(runtime, timeline, follower, time.monotonic() + sc.deadline_s)
        with self._lock:
            self._controls.add(control)
        teardown.cleanup("run control", self._release, control)
        if self.stop_requested.is_set():
            control.interrupted.set()
        return framework.supervise(job, plan, control)

    def _release(self, control: RunControl) -> None:
        with self._lock:
            self._controls.discard(control)


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


@dataclass(frozen=True)
class CleanupFailure:
    """A cleanup of a run that raised: ``step`` names it (``runtime cleanup``, ``fault 'kill' cleanup``,
    ``fault 'kill' controller``, ``checkpoint watcher``, ``leftover check``, ...), ``error`` is the one line it
    raised (``RuntimeError: the engine went away``)."""

    step: str
    error: str

    def describe(self) -> str:
        return f"{self.step}: {self.error}"


@dataclass(frozen=True)
class SuiteHalt:
    """Why a suite stopped before its end (:attr:`Runner.halted`): run ``label`` (in ``run_dir``) failed the
    cleanups ``failures``, and after them ``left`` may still be running (pids, containers, networks, jobs, or
    whatever the runtime could not list), which the next run could collide with. Finished runs are kept."""

    label: str
    run_dir: Path
    failures: list[CleanupFailure]
    left: list[str]

    def describe(self) -> str:
        """One line: what failed, what may be left, what to do."""
        return (
            f"suite stopped after run {self.label}: its cleanup failed "
            f"({'; '.join(f.describe() for f in self.failures)}) and may have left {', '.join(self.left)} "
            f"running; finished runs are kept (chaosbench cleanup {self.run_dir.parent.parent}, then "
            "--resume, runs the rest)"
        )


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


def _fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.2f} {unit}" if unit else f"{v:.3g}"
    return f"{v}"


def summarize(rec: RunRecord) -> str:
    m = rec.metrics
    if m is None:
        return f"{rec.result.status}: {rec.result.reason}"
    parts = [m.outcome or rec.result.status]
    if m.serving:
        parts.append(f"{_fmt(m.failed_requests)}/{_fmt(m.requests)} requests failed")
        if not m.control:
            parts += [
                f"detect {_fmt(m.time_to_detect_s)}",
                f"recover {_fmt(m.time_to_recover_s)}",
                f"budget burn {_fmt(m.error_budget_burn, '')}",
            ]
    elif not m.control:
        parts += [
            f"detect {_fmt(m.time_to_detect_s)}",
            f"resume {_fmt(m.time_to_resume_s)}",
            f"lost {_fmt(m.lost_steps)} steps",
        ]
        if m.fidelity:
            parts.append(f"fidelity {m.fidelity}")
    if rec.result.status == "error":
        parts.append(f"error: {rec.result.reason}")
    return "  ".join(parts)
