"""What a suite will do, worked out before (and without) running it: its runs in order and their cost
(:func:`suite_plan`, the progress's ETA), its size against the limits (:func:`suite_limits`), what it lacks on
this machine (:func:`missing_engines`), every run's launch plan (:func:`dry_run_plans`, ``--dry-run``) and when
each framework can detect each fault (:func:`suite_outlook`, :func:`detection_outlook`). Also the plugin objects
a run is built from (:func:`build_workload`, :func:`build_runtime`, :func:`build_framework`,
:func:`build_injector`, :func:`job_context`), shared with the run itself (:mod:`chaosbench.run_lifecycle`).
Plain data, nothing started.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaosbench.errors import MissingEngine, SpecError, Unsupported
from chaosbench.frameworks.base import Framework, JobContext, LaunchPlan
from chaosbench.injectors.base import Injector
from chaosbench.progress import PlannedRun
from chaosbench.registry import FRAMEWORKS, INJECTORS, RUNTIMES, WORKLOADS
from chaosbench.rundir import RunDir
from chaosbench.runtimes.base import RunInfo, Runtime
from chaosbench.specs import FaultSpec, Scenario, Suite
from chaosbench.timeline.schema import harness_writer
from chaosbench.workloads.base import Workload

#: Allowance per run for setting it up and tearing it down, beyond its deadline, in the suite's wall-time bound.
RUN_OVERHEAD_S = 30.0
#: Above these a suite runs only when told (``--yes``): most likely a typo (``repeats: 100000000``).
MAX_RUNS = 10_000
MAX_WALL_S = 24 * 3600.0
#: Likewise the size of one run: its world size, nodes and steps (``ranks: 1e12`` would build a plan per rank).
MAX_RANKS = 4096
MAX_NODES = 1024
MAX_STEPS = 1_000_000


def suite_plan(suite: Suite, outlook: Sequence[dict[str, Any]] = ()) -> list[PlannedRun]:
    """Every run of the suite in run order, as the progress's ETA estimates them (:class:`PlannedRun`: a cell
    repeated until decided counts its ``max``); each bounded by its deadline plus :data:`RUN_OVERHEAD_S`, with
    the floor its faults' detection ``outlook`` (:func:`suite_outlook`) puts on its cost: per fault, its resume
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


def detection_outlook(sc: Scenario, framework: Framework, timeouts: dict[str, Any]) -> list[dict[str, Any]]:
    """For each fault of the scenario: when its framework's timeouts in force let it detect the fault (see
    :meth:`Framework.predict_detection`; ``expected_s`` None: never), and the problems that follow from it (it
    cannot be detected, or the job cannot resume, before the run's deadline; it ends before it can be detected).
    Plain data: printed before a suite runs and written as ``detection_prediction`` events."""
    out = []
    for name, fault in sc.faults:
        injector = build_injector(name, fault)
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


def build_workload(scenario: Scenario) -> Workload:
    """The scenario's workload, its options validated."""
    cls = WORKLOADS.get(scenario.workload.name)
    return cls(scenario.workload, cls.Options.model_validate(scenario.workload.options))


def build_runtime(scenario: Scenario, info: RunInfo) -> Runtime:
    """The scenario's runtime for the run ``info``, its options validated (none given: the runtime's defaults)."""
    cls = RUNTIMES.get(scenario.runtime)
    options = cls.Options.model_validate(scenario.runtime_options) if scenario.runtime_options else None
    return cls(info, options)


def build_framework(scenario: Scenario) -> Framework:
    """The scenario's framework adapter, its options validated."""
    cls = FRAMEWORKS.get(scenario.adapter)
    return cls(scenario.framework_label, cls.Options.model_validate(scenario.framework_options))


def build_injector(name: str, fault: FaultSpec) -> Injector:
    """The injector of the fault ``name``, its params validated."""
    cls = INJECTORS.get(fault.injector)
    return cls(name, cls.Params.model_validate(fault.params))


def job_context(sc: Scenario, run_dir: Path, runtime: Runtime, run_id: str) -> JobContext:
    """What a framework plans and supervises a run of ``sc`` with: its ids, its directory's paths
    (:class:`~chaosbench.rundir.RunDir`), its workload and ``runtime``."""
    rd = RunDir(run_dir)
    return JobContext(
        scenario=sc,
        run_id=run_id,
        run_dir=run_dir,
        ckpt_dir=rd.checkpoints,
        events_path=rd.events,
        workload=build_workload(sc),
        runtime=runtime,
    )


def dry_run_plans(suite: Suite, suite_dir: Path) -> list[tuple[Scenario, LaunchPlan | str]]:
    """The launch plan of every scenario of ``suite`` (results under ``suite_dir``), without starting anything
    (``--dry-run``); where what the plan needs is missing on this machine (:class:`MissingEngine`, warned about by
    :func:`missing_engines`), the reason instead. Raises :class:`SpecError` where a framework cannot do what
    the suite asks of it (:class:`Unsupported`)."""
    out: list[tuple[Scenario, LaunchPlan | str]] = []
    with tempfile.TemporaryDirectory(prefix="chaosbench-dry-") as tmp:
        writer = harness_writer(Path(tmp) / "events.jsonl")
        for sc in suite.iter_scenarios():
            run_dir = RunDir.of(suite_dir, sc).path
            runtime = build_runtime(sc, RunInfo(f"dry-{sc.dirname}-{sc.repeat}", Path(tmp), writer))
            job = job_context(sc, run_dir, runtime, "dry-run")
            try:
                out.append((sc, build_framework(sc).plan(job)))
            except MissingEngine as exc:
                out.append((sc, str(exc)))
            except Unsupported as exc:
                # What no run of this framework can do is the suite's problem, found before any run starts.
                raise SpecError(
                    f"{suite.framework_where(sc.framework_label)}: framework '{sc.framework_label}': {exc}"
                ) from None
        writer.close()
    return out


def suite_outlook(suite: Suite, suite_dir: Path) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Detection outlook (:func:`detection_outlook`) of every distinct framework x fault schedule of ``suite``
    (first repeat), and each framework's timeout problems, from the timeouts its adapter would put in force;
    starts nothing."""
    recs: list[dict[str, Any]] = []
    problems: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="chaosbench-outlook-") as tmp:
        writer = harness_writer(Path(tmp) / "events.jsonl")
        for fw, names, _ in suite.cells():  # first repeats only: a huge matrix is not built
            sc = suite.scenario(fw, names, 0)
            if sc.control and sc.framework_label in problems:
                continue
            runtime = build_runtime(sc, RunInfo(f"outlook-{sc.dirname}", Path(tmp), writer))
            framework = build_framework(sc)
            timeouts = framework.timeouts(job_context(sc, RunDir.of(suite_dir, sc).path, runtime, "outlook"))
            if sc.framework_label not in problems:
                problems[sc.framework_label] = framework.timeout_problems(timeouts) + arithmetic_problems(
                    sc, build_workload(sc).options, timeouts
                )
            recs += detection_outlook(sc, framework, timeouts)
        writer.close()
    return recs, problems
