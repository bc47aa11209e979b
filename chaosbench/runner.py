"""Runs a suite: every scenario in its own run directory (layout: :mod:`chaosbench.rundir`), one timeline each,
guaranteed teardown. Each run's metrics are computed when it ends and its ``result.json`` written last, each
file whole (written aside, then renamed), so a harness killed at any moment keeps every finished run, and
``--resume`` (:meth:`Runner.run`) skips them and runs the rest, the unfinished one again from scratch. The
suite's table is written once, at the end (or by ``chaosbench report``), from the runs' own files.

What a suite will do, worked out before it runs, is :mod:`chaosbench.planning`; one run's life cycle (start,
supervision, teardown) :mod:`chaosbench.run_lifecycle`; what a run leaves (its record, its checkpoints kept or
not, its ``result.json`` read back) :mod:`chaosbench.run_results`. Their public names are importable from here.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.analysis.sequential import REPEATS_FILE, Settlement, StoppingRule
from chaosbench.errors import ResultsError, Unsupported
from chaosbench.frameworks.base import JobContext, LaunchPlan
from chaosbench.planning import (
    MAX_NODES,
    MAX_RANKS,
    MAX_RUNS,
    MAX_STEPS,
    MAX_WALL_S,
    RUN_OVERHEAD_S,
    arithmetic_problems,
    describe_outlook,
    detection_outlook,
    dry_run_plans,
    job_context,
    missing_engines,
    suite_limits,
    suite_outlook,
    suite_plan,
)
from chaosbench.post_run import DEFAULT_HOOKS, PostRunHook
from chaosbench.registry import RUNTIMES
from chaosbench.run_lifecycle import LiveRuns, RunLifecycle
from chaosbench.run_results import CleanupFailure, RunRecord, SuiteHalt, finished_record
from chaosbench.rundir import RunDir, SuiteDir, write_atomic
from chaosbench.runtimes.base import Runtime
from chaosbench.specs import Scenario, Suite, UntilDecided
from chaosbench.timeline import Event

#: Names that live in the modules the runner is made of, importable from here as before.
__all__ = [
    "MAX_NODES",
    "MAX_RANKS",
    "MAX_RUNS",
    "MAX_STEPS",
    "MAX_WALL_S",
    "RUN_OVERHEAD_S",
    "SUITE_MARKER",
    "SWITCH_INTERVAL_S",
    "CleanupFailure",
    "Progress",
    "RunRecord",
    "Runner",
    "SuiteHalt",
    "arithmetic_problems",
    "describe_outlook",
    "detection_outlook",
    "missing_engines",
    "suite_limits",
    "suite_plan",
    "summarize",
]

SUITE_MARKER = SuiteDir.MARKER
#: The harness's GIL switch interval while a suite runs (at most; Python's default is 5 ms): see Runner.run.
SWITCH_INTERVAL_S = 0.001


class Progress(Protocol):
    """What the runner tells about its progress (:class:`chaosbench.progress.SuiteProgress` shows it).
    ``concurrency``: how many runs go at once (set by the runner before a concurrent suite starts)."""

    concurrency: int

    def skipped(self, label: str, reason: str) -> None: ...
    def run_started(self, index: int, label: str, deadline_s: float, control: bool) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def run_finished(self, label: str, summary: str, elapsed_s: float) -> None: ...
    def message(self, text: str) -> None: ...


class _Lines:
    """Progress as plain lines to a callable (or nowhere)."""

    def __init__(self, out: Callable[[str], None] | None = None) -> None:
        self.out = out or (lambda s: None)
        self.concurrency = 1

    def skipped(self, label: str, reason: str) -> None:
        self.out(f"{label}: {reason}")

    def run_started(self, index: int, label: str, deadline_s: float, control: bool) -> None:
        self.out(f"[{index}] {label} ...")

    def on_event(self, event: Event) -> None:
        pass

    def run_finished(self, label: str, summary: str, elapsed_s: float) -> None:
        self.out(f"{label} {summary} ({elapsed_s:.1f} s)")

    def message(self, text: str) -> None:
        self.out(text)


@dataclass(frozen=True)
class _Cell:
    """A framework x fault schedule of the suite and its repeats: ``bound`` runs at most, from suite index
    ``first_index``; ``design`` when repeated until decided; ``has_slos``: its runs carry SLOs."""

    framework: str
    faults: list[str]
    bound: int
    first_index: int
    design: UntilDecided | None
    has_slos: bool

    @property
    def id(self) -> str:
        return f"{self.framework}/{'+'.join(self.faults) or 'control'}"


class Runner:
    """Runs the scenarios of a suite: every framework's control first, then the fault runs in the suite's order
    (a run's index stays its place in that order). Every fault run is measured against its framework's control,
    a control that cannot run shows a broken framework or environment in the suite's first minutes, and the
    progress's ETA knows each framework's cost from the start (a framework several times slower than the others,
    run last, would otherwise be guessed at their level until then).

    ``request_stop`` (from a signal handler) ends the current run promptly, with teardown and reverts,
    and skips the rest; finished runs and their results are kept.
    """

    def __init__(
        self,
        suite: Suite,
        out_dir: str | Path,
        progress: Progress | Callable[[str], None] | None = None,
        stopping: StoppingRule | None = None,
        post_run: Sequence[PostRunHook] = DEFAULT_HOOKS,
    ) -> None:
        """``stopping``: when a scenario repeated until decided stops (:mod:`chaosbench.analysis.sequential`;
        default: without a baseline, on its SLOs alone). ``post_run``: the hooks called on each finished run,
        in order (:mod:`chaosbench.post_run`; default: checkpoints kept or deleted, then the timeline plot)."""
        self.suite = suite
        self.post_run = tuple(post_run)
        self.stopping = stopping or StoppingRule(None)
        #: Scenario id -> why it stopped, for each scenario repeated until decided that has.
        self.settlements: dict[str, Settlement] = {}
        self.out_dir = Path(out_dir).resolve()
        self.suite_dir = self.out_dir / suite.name
        self.progress: Progress = (
            progress if progress is not None and not callable(progress) else _Lines(progress)
        )
        self.stop_requested = threading.Event()
        self._live = LiveRuns()  # the runs going on now (several with --jobs)
        self._lock = threading.RLock()  # halted (set from the runs' threads with --jobs)
        self._finish_lock = threading.Lock()  # records, and one run's metrics at a time
        self.records: list[RunRecord] = []
        #: Set when a run's cleanup failed and left, or may have left, something running that the next run
        #: could collide with: no run starts after it (see :meth:`run_one`).
        self.halted: SuiteHalt | None = None

    def request_stop(self) -> None:
        self.stop_requested.set()
        self._live.interrupt_all()

    # ------------------------------------------------------------------ planning
    def plans(self) -> list[tuple[Scenario, LaunchPlan | str]]:
        """The launch plan of every scenario, without starting anything (``--dry-run``; see
        :func:`~chaosbench.planning.dry_run_plans`)."""
        return dry_run_plans(self.suite, self.suite_dir)

    def outlook(self) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
        """Detection outlook of every distinct framework x fault schedule, and each framework's timeout
        problems; starts nothing (see :func:`~chaosbench.planning.suite_outlook`)."""
        return suite_outlook(self.suite, self.suite_dir)

    def _run_dir(self, sc: Scenario) -> Path:
        return RunDir.of(self.suite_dir, sc).path

    def _job(self, sc: Scenario, run_dir: Path, runtime: Runtime, run_id: str) -> JobContext:
        """The job context of a run of ``sc`` (:func:`~chaosbench.planning.job_context`)."""
        return job_context(sc, run_dir, runtime, run_id)

    # ------------------------------------------------------------------ running
    def prepare(self, resume: bool = False) -> None:
        """Fresh suite directory: earlier results of this suite (and only of a chaosbench suite) go. With
        ``resume`` an earlier one of the same suite definition is kept (after cleaning up what a crashed harness
        left); a different definition is refused."""
        marker = self.suite_dir / SUITE_MARKER
        if self.suite_dir.exists() and not marker.exists():
            raise ResultsError(
                str(self.suite_dir),
                "exists and is not a chaosbench results directory; choose another --out",
                message=f"{self.suite_dir} exists and is not a chaosbench results directory; choose another --out",
            )
        definition = self.suite.model_dump(mode="json")
        from chaosbench.cleanup import cleanup

        if resume and marker.exists():
            earlier = SuiteDir(self.suite_dir).definition()
            if earlier != definition:
                changed = sorted(
                    k
                    for k in set(earlier or {}) | set(definition)
                    if (earlier or {}).get(k) != definition.get(k)
                )
                raise ResultsError(
                    str(self.suite_dir),
                    f"cannot resume: suite '{self.suite.name}' has changed since those runs "
                    f"(in {', '.join(changed) or 'its definition'}); run without --resume to start over",
                )
            # what the killed harness left: processes, mounts, containers
            for line in cleanup(self.suite_dir):
                self.progress.message(f"cleanup: {line}")
            for tmp in self.suite_dir.glob(".*.tmp"):  # a table or report it was writing when killed
                tmp.unlink(missing_ok=True)
            return
        if self.suite_dir.exists():
            # a crashed earlier run may have left processes or a live FUSE mount there
            cleanup(self.suite_dir)
            shutil.rmtree(self.suite_dir)
        self.suite_dir.mkdir(parents=True)
        write_atomic(
            marker,
            json.dumps(
                {"suite": self.suite.name, "source": self.suite.source, "definition": definition}, indent=2
            ),
        )

    def finish(self, rec: RunRecord, elapsed_s: float | None = None) -> RunMetrics:
        """A run has ended: its metrics, computed once (against its framework's control, which runs first), go
        into ``metrics.json``, the post-run hooks do their work (by default its checkpoints kept or not, then
        its timeline plot drawn) and last its ``result.json``, with what the hooks added, is written: from then
        on the run counts as finished (``--resume`` skips it). ``chaosbench report`` recomputes the metrics
        from the timelines."""
        from chaosbench.analysis.results import run_metrics

        control = self._control_of(rec.scenario)
        rd = RunDir(rec.run_dir)
        rec.metrics = run_metrics(rd, RunDir(control) if control is not None else None)
        result: dict[str, Any] = {
            "status": rec.result.status,
            "reason": rec.result.reason,
            "leftover_pids": rec.leftovers,
            "outcome": rec.metrics.outcome,
            "elapsed_s": elapsed_s,
        }
        for hook in self.post_run:
            result.update(hook(rd, rec.metrics, self.suite))
        result["cleanup_failures"] = [dataclasses.asdict(f) for f in rec.cleanup_failures]
        write_atomic(rd.result, json.dumps(result, indent=2, default=str))
        self.records.append(rec)
        return rec.metrics

    def _control_of(self, sc: Scenario) -> Path | None:
        return next(
            (
                r.run_dir
                for r in self.records
                if r.scenario.control and r.scenario.framework_label == sc.framework_label
            ),
            None,
        )

    def _finished(self, sc: Scenario) -> RunRecord | None:
        """The record of a run an earlier harness finished (``result.json``), or None: run it (again)."""
        return finished_record(self.suite_dir, sc)

    def slots(self, jobs: int, timings_may_interfere: bool = False) -> list[dict[str, Any]]:
        """Runtime options of each of ``jobs`` concurrent slots (:meth:`Runtime.concurrent_slots`); raises
        :class:`~chaosbench.errors.Unsupported` when the runtime cannot keep concurrent runs apart, unless
        ``timings_may_interfere`` and it only shares CPUs (the local runtime)."""
        cls = RUNTIMES.get(self.suite.defaults.runtime)
        nodes = max(self.suite.workload_for(fw).nodes for fw in self.suite.matrix.all_frameworks())
        try:
            return list(cls.concurrent_slots(dict(self.suite.defaults.runtime_options), jobs, nodes))
        except Unsupported:
            if timings_may_interfere and cls.ranks_on_harness_host:
                return [{} for _ in range(jobs)]
            raise

    def run(
        self, resume: bool = False, jobs: int = 1, timings_may_interfere: bool = False
    ) -> list[RunRecord]:
        """Every run of the suite, in order; with ``resume`` the runs an earlier harness finished are kept (same
        seeds and plans) and the others run, an unfinished one from scratch. ``jobs`` > 1: that many runs at once,
        each in a slot of its own (:meth:`slots`; the controls first, then the rest). Ends by writing the
        suite's table."""
        # refused before anything is touched
        slots = self.slots(jobs, timings_may_interfere) if jobs > 1 else None
        # A thread woken by a process's exit or output stamps it once it holds the GIL: with the default 5 ms
        # switch interval a busy thread delays it by up to that (p99 of the stamp error 20-28 ms on a loaded
        # 2-core machine, 8 ms with 1 ms: benchmarks/detect_calibration.py).
        switch_s = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_s, SWITCH_INTERVAL_S))
        try:
            return self._run(resume, slots)
        finally:
            sys.setswitchinterval(switch_s)

    def _run(self, resume: bool, slots: list[dict[str, Any]] | None) -> list[RunRecord]:
        from chaosbench.analysis.results import write_table

        self.prepare(resume)
        total = self.suite.run_count()
        cells = self._cells()
        if slots is None:
            left = [total]  # runs not started yet (the indices no longer say it: the controls run first)
            # stable: the controls, then the fault cells
            for cell in sorted(cells, key=lambda c: bool(c.faults)):
                if not self._run_cell(cell, resume, left):
                    break
        else:
            self._run_cells_concurrently(cells, resume, slots)
        self.records.sort(key=lambda r: r.index)
        self._write_settlements()
        metrics = [r.metrics for r in self.records if r.metrics is not None]
        if metrics:
            write_table(self.suite_dir, metrics)
        return self.records

    def _cells(self) -> list[_Cell]:
        """Every cell of the suite in run order, with the 1-based index of its first run (a cell repeated until
        decided takes the places of its ``max`` runs: the indices stay those of the suite's order)."""
        designs = self.suite.until_decided()
        out, first = [], 1
        for fw, names, bound in self.suite.cells():
            sc = self.suite.scenario(fw, names, 0)
            out.append(_Cell(fw, names, bound, first, designs.get(sc.id), bool(sc.slos) and not sc.control))
            first += bound
        return out

    def _take(self, cell: _Cell, rep: int, resume: bool) -> tuple[int, Scenario] | None:
        """Repeat ``rep`` of ``cell``: None when an earlier harness finished it (``resume``: its record kept),
        else its index and scenario, to run."""
        sc = self.suite.scenario(cell.framework, cell.faults, rep)
        i = cell.first_index + rep
        if resume and (done := self._finished(sc)) is not None:
            done.index = i
            self.records.append(done)
            self.progress.skipped(
                f"{sc.id} #{sc.repeat}", f"finished earlier ({done.metrics.outcome if done.metrics else '?'})"
            )
            return None
        return i, sc

    def _settled(self, cell: _Cell) -> bool:
        """Whether a cell repeated until decided stops now (decided, or ``max`` reached); says so once when it
        does. Always False for a cell of fixed repeats."""
        if cell.design is None or cell.id in self.settlements:
            return cell.id in self.settlements
        rows = [
            r.metrics.to_dict() for r in self.records if r.scenario.id == cell.id and r.metrics is not None
        ]
        done = sum(1 for r in self.records if r.scenario.id == cell.id)
        if done < cell.design.min_repeats:
            return False
        settlement = self.stopping.settle(cell.id, cell.design, rows, cell.has_slos)
        if settlement.stops or done >= cell.design.max:
            self.settlements[cell.id] = settlement
            self.progress.message(f"repeats: {settlement.describe()}")
            return True
        return False

    def _run_cell(self, cell: _Cell, resume: bool, left: list[int]) -> bool:
        """Every repeat of ``cell`` in turn (until decided, for such a cell); False when a stop was requested.
        ``left[0]``: the suite's runs not started yet, counted down."""
        for rep in range(cell.bound):
            if self._settled(cell):
                left[0] -= cell.bound - rep  # the repeats it no longer needs
                return True
            if (todo := self._take(cell, rep, resume)) is None:
                left[0] -= 1
                continue
            i, sc = todo
            if self.stop_requested.is_set():
                self.progress.message(f"stopped: at most {left[0]} runs not started")
                return False
            if self.halted is not None:
                self.progress.message(f"{self.halted.describe()}; at most {left[0]} runs not started")
                return False
            left[0] -= 1
            self._run_in_slot(i, sc, {}, follow=True)
        self._settled(cell)
        return True

    def _run_cells_concurrently(self, cells: list[_Cell], resume: bool, slots: list[dict[str, Any]]) -> None:
        """With ``--jobs``: every run of the fixed cells and the first ``min`` repeats of the cells repeated until
        decided at once (controls first), then rounds of one more repeat of each cell not yet decided."""
        pending = []
        for cell in cells:
            first = cell.bound if cell.design is None else cell.design.min_repeats
            pending += [t for rep in range(first) if (t := self._take(cell, rep, resume)) is not None]
        next_rep = {c.id: c.design.min_repeats for c in cells if c.design is not None}
        while True:
            if pending:
                self._run_concurrently(pending, slots)
            if self.stop_requested.is_set() or self.halted is not None:
                return
            pending = []
            for cell in cells:
                while cell.id in next_rep and not self._settled(cell) and next_rep[cell.id] < cell.bound:
                    rep = next_rep[cell.id]
                    next_rep[cell.id] += 1
                    if (todo := self._take(cell, rep, resume)) is not None:
                        pending.append(todo)
                        break
            if not pending:
                break
        for cell in cells:
            self._settled(cell)

    def _write_settlements(self) -> None:
        """``repeats.json`` in the suite directory: per scenario repeated until decided, how many repeats ran,
        its looks and why it stopped (the gate multiplies its p-values by its looks)."""
        if self.settlements:
            write_atomic(
                self.suite_dir / REPEATS_FILE,
                json.dumps({key: s.to_dict() for key, s in self.settlements.items()}, indent=2),
            )

    def _run_in_slot(self, index: int, sc: Scenario, slot: dict[str, Any], follow: bool) -> None:
        label = f"{sc.id} #{sc.repeat}"
        if slot:
            sc = dataclasses.replace(sc, runtime_options={**sc.runtime_options, **slot})
        self.progress.run_started(index, label, sc.deadline_s, sc.control)
        t = time.monotonic()
        rec = self.run_one(sc, follow=follow)
        rec.index = index
        with self._finish_lock:
            self.finish(rec, time.monotonic() - t)
        self.progress.run_finished(label, summarize(rec), time.monotonic() - t)

    def _run_concurrently(self, pending: list[tuple[int, Scenario]], slots: list[dict[str, Any]]) -> None:
        """``pending`` runs, as many at once as there are ``slots``, each run in a free slot; the controls first
        (every fault run is measured against its framework's)."""
        from concurrent.futures import ThreadPoolExecutor

        free: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        for slot in slots:
            free.put(slot)
        self.progress.concurrency = len(slots)

        def one(index: int, sc: Scenario) -> None:
            if self.stop_requested.is_set() or self.halted is not None:
                return
            slot = free.get()
            try:
                if not self.stop_requested.is_set() and self.halted is None:
                    self._run_in_slot(index, sc, slot, follow=False)  # several runs' phases would mix
            finally:
                free.put(slot)

        for batch in ([p for p in pending if p[1].control], [p for p in pending if not p[1].control]):
            with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="run") as pool:
                for future in [pool.submit(one, i, sc) for i, sc in batch]:
                    future.result()
        started = {r.index for r in self.records}
        if self.stop_requested.is_set() and (left := [i for i, _ in pending if i not in started]):
            self.progress.message(f"stopped: {len(left)} runs not started")
        elif self.halted is not None and (left := [i for i, _ in pending if i not in started]):
            self.progress.message(f"{self.halted.describe()}; {len(left)} runs not started")

    def run_one(self, sc: Scenario, follow: bool = True) -> RunRecord:
        """One run, from its fresh directory to its teardown (``follow``: its events go to the progress); see
        :class:`~chaosbench.run_lifecycle.RunLifecycle`. A cleanup that fails makes this run an ``error`` whose
        reason names it, and the suite goes on, unless the runtime then still lists processes or objects of the
        run, or cannot list them: the next run could collide with them (ports, containers, GPUs, nodes), so the
        suite stops after this one (:attr:`halted`)."""
        run_id = f"{self.suite.name}-{sc.dirname}-{sc.repeat}-{uuid.uuid4().hex[:8]}"
        on_event = self.progress.on_event if follow else None
        life = RunLifecycle(sc, self._run_dir(sc), run_id, self._live, self.stop_requested, on_event)
        rec, halt = life.run()
        if halt is not None:
            with self._lock:
                self.halted = self.halted or halt
        return rec


def _fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.2f} {unit}" if unit else f"{v:.3g}"
    return f"{v}"


def summarize(rec: RunRecord) -> str:
    m = rec.metrics
    if m is None:
        return f"{rec.result.status}: {rec.result.reason}"
    parts = [m.outcome or rec.result.status]
    if m.serving:
        parts.append(f"{_fmt(m.failed_requests)}/{_fmt(m.requests)} requests failed")
        if not m.control:
            parts += [
                f"detect {_fmt(m.time_to_detect_s)}",
                f"recover {_fmt(m.time_to_recover_s)}",
                f"budget burn {_fmt(m.error_budget_burn, '')}",
            ]
    elif not m.control:
        parts += [
            f"detect {_fmt(m.time_to_detect_s)}",
            f"resume {_fmt(m.time_to_resume_s)}",
            f"lost {_fmt(m.lost_steps)} steps",
        ]
        if m.fidelity:
            parts.append(f"fidelity {m.fidelity}")
    if rec.result.status == "error":
        parts.append(f"error: {rec.result.reason}")
    return "  ".join(parts)
