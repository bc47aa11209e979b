"""Render report blocks as one HTML page: inline CSS, suite-level figures embedded as base64 PNG, per-run
timeline plots shown or linked by their path relative to the report (they live in the run directories)."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path

from chaosbench.report.document import Block, Cell, Heading, Image, KeyValues, Link, Paragraph, Table

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
.missing { color: #a33; }
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
        css.append(",".join(f"#t{index} td:nth-child({i + 1})" for i in sorted(table.numeric))
                   + "{text-align:right;font-variant-numeric:tabular-nums}")  # fmt: skip
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
    style = _CSS + "\n".join(css)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(title)}</title>\n<style>{style}\n</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
