"""How precisely does chaosbench measure time-to-detect? Prints figures; asserts nothing.

Runs the test-only ``delayed-detect`` framework (a watchdog that prints a detection line a known delay after
a rank dies) under a real SIGKILL of rank 1, for several delays and repeats, and prints the measured
time-to-detect minus the known delay: the harness's own measurement error (death noticed by /proc
polling + pipe + stamping). Usage::

    python benchmarks/detect_calibration.py [--repeats 3] [--delays 0.1 0.5 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap

from chaosbench.analysis.results import collect
from chaosbench.registry import FRAMEWORKS
from chaosbench.runner import Runner
from chaosbench.specs import load_yaml_text, suite_from_data
from chaosbench.testing.calibration import DelayedDetectFramework


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delays", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    args = ap.parse_args()
    FRAMEWORKS.register("delayed-detect", DelayedDetectFramework)
    fws = "\n".join(f"  d{i}: {{adapter: delayed-detect, delay_s: {d}}}" for i, d in enumerate(args.delays))
    text = textwrap.dedent(f"""
    name: calibration
    control: false
    defaults:
      deadline_s: 60
      workload: {{name: ddp-mlp, ranks: 2, steps: 20, checkpoint_every: 0, step_sleep_s: 0.02}}
    frameworks:
    {fws}
    faults:
      kill: {{injector: kill, target: {{rank: 1}}, trigger: {{at_step: 5}}}}
    matrix: {{frameworks: [{", ".join(f"d{i}" for i in range(len(args.delays)))}], faults: [kill],
              repeats: {args.repeats}}}
    """)
    data, smap = load_yaml_text(text, "<calibration>")
    suite = suite_from_data(data, smap)
    with tempfile.TemporaryDirectory() as out:
        Runner(suite, out).run()
        metrics = collect(Runner(suite, out).suite_dir, write=False)
    print(f"{'delay_s':>8} {'n':>3} {'median_err_ms':>14} {'max_abs_err_ms':>15}")
    errs_all = []
    for i, d in enumerate(args.delays):
        errs = [(m.time_to_detect_s - d) * 1000 for m in metrics
                if m.framework == f"d{i}" and m.time_to_detect_s is not None]  # fmt: skip
        errs_all += errs
        if errs:
            print(f"{d:>8.3f} {len(errs):>3} {statistics.median(errs):>14.2f} {max(map(abs, errs)):>15.2f}")
        else:
            print(f"{d:>8.3f}   0  (no detection measured)")
    if errs_all:
        print(f"overall: n={len(errs_all)} median {statistics.median(errs_all):.2f} ms, "
              f"max |error| {max(map(abs, errs_all)):.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
