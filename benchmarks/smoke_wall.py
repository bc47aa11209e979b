"""The smoke suite's wall time, whole and per run. Prints figures; asserts nothing.

Runs ``chaosbench run suites/smoke.yaml`` (as the README's first set-up command does inside its tox
environment) into a temporary directory and prints the whole command's wall time, then each run's own wall
(``result.json``'s ``elapsed_s``: from its start to its teardown's end) and, per scenario, the median. Usage::

    python benchmarks/smoke_wall.py [--suite suites/smoke.yaml] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "suites" / "smoke.yaml"))
    ap.add_argument("--repeats", type=int, default=1, help="whole suites to run (default 1)")
    args = ap.parse_args()
    walls = []
    per_run: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="smoke-wall-") as out:
            t = time.monotonic()
            res = subprocess.run(
                [sys.executable, "-m", "chaosbench.cli", "run", args.suite, "--out", out],
                capture_output=True,
                text=True,
            )
            walls.append(time.monotonic() - t)
            if res.returncode not in (0, 3):
                print(res.stderr[-2000:], file=sys.stderr)
                sys.exit(f"chaosbench run exited {res.returncode}")
            for result in sorted(Path(out).glob("*/*/*/result.json")):
                scenario = result.parent.parent.name.replace("__", "/")
                elapsed = json.loads(result.read_text()).get("elapsed_s")
                if elapsed is not None:
                    per_run[scenario].append(float(elapsed))
    print(f"{'scenario':<28} {'runs':>4} {'median_s':>9} {'max_s':>7}")
    for scenario, values in sorted(per_run.items()):
        print(f"{scenario:<28} {len(values):>4} {statistics.median(values):>9.1f} {max(values):>7.1f}")
    runs_s = sum(sum(v) for v in per_run.values()) / len(walls)
    print(
        f"smoke suite: wall {statistics.median(walls):.0f} s (median of {len(walls)}), of which the runs "
        f"{runs_s:.0f} s; the rest is start-up, the outlook, metrics and the report"
    )


if __name__ == "__main__":
    main()
