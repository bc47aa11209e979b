"""``write_report``: turn a suite's results table and run timelines into report.md, report.html and plots."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.report.analysis import analysis_blocks
from chaosbench.report.document import Heading
from chaosbench.report.fmt import MISSING, as_text
from chaosbench.report.html import render_html
from chaosbench.report.markdown import render_markdown
from chaosbench.report.plots import RunMarkers, events_path, load_run_events, plot_timeline
from chaosbench.report.tables import COLUMNS, RunView, build_document, group_runs
from chaosbench.rundir import RunDir

if TYPE_CHECKING:
    import pandas as pd

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"


def _records(results: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts with every report column present (absent columns read as missing)."""
    records = results.reset_index(drop=True).to_dict("records")
    return [{**dict.fromkeys(COLUMNS), **{str(k): v for k, v in rec.items()}} for rec in records]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"


def _plot_name(run: RunView, used: set[str]) -> str:
    """``plots/<scenario>__<repeat>.png`` with the scenario made file-safe (``/`` becomes ``_``); unique."""
    base = f"{_safe_name(run.scenario)}__{_safe_name(run.repeat_label)}"
    candidates = [base] + ([f"{base}-control"] if run.control else [])
    candidates += [f"{base}-{i}" for i in range(2, len(used) + 3)]
    for stem in candidates:
        rel = f"{PLOTS_DIR}/{stem}.png"
        if rel not in used:
            used.add(rel)
            return rel
    raise AssertionError("unreachable: more candidates than used names")


def _run_dir(suite_dir: Path, run: RunView) -> tuple[Path | None, str]:
    """The run directory holding ``events.jsonl``, or ``None`` and why it was not found.

    Tries ``run_dir`` as recorded, then relative to the suite directory, then the standard layout
    (:class:`chaosbench.rundir.RunDir`).
    """
    recorded = as_text(run.row.get("run_dir"))
    candidates: list[Path] = []
    if recorded:
        candidates.append(Path(recorded))
        if not Path(recorded).is_absolute():
            candidates.append(suite_dir / recorded)
    if as_text(run.row.get("scenario")) and run.repeat is not None:
        candidates.append(RunDir.at(suite_dir, run.scenario, run.repeat).path)
    for cand in candidates:
        if events_path(cand).is_file():
            return cand, ""
    if recorded:
        return None, f"no events.jsonl in {recorded}"
    return None, "no run_dir recorded"


def _draw(suite_dir: Path, run: RunView, used: set[str], written: dict[str, Path]) -> None:
    """Plot one run's timeline; on any failure record why instead (a report never dies for one plot)."""
    run_dir, why = _run_dir(suite_dir, run)
    if run_dir is None:
        run.plot_note = f"no timeline: {why}"
        return
    try:
        events = load_run_events(run_dir)
    except OSError as exc:
        run.plot_note = f"timeline unreadable: {exc}"
        return
    if not events:
        run.plot_note = "no timeline: events.jsonl is empty"
        return
    rel = _plot_name(run, used)
    title = f"{run.scenario}{' (control)' if run.control else ''} · repeat {run.repeat_label} · {run.outcome or MISSING}"
    markers = RunMarkers(
        resume_t_s=run.value("resume_t_s"),
        fault_t_s=run.value("fault_t_s"),
        detect_t_s=run.value("detect_t_s"),
    )
    try:
        plot_timeline(events, suite_dir / rel, title, markers)
    except Exception as exc:  # noqa: BLE001 - a plotting bug must not cost the whole report; it is reported
        used.discard(rel)
        run.plot_note = f"plot failed: {type(exc).__name__}: {exc}"
        return
    run.plot_rel = rel
    written[rel] = suite_dir / rel


def write_report(
    suite_dir: str | Path,
    results: pd.DataFrame,
    title: str | None = None,
    definition: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and ``plots/<scenario>__<repeat>.png`` into ``suite_dir``.

    ``results`` has one row per run (columns: see :data:`chaosbench.report.tables.COLUMNS`; any may be absent
    or missing). Each run's plot is drawn from ``<run_dir>/events.jsonl``; a run without a readable timeline gets
    no plot and the report says why. Missing metrics show as ``—`` with the reason from the ``missing`` column.
    The HTML is self-contained (plots embedded as base64 PNG); the Markdown links the PNGs by relative path.

    Returns what was written, keyed by path relative to ``suite_dir``: ``"report.md"``, ``"report.html"``
    and one ``"plots/<name>.png"`` per plot. ``definition``: the suite's definition (``suite.json``), used
    by the analysis section (checkpoint interval, projection settings); read from ``suite.json`` when omitted.
    """
    suite_dir = Path(suite_dir)
    suite_dir.mkdir(parents=True, exist_ok=True)
    runs = [RunView(rec) for rec in _records(results)]
    suite = next((s for run in runs if (s := as_text(run.row.get("suite")))), None) or suite_dir.name
    title = title or f"chaosbench report: {suite}"
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

    written: dict[str, Path] = {}
    used: set[str] = set()
    for group in group_runs(runs):  # group order, so plot names are stable
        for run in group.runs:
            _draw(suite_dir, run, used, written)

    blocks = build_document(runs, title, suite, generated)
    if definition is None and (suite_dir / "suite.json").is_file():
        try:
            definition = json.loads((suite_dir / "suite.json").read_text()).get("definition")
        except ValueError:
            definition = None
    extra, extra_written = analysis_blocks([run.row for run in runs], suite_dir, definition)
    written.update(extra_written)
    at = next((i for i, b in enumerate(blocks) if isinstance(b, Heading) and b.level == 2
               and b.text.startswith("Scenario")), len(blocks))  # fmt: skip
    blocks[at:at] = extra
    md_path = suite_dir / REPORT_MD
    md_path.write_text(render_markdown(blocks), encoding="utf-8")
    html_path = suite_dir / REPORT_HTML
    html_path.write_text(render_html(blocks, suite_dir, title), encoding="utf-8")
    return {REPORT_MD: md_path, REPORT_HTML: html_path, **written}
