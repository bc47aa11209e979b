"""Where the test suite's CPU goes: per test file, the wall and CPU seconds the tests' own accounting logged
(``CHAOSBENCH_TEST_CPU_LOG``, see ``tests/conftest.py``), heaviest first. Prints figures; asserts nothing.

Usage::

    CHAOSBENCH_TEST_CPU_LOG=/tmp/cpu.jsonl tox            # or: pytest -n 2 ...
    python benchmarks/test_cpu.py /tmp/cpu.jsonl [--top 30] [--tests]

The CPU counted is the pytest process's own (the harness, its threads) and that of the children it reaped during
a test (ranks, agents, launchers and their waited-for descendants); a container's processes (reaped by the
engine) and the engines themselves (dockerd, slurmd) are not in it. With ``--tests`` each test is listed.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    ap.add_argument("--tests", action="store_true", help="one row per test instead of per file")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        key = r["nodeid"] if args.tests else r["nodeid"].split("::", 1)[0]
        s = sums[key]
        s[0] += r["wall_s"]
        s[1] += r["own_cpu_s"]
        s[2] += r["children_cpu_s"]
        s[3] += 1
    total = [sum(s[i] for s in sums.values()) for i in range(3)]
    print(
        f"{len(rows)} tests: wall {total[0]:.0f} s, CPU {total[1] + total[2]:.0f} s "
        f"(pytest {total[1]:.0f} s, children {total[2]:.0f} s)"
    )
    print(f"{'CPU s':>8} {'wall s':>8} {'cores':>6} {'tests':>5}  file")
    ranked = sorted(sums.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    for key, (wall, own, kids, n) in ranked[: args.top]:
        cores = (own + kids) / wall if wall else 0.0
        print(f"{own + kids:8.1f} {wall:8.1f} {cores:6.2f} {int(n):5d}  {key}")


if __name__ == "__main__":
    main()
