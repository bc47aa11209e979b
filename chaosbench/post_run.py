"""Post-run hooks: the work done on a finished run after its metrics are computed and before its ``result.json``
marks it finished (from then on ``--resume`` skips it).

A hook gets the run's directory, its metrics and the suite, and returns the fields it adds to ``result.json``.
The runner calls the hooks it was given, in order (:class:`~chaosbench.runner.Runner`'s ``post_run``; default
:data:`DEFAULT_HOOKS`: the checkpoints kept or deleted by the suite's ``keep_checkpoints``, then the run's
timeline plot drawn, then a serving run's per-second plot). A hook must not raise for a run it cannot handle: it says so in the fields it returns
(as the plot does with ``timeline_plot``), so that its work never costs a finished run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.report.plots import draw_run_timeline
from chaosbench.report.serving import PER_SECOND_PNG, draw_run_per_second
from chaosbench.run_results import retain_checkpoints
from chaosbench.rundir import RunDir
from chaosbench.specs import Suite

#: A post-run hook: (the run's directory, its metrics, the suite) -> the fields it adds to ``result.json``.
PostRunHook = Callable[[RunDir, RunMetrics, Suite], dict[str, Any]]


def checkpoint_retention(rd: RunDir, metrics: RunMetrics, suite: Suite) -> dict[str, Any]:
    """The run's checkpoint files listed in ``checkpoints.json``, then kept or deleted by the suite's
    ``keep_checkpoints`` (:func:`~chaosbench.run_results.retain_checkpoints`): ``checkpoints_kept``."""
    return {"checkpoints_kept": retain_checkpoints(rd, metrics, suite.keep_checkpoints)}


def timeline_plot(rd: RunDir, metrics: RunMetrics, suite: Suite) -> dict[str, Any]:
    """The run's ``timeline.png``, drawn once here (the report links it): ``timeline_plot``, its file name or
    why it was not drawn (:func:`~chaosbench.report.plots.draw_run_timeline` never raises)."""
    plot = draw_run_timeline(rd.path, metrics)
    return {"timeline_plot": plot.reason or "timeline.png"}


def per_second_plot(rd: RunDir, metrics: RunMetrics, suite: Suite) -> dict[str, Any]:
    """A serving run's ``per_second.png`` (requests and p99 latency per second), drawn once here (the report
    shows it): ``per_second_plot``, its file name or why it was not drawn; nothing for a training run."""
    if not metrics.serving:
        return {}
    plot = draw_run_per_second(rd.path, metrics)
    return {"per_second_plot": plot.reason or PER_SECOND_PNG}


#: The hooks a runner calls unless it is given others, in this order.
DEFAULT_HOOKS: tuple[PostRunHook, ...] = (checkpoint_retention, timeline_plot, per_second_plot)
