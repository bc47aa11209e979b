"""The report's content: summary, comparison and per-scenario tables, built as document blocks.

Input is the results table (one row per run). Every column may be absent or hold missing values; a metric that
was not measured is shown as ``—`` and, where the run's ``missing`` column gives one, with the reason.
Runs are grouped by (scenario, control), so fault-free controls always get their own table even when they share
the scenario name with the faulted runs.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.report.document import Block, Cell, Heading, Image, KeyValues, Link, Paragraph, Table
from chaosbench.report.fmt import (
    MISSING,
    as_bool,
    as_float,
    as_int,
    as_text,
    fmt_bool,
    fmt_count,
    fmt_number,
    fmt_percent,
    fmt_seconds,
    fmt_text,
    fmt_value,
    parse_json_object,
)
from chaosbench.report.serving import SERVING_METRICS

#: Every column the report reads (the run metrics, named once: the fields of RunMetrics); absent ones are treated
#: as all-missing.
COLUMNS = list(RunMetrics.__dataclass_fields__)

#: Metrics of the per-scenario table and how each is formatted (``s``: seconds, ``count``, ``fraction``: %).
METRICS: list[tuple[str, str]] = [
    ("time_to_detect_s", "s"),
    ("time_to_resume_s", "s"),
    ("time_to_catch_up_s", "s"),
    ("lost_steps", "count"),
    ("lost_work_s", "s"),
    ("restart_count", "count"),
    ("restarts_claimed", "count"),
    ("false_detections", "count"),
    ("predicted_detect_s", "s"),
    ("injection_latency_s", "s"),
    ("fault_step", "count"),
    ("checkpoint_age_s", "s"),
    ("checkpoint_save_s", "s"),
    ("wall_s", "s"),
    ("productive_s", "s"),
    ("goodput", "fraction"),
    ("extra_wall_s", "s"),
    ("badput_detect_s", "s"),
    ("badput_restart_init_s", "s"),
    ("badput_restore_s", "s"),
    ("badput_recompute_s", "s"),
    ("stage_detect_s", "s"),
    ("stage_reschedule_s", "s"),
    ("stage_reschedule_runtime_s", "s"),
    ("stage_reshard_or_replace_s", "s"),
    ("stage_resume_s", "s"),
    ("time_to_recover_s", "s"),
    ("fault_count", "count"),
    ("time_burned_s", "s"),
    ("step_time_s", "s"),
    ("fault_step_time_s", "s"),
    ("slowdown", "number"),
]

#: Outcomes in the order the summary lists them; unknown ones follow, then runs with no outcome.
OUTCOMES = [
    "completed",
    "recovered",
    "outlasted",
    "not_recovered",
    "fault_not_fired",
    "contaminated",
    "failed",
    "error",
]
#: How outcome counts name runs whose outcome is missing.
NO_OUTCOME = "no outcome"
#: Suites of at most this many runs show every run's timeline plot in the report (by relative path, loaded
#: lazily); larger ones only link each run's plot from its row, so a 10,000-run report stays a few MB to open.
INLINE_TIMELINES_MAX_RUNS = 100
#: A "missing: why" note names at most this many repeats (or ranges of repeats) per reason, then counts the rest.
MAX_REPEATS_NAMED = 20


@dataclass
class RunView:
    """One results row plus what the report made of it (its plot, or why there is none).

    ``plot_rel``: the run's timeline PNG, as a URL path relative to the suite directory (``/``-separated,
    percent-quoted); ``dir_rel``: its run directory so (ending in ``/``), None when it was not found. The row is
    not to be changed: what identifies the run is read from it once and cached.
    """

    row: dict[str, Any]
    plot_rel: str | None = None
    plot_note: str | None = None
    dir_rel: str | None = None

    @cached_property
    def scenario(self) -> str:
        return as_text(self.row.get("scenario")) or "(no scenario)"

    @cached_property
    def control(self) -> bool:
        return bool(as_bool(self.row.get("control")))

    @cached_property
    def repeat(self) -> int | None:
        return as_int(self.row.get("repeat"))

    @cached_property
    def repeat_label(self) -> str:
        rep = self.repeat
        return str(rep) if rep is not None else (as_text(self.row.get("repeat")) or "?")

    @cached_property
    def outcome(self) -> str | None:
        return as_text(self.row.get("outcome"))

    @cached_property
    def missing_reasons(self) -> dict[str, Any]:
        return parse_json_object(self.row.get("missing"))

    def value(self, metric: str) -> float | None:
        return as_float(self.row.get(metric))


@dataclass
class Group:
    """The runs of one scenario (controls are a group of their own)."""

    scenario: str
    control: bool
    runs: list[RunView] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.scenario} (control)" if self.control else self.scenario

    @property
    def anchor(self) -> str:
        return scenario_anchor(self.label)


def scenario_anchor(label: str) -> str:
    """The HTML id of a scenario's section (``label``: :attr:`Group.label`)."""
    return "scenario-" + "".join(c if c.isalnum() else "-" for c in label).strip("-").lower()


