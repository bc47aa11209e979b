"""``chaosbench fuzz``: search fault schedules for a recovery bug, then shrink it to a minimal reproducer.

Hypothesis draws schedules of one to ``max_faults`` faults (a killed rank at a step, a rank hung for a while,
a rank killed during a checkpoint save, a straggler), each one a real run of the suite's workload under one
framework, checked against recovery invariants:

- the job finishes (``outcome: recovered``),
- the final state equals the fault-free control's (``fidelity: exact``),
- no crash loop,
- and every SLO of the suite (e.g. ``time_to_resume_s: {max: 30}``).

A failing schedule is shrunk by Hypothesis (fewer faults, earlier steps, simpler kinds) and written as a suite
YAML that reproduces it. Bounded: at most ``max_runs`` real runs (a schedule is never run twice: results are
memoized, so shrinking stays consistent) and ``max_examples`` generated examples; seeded.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.results import run_metrics
from chaosbench.errors import ChaosbenchError
from chaosbench.gate import missed_slos
from chaosbench.rundir import RunDir
from chaosbench.specs import FaultSpec, Scenario, Suite, slos_as_data
from chaosbench.timeline import read_events


@dataclass
class FuzzResult:
    runs: int
    examples: int
    schedule: list[dict[str, Any]] | None = None
    violations: list[str] = field(default_factory=list)
    run_dir: str | None = None
    reproducer: Path | None = None
    elapsed_s: float = 0.0


KINDS = ("kill", "hang", "torn-write", "straggler")


def schedule_strategy(
    steps: int, ckpt_every: int, ranks: int, max_faults: int, kinds: tuple[str, ...] = KINDS
) -> Any:
    """Hypothesis strategy over fault schedules (lists of fault specs as plain dicts) of the given kinds.

    A torn write kills a rank once its shard file appeared in the checkpoint being written (or, the other
    variant, as soon as the save began)."""
    from hypothesis import strategies as st

    rank = st.integers(0, ranks - 1)
    step = st.integers(2, max(2, steps - 2))
    kill = st.builds(lambda r, s: {"injector": "kill", "target": r, "trigger": {"at_step": s}}, rank, step)
    hang = st.builds(
        lambda r, s, d: {
            "injector": "hang",
            "target": r,
            "trigger": {"at_step": s},
            "params": {"duration_s": d},
        },
        rank,
        step,
        st.sampled_from([0.5, 1.0, 2.0]),
    )
    options = {"kill": kill, "hang": hang}
    if ckpt_every and steps > ckpt_every:
        save_steps = list(range(ckpt_every, steps, ckpt_every))
        torn = st.builds(
            lambda r, s, at: {
                "injector": "corrupt-checkpoint",
                "target": r,
                "params": {"mode": "torn-write", "torn_at": at},
                "trigger": {"on_event": {"kind": "ckpt_save_begin", "step": s}},
            },
            rank,
            st.sampled_from(save_steps),
            st.sampled_from(["shard-write", "begin"]),
        )
        options["torn-write"] = torn
    slow = st.builds(
        lambda r, s: {
            "injector": "straggler",
            "target": r,
            "trigger": {"at_step": s},
            "params": {"cpu_fraction": 0.2, "duration_s": 1.0},
        },
        rank,
        step,
    )
    options["straggler"] = slow
    unknown = [k for k in kinds if k not in options]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown} (known: {', '.join(options)})")
    return st.lists(st.one_of(*(options[k] for k in kinds)), min_size=1, max_size=max_faults)


class Fuzzer:
    def __init__(
        self,
        suite: Suite,
        framework: str,
        out_dir: str | Path,
        max_examples: int = 10,
        max_runs: int = 30,
        max_faults: int = 2,
        seed: int = 0,
        progress: Any = None,
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        from chaosbench.runner import Runner

        if framework not in suite.matrix.all_frameworks() and framework not in suite.frameworks:
            raise ValueError(f"framework '{framework}' is not in the suite")
        self.suite = suite
        self.framework = framework
        self.runner = Runner(suite.model_copy(update={"name": f"{suite.name}-fuzz"}), out_dir)
        self.max_examples, self.max_runs, self.max_faults, self.seed = (
            max_examples,
            max_runs,
            max_faults,
            seed,
        )
        self.kinds = tuple(kinds)
        self.progress = progress or (lambda s: None)
        self._memo: dict[str, tuple[list[str], str]] = {}
        self._control: list[Any] | None = None
        self.runs = 0

    def _base(self) -> Scenario:
        control = (
            next(s for s in self.suite.scenarios() if s.framework_label == self.framework and s.control)
            if self.suite.control
            else None
        )
        if control is not None:
            return control
        return self.suite.scenario(self.framework, [], 0)

    def _run(self, faults: list[tuple[str, FaultSpec]], tag: str) -> tuple[RunMetrics, str]:
        """Run ``faults`` (none: the control) with the suite's SLOs; its metrics, SLO verdicts included, as
        ``chaosbench run`` computes them (against the control's timeline once there is one)."""
        base = self._base()
        name = "+".join(n for n, _ in faults) if faults else None
        sc = replace(
            base,
            fault_name=name and tag,
            fault=faults[0][1] if faults else None,
            faults=tuple(faults),
            slos=dict(self.suite.slos),
        )
        rec = self.runner.run_one(sc)
        self.runs += 1
        control = RunDir.of(self.runner.suite_dir, base) if self._control is not None else None
        m = run_metrics(RunDir(rec.run_dir), control, write=False, control_events=self._control)
        return m, str(rec.run_dir)

    def violations(self, m: RunMetrics) -> list[str]:
        """The recovery invariants ``m`` breaks, then the suite's SLOs it missed (judged as the gate does)."""
        out = []
        if m.outcome != "recovered":
            out.append(f"the job did not recover ({m.verdict})")
        if m.fidelity != "exact":
            out.append(f"fidelity {m.fidelity or 'not measured'} ({m.missing.get('fidelity', m.verdict)})")
        if m.crash_loop:
            out.append("crash loop")
        return out + missed_slos(m)

    def check(self, schedule: list[dict[str, Any]]) -> list[str]:
        key = json.dumps(schedule, sort_keys=True)
        if key in self._memo:
            return self._memo[key][0]
        if self.runs >= self.max_runs:
            return []  # budget spent: unseen schedules count as passing (consistent, since memoized)
        faults = [(f"f{i}", FaultSpec.model_validate(f)) for i, f in enumerate(schedule)]
        m, run_dir = self._run(faults, f"fuzz{self.runs}")
        v = self.violations(m)
        self._memo[key] = (v, run_dir)
        self.progress(
            f"[fuzz {self.runs}/{self.max_runs}] {self.describe(schedule)}: "
            f"{'VIOLATES ' + '; '.join(v) if v else 'ok'}"
        )
        return v

    @staticmethod
    def describe(schedule: list[dict[str, Any]]) -> str:
        parts = []
        for f in schedule:
            trig = f["trigger"]
            if "at_step" in trig:
                when = f"step {trig['at_step']}"
            else:
                when = (
                    f"save of step {trig['on_event']['step']} ({f.get('params', {}).get('torn_at', 'begin')})"
                )
            kind = f.get("params", {}).get("mode", f["injector"])
            parts.append(f"{kind} rank {f['target']} at {when}")
        return ", ".join(parts)

    def fuzz(self) -> FuzzResult:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hseed
        from hypothesis.errors import Flaky

        t0 = time.monotonic()
        self.runner.prepare()
        m, _ = self._run([], "control")
        self._control = read_events(RunDir.of(self.runner.suite_dir, self._base()).events)
        if m.outcome != "completed":
            raise ChaosbenchError(f"fuzz: the fault-free control did not complete ({m.verdict})")
        wl = self.suite.defaults.workload
        opts = wl.options
        strategy = schedule_strategy(
            int(opts.get("steps", 60)),
            int(opts.get("checkpoint_every", 10)),
            wl.ranks,
            self.max_faults,
            self.kinds,
        )
        failures: list[tuple[list[dict[str, Any]], list[str]]] = []
        examples = {"n": 0}

        @settings(
            max_examples=self.max_examples,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate, Phase.shrink],
        )
        @hseed(self.seed)
        @given(strategy)
        def prop(schedule: list[dict[str, Any]]) -> None:
            examples["n"] += 1
            v = self.check(schedule)
            if v:
                failures.append((schedule, v))
                raise AssertionError("; ".join(v))

        try:
            prop()
        except (AssertionError, Flaky):
            pass
        result = FuzzResult(runs=self.runs, examples=examples["n"], elapsed_s=time.monotonic() - t0)
        if failures:
            # Hypothesis replays the minimal failing example last; failures are memoized, so it is the smallest.
            schedule, v = min(failures, key=lambda f: (len(f[0]), json.dumps(f[0], sort_keys=True)))
            result.schedule, result.violations = schedule, v
            result.run_dir = self._memo[json.dumps(schedule, sort_keys=True)][1]
        return result

    def reproducer(self, schedule: list[dict[str, Any]], path: str | Path) -> Path:
        """A suite YAML that replays ``schedule`` under the same workload and framework, with the invariants as SLOs."""
        names = [f"f{i}" for i in range(len(schedule))]
        slos: dict[str, Any] = {"outcome": "recovered", "fidelity": "exact", "crash_loop": False}
        slos.update(slos_as_data(self.suite.slos))
        doc: dict[str, Any] = {
            "name": f"{self.suite.name}-repro",
            "description": f"minimal failing schedule found by chaosbench fuzz (seed {self.seed})",
            "seed": self.suite.seed,
            "control": True,
            "defaults": self.suite.defaults.model_dump(mode="json"),
            "frameworks": {
                self.framework: self.suite.framework_spec(self.framework).model_dump(exclude_none=True)
            },
            "faults": dict(zip(names, schedule, strict=True)),
            "matrix": {"frameworks": [self.framework], "faults": [names], "repeats": 1},
            "slos": slos,
        }
        wl = doc["defaults"]["workload"]
        doc["defaults"]["workload"] = {k: v for k, v in wl.items() if v is not None}
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        return p
