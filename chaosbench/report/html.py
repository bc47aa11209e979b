"""Render report blocks as one HTML page: inline CSS, suite-level figures embedded as base64 PNG, per-run
timeline plots shown or linked by their path relative to the report (they live in the run directories).

The markup is a Jinja2 template (``templates/report.html.j2``, its style sheet ``templates/report.css``) rendered
with autoescape: every text of the report is escaped by the template engine. This module works out what the
template cannot (which tables right-align which columns, the embedded images' data, the scorecard's colour
scale) and hands it over as plain values."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from chaosbench.report.document import (
    Block,
    Cell,
    Heading,
    Image,
    KeyValues,
    Link,
    Paragraph,
    Scorecard,
    ScoreCell,
    Table,
)

TEMPLATE = "report.html.j2"
MACROS = "blocks.html.j2"
STYLE_SHEET = "report.css"


@cache
def _environment() -> jinja2.Environment:
    """The template environment (built once): templates from this package, autoescape on, block tags alone on
    their line leave no blank line; tests name the block kinds."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("chaosbench.report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    kinds: dict[str, type] = {
        "link": Link,
        "heading": Heading,
        "paragraph": Paragraph,
        "keyvalues": KeyValues,
        "table": Table,
        "image": Image,
        "scorecard": Scorecard,
    }
    for name, kind in kinds.items():
        env.tests[name] = lambda value, kind=kind: isinstance(value, kind)
    return env


def _macro(name: str) -> Any:
    """A macro of the report's template, callable from Python (the unit tests render single cells with it)."""
    return getattr(_environment().get_template(MACROS).module, name)


def _image_data(image: Image, base_dir: Path) -> tuple[str | None, str | None]:
    """(the PNG's base64, None) for an embedded image; (None, why) when it cannot be read; (None, None) for a
    linked one."""
    if not image.embed:
        return None, None
    try:
        return base64.b64encode((base_dir / image.rel_path).read_bytes()).decode("ascii"), None
    except OSError as exc:
        return None, str(exc)


def _numeric_rule(index: int, table: Table) -> str:
    """The CSS rule that right-aligns ``table``'s numeric columns (the table has ``id="t<index>"``)."""
    return (
        ",".join(f"#t{index} td:nth-child({i + 1})" for i in sorted(table.numeric))
        + "{text-align:right;font-variant-numeric:tabular-nums}"
    )


#: Scorecard colours by time: short (green) -> medium (yellow) -> long (orange), light enough for dark text.
_SCALE = ((0xC7, 0xE9, 0xC0), (0xFE, 0xE0, 0x8B), (0xFC, 0x8D, 0x59))


def _colour(frac: float) -> str:
    """The scale's colour at ``frac`` (0..1), as ``#rrggbb``."""
    frac = min(max(frac, 0.0), 1.0) * (len(_SCALE) - 1)
    i = min(int(frac), len(_SCALE) - 2)
    a, b, t = _SCALE[i], _SCALE[i + 1], frac - i
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


class _TimeScale:
    """Seconds -> 0..1 over the scorecard's range: logarithmic when it spans more than tenfold (recoveries of
    0.5 s and 60 s both readable), else linear; one value alone sits mid-scale."""

    def __init__(self, values: list[float]) -> None:
        self.lo, self.hi = (min(values), max(values)) if values else (0.0, 0.0)
        self.log = self.lo > 0 and self.hi / self.lo > 10

    def _f(self, v: float) -> float:
        return math.log(v) if self.log else v

    def frac(self, v: float) -> float:
        if self.hi <= self.lo:
            return 0.5
        return (self._f(v) - self._f(self.lo)) / (self._f(self.hi) - self._f(self.lo))

    def at(self, frac: float) -> float:
        """The seconds at ``frac`` (the legend's labels)."""
        x = self._f(self.lo) + frac * (self._f(self.hi) - self._f(self.lo))
        return math.exp(x) if self.log else x


@dataclass
class ScoreCellView:
    """What one scorecard cell shows: its CSS ``classes``, its ``background`` colour (None: none, no time to
    colour by), its tooltip ``title`` and the cell's own text and links."""

    classes: list[str]
    background: str | None
    title: str
    lines: list[str]
    anchor: str | None
    runs: list[Cell]
    more_runs: int


