"""The ``chaosbench`` command line. Thin: parsing, progress output and error reporting only.

Exit codes: 0 the suite ran and met its SLOs (a suite without SLOs: whatever the recovery outcomes were),
1 a harness error or an interrupted run, 2 bad input (a malformed suite, an unknown fault, a missing file),
3 an SLO was missed, 4 a regression against the baseline (``--baseline``); defined, and decided for a suite's
results, in :mod:`chaosbench.gate`. A comparison with the baseline that the repeats cannot decide ("not decidable
with 3 vs 3 repeats: needs N") is not a regression: it leaves the exit code as it is (0, or 3 with an SLO miss),
and is printed as a note and counted in the summary and the JUnit XML (skipped). ``run --baseline`` prints what
the gate can detect with the suite's repeats and the baseline's before the first run. A scenario with
``repeats: {max: N, until: decided}`` stops once its verdict can no longer change
(:mod:`chaosbench.analysis.sequential`); each stop is printed, with how many repeats ran and why.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from chaosbench import __version__
from chaosbench.errors import ChaosbenchError, ResultsError, SpecError, UnknownPlugin
from chaosbench.gate import EXIT_HARNESS, EXIT_INPUT, EXIT_OK, EXIT_SLO

if TYPE_CHECKING:
    from chaosbench.runner import Runner, RunRecord


def _err(msg: str) -> None:
    print(f"chaosbench: error: {msg}", file=sys.stderr)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    """``chaosbench run``: the suite's size and outlook printed, then its plans (``--dry-run``) or its runs,
    its report, the gate's verdict (the exit code) and its manifest.

    Args:
        args: The parsed command line: ``suite``, ``out``, ``dry_run``, ``jobs``, ``baseline``, ``junit`` and
            the other options ``chaosbench run --help`` lists.

    Returns:
        The exit code: ``EXIT_OK`` (0), ``EXIT_SLO`` (3) when a run missed an SLO, ``EXIT_REGRESSION`` (4)
        when the baseline's gate found a regression, ``EXIT_HARNESS`` (1) when the suite was halted.

    Raises:
        SpecError: The suite file is malformed or names what does not exist (the CLI exits 2).
        ChaosbenchError: The harness cannot run the suite at all (the CLI exits 1); a run that cannot start is
            that run's error, not raised.
    """
    from chaosbench.runner import Runner, missing_engines
    from chaosbench.specs import load_suite

    suite = load_suite(args.suite)
    n, bound_s = _announce_suite(args, suite)
    runner = Runner(suite, args.out, stopping=_stopping(args, suite))
    outlook, problems = runner.outlook()
    _print_outlook(outlook, problems)
    engines = missing_engines(suite)
    for what, why in engines.items():
        _progress(f"warning: {what}: {why}; its runs will fail here")
    if args.baseline:
        _print_power(args, suite)
    _print_until_decided(args, suite)
    if args.dry_run:
        _print_dry_run(runner, n, bound_s, outlook, problems, engines)
        return EXIT_OK
    records = _run_suite(args, runner, n, bound_s, outlook)
    return _conclude_run(args, runner, records)


def _announce_suite(args: argparse.Namespace, suite: Any) -> tuple[int, float]:
    """The suite's number of runs and wall-time bound (:func:`~chaosbench.runner.suite_limits`), printed; raises
    :class:`SpecError` for a ``--jobs`` below 1, and for a suite over the limits unless ``--yes``."""
    from chaosbench.progress import format_duration
    from chaosbench.runner import RUN_OVERHEAD_S, suite_limits

    if args.jobs < 1:
        raise SpecError(f"--jobs {args.jobs}: give 1 or more runs at once")
    n, bound_s, over = suite_limits(suite, args.jobs)
    at_once = f", {args.jobs} at once" if args.jobs > 1 else ""
    _progress(
        f"suite '{suite.name}': {'at most ' if suite.until_decided() else ''}{n} runs, at most {format_duration(bound_s)} (each run to its deadline of "
        f"{_deadlines(suite)}, +{RUN_OVERHEAD_S:g} s to set up and tear down{at_once})"
    )
    if over and not args.yes:
        raise SpecError(
            f"suite '{suite.name}' is too large: {'; '.join(over)} (check matrix.repeats, "
            "defaults.deadline_s and the workloads' ranks, nodes and steps); pass --yes to run it anyway",
            file=args.suite,
        )
    return n, bound_s


def _deadlines(suite: Any) -> str:
    """The suite's run deadlines in words: ``300 s``, or ``300 s (hang: 60 s)`` where faults set their own."""
    own = {n: f.deadline_s for n, f in suite.faults.items() if f.deadline_s is not None}
    shown = ", ".join(f"{n}: {d:g} s" for n, d in sorted(own.items()))
    return f"{suite.defaults.deadline_s:g} s" + (f" ({shown})" if shown else "")


