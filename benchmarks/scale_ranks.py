"""Does chaosbench keep up with many local ranks, and what share of the CPU does the harness itself take? Prints
figures; asserts nothing. Goal: the harness's own CPU share < 5 %.

One run (``--control`` adds a fault-free one first): ddp-mlp on ``--ranks`` local ranks on one node (gloo; a tiny
model, few steps: every rank imports torch, which dominates on a small machine), rank 1 SIGKILLed after step
``--kill-at-step`` under the ``restart`` framework (which relaunches all ranks from the last checkpoint). The suite
runs inside this process (:class:`~chaosbench.runner.Runner`), so the harness is this process: its CPU time (user
+ system, all its threads: pumps, waiters, the timeline follower, supervision, the end-of-run metrics) comes from
``getrusage(RUSAGE_SELF)`` and the ranks' from ``getrusage(RUSAGE_CHILDREN)`` (every rank is a child of the
harness and is reaped by it, so all of each rank's CPU time is counted once it has exited), both taken around
the suite. Two shares are printed:

- harness CPU / (harness + ranks CPU): its share of the work the run caused;
- harness CPU / (wall x cores): its share of the machine over the run's wall.

Usage::

    python benchmarks/scale_ranks.py [--ranks 32] [--steps 30] [--kill-at-step 15] [--control]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import textwrap
import time

from chaosbench.analysis.results import collect
from chaosbench.runner import Runner
from chaosbench.specs import load_yaml_text, suite_from_data

GOAL_SHARE = 0.05


def suite_text(args: argparse.Namespace) -> str:
    return textwrap.dedent(f"""
    name: scale-ranks
    control: {str(args.control).lower()}
    defaults:
      deadline_s: {args.deadline_s}
      workload: {{name: ddp-mlp, ranks: {args.ranks}, steps: {args.steps}, checkpoint_every: {args.checkpoint_every},
                  hidden: 8, layers: 1, batch_size: 4, step_sleep_s: 0.02, pg_timeout_s: 120}}
    frameworks:
      restart: {{max_restarts: 2, heartbeat_timeout_s: 60, startup_timeout_s: {args.deadline_s / 2:g}}}
    faults:
      kill-rank1: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: {args.kill_at_step}}}}}
    matrix: {{frameworks: [restart], faults: [kill-rank1], repeats: 1}}
    """)


def cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--kill-at-step", type=int, default=15)
    ap.add_argument("--deadline-s", type=float, default=900)
    ap.add_argument("--control", action="store_true", help="run a fault-free control first")
    args = ap.parse_args()
    data, smap = load_yaml_text(suite_text(args), "<scale-ranks>")
    suite = suite_from_data(data, smap)
    cores = len(os.sched_getaffinity(0))

    with tempfile.TemporaryDirectory(prefix="scale-ranks-") as out:
        runner = Runner(suite, out, progress=lambda s: print(s, flush=True))
        self0, children0, t0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), time.monotonic()
        records = runner.run()
        harness = cpu_s(resource.RUSAGE_SELF) - self0
        ranks = cpu_s(resource.RUSAGE_CHILDREN) - children0
        wall = time.monotonic() - t0
        metrics = collect(runner.suite_dir, write=False)
        leftovers = [pid for r in records for pid in r.leftovers]

    print(f"\n{'run':<22} {'outcome':<14} {'detect_s':>9} {'resume_s':>9} {'restarts':>9} {'lost_steps':>11}")
    for m in metrics:
        print(
            f"{str(m.scenario):<22} {m.outcome or '-':<14} {_f(m.time_to_detect_s):>9} "
            f"{_f(m.time_to_resume_s):>9} {_f(m.restart_count):>9} {_f(m.lost_steps):>11}"
        )
    print(f"leftover processes: {len(leftovers)}")
    print(
        f"\n{'ranks':>5} {'cores':>5} {'wall_s':>8} {'harness_cpu_s':>14} {'ranks_cpu_s':>12} "
        f"{'share_of_run_%':>15} {'share_of_machine_%':>19}"
    )
    of_run = harness / (harness + ranks) if harness + ranks > 0 else float("nan")
    of_machine = harness / (wall * cores)
    print(
        f"{args.ranks:>5} {cores:>5} {wall:>8.1f} {harness:>14.2f} {ranks:>12.2f} {of_run * 100:>15.2f} "
        f"{of_machine * 100:>19.2f}"
    )
    recovered = [m.outcome for m in metrics if m.fault] == ["recovered"]
    print(
        f"harness CPU share with {args.ranks} ranks: {of_run * 100:.2f} % of the run's CPU, {of_machine * 100:.2f} % "
        f"of the machine ({'recovered' if recovered else 'NOT recovered'}) vs goal < {GOAL_SHARE * 100:g} %: "
        f"{'met' if max(of_run, of_machine) < GOAL_SHARE else 'NOT met'}"
    )


def _f(v: object) -> str:
    return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


if __name__ == "__main__":
    main()
