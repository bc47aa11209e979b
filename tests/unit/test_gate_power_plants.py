"""benchmarks/gate_power.py's suites: the derived CI suite loads, has suites/ci.yaml's scenarios plus
restart/hang-rank1, and each plant is one real change of behaviour in it (a framework option or a workload
bug), nothing else."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaosbench.specs import load_suite
from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("gate_power", ROOT / "benchmarks" / "gate_power.py")
assert _spec is not None and _spec.loader is not None
gate_power = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gate_power", gate_power)  # dataclasses look their module up there
_spec.loader.exec_module(gate_power)


def _load(doc: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(ROOT)  # faults/*.yaml (the suite's `use:`) resolve from here
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_suite(path)


def _diff(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{where}.{k}")
        ]
    return [] if a == b else [f"{where}: {a!r} -> {b!r}"]


def test_the_derived_suite_is_ci_plus_a_hung_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _load(gate_power.derived_suite(3), tmp_path, monkeypatch)
    ids = [sc.id for sc in suite.scenarios() if not sc.control]
    assert sorted(set(ids)) == sorted(gate_power.ALL) and len(ids) == 5 * 3
    assert sum(1 for sc in suite.scenarios() if sc.control) == 2
    ci = yaml.safe_load((ROOT / "suites" / "ci.yaml").read_text())
    assert _diff(ci, gate_power.derived_suite(3)) == [
        f".description: {ci['description']!r} -> {gate_power.derived_suite(3)['description']!r}",
        f".faults.hang-rank1: None -> {gate_power.HANG!r}",
        ".matrix.include: None -> [{'frameworks': ['restart'], 'faults': ['hang-rank1']}]",
    ]


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("restart-delay", ".frameworks.restart.restart_delay_s: None -> 2.0"),
        ("max-restarts-0", ".frameworks.restart.max_restarts: 3 -> 0"),
        ("heartbeat-15s", ".frameworks.restart.heartbeat_timeout_s: 5 -> 15.0"),
        ("forget-optimizer", ".defaults.workload.bug: None -> 'forget-optimizer'"),
        ("non-atomic-ckpt", ".defaults.workload.bug: None -> 'non-atomic-ckpt'"),
    ],
)
def test_each_plant_is_one_change_of_behaviour(
    name: str, change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant = gate_power.PLANTS[name]
    doc = gate_power.derived_suite(2, plant)
    assert _diff(gate_power.derived_suite(2), doc) == [change]
    suite = _load(doc, tmp_path, monkeypatch)  # the framework and the workload accept it
    ids = {sc.id for sc in suite.scenarios()}
    assert set(plant.scenarios) <= ids


def test_the_until_decided_set_changes_only_its_repeats_and_drops_the_slos() -> None:
    fixed, until = gate_power.derived_suite(4), gate_power.derived_suite((2, 6))
    assert _diff(fixed, until) == [
        ".matrix.repeats: 4 -> {'min': 2, 'max': 6, 'until': 'decided'}",
        f".slos: {fixed['slos']!r} -> None",
    ]
