"""The HTML report in a real browser (issue 27, item 6): headless Chromium loads report.html of a small result set
built from real runs' timelines, and of one with unusable rows and missing figures; no script error or console
message, every image loads, and the first screen's screenshot is not blank. Skipped without Chromium, failed
instead when ``CHAOSBENCH_REQUIRE`` contains ``chromium`` (CI installs Debian's ``chromium``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from browser_support import check_page, non_background_share, pixels_of, require_chromium

from chaosbench.analysis.metrics import RunMetrics, compute_metrics
from chaosbench.analysis.results import to_frame
from chaosbench.report import write_report
from chaosbench.timeline import read_events
from tests.conftest import ROOT
from tests.helpers import OTLP, write_lighthouse_died_control

pytestmark = pytest.mark.integration
require_chromium()

TIMELINES = ROOT / "tests" / "fixtures" / "timelines"
#: Real runs' timelines (kept fixtures): one per framework x fault, each a recovered run.
REAL = ("command_restart_kill", "restart_hang", "torchrun_kill", "torchft_kill_group")


def _run_dir(suite_dir: Path, name: str) -> tuple[Path, RunMetrics]:
    """A run directory in the standard layout holding the kept timeline ``name``, and its metrics."""
    src = TIMELINES / f"{name}.jsonl"
    events = read_events(src)
    run_dir = suite_dir / str(events[0].get("scenario")) / "0"
    run_dir.mkdir(parents=True)
    shutil.copy(src, run_dir / "events.jsonl")
    m = compute_metrics(events)
    m.run_dir = str(run_dir)
    return run_dir, m


def _img_count(html: str) -> int:
    return len(re.findall(r"<img\b", html))


def _assert_reads_well(page: Path, tmp: Path, images: int) -> str:
    """The browser checks shared by both result sets; returns the page's DOM. The first screen shows the headline
    and the scorecard (issue 27, item 3): the headline comes first in the page, and every scorecard cell's colour
    by time is in the first screen's screenshot."""
    seen = check_page(page, tmp / "browser")
    html = page.read_text()
    assert html.index("<h2") == html.index('<h2 id="headline"') < html.index('<h2 id="scorecard"')
    grid = html.split('<table class="sc">', 1)[1].split("</table>", 1)[0]
    colours = set(re.findall(r'style="background:(#[0-9a-f]{6})"', grid))
    assert colours and all(pixels_of(seen.screenshot, c) > 500 for c in colours), colours
    assert seen.errors == [] and seen.console == []
    assert len(seen.images) == images == _img_count(page.read_text())
    broken = [i for i in seen.images if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
    assert broken == []
    colours, share = non_background_share(seen.screenshot)
    assert colours > 1 and share > 0.01, (colours, share)  # text and tables, not one colour
    return seen.dom


def test_report_of_real_runs_reads_in_a_browser(tmp_path: Path) -> None:
    suite_dir = tmp_path / "real"
    metrics = [_run_dir(suite_dir, name)[1] for name in REAL]
    written = write_report(suite_dir, to_frame(metrics), plots="missing")
    # the two suite-level figures (embedded) and the four runs' timelines (files beside the report)
    dom = _assert_reads_well(written["report.html"], tmp_path, images=6)
    assert "restart/kill repeat 0: recovered" in dom


def test_report_with_unusable_rows_and_missing_figures_reads_in_a_browser(tmp_path: Path) -> None:
    """A TorchFT control whose Lighthouse died at start-up (unusable rows), its real fault run, a run recorded
    without a directory and one whose directory has no timeline: their figures are missing, with the reason."""
    suite_dir = tmp_path / "broken"
    control_dir = suite_dir / "torchft" / "control" / "0"
    control_events = write_lighthouse_died_control(control_dir, 1_800_000_000_000_000_000)
    control = compute_metrics(control_events, total_steps=30)
    control.run_dir = str(control_dir)
    fault_dir, _ = _run_dir(suite_dir, "torchft_kill_group")
    fault = compute_metrics(read_events(fault_dir / "events.jsonl"), control=control_events)
    fault.run_dir = str(fault_dir)
    no_dir = compute_metrics(read_events(TIMELINES / "restart_hang.jsonl"))  # run_dir not recorded
    empty_dir = suite_dir / "restart" / "kill" / "0"
    empty_dir.mkdir(parents=True)
    no_timeline = compute_metrics(read_events(TIMELINES / "command_restart_kill.jsonl"))
    no_timeline.run_dir = str(empty_dir)
    written = write_report(suite_dir, to_frame([control, fault, no_dir, no_timeline]), plots="missing")
    html = written["report.html"].read_text()
    assert (
        f"unusable: its control run did not complete (control failed (failed); 'lighthouse' exited 1 before "
        f"the job's first step: {OTLP})".replace("'", "&#39;")
        in html
    )
    assert "no timeline plot: no run_dir recorded" in html
    assert f"no timeline plot: no events.jsonl in {empty_dir}" in html
    # shown: the two suite-level figures and the two timelines drawn (the control's and its fault run's)
    dom = _assert_reads_well(written["report.html"], tmp_path, images=4)
    assert "unusable" in dom
