"""Shared fixtures: build suites from YAML text and run them for real."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.results import collect
from chaosbench.runner import Runner
from chaosbench.specs import Suite, load_yaml_text, suite_from_data

ROOT = Path(__file__).resolve().parent.parent


def make_suite(text: str, name: str = "test.yaml") -> Suite:
    data, smap = load_yaml_text(textwrap.dedent(text), name)
    return suite_from_data(data, smap)


@pytest.fixture
def run_suite(tmp_path: Path):
    """Run a suite given as YAML text; returns {scenario id + '#' + repeat: RunMetrics}."""

    def _run(text: str) -> dict[str, RunMetrics]:
        suite = make_suite(text)
        runner = Runner(suite, tmp_path / "out")
        records = runner.run()
        for r in records:
            assert r.leftovers == [], f"{r.scenario.id}: processes left running: {r.leftovers}"
        metrics = collect(runner.suite_dir, write=True)
        return {f"{m.scenario}#{m.repeat}": m for m in metrics}

    return _run
