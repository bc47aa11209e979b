"""Suites generated from the suite schema, and the property every one of them must hold.

The property (:func:`check_suite_file`): ``chaosbench run SUITE --dry-run`` either refuses the suite with one
line naming the file and the line (exit 2), or accepts it and prints its plans within seconds (exit 0); nothing
else escapes: no traceback, no harness error, no hang.

The suites (:func:`suites`): the repository's own suites, each changed where the schema (``chaosbench schema``,
:func:`chaosbench.cli.suite_schema`) says a value lies: a value drawn from the schema at that place (valid or
not), a hostile one (the wrong type, out of range, huge, empty), a key deleted, renamed or unknown, or the YAML
text broken; and whole suites drawn from the schema alone. Used by ``tests/unit/test_suite_fuzz.py`` (bounded)
and ``benchmarks/suite_fuzz.py`` (1,000 and the counts).
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

#: Values of the wrong type, out of range, huge or empty: what a typo or a careless edit puts in a suite.
HOSTILE: list[Any] = [
    True,
    False,
    None,
    "",
    " ",
    "x" * 5000,
    0,
    -1,
    1.5,
    1e12,
    10**12,
    10**18,
    1e18,
    -1e18,
    float("inf"),
    float("nan"),
    [],
    {},
    [1, "a"],
    {"a": 1},
    "1e12",
    "yes",
    "random",
    "0",
]


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = {**defs[node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def from_schema(node: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a JSON-schema node (the subset pydantic writes: objects, arrays, anyOf/oneOf, enums, bounds),
    mostly valid, with its bounds' edges and a little beyond them."""
    node = _resolve(node, defs)
    if depth > 6:
        return st.sampled_from(HOSTILE)
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return st.one_of([from_schema(n, defs, depth + 1) for n in node[key]])
    kind = node.get("type")
    if kind == "object":
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        if not props and isinstance(extra, dict):  # a mapping of names (faults, frameworks, slos)
            return st.dictionaries(
                st.text("abcdefghk-1", min_size=1, max_size=8),
                from_schema(extra, defs, depth + 1),
                max_size=3,
            )
        required = sorted(node.get("required", []))
        optional = sorted(set(props) - set(required))
        fixed = st.fixed_dictionaries({k: from_schema(props[k], defs, depth + 1) for k in required})
        return st.builds(lambda a, b: {**b, **a}, fixed, _optional(props, optional, defs, depth))
    if kind == "array":
        return st.lists(
            from_schema(node.get("items", {}), defs, depth + 1), min_size=node.get("minItems", 0), max_size=3
        )
    if kind == "integer":
        lo = node.get("minimum", node.get("exclusiveMinimum", -1) + 1 if "exclusiveMinimum" in node else -5)
        return st.one_of(st.integers(lo, lo + 100), st.integers(lo - 2, lo), st.sampled_from([10**6, 10**12]))
    if kind == "number":
        lo = node.get("minimum", node.get("exclusiveMinimum", -5))
        return st.one_of(st.floats(lo, lo + 500, allow_nan=False), st.sampled_from([lo, lo - 1, 1e12, 1e18]))
    if kind == "string":
        return st.one_of(
            st.text("abcdefghijklmnopqrstuvwxyz-_0123456789", max_size=12), st.sampled_from(["", "x" * 300])
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.sampled_from(HOSTILE)


def _optional(
    props: dict[str, Any], optional: list[str], defs: dict[str, Any], depth: int
) -> st.SearchStrategy[dict[str, Any]]:
    if not optional:
        return st.just({})
    return st.lists(st.sampled_from(optional), unique=True, max_size=min(4, len(optional))).flatmap(
        lambda keys: st.fixed_dictionaries({k: from_schema(props[k], defs, depth + 1) for k in keys})
    )


def schema_at(schema: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema node of a place in a suite (None where the schema says nothing: a plugin's own options)."""
    defs = schema.get("$defs", {})
    node: dict[str, Any] | None = schema
    for part in path:
        if node is None:
            return None
        node = _resolve(node, defs)
        choices = node.get("anyOf") or node.get("oneOf")
        if choices:
            fitting = [
                _resolve(c, defs) for c in choices if _resolve(c, defs).get("type") in ("object", "array")
            ]
            node = fitting[0] if fitting else None
            if node is None:
                return None
        if isinstance(part, int):
            node = node.get("items")
        else:
            props = node.get("properties", {})
            extra = node.get("additionalProperties")
            node = props.get(part) if part in props else (extra if isinstance(extra, dict) else None)
    return node


def _paths(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, path + (i,))


def _parent(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


@dataclass(frozen=True)
class FuzzCase:
    """A generated suite: its YAML text and how it was made (for the report of a failure)."""

    text: str
    how: str


def _mutate(draw: Any, data: dict[str, Any], schema: dict[str, Any]) -> str:
    paths = list(_paths(data))
    if not paths:
        return "empty suite"
    path = draw(st.sampled_from(paths))
    parent = _parent(data, path)
    key = path[-1]
    kind = draw(st.sampled_from(["schema", "hostile", "delete", "rename", "unknown"]))
    if kind == "schema" and (node := schema_at(schema, path)) is not None:
        parent[key] = draw(from_schema(node, schema.get("$defs", {})))
    elif kind in ("hostile", "schema"):
        kind = "hostile"
        parent[key] = draw(st.sampled_from(HOSTILE))
    elif kind == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        value = parent.pop(key) if kind == "rename" else draw(st.sampled_from(HOSTILE))
        parent[f"{key}x" if kind == "rename" else "unknown_key"] = value
    else:
        parent.append(draw(st.sampled_from(HOSTILE)))
    return f"{kind} at {'.'.join(str(p) for p in path)}"


@st.composite
def suites(draw: Any, bases: dict[str, str], schema: dict[str, Any]) -> FuzzCase:
    """A suite to try: one of ``bases`` (name -> YAML text) with 1 to 3 changes (:func:`_mutate`), its text
    sometimes broken; or one drawn from ``schema`` alone."""
    if draw(st.integers(0, 9)) == 0:
        data = draw(from_schema(schema, schema.get("$defs", {})))
        return FuzzCase(yaml.safe_dump(data, sort_keys=False), "drawn from the schema")
    name = draw(st.sampled_from(sorted(bases)))
    data = yaml.safe_load(bases[name])
    hows = [_mutate(draw, data, schema) for _ in range(draw(st.integers(1, 3)))]
    text = yaml.safe_dump(data, sort_keys=False, width=200)
    if draw(st.integers(0, 9)) == 0:  # broken YAML: a character dropped or added somewhere
        at = draw(st.integers(0, max(0, len(text) - 1)))
        text = text[:at] + draw(st.sampled_from(["", ":", "{", "[", "'", '"', "\t", "- "])) + text[at + 1 :]
        hows.append(f"text changed at {at}")
    return FuzzCase(text, f"{name}: {'; '.join(hows)}")


class TookTooLong(Exception):
    """A dry-run that did not answer in time."""


@dataclass(frozen=True)
class Verdict:
    """How a suite was answered: ``refused`` (one line with file:line), ``accepted`` (a dry-run with plans), or
    ``escaped`` (anything else: the property fails), with the time it took and what was printed last."""

    kind: str
    elapsed_s: float
    detail: str


def check_suite_file(path: Path, out: Path, limit_s: float = 10.0) -> Verdict:
    """Dry-run the suite at ``path`` in this process and say how it was answered (see :class:`Verdict`).

    ``limit_s``: past it the dry-run is interrupted (SIGALRM; main thread only) and counted as escaped."""
    from chaosbench.cli import main

    err, stdout = io.StringIO(), io.StringIO()

    def alarm(_signum: int, _frame: Any) -> None:
        raise TookTooLong(f"no answer within {limit_s:g} s")

    old = signal.signal(signal.SIGALRM, alarm)
    outer_s, _ = signal.setitimer(
        signal.ITIMER_REAL, limit_s
    )  # a timer already set (pytest-timeout) goes on after
    t = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
            rc = main(["run", str(path), "--dry-run", "--out", str(out)])
    except TookTooLong as exc:
        return Verdict("escaped", time.monotonic() - t, str(exc))
    except BaseException as exc:  # noqa: BLE001 - the property is that nothing escapes: report what did
        return Verdict("escaped", time.monotonic() - t, f"{type(exc).__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_s:
            signal.setitimer(signal.ITIMER_REAL, max(outer_s - (time.monotonic() - t), 0.001))
    elapsed = time.monotonic() - t
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("chaosbench: error: ")]
    if rc == 2 and len(errors) == 1:
        msg = errors[0].removeprefix("chaosbench: error: ")
        if re.match(re.escape(str(path)) + r":\d+: \S", msg) or re.match(
            re.escape(str(path)) + r": suite '.*' is too large: ", msg
        ):
            return Verdict("refused", elapsed, msg)
        return Verdict("escaped", elapsed, f"refused without file:line: {msg}")
    if rc == 0 and not errors and '"runs"' in stdout.getvalue():
        return Verdict("accepted", elapsed, "")
    return Verdict("escaped", elapsed, f"exit {rc}: {err.getvalue().strip()[-500:]}")


def project_suites(root: Path) -> dict[str, str]:
    """The repository's own suites (``suites/*.yaml``): name -> text."""
    return {p.name: p.read_text() for p in sorted((root / "suites").glob("*.yaml"))}
