"""What a user watching ``chaosbench run`` sees: the suite's progress with an ETA, and the current run's phase.

:class:`SuiteProgress` draws a rich progress bar with a transient current-run line when its stream is a terminal,
and writes plain lines (no escape codes) otherwise: CI logs and pipes. The current run's phase is derived from
its timeline events (:func:`next_phase`), handed over by the timeline follower's thread.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from chaosbench.timeline.events import Event

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.progress import Progress, TaskID

#: The phases of a run, in the order a run with a fault goes through them.
PHASES = (
    "starting",
    "waiting for the fault",
    "running",
    "detecting",
    "recovering",
    "gave up",
    "finishing",
    "tearing down",
)


def next_phase(phase: str, event: Event, control: bool) -> str:
    """The phase after ``event``: ``starting`` until the first step, then ``waiting for the fault`` (a control
    run: ``running``), ``detecting`` from a ``fault_inject`` until a ``detect``/``restart`` (``recovering``) or a
    ``give_up`` (``gave up``), ``finishing`` from the first step after that or a ``train_end``, ``tearing down``
    from ``teardown_begin`` on (final)."""
    kind = event.kind
    if phase == "tearing down":
        return phase
    if kind == "teardown_begin":
        return "tearing down"
    if kind == "fault_inject":
        return "detecting"
    if kind in ("detect", "restart"):
        return "recovering"
    if kind == "give_up":
        return "gave up"
    if kind == "train_end":
        return "finishing"
    if kind == "step":
        if phase == "starting":
            return "running" if control else "waiting for the fault"
        if phase == "recovering":
            return "finishing"
    return phase


def format_duration(seconds: float) -> str:
    """``42s``, ``2m10s``, ``1h05m``: an ETA's resolution."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


#: The ``fault`` of a control run in a plan.
CONTROL = "control"


@dataclass(frozen=True)
class PlannedRun:
    """One run of a suite as planned, in the order ``chaosbench run`` runs them: its 1-based ``index``, ``label``
    (``framework/fault #repeat``, as the runner names it to the progress), ``framework`` entry, ``fault`` schedule
    (``control`` for a control run), ``bound_s``, its wall bound (its deadline plus set-up and teardown), and
    ``floor_s``: the seconds its faults cost at least beyond a control's wall, from the timeouts in force (the
    detection outlook's resume floor, else its expected detection; 0 when not modelled), and ``deadline_s``, the
    run's deadline (None: not known)."""

    index: int
    label: str
    framework: str
    fault: str
    bound_s: float
    floor_s: float = 0.0
    deadline_s: float | None = None


