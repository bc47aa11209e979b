"""Everything computed from the timelines: each run's metrics (:mod:`~chaosbench.analysis.metrics`) and what a
damaged checkpoint came to (:mod:`~chaosbench.analysis.checkpoint_outcome`), the suite's results table
(:mod:`~chaosbench.analysis.results`), SLOs and baselines (:mod:`~chaosbench.analysis.slo`,
:mod:`~chaosbench.analysis.baseline`), statistics over repeats (:mod:`~chaosbench.analysis.stats`) and the
fleet-scale projection (:mod:`~chaosbench.analysis.fleet`). Reads only timelines and run directories; the report
reads what this writes."""