def group_runs(runs: Sequence[RunView]) -> list[Group]:
    """Group by (scenario, control) in order of first appearance; repeats sorted, unnumbered ones last."""
    groups: dict[tuple[str, bool], Group] = {}
    for run in runs:
        key = (run.scenario, run.control)
        groups.setdefault(key, Group(run.scenario, run.control)).runs.append(run)
    for g in groups.values():
        g.runs.sort(key=lambda r: (r.repeat is None, r.repeat if r.repeat is not None else 0))
    return list(groups.values())


def _values(runs: Sequence[RunView], metric: str) -> list[float]:
    return [v for r in runs if (v := as_float(r.row.get(metric))) is not None]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def count_text(counter: Counter[str], order: Sequence[str] = ()) -> str:
    """``"3 recovered, 1 error"`` in ``order`` first, then others, then :data:`NO_OUTCOME`; ``—`` when empty."""
    if not counter:
        return MISSING
    keys = [k for k in order if k in counter] + sorted(
        k for k in counter if k not in order and k != NO_OUTCOME
    )
    if NO_OUTCOME in counter:
        keys.append(NO_OUTCOME)
    return ", ".join(f"{counter[k]} {k}" for k in keys)


def outcome_counter(runs: Sequence[RunView]) -> Counter[str]:
    return Counter(run.outcome or NO_OUTCOME for run in runs)


def repeats_text(runs: Sequence[RunView], limit: int = MAX_REPEATS_NAMED) -> str:
    """The runs' repeats as ``repeats 0-3, 5, 9`` (consecutive numbers as ranges, in the runs' order); past
    ``limit`` ranges the rest are counted (``…, 7 more``) so a note stays short in a suite of 10,000 runs."""
    pieces: list[str] = []
    start = prev = None
    for run in runs:
        rep = run.repeat
        if rep is not None and prev is not None and rep == prev + 1:
            prev = rep
            continue
        if start is not None:
            pieces.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rep
        if rep is None:
            pieces.append(run.repeat_label)
    if start is not None:
        pieces.append(str(start) if start == prev else f"{start}-{prev}")
    word = "repeat" if len(runs) == 1 else "repeats"
    if len(pieces) > limit:
        named = sum(_piece_size(p) for p in pieces[:limit])
        return f"{word} {', '.join(pieces[:limit])}, … {len(runs) - named} more"
    return f"{word} {', '.join(pieces)}"


def _piece_size(piece: str) -> int:
    lo, sep, hi = piece.partition("-")
    return int(hi) - int(lo) + 1 if sep and lo.isdigit() and hi.isdigit() else 1


def _missing_note(runs: Sequence[RunView], metric: str, missing: Sequence[RunView] | None = None) -> str:
    """Why the runs without a value for ``metric`` (``missing``, when the caller has them) have none, grouped by
    reason."""
    if missing is None:
        missing = [run for run in runs if run.value(metric) is None]
    by_reason: dict[str, list[RunView]] = {}
    for run in missing:
        reason = as_text(run.missing_reasons.get(metric)) or "no reason recorded"
        by_reason.setdefault(reason, []).append(run)
    if not by_reason:
        return ""
    if len(by_reason) == 1 and sum(len(v) for v in by_reason.values()) == len(runs) and len(runs) > 1:
        return f"{next(iter(by_reason))} (all repeats)"
    return "; ".join(f"{reason} ({repeats_text(missing)})" for reason, missing in by_reason.items())


