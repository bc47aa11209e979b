"""Runs a suite: every scenario in its own run directory (layout: :mod:`chaosbench.rundir`), one timeline each,
guaranteed teardown. Each run's metrics are computed when it ends and the results table is rewritten, so a
harness that dies keeps every finished run.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.errors import ChaosbenchError
from chaosbench.fault_control import FaultController
from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    RankErrorWatcher,
    RunControl,
)
from chaosbench.injectors.base import Injector, RunSetup
from chaosbench.registry import FRAMEWORKS, INJECTORS, RUNTIMES, WORKLOADS
from chaosbench.rundir import RunDir, SuiteDir
from chaosbench.runtimes.base import RunInfo, Runtime
from chaosbench.specs import FaultSpec, Scenario, Suite
from chaosbench.timeline import TimelineFollower, TimelineWriter
from chaosbench.workloads.base import Workload

SUITE_MARKER = SuiteDir.MARKER


def _workload(scenario: Scenario) -> Workload:
    cls = WORKLOADS.get(scenario.workload.name)
    return cls(scenario.workload, cls.Options.model_validate(scenario.workload.options))  # type: ignore[no-any-return]


def _runtime(scenario: Scenario, info: RunInfo) -> Runtime:
    cls = RUNTIMES.get(scenario.runtime)
    options = cls.Options.model_validate(scenario.runtime_options) if scenario.runtime_options else None
    return cls(info, options)  # type: ignore[no-any-return]


def _framework(scenario: Scenario) -> Framework:
    cls = FRAMEWORKS.get(scenario.adapter)
    return cls(scenario.framework_label, cls.Options.model_validate(scenario.framework_options))  # type: ignore[no-any-return]


def _injector(name: str, fault: FaultSpec) -> Injector:
    cls = INJECTORS.get(fault.injector)
    return cls(name, cls.Params.model_validate(fault.params))  # type: ignore[no-any-return]


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
        rec: dict[str, Any] = {"fault": name, "injector": fault.injector, "mode": mode, "framework": sc.framework_label}
        if pred is None:
            what = f"a {mode or fault.injector} fault" if modelled else f"a {mode} of the {fault.target.role}"
            rec.update(expected_s=None, decided_by="", resume_floor_s=None, modelled=False,
                       note=f"no detection model for {what} under {sc.adapter}")  # fmt: skip
            rec["problems"] = []
            out.append(rec)
            continue
        duration = injector.duration_s
        if duration is not None and pred.expected_s is not None and pred.resume_floor_s is not None:
            # A fixed wait on a stopped process (torchrun's SIGTERM grace) ends once the fault ends and it can act.
            pred.resume_floor_s = max(pred.expected_s, min(pred.resume_floor_s, duration))
        rec.update(pred.to_dict())
        problems = []
        if pred.expected_s is not None and pred.expected_s >= sc.deadline_s:
            problems.append(f"{sc.framework_label} cannot detect {name} before the run's deadline ({sc.deadline_s:g} s): "
                            f"expected {pred.expected_s:g} s after the fault ({pred.decided_by})")  # fmt: skip
        elif pred.resume_floor_s is not None and pred.resume_floor_s >= sc.deadline_s:
            problems.append(f"{sc.framework_label} cannot resume from {name} before the run's deadline "
                            f"({sc.deadline_s:g} s): not before {pred.resume_floor_s:g} s after the fault")  # fmt: skip
        if duration is not None and pred.expected_s is not None and duration < pred.expected_s:
            problems.append(f"{name} ends after {duration:g} s, before {sc.framework_label} can detect it "
                            f"({pred.expected_s:g} s): expect an undetected recovery in place")  # fmt: skip
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


@dataclass
class RunRecord:
    scenario: Scenario
    run_dir: Path
    result: JobResult
    metrics: RunMetrics | None = None
    leftovers: list[int] = field(default_factory=list)


class Runner:
    """Runs the scenarios of a suite in order (controls first, per framework).

    ``request_stop`` (from a signal handler) ends the current run promptly, with teardown and reverts,
    and skips the rest; finished runs and their results are kept.
    """

    def __init__(
        self,
        suite: Suite,
        out_dir: str | Path,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.suite = suite
        self.out_dir = Path(out_dir).resolve()
        self.suite_dir = self.out_dir / suite.name
        self.progress = progress or (lambda s: None)
        self.stop_requested = threading.Event()
        self._control: RunControl | None = None
        self.records: list[RunRecord] = []

    def request_stop(self) -> None:
        self.stop_requested.set()
        if self._control is not None:
            self._control.interrupted.set()

    # ------------------------------------------------------------------ planning
    def plans(self) -> list[tuple[Scenario, LaunchPlan]]:
        """The launch plan of every scenario, without starting anything (``--dry-run``)."""
        import tempfile

        out = []
        with tempfile.TemporaryDirectory(prefix="chaosbench-dry-") as tmp:
            writer = TimelineWriter(Path(tmp) / "events.jsonl")
            for sc in self.suite.scenarios():
                run_dir = self._run_dir(sc)
                runtime = _runtime(sc, RunInfo(f"dry-{sc.dirname}-{sc.repeat}", Path(tmp), writer))
                job = self._job(sc, run_dir, runtime, "dry-run")
                out.append((sc, _framework(sc).plan(job)))
            writer.close()
        return out

    def outlook(self) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
        """Detection outlook of every distinct framework x fault schedule (first repeat), and each framework's
        timeout problems, from the timeouts its adapter would put in force; starts nothing."""
        import tempfile

        recs: list[dict[str, Any]] = []
        problems: dict[str, list[str]] = {}
        with tempfile.TemporaryDirectory(prefix="chaosbench-outlook-") as tmp:
            writer = TimelineWriter(Path(tmp) / "events.jsonl")
            for sc in self.suite.scenarios():
                if sc.repeat or (sc.control and sc.framework_label in problems):
                    continue
                runtime = _runtime(sc, RunInfo(f"outlook-{sc.dirname}", Path(tmp), writer))
                framework = _framework(sc)
                timeouts = framework.timeouts(self._job(sc, self._run_dir(sc), runtime, "outlook"))
                problems.setdefault(sc.framework_label, framework.timeout_problems(timeouts))
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
    def prepare(self) -> None:
        """Fresh suite directory: earlier results of this suite (and only of a chaosbench suite) go."""
        if self.suite_dir.exists():
            if not (self.suite_dir / SUITE_MARKER).exists():
                raise ChaosbenchError(
                    f"{self.suite_dir} exists and is not a chaosbench results directory; choose another --out"
                )
            from chaosbench.cleanup import cleanup

            cleanup(self.suite_dir)  # a crashed earlier run may have left processes or a live FUSE mount there
            shutil.rmtree(self.suite_dir)
        self.suite_dir.mkdir(parents=True)
        (self.suite_dir / SUITE_MARKER).write_text(
            json.dumps({"suite": self.suite.name, "source": self.suite.source,
                        "definition": self.suite.model_dump(mode="json")}, indent=2)
        )  # fmt: skip

    def finish(self, rec: RunRecord) -> RunMetrics:
        """A run has ended: its metrics, computed once (against its framework's control, which runs first), go
        into ``metrics.json`` and the suite's table is rewritten with every finished run so far (a harness that
        dies keeps them). ``chaosbench report`` recomputes them all from the timelines."""
        from chaosbench.analysis.results import run_metrics, write_table

        control = next((r.run_dir for r in self.records if r.scenario.control
                        and r.scenario.framework_label == rec.scenario.framework_label), None)  # fmt: skip
        rec.metrics = run_metrics(RunDir(rec.run_dir), RunDir(control) if control is not None else None)
        self.records.append(rec)
        write_table(self.suite_dir, [r.metrics for r in self.records if r.metrics is not None])
        return rec.metrics

    def run(self) -> list[RunRecord]:
        self.prepare()
        scenarios = self.suite.scenarios()
        for i, sc in enumerate(scenarios, 1):
            if self.stop_requested.is_set():
                self.progress(f"stopped: {len(scenarios) - i + 1} runs not started")
                break
            label = f"[{i:>{len(str(len(scenarios)))}}/{len(scenarios)}] {sc.id} #{sc.repeat}"
            self.progress(f"{label} ...")
            t = time.monotonic()
            rec = self.run_one(sc)
            self.finish(rec)
            self.progress(f"{label} {summarize(rec)} ({time.monotonic() - t:.1f} s)")
        return self.records

    def run_one(self, sc: Scenario) -> RunRecord:
        run_dir = self._run_dir(sc)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        run_id = f"{self.suite.name}-{sc.dirname}-{sc.repeat}-{uuid.uuid4().hex[:8]}"
        timeline = TimelineWriter(RunDir(run_dir).events)
        follower = TimelineFollower(RunDir(run_dir).events).start()
        runtime = _runtime(sc, RunInfo(run_id, run_dir, timeline))
        runtime.line_observers.append(RankErrorWatcher(timeline))
        controllers: list[FaultController] = []
        injectors: list[Injector] = []
        result = JobResult("error", "not started")
        leftovers: list[int] = []
        try:
            job = self._job(sc, run_dir, runtime, run_id)
            framework = _framework(sc)
            for i, (fault_name, fault) in enumerate(sc.faults):
                injector = _injector(fault_name, fault)
                setup = RunSetup(
                    run_id=run_id, run_dir=run_dir, ckpt_dir=job.ckpt_dir, runtime=runtime, timeline=timeline,
                    rng=random.Random(sc.rng_seed + i), ranks=sc.workload.ranks, nodes=sc.workload.nodes,
                    target=fault.target, roles=dict(framework.roles),
                )  # fmt: skip
                injectors.append(injector)
                injector.prepare(setup)
                job.extra_env.update(setup.env)
                if fault.trigger is not None:
                    controllers.append(FaultController(fault_name, fault, injector, setup, sc.rng_seed + i))
            runtime.resolve()  # what the plan needs from the cluster, looked up now: planning itself runs nothing
            plan = framework.plan(job)
            RunDir(run_dir).config.write_text(
                json.dumps({"run_id": run_id, "scenario": sc.to_dict(), "plan": plan.to_dict(),
                            "total_steps": job.workload.total_steps}, indent=2, default=str)
            )  # fmt: skip
            timeline.emit(
                "run_start", suite=sc.suite, scenario=sc.id, framework=sc.framework_label, adapter=sc.adapter,
                fault=sc.fault_name, repeat=sc.repeat, control=sc.control, seed=sc.seed, run_id=run_id,
                runtime=sc.runtime, ranks=sc.workload.ranks, nodes=sc.workload.nodes,
            )  # fmt: skip
            timeline.emit(
                "framework_info", framework=sc.framework_label, versions=plan.versions, timeouts=plan.timeouts,
                options=plan.options, timeout_problems=framework.timeout_problems(plan.timeouts),
            )  # fmt: skip
            for rec in detection_outlook(sc, framework, plan.timeouts):
                timeline.emit("detection_prediction", **rec)
            runtime.provision(sc.workload.nodes)  # container nodes: now, after the faults' prepare, all at once
            for controller in controllers:
                follower.subscribe(controller)
            control = RunControl(runtime, timeline, follower, time.monotonic() + sc.deadline_s)
            self._control = control
            if self.stop_requested.is_set():
                control.interrupted.set()
            result = framework.supervise(job, plan, control)
        except ChaosbenchError as exc:
            result = JobResult("error", str(exc))
        except Exception as exc:  # noqa: BLE001 - a harness bug must still tear the run down
            result = JobResult("error", f"{type(exc).__name__}: {exc}")
        finally:
            self._control = None
            # From here on every process exit, log line and reaction is caused by the harness, not by the fault:
            # the metrics credit nothing after this event to the framework (see chaosbench.analysis.metrics).
            timeline.emit("teardown_begin", reason=_teardown_reason(result))
            for controller in controllers:
                controller.close()
            runtime.cleanup()
            for injector in injectors:
                try:
                    injector.cleanup()
                except Exception as exc:  # noqa: BLE001 - recorded; the harness goes on
                    timeline.emit("fault_revert", src="injector", fault=injector.fault_name, reason="cleanup",
                                  error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            leftovers = runtime.leftovers()
            objects = runtime.leftover_objects()
            timeline.emit("run_end", outcome=result.status, reason=result.reason, leftover_pids=leftovers,
                          leftover_objects=objects)  # fmt: skip
            follower.stop()
            timeline.close()
        return RunRecord(sc, run_dir, result, leftovers=leftovers)


def _teardown_reason(result: JobResult) -> str:
    """Why the harness tears the run down: the job ended by itself (``end``), or the harness stopped it."""
    return result.status if result.status in ("deadline", "interrupted", "error") else "end"


def _fmt(v: Any, unit: str = "s") -> str:
    return "—" if v is None else (f"{v:.2f} {unit}" if isinstance(v, float) else f"{v}")


def summarize(rec: RunRecord) -> str:
    m = rec.metrics
    if m is None:
        return f"{rec.result.status}: {rec.result.reason}"
    parts = [m.outcome or rec.result.status]
    if not m.control:
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
