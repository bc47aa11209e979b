"""How precisely does chaosbench measure time-to-detect? Prints figures; asserts nothing.

Runs the test-only ``delayed-detect`` framework (a watchdog that prints a detection line a known delay after
a rank dies) under a real SIGKILL of rank 1, for several delays and repeats, and prints the measured
time-to-detect minus the known delay, split into the kill's own latency (the signal delivered to the process
gone, as the watchdog saw it) and the harness's own error (/proc polling + sleep + pipe + stamping). Usage::

    python benchmarks/detect_calibration.py [--repeats 3] [--delays 0.1 0.5 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
from pathlib import Path

from chaosbench.analysis.results import collect
from chaosbench.registry import FRAMEWORKS
from chaosbench.runner import Runner
from chaosbench.specs import load_yaml_text, suite_from_data
from chaosbench.testing.calibration import DelayedDetectFramework
from chaosbench.timeline import read_events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delays", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    args = ap.parse_args()
    FRAMEWORKS.register("delayed-detect", DelayedDetectFramework)
    fws = ", ".join(f"d{i}: {{adapter: delayed-detect, delay_s: {d}}}" for i, d in enumerate(args.delays))
    text = textwrap.dedent(f"""
    name: calibration
    control: false
    defaults:
      deadline_s: 60
      workload: {{name: ddp-mlp, ranks: 2, steps: 20, checkpoint_every: 0, step_sleep_s: 0.02}}
    frameworks: {{{fws}}}
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
        print(f"{'delay_s':>8} {'n':>3} {'total_ms':>9} {'kill_ms':>8} {'harness_ms':>11} {'max_abs_harness_ms':>19}")
        harness_all = []
        for i, d in enumerate(args.delays):
            rows = []
            for m in metrics:
                if m.framework != f"d{i}" or m.time_to_detect_s is None:
                    continue
                events = read_events(Path(str(m.run_dir)) / "events.jsonl")
                detect = next(e for e in events if e.kind == "detect")
                fault = next(e for e in events if e.kind == "fault_inject")
                kill = (int(detect["dead_ns"]) - int(fault["effect_t_ns"])) / 1e6
                total = (m.time_to_detect_s - d) * 1000
                rows.append((total, kill, total - kill))
            harness_all += [h for _, _, h in rows]
            if rows:
                med = [statistics.median(col) for col in zip(*rows, strict=True)]
                print(f"{d:>8.3f} {len(rows):>3} {med[0]:>9.2f} {med[1]:>8.2f} {med[2]:>11.2f} "
                      f"{max(abs(h) for _, _, h in rows):>19.2f}")  # fmt: skip
            else:
                print(f"{d:>8.3f}   0  (no detection measured)")
        if harness_all:
            print(f"harness error overall: n={len(harness_all)} median {statistics.median(harness_all):.2f} ms, "
                  f"max |error| {max(map(abs, harness_all)):.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
