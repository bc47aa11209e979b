"""The ``chaosbench`` command line. Thin: parsing, progress output and error reporting only.

Exit codes: 0 the suite ran (whatever the recovery outcomes were), 1 a harness error or an interrupted
run, 2 bad input (a malformed suite, an unknown fault, a missing file).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from chaosbench import __version__
from chaosbench.errors import ChaosbenchError, SpecError, UnknownPlugin

EXIT_OK, EXIT_HARNESS, EXIT_INPUT = 0, 1, 2


def _err(msg: str) -> None:
    print(f"chaosbench: error: {msg}", file=sys.stderr)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from chaosbench.runner import Runner
    from chaosbench.specs import load_suite

    suite = load_suite(args.suite)
    runner = Runner(suite, args.out, progress=_progress)
    if args.dry_run:
        plans = [{"scenario": sc.id, "repeat": sc.repeat, "deadline_s": sc.deadline_s,
                  "fault": sc.fault.model_dump() if sc.fault else None, "plan": plan.to_dict()}
                 for sc, plan in runner.plans()]  # fmt: skip
        print(json.dumps({"suite": suite.name, "runs": plans}, indent=2, default=str))
        return EXIT_OK

    interrupts = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        interrupts["n"] += 1
        if interrupts["n"] > 1:
            raise KeyboardInterrupt
        _progress(f"chaosbench: {signal.Signals(signum).name}: stopping the current run and tearing down")
        runner.request_stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        n = len(suite.scenarios())
        _progress(f"suite '{suite.name}': {n} runs -> {runner.suite_dir}")
        records = runner.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    paths = _write_report(runner.suite_dir, suite.name)
    if paths:
        _progress(f"report: {paths.get('report.html')}  (also {paths.get('report.md')})")
    errors = [r for r in records if r.result.status == "error"]
    for r in errors:
        _err(f"{r.scenario.id} #{r.scenario.repeat}: {r.result.reason}")
    if runner.stop_requested.is_set():
        _err("interrupted; finished runs are kept and reported")
        return EXIT_HARNESS
    return EXIT_HARNESS if errors else EXIT_OK


def _write_report(suite_dir: Path, title: str | None) -> dict[str, Path]:
    from chaosbench.report import load_results, write_report
    from chaosbench.results import collect

    if not collect(suite_dir, write=True):
        return {}
    return write_report(suite_dir, load_results(suite_dir), title=title)


def cmd_report(args: argparse.Namespace) -> int:
    from chaosbench.runner import SUITE_MARKER

    d = Path(args.dir)
    if not d.is_dir():
        raise ChaosbenchError(f"{d}: no such results directory")
    suites = [d] if (d / SUITE_MARKER).exists() else sorted(p.parent for p in d.glob(f"*/{SUITE_MARKER}"))
    if not suites:
        raise ChaosbenchError(f"{d}: no chaosbench results found (expected {SUITE_MARKER})")
    for s in suites:
        title = json.loads((s / SUITE_MARKER).read_text()).get("suite")
        paths = _write_report(s, title)
        print(f"{s}: {paths.get('report.html', 'no runs')}")
    return EXIT_OK


def cmd_faults(args: argparse.Namespace) -> int:
    from chaosbench.registry import INJECTORS

    for name in INJECTORS.names():
        cls = INJECTORS.get(name)
        print(f"{name}: {getattr(cls, 'summary', '') or (cls.__doc__ or '').strip().splitlines()[0]}")
        for pname, f in cls.Params.model_fields.items():
            default = "required" if f.is_required() else f"default {f.default!r}"
            print(f"    {pname} ({default}): {f.description or ''}")
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    from chaosbench.cleanup import cleanup

    d = Path(args.dir)
    if not d.is_dir():
        raise ChaosbenchError(f"{d}: no such results directory")
    actions = cleanup(d, dry_run=args.dry_run)
    for a in actions:
        print(("would " if args.dry_run else "") + a)
    if not actions:
        print("nothing to clean up")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chaosbench",
        description="Chaos-testing and recovery benchmark harness for multi-rank PyTorch training.",
    )
    p.add_argument("--version", action="version", version=f"chaosbench {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a suite and write its results and report",
                       description="Run every scenario of a suite (controls first), then write "
                                   "results.csv/.parquet, report.md and report.html into OUT/<suite>/.")  # fmt: skip
    r.add_argument("suite", help="suite YAML file, e.g. suites/smoke.yaml")
    r.add_argument("--out", default="reports", help="results directory (default: reports)")
    r.add_argument("--dry-run", action="store_true", help="validate the suite and print every launch plan")
    r.set_defaults(fn=cmd_run)
    rep = sub.add_parser("report", help="recompute metrics and reports from run directories",
                         description="Recompute every metric from the runs' timelines and rewrite the "
                                     "reports of a suite directory (or of every suite below DIR).")  # fmt: skip
    rep.add_argument("dir", help="a suite results directory (e.g. reports/smoke) or a directory of them")
    rep.set_defaults(fn=cmd_report)
    f = sub.add_parser("faults", help="list the injectors and their parameters")
    f.set_defaults(fn=cmd_faults)
    c = sub.add_parser("cleanup", help="remove what crashed runs left behind (processes, cgroups, mounts)",
                       description="End the recorded processes of runs that never ended (pid and start time "
                                   "must both match) and remove their cgroups and mounts; nothing else.")  # fmt: skip
    c.add_argument("dir", nargs="?", default="reports", help="results directory (default: reports)")
    c.add_argument("--dry-run", action="store_true", help="only print what would be done")
    c.set_defaults(fn=cmd_cleanup)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