def metrics_table(group: Group) -> Table:
    """Rows: metrics (a serving scenario's: :data:`~chaosbench.report.serving.SERVING_METRICS`); columns: median,
    min, max, n (repeats with a value) and why values are missing."""
    rows: list[list[Cell]] = []
    serving = any(as_bool(run.row.get("serving")) for run in group.runs)
    for metric, kind in SERVING_METRICS if serving else METRICS:
        values: list[float] = []
        missing: list[RunView] = []
        for run in group.runs:
            if (v := as_float(run.row.get(metric))) is None:
                missing.append(run)
            else:
                values.append(v)
        cells = [
            fmt_value(kind, _median(values)),
            fmt_value(kind, min(values, default=None)),
            fmt_value(kind, max(values, default=None)),
        ]
        rows.append([metric, *cells, str(len(values)), _missing_note(group.runs, metric, missing)])
    return Table(["metric", "median", "min", "max", "n", "missing: why"], rows, numeric={1, 2, 3, 4})


def repeats_table(group: Group) -> Table:
    """One row per repeat: outcome, detection, recovery, fidelity and a link to its timeline plot."""
    rows: list[list[Cell]] = []
    for run in group.runs:
        r = run.row
        plot: Cell
        if run.plot_rel:
            plot = Link("plot", run.plot_rel, run.plot_rel)
        else:
            plot = f"{MISSING} ({run.plot_note})" if run.plot_note else MISSING
        rows.append(
            [
                run.repeat_label,
                fmt_text(r.get("outcome")),
                fmt_text(r.get("verdict")),
                _slo_text(r),
                _detected_text(r),
                _blame_text(r),
                fmt_bool(r.get("recovered")),
                fmt_text(r.get("run_end_outcome")),
                fmt_text(r.get("fidelity")),
                fmt_number(as_float(r.get("loss_diff"))),
                fmt_count(as_float(r.get("final_step"))),
                plot,
            ]
        )
    headers = [
        "repeat",
        "outcome",
        "what happened",
        "SLOs",
        "detected",
        "blamed",
        "recovered",
        "run end",
        "fidelity",
        "loss diff",
        "final step",
        "timeline",
    ]
    return Table(headers, rows, numeric={0, 9, 10})


def _detected_text(row: dict[str, Any]) -> str:
    """Whether the failure was detected, by what and how soon: ``yes: process-group timeout, 10.2 s``."""
    text = fmt_bool(row.get("detected"))
    via = as_text(row.get("detected_via"))
    ttd = as_float(row.get("time_to_detect_s"))
    if text != "yes" or (via is None and ttd is None):
        return text
    return f"{text}: " + ", ".join(x for x in (via, None if ttd is None else fmt_seconds(ttd)) if x)


def _blame_text(row: dict[str, Any]) -> str:
    """Whom the framework blamed, and whether that was the faulted rank: ``rank 1 (correct)``."""
    blame = as_text(row.get("blame"))
    if blame is None:
        return MISSING
    if blame == "none":
        return "no one named"
    return f"{as_text(row.get('blamed')) or '?'} ({blame})"


def _slo_text(row: dict[str, Any]) -> str:
    ok = row.get("slo_ok")
    if ok is None or (isinstance(ok, float) and ok != ok):
        return MISSING
    if ok is True or str(ok).lower() == "true":
        return "met"
    try:
        failures = json.loads(str(row.get("slo_failures") or "[]"))
    except ValueError:
        failures = [str(row.get("slo_failures"))]
    return "MISSED: " + "; ".join(str(f) for f in failures)


def plot_anchor(rel_path: str) -> str:
    return "plot-" + "".join(c if c.isalnum() else "-" for c in rel_path.removeprefix("plots/")).lower()


def _fmt_timeout(value: Any) -> str:
    f = as_float(value)
    if f is not None and not isinstance(value, bool):
        return fmt_seconds(f)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return fmt_text(value)


