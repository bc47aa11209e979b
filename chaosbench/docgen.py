"""Generated documentation and code, from one source each: the docs site's reference tables (docs/): the timeline
events (from the event models, :mod:`chaosbench.timeline.schema`), the metrics (from
:mod:`chaosbench.analysis.metric_docs`), the injectors and their parameters (from each injector's ``Params``
model), the frameworks with their options and timeouts (from each adapter's ``Options`` model and ``timeouts``),
the CLI (from :func:`chaosbench.cli.build_parser`); and the standard-library table the ranks check their events
against (:mod:`chaosbench.timeline.kinds`, from the models).

    python -m chaosbench.docgen --write   # rewrite the docs pages' generated regions and chaosbench/timeline/kinds.py
    python -m chaosbench.docgen --check   # exit 1 (naming them) when any differs from what is generated

A generated region of a page is delimited by ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` (NAME:
a key of :data:`REGIONS`, found in the page :data:`PAGES` names for it); everything between is replaced, the rest
of the page is left as it is. Unit tests (tests/unit/test_timeline_schema.py) fail when a page or kinds.py is not
what this module generates, or a page lacks its region.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
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
    common = "; ".join(
        f"`{n}` {type_name(f.annotation)}: {f.description}" for n, f in EventModel.model_fields.items()
    )
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


# ------------------------------------------------------------------------------------------ plugin references
def _value(value: Any) -> str:
    """A default as a suite's YAML would write it: ``true``, ``null``, ``"block"``, ``[]``."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def _field_rows(model: Any) -> list[str]:
    """One table row per field of the pydantic ``model``: name, type, default (or required), description."""
    rows = []
    for name, f in model.model_fields.items():
        if f.is_required():
            default = "required"
        else:
            value = f.default_factory() if f.default_factory is not None else f.default
            default = f"`{_value(value)}`"
        rows.append(
            f"| `{name}` | {type_name(f.annotation)} | {_cell(default)} | {_cell(f.description or '')} |"
        )
    return rows


def _summary(cls: Any) -> str:
    """A plugin's one-paragraph summary: its ``summary``, else its docstring's first paragraph."""
    text = getattr(cls, "summary", "") or (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split())


def injectors_reference() -> str:
    """Every injector of the registry (built-ins and installed plugins): what it does, what it declares about
    its faults, and its parameters (from its ``Params`` model and the fields' descriptions)."""
    from chaosbench.registry import INJECTORS

    names = sorted(INJECTORS.builtins())
    aliases = {a: n for a, n in INJECTORS.aliases().items() if n in names}
    lines = [
        "Each injector's parameters go under a fault's `params:` in a suite (or a `faults/` definition); the suite "
        "is refused with its line when one is unknown or of the wrong type. `chaosbench faults` prints the same, "
        "with any installed plugin's. This page lists the injectors chaosbench ships.",
        "",
    ]
    if aliases:
        lines += ["Other names: " + ", ".join(f"`{a}` (= `{n}`)" for a, n in aliases.items()) + ".", ""]
    for name in names:
        cls = INJECTORS.get(name)
        lines += [f"### `{name}`", "", _summary(cls), ""]
        facts = []
        if getattr(cls, "planted", False):
            facts.append("planted (fires from inside the workload)")
        if getattr(cls, "needs_node_control", False):
            facts.append("needs a runtime with node control")
        if getattr(cls, "role_targets", False):
            facts.append("can target a process by `role`")
        if not getattr(cls, "requires_trigger", True):
            facts.append("no trigger (its parameters say when)")
        if facts:
            lines += ["- " + "; ".join(facts), ""]
        fields = cls.Params.model_fields
        if fields:
            lines += [
                "| parameter | type | default | meaning |",
                "| --- | --- | --- | --- |",
                *_field_rows(cls.Params),
            ]
        else:
            lines.append("No parameters.")
        lines.append("")
    return "\n".join(lines).rstrip()


class _DocJob:
    """The least of a :class:`~chaosbench.frameworks.base.JobContext` that an adapter's ``timeouts`` reads, to
    list its timeouts at their defaults; the workload's process-group timeout is shown as the workload's."""

    class _Workload:
        pg_timeout_s = "the workload's `pg_timeout_s`"

    workload = _Workload()
    ranks = 2
    nodes = 1
    ranks_per_node = 2
    #: Documenting, not running: an adapter whose timeouts depend on the installed version of its framework (nvrx)
    #: names them per version instead of reading the version installed where the docs are generated.
    documenting = True


def _timeouts_line(cls: Any) -> str:
    try:
        timeouts = cls("doc", cls.Options()).timeouts(_DocJob())
    except Exception as e:  # an adapter that reads the runtime (the scheduler's settings) when a run starts
        return (
            f"Timeouts in force: not listed here (`timeouts` needs a started run: {type(e).__name__}); each "
            "run records them in its `framework_info` event."
        )
    shown = ", ".join(f"`{k}` = {v if isinstance(v, str) else f'`{_value(v)}`'}" for k, v in timeouts.items())
    return f"Timeouts in force with the default options (recorded in every run's `framework_info` event): {shown}."


