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


@dataclass
class ScoreCell:
    """One framework x fault cell of a :class:`Scorecard`, from its fault runs (controls are not in any cell).

    ``fired``: runs whose fault fired; of them ``recovered``, ``outlasted`` (the job went on with no framework
    reaction) and ``not_recovered``. ``seconds``: what the cell's colour shows (the median time to resume of the
    recovered runs; None: none recovered, so no colour). ``unusable``: why the cell is not counted (its
    framework's control did not run clean), else None. ``lines``: what it says, in both renderings; ``anchor``:
    the HTML id of the section describing its runs; ``runs``: a link to each run's directory (or its label when
    it has none), at most a few, ``more_runs`` counts the rest."""

    lines: list[str]
    fired: int = 0
    recovered: int = 0
    outlasted: int = 0
    not_recovered: int = 0
    seconds: float | None = None
    unusable: str | None = None
    anchor: str | None = None
    runs: list[Cell] = field(default_factory=list)
    more_runs: int = 0


@dataclass
class Scorecard:
    """A grid: one row per framework, one column per fault; a cell is None where the framework ran no such fault.
    HTML colours each cell by its ``seconds`` (a legend gives the scale, ``measure`` names it)."""

    columns: list[str]
    rows: list[tuple[str, list[ScoreCell | None]]]
    measure: str
    caption: str | None = None


Block = Heading | Paragraph | KeyValues | Table | Image | Scorecard
