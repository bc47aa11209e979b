"""Does the baseline gate catch real regressions, and does it stay quiet on a clean rerun? Prints figures; asserts
nothing.

The suite is ``suites/ci.yaml`` plus one scenario, ``restart/hang-rank1`` (rank 1 SIGSTOPped at step 15 until the
run ends, under the restart framework only, through ``matrix.include``): a heartbeat timeout only shows under a hung
rank and the CI suite has none. It is derived from ``suites/ci.yaml`` here, with the repeats replaced (fixed:
``--baseline-repeats`` for the baseline, ``--repeats`` for every other set); ``suites/ci.yaml`` is not changed.

1. The baseline: the derived suite, unchanged, ``chaosbench baseline`` of its results.
2. One result set per *plant*, each a real change of behaviour in the derived suite (never an edited result):

   - ``restart-delay``: the restart framework waits ``restart_delay_s: 2`` before it relaunches (0 in the suite);
   - ``max-restarts-0``: the restart framework gives up at the first failure (``max_restarts: 0``, 3 in the suite);
   - ``heartbeat-15s``: the restart framework's ``heartbeat_timeout_s`` 5 -> 15 s (a hung rank is seen later;
     with the workload's ``pg_timeout_s: 10`` the peer's collective times out first);
   - ``forget-optimizer``: the workload does not restore its optimizer's state on resume (``bug: forget-optimizer``);
   - ``non-atomic-ckpt``: the workload writes ``COMPLETE`` before the shards, so a torn save is loaded
     (``bug: non-atomic-ckpt``).

3. ``--clean-reruns K`` result sets of the unchanged derived suite.
4. ``--until MIN:MAX``: ``--until-reruns`` more clean sets repeated until decided (``{min: MIN, max: MAX, until:
   decided}``, the SLOs dropped: see below), their runs and wall beside the fixed clean reruns' (issue 30 item 3).

Every set after the baseline is run by ``chaosbench run --baseline`` (its exit code is kept) and compared with the
baseline here by :func:`chaosbench.analysis.baseline.compare`, the gate's own rules (alpha 0.05 over the whole
verdict, Holm, threshold 20 %). A plant is *caught* when its verdict has a failing comparison (a regression, or a
figure no longer measured); a clean rerun's failing comparisons are *false alarms*. SLO misses (exit 3) are
printed beside, not counted as caught: this measures the baseline gate.

Resumable: each set lives in ``OUT/<set>-r<repeats>/``; a set with ``done.json`` is reused, one without is resumed
(``chaosbench run --resume``). Usage::

    python benchmarks/gate_power.py --out reports/gate-power [--baseline-repeats 10] [--repeats 4]
        [--plants restart-delay,forget-optimizer | all | none] [--clean-reruns 10] [--until 2:6 --until-reruns 2]
        [--power-only | --report-only]

Fixed repeats by default, not ``{max: N, until: decided}``: the suite has SLOs, and a scenario whose runs all meet them is not
settled before ``max`` (one more run could miss), so a clean set would run ``max`` anyway, and each look costs
alpha (every p times ``max - min + 1``). A large baseline and few new repeats buy the most power per run: the
baseline is run once, the new repeats once per set; complete separation of 10 against 4 gives p = 1/C(14,4) =
1/1001, below the first Holm level of a family of up to 50 comparisons at alpha 0.05 (12 against 4: 1/1820, up
to 91).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CI_SUITE = ROOT / "suites" / "ci.yaml"
HANG = {"use": "hang-rank", "target": {"rank": 1}, "trigger": {"at_step": 15}}
ALPHA = 0.05
THRESHOLD = 0.2


@dataclass(frozen=True)
class Plant:
    """A planted regression: ``change`` edits the derived suite's document in place; ``scenarios``: the scenario
    ids whose behaviour it changes (a failing comparison elsewhere is reported as outside the plant)."""

    name: str
    what: str
    change: Callable[[dict[str, Any]], None]
    scenarios: tuple[str, ...]


def _restart(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["frameworks"]["restart"][key] = value

    return change


def _bug(bug: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["defaults"]["workload"]["bug"] = bug

    return change


RESTART = ("restart/kill-rank1", "restart/torn-write", "restart/hang-rank1")
ALL = (*RESTART, "torchrun/kill-rank1", "torchrun/torn-write")
PLANTS = {
    p.name: p
    for p in (
        Plant(
            "heartbeat-15s",
            "restart framework: heartbeat_timeout_s 5 -> 15 s",
            _restart("heartbeat_timeout_s", 15.0),
            ("restart/hang-rank1",),
        ),
        Plant(
            "restart-delay",
            "restart framework: restart_delay_s 0 -> 2 s",
            _restart("restart_delay_s", 2.0),
            RESTART,
        ),
        Plant(
            "forget-optimizer",
            "ddp-mlp: bug forget-optimizer (optimizer state not restored on resume)",
            _bug("forget-optimizer"),
            ALL,
        ),
        Plant(
            "non-atomic-ckpt",
            "ddp-mlp: bug non-atomic-ckpt (COMPLETE before the shards: a torn save is loaded)",
            _bug("non-atomic-ckpt"),
            ("restart/torn-write", "torchrun/torn-write"),
        ),
        Plant(
            "max-restarts-0", "restart framework: max_restarts 3 -> 0", _restart("max_restarts", 0), RESTART
        ),
    )
}


def derived_suite(repeats: int | tuple[int, int], plant: Plant | None = None) -> dict[str, Any]:
    """``suites/ci.yaml`` plus ``restart/hang-rank1``, ``repeats`` fixed repeats, with ``plant`` applied.
    ``repeats`` (MIN, MAX): ``{min: MIN, max: MAX, until: decided}`` and the suite's SLOs dropped (a scenario
    whose runs all met its SLOs is not settled before MAX: one more run could miss; without them the baseline
    alone decides when it stops)."""
    doc = yaml.safe_load(CI_SUITE.read_text())
    doc = copy.deepcopy(doc)
    doc["description"] = "suites/ci.yaml plus restart/hang-rank1, derived by benchmarks/gate_power.py"
    doc["faults"]["hang-rank1"] = dict(HANG)
    if isinstance(repeats, tuple):
        doc["matrix"]["repeats"] = {"min": repeats[0], "max": repeats[1], "until": "decided"}
        doc.pop("slos", None)
    else:
        doc["matrix"]["repeats"] = repeats
    doc["matrix"]["include"] = [{"frameworks": ["restart"], "faults": ["hang-rank1"]}]
    if plant is not None:
        plant.change(doc)
    return doc


@dataclass
class SetResult:
    name: str
    path: Path  # the suite's results directory (OUT/<set>/ci)
    rc: int
    wall_s: float
    runs: int


def _count_runs(suite_dir: Path) -> int:
    return sum(1 for _ in suite_dir.glob("*/*/result.json"))


def run_set(
    out: Path, name: str, doc: dict[str, Any], baseline_csv: Path | None, report_only: bool = False
) -> SetResult | None:
    """Run (or reuse, or resume) one result set; ``OUT/<name>/done.json`` marks it finished. ``report_only``:
    None for a set not finished, nothing is run."""
    here = out / name
    done = here / "done.json"
    suite_dir = here / str(doc["name"])
    if done.is_file():
        rec = json.loads(done.read_text())
        print(f"[{name}] reused: {rec['runs']} runs, {rec['wall_s']:.0f} s, exit {rec['rc']}", flush=True)
        return SetResult(name, suite_dir, int(rec["rc"]), float(rec["wall_s"]), int(rec["runs"]))
    if report_only:
        print(f"[{name}] not finished: left out", flush=True)
        return None
    here.mkdir(parents=True, exist_ok=True)
    suite_file = here / "suite.yaml"
    suite_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = [
        sys.executable,
        "-m",
        "chaosbench.cli",
        "run",
        str(suite_file),
        "--out",
        str(here),
        "--summary",
        str(here / "summary.md"),
    ]
    if baseline_csv is not None:
        argv += ["--baseline", str(baseline_csv)]
    earlier = 0.0
    partial = here / "partial.json"
    if suite_dir.exists():
        argv.append("--resume")
        if partial.is_file():
            earlier = float(json.loads(partial.read_text()).get("wall_s", 0.0))
    print(
        f"[{name}] running{' (resumed)' if earlier or suite_dir.exists() else ''}: {' '.join(argv[1:])}",
        flush=True,
    )
    t = time.monotonic()
    with open(here / "chaosbench.log", "a") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            rc = proc.wait()
        finally:
            partial.write_text(json.dumps({"wall_s": earlier + time.monotonic() - t}))
    wall = earlier + time.monotonic() - t
    if rc not in (0, 3, 4):
        sys.exit(f"[{name}] chaosbench run exited {rc}: see {here / 'chaosbench.log'}")
    runs = _count_runs(suite_dir)
    done.write_text(json.dumps({"rc": rc, "wall_s": wall, "runs": runs}))
    print(f"[{name}] done: {runs} runs, {wall:.0f} s, exit {rc}", flush=True)
    return SetResult(name, suite_dir, rc, wall, runs)


def verdict(baseline_rows: list[dict[str, Any]], res: SetResult) -> list[Any]:
    """The gate's comparisons of ``res`` against the baseline (:func:`chaosbench.analysis.baseline.compare`)."""
    from chaosbench.analysis.baseline import compare, load_rows
    from chaosbench.analysis.sequential import recorded_looks

    return compare(
        baseline_rows, load_rows(res.path), threshold=THRESHOLD, alpha=ALPHA, looks=recorded_looks(res.path)
    )