def _print_dry_run(
    runner: Runner,
    n: int,
    bound_s: float,
    outlook: list[dict[str, Any]],
    problems: dict[str, list[str]],
    engines: dict[str, str],
) -> None:
    """``run --dry-run``: the suite's size, outlook, missing engines, every run's plan and its repeats until
    decided, as one JSON document on stdout."""
    suite = runner.suite
    plans = [
        {
            "scenario": sc.id,
            "repeat": sc.repeat,
            "deadline_s": sc.deadline_s,
            "fault": sc.fault.model_dump() if sc.fault else None,
            "faults": sc.to_dict()["faults"],
            "slos": sc.to_dict()["slos"],
            "plan": plan if isinstance(plan, str) else plan.to_dict(),
        }
        for sc, plan in runner.plans()
    ]
    until = {
        key: {"min": d.min_repeats, "max": d.max, "looks": d.looks}
        for key, d in suite.until_decided().items()
    }
    print(
        json.dumps(
            {
                "suite": suite.name,
                "runs_total": n,
                "wall_bound_s": bound_s,
                "detection_outlook": outlook,
                "timeout_problems": problems,
                "missing_engines": engines,
                "runs": plans,
                "repeats_until_decided": until,
            },
            indent=2,
            default=str,
        )
    )


def _run_suite(
    args: argparse.Namespace, runner: Runner, n: int, bound_s: float, outlook: list[dict[str, Any]]
) -> list[RunRecord]:
    """The suite's runs under a live progress, SIGINT/SIGTERM asking the runner to stop (a second one raises
    KeyboardInterrupt); the runs' records. Raises :class:`SpecError` when ``--jobs`` cannot run here."""
    from chaosbench.errors import Unsupported
    from chaosbench.progress import SuiteProgress
    from chaosbench.runner import suite_plan

    suite = runner.suite
    if args.jobs > 1:
        try:
            runner.slots(args.jobs, args.timings_may_interfere)
        except Unsupported as exc:
            raise SpecError(f"--jobs {args.jobs}: {exc}") from None

    interrupts = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        interrupts["n"] += 1
        if interrupts["n"] > 1:
            raise KeyboardInterrupt
        runner.progress.message(
            f"chaosbench: {signal.Signals(signum).name}: stopping the current run and tearing down"
        )
        runner.request_stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with SuiteProgress(suite.name, n, bound_s, header=False, plan=suite_plan(suite, outlook)) as progress:
            runner.progress = progress
            progress.message(f"results -> {runner.suite_dir}" + (" (resuming)" if args.resume else ""))
            records = runner.run(
                resume=args.resume, jobs=args.jobs, timings_may_interfere=args.timings_may_interfere
            )
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return records


def _conclude_run(args: argparse.Namespace, runner: Runner, records: list[RunRecord]) -> int:
    """After the runs: the suite's report written, the gate's verdict (the exit code), why the suite stopped
    early if it did, and its manifest."""
    suite = runner.suite
    paths = _write_report(runner.suite_dir, suite.name, recompute=False)
    if paths:
        _progress(f"report: {paths.get('report.html')}  (also {paths.get('report.md')})")
    metrics = [r.metrics for r in records if r.metrics is not None]
    repeats = [s.describe() for s in runner.settlements.values()]
    code = _gate(
        args,
        runner.suite_dir,
        suite.name,
        records,
        metrics,
        interrupted=runner.stop_requested.is_set(),
        repeats=repeats,
    )
    if runner.halted is not None:  # its run is an error too: the exit code says so already
        _err(runner.halted.describe())
    from chaosbench.manifest import write_manifest

    _progress(f"manifest: {write_manifest(runner.suite_dir, args.argv, Path(args.suite))}")
    return code


