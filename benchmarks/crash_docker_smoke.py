"""The harness SIGKILLed at random moments of the whole docker smoke suite (suites/docker-smoke.yaml), each kill
followed by ``chaosbench cleanup`` and ``--resume``, held to an uninterrupted run of the same suite (issue 31 item
6; CI runs the same machinery on a 2-run docker suite in tests/integration/test_harness_crash.py). By hand, with
dockerd up (scripts/docker-up); 7 minutes on 2 cores (2026-12-06: the uninterrupted run 190 s, the crashed and
resumed one 215 s):

    python benchmarks/crash_docker_smoke.py [--out DIR] [--seed N]

It runs the suite once uninterrupted, then again with five kills (the control's containers up; a fault in force,
twice; containers up in a later run; the report being written). After each kill it checks that cleanup left no
container, network, capture directory, process, iptables rule or qdisc of the suite and that every finished run's
result and metrics are unchanged byte for byte; at the end that ``--resume`` ran every run once and that each
(scenario, repeat) ended with the uninterrupted run's outcome and fidelity. Prints both tables side by side;
exits 1 (with the assertion) when anything differs.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

from tests.integration.test_harness_crash import Kill, Suite, crash_and_resume  # noqa: E402

SUITE = ROOT / "suites" / "docker-smoke.yaml"


def table(suite_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    with (suite_dir / "results.csv").open() as f:
        return {(r["scenario"], r["repeat"]): (r["outcome"], r["fidelity"]) for r in csv.DictReader(f)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=None, help="where both result sets go (default: a new temp dir)"
    )
    p.add_argument("--seed", type=int, default=31, help="draws the moment of each kill")
    ns = p.parse_args()
    out = ns.out or Path(tempfile.mkdtemp(prefix="crash-docker-smoke-"))
    plain = out / "plain"
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "chaosbench.cli", "run", str(SUITE), "--out", str(plain)], check=True
    )
    want = table(plain / "docker-smoke")
    print(f"uninterrupted: {len(want)} runs, {time.monotonic() - t0:.0f} s", flush=True)
    crashed = out / "crashed"
    crashed.mkdir(parents=True, exist_ok=True)
    suite = Suite(crashed, "docker-smoke", SUITE.read_text(), runs=len(want))
    plan = [
        Kill("docker", spread_s=2.0),  # the first control's containers up
        Kill("fault", after_progress=True),  # a fault in force (the node killed, paused, cut off or delayed)
        Kill("fault", after_progress=True, spread_s=3.0),  # another, later in its window
        Kill("docker", after_progress=True, spread_s=5.0),  # a later run's containers up
        Kill("report", spread_s=0.2),  # every run finished: the report being written
    ]
    t1 = time.monotonic()
    try:
        crash_and_resume(crashed, suite, plan, seed=ns.seed, docker=True, expected=want)
        ok = True
    except AssertionError as e:
        print(f"FAILED: {e}", flush=True)
        ok = False
    got = table(suite.dir) if (suite.dir / "results.csv").is_file() else {}
    print(
        f"crashed {len(plan)} times and resumed: {time.monotonic() - t1:.0f} s; log {crashed / 'docker-smoke.log'}"
    )
    print(f"{'scenario':32} {'repeat':>6}  {'uninterrupted':28} crashed and resumed")
    for key in sorted(want.keys() | got.keys()):
        a, b = want.get(key, ("-", "")), got.get(key, ("-", ""))
        print(
            f"{key[0]:32} {key[1]:>6}  {a[0] + ' ' + a[1]:28} {b[0] + ' ' + b[1]}{'' if a == b else '   DIFFERS'}"
        )
    print("same rows, nothing left behind, no finished result lost" if ok else "NOT the same: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
