"""No module outside a plugin names it: analysis, reports and the runner (and, but for :data:`EXEMPT`, every
other module) learn what a fault, framework, runtime or workload is from the timeline and from what the plugin
declares, never by testing its name or its class.

The scan (:func:`name_checks`) reads the modules' syntax trees and reports, with file and line:

- a comparison (``==``, ``!=``, ``in``, ``not in``) of a registered plugin's name (a string literal, or a
  module-level constant holding one) with an expression that speaks of a plugin kind (its source mentions
  ``injector``, ``framework``, ``runtime`` or ``workload``: ``e.get("injector") == "sdc"``,
  ``runtime.name == "local"``, ``injector in ("kill", "hang")``);
- a table keyed by plugin names (a dict literal with three or more keys, all names of one registry);
- an ``isinstance``/``issubclass`` test against a registered plugin's class.

Names that are also ordinary words of the timeline (``restart`` is an event kind, ``hang`` a fault class,
``none`` a blame) are only reported in those plugin contexts, so ``e.kind == "restart"`` passes and
``framework == "restart"`` does not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from chaosbench.registry import FRAMEWORKS, INJECTORS, RUNTIMES, WORKLOADS, Registry

PACKAGE = Path(__file__).resolve().parents[2] / "chaosbench"
#: What must not name a plugin: the analysis, the reports and the runner.
SCANNED = ("analysis", "report", "runner.py")
REGISTRIES: tuple[Registry, ...] = (INJECTORS, FRAMEWORKS, RUNTIMES, WORKLOADS)
_PLUGIN_KIND = re.compile(r"injector|framework|runtime|workload", re.IGNORECASE)


def plugin_names() -> dict[str, set[str]]:
    """Each registry's kind -> every name a suite may use there (plugins and aliases)."""
    return {r.kind: set(r.names()) for r in REGISTRIES}


def plugin_classes() -> set[str]:
    """The class names of every registered plugin."""
    return {r.get(n).__name__ for r in REGISTRIES for n in r.names() if r.alias_of(n) is None}


def _module_constants(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and isinstance(node.value.value, str):
                    out[t.id] = node.value.value
    return out


def _strings(node: ast.expr, consts: dict[str, str]) -> list[str]:
    """The string values ``node`` stands for: a literal, a module constant, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in consts:
        return [consts[node.id]]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e, consts)]
    return []


def name_checks(source: str, where: str, names: dict[str, set[str]], classes: set[str]) -> list[str]:
    """Every place in ``source`` that tests a plugin's name or class (see the module's docstring)."""
    tree = ast.parse(source)
    consts = _module_constants(tree)
    every = set().union(*names.values())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(operands):
                named = [s for s in _strings(op, consts) if s in every]
                others = [ast.get_source_segment(source, o) or "" for j, o in enumerate(operands) if j != i]
                if named and any(_PLUGIN_KIND.search(o) for o in others):
                    found.append(
                        f"{where}:{node.lineno}: compares {', '.join(named)} with {' / '.join(others)}"
                    )
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            for kind, known in names.items():
                if len(keys) >= 3 and len(keys) == len(node.keys) and all(k in known for k in keys):
                    found.append(
                        f"{where}:{node.lineno}: a table keyed by {kind} names ({', '.join(keys[:3])}, ...)"
                    )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
        ):
            if len(node.args) == 2:
                tested = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                for t in tested:
                    name = (
                        t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                    )
                    if name in classes:
                        found.append(f"{where}:{node.lineno}: {node.func.id}(..., {name})")
    return found


def scanned_files(package: Path = PACKAGE) -> list[Path]:
    out: list[Path] = []
    for part in SCANNED:
        path = package / part
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def scan(package: Path = PACKAGE) -> list[str]:
    names, classes = plugin_names(), plugin_classes()
    return [
        hit
        for f in scanned_files(package)
        for hit in name_checks(f.read_text(), str(f.relative_to(package.parent)), names, classes)
    ]


def test_analysis_reports_and_runner_name_no_plugin() -> None:
    assert len(scanned_files()) > 20  # the scan sees the modules it is meant to
    assert scan() == []


#: The modules that may name plugins, and why: the name tables themselves, the reading of timelines written before
#: injectors declared their class, and the planted faults' in-rank half (it runs the entry its injector wrote,
#: which names the injector, inside ranks that cannot import the plugins).
EXEMPT = {
    "registry.py": "the registries: name -> plugin",
    "injectors/legacy.py": "legacy timelines: the name table analysis used before injectors declared themselves",
    "workloads/planted.py": "the planted injectors' in-rank half",
    "workloads/serve_replica.py": "the planted injectors' in-rank half in a serving replica",
}


def test_no_other_module_names_a_plugin() -> None:
    """Frameworks, runtimes, specs, the CLI and the rest ask declared capabilities too (Workload.serves,
    Framework.heals, BatchJobs, ...)."""
    names, classes = plugin_names(), plugin_classes()
    hits = [
        hit
        for f in sorted(PACKAGE.rglob("*.py"))
        if f.relative_to(PACKAGE).as_posix() not in EXEMPT
        for hit in name_checks(f.read_text(), str(f.relative_to(PACKAGE.parent)), names, classes)
    ]
    assert hits == []


@pytest.mark.parametrize(
    "code",
    [
        'INJECTOR = "corrupt-checkpoint"\nok = e.get("injector") == INJECTOR',
        'ok = e.get("injector") == "sdc" and e.get("checkpoint_step") is not None',
        'ok = fault.get("injector") == "partition"',
        'ok = injector == "kill" and sig in ("SIGSTOP",)',
        'ok = runtime.name == "local"',
        'ok = spec.framework != "torchft"',
        'ok = self.workload.name in ("ddp-mlp", "fsdp-lm")',
        'T = {"kill": "crash", "segfault": "crash", "hang": "hang"}',
        "ok = isinstance(rt, SlurmRuntime)",
    ],
)
def test_the_scan_finds_a_name_check(code: str) -> None:
    assert len(name_checks(code, "x.py", plugin_names(), plugin_classes())) == 1


@pytest.mark.parametrize(
    "code",
    [
        'ok = e.kind == "restart"',
        'ok = fault_class in ("crash", "hang", "node")',
        'ok = r.get("blame") == "none"',
        'ok = e.get("role") == "balancer"',
        'MIX = {"crash": 1.0, "node": 1.0, "hang": 1.0, "sdc": 1.0}',
        "ok = isinstance(rt, NodeControl)",
    ],
)
def test_the_scan_leaves_the_timeline_s_own_words(code: str) -> None:
    assert name_checks(code, "x.py", plugin_names(), plugin_classes()) == []