def _print_outlook(outlook: list[dict[str, Any]], problems: dict[str, list[str]]) -> None:
    """Timeout sanity before a suite runs: when each fault can be detected, and what cannot work."""
    from chaosbench.runner import describe_outlook

    if not outlook and not any(problems.values()):
        return
    _progress("timeout sanity (when the timeouts in force let each framework detect each fault):")
    for rec in outlook:
        _progress(f"  {describe_outlook(rec)}")
        for p in rec.get("problems") or []:
            _progress(f"    warning: {p}")
    for fw, lines in problems.items():
        for p in lines:
            _progress(f"  warning: {fw}: {p}")


def _print_power(args: argparse.Namespace, suite: Any) -> None:
    """Before a suite runs against a baseline: what the gate can detect with its repeats and the baseline's
    (:mod:`chaosbench.analysis.power`), so that a green gate is read for what it is."""
    from chaosbench.analysis.baseline import load_rows
    from chaosbench.analysis.power import power, suite_repeats

    p = power(load_rows(args.baseline), suite_repeats(suite), alpha=args.alpha, threshold=args.threshold)
    for line in p.lines():
        _progress(line)


def _stopping(args: argparse.Namespace, suite: Any) -> Any:
    """When scenarios repeated until decided stop (:mod:`chaosbench.analysis.sequential`): against the
    baseline when given, else on their SLOs alone; None when the suite has none."""
    if not suite.until_decided():
        return None
    from chaosbench.analysis.baseline import load_rows
    from chaosbench.analysis.sequential import StoppingRule

    rows = load_rows(args.baseline) if args.baseline else None
    return StoppingRule.for_suite(suite, rows, alpha=args.alpha, threshold=args.threshold)


def _print_until_decided(args: argparse.Namespace, suite: Any) -> None:
    """Before a suite runs: each scenario repeated until decided, its repeats and looks, and what can decide it."""
    designs = suite.until_decided()
    if not designs:
        return
    against = "the baseline and its SLOs" if args.baseline else "its SLOs (no --baseline)"
    spent = "; the power line's levels divided by its looks" if args.baseline else ""
    _progress(
        f"repeated until decided (stops once its verdict against {against} can no longer change; alpha "
        f"spent over the looks: every p x its looks{spent}):"
    )
    for fw, names, _ in suite.cells():
        sc = suite.scenario(fw, names, 0)
        if (d := designs.get(sc.id)) is None:
            continue
        tail = "" if args.baseline or sc.slos else ": nothing to decide without a baseline or SLOs, runs max"
        if sc.slos:
            tail = "; its SLOs are settled only by a miss (while every run meets them it runs max)"
        _progress(f"  {sc.id}: {d.min_repeats} to {d.max} repeats, {d.looks} looks{tail}")


def _gate(
    args: argparse.Namespace,
    suite_dir: Path,
    suite: str,
    records: list[Any],
    metrics: list[Any],
    interrupted: bool,
    repeats: list[str] | None = None,
) -> int:
    """CI outputs and the exit code, from the gate (:mod:`chaosbench.gate`); here only what is printed."""
    from chaosbench.gate import Comparison, Gate, harness_errors

    comparison = None
    if args.baseline:
        comparison = Comparison.of(
            args.baseline,
            suite_dir,
            threshold=args.threshold,
            alpha=args.alpha,
            title=f"{suite} against {args.baseline}",
        )
    gate = Gate(
        suite,
        metrics,
        harness_errors(records),
        comparison=comparison,
        interrupted=interrupted,
        repeats=repeats or [],
    )
    for d in gate.notes:
        _progress(f"note: {d.describe()}")
    gate.write(suite_dir, junit=args.junit, summary=args.summary)
    for run_dir, reason in gate.errors.items():
        _err(f"{run_dir}: {reason}")
    for m in gate.misses:
        _progress(f"SLO missed: {m.scenario} #{m.repeat}: {'; '.join(m.slo_failures)} ({m.run_dir})")
    for d in gate.regressions:
        _progress(f"regression: {d.describe()}")
    if comparison is not None:
        _progress(f"baseline: {comparison.verdict()}")
    if interrupted:
        _err("interrupted; finished runs are kept and reported")
    return gate.exit_code()


def _write_report(
    suite_dir: Path, title: str | None, recompute: bool = True, plots: str = "existing"
) -> dict[str, Path]:
    """The suite's report from its table; ``recompute``: every run's metrics recomputed from its timeline first
    (``chaosbench report``; a suite just run has its table already)."""
    from chaosbench.analysis.results import RESULTS_CSV, collect, load_results
    from chaosbench.report import write_report

    if recompute and not collect(suite_dir, write=True):
        return {}
    if not (suite_dir / RESULTS_CSV).exists():
        return {}
    return write_report(suite_dir, load_results(suite_dir), title=title, plots=plots)


