"""The report's first screen (issue 27, item 3): the headline per framework and the framework x fault scorecard,
from a result set built of kept real timelines (tests/fixtures/timelines), so every figure asserted here is one
those runs measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaosbench.analysis.metrics import RunMetrics, compute_metrics
from chaosbench.analysis.results import to_frame
from chaosbench.report import write_report
from chaosbench.report.html import _colour, _TimeScale
from chaosbench.rundir import dirname
from chaosbench.timeline import Event, TimelineWriter, read_events
from tests.conftest import ROOT
from tests.helpers import OTLP, write_lighthouse_died_control

TIMELINES = ROOT / "tests" / "fixtures" / "timelines"
T0 = 1_800_000_000_000_000_000


def _run(suite_dir: Path, events: list[Event], repeat: int = 0) -> RunMetrics:
    """The run of ``events`` in the standard layout (``<scenario dir>/<repeat>/events.jsonl``), and its metrics."""
    m = compute_metrics(events)
    m.repeat = repeat
    run_dir = suite_dir / dirname(str(m.scenario)) / str(repeat)
    run_dir.mkdir(parents=True)
    with TimelineWriter(run_dir / "events.jsonl") as tl:
        for ev in events:
            tl.emit(ev.kind, t_ns=ev.t_ns, **{k: v for k, v in ev.data.items() if k not in ("kind", "t_ns")})
    m.run_dir = str(run_dir)
    return m


def _kept(name: str) -> list[Event]:
    return read_events(TIMELINES / f"{name}.jsonl")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """report.md and report.html of: restart recovering from a kill, a hang, an OOM and a NaN (kept timelines),
    and the kill's timeline without its fault (the fault did not fire: an unusable row); torchrun recovering from
    a kill and not from the loss of its rendezvous host; torchft's kill of a group, with a control whose
    Lighthouse died at start-up (the framework is unusable)."""
    suite_dir = tmp_path_factory.mktemp("suite")
    kill = _kept("command_restart_kill")
    metrics = [
        _run(suite_dir, kill),
        _run(suite_dir, [e for e in kill if e.kind != "fault_inject"], repeat=1),
    ]
    metrics += [
        _run(suite_dir, _kept(n))
        for n in (
            "restart_hang",
            "restart_oom",
            "restart_sdc_nan",
            "torchrun_kill",
            "torchrun_kill_rendezvous_host",
        )
    ]
    control_dir = suite_dir / "torchft__control" / "0"
    control = compute_metrics(write_lighthouse_died_control(control_dir, T0), total_steps=30)
    control.run_dir = str(control_dir)
    metrics += [control, _run(suite_dir, _kept("torchft_kill_group"))]
    written = write_report(suite_dir, to_frame(metrics))
    return written["report.md"].read_text(), written["report.html"].read_text()


def test_headline_per_framework(report: tuple[str, str]) -> None:
    md, _ = report
    # restart: 4 of 4 fired faults recovered (the fault of repeat 1 of the kill did not fire); the median of the
    # four measured times to resume (5.295, 7.384, 8.434, 8.856 s) is 7.909 s; Wilson 95 % of 4/4 is 51-100 %
    restart = (
        "- **restart:** recovered 4/4 (95 % CI 51-100 %); median time to resume 7.909 s; detected by process exit ×2 "
        "(timeout: monitor_interval_s=0.05), step watchdog ×1 (timeout: heartbeat_timeout_s=3 + "
        "monitor_interval_s=0.05), loss guard ×1 (timeout: — no detection model for a sdc fault under "
        "restart); unusable rows: restart/kill repeat 1 (fault_not_fired: fault did not fire)"
    )
    torchrun = (
        "- **torchrun:** recovered 1/2 (95 % CI 9-91 %; 1 not recovered); median time to resume 5.084 s; detected by "
        "process exit ×1 (timeout: monitor_interval_s=0.1), rendezvous store lost ×1 (timeout: — no "
        "detection model for a crash of the rendezvous-host under torchrun)"
    )
    torchft = (
        "- **torchft:** unusable, not counted (1 fault run): its control run did not complete (control failed "
        "(failed); 'lighthouse' exited 1 before the job's first step: " + OTLP + ")"
    )
    head = md.split("## Scorecard", 1)[0]
    assert head.splitlines()[2:] == ["## Headline", "", restart, torchrun, torchft, ""]


def _md_row(md: str, framework: str) -> list[str]:
    card = md.split("## Scorecard", 1)[1]
    line = next(ln for ln in card.splitlines() if ln.startswith(f"| {framework} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_scorecard_cells(report: tuple[str, str]) -> None:
    md, html = report
    card = md.split("## Scorecard", 1)[1]
    header = next(ln for ln in card.splitlines() if ln.startswith("| framework |"))
    faults = ["kill", "hang", "oom", "sdc-nan", "kill-rendezvous-host", "kill-g1"]
    assert header == "| " + " | ".join(["framework", *faults]) + " |"
    assert _md_row(md, "restart") == [
        "restart",
        "1/1 recovered; median 5.295 s; 1 unusable row · runs [0](restart__kill/0/) [1](restart__kill/1/)",
        "1/1 recovered; median 8.856 s · runs [0](restart__hang/0/)",
        "1/1 recovered; median 7.384 s · runs [0](restart__oom/0/)",
        "1/1 recovered; median 8.434 s · runs [0](restart__sdc-nan/0/)",
        "not run",
        "not run",
    ]
    torchrun = _md_row(md, "torchrun")
    assert torchrun[5] == "0/1 recovered; 1 not recovered · runs [0](torchrun__kill-rendezvous-host/0/)"
    assert _md_row(md, "torchft")[6] == "unusable; its control was not clean · runs [0](torchft__kill-g1/0/)"

    # HTML: each cell links its scenario's section (which exists) and its runs; coloured by its median from the
    # fastest (5.084 s, torchrun's kill) to the slowest (8.856 s, restart's hang); the unrecovered cell striped,
    # the unusable one grey with the reason on hover
    grid = html.split('<table class="sc">', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td[^>]*>.*?(?=<td|<tr|</tbody>)", grid, re.S)
    assert len(cells) == 3 * len(faults)
    scale = _TimeScale([5.294626445, 8.855693837, 7.38365877, 8.433718532, 5.084347188])
    kill = cells[0]
    assert f'style="background:{_colour(scale.frac(5.294626445))}"' in kill
    assert '<a href="#scenario-restart-kill"><b>1/1 recovered</b></a>' in kill
    assert 'id="scenario-restart-kill"' in html
    assert '<a href="restart__kill/0/">0</a> <a href="restart__kill/1/">1</a>' in kill
    assert f'style="background:{_colour(1.0)}"' in cells[1]  # the hang: the slowest
    assert f'style="background:{_colour(0.0)}"' in cells[len(faults)]  # torchrun's kill: the fastest
    assert cells[len(faults) + 4].startswith('<td class="sc-none-nr">')
    unusable = cells[2 * len(faults) + 5]
    assert unusable.startswith('<td class="sc-unusable" title="its control run did not complete')
    assert cells[4].startswith('<td class="sc-empty">not run')


def test_interval_bounds_keep_what_rounding_would_hide() -> None:
    from chaosbench.report.headline import _percent

    assert [_percent(x) for x in (0.0, 0.0042, 0.094, 0.9958, 1.0)] == ["0", "0.4", "9", "99.6", "100"]


def test_time_scale() -> None:
    linear = _TimeScale([2.0, 4.0, 6.0])
    assert (linear.log, linear.frac(4.0), linear.at(0.5)) == (False, 0.5, 4.0)
    log = _TimeScale([0.5, 50.0])  # over tenfold: logarithmic, 5 s mid-scale
    assert log.log and log.frac(5.0) == pytest.approx(0.5) and log.at(0.5) == pytest.approx(5.0)
    assert _TimeScale([3.0]).frac(3.0) == 0.5
    assert (_colour(0.0), _colour(0.5), _colour(1.0)) == ("#c7e9c0", "#fee08b", "#fc8d59")


def test_outlasted_and_not_recovered_cells_look_apart() -> None:
    from chaosbench.report.document import ScoreCell
    from chaosbench.report.html import _score_cell

    scale = _TimeScale([1.0, 2.0])
    some_out = _score_cell(
        ScoreCell(["1/2 recovered"], fired=2, recovered=1, outlasted=1, seconds=1.0), scale
    )
    some_nr = _score_cell(
        ScoreCell(["1/2 recovered"], fired=2, recovered=1, not_recovered=1, seconds=2.0), scale
    )
    all_out = _score_cell(ScoreCell(["0/2 recovered"], fired=2, outlasted=2), scale)
    none_nr = _score_cell(ScoreCell(["0/2 recovered"], fired=2, outlasted=1, not_recovered=1), scale)
    unfired = _score_cell(ScoreCell(["no fault fired"]), scale)
    assert some_out.startswith(f'<td class="sc-out" style="background:{_colour(0.0)}">')
    assert some_nr.startswith(f'<td class="sc-nr" style="background:{_colour(1.0)}">')
    assert all_out.startswith('<td class="sc-none-out">') and none_nr.startswith('<td class="sc-none-nr">')
    assert unfired.startswith('<td class="sc-unfired">')


def test_a_detection_without_its_mechanism_says_why() -> None:
    from chaosbench.analysis.results import to_frame
    from chaosbench.report.headline import headline_items
    from chaosbench.report.tables import RunView
    from chaosbench.report.writer import _records

    runs = [RunView(r) for r in _records(to_frame([compute_metrics(_kept("calibration_kill"))]))]
    assert headline_items(runs) == [
        (
            "cal",
            "recovered 0/1 (95 % CI 0-79 %; 1 not recovered); median time to resume — "
            "(none recovered); detected by a mechanism not named (the detection's source "
            "does not say what noticed the failure (via: none)) ×1 (timeout: — no detector: "
            "a failed rank ends the job, a hung one stalls it)",
        )
    ]


def test_the_framework_named_none_is_named() -> None:
    """The framework that does nothing is called ``none``: a name, not a missing value (its headline and its
    scorecard row said '—')."""
    from types import SimpleNamespace

    from chaosbench.report.fmt import as_name
    from chaosbench.report.headline import _fault, _framework

    assert _framework(SimpleNamespace(row={"framework": "none"})) == "none"  # type: ignore[arg-type]
    assert _fault(SimpleNamespace(row={"fault": "none"})) == "none"  # type: ignore[arg-type]
    assert _framework(SimpleNamespace(row={"framework": float("nan")})) == "—"  # type: ignore[arg-type]
    assert as_name(None) is None and as_name("none") == "none"