def frameworks_reference() -> str:
    """Every framework adapter of the registry: what it does, the roles a fault can target, whether it heals,
    the timeouts in force at its defaults and its options (from its ``Options`` model)."""
    from chaosbench.registry import FRAMEWORKS

    lines = [
        "A suite's `frameworks:` maps a label to an adapter's options (`adapter:` picks the adapter when the label "
        "differs); unknown options are refused with their line. This page lists the adapters chaosbench ships.",
        "",
    ]
    for name in sorted(FRAMEWORKS.builtins()):
        cls = FRAMEWORKS.get(name)
        lines += [f"### `{name}`", "", _summary(cls), ""]
        roles = ", ".join(f"`{r}` ({role.description})" for r, role in cls.roles.items())
        lines += [
            f"- Roles a fault can target: {roles or 'none'}",
            f"- Heals from a live peer: {'yes' if cls.heals else 'no'}",
            f"- {_timeouts_line(cls)}",
            "",
        ]
        if cls.Options.model_fields:
            lines += [
                "| option | type | default | meaning |",
                "| --- | --- | --- | --- |",
                *_field_rows(cls.Options),
            ]
        lines.append("")
    return "\n".join(lines).rstrip()


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's arguments. argparse has no public way to list them; its ``_actions`` is the one stable place (in
    every Python chaosbench supports), and the formatted help differs between versions."""
    return list(parser._actions)


def _cli_commands(parser: argparse.ArgumentParser, prog: str, lines: list[str]) -> None:
    """Append a section per subcommand of ``parser`` (and of theirs: ``image build``) to ``lines``."""
    sub = next((a for a in _actions(parser) if isinstance(a.choices, dict)), None)  # its subcommands
    for name, command in sub.choices.items() if sub else []:  # type: ignore[union-attr]
        lines += [f"### `{prog} {name}`", "", " ".join((command.description or "").split()), ""]
        rows = []
        for a in _actions(command):
            if (a.dest == "help" and a.nargs == 0) or isinstance(a.choices, dict):
                continue
            flags = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
            if a.option_strings and a.nargs != 0:
                flags += f" {a.metavar or a.dest.upper()}"
            shown = a.default not in (None, False, argparse.SUPPRESS) and a.option_strings
            default = f"`{_value(a.default)}`" if shown else ""
            rows.append(f"| {_cell(flags)} | {_cell(' '.join((a.help or '').split()))} | {_cell(default)} |")
        if rows:
            lines += ["| argument | meaning | default |", "| --- | --- | --- |", *rows, ""]
        _cli_commands(command, f"{prog} {name}", lines)


def cli_reference() -> str:
    """Every command of ``chaosbench`` and its arguments, from :func:`chaosbench.cli.build_parser`'s actions (not
    argparse's formatted help, whose layout differs between Python versions)."""
    from chaosbench.cli import build_parser

    parser = build_parser()
    lines = [f"`chaosbench`: {parser.description}", ""]
    _cli_commands(parser, "chaosbench", lines)
    return "\n".join(lines).rstrip()


#: The generated regions: name -> what generates its content.
REGIONS: dict[str, Callable[[], str]] = {
    "events": events_table,
    "metrics": _metric_region("metrics"),
    "serving-metrics": _metric_region("serving-metrics"),
    "run-record": _metric_region("run-record"),
    "injectors": injectors_reference,
    "frameworks": frameworks_reference,
    "cli": cli_reference,
}

#: The page of docs/ that holds each generated region.
PAGES: dict[str, Path] = {
    "events": DOCS / "events.md",
    "metrics": DOCS / "metrics.md",
    "serving-metrics": DOCS / "metrics.md",
    "run-record": DOCS / "metrics.md",
    "injectors": DOCS / "reference" / "injectors.md",
    "frameworks": DOCS / "reference" / "frameworks.md",
    "cli": DOCS / "reference" / "cli.md",
}


def render_page(text: str) -> str:
    """``text`` with every generated region's content replaced by what :data:`REGIONS` generates. Raises
    ValueError for an unknown region or one without its end marker."""
    out: list[str] = []
    pos = 0
    for m in _BEGIN.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        if name not in REGIONS:
            raise ValueError(f"region '{name}' is not generated here (known: {', '.join(REGIONS)})")
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"region '{name}' has no '{END}'")
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
def pages() -> list[Path]:
    """The pages that hold generated regions, each once, in :data:`PAGES`' order."""
    return list(dict.fromkeys(PAGES.values()))


def missing_regions() -> list[str]:
    """``NAME: PAGE`` for each region of :data:`PAGES` its page lacks (a region deleted by hand would otherwise
    leave the page unchecked)."""
    return [
        f"{name}: {page}"
        for name, page in PAGES.items()
        if not page.exists() or name not in regions(page.read_text())
    ]


def stale(kinds_py: Path = KINDS_PY) -> list[Path]:
    """The generated files that differ from what is generated now."""
    out = [page for page in pages() if page.exists() and page.read_text() != render_page(page.read_text())]
    if not kinds_py.exists() or kinds_py.read_text() != kinds_module():
        out.append(kinds_py)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaosbench.docgen", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--write", action="store_true", help="rewrite the docs pages' generated regions and kinds.py"
    )
    g.add_argument(
        "--check", action="store_true", help="exit 1 when a docs page or kinds.py is not up to date"
    )
    args = ap.parse_args(argv)
    lacking = missing_regions()
    for m in lacking:
        print(f"region {m}: the page lacks '<!-- generated: NAME -->' ... '{END}'")
    if args.check:
        out = stale()
        for p in out:
            print(f"{p}: not what chaosbench.docgen generates (run python -m chaosbench.docgen --write)")
        return 1 if out or lacking else 0
    KINDS_PY.write_text(kinds_module())
    for page in pages():
        if page.exists():
            page.write_text(render_page(page.read_text()))
    return 1 if lacking else 0


if __name__ == "__main__":
    sys.exit(main())
