"""Unit tests of chaosbench.report: tables, per-run timeline plots and their links, and the results table round
trip (no torch)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.results import is_missing, load_results, write_results
from chaosbench.errors import ChaosbenchError
from chaosbench.report import write_report
from chaosbench.report.fmt import MISSING, as_bool, fmt_percent, fmt_seconds
from chaosbench.report.plots import TIMELINE_PNG, draw_run_timeline
from chaosbench.report.tables import INLINE_TIMELINES_MAX_RUNS, RunView, repeats_text
from chaosbench.report.writer import NOT_DRAWN
from chaosbench.timeline import TimelineWriter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000_000_000_000  # run_start, ns
S = 1_000_000_000


def _fake_run(run_dir: Path, *, fault: bool) -> None:
    """Two ranks stepping every 0.5 s; with ``fault``: rank 1 killed at 2.2 s, detected, restarted, resumed."""
    with TimelineWriter(run_dir / "events.jsonl") as tl:
        tl.emit("run_start", t_ns=T0, suite="unit", scenario="x", repeat=0, framework="restart")
        tl.emit("proc_start", t_ns=T0 + S // 10, proc="job", pid=100, role="job", node="node0", incarnation=0)
        for rank in (0, 1):
            tl.emit(
                "rank_start",
                t_ns=T0 + S // 5,
                src="rank",
                rank=rank,
                world_size=2,
                pid=200 + rank,
                node="node0",
                incarnation=0,
                local_rank=rank,
            )
        for step in range(1, 5):
            for rank in (0, 1):
                tl.emit(
                    "step",
                    t_ns=T0 + step * S // 2,
                    src="rank",
                    rank=rank,
                    step=step,
                    loss=1.0 / step,
                    incarnation=0,
                )
        tl.emit(
            "ckpt_save_end",
            t_ns=T0 + 2 * S + S // 10,
            src="rank",
            rank=0,
            step=4,
            path="ckpt/4",
            incarnation=0,
            complete=True,
        )
        if fault:
            tl.emit(
                "fault_inject",
                t_ns=T0 + 2 * S + S // 5,
                fault="kill-rank1",
                injector="kill",
                target=[{"rank": 1}],
                params={"signal": "SIGKILL"},
            )
            tl.emit("proc_exit", t_ns=T0 + 2 * S + S // 2, proc="job", pid=100, returncode=-9, incarnation=0)
            tl.emit("detect", t_ns=T0 + 2 * S + S // 2, framework="restart", reason="job exited", line="")
            tl.emit("restart", t_ns=T0 + 3 * S, framework="restart", attempt=1, reason="job exited")
            tl.emit(
                "proc_start", t_ns=T0 + 3 * S, proc="job", pid=101, role="job", node="node0", incarnation=1
            )
            for rank in (0, 1):
                tl.emit(
                    "rank_start",
                    t_ns=T0 + 3 * S + S // 5,
                    src="rank",
                    rank=rank,
                    world_size=2,
                    pid=300 + rank,
                    node="node0",
                    incarnation=1,
                    local_rank=rank,
                )
            for i, step in enumerate(range(5, 8)):
                for rank in (0, 1):
                    tl.emit(
                        "step",
                        t_ns=T0 + 4 * S + i * S // 2,
                        src="rank",
                        rank=rank,
                        step=step,
                        loss=0.1,
                        incarnation=1,
                    )
            tl.emit("proc_exit", t_ns=T0 + 5 * S + S // 2, proc="job", pid=101, returncode=0, incarnation=1)
        else:
            tl.emit("proc_exit", t_ns=T0 + 2 * S + S // 2, proc="job", pid=100, returncode=0, incarnation=0)
        tl.emit("run_end", t_ns=T0 + 6 * S, outcome="completed", reason="")


def _row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "suite": "unit",
        "scenario": "restart/kill-rank1",
        "framework": "restart",
        "fault": "kill-rank1",
        "repeat": 0,
        "control": False,
        "run_dir": None,
        "outcome": "recovered",
        "detected": True,
        "recovered": True,
        "run_end_outcome": "completed",
        "time_to_detect_s": 0.3,
        "time_to_resume_s": 10.0,
        "time_to_catch_up_s": 12.0,
        "lost_steps": 2,
        "lost_work_s": 1.0,
        "restart_count": 1,
        "checkpoint_age_s": 0.1,
        "wall_s": 6.0,
        "productive_s": 3.5,
        "goodput": 0.5,
        "extra_wall_s": 2.0,
        "badput_detect_s": 0.3,
        "badput_restart_init_s": 1.2,
        "badput_restore_s": 0.2,
        "badput_recompute_s": None,
        "stage_detect_s": 0.3,
        "stage_reschedule_s": 1.0,
        "stage_reshard_or_replace_s": 0.4,
        "stage_resume_s": 10.3,
        "fidelity": "exact",
        "loss_diff": 0.0,
        "final_step": 7,
        "fault_t_s": 2.2,
        "detect_t_s": 2.5,
        "resume_t_s": 4.0,
        "missing": json.dumps({"badput_recompute_s": "no step recomputed after restore"}),
        "versions": json.dumps({"torch": "2.13.0", "python": "3.11"}),
        "timeouts": json.dumps({"restart_delay": 0.5, "detect_deadline": 60}),
    }
    base.update(kw)
    return base


@pytest.fixture
def suite(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    """Four runs: the fault run's timeline plot drawn when it ended (as the runner does), the control's not
    (it has a timeline), two repeats without a run directory."""
    suite_dir = tmp_path / "unit"
    fault_dir = suite_dir / "restart/kill-rank1" / "0"
    control_dir = suite_dir / "restart/control" / "0"
    _fake_run(fault_dir, fault=True)
    _fake_run(control_dir, fault=False)
    rows = [
        _row(run_dir=str(fault_dir)),
        # No timeline for these two repeats: the report must say so, not crash.
        _row(repeat=1, time_to_resume_s=12.5, goodput=0.75, fidelity="diverged", loss_diff=1e-3),
        _row(
            repeat=2,
            time_to_resume_s=11.0,
            goodput=float("nan"),
            outcome="not_recovered",
            recovered=False,
            fidelity=None,
            final_step=float("nan"),
        ),
        _row(
            scenario="restart/control",
            fault=None,
            control=True,
            run_dir=str(control_dir),
            outcome="completed",
            detected=None,
            recovered=None,
            time_to_detect_s=None,
            time_to_resume_s=None,
            time_to_catch_up_s=None,
            lost_steps=None,
            restart_count=0,
            extra_wall_s=None,
            fault_t_s=None,
            detect_t_s=None,
            resume_t_s=None,
            fidelity=None,
            timeouts=None,
            missing=json.dumps({"time_to_detect_s": "no fault in a control run"}),
        ),
    ]
    path, why = draw_run_timeline(fault_dir, rows[0])
    assert path == fault_dir / TIMELINE_PNG and why is None
    return suite_dir, pd.DataFrame(rows)


def _table_row(md: str, first_cell: str) -> list[str]:
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r}")


def test_write_report_files_tables_and_plots(suite: tuple[Path, pd.DataFrame]) -> None:
    suite_dir, df = suite
    written = write_report(suite_dir, df, title="Unit report")

    md_path, html_path = suite_dir / "report.md", suite_dir / "report.html"
    assert written["report.md"] == md_path and md_path.is_file()
    assert written["report.html"] == html_path and html_path.is_file()
    # Only the suite-level figures are drawn; the run timelines are linked where they lie.
    assert set(written) == {
        "report.md",
        "report.html",
        "plots/distribution_time_to_resume.png",
        "plots/badput_waterfall.png",
    }
    assert "## Framework comparison" in md_path.read_text()
    for path in [*written.values(), suite_dir / "restart/kill-rank1/0" / TIMELINE_PNG]:
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG_SIGNATURE)
            assert path.stat().st_size < 200_000  # small enough for 20 plots per report
    assert not (suite_dir / "restart/control/0" / TIMELINE_PNG).exists()

    md = md_path.read_text()
    assert "# Unit report" in md
    assert "restart/kill-rank1" in md and "restart/control (control)" in md
    assert "Runs:** 4" in md
    # Median of time_to_resume_s over repeats 10.0, 12.5, 11.0 is 11.0; min 10, max 12.5, n 3.
    assert _table_row(md, "time_to_resume_s")[1:5] == ["11.000", "10.000", "12.500", "3"]
    # goodput is a percentage over the two repeats that have one; the missing one is named.
    goodput = _table_row(md, "goodput")
    assert goodput[1:5] == ["62.5%", "50.0%", "75.0%", "2"]
    assert "no reason recorded (repeat 2)" in goodput[5]
    # A metric missing in every repeat: dashes plus the reason from the missing column.
    recompute = _table_row(md, "badput_recompute_s")
    assert recompute[1:5] == [MISSING, MISSING, MISSING, "0"]
    assert "no step recomputed after restore (all repeats)" in recompute[5]
    assert "no fault in a control run" in md
    # Comparison table and per-repeat outcome/fidelity.
    cmp_row = _table_row(md, "restart/kill-rank1")
    assert cmp_row[1] == "3" and "2 recovered" in cmp_row[2] and "1 not_recovered" in cmp_row[2]
    assert cmp_row[4] == "11.000" and "1 exact" in cmp_row[7] and "1 diverged" in cmp_row[7]
    assert _table_row(md, "restart/control (control)")[3] == MISSING
    # Timeouts from the first row, plus the plot link by relative path and the reason for absent plots.
    assert _table_row(md, "detect_deadline")[1] == "60.000"
    assert _table_row(md, "0")[-1] == "[plot](restart/kill-rank1/0/timeline.png)"
    assert "![restart/kill-rank1 repeat 0: recovered](restart/kill-rank1/0/timeline.png)" in md
    assert "no timeline plot: no run_dir recorded" in md
    assert NOT_DRAWN in md  # the control has a timeline but no plot yet

    html = html_path.read_text()
    assert html.count('src="data:image/png;base64,') == 2  # the 2 suite-level figures only
    by_path = re.findall(r'<img[^>]+src="(?!data:)([^"]+)"', html)
    assert by_path == ["restart/kill-rank1/0/timeline.png"]  # the run's own PNG, by path, not embedded
    assert '<a href="restart/kill-rank1/0/timeline.png">plot</a>' in html
    assert "restart/kill-rank1" in html and "11.000" in html


def test_write_report_plots_modes(suite: tuple[Path, pd.DataFrame]) -> None:
    suite_dir, df = suite
    fault_png = suite_dir / "restart/kill-rank1/0" / TIMELINE_PNG
    control_png = suite_dir / "restart/control/0" / TIMELINE_PNG
    drawn_ns = fault_png.stat().st_mtime_ns

    written = write_report(suite_dir, df, plots="missing")  # draws the control's only
    assert set(written) - {"report.md", "report.html"} - {k for k in written if k.startswith("plots/")} == {
        "restart/control/0/timeline.png"
    }
    assert control_png.read_bytes().startswith(PNG_SIGNATURE) and fault_png.stat().st_mtime_ns == drawn_ns
    md = written["report.md"].read_text()
    assert NOT_DRAWN not in md and "[plot](restart/control/0/timeline.png)" in md

    written = write_report(suite_dir, df, plots="all")  # redraws both
    assert {"restart/control/0/timeline.png", "restart/kill-rank1/0/timeline.png"} <= set(written)
    assert not list(suite_dir.rglob(".timeline.png.*"))  # drawn beside, renamed into place

    with pytest.raises(ChaosbenchError, match="plots='some'"):
        write_report(suite_dir, df, plots="some")


def test_draw_run_timeline_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = RunMetrics(
        scenario="restart/kill-rank1", repeat=3, outcome="recovered", fault_t_s=2.2, resume_t_s=4.0
    )
    path, why = draw_run_timeline(tmp_path / "nowhere", m)
    assert path is None and why == "no timeline: no events.jsonl"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "events.jsonl").write_text("")
    assert draw_run_timeline(tmp_path / "empty", m) == (None, "no timeline: events.jsonl is empty")
    _fake_run(tmp_path / "run", fault=True)
    path, why = draw_run_timeline(tmp_path / "run", m)  # a RunMetrics, as the runner has it
    assert path == tmp_path / "run" / TIMELINE_PNG and why is None
    assert path.read_bytes().startswith(PNG_SIGNATURE)

    def broken(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("a plotting bug")

    monkeypatch.setattr("chaosbench.report.plots.plot_timeline", broken)
    assert draw_run_timeline(tmp_path / "run", {"scenario": "x"}) == (
        None,
        "plot failed: RuntimeError: a plotting bug",
    )
    assert path.read_bytes().startswith(PNG_SIGNATURE)  # the earlier plot stays
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "events.jsonl",
        TIMELINE_PNG,
    ]  # no temp left


def test_large_suite_links_timelines_without_showing_them(tmp_path: Path) -> None:
    suite_dir = tmp_path / "big"
    n = INLINE_TIMELINES_MAX_RUNS + 1
    rows = []
    for rep in range(n):
        run_dir = suite_dir / "restart__kill-rank1" / str(rep)  # the standard layout, run_dir not recorded
        run_dir.mkdir(parents=True)
        (run_dir / TIMELINE_PNG).write_bytes(PNG_SIGNATURE)
        rows.append(_row(repeat=rep, run_dir=None))
    written = write_report(suite_dir, pd.DataFrame(rows))
    html = written["report.html"].read_text()
    assert len(re.findall(rf'<a href="restart__kill-rank1/\d+/{TIMELINE_PNG}">', html)) == n
    assert not re.search(r'<img[^>]+src="(?!data:)', html)  # linked, not shown: the page stays small
    assert f"{n} runs: each run's timeline plot is linked" in written["report.md"].read_text()


def test_repeats_text_ranges() -> None:
    runs = [RunView({"repeat": r}) for r in [0, 1, 2, 3, 5, 7, 8]] + [RunView({"repeat": "x"})]
    assert repeats_text(runs) == "repeats 0-3, 5, 7-8, x"
    assert repeats_text(runs[:1]) == "repeat 0"
    many = [RunView({"repeat": r}) for r in range(0, 100, 2)]  # 50 runs, none consecutive
    assert repeats_text(many, limit=3) == "repeats 0, 2, 4, … 47 more"


def test_write_report_tolerates_sparse_frames(tmp_path: Path) -> None:
    # Only some columns, all values missing, and an empty frame: never a crash.
    df = pd.DataFrame([{"scenario": None, "repeat": None, "goodput": None, "missing": "not json"}])
    written = write_report(tmp_path / "a", df)
    md = written["report.md"].read_text()
    assert "(no scenario)" in md and MISSING in md
    assert "no timeline plot: no run_dir recorded" in md
    written = write_report(tmp_path / "b", pd.DataFrame())
    assert "No runs" in written["report.md"].read_text()
    assert set(written) == {"report.md", "report.html"}


def test_report_imports_heavy_modules_lazily() -> None:
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, chaosbench.report; print(sorted({'matplotlib', 'pandas', 'pyarrow'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_results_round_trip_with_missing_values(tmp_path: Path) -> None:
    df = pd.DataFrame(
        [
            {
                "scenario": "a/b",
                "repeat": 0,
                "goodput": 0.9,
                "detected": True,
                "fault": "kill",
                "mixed": 1,
                "missing": json.dumps({}),
                "obj": {"k": 1},
            },
            {
                "scenario": "a/b",
                "repeat": 1,
                "goodput": None,
                "detected": None,
                "fault": None,
                "mixed": "x",
                "missing": None,
                "obj": None,
            },
        ]
    )
    paths = write_results(tmp_path, df)
    assert paths["csv"].is_file() and paths["parquet"].is_file()

    back = load_results(tmp_path)  # parquet
    assert list(back["scenario"]) == ["a/b", "a/b"]
    assert list(back["repeat"]) == [0, 1]
    assert back["goodput"][0] == pytest.approx(0.9) and math.isnan(back["goodput"][1])
    assert as_bool(back["detected"][0]) is True
    assert is_missing(back["detected"][1]) and is_missing(back["fault"][1]) and is_missing(back["missing"][1])
    assert list(back["mixed"]) == ["1", "x"]
    assert json.loads(back["obj"][0]) == {"k": 1} and is_missing(back["obj"][1])

    paths["parquet"].unlink()
    back_csv = load_results(tmp_path)  # csv fallback
    assert list(back_csv["scenario"]) == ["a/b", "a/b"]
    assert is_missing(back_csv["fault"][1]) and is_missing(back_csv["goodput"][1])

    paths["csv"].unlink()
    from chaosbench.errors import ChaosbenchError

    with pytest.raises(ChaosbenchError):
        load_results(tmp_path)


def test_formatting() -> None:
    assert fmt_seconds(None) == MISSING
    assert fmt_seconds(1.23456) == "1.235"
    assert fmt_seconds(1234.5) == "1234.50"
    assert fmt_percent(0.923) == "92.3%"
