"""pytest plugin: recovery regression tests from chaosbench suites.

    pytest --chaos-suite suites/ci.yaml [--chaos-out reports] [--chaos-baseline baselines/ci.csv]

collects every run of the suite (controls first, then framework x fault x repeat) as a test item. An item runs
its scenario for real and fails when the gate (:mod:`chaosbench.gate`, as ``chaosbench run``) fails that run: a
harness error, or an SLO of the suite missed; the failure message shows the measured value, the bound and the
run directory. With ``--chaos-baseline`` one more item compares the finished result set with the baseline and
fails on regressions.

The ``chaos_run`` fixture runs a suite given as YAML text (or a path) in the test's temporary directory and
returns its metrics keyed ``"framework/fault#repeat"``, for recovery tests written in Python.

Thin on purpose: torch, pandas and the rest are imported only when an item runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("chaosbench", "chaosbench recovery tests")
    g.addoption(
        "--chaos-suite",
        action="append",
        default=[],
        metavar="YAML",
        help="collect every run of this chaosbench suite as a test item (repeatable)",
    )
    g.addoption("--chaos-out", default="reports", metavar="DIR", help="results directory (default: reports)")
    g.addoption(
        "--chaos-yes",
        action="store_true",
        default=False,
        help="collect a suite above the limits (as chaosbench run --yes: 10,000 runs, 24 h, 4,096 ranks, "
        "1,024 nodes or 1,000,000 steps a run)",
    )
    g.addoption(
        "--chaos-baseline",
        default=None,
        metavar="CSV|DIR",
        help="also fail on regressions against this result set",
    )
    g.addoption(
        "--chaos-threshold",
        type=float,
        default=0.2,
        help="relative change of a timing that counts, besides twice the baseline's interquartile range (default 0.2)",
    )
    g.addoption(
        "--chaos-alpha",
        type=float,
        default=0.05,
        help="false-alarm rate of the whole baseline verdict (Holm over every comparison; default 0.05)",
    )


class ChaosFailure(AssertionError):
    """An SLO missed or a regression found: the message is the whole story."""


class _SuiteState:
    def __init__(self, path: str, out: str, yes: bool = False) -> None:
        from chaosbench.errors import SpecError
        from chaosbench.runner import Runner, suite_limits
        from chaosbench.specs import load_suite

        self.suite = load_suite(path)
        over = suite_limits(self.suite)[2]
        if over and not yes:  # the guard of chaosbench run, before a run or an item is built
            raise SpecError(
                f"suite '{self.suite.name}' is too large: {'; '.join(over)}; pass --chaos-yes "
                "to collect it anyway",
                file=str(path),
            )
        self.runner = Runner(self.suite, out)
        self.prepared = False

    def run(self, scenario: Any) -> Any:
        if not self.prepared:
            self.runner.prepare()
            self.prepared = True
        if (
            self.runner.halted is not None
        ):  # an earlier run may have left something this one would collide with
            raise ChaosFailure(f"not run: {self.runner.halted.describe()}")
        t = time.monotonic()
        rec = self.runner.run_one(scenario)
        return rec, self.runner.finish(rec, time.monotonic() - t)


class ChaosItem(pytest.Item):
    def __init__(self, *, state: _SuiteState, scenario: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.state = state
        self.scenario = scenario

    def runtest(self) -> None:
        from chaosbench.gate import EXIT_HARNESS, EXIT_OK, Gate, harness_errors, missed_slos

        rec, m = self.state.run(self.scenario)
        code = Gate(self.state.suite.name, [m], harness_errors([rec])).exit_code()
        if code == EXIT_HARNESS:
            raise ChaosFailure(f"harness error: {rec.result.reason} (run directory: {rec.run_dir})")
        if code != EXIT_OK:
            raise ChaosFailure(
                f"{self.scenario.id} #{self.scenario.repeat}: "
                + "; ".join(missed_slos(m))
                + f"\n  verdict: {m.verdict}\n  run directory: {rec.run_dir}"
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ChaosFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path(self.state.suite.source), 0, f"chaos: {self.name}"


class BaselineItem(pytest.Item):
    def __init__(
        self, *, state: _SuiteState, baseline: str, threshold: float, alpha: float, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.state, self.baseline, self.threshold, self.alpha = state, baseline, threshold, alpha

    def runtest(self) -> None:
        from chaosbench.gate import Comparison

        comparison = Comparison.of(
            self.baseline, self.state.runner.suite_dir, threshold=self.threshold, alpha=self.alpha
        )
        bad = [d.describe() for d in comparison.regressions]
        if bad:
            raise ChaosFailure("regressions against " + self.baseline + ":\n  " + "\n  ".join(bad))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ChaosFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path(self.state.suite.source), 0, "chaos: baseline comparison"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    suites = config.getoption("--chaos-suite")
    if not suites:
        return
    from chaosbench.errors import ChaosbenchError

    for path in suites:
        try:
            state = _SuiteState(path, config.getoption("--chaos-out"), config.getoption("--chaos-yes"))
        except ChaosbenchError as exc:
            raise pytest.UsageError(str(exc)) from None
        for sc in state.suite.scenarios():
            items.append(
                ChaosItem.from_parent(
                    session, name=f"{state.suite.name}::{sc.id}#{sc.repeat}", state=state, scenario=sc
                )
            )
        baseline = config.getoption("--chaos-baseline")
        if baseline:
            items.append(
                BaselineItem.from_parent(
                    session,
                    name=f"{state.suite.name}::baseline",
                    state=state,
                    baseline=baseline,
                    threshold=config.getoption("--chaos-threshold"),
                    alpha=config.getoption("--chaos-alpha"),
                )
            )


@pytest.fixture
def chaos_run(tmp_path: Path) -> Iterator[Callable[..., dict[str, Any]]]:
    """Run a chaosbench suite (YAML text or a path) for real; returns metrics keyed "framework/fault#repeat"."""

    def _run(suite: str | Path) -> dict[str, Any]:
        import textwrap

        from chaosbench.analysis.results import collect
        from chaosbench.runner import Runner
        from chaosbench.specs import load_suite, load_yaml_text, suite_from_data

        if isinstance(suite, Path) or (
            isinstance(suite, str) and "\n" not in suite and suite.endswith(".yaml")
        ):
            spec = load_suite(suite)
        else:
            data, smap = load_yaml_text(textwrap.dedent(str(suite)), "<chaos_run>")
            spec = suite_from_data(data, smap)
        runner = Runner(spec, tmp_path / "chaos")
        runner.run()
        return {f"{m.scenario}#{m.repeat}": m for m in collect(runner.suite_dir, write=True)}

    yield _run
