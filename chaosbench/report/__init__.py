"""Reports of a suite: Markdown and self-contained HTML with per-run timeline plots, from the results table
(:mod:`chaosbench.analysis.results`). :func:`write_report` writes ``report.md``, ``report.html`` and
``plots/*.png`` into a suite directory. matplotlib is imported inside the functions, never at import time.
"""

from __future__ import annotations

from chaosbench.report.writer import write_report

__all__ = ["write_report"]