def cmd_report(args: argparse.Namespace) -> int:
    """``chaosbench report DIR``: the metrics and reports of every suite below ``DIR`` recomputed from their run
    directories (timelines), one line each naming its report.

    Args:
        args: ``dir`` (a suite's results directory, or a directory of them) and ``plots``.

    Returns:
        ``EXIT_OK``.

    Raises:
        ResultsError: ``DIR`` does not exist or holds no suite's results.
    """
    from chaosbench.runner import SUITE_MARKER

    d = Path(args.dir)
    if not d.is_dir():
        raise ResultsError(str(d), "no such results directory")
    suites = [d] if (d / SUITE_MARKER).exists() else sorted(p.parent for p in d.glob(f"*/{SUITE_MARKER}"))
    if not suites:
        raise ResultsError(str(d), f"no chaosbench results found (expected {SUITE_MARKER})")
    for s in suites:
        title = json.loads((s / SUITE_MARKER).read_text()).get("suite")
        paths = _write_report(s, title, plots=args.plots)
        print(f"{s}: {paths.get('report.html', 'no runs')}")
    return EXIT_OK


def cmd_faults(args: argparse.Namespace) -> int:
    """``chaosbench faults``: every injector with its parameters (required first), then the fault definitions a
    suite's ``use: NAME`` finds.

    Args:
        args: ``suite``, the suite whose own ``faults/`` folders are searched first (None: the current
            directory's).

    Returns:
        ``EXIT_OK``.

    Raises:
        SpecError: ``suite`` is given and is not a file.
    """
    from chaosbench.registry import INJECTORS

    for name in INJECTORS.names():
        alias_of = INJECTORS.alias_of(name)
        if alias_of is not None:
            print(f"{name}: alias of {alias_of}")
            continue
        cls = INJECTORS.get(name)
        print(f"{name}: {getattr(cls, 'summary', '') or (cls.__doc__ or '').strip().splitlines()[0]}")
        fields = cls.Params.model_fields.items()
        for pname, f in sorted(
            fields, key=lambda kv: not kv[1].is_required()
        ):  # required first, then as declared
            default = "required" if f.is_required() else f"default {f.default!r}"
            print(f"    {pname} ({default}): {f.description or ''}")
    _print_fault_definitions(args.suite)
    return EXIT_OK


def _print_fault_definitions(suite: str | None) -> None:
    """The definitions ``use: NAME`` finds from ``suite`` (default: a suite in the current directory), each with
    its file and where it came from."""
    from chaosbench.specs import fault_definitions

    if suite is not None and not Path(suite).is_file():
        raise SpecError("no such suite file", file=str(suite))
    found = fault_definitions(suite or str(Path.cwd() / "suite.yaml"))
    print(
        f"\nfault definitions for use: NAME{f' in {suite}' if suite else ''} (the suite's own faults/ folders "
        "first, then those shipped with chaosbench):"
    )
    for d in found.values():
        origin = (
            "shipped with chaosbench"
            if d.builtin
            else "the suite's own" + ("; overrides the one shipped with chaosbench" if d.shadows else "")
        )
        print(f"  {d.name}: {d.file} ({origin})")


def cmd_cleanup(args: argparse.Namespace) -> int:
    """``chaosbench cleanup DIR``: what crashed runs below ``DIR`` left behind (processes, containers, networks,
    Slurm jobs, mounts, qdiscs, capture directories) removed, each action printed.

    Args:
        args: ``dir`` and ``dry_run`` (list the processes it would end, do nothing).

    Returns:
        ``EXIT_OK``.

    Raises:
        ResultsError: ``DIR`` does not exist.
    """
    from chaosbench.cleanup import cleanup

    d = Path(args.dir)
    if not d.is_dir():
        raise ResultsError(str(d), "no such results directory")
    actions = cleanup(d, dry_run=args.dry_run)
    for a in actions:
        print(("would " if args.dry_run else "") + a)
    if not actions:
        print("nothing to clean up")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """``chaosbench verify DIR``: a suite's results checked against the manifest written when it ended.

    Args:
        args: ``dir`` and ``checkpoints`` (verify the checkpoint files' names and sizes too).

    Returns:
        0 when every file matches, else 1 (each problem printed).

    Raises:
        ResultsError: No readable manifest.
    """
    from chaosbench.manifest import main_verify

    return main_verify(args.dir, checkpoints=args.checkpoints)