class RunWallModel:
    """How long runs of a suite take, from the walls of its ``finished`` runs (each with its plan entry); built
    once per finished run, asked for every run left (:meth:`estimate_s`).

    A run's estimate is the median wall of its own cell (same framework and fault) when one of them finished;
    else its framework's level plus its fault's extra, and at least the level plus the run's ``floor_s``: a
    fault's extra is the median, over the frameworks that ran it and their control, of the seconds the cell's
    median wall took beyond the control's (a control: 0); a framework's level is its control's median wall, else
    the median of its runs' walls each less its fault's extra, else (a framework not begun) the median level of
    the others. A fault adds its cost (the detection's timeouts, a restart, the steps trained again) to a
    framework's own wall rather than multiplying it: on the compare suite of 2026-12-07 a factor (the cell over
    its control) took Ray Train's 60 s start-up times the others' 4-7x and put its fault runs at their 180 s bound
    where they took 49-89 s (the ETA's largest error from 20 % of the suite on: 57 % with factors, 21 % with
    extras; ``tests/unit/test_eta_replay.py``). A
    fault no framework ran yet stands at the median wall of the framework's finished runs, else of the fault's
    under the other frameworks, else at the run's bound scaled by how much of their bounds the finished runs
    took (each also at least the level plus the floor). No estimate is above the run's bound; one whose floor
    reaches its deadline (a lost node that a fixed-size rendezvous waits for) takes its deadline plus what the
    finished runs that reached theirs took beyond it (their median; none yet: 0), and such cells set no extra
    and no level."""

    def __init__(self, finished: Sequence[tuple[PlannedRun, float]]) -> None:
        self.finished = list(finished)
        cells: dict[tuple[str, str], list[float]] = {}
        for r, wall_s in self.finished:
            cells.setdefault((r.framework, r.fault), []).append(wall_s)
        self.cells = {key: statistics.median(walls) for key, walls in cells.items()}
        self.controls = {fw: m for (fw, fault), m in self.cells.items() if fault == CONTROL}
        # cells whose timeouts made them wait out their deadline: their walls say nothing of what the fault costs
        # a framework that recovers from it, so they set no extra and no level
        self._waited = {
            (r.framework, r.fault)
            for r, _ in self.finished
            if r.deadline_s is not None and r.floor_s >= r.deadline_s
        }
        faults = {fault for _, fault in self.cells}
        self.extras = {f: x for f in faults if (x := self._extra(f)) is not None}
        frameworks = {fw for fw, _ in self.cells}
        self.levels = {fw: x for fw in frameworks if (x := self._level(fw)) is not None}
        self.median_level = statistics.median(self.levels.values()) if self.levels else None
        bounds_s = sum(r.bound_s for r, _ in self.finished)
        walls_s = sum(s for _, s in self.finished)
        self._per_bound = walls_s / bounds_s if bounds_s > 0 else None
        self._mean_s = walls_s / len(self.finished) if self.finished else None
        past = [s - r.deadline_s for r, s in self.finished if r.deadline_s is not None and s >= r.deadline_s]
        self._past_deadline_s = statistics.median(past) if past else 0.0
        self._by_cell: dict[tuple[str, str, float, float, float | None], float | None] = {}

    def _extra(self, fault: str) -> float | None:
        if fault == CONTROL:
            return 0.0
        extras = [
            m - self.controls[fw]
            for (fw, f), m in self.cells.items()
            if f == fault and fw in self.controls and (fw, f) not in self._waited
        ]
        return statistics.median(extras) if extras else None

    def _level(self, fw: str) -> float | None:
        if fw in self.controls:
            return self.controls[fw]
        less = [
            m - x
            for (f_fw, fault), m in self.cells.items()
            if f_fw == fw and (x := self.extras.get(fault)) is not None and (f_fw, fault) not in self._waited
        ]
        return statistics.median(less) if less else None

    def estimate_s(self, run: PlannedRun) -> float | None:
        """Seconds ``run`` will take (see the class); None when no run finished."""
        key = (run.framework, run.fault, run.bound_s, run.floor_s, run.deadline_s)
        if key not in self._by_cell:
            self._by_cell[key] = self._estimate_s(run)
        return self._by_cell[key]

    def _estimate_s(self, run: PlannedRun) -> float | None:
        if not self.finished:
            return None
        if (own := self.cells.get((run.framework, run.fault))) is not None:
            return own
        if run.deadline_s is not None and run.floor_s >= run.deadline_s:
            return min(run.deadline_s + self._past_deadline_s, run.bound_s)
        guess = self._guess_s(run)
        return min(guess, run.bound_s) if run.bound_s > 0 else guess

    def _guess_s(self, run: PlannedRun) -> float:
        level = self.levels.get(run.framework, self.median_level)
        floor_s = 0.0 if level is None else level + run.floor_s
        extra = self.extras.get(run.fault)
        if extra is not None and level is not None:
            return max(level + extra, floor_s)
        for same in ((run.framework, None), (None, run.fault)):
            walls = [
                s for r, s in self.finished if same[0] in (None, r.framework) and same[1] in (None, r.fault)
            ]
            if walls:
                return max(statistics.median(walls), floor_s)
        scaled = run.bound_s * self._per_bound if self._per_bound is not None else self._mean_s
        return max(scaled or 0.0, floor_s)


