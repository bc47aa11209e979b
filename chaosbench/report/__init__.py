"""Reports of a suite: Markdown and HTML from the results table (:mod:`chaosbench.analysis.results`), opening
with a headline per framework and a framework x fault scorecard (:mod:`chaosbench.report.headline`), linking
each run's timeline plot. :func:`write_report` writes ``report.md``, ``report.html`` and the suite-level figures
(``plots/*.png``) into a suite directory; each run's ``timeline.png`` is drawn into its run directory when the run
ends (:func:`chaosbench.report.plots.draw_run_timeline`). matplotlib is imported inside the functions, never at
import time.
"""

from __future__ import annotations

from chaosbench.report.writer import write_report

__all__ = ["write_report"]
