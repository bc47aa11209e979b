"""Everything computed from the timelines: each run's metrics (:mod:`~chaosbench.analysis.metrics`, assembled over
one index of the timeline, :mod:`~chaosbench.analysis.timeline_index`, from the families
:mod:`~chaosbench.analysis.timing`, :mod:`~chaosbench.analysis.fidelity`, :mod:`~chaosbench.analysis.attribution`
and :mod:`~chaosbench.analysis.goodput`; a serving run's from :mod:`~chaosbench.analysis.serving`, over the latency
histogram of :mod:`~chaosbench.analysis.latency`) and what a damaged checkpoint came to
(:mod:`~chaosbench.analysis.checkpoint_outcome`), the suite's results table (:mod:`~chaosbench.analysis.results`),
SLOs and baselines (:mod:`~chaosbench.analysis.slo`, :mod:`~chaosbench.analysis.baseline`), statistics over
repeats (:mod:`~chaosbench.analysis.stats`) and the fleet-scale projection (:mod:`~chaosbench.analysis.fleet`).
Reads only timelines and run directories; the report reads what this writes."""
