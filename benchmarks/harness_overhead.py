"""What does running under chaosbench cost in wall time, against the same launch run bare? Prints figures; asserts
nothing. Goal: harness / bare <= 1.05.

A small suite (ddp-mlp on ``--ranks`` local ranks, ``--steps`` steps, no fault: the control run only, framework
``--framework``) runs through ``chaosbench run`` as a subprocess. The run's launch plan is then read from its
``config.json`` and the same processes are started bare with :mod:`subprocess` (same argv, same environment:
this process's plus the plan's; only the per-run paths (events file, run and checkpoint directories) and the
rendezvous port are fresh ones, and output goes to files as the harness's capture does). Harness and bare runs
alternate (harness first, then bare first, ...), ``--repeats`` times. Three walls are printed:

- ``run_s``: the run's own wall on its timeline, ``run_start`` to ``run_end`` (planning events, launch,
  supervision, teardown and the leftover check): the fair comparison with the bare launch, ``bare_s`` (first
  process started to last one exited);
- ``ranks_s``: under the harness, first ``proc_start`` to last ``proc_exit`` (the processes' own span);
- ``cli_s``: the whole ``chaosbench run`` command, interpreter start, suite loading, metrics and report writing
  included (a fixed cost per suite and per run, not per step).

Usage::

    python benchmarks/harness_overhead.py [--repeats 3] [--steps 200] [--ranks 2] [--framework none|restart]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from chaosbench.timeline import read_events

GOAL_RATIO = 1.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def suite_text(args: argparse.Namespace) -> str:
    return textwrap.dedent(f"""
    name: harness-overhead
    control: true
    defaults:
      deadline_s: 300
      workload: {{name: ddp-mlp, ranks: {args.ranks}, steps: {args.steps}, checkpoint_every: 0,
                  step_sleep_s: {args.step_sleep_s}}}
    frameworks: {{{args.framework}: {{}}}}
    matrix: {{frameworks: [{args.framework}], faults: [], repeats: 1}}
    """)


def run_harness(suite: Path, out: Path) -> tuple[float, Path]:
    """``chaosbench run`` of ``suite`` into ``out``: its wall (s) and the control run's directory."""
    t = time.perf_counter()
    with (out.parent / f"{out.name}.log").open("wb") as log:
        rc = subprocess.run(
            [sys.executable, "-m", "chaosbench.cli", "run", "--out", str(out), str(suite)],
            stdout=log,
            stderr=subprocess.STDOUT,
        ).returncode
    wall = time.perf_counter() - t
    runs = sorted(out.glob("*/*/*/config.json"))
    if rc != 0 or len(runs) != 1:
        raise SystemExit(
            f"chaosbench run failed (exit {rc}, {len(runs)} runs); see {out.parent / out.name}.log"
        )
    return wall, runs[0].parent


def harness_walls(run_dir: Path) -> tuple[float, float]:
    """``run_start`` to ``run_end``, and first ``proc_start`` to last ``proc_exit``, on the run's timeline (s)."""
    ev = read_events(run_dir / "events.jsonl")
    t = {k: [e.t_ns for e in ev if e.kind == k] for k in ("run_start", "run_end", "proc_start", "proc_exit")}
    return (t["run_end"][-1] - t["run_start"][0]) / 1e9, (max(t["proc_exit"]) - min(t["proc_start"])) / 1e9


def bare_processes(run_dir: Path, fresh: Path) -> list[tuple[list[str], dict[str, str]]]:
    """The plan's processes of ``run_dir``, their per-run paths moved into ``fresh`` and a new rendezvous port."""
    plan: dict[str, Any] = json.loads((run_dir / "config.json").read_text())["plan"]
    old, port = str(run_dir), str(free_port())
    out = []
    for p in plan["processes"]:
        env = {k: (v.replace(old, str(fresh)) if isinstance(v, str) else str(v)) for k, v in p["env"].items()}
        if "MASTER_PORT" in env:
            env["MASTER_PORT"] = port
        out.append(([a.replace(old, str(fresh)) for a in p["argv"]], {**os.environ, **env}))
    return out


def run_bare(procs: list[tuple[list[str], dict[str, str]]], fresh: Path) -> float:
    """Start every process as planned, wait for all; wall (s) from the first start to the last exit."""
    (fresh / "logs").mkdir(parents=True)
    t = time.perf_counter()
    running = []
    for i, (argv, env) in enumerate(procs):
        with (
            (fresh / "logs" / f"p{i}.out").open("wb") as out,
            (fresh / "logs" / f"p{i}.err").open("wb") as err,
        ):
            running.append(
                subprocess.Popen(
                    argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
                )
            )
    rcs = [p.wait() for p in running]
    wall = time.perf_counter() - t
    if any(rcs):
        raise SystemExit(f"a bare process failed (exit codes {rcs}); see {fresh / 'logs'}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--step-sleep-s", type=float, default=0.02, help="the workload's emulated extra compute per step"
    )
    ap.add_argument("--framework", choices=["none", "restart"], default="none")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="harness-overhead-") as tmp_s:
        tmp = Path(tmp_s)
        suite = tmp / "suite.yaml"
        suite.write_text(suite_text(args))
        # the launch command comes from a harness run's plan: one first, outside the measurement
        _, first = run_harness(suite, tmp / "plan")
        procs = bare_processes(first, tmp / "bare-plan")
        print(
            f"{args.framework}: ddp-mlp, {args.ranks} ranks, {args.steps} steps, step_sleep_s {args.step_sleep_s:g}; "
            f"launch: {' '.join(procs[0][0][:3])} ... x{len(procs)}"
        )
        print(
            f"{'rep':>3} {'cli_s':>7} {'run_s':>7} {'ranks_s':>8} {'bare_s':>7} {'run/bare':>9} {'cli/bare':>9}"
        )
        rows = []
        for i in range(args.repeats):
            out, fresh = tmp / f"h{i}", tmp / f"b{i}"
            first_harness = i % 2 == 0
            if first_harness:
                cli, run_dir = run_harness(suite, out)
            bare = run_bare(bare_processes(first, fresh), fresh)
            if not first_harness:
                cli, run_dir = run_harness(suite, out)
            run, ranks = harness_walls(run_dir)
            rows.append((cli, run, ranks, bare))
            print(
                f"{i:>3} {cli:>7.2f} {run:>7.2f} {ranks:>8.2f} {bare:>7.2f} {run / bare:>9.3f} {cli / bare:>9.3f}"
            )
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(fresh, ignore_errors=True)
    cli, run, ranks, bare = (statistics.median(c) for c in zip(*rows, strict=True))
    run_ratio = statistics.median(r[1] / r[3] for r in rows)
    cli_ratio = statistics.median(r[0] / r[3] for r in rows)
    print(
        f"{'med':>3} {cli:>7.2f} {run:>7.2f} {ranks:>8.2f} {bare:>7.2f} {run_ratio:>9.3f} {cli_ratio:>9.3f}"
    )
    print(
        f"harness overhead: run wall / bare wall {run_ratio:.3f} (whole chaosbench run / bare {cli_ratio:.3f}, "
        f"+{cli - bare:.2f} s) vs goal <= {GOAL_RATIO:g}: {'met' if run_ratio <= GOAL_RATIO else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
