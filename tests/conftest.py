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

# Test files that use a machine-wide engine or look at machine-wide state: Docker containers and networks, the
# local Slurm cluster's three nodes (test_slurm.py needs them idle), the host's qdiscs and iptables rules, the
# docker runtime's capture directories in /tmp (test_harness_crash.py counts every one as a leftover). Under
# pytest-xdist (tox runs ``pytest -n 2 --dist loadgroup``) they form one group, run one after another on one
# worker; every other file is a group of its own (its module-scoped controls are run once, on one worker).
ENGINE_FILES = frozenset({
    "test_docker_runtime.py", "test_elasticity.py", "test_foreign_targets.py", "test_harness_crash.py",
    "test_network_faults.py", "test_serving_docker.py", "test_slurm.py",
})  # fmt: skip


def xdist_group(item: pytest.Item) -> str:
    """The xdist group of a test: ``engines`` for the files above, else its file."""
    return "engines" if item.path.name in ENGINE_FILES else item.path.relative_to(ROOT).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its xdist group, and put the engine group first (the longest chain: with
    ``--no-loadscope-reorder`` xdist hands groups out in this order), the other integration files next, the unit
    tests last (short, they fill the gaps). Without xdist the marks do nothing and the order only moves the
    engine files first."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    rank = {"engines": 0}
    items.sort(key=lambda it: rank.get(xdist_group(it), 1 if "integration" in it.path.parts else 2))


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
