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
    """A PNG under the suite directory: linked by relative path in Markdown, embedded in HTML."""

    rel_path: str
    alt: str
    anchor: str | None = None


Block = Heading | Paragraph | KeyValues | Table | Image