def cmd_compare(args: argparse.Namespace) -> int:
    """``chaosbench compare A B``: two results directories side by side, per ``by`` (scenario, framework, ...),
    with the rank test's p for each timing, as Markdown (printed, and written to ``out`` when given).

    Args:
        args: ``a``, ``b``, ``by``, ``threshold``, ``alpha`` and ``out``.

    Returns:
        ``EXIT_OK``.

    Raises:
        ResultsError: The two have nothing of ``by`` in common.
    """
    from chaosbench.gate import Comparison

    comparison = Comparison.of(args.a, args.b, by=args.by, threshold=args.threshold, alpha=args.alpha)
    if not comparison.diffs:
        raise ResultsError(
            str(args.b),
            f"no {args.by} in common with {args.a}",
            message=f"{args.a} and {args.b} have no {args.by} in common",
        )
    text = comparison.markdown()
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return EXIT_OK


def cmd_baseline(args: argparse.Namespace) -> int:
    """``chaosbench baseline DIR``: a suite's results saved as the baseline later runs are gated against.

    Args:
        args: ``dir`` (the results) and ``to`` (the baseline file).

    Returns:
        ``EXIT_OK``.

    Raises:
        ResultsError: ``DIR`` has no results.csv.
    """
    from chaosbench.analysis.baseline import save_baseline

    print(f"baseline saved: {save_baseline(args.dir, args.to)}")
    return EXIT_OK


def schedule_strategy_check(fuzzer: Any) -> None:
    """Reject unknown fault kinds before any run starts."""
    from chaosbench.fuzz import schedule_strategy

    schedule_strategy(30, 10, 2, fuzzer.max_faults, fuzzer.kinds)


def cmd_fuzz(args: argparse.Namespace) -> int:
    """``chaosbench fuzz SUITE``: fault schedules generated against one framework of the suite until one breaks
    a recovery invariant, then shrunk to a minimal reproducer suite.

    Args:
        args: ``suite``, ``framework``, ``out``, ``examples``, ``max_runs``, ``max_faults``, ``seed``, ``kinds``
            and ``write`` (the reproducer's path).

    Returns:
        ``EXIT_OK`` when no schedule violated the invariants, ``EXIT_SLO`` when one did (its reproducer
        written).

    Raises:
        SpecError: The suite is malformed, or ``kinds`` names an unknown fault kind.
    """
    from chaosbench.fuzz import Fuzzer
    from chaosbench.specs import load_suite

    suite = load_suite(args.suite)
    framework = args.framework or suite.matrix.frameworks[0]
    try:
        fuzzer = Fuzzer(
            suite,
            framework,
            args.out,
            max_examples=args.examples,
            max_runs=args.max_runs,
            max_faults=args.max_faults,
            seed=args.seed,
            progress=_progress,
            kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        )
        schedule_strategy_check(fuzzer)
    except ValueError as exc:
        raise SpecError(str(exc), file=args.suite) from None
    res = fuzzer.fuzz()
    _progress(f"fuzz: {res.examples} examples, {res.runs} runs, {res.elapsed_s:.0f} s")
    if res.schedule is None:
        print("no schedule violated the recovery invariants")
        return EXIT_OK
    path = fuzzer.reproducer(res.schedule, args.write or Path(args.out) / f"{suite.name}-repro.yaml")
    print(f"minimal failing schedule: {Fuzzer.describe(res.schedule)}")
    print(f"violations: {'; '.join(res.violations)}")
    print(f"run directory: {res.run_dir}")
    print(f"reproducer: {path}  (chaosbench run {path})")
    return EXIT_SLO