def _slo_misses(res: SetResult) -> int:
    from chaosbench.analysis.baseline import load_rows
    from chaosbench.analysis.values import as_bool

    return sum(1 for r in load_rows(res.path) if as_bool(r.get("slo_ok")) is False)


def _finding(d: Any) -> str:
    p = "" if d.p_worse is None else f", p {d.p_worse:.3g}"
    ph = "" if d.p_holm is None else f", p_holm {d.p_holm:.3g}"
    return (
        f"{d.key}: {d.metric} {d.values_text() if d.p_worse is not None else ''}{p}{ph}: {d.status.value}"
        + (f" ({d.note})" if d.note else "")
    )


def _report_until(until: list[tuple[SetResult, list[Any]]], fixed: list[tuple[SetResult, list[Any]]]) -> None:
    """Clean reruns repeated until decided against the fixed ones: runs, wall, the repeats each scenario took
    (``repeats.json``: how many and why it stopped), and whether the decisions were the same (no regression)."""
    for res, diffs in until:
        fails = [d for d in diffs if d.status.fails]
        rec = (
            json.loads((res.path / "repeats.json").read_text())
            if (res.path / "repeats.json").is_file()
            else {}
        )
        took = ", ".join(f"{k} {v.get('repeats')}" for k, v in sorted(rec.items()))
        print(
            f"clean rerun {res.name} (until decided, no SLOs): {len(fails)} false alarms; {res.runs} runs, "
            f"{res.wall_s:.0f} s, exit {res.rc}; repeats per scenario: {took or 'none recorded'}"
        )
        for d in fails:
            print(f"    {_finding(d)}")
    if fixed:
        runs = sum(r.runs for r, _ in fixed) / len(fixed)
        wall = sum(r.wall_s for r, _ in fixed) / len(fixed)
        u_runs = sum(r.runs for r, _ in until) / len(until)
        u_wall = sum(r.wall_s for r, _ in until) / len(until)
        print(
            f"until decided: {u_runs:.1f} runs, {u_wall:.0f} s per clean set on average; fixed repeats: "
            f"{runs:.1f} runs, {wall:.0f} s ({len(until)} and {len(fixed)} sets)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "gate-power"), help="result sets (resumable)")
    ap.add_argument("--baseline-repeats", type=int, default=10, help="the baseline's repeats per scenario")
    ap.add_argument("--repeats", type=int, default=4, help="repeats per scenario of every other set")
    ap.add_argument(
        "--plants", default="all", help=f"comma-separated, 'all' or 'none' (of: {', '.join(PLANTS)})"
    )
    ap.add_argument("--clean-reruns", type=int, default=10, help="clean reruns against the baseline")
    ap.add_argument(
        "--until",
        default=None,
        metavar="MIN:MAX",
        help="also clean reruns repeated until decided ({min: MIN, max: MAX, until: decided}, no SLOs)",
    )
    ap.add_argument("--until-reruns", type=int, default=2, help="how many such clean reruns (with --until)")
    ap.add_argument(
        "--power-only", action="store_true", help="print the power statement and stop (needs a baseline)"
    )
    ap.add_argument(
        "--report-only", action="store_true", help="run nothing: report the sets already finished"
    )
    args = ap.parse_args()
    names = (
        list(PLANTS)
        if args.plants == "all"
        else []
        if args.plants == "none"
        else [n.strip() for n in args.plants.split(",") if n.strip()]
    )
    unknown = [n for n in names if n not in PLANTS]
    if unknown:
        sys.exit(f"unknown plants: {', '.join(unknown)} (known: {', '.join(PLANTS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(
        f"gate power: suites/ci.yaml + restart/hang-rank1 (derived here), baseline {args.baseline_repeats} "
        f"repeats, every other set {args.repeats} fixed repeats per scenario; plants: {', '.join(names) or 'none'}; "
        f"clean reruns: {args.clean_reruns}",
        flush=True,
    )

    from chaosbench.analysis.baseline import load_rows, save_baseline
    from chaosbench.analysis.power import power

    base_name = f"baseline-r{args.baseline_repeats}"
    base = run_set(out, base_name, derived_suite(args.baseline_repeats), None, args.report_only)
    if base is None:
        sys.exit("no finished baseline")
    base_csv = out / base_name / "baseline.csv"
    if not base_csv.is_file():
        save_baseline(base.path, base_csv)
    base_rows = load_rows(base_csv)
    keys = {str(r["scenario"]) for r in base_rows if str(r.get("control")).lower() not in ("true", "1")}
    for line in power(base_rows, dict.fromkeys(keys, args.repeats), alpha=ALPHA, threshold=THRESHOLD).lines():
        print(line, flush=True)
    if args.power_only:
        return

    sets: list[tuple[str, Plant | None]] = [(f"plant-{n}-r{args.repeats}", PLANTS[n]) for n in names]
    sets += [(f"clean-{i}-r{args.repeats}", None) for i in range(1, args.clean_reruns + 1)]
    results: list[tuple[SetResult, Plant | None, list[Any]]] = []
    for name, plant in sets:
        res = run_set(out, name, derived_suite(args.repeats, plant), base_csv, args.report_only)
        if res is not None:
            results.append((res, plant, verdict(base_rows, res)))
    until: list[tuple[SetResult, list[Any]]] = []
    if args.until:
        lo, hi = (int(x) for x in args.until.split(":"))
        for i in range(1, args.until_reruns + 1):
            res = run_set(
                out, f"clean-until-{lo}-{hi}-{i}", derived_suite((lo, hi)), base_csv, args.report_only
            )
            if res is not None:
                until.append((res, verdict(base_rows, res)))

    print()
    print(
        f"== gate power: baseline {args.baseline_repeats} repeats ({base.runs} runs, {base.wall_s:.0f} s) vs "
        f"{args.repeats} repeats per set; alpha {ALPHA} over the whole verdict (Holm), threshold {THRESHOLD:.0%}"
    )
    caught = 0
    for res, plant, diffs in results:
        if plant is None:
            continue
        fails = [d for d in diffs if d.status.fails]
        inside = [d for d in fails if d.key in plant.scenarios]
        caught += bool(inside)
        family = sum(1 for d in diffs if d.in_family)
        print(
            f"plant {plant.name} ({plant.what}): {'CAUGHT' if inside else 'NOT CAUGHT'} "
            f"({len(inside)} failing comparisons in its scenarios, family {family}; {res.runs} runs, "
            f"{res.wall_s:.0f} s, exit {res.rc}, {_slo_misses(res)} SLO misses)"
        )
        for d in inside:
            print(f"    {_finding(d)}")
        for d in fails:
            if d not in inside:
                print(f"    outside the plant's scenarios: {_finding(d)}")
        if not inside:
            # why not: what moved the bad way in its scenarios, beyond its noise floor or inside it
            near = sorted(
                (
                    d
                    for d in diffs
                    if d.key in plant.scenarios and (d.adverse or d.status.value == "within noise")
                ),
                key=lambda d: (not d.adverse, d.p_worse if d.p_worse is not None else 1.0),
            )
            for d in near[:8]:
                print(f"    moved the bad way: {_finding(d)}")
            if not near:
                print("    no figure of its scenarios moved the bad way")
    n_plants = sum(1 for _, p, _ in results if p is not None)
    if n_plants:
        print(f"plants caught: {caught}/{n_plants}")
    alarms_total = 0
    n_clean = 0
    for res, plant, diffs in results:
        if plant is not None:
            continue
        n_clean += 1
        fails = [d for d in diffs if d.status.fails]
        alarms_total += bool(fails)
        undecided = sum(1 for d in diffs if d.status.value == "undecided")
        family = sum(1 for d in diffs if d.in_family)
        print(
            f"clean rerun {res.name}: {len(fails)} false alarms (family {family}, {undecided} undecided; "
            f"{res.runs} runs, {res.wall_s:.0f} s, exit {res.rc}, {_slo_misses(res)} SLO misses)"
        )
        for d in fails:
            print(f"    {_finding(d)}")
    if n_clean:
        print(f"clean reruns with a false alarm: {alarms_total}/{n_clean}")
    if until:
        _report_until(until, [(r, d) for r, p, d in results if p is None])
    runs = base.runs + sum(r.runs for r, _, _ in results) + sum(r.runs for r, _ in until)
    wall = base.wall_s + sum(r.wall_s for r, _, _ in results) + sum(r.wall_s for r, _ in until)
    print(
        f"runs: {runs} (baseline {base.runs}); wall of the chaosbench runs {wall:.0f} s ({wall / 60:.1f} min); "
        f"this invocation {time.monotonic() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
