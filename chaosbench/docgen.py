"""Generated documentation and code, from one source each: the README's table of timeline events (from the event
models, :mod:`chaosbench.timeline.schema`), its metric tables (from :mod:`chaosbench.analysis.metric_docs`) and the
standard-library table the ranks check their events against (:mod:`chaosbench.timeline.kinds`, from the models).

    python -m chaosbench.docgen --write   # rewrite README.md's generated regions and chaosbench/timeline/kinds.py
    python -m chaosbench.docgen --check   # exit 1 (naming them) when either differs from what is generated

A generated region of README.md is delimited by ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` (NAME:
a key of :data:`REGIONS`); everything between is replaced, the rest of the file is left as it is. Unit tests
(tests/unit/test_timeline_schema.py) fail when README.md or kinds.py is not what this module generates.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
KINDS_PY = Path(__file__).resolve().parent / "timeline" / "kinds.py"
END = "<!-- end generated -->"
_BEGIN = re.compile(r"<!-- generated: ([a-z-]+) -->")


# ------------------------------------------------------------------------------------------------ event table
def type_name(annotation: Any) -> str:
    """A field's type as the tables write it: ``int``, ``float``, ``str | null``, ``list[int]``, ``"a" | "b"``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" if isinstance(a, int) else f'`"{a}"`' for a in args)
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]" if args else "dict"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "str"
    return getattr(annotation, "__name__", str(annotation))


def _doc(obj: Any) -> str:
    return " ".join((obj.__doc__ or "").split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def events_table() -> str:
    """The Markdown table of every event kind: who writes it, what it records and its fields (bold: required).
    A field several kinds share with the same meaning (a rank's ``rank``, a log line's ``proc``) is explained once,
    above the table, and only named in the rows."""
    from chaosbench.timeline.events import COMMON_FIELDS
    from chaosbench.timeline.schema import MODELS, EventModel

    uses: dict[tuple[str, str], int] = {}
    for m in MODELS.values():
        for name, f in m.model_fields.items():
            uses[(name, f.description or "")] = uses.get((name, f.description or ""), 0) + 1
    shared: dict[str, list[str]] = {}
    for (name, desc), n in uses.items():
        if n >= 3 and name not in COMMON_FIELDS:
            shared.setdefault(name, []).append(desc)
    common = "; ".join(f"`{n}` {type_name(f.annotation)}: {f.description}" for n, f in EventModel.model_fields.items())
    glossary = "; ".join(f"`{n}`: {' / '.join(ds)}" for n, ds in shared.items())
    lines = [
        f"Every event has {common}. The fields of each kind follow (**bold**: always there; the others may be "
        f"absent, and no other is allowed). Where a row names a field without saying what it is: {glossary}.",
        "",
        "| kind | written by | what it records | fields |",
        "| --- | --- | --- | --- |",
    ]
    for kind, m in MODELS.items():
        fields = []
        for name, f in m.model_fields.items():
            if name in COMMON_FIELDS:
                continue
            shown = f"**`{name}`**" if f.is_required() else f"`{name}`"
            desc = f.description or ""
            said = "" if uses[(name, desc)] >= 3 else f": {_cell(desc)}"
            fields.append(f"{shown} {type_name(f.annotation)}{said}")
        lines.append(f"| `{kind.value}` | {_cell(m.WRITERS)} | {_cell(_doc(m))} | {'; '.join(fields)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- metric tables
def metrics_table(name: str) -> str:
    """The Markdown table of metric table ``name`` (a key of :data:`chaosbench.analysis.metric_docs.TABLES`)."""
    from chaosbench.analysis.metric_docs import TABLES

    lines = ["| metric | meaning |", "| --- | --- |"]
    lines += [f"| {row.label} | {row.meaning} |" for row in TABLES[name]]
    return "\n".join(lines)


def _metric_region(name: str) -> Callable[[], str]:
    return lambda: metrics_table(name)


#: The generated regions of README.md: name -> what generates its content.
REGIONS: dict[str, Callable[[], str]] = {
    "events": events_table,
    "metrics": _metric_region("metrics"),
    "serving-metrics": _metric_region("serving-metrics"),
    "run-record": _metric_region("run-record"),
}


def render_readme(text: str) -> str:
    """``text`` with every generated region's content replaced by what :data:`REGIONS` generates. Raises
    ValueError for an unknown region or one without its end marker."""
    out: list[str] = []
    pos = 0
    for m in _BEGIN.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        if name not in REGIONS:
            raise ValueError(f"README region '{name}' is not generated here (known: {', '.join(REGIONS)})")
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"README region '{name}' has no '{END}'")
        out += [text[pos : m.end()], "\n\n", REGIONS[name](), "\n\n"]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def regions(text: str) -> list[str]:
    """The names of the generated regions in ``text``, in order."""
    return [m.group(1) for m in _BEGIN.finditer(text)]


# ------------------------------------------------------------------------------------------------- kinds.py
def kinds_module() -> str:
    """The text of :mod:`chaosbench.timeline.kinds`: the models' fields as a standard-library table."""
    from chaosbench.timeline.schema import stdlib_table

    lines = [
        '"""Every event kind\'s fields, for the standard-library check inside ranks',
        "(:func:`chaosbench.timeline.events.check_fields`). GENERATED from the models in",
        ":mod:`chaosbench.timeline.schema` by ``python -m chaosbench.docgen --write``: do not edit (a unit test fails",
        'when it differs from the models)."""',
        "",
        "#: kind -> field -> (required, the JSON types it may have: null, bool, int, float (an int too), str, list,",
        "#: dict, any). The common fields (t_ns, kind, src, host) are not in it.",
        "FIELDS: dict[str, dict[str, tuple[bool, tuple[str, ...]]]] = {",
    ]
    for kind, fields in stdlib_table().items():
        lines.append(f'    "{kind}": {{')
        for name, (required, json_types) in fields.items():
            ts = ", ".join(f'"{t}"' for t in json_types) + ("," if len(json_types) == 1 else "")
            lines.append(f'        "{name}": ({required}, ({ts})),')
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------ main
def stale(readme: Path = README, kinds_py: Path = KINDS_PY) -> list[Path]:
    """The generated files that differ from what is generated now."""
    out = []
    if readme.read_text() != render_readme(readme.read_text()):
        out.append(readme)
    if not kinds_py.exists() or kinds_py.read_text() != kinds_module():
        out.append(kinds_py)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaosbench.docgen", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="rewrite README.md's generated regions and kinds.py")
    g.add_argument("--check", action="store_true", help="exit 1 when README.md or kinds.py is not up to date")
    args = ap.parse_args(argv)
    if args.check:
        out = stale()
        for p in out:
            print(f"{p}: not what chaosbench.docgen generates (run python -m chaosbench.docgen --write)")
        return 1 if out else 0
    KINDS_PY.write_text(kinds_module())
    README.write_text(render_readme(README.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