def suite_schema() -> dict[str, Any]:
    """The JSON schema of a suite file, from the typed models (for editors: completion and validation)."""
    from chaosbench.specs import Suite

    schema = Suite.model_json_schema()
    schema["title"] = "chaosbench suite"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def cmd_schema(args: argparse.Namespace) -> int:
    """``chaosbench schema``: the JSON schema of a suite file (or, with ``--events``, of the timeline's events),
    from the typed models.

    Args:
        args: ``events`` and ``out`` (a file; None: standard output).

    Returns:
        ``EXIT_OK``.
    """
    if args.events:
        from chaosbench.timeline.schema import events_json_schema

        schema = events_json_schema()
    else:
        schema = suite_schema()
    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        _progress(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    """``chaosbench init DIR``: a starter suite (``chaos/ci.yaml``) and a CI job running it
    (``.github/workflows/chaos.yml``) written into a team's own repository.

    Args:
        args: ``dir``, the repository's root.

    Returns:
        ``EXIT_OK``, each file written printed.

    Raises:
        SpecError: One of the files exists already (nothing is written).
    """
    from chaosbench.starter import write_starter

    for p in write_starter(args.dir):
        print(f"wrote {p}")
    return EXIT_OK


def cmd_image(args: argparse.Namespace) -> int:
    """``chaosbench image build``: the docker runtime's default node image assembled from local files.

    Args:
        args: ``force`` (rebuild although the image exists).

    Returns:
        0, the image's tag printed.

    Raises:
        EngineError: The engine cannot build it.
        MissingEngine: No Docker engine answers.
    """
    from chaosbench.runtimes.docker.image import main_build

    return main_build(force=args.force)


class _Subcommands(Protocol):
    """What a subcommand's helper uses of ``ArgumentParser.add_subparsers()``: adding the subcommand's parser."""

    def add_parser(
        self, name: str, *, help: str | None = ..., description: str | None = ...
    ) -> argparse.ArgumentParser: ...


def _add_run_command(sub: _Subcommands) -> None:
    """``chaosbench run SUITE``: run a suite and write its results and report."""
    r = sub.add_parser(
        "run",
        help="run a suite and write its results and report",
        description="Run every scenario of a suite (controls first), then write "
        "results.csv/.parquet, report.md and report.html into OUT/<suite>/.",
    )
    r.add_argument("suite", help="suite YAML file, e.g. suites/smoke.yaml")
    r.add_argument("--out", default="reports", help="results directory (default: reports)")
    r.add_argument("--dry-run", action="store_true", help="validate the suite and print every launch plan")
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted or crashed suite in OUT: keep its finished runs, run the rest "
        "(an unfinished run again from scratch); refused if the suite has changed",
    )
    r.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="run N independent runs at once where the runtime keeps them apart (slurm: nodes of "
        "their own; docker: CPUs of their own); the controls first (default 1)",
    )
    r.add_argument(
        "--timings-may-interfere",
        action="store_true",
        help="allow --jobs on the local runtime, whose runs share this machine's CPUs: outcomes are "
        "checked, timings taken this way are not comparable",
    )
    r.add_argument(
        "--yes",
        action="store_true",
        help="run a suite above the limits (10,000 runs, 24 h when every run reaches its deadline, "
        "4,096 ranks, 1,024 nodes or 1,000,000 steps a run)",
    )
    r.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per run; SLO misses fail)")
    r.add_argument("--summary", metavar="FILE", help="write a Markdown summary (also OUT/<suite>/summary.md)")
    r.add_argument(
        "--baseline",
        metavar="CSV|DIR",
        help="fail (exit 4) on regressions against this result set; prints first what its repeats and "
        "the suite's can detect; scenarios with repeats: {max: N, until: decided} stop once their "
        "verdict against it (and their SLOs) can no longer change",
    )
    r.add_argument(
        "--threshold",
        type=float,
        default=0.2,
        help="relative change of a timing that counts, besides the baseline's own range (default 0.2)",
    )
    r.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="false-alarm rate of the whole verdict (Holm over every comparison; default 0.05)",
    )
    r.set_defaults(fn=cmd_run)


def _add_report_command(sub: _Subcommands) -> None:
    """``chaosbench report DIR``: recompute metrics and reports from run directories."""
    rep = sub.add_parser(
        "report",
        help="recompute metrics and reports from run directories",
        description="Recompute every metric from the runs' timelines and rewrite the "
        "reports of a suite directory (or of every suite below DIR).",
    )
    rep.add_argument("dir", help="a suite results directory (e.g. reports/smoke) or a directory of them")
    rep.add_argument(
        "--plots",
        choices=["existing", "missing", "all"],
        default="existing",
        help="per-run plots (each run's timeline.png and a serving run's per_second.png, drawn when "
        "it ended): show the existing ones (default), draw the missing ones, or redraw all",
    )
    rep.set_defaults(fn=cmd_report)


