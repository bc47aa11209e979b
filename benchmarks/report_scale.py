"""How does report generation scale with the number of runs? Prints figures; asserts nothing.

Builds synthetic suites of N runs in a temporary directory, laid out as a real one (``suite.json``, one run
directory per run in the :class:`chaosbench.rundir.RunDir` layout, ``results.csv`` and ``results.parquet`` written
by :func:`chaosbench.analysis.results.write_table` from :class:`~chaosbench.analysis.metrics.RunMetrics`): 5
frameworks x (9 faults + a control), repeats spread evenly, realistic outcomes, verdicts, missing metrics with
their reasons, SLO misses, timeouts and versions. A few runs (``--events``) get a synthetic ``events.jsonl``
and their ``timeline.png`` drawn by :func:`chaosbench.report.plots.draw_run_timeline` (timed: the runner pays
this once per run when it ends); with ``--png all`` (default) every other run gets a hard link to one of those
PNGs, so the report links a plot for every run, as after a real suite.

Then times ``load_results`` + ``write_report`` (plots="existing": link only), median of ``--repeat`` rounds,
for every size asked, and prints them side by side with the time per run (linear: the per-run figure stays
flat) and the sizes of report.html and report.md. Usage::

    python benchmarks/report_scale.py [--runs 1000 10000] [--repeat 3] [--events 20] [--png all|drawn|none]
                                      [--keep DIR] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chaosbench.analysis.metrics import RunMetrics, verdict
from chaosbench.analysis.results import load_results, write_table
from chaosbench.rundir import RunDir
from chaosbench.timeline import TimelineWriter

FRAMEWORKS = ["restart", "torchrun", "torchft", "nvrx", "elastic"]
#: fault name -> fleet fault class (None: not in the projection's mix)
FAULTS = {
    "kill-rank1": "crash",
    "kill-agent0": "crash",
    "hang-rank1": "hang",
    "sigstop-rank0": "hang",
    "node-kill": "node",
    "node-pause": "node",
    "sdc-flip": "sdc",
    "corrupt-checkpoint": None,
    "slow-rank1": None,
}
SUITE = "scale"
DEFINITION = {"name": SUITE, "defaults": {"workload": {"name": "ddp-mlp", "checkpoint_every": 10}}}
S = 1_000_000_000


def synthetic_metrics(suite_dir: Path, n_runs: int, seed: int = 0) -> list[RunMetrics]:
    """``n_runs`` RunMetrics as the runner would record them, repeats spread evenly over the scenarios."""
    rng = random.Random(seed)
    scenarios = [(fw, None) for fw in FRAMEWORKS] + [(fw, f) for fw in FRAMEWORKS for f in FAULTS]
    repeat_of: dict[str, int] = {}
    out = []
    for i in range(n_runs):
        fw, fault = scenarios[i % len(scenarios)]
        sid = f"{fw}/{fault or 'control'}"
        rep = repeat_of[sid] = repeat_of.get(sid, -1) + 1
        m = RunMetrics(
            suite=SUITE,
            scenario=sid,
            framework=fw,
            fault=fault,
            repeat=rep,
            control=fault is None,
            run_dir=str(RunDir.at(suite_dir, sid, rep).path),
        )
        _fill(m, rng, FAULTS.get(fault or ""))
        m.verdict = verdict(m)
        out.append(m)
    return out


def _maybe(rng: random.Random, m: RunMetrics, name: str, value: float, p_missing: float, why: str) -> None:
    if rng.random() < p_missing:
        m.missing[name] = why
    else:
        setattr(m, name, value)


def _fill(m: RunMetrics, rng: random.Random, fault_class: str | None) -> None:
    m.versions = {"torch": "2.5.1", "python": "3.11.9", "chaosbench": "0.1.0"}
    m.timeouts = {"detect_deadline": 60, "restart_delay": 0.5, "pg_timeout": 30.0, "heartbeat": 5.0}
    m.wall_s = rng.uniform(20, 40)
    m.step_time_s = rng.uniform(0.05, 0.2)
    m.checkpoint_save_s = rng.uniform(0.01, 0.1)
    m.final_step = 100
    m.final_loss = rng.uniform(0.01, 0.1)
    m.digest = f"{rng.getrandbits(64):016x}"
    m.clock_offset_bound_s = rng.uniform(1e-5, 1e-3) if rng.random() < 0.3 else None
    if m.control:
        m.outcome = m.run_end_outcome = "completed"
        m.clean, m.false_detections, m.restart_count, m.restarts_claimed = True, 0, 0, 0
        m.productive_s = m.wall_s * 0.9
        m.goodput = 0.9
        for name in ("time_to_detect_s", "time_to_resume_s", "lost_steps"):
            m.missing[name] = "no fault in a control run"
        return
    r = rng.random()
    m.fault_class = fault_class
    m.fault_count = 1
    m.fault_step, m.trigger_step = 20, 20
    m.fault_t_s = rng.uniform(3, 6)
    _maybe(rng, m, "injection_latency_s", rng.uniform(1e-3, 5e-2), 0.05, "no effect stamp from the injector")
    m.predicted_detect_s = rng.uniform(1, 30) if rng.random() < 0.7 else None
    m.predicted_by = "pg_timeout" if m.predicted_detect_s is not None else None
    if m.predicted_detect_s is None:
        m.missing["predicted_detect_s"] = "the adapter has no model for this fault"
    if r < 0.05:
        m.outcome, m.run_end_outcome = "fault_not_fired", "completed"
        m.missing["time_to_detect_s"] = "the fault did not fire"
        return
    m.detected = rng.random() < 0.92
    m.detected_via = rng.choice(
        ["process exit", "process-group timeout", "step watchdog", "framework heartbeat"]
    )
    m.detected_by = m.framework
    m.blame = rng.choice(["correct", "correct", "correct", "wrong", "none"]) if m.detected else None
    m.blamed = "rank 1" if m.blame in ("correct", "wrong") else None
    m.false_detections = 1 if rng.random() < 0.02 else 0
    if m.detected:
        m.time_to_detect_s = rng.lognormvariate(0.5, 1.0)
        m.detect_t_s = m.fault_t_s + m.time_to_detect_s
        m.badput_detect_s = m.time_to_detect_s
    else:
        m.missing["time_to_detect_s"] = "no detect event before the run ended"
    m.recovered = r < 0.82
    m.restart_count = m.restarts_claimed = rng.choice([1, 1, 1, 2]) if m.recovered else rng.choice([0, 3])
    m.rollback = m.framework != "torchft"
    if m.recovered:
        m.outcome, m.run_end_outcome = "recovered", "completed"
        m.time_to_resume_s = (m.time_to_detect_s or 0) + rng.uniform(2, 15)
        m.resume_t_s = m.fault_t_s + m.time_to_resume_s
        m.time_to_catch_up_s = m.time_to_resume_s + rng.uniform(0, 3)
        m.time_to_rejoin_s = m.time_to_resume_s
        m.lost_steps = rng.randint(0, 9)
        m.lost_work_s = m.lost_steps * m.step_time_s
        m.checkpoint_age_s = rng.uniform(0, 2)
        m.badput_restart_init_s = rng.uniform(1, 10)
        _maybe(
            rng, m, "badput_restore_s", rng.uniform(0.1, 1), 0.1, "no ckpt_load events in the new incarnation"
        )
        _maybe(rng, m, "badput_recompute_s", rng.uniform(0, 2), 0.3, "no step recomputed after restore")
        m.extra_wall_s = m.time_to_resume_s + rng.uniform(-1, 2)
        m.productive_s = m.wall_s * rng.uniform(0.5, 0.85)
        m.goodput = m.productive_s / m.wall_s
        m.fidelity = "exact" if rng.random() < 0.9 else "diverged"
        m.loss_diff = 0.0 if m.fidelity == "exact" else rng.uniform(-1e-3, 1e-3)
        m.failure_class = "transient"
        m.ranks_agree = True
    else:
        m.outcome, m.run_end_outcome = "not_recovered", rng.choice(["deadline", "failed"])
        m.gave_up = rng.random() < 0.3
        m.time_burned_s = m.wall_s - m.fault_t_s
        for name in ("time_to_resume_s", "lost_steps", "goodput", "fidelity"):
            m.missing[name] = "training did not finish"
    m.slo_ok = m.recovered and (m.time_to_resume_s or 0) < 20
    if not m.slo_ok:
        m.slo_failures = [f"time_to_resume_s {m.time_to_resume_s or 'missing'} > 20 s"]
    if rng.random() < 0.01:
        m.timeout_problems = ["pg_timeout (30 s) is shorter than the checkpoint save (45 s)"]


def write_events(run_dir: Path, m: RunMetrics) -> None:
    """A small two-rank timeline consistent with ``m``: steps, a checkpoint, the fault, detection and restart."""
    t0 = 1_700_000_000 * S
    fault = m.fault_t_s if m.fault_t_s is not None else None
    with TimelineWriter(run_dir / "events.jsonl") as tl:
        tl.emit(
            "run_start", t_ns=t0, suite=m.suite, scenario=m.scenario, repeat=m.repeat, framework=m.framework
        )
        tl.emit("proc_start", t_ns=t0 + S // 10, proc="job", pid=100, role="job", node="node0", incarnation=0)
        for rank in (0, 1):
            tl.emit(
                "rank_start",
                t_ns=t0 + S // 5,
                src="rank",
                rank=rank,
                pid=1000 + rank,
                world_size=2,
                node="node0",
                incarnation=0,
            )
        end = (m.wall_s or 20.0) * S
        step, inc, t = 0, 0, S // 2
        while t < end - S:
            if fault is not None and inc == 0 and t > fault * S:
                tl.emit(
                    "fault_inject",
                    t_ns=t0 + int(fault * S),
                    fault=m.fault,
                    injector="kill",
                    target=[{"rank": 1}],
                )
                if m.detect_t_s is not None:
                    tl.emit(
                        "detect", t_ns=t0 + int(m.detect_t_s * S), framework=m.framework, reason="job exited"
                    )
                if m.resume_t_s is None:
                    break
                inc, t = 1, int(m.resume_t_s * S)
                tl.emit("restart", t_ns=t0 + t - S, framework=m.framework, attempt=1, reason="job exited")
                step = max(0, step - (m.lost_steps or 0))
            step += 1
            for rank in (0, 1):
                tl.emit(
                    "step", t_ns=t0 + t, src="rank", rank=rank, step=step, loss=1.0 / step, incarnation=inc
                )
            if step % 10 == 0:
                tl.emit(
                    "ckpt_save_end",
                    t_ns=t0 + t + S // 20,
                    src="rank",
                    rank=0,
                    step=step,
                    complete=True,
                    incarnation=inc,
                )
            t += S // 2
        tl.emit("run_end", t_ns=t0 + int(end), outcome=m.run_end_outcome or "completed", reason="")


def build_suite(root: Path, n_runs: int, n_events: int, png: str) -> tuple[Path, list[float]]:
    """A suite directory of ``n_runs`` runs below ``root``; returns it and the seconds each drawn PNG took."""
    from chaosbench.report.plots import TIMELINE_PNG, draw_run_timeline

    suite_dir = root / f"{SUITE}-{n_runs}"
    suite_dir.mkdir(parents=True)
    (suite_dir / "suite.json").write_text(json.dumps({"suite": SUITE, "definition": DEFINITION}))
    metrics = synthetic_metrics(suite_dir, n_runs)
    t = time.perf_counter()
    write_table(suite_dir, metrics)
    print(f"  {n_runs} runs: write_table {time.perf_counter() - t:.2f} s (the runner's side, once)")
    draw_s: list[float] = []
    drawn: list[Path] = []
    # Spread the drawn runs over the scenarios (every 50th run is the next scenario's next repeat).
    step = max(1, n_runs // max(n_events, 1))
    for i, m in enumerate(metrics):
        run_dir = Path(m.run_dir or "")
        run_dir.mkdir(parents=True, exist_ok=True)
        if len(drawn) < n_events and i % step == 0:
            write_events(run_dir, m)
            t = time.perf_counter()
            path, why = draw_run_timeline(run_dir, m)
            draw_s.append(time.perf_counter() - t)
            if path is None:
                print(f"  timeline of {run_dir} not drawn: {why}")
            else:
                drawn.append(path)
    if png == "all" and drawn:
        for i, m in enumerate(metrics):
            target = Path(m.run_dir or "") / TIMELINE_PNG
            if not target.exists():
                os.link(drawn[i % len(drawn)], target)
    return suite_dir, draw_s


def time_report(suite_dir: Path, repeat: int) -> tuple[list[float], list[float], list[float]]:
    """Wall seconds of load_results and of write_report, and the CPU seconds of both, per round."""
    from chaosbench.report import write_report

    loads, reports, cpus = [], [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        df = load_results(suite_dir)
        t1 = time.perf_counter()
        write_report(suite_dir, df)
        t2 = time.perf_counter()
        loads.append(t1 - t0)
        reports.append(t2 - t1)
        cpus.append(time.process_time() - c0)
    return loads, reports, cpus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--runs", type=int, nargs="+", default=[1000, 10000], help="suite sizes (default 1000 10000)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds per size; the median is shown (default 3)")
    ap.add_argument(
        "--events", type=int, default=20, help="runs given a timeline and a drawn PNG (default 20)"
    )
    ap.add_argument(
        "--png",
        choices=["all", "drawn", "none"],
        default="all",
        help="all: every run links a PNG (hard links to the drawn ones); drawn: only the drawn runs; "
        "none: no PNG at all (default all)",
    )
    ap.add_argument("--keep", type=Path, help="build the suites here and keep them (default: a temp dir)")
    ap.add_argument(
        "--profile", action="store_true", help="print a cProfile of one round at the largest size"
    )
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="cb-report-scale-") as tmp:
        root = args.keep or Path(tmp)
        print(f"building suites in {root}")
        rows = []
        all_draws: list[float] = []
        for n in args.runs:
            suite_dir, draws = build_suite(root, n, 0 if args.png == "none" else args.events, args.png)
            all_draws += draws
            import pyarrow.parquet as pq  # the read side's time includes pandas' import only once, as in the CLI

            pq.read_metadata(suite_dir / "results.parquet")
            loads, reports, cpus = time_report(suite_dir, args.repeat)
            html = (suite_dir / "report.html").stat().st_size
            md = (suite_dir / "report.md").stat().st_size
            rows.append(
                (n, statistics.median(loads), statistics.median(reports), statistics.median(cpus), html, md)
            )
        if args.profile:
            from chaosbench.report import write_report

            df = load_results(suite_dir)
            prof = cProfile.Profile()
            prof.runcall(write_report, suite_dir, df)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(35)

    print(
        f"\nload_results + write_report (plots='existing'), median of {args.repeat} rounds (wall seconds; CPU "
        f"seconds of this process beside them, steadier on a shared machine; load avg {os.getloadavg()[0]:.1f}):"
    )
    print(
        f"{'runs':>8} {'load s':>8} {'report s':>9} {'total s':>8} {'cpu s':>7} {'ms/run':>7} {'report.html':>12} "
        f"{'report.md':>11}"
    )
    for n, load, report, cpu, html, md in rows:
        total = load + report
        print(
            f"{n:>8} {load:>8.3f} {report:>9.3f} {total:>8.3f} {cpu:>7.3f} {total / n * 1e3:>7.3f} "
            f"{html / 1e6:>9.2f} MB {md / 1e6:>8.2f} MB"
        )
    for (n1, l1, r1, c1, _, _), (n2, l2, r2, c2, _, _) in zip(rows, rows[1:], strict=False):
        print(
            f"from {n1} to {n2} runs: {(l2 + r2 - l1 - r1) / (n2 - n1) * 1e3:.3f} ms wall, "
            f"{(c2 - c1) / (n2 - n1) * 1e3:.3f} ms CPU per added run (the rest is fixed: matplotlib's import, the "
            "suite-level figures, the fleet projection)"
        )
    if all_draws:
        print(
            f"\ndraw_run_timeline, one run's PNG: median {statistics.median(all_draws):.3f} s, "
            f"max {max(all_draws):.3f} s over {len(all_draws)} runs (the first includes matplotlib's import)"
        )
    else:
        print("\ndraw_run_timeline: not timed (no run given a timeline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
