"""Render report blocks as one HTML page: inline CSS, suite-level figures embedded as base64 PNG, per-run
timeline plots shown or linked by their path relative to the report (they live in the run directories)."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable
from pathlib import Path

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

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
caption { text-align: left; font-style: italic; padding-bottom: 3px; }
img { max-width: 100%; height: auto; display: block; margin: 0.3em 0 1em; }
ul.kv { list-style: none; padding-left: 0; } ul.kv li b { display: inline-block; min-width: 8em; }
ul.kv li { padding-left: 8em; text-indent: -8em; } ul.kv li b { text-indent: 0; } /* a long value wraps under itself */
.missing { color: #a33; }
table.sc { width: 100%; table-layout: fixed; } table.sc th:first-child { width: 7em; }
table.sc th { overflow-wrap: anywhere; } table.sc td { font-size: 0.85em; border: 3px solid #fff; }
table.sc td a { color: #123; } table.sc td.sc-empty { color: #aaa; background: #fafafa; }
p.sc-caption { font-style: italic; margin: 0.3em 0; font-size: 0.9em; }
table.sc td.sc-unusable { background: #e4e4e4; color: #555; } table.sc td.sc-unfired { background: #f4f4f4; }
.sc-nr { outline: 3px solid #c0392b; outline-offset: -3px; }
.sc-out { outline: 3px dashed #3d5a80; outline-offset: -3px; }
.sc-none-nr { background: repeating-linear-gradient(45deg, #f3c9c4 0 6px, #fff 6px 12px); }
.sc-none-out { background: repeating-linear-gradient(45deg, #cfd9e6 0 6px, #fff 6px 12px); }
.sc-runs { font-size: 0.85em; color: #444; }
ul.sc-legend { list-style: none; padding: 0; margin: 0 0 1em; font-size: 0.85em; }
ul.sc-legend li { display: inline-block; margin: 0 1em 0.3em 0; }
ul.sc-legend span { display: inline-block; width: 1.6em; height: 1em; vertical-align: middle; margin-right: 0.3em;
                    border: 1px solid #ccc; }
"""


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        return f'<a href="{_esc(cell.html_href)}">{_esc(cell.text)}</a>'
    return _esc(str(cell))