def _add_compare_command(sub: _Subcommands) -> None:
    """``chaosbench compare A B``: two result sets side by side."""
    cmp = sub.add_parser(
        "compare",
        help="two result sets side by side, with the significance of each difference",
        description="Compare result set B against A (suite directories or results CSVs): "
        "shares of outcomes (Fisher's exact p), medians (Mann-Whitney p), Holm-adjusted "
        "p over every comparison, regressions and what the repeats cannot decide.",
    )
    cmp.add_argument("a", help="result set A (e.g. reports/compare or a baseline CSV)")
    cmp.add_argument("b", help="result set B")
    cmp.add_argument(
        "--by",
        choices=["scenario", "fault"],
        default="scenario",
        help="match runs by scenario (framework/fault) or by fault only (two frameworks)",
    )
    cmp.add_argument(
        "--threshold",
        type=float,
        default=0.2,
        help="relative change of a timing that counts, besides A's own range (default 0.2)",
    )
    cmp.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="false-alarm rate of the whole comparison (Holm over every comparison; default 0.05)",
    )
    cmp.add_argument("--out", metavar="FILE", help="also write the Markdown table to FILE")
    cmp.set_defaults(fn=cmd_compare)


def _add_fuzz_command(sub: _Subcommands) -> None:
    """``chaosbench fuzz SUITE``: search fault schedules for a recovery bug."""
    fz = sub.add_parser(
        "fuzz",
        help="search fault schedules for a recovery bug and shrink it to a reproducer",
        description="Draw fault schedules (kills, hangs, kills during a checkpoint save, "
        "stragglers; several per run) with Hypothesis, run each for real, check the "
        "recovery invariants (finishes, fidelity exact, no crash loop, the suite's "
        "SLOs), shrink a failing schedule and write it as a suite YAML. Exit 3 when "
        "one is found.",
    )
    fz.add_argument("suite", help="suite whose workload, framework and SLOs to use")
    fz.add_argument("--framework", help="framework label of the suite (default: the first in its matrix)")
    fz.add_argument("--examples", type=int, default=10, help="generated examples (default 10)")
    fz.add_argument(
        "--max-runs", type=int, default=30, help="real runs at most, shrinking included (default 30)"
    )
    fz.add_argument("--max-faults", type=int, default=2, help="faults per schedule at most (default 2)")
    fz.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    fz.add_argument(
        "--kinds",
        default="kill,hang,torn-write,straggler",
        help="fault kinds to draw from, comma-separated (default: kill,hang,torn-write,straggler)",
    )
    fz.add_argument("--out", default="reports", help="results directory (default: reports)")
    fz.add_argument("--write", metavar="YAML", help="reproducer path (default: OUT/<suite>-repro.yaml)")
    fz.set_defaults(fn=cmd_fuzz)


def _add_baseline_command(sub: _Subcommands) -> None:
    """``chaosbench baseline DIR --to CSV``: save a suite's results as a baseline."""
    bl = sub.add_parser(
        "baseline",
        help="save a suite's results as a baseline for later --baseline runs",
        description="Save a suite's results as a baseline for later --baseline runs.",
    )
    bl.add_argument("dir", help="a suite results directory, e.g. reports/ci")
    bl.add_argument("--to", required=True, metavar="CSV", help="where to store it, e.g. baselines/ci.csv")
    bl.set_defaults(fn=cmd_baseline)


def _add_verify_command(sub: _Subcommands) -> None:
    """``chaosbench verify DIR``: check a suite directory against its manifest."""
    vf = sub.add_parser(
        "verify",
        help="check a suite directory against its manifest.json",
        description="Check every result file of a suite directory against the sha256 its "
        "manifest.json recorded when the suite ran (timelines, logs, configs, figures: a "
        "change fails; reports and plots are derived: a change is a note), the suite "
        "definition's hash, and that every run of results.csv has its directory. Exit "
        "0 when it holds, 1 otherwise.",
    )
    vf.add_argument("dir", help="a suite results directory, e.g. reports/smoke")
    vf.add_argument("--checkpoints", action="store_true", help="also check checkpoint file names and sizes")
    vf.set_defaults(fn=cmd_verify)


def _add_faults_command(sub: _Subcommands) -> None:
    """``chaosbench faults [SUITE]``: list the injectors and the fault definitions."""
    f = sub.add_parser(
        "faults",
        help="list the injectors, their parameters and the fault definitions",
        description="List every injector with its parameters, then every fault definition a "
        "suite's `use: NAME` finds, with its file and where it came from: the suite's "
        "own faults/ folders first, then the library shipped with chaosbench.",
    )
    f.add_argument(
        "suite",
        nargs="?",
        help="the definitions as this suite sees them (default: a suite in the current directory)",
    )
    f.set_defaults(fn=cmd_faults)


