"""The CPU floor of the test suite on this machine: how many torch processes the tests started (counted from the
run directories a test session left behind), what one such start costs here in CPU, and the shortest pytest wall
those starts alone allow on this machine's cores. Prints figures; asserts nothing.

Usage::

    CHAOSBENCH_TEST_CPU_LOG=/tmp/cpu.jsonl tox       # a full test session (the CPU log is optional)
    python benchmarks/ci_floor.py [BASETEMP] [--cpu-log /tmp/cpu.jsonl] [--cores N] [--target-min 20]

``BASETEMP`` is the session's pytest base directory (default: the newest, ``<tmp>/pytest-of-<user>/pytest-current``).
Every ``events.jsonl`` below it is read:

- a *rank start* is a ``rank_start`` event of a training workload: a rank that imported torch and its training
  stack (a rank restarted after a fault starts again, and counts again); a *replica start* is one of a serving
  workload (``serve``, ``serve-command``: torch, no optimizer). A process is counted once, by its host, pid and
  start ticks, however many copies of its timeline the tests made;
- an *agent start* is a ``proc_start`` of role ``agent`` (a torchrun or nvrx agent: it imports torch, not the
  training stack).

The CPU of one start is measured here, in a child process of this interpreter (run it with the tests'
interpreter, ``.tox/py/bin/python``): a trainer's imports (torch, its distributed checkpointing, and one optimizer,
whose first ``add_param_group`` imports ``torch._dynamo``: every torch optimizer does), a replica's (torch) and an
agent's (``torch.distributed.run``). The floor is the sum of starts x CPU over the three, divided by the cores: the
pytest wall below which no scheduling of these tests can go on this machine, before any step is trained, any
harness work or any container, Ray, Lightning or Slurm process is counted.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: What a training rank imports before its first step (the built-in programs and users' DDP scripts alike).
RANK_IMPORTS = (
    "import torch, torch.distributed as dist, torch.distributed.checkpoint\n"
    "torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)\n"
)
#: What a serving replica imports (a model, no optimizer).
REPLICA_IMPORTS = "import torch\n"
#: What a torchrun agent imports.
AGENT_IMPORTS = "import torch.distributed.run\n"
#: The serving workloads: their rank_start is a replica's.
SERVING = ("serve", "serve-command")


def default_basetemp() -> Path:
    return Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}" / "pytest-current"


def count_starts(basetemp: Path) -> tuple[Counter[str], Counter[str], int]:
    """(rank starts by workload, other process starts by role, timelines read) below ``basetemp``."""
    ranks: Counter[str] = Counter()
    others: Counter[str] = Counter()
    seen: set[tuple[str | int, ...]] = set()
    files = 0
    for events in basetemp.rglob("events.jsonl"):
        files += 1
        workload = _workload(events.parent)
        for line in events.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            kind = e.get("kind")
            if kind not in ("rank_start", "proc_start"):
                continue
            key = (str(e.get("host")), int(e.get("pid") or 0), int(e.get("pid_ticks") or e.get("t_ns") or 0))
            if kind == "rank_start" and ("rank", *key) not in seen:
                seen.add(("rank", *key))
                ranks[workload] += 1
            elif kind == "proc_start" and e.get("role") != "rank" and key not in seen:
                seen.add(key)
                others[str(e.get("role"))] += 1
    return ranks, others, files


def _workload(run_dir: Path) -> str:
    try:
        sc = json.loads((run_dir / "config.json").read_text())["scenario"]
        return str((sc.get("workload") or {}).get("name") or "?")
    except (OSError, ValueError, KeyError, TypeError):
        return "(no config: a program run by a test itself)"


def start_cpu_s(code: str, times: int) -> float:
    """Median CPU seconds (user + system) of a fresh interpreter running ``code``."""
    out = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(out)


def cpu_log_totals(path: Path) -> tuple[float, float, int]:
    """(summed test wall, counted CPU, tests) from a ``CHAOSBENCH_TEST_CPU_LOG`` file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wall = sum(r["wall_s"] for r in rows)
    cpu = sum(r["own_cpu_s"] + r["children_cpu_s"] for r in rows)
    return wall, cpu, len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("basetemp", nargs="?", type=Path, default=default_basetemp())
    ap.add_argument("--cpu-log", type=Path, help="the session's CHAOSBENCH_TEST_CPU_LOG file")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="default: this machine's")
    ap.add_argument(
        "--target-min", type=float, default=20.0, help="the pytest wall to compare with (minutes)"
    )
    ap.add_argument("--times", type=int, default=3, help="starts measured per kind (median)")
    args = ap.parse_args()

    ranks, others, files = count_starts(args.basetemp.resolve())
    cpu = {
        "rank": start_cpu_s(RANK_IMPORTS, args.times),
        "replica": start_cpu_s(REPLICA_IMPORTS, args.times),
        "agent": start_cpu_s(AGENT_IMPORTS, args.times),
    }
    bare = start_cpu_s("pass", args.times)
    starts = {
        "rank": sum(n for w, n in ranks.items() if w not in SERVING),
        "replica": sum(n for w, n in ranks.items() if w in SERVING),
        "agent": others.get("agent", 0),
    }
    floor_cpu = sum(starts[k] * cpu[k] for k in starts)
    print(f"{files} timelines below {args.basetemp}")
    print(
        f"rank and replica starts: {sum(ranks.values())} ({', '.join(f'{w}: {n}' for w, n in ranks.most_common())})"
    )
    print(
        f"other process starts: {sum(others.values())} ({', '.join(f'{r}: {n}' for r, n in others.most_common())})"
    )
    print(
        f"CPU of one start here (median of {args.times}): rank {cpu['rank']:.2f} s (torch, distributed "
        f"checkpointing, an optimizer: torch._dynamo), replica {cpu['replica']:.2f} s, agent {cpu['agent']:.2f} s, "
        f"bare interpreter {bare:.2f} s"
    )
    print(
        f"{starts['rank']} rank, {starts['replica']} replica and {starts['agent']} agent starts: {floor_cpu:.0f} CPU-s "
        f"= {floor_cpu / args.cores:.0f} s of pytest wall on {args.cores} cores at the least "
        f"({floor_cpu / args.cores / 60:.1f} min; target {args.target_min:g} min)"
    )
    if args.cpu_log is not None:
        wall, counted, tests = cpu_log_totals(args.cpu_log)
        print(
            f"CPU log: {tests} tests, {counted:.0f} CPU-s counted (pytest and the children it reaped; not containers "
            f"or Slurm's), {wall:.0f} s of test wall summed over the workers"
        )
    budget = args.target_min * 60 * args.cores
    if floor_cpu > budget:
        print(
            f"within the target: at most {budget / cpu['rank']:.0f} rank starts and nothing else "
            f"(these tests: {starts['rank']}), or {floor_cpu / (args.target_min * 60):.1f} cores for these starts alone"
        )


if __name__ == "__main__":
    main()
