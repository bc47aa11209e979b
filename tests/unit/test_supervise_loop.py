"""The one supervise loop (frameworks/base.py ``supervise_loop``) and the run's exit queue it waits on
(runtimes/base.py ``ExitQueue``): an exit wakes it at once when asked to, never when the interval is the
modelled framework's poll; the harness's stop ends every wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chaosbench.frameworks.base import JobResult, RunControl, Stopped, supervise_job, supervise_loop
from chaosbench.runtimes.base import ExitQueue, ProcessSpec, ProcHandle, RunInfo
from chaosbench.timeline import TimelineWriter


def _control(tmp_path: Path, deadline_s: float = 30.0) -> tuple[RunControl, ExitQueue]:
    timeline = TimelineWriter(tmp_path / "events.jsonl")
    run = RunInfo("run-1", tmp_path, timeline)
    runtime: Any = SimpleNamespace(run=run)
    return RunControl(runtime, timeline, SimpleNamespace(), time.monotonic() + deadline_s), run.exits  # type: ignore[arg-type]


def _handle(name: str = "rank0") -> ProcHandle:
    return ProcHandle(ProcessSpec(name, ["true"]), pid=1, ticks=None)


def _later(seconds: float, fn: Any, *args: Any) -> threading.Thread:
    t = threading.Timer(seconds, fn, args)
    t.start()
    return t


def test_settle_records_the_exit_on_the_handle_and_counts_it() -> None:
    exits, h = ExitQueue(), _handle()
    assert h.poll() is None and exits.count == 0
    exits.settle(h, -9, 123)
    assert (h.poll(), h.returncode, h.t_exit_ns, h.exited.is_set(), exits.count) == (-9, -9, 123, True, 1)
    assert exits.wait(0, 5.0) is True  # an exit after the 0th: no wait
    assert exits.wait(1, 0.01) is False  # none since the 1st: the timeout


def test_an_exit_wakes_the_loop_at_once(tmp_path: Path) -> None:
    control, exits = _control(tmp_path)
    h = _handle()
    steps: list[float] = []

    def step() -> JobResult | None:
        steps.append(time.monotonic())
        return JobResult("failed", "rank0 exited") if h.poll() is not None else None

    timer = _later(0.2, exits.settle, h, 1, 0)
    t0 = time.monotonic()
    out = supervise_job(control, step, 30.0)  # an interval far longer than the test
    timer.join()
    assert out == JobResult("failed", "rank0 exited")
    # woken by the exit, not by the 30 s interval: the second step came right after the exit at 0.2 s (the
    # bound is the wake-up of a thread on a busy 2-core machine, not a measured figure)
    assert len(steps) == 2 and steps[1] - t0 < 5.0


def test_an_exit_during_a_step_is_not_missed(tmp_path: Path) -> None:
    """The exit count is read before the step: an exit settled while the step runs ends the next wait at once."""
    control, exits = _control(tmp_path)
    h = _handle()
    calls = 0

    def step() -> JobResult | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            exits.settle(h, 0, 0)  # after this step looked
            return None
        return JobResult("completed")

    t0 = time.monotonic()
    assert supervise_job(control, step, 30.0) == JobResult("completed")
    assert time.monotonic() - t0 < 5.0


def test_a_modelled_poll_is_not_woken_by_an_exit(tmp_path: Path) -> None:
    """wake_on_exit=False: the loop steps every interval and no sooner (the plain restart loop's
    monitor_interval_s is part of its detection time)."""
    control, exits = _control(tmp_path)
    h = _handle()
    steps: list[float] = []

    def step() -> str | None:
        steps.append(time.monotonic())
        return "seen" if h.poll() is not None else None

    timer = _later(0.05, exits.settle, h, 1, 0)
    t0 = time.monotonic()
    assert supervise_loop(control, step, 0.6, wake_on_exit=False) == "seen"
    timer.join()
    # the exit at 0.05 s was seen by the step at 0.6 s, not before (a wait ends no sooner than its timeout)
    assert len(steps) == 2 and steps[1] - t0 >= 0.6


def test_the_stop_ends_every_wait(tmp_path: Path) -> None:
    for wake_on_exit in (True, False):
        control, _ = _control(tmp_path)
        timer = _later(0.1, control.interrupt)
        t0 = time.monotonic()
        out = supervise_loop(control, lambda: None, 30.0, wake_on_exit=wake_on_exit)
        timer.join()
        assert out == Stopped("interrupted") and time.monotonic() - t0 < 5.0
        assert out.result() == JobResult("interrupted", "harness stopped the run (interrupted)")
    control, _ = _control(tmp_path, deadline_s=0.1)
    assert supervise_job(control, lambda: None, 30.0) == JobResult(
        "deadline", "harness stopped the run (deadline)"
    )


def test_the_local_runtime_settles_its_exits_in_the_runs_queue(tmp_path: Path) -> None:
    from chaosbench.runtimes.local import LocalRuntime

    timeline = TimelineWriter(tmp_path / "events.jsonl")
    run = RunInfo("run-1", tmp_path, timeline)
    rt = LocalRuntime(run)
    try:
        h = rt.start(ProcessSpec("rank0", ["sh", "-c", "exit 3"]))
        assert run.exits.wait(0, 30.0) is True
        assert (h.poll(), run.exits.count) == (3, 1) and h.t_exit_ns is not None
    finally:
        rt.cleanup()