def estimate_run_s(run: PlannedRun, finished: Sequence[tuple[PlannedRun, float]]) -> float | None:
    """Seconds ``run`` will take, from the walls of the ``finished`` runs (:class:`RunWallModel`); None when
    nothing finished yet."""
    return RunWallModel(finished).estimate_s(run)


class _ReplayClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_eta(
    runs: Sequence[tuple[PlannedRun, float]], with_plan: bool = True
) -> list[tuple[float | None, float]]:
    """The ETA a suite's progress showed right after each of ``runs`` (in the order they ran, each with its wall:
    to the next run's start) finished, replayed on a fake clock, beside the time then in fact left; with
    ``with_plan`` False the estimate without a plan (the mean of the finished runs). The deadlines given to the
    progress are each run's bound less its set-up allowance (a replay shows no phase, so they matter not).

    Returns:
        Per finished run, in order: (the ETA in seconds, None when there was none; the seconds left).
    """
    clock = _ReplayClock()
    plan = [p for p, _ in runs] if with_plan else None
    progress = SuiteProgress(
        "replay",
        len(runs),
        sum(p.bound_s for p, _ in runs),
        stream=io.StringIO(),
        live=False,
        clock=clock,
        header=False,
        plan=plan,
    )
    total_s = sum(w for _, w in runs)
    out: list[tuple[float | None, float]] = []
    done_s = 0.0
    for p, wall_s in runs:
        progress.run_started(p.index, p.label, p.deadline_s or p.bound_s, p.fault == CONTROL)
        clock.now += wall_s
        done_s += wall_s
        progress.run_finished(p.label, "", wall_s)
        out.append((progress.eta_s()[0], total_s - done_s))
    return out


@dataclass
class _Run:
    index: int
    label: str
    deadline_s: float
    control: bool
    started: float  # the clock's seconds
    phase: str = "starting"
    step: int | None = None


