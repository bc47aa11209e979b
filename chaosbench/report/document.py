"""A tiny document model: the report is built once as blocks, then rendered as Markdown and as HTML.

Keeping one model guarantees both renderings say the same thing; the renderers only decide markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    """A table cell that links somewhere: ``md_href`` in Markdown, ``html_href`` in HTML."""

    text: str
    md_href: str
    html_href: str

    def __str__(self) -> str:
        return self.text


Cell = str | Link


@dataclass
class Heading:
    level: int
    text: str
    anchor: str | None = None


@dataclass
class Paragraph:
    text: str


@dataclass
class KeyValues:
    """A short list of labelled facts (``Suite: smoke``)."""

    items: list[tuple[str, str]]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    #: Indexes of columns holding numbers (right-aligned).
    numeric: set[int] = field(default_factory=set)
    caption: str | None = None


@dataclass
class Image:
    """A PNG, by its URL path relative to the report (``/``-separated, percent-quoted): linked by that path in
    Markdown; in HTML embedded as base64 with ``embed`` (small suite-level figures, so the page stands alone),
    else shown by that path and loaded lazily (per-run timelines, which live in the run directories)."""

    rel_path: str
    alt: str
    anchor: str | None = None
    embed: bool = True


Block = Heading | Paragraph | KeyValues | Table | Image
