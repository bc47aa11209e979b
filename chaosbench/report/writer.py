"""``write_report``: turn a suite's results table into report.md and report.html, linking each run's timeline plot
(``<run_dir>/timeline.png``, drawn when the run ended by :func:`chaosbench.report.plots.draw_run_timeline`)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosbench.errors import SpecError
from chaosbench.report.analysis import analysis_blocks
from chaosbench.report.document import Heading
from chaosbench.report.fmt import as_text
from chaosbench.report.headline import first_screen_blocks
from chaosbench.report.html import render_html
from chaosbench.report.links import href, run_dir_candidates
from chaosbench.report.markdown import render_markdown
from chaosbench.report.plots import TIMELINE_PNG, draw_run_timeline
from chaosbench.report.tables import COLUMNS, RunView, build_document
from chaosbench.rundir import RunDir, write_atomic

if TYPE_CHECKING:
    import pandas as pd

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"
#: ``write_report(plots=...)``: ``existing`` links the PNGs there are; ``missing`` draws the absent ones first;
#: ``all`` redraws every run's.
PLOTS_MODES = ("existing", "missing", "all")
#: Why a run with a timeline has no plot in ``plots="existing"`` mode.
NOT_DRAWN = (
    "no timeline plot: drawn when the run ends; `chaosbench report --plots missing` draws missing ones"
)


def _records(results: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts of plain Python values, every report column present (absent columns read as missing)
    and every missing value (NaN, ``pd.NA``, ``NaT``) ``None``. Built column by column (``tolist`` and one
    ``isna`` per column): a third of ``to_dict("records")``'s time on 10,000 rows, and the tables then read
    Python floats without pandas' help."""
    columns: dict[str, list[Any]] = {}
    for name in results.columns:
        series = results[name]
        values = series.tolist()
        if series.hasnans:
            values = [None if gap else v for v, gap in zip(values, series.isna().tolist(), strict=True)]
        columns[str(name)] = values
    absent = [c for c in COLUMNS if c not in columns]
    keys = list(columns) + absent
    rows = zip(*columns.values(), *([[None] * len(results)] * len(absent)), strict=True)
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _find_plot(suite_dir: str, run: RunView, redraw: bool) -> str | None:
    """Find the run's directory (``dir_rel``); link the run's existing timeline PNG (``plot_rel``), or say why
    there is none (``plot_note``); returns the
    run directory to draw it in when it can be drawn (it has an ``events.jsonl``) and is absent or ``redraw``.
    ``suite_dir``: absolute."""
    candidates = run_dir_candidates(suite_dir, run.row)
    if not candidates:
        run.plot_note = "no timeline plot: no run_dir recorded"
        return None
    found = next((c for c in candidates if os.path.isdir(c)), None)
    if found is not None:
        run.dir_rel = href(found, suite_dir) + "/"
    if not redraw:
        for cand in candidates:
            if os.path.isfile(png := os.path.join(cand, TIMELINE_PNG)):
                run.plot_rel = href(png, suite_dir)
                return None
    drawable = next((c for c in candidates if os.path.isfile(os.path.join(c, RunDir.EVENTS))), None)
    if drawable is None:
        recorded = as_text(run.row.get("run_dir"))
        run.plot_note = (
            f"no timeline plot: no events.jsonl in {recorded}"
            if recorded
            else "no timeline plot: no run_dir recorded"
        )
        return None
    run.plot_note = NOT_DRAWN
    return drawable


def write_report(
    suite_dir: str | Path,
    results: pd.DataFrame,
    title: str | None = None,
    definition: dict[str, Any] | None = None,
    plots: str = "existing",
) -> dict[str, Path]:
    """Write ``report.md`` and ``report.html`` into ``suite_dir`` (and the suite-level figures under ``plots/``).

    ``results`` has one row per run (columns: see :data:`chaosbench.report.tables.COLUMNS`; any may be absent
    or missing). Missing metrics show as ``—`` with the reason from the ``missing`` column.

    Run timelines are not drawn here but linked: each run's ``<run_dir>/timeline.png`` (drawn when the run
    ended, :func:`chaosbench.report.plots.draw_run_timeline`) by its path relative to ``suite_dir``, from the
    run's row in both reports, and shown below its scenario in suites of at most
    :data:`~chaosbench.report.tables.INLINE_TIMELINES_MAX_RUNS` runs. The run directory is the standard layout
    under ``suite_dir`` (:class:`~chaosbench.rundir.RunDir`), else ``run_dir`` as recorded (relative to
    ``suite_dir``, then as it is). A run without a PNG gets a note saying why. ``plots``: ``"existing"`` links only; ``"missing"`` first draws the PNGs that are absent (runs with an
    ``events.jsonl``), ``"all"`` redraws every run's, one after the other (0.1 to 0.4 s a plot). The same goes
    for a serving run's ``per_second.png`` (:mod:`chaosbench.report.serving`). A plot that cannot be drawn is
    noted, never raised.
    The HTML embeds only the suite-level figures as base64 (two, one row per fault x framework: about 15 kB for
    the smoke suite's 6 rows, 135 kB for 45).

    Returns what was written, keyed by path relative to ``suite_dir``: ``"report.md"``, ``"report.html"``, the
    suite-level figures (``"plots/<name>.png"``) and each run's PNG drawn by this call. ``definition``: the suite's
    definition (``suite.json``), used by the analysis section (checkpoint interval, projection settings); read
    from ``suite.json`` when omitted. Raises :class:`~chaosbench.errors.SpecError` for an unknown ``plots``.
    """
    if plots not in PLOTS_MODES:
        raise SpecError(f"expected one of {', '.join(PLOTS_MODES)}", obj=f"plots={plots!r}")
    suite_dir = Path(suite_dir)
    suite_dir.mkdir(parents=True, exist_ok=True)
    suite_abs = os.path.abspath(suite_dir)
    runs = [RunView(rec) for rec in _records(results)]
    suite = next((s for run in runs if (s := as_text(run.row.get("suite")))), None) or suite_dir.name
    title = title or f"chaosbench report: {suite}"
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

    written: dict[str, Path] = {}
    for run in runs:
        run_dir = _find_plot(suite_abs, run, redraw=plots == "all")
        if run_dir is None or plots == "existing":
            continue
        png, why = draw_run_timeline(run_dir, run.row)
        if png is None:
            run.plot_note = why
        else:
            run.plot_rel, run.plot_note = href(os.path.abspath(png), suite_abs), None
            written[Path(os.path.relpath(png, suite_abs)).as_posix()] = png

    blocks = build_document(runs, title, suite, generated, lead=first_screen_blocks(runs))
    if definition is None and (suite_dir / "suite.json").is_file():
        try:
            definition = json.loads((suite_dir / "suite.json").read_text()).get("definition")
        except ValueError:
            definition = None
    extra, extra_written = analysis_blocks([run.row for run in runs], suite_dir, definition, plots)
    written.update(extra_written)
    at = next(
        (
            i
            for i, b in enumerate(blocks)
            if isinstance(b, Heading) and b.level == 2 and b.text.startswith("Scenario")
        ),
        len(blocks),
    )
    blocks[at:at] = extra
    md_path = write_atomic(
        suite_dir / REPORT_MD, render_markdown(blocks)
    )  # whole: a harness may die meanwhile
    html_path = write_atomic(suite_dir / REPORT_HTML, render_html(blocks, suite_dir, title))
    return {REPORT_MD: md_path, REPORT_HTML: html_path, **written}