class SuiteProgress:
    """Progress of one suite's runs, for a user watching.

    ``live`` None draws a rich live bar when ``stream.isatty()`` (and ``TERM`` is not ``dumb``), else writes
    plain lines. ``bound_s``: the suite's upper bound of wall time from its deadlines, shown once at start and
    used as the ETA (labelled a bound) until a run has finished. ``plan``: every run of the suite in order
    (:class:`PlannedRun`): the ETA then sums each run's own estimate (:class:`RunWallModel`); without it, the
    mean of the finished runs' walls stands for every run left. ``clock``: seconds, for tests. Every method is safe to call from any thread;
    :meth:`on_event` never raises, and a stream that cannot be written to loses the line, never fails the suite.
    """

    def __init__(
        self,
        suite: str,
        total_runs: int,
        bound_s: float | None,
        stream: TextIO = sys.stderr,
        live: bool | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        header: bool = True,
        plan: Sequence[PlannedRun] | None = None,
    ) -> None:
        self.suite = suite
        self.total_runs = total_runs
        self.bound_s = bound_s
        #: Runs at once (``chaosbench run --jobs``): the waiting runs share that many slots in the ETA.
        self.concurrency = 1
        self.stream = stream
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._walls_s: list[float] = []  # finished runs only: a skipped run took no time here
        self._plan = None if plan is None else {p.label: p for p in plan}
        self._finished: list[tuple[PlannedRun, float]] = []  # with a plan: each finished run and its wall
        self._model: RunWallModel | None = None  # of the finished runs, until the next one finishes
        self._gone: set[str] = set()  # labels of the runs finished or skipped
        self._running: dict[str, float] = {}  # label -> when it started (several at once with --jobs)
        self._done = 0
        self._last_index = 0
        self._current: _Run | None = None
        self._indices: dict[str, int] = {}  # label -> index of the runs started (several at once with --jobs)
        self._closed = False
        self._live: Live | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if _isatty(stream) if live is None else live:
            self._start_live()
        if header:  # the CLI states it itself, before the dry run's exit
            bound = f"; at most {format_duration(bound_s)} by the deadlines" if bound_s is not None else ""
            self._print(f"suite '{suite}': {total_runs} runs{bound}")

    # ------------------------------------------------------------------ the runner's calls
    def skipped(self, label: str, reason: str) -> None:
        """A run finished earlier (a resumed suite): counts as done, not in the ETA's mean."""
        with self._lock:
            self._done += 1
            self._last_index += 1
            self._gone.add(label)
            line = f"{self._prefix(self._last_index)} {label} skipped: {reason}"
        self._print(line)

    def run_started(self, index: int, label: str, deadline_s: float, control: bool) -> None:
        """Run ``index`` (1-based) of the suite starts; its phase is ``starting``."""
        with self._lock:
            self._last_index = index
            self._current = _Run(index, label, deadline_s, control, self._clock())
            self._indices[label] = index
            self._running[label] = self._current.started
            line = f"{self._prefix(index)} {label} ..."
        if self._live is None:
            self._print(line)

    def on_event(self, event: Event) -> None:
        """One timeline event of the current run (from the follower's thread): updates its phase and step; a
        phase change is a line in plain mode. Cheap, and never raises (a display must not break a run)."""
        try:
            with self._lock:
                run = self._current
                if run is None:  # a late event of a finished run
                    return
                step = event.get("step") if event.kind == "step" else None
                if isinstance(step, int) and (run.step is None or step > run.step):
                    run.step = step
                phase = next_phase(run.phase, event, run.control)
                if phase == run.phase:
                    return
                run.phase = phase
                if self._live is None:
                    step_seen = f", step {run.step}" if run.step is not None else ""
                    at = f"t+{self._clock() - run.started:.1f} s{step_seen}"
                    self._write(f"{self._prefix(run.index)}   phase: {phase} ({at})")
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    def run_finished(self, label: str, summary: str, elapsed_s: float) -> None:
        """The current run ended after ``elapsed_s`` (measured by the caller): its summary line, with the ETA."""
        with self._lock:
            index = self._indices.pop(
                label, self._current.index if self._current is not None else self._last_index
            )
            self._current = None
            self._done += 1
            self._walls_s.append(elapsed_s)
            self._running.pop(label, None)
            self._gone.add(label)
            if self._plan is not None:
                planned = self._plan.get(label) or PlannedRun(index, label, "", "", 0.0)
                self._finished.append((planned, elapsed_s))
                self._model = None
            eta = self._eta_text() if self._done < self.total_runs else ""
            line = f"{self._prefix(index)} {label} {summary} ({elapsed_s:.1f} s{'; ' + eta if eta else ''})"
        self._print(line)

    def message(self, text: str) -> None:
        """Any other line (above the live bar)."""
        self._print(text)

    def close(self) -> None:
        """Stops the live bar (erased: the printed lines stay); safe to call twice."""
        with self._lock:
            live, self._closed = (None if self._closed else self._live), True
        if live is not None:
            try:
                live.stop()
            except Exception:  # noqa: BLE001 - the terminal is gone; nothing left to clean
                pass

    def __enter__(self) -> SuiteProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ figures
    def eta_s(self) -> tuple[float | None, bool]:
        """Seconds until the suite ends and whether that is the deadline bound. With a plan: the estimates of
        the runs not started (:class:`RunWallModel`: their cell's median wall, else their framework's level
        plus their fault's extra, at least the level plus their floor), shared among ``concurrency`` slots, plus
        each running run's estimate less its time so far (never negative). Without: remaining runs x the mean wall of finished runs,
        plus the current run's remaining share of that mean. Before any run finished: the bound less the time
        elapsed ((None, False) without a bound)."""
        with self._lock:
            return self._eta()

    def _eta(self) -> tuple[float | None, bool]:
        now = self._clock()
        if not self._walls_s:
            if self.bound_s is None:
                return None, False
            return max(self.bound_s - (now - self._started), 0.0), True
        if self._plan is not None:
            return self._planned_eta(now), False
        mean_s = sum(self._walls_s) / len(self._walls_s)
        run = self._current
        waiting = self.total_runs - self._done - (1 if run is not None else 0)
        current_s = max(mean_s - (now - run.started), 0.0) if run is not None else 0.0
        return max(waiting, 0) * mean_s / self.concurrency + current_s, False

    def _planned_eta(self, now: float) -> float:
        assert self._plan is not None
        if self._model is None:
            self._model = RunWallModel(self._finished)
        waiting_s = running_s = 0.0
        for label, planned in self._plan.items():
            if label in self._gone:
                continue
            estimate_s = self._model.estimate_s(planned) or 0.0
            if label in self._running:
                running_s += max(estimate_s - (now - self._running[label]), 0.0)
            else:
                waiting_s += estimate_s
        return waiting_s / self.concurrency + running_s

    def _eta_text(self) -> str:
        eta_s, is_bound = self._eta()
        if eta_s is None:
            return "ETA unknown"
        if is_bound:
            return f"ETA at most {format_duration(eta_s)} (deadline bound)"
        unseen = self._frameworks_not_begun()
        if unseen:
            return f"ETA {format_duration(eta_s)} (guessed for {unseen} framework{'s' if unseen > 1 else ''} not begun)"
        return f"ETA {format_duration(eta_s)}"

    def _frameworks_not_begun(self) -> int:
        """With a plan: how many frameworks of the runs left have no level of their own yet (no finished run to
        take it from): their runs are taken at the other frameworks' median level, a guess."""
        if self._plan is None or self._model is None:
            return 0
        left = {p.framework for label, p in self._plan.items() if label not in self._gone}
        return len(left - set(self._model.levels))

    def _prefix(self, index: int) -> str:
        return f"[{index:>{len(str(self.total_runs))}}/{self.total_runs}]"

    # ------------------------------------------------------------------ output
    def _print(self, line: str) -> None:
        if self._live is not None:
            try:  # never under self._lock: rich's refresh thread holds its lock while it asks for _render
                self._live.console.print(line, markup=False, highlight=False)
                self._refresh_bar()
            except Exception:  # noqa: BLE001 - see the class docstring
                pass
            return
        with self._lock:
            self._write(line)

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: the line is lost, the suite goes on
            pass

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, force_terminal=True)
        self._bar = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}", markup=False),
            console=console,
            get_time=self._clock,
        )
        self._task = self._bar.add_task(self.suite, total=self.total_runs, eta="")
        # other writers to stdout and stderr go above the bar while it is live, not through it
        self._live = Live(console=console, transient=True, refresh_per_second=4, get_renderable=self._render)
        self._live.start()

    def _refresh_bar(self) -> None:
        if self._bar is not None and self._task is not None:
            with self._lock:
                done = self._done
                eta = self._eta_text() if done < self.total_runs else ""
            self._bar.update(self._task, completed=done, eta=eta)

    def _render(self) -> RenderableType:
        """The live display (from rich's refresh thread): the bar, then the current run's line."""
        from rich.console import Group
        from rich.text import Text

        self._refresh_bar()
        assert self._bar is not None
        with self._lock:
            run, now = self._current, self._clock()
            line = (
                ""
                if run is None
                else (
                    f"{run.label}: {run.phase}, step {run.step if run.step is not None else '-'}, "
                    f"{now - run.started:.0f} s / {run.deadline_s:.0f} s"
                )
            )
        return Group(self._bar, Text(line, no_wrap=True, overflow="ellipsis"))


def _isatty(stream: TextIO) -> bool:
    if os.environ.get("TERM") == "dumb":  # a terminal that cannot move the cursor (emacs' shell): plain lines
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
