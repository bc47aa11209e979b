"""The package's shape: data flows one way (no import cycle inside chaosbench, TYPE_CHECKING and function-level
imports included) and no module reaches into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "chaosbench"

#: Private names of other libraries that chaosbench must use, each for a stated reason.
FOREIGN_PRIVATES = {
    "os._exit",  # public API despite the underscore: leave without running atexit hooks (fsdp_lm)
    "agent_cls._start_workers",  # torch elastic's agent: number incarnations by rendezvous round
    "parser._actions",  # argparse: a parser's arguments, for the generated CLI reference (docgen)
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("chaosbench"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
    return {m for m in found if m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_the_package() -> None:
    modules = _modules()
    # a package's __init__ importing its own submodules is no cycle of concepts
    graph = {
        m: {i for i in _imports(p, modules) if not (p.name == "__init__.py" and i.startswith(m + "."))}
        for m, p in modules.items()
    }
    assert _cycles(graph) == []


def test_no_module_touches_another_ones_private_names() -> None:
    offenders = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("chaosbench"):
                offenders += [
                    f"{mod}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
            if not (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if ast.unparse(node) not in FOREIGN_PRIVATES:
                offenders.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_metric_names_are_defined_once() -> None:
    """Tables, baselines and SLO validation name metrics from RunMetrics' fields."""
    from chaosbench.analysis.baseline import HIGHER_IS_BETTER, LOWER_IS_BETTER
    from chaosbench.analysis.metrics import FAULT_METRICS, RunMetrics, metric_names
    from chaosbench.report.tables import COLUMNS, METRICS

    fields = set(RunMetrics.__dataclass_fields__)
    assert set(COLUMNS) == fields
    assert set(metric_names()) < fields
    for names in (LOWER_IS_BETTER, HIGHER_IS_BETTER, FAULT_METRICS, [m for m, _ in METRICS]):
        assert set(names) <= fields, set(names) - fields


def test_test_files_have_unique_basenames() -> None:
    """pytest imports test modules by basename (no packages under tests/): two alike fail collection."""
    from collections import Counter

    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