def _add_cleanup_command(sub: _Subcommands) -> None:
    """``chaosbench cleanup [DIR]``: remove what crashed runs left behind."""
    c = sub.add_parser(
        "cleanup",
        help="remove what crashed runs left behind (processes, cgroups, mounts, containers, networks)",
        description="End the recorded processes of runs that never ended (pid and start time "
        "must both match) and remove their cgroups, mounts, containers, networks and "
        "docker output handover directories; nothing else.",
    )
    c.add_argument("dir", nargs="?", default="reports", help="results directory (default: reports)")
    c.add_argument("--dry-run", action="store_true", help="only print what would be done")
    c.set_defaults(fn=cmd_cleanup)


def _add_schema_command(sub: _Subcommands) -> None:
    """``chaosbench schema``: the JSON schema of suite files (or of a timeline line)."""
    sch = sub.add_parser(
        "schema",
        help="the JSON schema of suite files (for editors)",
        description="Print (or write) the JSON schema of a suite file, generated from the typed "
        "models; suites/suite.schema.json is this, kept fresh by a test.",
    )
    sch.add_argument("--out", metavar="FILE", help="write it to FILE instead of standard output")
    sch.add_argument(
        "--events",
        action="store_true",
        help="the JSON schema of a timeline line (events.jsonl: one model per event kind) instead",
    )
    sch.set_defaults(fn=cmd_schema)


def _add_init_command(sub: _Subcommands) -> None:
    """``chaosbench init [DIR]``: write a starter suite and a CI job."""
    ini = sub.add_parser(
        "init",
        help="write a starter suite and a CI job into a repository",
        description="Write chaos/ci.yaml (a starter recovery suite using the fault library "
        "shipped with chaosbench) and .github/workflows/chaos.yml (a CI job running "
        "it) under DIR; an existing file is refused, nothing is overwritten.",
    )
    ini.add_argument(
        "dir", nargs="?", default=".", help="the repository's root (default: the current directory)"
    )
    ini.set_defaults(fn=cmd_init)


def _add_image_command(sub: _Subcommands) -> None:
    """``chaosbench image build``: the docker runtime's default node image."""
    img = sub.add_parser(
        "image",
        help="the docker runtime's default node image",
        description="The docker runtime's default node image.",
    )
    isub = img.add_subparsers(dest="image_cmd", required=True)
    b = isub.add_parser(
        "build",
        help="build the default node image from local files (no registry needed)",
        description="Import the docker runtime's default node image (an empty layer; the host's "
        "Python, torch and chaosbench are mounted read-only at run time) unless it "
        "exists, and print its tag.",
    )
    b.add_argument("--force", action="store_true", help="import it again even if it exists")
    b.set_defaults(fn=cmd_image)


def build_parser() -> argparse.ArgumentParser:
    """The ``chaosbench`` command line: its own options, then a parser per subcommand (``_add_*_command``),
    added in the order ``--help`` lists them."""
    p = argparse.ArgumentParser(
        prog="chaosbench",
        description="Chaos-testing and recovery benchmark harness for multi-rank PyTorch training and for model "
        "replicas served behind a load balancer.",
    )
    p.add_argument("--version", action="version", version=f"chaosbench {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run_command(sub)
    _add_report_command(sub)
    _add_compare_command(sub)
    _add_fuzz_command(sub)
    _add_baseline_command(sub)
    _add_verify_command(sub)
    _add_faults_command(sub)
    _add_cleanup_command(sub)
    _add_schema_command(sub)
    _add_init_command(sub)
    _add_image_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``chaosbench`` command: parse the command line and run its subcommand.

    Args:
        argv: The arguments after the program's name (None: ``sys.argv[1:]``).

    Returns:
        The subcommand's exit code; ``EXIT_INPUT`` (2) for bad input (a malformed suite, an unknown plugin)
        and ``EXIT_HARNESS`` (1) for any other chaosbench error or an interrupt, each printed as one line.
    """
    args = build_parser().parse_args(argv)
    args.argv = ["chaosbench", *(sys.argv[1:] if argv is None else argv)]
    try:
        return int(args.fn(args))
    except (SpecError, UnknownPlugin) as exc:
        _err(str(exc))
        return EXIT_INPUT
    except ChaosbenchError as exc:
        _err(str(exc))
        return EXIT_HARNESS
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_HARNESS


if __name__ == "__main__":
    sys.exit(main())
