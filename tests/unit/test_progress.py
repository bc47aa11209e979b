"""The suite's progress display: phases from timeline events, the ETA, plain lines and the live bar."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from chaosbench.progress import PlannedRun, SuiteProgress, estimate_run_s, format_duration, next_phase
from chaosbench.timeline.events import Event


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ev(kind: str, **data: object) -> Event:
    return Event(t_ns=0, kind=kind, data=dict(data))


def phases(events: list[Event], control: bool = False) -> list[str]:
    phase, out = "starting", []
    for e in events:
        phase = next_phase(phase, e, control)
        out.append(phase)
    return out


def test_the_phases_of_a_run_with_a_fault() -> None:
    events = [
        ev("run_start"),
        ev("step", step=1),
        ev("step", step=2),
        ev("fault_inject", fault="kill-rank1"),
        ev("step", step=3),  # a survivor's step before anyone noticed: still detecting
        ev("detect", reason="exit"),
        ev("restart", attempt=1),
        ev("step", step=2, incarnation=1),
        ev("step", step=3),
        ev("train_end", step=4),
        ev("teardown_begin", reason="end"),
        ev("step", step=5),
    ]
    assert phases(events) == [
        "starting",
        "waiting for the fault",
        "waiting for the fault",
        "detecting",
        "detecting",
        "recovering",
        "recovering",
        "finishing",
        "finishing",
        "finishing",
        "tearing down",
        "tearing down",
    ]


def test_a_control_run_is_running_and_a_give_up_ends_detecting() -> None:
    assert phases([ev("step", step=1), ev("train_end")], control=True) == ["running", "finishing"]
    assert phases([ev("step", step=1), ev("fault_inject"), ev("give_up"), ev("step", step=2)]) == [
        "waiting for the fault",
        "detecting",
        "gave up",
        "gave up",
    ]


def test_format_duration() -> None:
    assert [format_duration(s) for s in (-1, 0.4, 42, 130, 3599.6, 3900)] == [
        "0s",
        "0s",
        "42s",
        "2m10s",
        "1h00m",
        "1h05m",
    ]


def test_plain_lines_with_phases_and_the_eta() -> None:
    out, clock = io.StringIO(), FakeClock()
    p = SuiteProgress("smoke", 3, bound_s=300, stream=out, clock=clock)
    assert p.eta_s() == (300, True)
    p.run_started(1, "restart/kill-rank1 #0", deadline_s=60, control=False)
    clock.now += 1.0
    p.on_event(ev("run_start"))  # no phase change: no line
    p.on_event(ev("step", rank=0, step=1))
    clock.now += 2.0
    p.on_event(ev("step", rank=0, step=7))
    p.on_event(ev("fault_inject", fault="kill-rank1"))
    clock.now += 1.2
    p.on_event(ev("detect", reason="exit"))
    p.on_event(ev("step", rank=0, step=5, incarnation=1))
    clock.now += 5.0
    p.on_event(ev("teardown_begin", reason="end"))
    p.run_finished("restart/kill-rank1 #0", "recovered  detect 1.2 s", 10.0)
    p.on_event(ev("step", step=99))  # a late event of the finished run: ignored
    p.run_started(2, "restart/kill-rank1 #1", deadline_s=60, control=False)
    p.run_finished("restart/kill-rank1 #1", "recovered", 20.0)
    p.run_started(3, "restart/kill-rank1 #2", deadline_s=60, control=False)
    p.run_finished("restart/kill-rank1 #2", "recovered", 30.0)
    p.close()
    assert out.getvalue().splitlines() == [
        "suite 'smoke': 3 runs; at most 5m00s by the deadlines",
        "[1/3] restart/kill-rank1 #0 ...",
        "[1/3]   phase: waiting for the fault (t+1.0 s, step 1)",
        "[1/3]   phase: detecting (t+3.0 s, step 7)",
        "[1/3]   phase: recovering (t+4.2 s, step 7)",
        "[1/3]   phase: finishing (t+4.2 s, step 7)",
        "[1/3]   phase: tearing down (t+9.2 s, step 7)",
        "[1/3] restart/kill-rank1 #0 recovered  detect 1.2 s (10.0 s; ETA 20s)",  # 2 runs left x 10 s
        "[2/3] restart/kill-rank1 #1 ...",
        "[2/3] restart/kill-rank1 #1 recovered (20.0 s; ETA 15s)",  # 1 x mean(10, 20)
        "[3/3] restart/kill-rank1 #2 ...",
        "[3/3] restart/kill-rank1 #2 recovered (30.0 s)",  # nothing left
    ]
    assert "\x1b" not in out.getvalue()


def test_the_eta_counts_the_current_runs_remaining_share() -> None:
    clock = FakeClock()
    p = SuiteProgress("s", 5, bound_s=None, stream=io.StringIO(), clock=clock)
    assert p.eta_s() == (None, False)
    for i, wall_s in ((1, 10.0), (2, 20.0)):
        p.run_started(i, f"r #{i}", 60, control=False)
        p.run_finished(f"r #{i}", "ok", wall_s)
    assert p.eta_s() == (45.0, False)  # 3 runs left x mean 15 s
    p.run_started(3, "r #3", 60, control=False)
    clock.now += 5.0
    assert p.eta_s() == (40.0, False)  # 2 waiting x 15 s + the current run's 15 - 5 s
    clock.now += 100.0
    assert p.eta_s() == (30.0, False)  # the current run overran the mean: no share, never negative


def test_skipped_runs_count_as_done_but_not_in_the_mean() -> None:
    out, clock = io.StringIO(), FakeClock()
    p = SuiteProgress("s", 4, bound_s=100, stream=out, clock=clock)
    p.skipped("a #0", "finished earlier")
    p.skipped("a #1", "finished earlier")
    clock.now += 30.0
    assert p.eta_s() == (70.0, True)  # no run finished here yet: the bound less the time elapsed
    p.run_started(3, "a #2", 60, control=True)
    p.run_finished("a #2", "completed", 12.0)
    assert p.eta_s() == (12.0, False)  # one run left x 12 s; the skipped runs took no time here
    lines = out.getvalue().splitlines()
    assert lines[1:3] == ["[1/4] a #0 skipped: finished earlier", "[2/4] a #1 skipped: finished earlier"]
    assert lines[-1] == "[3/4] a #2 completed (12.0 s; ETA 12s)"


def test_before_any_run_finished_the_eta_is_unknown_or_the_bound() -> None:
    out = io.StringIO()
    p = SuiteProgress("s", 3, bound_s=None, stream=out)
    p.skipped("a #0", "finished earlier")
    p.run_started(2, "a #1", 60, control=False)
    p.run_finished("a #1", "recovered", 12.0)
    assert "(12.0 s; ETA 12s)" in out.getvalue()
    p2 = SuiteProgress("s", 3, bound_s=None, stream=io.StringIO())
    p2.skipped("a #0", "x")
    assert p2.eta_s() == (None, False)


def test_on_event_never_raises() -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError("broken pipe")

    p = SuiteProgress("s", 1, bound_s=None, stream=Broken(), live=False)
    p.run_started(1, "a #0", 60, control=False)
    p.on_event(ev("step", step="not a number"))
    p.on_event(ev("fault_inject"))  # a phase line that cannot be written
    p.message("lost")
    p.run_finished("a #0", "ok", 1.0)
    p.close()


def test_plain_unless_the_stream_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def show(stream: io.StringIO) -> str:
        with SuiteProgress("s", 1, bound_s=10, stream=stream) as p:
            p.run_started(1, "a #0", 60, control=False)
            p.run_finished("a #0", "ok", 1.0)
        return stream.getvalue()

    monkeypatch.setenv("TERM", "dumb")
    assert "\x1b" not in show(Tty())
    monkeypatch.setenv("TERM", "xterm-256color")
    assert "\x1b" not in show(io.StringIO())
    tty = Tty()
    show(tty)
    assert "\x1b" in tty.getvalue()
    assert "a #0 ok (1.0 s)" in tty.getvalue()


@pytest.mark.timeout(60)
def test_live_mode_with_events_from_another_thread() -> None:
    out = io.StringIO()
    stdout, stderr = sys.stdout, sys.stderr
    p = SuiteProgress("smoke", 3, bound_s=120, stream=out, live=True)
    errors: list[BaseException] = []

    def follower() -> None:
        try:
            for i in range(1, 3001):
                p.on_event(ev("step", rank=0, step=i))
                if i == 1000:
                    p.on_event(ev("fault_inject"))
                if i == 1500:
                    p.on_event(ev("restart"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    for i in range(1, 4):
        p.run_started(i, f"restart/kill-rank1 #{i}", deadline_s=60, control=False)
        thread = threading.Thread(target=follower)
        thread.start()
        for j in range(20):
            p.message(f"note {i}.{j} [not markup]")
        thread.join(timeout=30)
        assert not thread.is_alive()
        p.run_finished(f"restart/kill-rank1 #{i}", "recovered", 2.0)
    p.close()
    p.close()  # idempotent
    assert errors == []
    assert (sys.stdout, sys.stderr) == (stdout, stderr)  # the live display's redirection is undone
    text = out.getvalue()
    assert "note 3.19 [not markup]" in text
    assert "[1/3] restart/kill-rank1 #1 recovered (2.0 s; ETA 4s)" in text
    assert "[3/3] restart/kill-rank1 #3 recovered (2.0 s)" in text
    # the cursor is shown again and the bar erased (transient): the terminal is left clean
    assert "\x1b[?25h" in text[-40:] and text.endswith("\x1b[2K")


# ---------------------------------------------------------------------------------------- the ETA from a plan
def _plan(*cells: tuple[str, str, int], floor_s: dict[str, float] | None = None) -> list[PlannedRun]:
    """Runs in order: (framework, fault, repeats) each; every run bounded by 100 s."""
    out: list[PlannedRun] = []
    for fw, fault, repeats in cells:
        for rep in range(repeats):
            out.append(
                PlannedRun(
                    len(out) + 1,
                    f"{fw}/{fault} #{rep}",
                    fw,
                    fault,
                    100.0,
                    (floor_s or {}).get(f"{fw}/{fault}", 0.0),
                )
            )
    return out


def _replay(p: SuiteProgress, clock: FakeClock, runs: list[PlannedRun], walls_s: list[float]) -> None:
    for run, wall_s in zip(runs[: len(walls_s)], walls_s, strict=True):
        p.run_started(run.index, run.label, 60, control=run.fault == "control")
        clock.now += wall_s
        p.run_finished(run.label, "ok", wall_s)


def test_the_eta_of_a_suite_whose_first_framework_is_fast() -> None:
    """Framework a's runs take 10-12 s, b's 30-32 s (its fault costs the same seconds: +2 s). Once a finished
    and b's control ran, the mean of all runs so far says 2 x 16 s; b's runs left take 64 s."""
    plan = _plan(("a", "control", 1), ("a", "kill", 2), ("b", "control", 1), ("b", "kill", 2))
    walls_s = [10.0, 12.0, 12.0, 30.0]
    old_clock, new_clock = FakeClock(), FakeClock()
    old = SuiteProgress("s", 6, bound_s=600, stream=io.StringIO(), clock=old_clock)
    new = SuiteProgress("s", 6, bound_s=600, stream=io.StringIO(), clock=new_clock, plan=plan)
    _replay(old, old_clock, plan, walls_s)
    _replay(new, new_clock, plan, walls_s)
    assert old.eta_s() == (32.0, False)  # -50 %
    assert new.eta_s() == (64.0, False)  # b's level 30 s + kill's extra 2 s, twice
    assert new._eta_text() == "ETA 1m04s"
    new.run_started(5, "b/kill #0", 60, control=False)
    new_clock.now += 6.0
    assert new.eta_s() == (58.0, False)  # the running run's 32 - 6 s, and 32 s waiting
    new_clock.now += 100.0
    assert new.eta_s() == (32.0, False)  # it overran its estimate: no share, never negative


def test_estimate_run_s_from_cell_framework_fault_and_bound() -> None:
    plan = _plan(
        ("a", "control", 1),
        ("a", "kill", 2),
        ("a", "hang", 1),
        ("b", "control", 1),
        ("b", "kill", 1),
        ("b", "hang", 1),
        ("c", "control", 1),
        ("c", "lose-node", 1),
        floor_s={"c/lose-node": 40.0},
    )
    a_ctl, a_kill0, a_kill1, a_hang, b_ctl, b_kill, b_hang, c_ctl, c_lose = plan
    assert estimate_run_s(a_kill0, []) is None
    done = [(a_ctl, 10.0), (a_kill0, 12.0), (a_kill1, 17.0)]
    assert estimate_run_s(a_kill1, done) == 14.5  # its cell's median
    assert estimate_run_s(b_kill, done) == 14.5  # b not begun: the median level (a's 10 s) + kill's 4.5 s
    assert estimate_run_s(a_hang, done) == 12.0  # a fault not seen: its framework's median
    assert estimate_run_s(b_hang, done) == 13.0  # nor its framework: its bound x 39 / 300 s of the bounds
    done += [(a_hang, 30.0), (b_ctl, 20.0)]
    assert estimate_run_s(b_hang, done) == 40.0  # b's control + hang's extra 20 s (a: 30 s against 10 s)
    assert estimate_run_s(c_ctl, done) == 15.0  # c not begun: the median of a's and b's levels
    # c's lose-node is not seen anywhere; its timeouts say it costs at least 40 s beyond a control
    assert estimate_run_s(c_lose, done) == 55.0
    # b's control has not finished: its level is its kill's wall less kill's extra (a: 2 s)
    assert estimate_run_s(b_ctl, [(a_ctl, 10.0), (a_kill0, 12.0), (b_kill, 24.0)]) == 22.0


def test_a_run_whose_floor_reaches_its_deadline_is_estimated_at_its_deadline() -> None:
    """torchrun's lost node: its rendezvous waits 600 s for the node, past the run's 150 s deadline."""
    ctl = PlannedRun(1, "t/control #0", "t", "control", 180.0, 0.0, 150.0)
    kill = PlannedRun(2, "t/kill #0", "t", "kill", 180.0, 0.1, 150.0)
    lose = [PlannedRun(3 + i, f"t/lose-node #{i}", "t", "lose-node", 180.0, 600.1, 150.0) for i in range(2)]
    hang = PlannedRun(5, "t/hang #0", "t", "hang", 180.0, 40.0, 150.0)
    assert estimate_run_s(lose[0], [(ctl, 10.0), (kill, 14.0)]) == 150.0  # none reached its deadline yet: +0
    assert estimate_run_s(lose[1], [(ctl, 10.0), (lose[0], 153.0)]) == 153.0  # its own cell
    other = PlannedRun(6, "u/lose-node #0", "u", "lose-node", 180.0, 600.1, 150.0)
    assert (
        estimate_run_s(other, [(ctl, 10.0), (lose[0], 153.0)]) == 153.0
    )  # 3 s past the deadline, as lose[0]
    # never above the run's bound: hang at 40 s beyond t's level of 200 s would be 240 s
    assert estimate_run_s(hang, [(ctl, 200.0)]) == 180.0
    # u recovers from a lost node: its lose-node extra comes from the frameworks that recovered (v: +20 s), not
    # from t's wait for the deadline (+143 s)
    v_ctl, v_lose = (
        PlannedRun(7, "v/control #0", "v", "control", 180.0, 0.0, 150.0),
        PlannedRun(8, "v/lose-node #0", "v", "lose-node", 180.0, 0.1, 150.0),
    )
    u_ctl, u_lose = (
        PlannedRun(9, "u/control #0", "u", "control", 180.0, 0.0, 150.0),
        PlannedRun(10, "u/lose-node #0", "u", "lose-node", 180.0, 0.1, 150.0),
    )
    done = [(ctl, 10.0), (lose[0], 153.0), (v_ctl, 20.0), (v_lose, 40.0), (u_ctl, 30.0)]
    assert estimate_run_s(u_lose, done) == 50.0


def test_suite_plan_of_the_compare_suite() -> None:
    from chaosbench.runner import RUN_OVERHEAD_S, suite_plan
    from chaosbench.specs import load_suite
    from tests.conftest import ROOT

    suite = load_suite(ROOT / "suites" / "compare.yaml")
    outlook = [
        {"framework": "torchrun", "fault": "hang-rank", "expected_s": 10.1, "resume_floor_s": 40.1},
        {"framework": "restart", "fault": "kill-rank", "expected_s": 0.05, "resume_floor_s": None},
        {"framework": "none", "fault": "kill-rank", "expected_s": None, "resume_floor_s": None},
    ]
    plan = suite_plan(suite, outlook)
    assert len(plan) == suite.run_count() == 91
    assert [p.index for p in plan] == list(range(1, 92))
    assert plan[0] == PlannedRun(1, "none/control #0", "none", "control", 150 + RUN_OVERHEAD_S, 0.0, 150)
    assert plan[14] == PlannedRun(
        15, "restart/kill-rank #0", "restart", "kill-rank", 150 + RUN_OVERHEAD_S, 0.05, 150
    )
    assert [p.floor_s for p in plan if p.label.startswith("torchrun/hang-rank")] == [40.1] * 3


def test_the_eta_says_when_a_framework_left_has_not_begun() -> None:
    plan = _plan(("a", "control", 1), ("a", "kill", 1), ("b", "control", 1), ("c", "control", 1))
    out, clock = io.StringIO(), FakeClock()
    p = SuiteProgress("s", 4, bound_s=400, stream=out, clock=clock, plan=plan)
    _replay(p, clock, plan, [10.0, 14.0, 30.0])
    assert (
        [line for line in out.getvalue().splitlines() if " ok " in line]
        == [
            "[1/4] a/control #0 ok (10.0 s; ETA 30s (guessed for 2 frameworks not begun))",  # a's level for a's kill
            "[2/4] a/kill #0 ok (14.0 s; ETA 20s (guessed for 2 frameworks not begun))",  # and for b's and c's
            "[3/4] b/control #0 ok (30.0 s; ETA 20s (guessed for 1 framework not begun))",  # c: median(10, 30)
        ]
    )
