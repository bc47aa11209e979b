"""Per-run timeline plots (issue 27, item 3): steps as a line per rank and incarnation, the recovery's phases
shaded from the run's own figures and events, checkpoint saves and loads marked; checked on kept real timelines
(tests/fixtures/timelines), against the events and metrics of the same runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosbench.analysis.metrics import compute_metrics
from chaosbench.report.plots import _milestones, run_markers, time_origin_ns, timeline_figure
from chaosbench.timeline import Event, read_events
from tests.conftest import ROOT

TIMELINES = ROOT / "tests" / "fixtures" / "timelines"


def _kept(name: str) -> tuple[list[Event], dict[str, object]]:
    events = read_events(TIMELINES / f"{name}.jsonl")
    return events, vars(compute_metrics(events))


def _rel(events: list[Event]):  # noqa: ANN202 - the plot's own clock: seconds since run_start
    t0 = time_origin_ns(events)
    assert t0 is not None
    return lambda ev: (ev.t_ns - t0) / 1e9


def test_milestones_of_a_restart_from_a_checkpoint() -> None:
    events, row = _kept("command_restart_kill")
    rel = _rel(events)
    stones = _milestones(events, rel, run_markers(row))
    restart = next(rel(ev) for ev in events if ev.kind == "restart")
    restore = next(rel(ev) for ev in events if ev.kind == "ckpt_load_end" and rel(ev) >= restart)
    assert stones == [
        ("fault", row["fault_t_s"]),
        ("detect", row["detect_t_s"]),
        ("restart", restart),
        ("restore", restore),
        ("resume", row["resume_t_s"]),
    ]
    assert [t for _, t in stones] == sorted(t for _, t in stones)


def test_milestones_of_runs_that_did_not_resume_or_serve() -> None:
    events, row = _kept("torchrun_kill_rendezvous_host")  # detected, never resumed
    assert [name for name, _ in _milestones(events, _rel(events), run_markers(row))] == ["fault", "detect"]
    fig = timeline_figure(events, "torchrun/kill-rendezvous-host", run_markers(row))
    # a rank still stepped after the detection: no claim that nothing resumed
    assert "not resumed by the run's end" not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    events, row = _kept("calibration_kill")  # no step after the detection: grey to the run's end
    fig = timeline_figure(events, "cal/kill", run_markers(row))
    assert "not resumed by the run's end" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    events, row = _kept("serving_supervised_kill_replica")  # a serving run ends at its recovery
    stones = _milestones(events, _rel(events), run_markers(row))
    assert [name for name, _ in stones] == ["fault", "detect", "recover"]
    assert stones[2][1] == pytest.approx(row["fault_t_s"] + row["time_to_recover_s"])


def test_steps_are_a_line_per_rank_and_incarnation(tmp_path: Path) -> None:
    events, row = _kept("command_restart_kill")
    fig = timeline_figure(events, "restart/kill", run_markers(row))
    steps_ax, lanes_ax = fig.axes[:2]
    rel = _rel(events)
    lines = {ln.get_gid(): ln for ln in steps_ax.get_lines() if str(ln.get_gid()).startswith("steps ")}
    expected = {}
    for ev in events:
        if ev.kind == "step":
            xs, ys = expected.setdefault(
                f"steps rank {ev.get('rank')} incarnation {ev.get('incarnation')}", ([], [])
            )
            xs.append(rel(ev))
            ys.append(ev.get("step"))
    assert set(lines) == set(expected) == {f"steps rank {r} incarnation {i}" for r in (0, 1) for i in (0, 1)}
    for gid, (xs, ys) in expected.items():
        assert list(lines[gid].get_xdata()) == xs and list(lines[gid].get_ydata()) == ys
    # the checkpoints: each complete save and each load at its step
    legend = [t.get_text() for t in steps_ax.get_legend().get_texts()]
    assert {
        "checkpoint saved",
        "checkpoint loaded",
        "fault → detect",
        "detect → restart",
        "restart → restore",
        "restore → resume",
    } <= set(legend) and "not resumed by the run's end" not in legend
    saved = next(ln for ln in steps_ax.get_lines() if ln.get_marker() == "v")
    saves = [(rel(ev), ev.get("step")) for ev in events if ev.kind == "ckpt_save_end" and ev.get("complete")]
    assert list(zip(saved.get_xdata(), saved.get_ydata(), strict=True)) == saves
    assert [t.get_text() for t in lanes_ax.get_yticklabels()] == ["processes"]
    fig.savefig(tmp_path / "t.png")  # draws
