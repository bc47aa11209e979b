"""Shared fixtures: build suites from YAML text and run them for real."""

from __future__ import annotations

import json
import os
import resource
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.results import collect
from chaosbench.runner import Runner
from chaosbench.specs import Suite, load_yaml_text, suite_from_data

ROOT = Path(__file__).resolve().parent.parent

# Test files that use a machine-wide engine or look at machine-wide state: Docker containers and networks, the
# local Slurm cluster's three nodes (test_slurm.py needs them idle), the host's qdiscs and iptables rules, the
# docker runtime's capture directories in /tmp (test_harness_crash.py counts every one as a leftover). Under
# pytest-xdist (tox: ``pytest -n 2 --dist loadscope``, CHAOSBENCH_TEST_WORKERS workers) they form one group, run
# one after another on one worker; every other file is a group of its own (its module-scoped controls are run once, on one worker).
ENGINE_FILES = frozenset(
    {
        "test_docker_runtime.py",
        "test_elasticity.py",
        "test_foreign_targets.py",
        "test_harness_crash.py",
        "test_network_faults.py",
        "test_ray_train_docker.py",
        "test_serving_docker.py",
        "test_slurm.py",
    }
)
ENGINES = "engines"


def test_group(path: str) -> str:
    """The group of a test, from its node id's file part: :data:`ENGINES` for the files above, else the file."""
    return ENGINES if path.rsplit("/", 1)[-1] in ENGINE_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand out whole groups (:func:`test_group`) to the workers, in collection order. Not xdist's own
    ``--dist loadgroup``: with pytest 9.2 and pytest-xdist 3.8 its ``xdist_group`` marks had no effect (tried:
    every test was handed out on its own, the engine files ran on both workers at once; with pytest 9.0 they
    worked)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid.split("::", 1)[0])

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine group first (the longest chain: with ``--no-loadscope-reorder`` xdist hands groups out in
    this order), the other integration files next, the unit tests last (short, they fill the gaps); without
    xdist this only moves the engine files first."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if test_group(path) == ENGINES else 1 if path.startswith("tests/integration/") else 2

    items.sort(key=rank)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """With ``CHAOSBENCH_TEST_CPU_LOG=<file>``: one JSON line per test appended to it, the test's wall and the CPU
    seconds (user + system) of the pytest process and of the children it reaped during the test (ranks, agents,
    launchers: whatever the harness started and waited for; not a container's processes, which the engine
    reaps), the worker and the wall-clock end (to lay each worker's tests out in time). ``benchmarks/test_cpu.py``
    sums them per file."""
    log = os.environ.get("CHAOSBENCH_TEST_CPU_LOG")
    if not log:
        return (yield)

    def cpu() -> tuple[float, float]:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    wall, (own, kids) = time.monotonic(), cpu()
    try:
        return (yield)
    finally:
        own2, kids2 = cpu()
        line = {
            "nodeid": item.nodeid,
            "wall_s": round(time.monotonic() - wall, 3),
            "own_cpu_s": round(own2 - own, 3),
            "children_cpu_s": round(kids2 - kids, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "end": round(time.time(), 3),
        }
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


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