def _table(table: Table, index: int, css: list[str]) -> str:
    """One table. Numeric columns are right-aligned by one CSS rule per table (appended to ``css``), not a class
    on every cell, and the optional ``</td>``/``</tr>`` end tags are left out (HTML5): a third less markup in a
    10,000-run report's repeats tables."""
    attr = ""
    if table.numeric:
        attr = f' id="t{index}"'
        css.append(
            ",".join(f"#t{index} td:nth-child({i + 1})" for i in sorted(table.numeric))
            + "{text-align:right;font-variant-numeric:tabular-nums}"
        )
    out = [f"<table{attr}>"]
    if table.caption:
        out.append(f"<caption>{_esc(table.caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in table.headers) + "</tr></thead>")
    out.append("<tbody>")
    out += ["<tr><td>" + "<td>".join(_cell(c) for c in row) for row in table.rows]
    out.append("</tbody></table>")
    return "\n".join(out)


def _image(image: Image, base_dir: Path) -> str:
    anchor = f' id="{_esc(image.anchor)}"' if image.anchor else ""
    if not image.embed:
        return f'<img{anchor} alt="{_esc(image.alt)}" src="{_esc(image.rel_path)}" loading="lazy">'
    path = base_dir / image.rel_path
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError as exc:
        return f'<p{anchor} class="missing">— plot {_esc(image.rel_path)} could not be read: {_esc(str(exc))}</p>'
    return f'<img{anchor} alt="{_esc(image.alt)}" src="data:image/png;base64,{data}">'


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


def _score_cell(cell: ScoreCell | None, scale: _TimeScale) -> str:
    if cell is None:
        return '<td class="sc-empty">not run'
    classes, style, title = [], "", ""
    if cell.unusable is not None:
        classes.append("sc-unusable")
        title = cell.unusable
    elif not cell.fired:
        classes.append("sc-unfired")
    elif cell.seconds is None:
        classes.append(
            "sc-none-nr" if cell.not_recovered else "sc-none-out" if cell.outlasted else "sc-unfired"
        )
    else:
        style = f' style="background:{_colour(scale.frac(cell.seconds))}"'
        if cell.not_recovered:
            classes.append("sc-nr")
        elif cell.outlasted:
            classes.append("sc-out")
    first = f"<b>{_esc(cell.lines[0])}</b>" if cell.lines else ""
    if cell.anchor:
        first = f'<a href="#{_esc(cell.anchor)}">{first}</a>'
    body = "<br>".join([first, *(_esc(line) for line in cell.lines[1:])])
    if cell.runs:
        more = f" … {cell.more_runs} more" if cell.more_runs else ""
        body += '<div class="sc-runs">runs ' + " ".join(_cell(r) for r in cell.runs) + more + "</div>"
    cls = f' class="{" ".join(classes)}"' if classes else ""
    tip = f' title="{_esc(title)}"' if title else ""
    return f"<td{cls}{style}{tip}>{body}"


def _scorecard(card: Scorecard) -> str:
    """The grid, coloured by time, and its legend (inline CSS only: the page stands alone)."""
    seconds = [
        c.seconds
        for _, cells in card.rows
        for c in cells
        if c is not None and c.seconds is not None and c.unusable is None
    ]
    scale = _TimeScale(seconds)
    legend = []
    if seconds:
        ticks = (0.0, 0.5, 1.0) if scale.hi > scale.lo else (0.5,)
        legend += [
            f'<li><span style="background:{_colour(f)}"></span>{scale.at(f):.3g} s</li>' for f in ticks
        ]
        legend.append(f"<li>{_esc(card.measure)}{', log scale' if scale.log else ''}</li>")
    legend += [
        '<li><span class="sc-nr" style="background:#fff"></span>some not recovered</li>',
        '<li><span class="sc-out" style="background:#fff"></span>some outlasted</li>',
        '<li><span class="sc-none-nr"></span>none recovered</li>',
        '<li><span class="sc-none-out"></span>all outlasted</li>',
        '<li><span style="background:#e4e4e4"></span>unusable (hover: why)</li>',
    ]
    out = []
    if card.caption:
        out.append(f'<p class="sc-caption">{_esc(card.caption)}</p>')
    out.append('<ul class="sc-legend">' + "".join(legend) + "</ul>")
    out.append('<table class="sc">')
    out.append("<thead><tr><th>framework" + "".join(f"<th>{_esc(c)}" for c in card.columns) + "</tr></thead>")
    out.append("<tbody>")
    out += [f"<tr><th>{_esc(fw)}" + "".join(_score_cell(c, scale) for c in cells) for fw, cells in card.rows]
    out.append("</tbody></table>")
    return "\n".join(out)


def render_html(blocks: Iterable[Block], base_dir: Path, title: str) -> str:
    """The whole report as one HTML document; images with ``embed`` are read from ``base_dir`` and embedded."""
    body: list[str] = []
    css: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            level = min(max(block.level, 1), 6)
            anchor = f' id="{_esc(block.anchor)}"' if block.anchor else ""
            body.append(f"<h{level}{anchor}>{_esc(block.text)}</h{level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p>{_esc(block.text)}</p>")
        elif isinstance(block, KeyValues):
            items = "".join(f"<li><b>{_esc(k)}:</b> {_esc(v)}</li>" for k, v in block.items)
            body.append(f'<ul class="kv">{items}</ul>')
        elif isinstance(block, Table):
            body.append(_table(block, len(css), css))
        elif isinstance(block, Image):
            body.append(_image(block, base_dir))
        elif isinstance(block, Scorecard):
            body.append(_scorecard(block))
    style = _CSS + "\n".join(css)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(title)}</title>\n<style>{style}\n</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