def score_cell_view(cell: ScoreCell, scale: _TimeScale) -> ScoreCellView:
    """How ``cell`` looks: unusable (grey, with why), no fault fired, nothing recovered (hatched: red when some
    did not recover, blue when all outlasted), else coloured by its seconds and outlined red (some not recovered)
    or dashed blue (some outlasted)."""
    classes: list[str] = []
    background = None
    if cell.unusable is not None:
        classes.append("sc-unusable")
    elif not cell.fired:
        classes.append("sc-unfired")
    elif cell.seconds is None:
        classes.append(
            "sc-none-nr" if cell.not_recovered else "sc-none-out" if cell.outlasted else "sc-unfired"
        )
    else:
        background = _colour(scale.frac(cell.seconds))
        if cell.not_recovered:
            classes.append("sc-nr")
        elif cell.outlasted:
            classes.append("sc-out")
    return ScoreCellView(
        classes=classes,
        background=background,
        title=cell.unusable or "",
        lines=cell.lines,
        anchor=cell.anchor,
        runs=cell.runs,
        more_runs=cell.more_runs,
    )


def _score_cell(cell: ScoreCell | None, scale: _TimeScale) -> str:
    """One cell's markup (``<td ...>``, no end tag), as the report's template writes it."""
    return str(_macro("score_cell")(None if cell is None else score_cell_view(cell, scale)))


@dataclass
class ScorecardView:
    """What the template needs of a scorecard beyond the card: its legend's ``ticks`` (colour, seconds as
    written), whether the scale is logarithmic, and each row's cell views."""

    ticks: list[tuple[str, str]] = field(default_factory=list)
    log: bool = False
    rows: list[tuple[str, list[ScoreCellView | None]]] = field(default_factory=list)


def _scorecard_view(card: Scorecard) -> ScorecardView:
    """The card's colour scale over the seconds of its usable cells, its legend's ticks and its cells' views."""
    seconds = [
        c.seconds
        for _, cells in card.rows
        for c in cells
        if c is not None and c.seconds is not None and c.unusable is None
    ]
    scale = _TimeScale(seconds)
    ticks: list[tuple[str, str]] = []
    if seconds:
        fracs = (0.0, 0.5, 1.0) if scale.hi > scale.lo else (0.5,)
        ticks = [(_colour(f), f"{scale.at(f):.3g}") for f in fracs]
    rows = [
        (fw, [None if c is None else score_cell_view(c, scale) for c in cells]) for fw, cells in card.rows
    ]
    return ScorecardView(ticks=ticks, log=scale.log, rows=rows)


def _with_extras(blocks: Iterable[Block], base_dir: Path, rules: list[str]) -> list[tuple[Block, Any]]:
    """Each block with what its markup needs beyond itself: a heading's level (1-6), a table's id index (None:
    no numeric column; its right-align rule appended to ``rules``), an image's (data, error), a scorecard's
    view."""
    items: list[tuple[Block, Any]] = []
    for block in blocks:
        extra: Any = None
        if isinstance(block, Heading):
            extra = min(max(block.level, 1), 6)
        elif isinstance(block, Table) and block.numeric:
            extra = len(rules)
            rules.append(_numeric_rule(extra, block))
        elif isinstance(block, Image):
            extra = _image_data(block, base_dir)
        elif isinstance(block, Scorecard):
            extra = _scorecard_view(block)
        items.append((block, extra))
    return items


def render_html(blocks: Iterable[Block], base_dir: Path, title: str) -> str:
    """The whole report as one HTML document; images with ``embed`` are read from ``base_dir`` and embedded."""
    env = _environment()
    rules: list[str] = []
    items = _with_extras(blocks, base_dir, rules)
    assert env.loader is not None
    css, _, _ = env.loader.get_source(env, STYLE_SHEET)
    return env.get_template(TEMPLATE).render(
        items=items,
        title=title,
        # the style sheet and the rules built from column indexes: no text of the report in them
        css=Markup(css),
        table_css=Markup("\n".join(rules)),
    )
