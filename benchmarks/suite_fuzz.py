"""Suite fuzzing: N suites generated from the suite schema (the repository's suites changed where the schema says
a value lies, broken YAML, suites drawn from the schema alone; :mod:`chaosbench.testing.suite_fuzz`), each
through ``chaosbench run --dry-run`` in this process. Prints how many were refused with a file:line message,
accepted, or escaped (a traceback, a harness error, a refusal without its line, no answer within the limit),
the slowest answer and every escape. Exit 1 when one escaped. Usage::

    python benchmarks/suite_fuzz.py [--examples 1000] [--seed 0] [--limit-s 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    from chaosbench.cli import suite_schema
    from chaosbench.testing.suite_fuzz import FuzzCase, check_suite_file, project_suites, suites

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000, help="suites to generate (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    ap.add_argument("--limit-s", type=float, default=10.0, help="longest a dry-run may take (default 10 s)")
    args = ap.parse_args()
    counts: Counter[str] = Counter()
    slowest = (0.0, "")
    escapes: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="chaosbench-suite-fuzz-"))
    path = tmp / "chaos" / "suite.yaml"  # a folder of its own, as in a user's repository
    path.parent.mkdir()

    @seed(args.seed)
    @settings(
        max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=suites(project_suites(ROOT), suite_schema()))
    def one(case: FuzzCase) -> None:
        nonlocal slowest
        path.write_text(case.text)
        v = check_suite_file(path, tmp / "out", limit_s=args.limit_s)
        counts[v.kind] += 1
        slowest = max(slowest, (v.elapsed_s, case.how))
        if v.kind == "escaped":
            escapes.append(f"{case.how}: {v.detail}")

    t = time.monotonic()
    one()
    total = sum(counts.values())
    print(
        f"{total} suites in {time.monotonic() - t:.0f} s: {counts['refused']} refused with file:line, "
        f"{counts['accepted']} accepted (dry-run finished), {counts['escaped']} escaped"
    )
    print(f"slowest answer: {slowest[0]:.2f} s ({slowest[1]})")
    for e in escapes:
        print(f"escaped: {e}")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
