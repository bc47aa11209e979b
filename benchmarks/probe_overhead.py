"""What does the probe (:mod:`chaosbench.probe`: the events a training program writes per step) cost? Prints
figures; asserts nothing. Goal: <= 1 % of the step time.

Two measurements:

1. A/B on real ranks: the ddp-mlp workload on 2 ranks (gloo), launched directly (no harness), with the probe on
   (``CHAOSBENCH_EVENTS`` names an events file, as in a chaosbench run) and off (no ``CHAOSBENCH_EVENTS``: the
   probe's documented disabled state, every call a no-op). Rank 0's ``step <n> loss <x>`` lines are stamped as
   this script reads them; the step time of a run is the median interval between consecutive lines after
   ``--warmup`` steps. Arms alternate (on/off, then off/on, ...) so drifting load hits both alike; each pair
   gives a relative overhead, and the median over pairs is the figure. The default ``--step-sleep-s 0`` is the
   harshest case: the step is only the tiny MLP's compute and its allreduce.
2. Microbenchmark: the cost of one ``Probe.step`` call (one JSON line appended to an events file) in this
   process, enabled and disabled, against the step time measured in 1.

Usage::

    python benchmarks/probe_overhead.py [--pairs 4] [--steps 400] [--step-sleep-s 0] [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaosbench.probe import ENV_EVENTS, Probe

GOAL_RATIO = 0.01


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(probe_on: bool, args: argparse.Namespace, tmp: Path) -> list[float]:
    """One 2-rank ddp-mlp run; returns rank 0's step intervals (s) after the warmup steps."""
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    argv = [
        sys.executable,
        "-m",
        "chaosbench.workloads.ddp_mlp",
        "--steps",
        str(args.steps),
        "--checkpoint-every",
        "0",
        "--step-sleep-s",
        str(args.step_sleep_s),
        "--seed",
        "0",
        "--ckpt-dir",
        str(run_dir / "ckpt"),
    ]
    base = {k: v for k, v in os.environ.items() if k != ENV_EVENTS}
    base.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "WORLD_SIZE": str(args.ranks),
            "LOCAL_WORLD_SIZE": str(args.ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )
    if probe_on:
        base[ENV_EVENTS] = str(run_dir / "events.jsonl")
    procs = []
    for rank in range(args.ranks):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        out = subprocess.PIPE if rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.DEVNULL))
    stamps: list[int] = []
    assert procs[0].stdout is not None
    for line in procs[0].stdout:
        if line.startswith(b"step "):
            stamps.append(time.perf_counter_ns())
    rcs = [p.wait() for p in procs]
    if any(rcs):
        raise SystemExit(f"a rank failed (exit codes {rcs}); see {run_dir}")
    stamps = stamps[args.warmup :]
    return [(b - a) / 1e9 for a, b in zip(stamps, stamps[1:], strict=False)]


def per_call_s(probe: Probe, calls: int, batches: int = 5) -> float:
    """Median over ``batches`` of the mean seconds one ``probe.step`` call takes."""
    out = []
    for _ in range(batches):
        t = time.perf_counter()
        for i in range(calls):
            probe.step(i, 0.125, duration_s=0.001)
        out.append((time.perf_counter() - t) / calls)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs of runs (each arm runs this often)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400, help="steps per run")
    ap.add_argument("--warmup", type=int, default=20, help="steps left out at the start of each run")
    ap.add_argument(
        "--step-sleep-s", type=float, default=0.0, help="the workload's emulated extra compute per step"
    )
    ap.add_argument("--calls", type=int, default=20000, help="probe calls per microbenchmark batch")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="probe-overhead-") as tmp:
        print(
            f"A/B: ddp-mlp, {args.ranks} ranks, {args.steps} steps, step_sleep_s {args.step_sleep_s:g}, "
            f"{args.pairs} pairs (interleaved)"
        )
        print(f"{'pair':>4} {'on_ms':>8} {'off_ms':>8} {'overhead_%':>11}")
        on_all, off_all, ratios = [], [], []
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            med = {arm: statistics.median(run_ranks(arm, args, Path(tmp))) for arm in order}
            on_all.append(med[True])
            off_all.append(med[False])
            ratios.append(med[True] / med[False] - 1)
            print(f"{i:>4} {med[True] * 1e3:>8.3f} {med[False] * 1e3:>8.3f} {ratios[-1] * 100:>11.2f}")
        step_s = statistics.median(off_all)
        print(
            f"{'med':>4} {statistics.median(on_all) * 1e3:>8.3f} {step_s * 1e3:>8.3f} "
            f"{statistics.median(ratios) * 100:>11.2f}"
        )

        on = per_call_s(Probe(str(Path(tmp) / "micro.jsonl"), rank=0, world_size=2), args.calls)
        off = per_call_s(Probe(None), args.calls)
    print(
        f"\nmicrobenchmark: Probe.step {on * 1e6:.2f} us enabled, {off * 1e6:.3f} us disabled "
        f"= {on / step_s * 100:.3f} % of the {step_s * 1e3:.3f} ms step"
    )
    ab = statistics.median(ratios)
    spread = max(ratios) - min(ratios)
    print(
        f"A/B pairs range {min(ratios) * 100:+.2f} .. {max(ratios) * 100:+.2f} %"
        + (
            ": wider than the goal, so the A/B cannot resolve it here (a noisy machine); the per-call figure can"
            if spread > GOAL_RATIO
            else ""
        )
    )
    # an A/B whose own pairs spread wider than the goal cannot decide it: then the per-call figure decides alone
    decisive = on / step_s if spread > GOAL_RATIO else max(ab, on / step_s)
    print(
        f"probe overhead: A/B {ab * 100:+.2f} % (median of {args.pairs} pairs"
        f"{', too noisy to decide' if spread > GOAL_RATIO else ''}), per-call {on / step_s * 100:.3f} % of step "
        f"time vs goal <= {GOAL_RATIO * 100:g} %: {'met' if decisive <= GOAL_RATIO else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
