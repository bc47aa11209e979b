"""Reports of a suite: Markdown and self-contained HTML with per-run timeline plots, plus the results table I/O.

- :func:`write_report` writes ``report.md``, ``report.html`` and ``plots/*.png`` into a suite directory.
- :func:`write_results` / :func:`load_results` store the results table as ``results.parquet`` + ``results.csv``.

pandas, pyarrow and matplotlib are imported inside the functions, never at import time.
"""

from __future__ import annotations

from chaosbench.report.results import load_results, write_results
from chaosbench.report.writer import write_report

__all__ = ["load_results", "write_report", "write_results"]
