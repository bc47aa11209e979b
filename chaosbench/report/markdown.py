"""Render report blocks as GitHub-flavoured Markdown.

Images are linked by their path relative to the report; anchors are HTML-only (Markdown viewers rewrite ids).
"""

from __future__ import annotations

from collections.abc import Iterable

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


def _cell(cell: Cell) -> str:
    if isinstance(cell, Link):
        text = f"[{_escape(cell.text)}]({cell.md_href})"
    else:
        text = _escape(str(cell))
    return text or " "


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(table: Table) -> list[str]:
    out = []
    if table.caption:
        out += [f"*{table.caption}*", ""]
    out.append("| " + " | ".join(_escape(h) for h in table.headers) + " |")
    seps = ["---:" if i in table.numeric else "---" for i in range(len(table.headers))]
    out.append("| " + " | ".join(seps) + " |")
    for row in table.rows:
        cells = [_cell(c) for c in row] + [" "] * (len(table.headers) - len(row))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _score_cell(cell: ScoreCell | None) -> str:
    if cell is None:
        return "not run"
    text = "; ".join(_escape(line) for line in cell.lines)
    if cell.runs:
        text += " · runs " + " ".join(_cell(r) for r in cell.runs)
        if cell.more_runs:
            text += f" … {cell.more_runs} more"
    return text


def _scorecard(card: Scorecard) -> list[str]:
    """The grid as a table (the colours by time are HTML's only)."""
    out = []
    if card.caption:
        out += [f"*{card.caption}*", ""]
    out.append("| " + " | ".join(_escape(h) for h in ["framework", *card.columns]) + " |")
    out.append("| " + " | ".join("---" for _ in range(len(card.columns) + 1)) + " |")
    for fw, cells in card.rows:
        out.append("| " + " | ".join([_escape(fw), *(_score_cell(c) for c in cells)]) + " |")
    return out


def render_markdown(blocks: Iterable[Block]) -> str:
    """The whole report as one Markdown string, blocks separated by blank lines."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, KeyValues):
            parts.append("\n".join(f"- **{k}:** {v}" for k, v in block.items))
        elif isinstance(block, Table):
            parts.append("\n".join(_table(block)))
        elif isinstance(block, Scorecard):
            parts.append("\n".join(_scorecard(block)))
        elif isinstance(block, Image):
            alt = block.alt.replace("[", "(").replace("]", ")")
            parts.append(f"![{alt}]({block.rel_path})")
    return "\n\n".join(parts) + "\n"