def timeouts_blocks(group: Group) -> list[Block]:
    """The timeouts in force (from the group's first run) and the versions recorded with them."""
    first = group.runs[0].row if group.runs else {}
    timeouts = parse_json_object(first.get("timeouts"))
    blocks: list[Block] = [Heading(3, "Timeouts in force")]
    if timeouts:
        rows: list[list[Cell]] = [[str(k), _fmt_timeout(v)] for k, v in timeouts.items()]
        blocks.append(Table(["timeout", "seconds"], rows, numeric={1}))
    else:
        blocks.append(Paragraph(f"{MISSING} (no timeouts recorded)"))
    versions = parse_json_object(first.get("versions"))
    if versions:
        blocks.append(Paragraph("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())))
    return blocks


def _fidelity_text(runs: Sequence[RunView]) -> str:
    counter = Counter(f for run in runs if (f := as_text(run.row.get("fidelity"))) is not None)
    return count_text(counter, ["exact", "diverged"])


def comparison_table(groups: Sequence[Group]) -> Table:
    """One row per scenario: outcome counts and the medians that matter most."""
    rows: list[list[Cell]] = []
    for g in groups:
        rows.append(
            [
                g.label,
                str(len(g.runs)),
                count_text(outcome_counter(g.runs), OUTCOMES),
                fmt_seconds(_median(_values(g.runs, "time_to_detect_s"))),
                fmt_seconds(_median(_values(g.runs, "time_to_resume_s"))),
                fmt_count(_median(_values(g.runs, "lost_steps"))),
                fmt_percent(_median(_values(g.runs, "goodput"))),
                _fidelity_text(g.runs),
                count_text(
                    Counter(v for run in g.runs if (v := as_text(run.row.get("verdict"))) is not None), []
                ),
            ]
        )
    headers = [
        "scenario",
        "runs",
        "outcomes",
        "median time_to_detect_s",
        "median time_to_resume_s",
        "median lost_steps",
        "median goodput",
        "fidelity",
        "what happened",
    ]
    return Table(headers, rows, numeric={1, 3, 4, 5, 6})


def outcomes_table(runs: Sequence[RunView]) -> Table:
    counter = outcome_counter(runs)
    keys = [k for k in OUTCOMES if k in counter] + sorted(
        k for k in counter if k not in OUTCOMES and k != NO_OUTCOME
    )
    if NO_OUTCOME in counter:
        keys.append(NO_OUTCOME)
    return Table(["outcome", "runs"], [[k, str(counter[k])] for k in keys], numeric={1})


def scenario_blocks(group: Group, inline_timelines: bool = True) -> list[Block]:
    """A scenario's section; with ``inline_timelines`` its runs' timeline PNGs are shown (by path) below it."""
    first = group.runs[0].row if group.runs else {}
    blocks: list[Block] = [
        Heading(2, f"Scenario: {group.label}", anchor=group.anchor),
        KeyValues(
            [
                ("Framework", fmt_text(first.get("framework"))),
                ("Fault", fmt_text(first.get("fault")) if not group.control else f"{MISSING} (control)"),
                ("Repeats", str(len(group.runs))),
                ("Outcomes", count_text(outcome_counter(group.runs), OUTCOMES)),
            ]
        ),
        Heading(3, "Metrics"),
        metrics_table(group),
        Heading(3, "Repeats"),
        repeats_table(group),
        *timeouts_blocks(group),
    ]
    plots = [run for run in group.runs if run.plot_rel] if inline_timelines else []
    if plots:
        blocks.append(Heading(3, "Timelines"))
        for run in plots:
            assert run.plot_rel is not None
            alt = f"{group.label} repeat {run.repeat_label}: {run.outcome or MISSING}"
            blocks.append(Image(run.plot_rel, alt, anchor=plot_anchor(run.plot_rel), embed=False))
    return blocks


def build_document(
    runs: Sequence[RunView],
    title: str,
    suite: str,
    generated: str,
    inline_timelines: bool | None = None,
    lead: Sequence[Block] = (),
) -> list[Block]:
    """All blocks of the report, in reading order. ``inline_timelines``: show each run's timeline PNG below its
    scenario (default: when there are at most :data:`INLINE_TIMELINES_MAX_RUNS` runs); each run's row links
    its PNG either way. ``lead``: what the first screen shows, right below the title (the headline and the
    scorecard: :mod:`chaosbench.report.headline`)."""
    groups = group_runs(runs)
    if inline_timelines is None:
        inline_timelines = len(runs) <= INLINE_TIMELINES_MAX_RUNS
    blocks: list[Block] = [
        Heading(1, title),
        *lead,
        KeyValues(
            [
                ("Suite", suite),
                ("Generated", generated),
                ("Runs", str(len(runs))),
                ("Outcomes", count_text(outcome_counter(runs), OUTCOMES)),
            ]
        ),
    ]
    if not runs:
        blocks.append(Paragraph("No runs in the results table."))
        return blocks
    blocks += [Heading(2, "Outcomes"), outcomes_table(runs)]
    blocks += [Heading(2, "Comparison across scenarios"), comparison_table(groups)]
    if not inline_timelines and any(run.plot_rel for run in runs):
        blocks.append(
            Paragraph(
                f"{len(runs)} runs: each run's timeline plot is linked from its row in its "
                f"scenario's repeats table (shown inline up to {INLINE_TIMELINES_MAX_RUNS} runs)."
            )
        )
    for g in groups:
        blocks += scenario_blocks(g, inline_timelines)
    return blocks
