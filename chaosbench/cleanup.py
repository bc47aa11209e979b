"""``chaosbench cleanup``: remove what crashed harnesses left behind, and only that.

A harness killed outright cannot run its ``finally`` blocks. Everything it started is on record: processes
in its runs' timelines (``proc_start``/``rank_start`` with pid and start time), cgroups named after the run
id, FUSE mounts in ``mounts.json``, containers and networks labelled with the run id. A run whose timeline
has no ``run_end`` is unfinished; cleanup ends its recorded processes (only when pid *and* start time still
match, so a reused pid is never touched), and each runtime and injector removes its own other leftovers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from chaosbench.runtimes import process
from chaosbench.timeline import read_events
from chaosbench.timeline.reader import crashed_run_ids, unfinished_runs


def _recorded_processes(run_dir: Path) -> list[tuple[int, int | None, str]]:
    procs = []
    # leniently: a crashed run's processes are ended even when a line of its timeline is not a valid event
    events = read_events(run_dir / "events.jsonl", correct_clocks=False, strict=False)
    start = next((e for e in events if e.kind == "run_start"), None)
    # On docker a rank reports its pid in the container's pid namespace, not a host pid; the runtime records
    # the host pid of each exec'd process in proc_start.
    in_containers = start is not None and str(start.get("runtime", "")).startswith("docker")
    kinds = ("proc_start",) if in_containers else ("proc_start", "rank_start")
    for e in events:
        if e.kind in kinds and e.get("pid") is not None:
            procs.append((int(e["pid"]), e.get("pid_ticks"), str(e.get("proc") or f"rank{e.get('rank')}")))
    return procs


def cleanup(results_dir: str | Path, dry_run: bool = False) -> list[str]:
    """Clean up after crashed runs below ``results_dir``; returns one line per action. The recorded processes
    are ended here; every registered runtime and injector then removes what it made for those runs (containers,
    networks, Slurm jobs, cgroups, FUSE mounts: :meth:`Runtime.cleanup_crashed`, :meth:`Injector.cleanup_crashed`).
    ``dry_run`` lists the processes it would end and does nothing else."""
    results_dir = Path(results_dir)
    actions: list[str] = []
    for run_dir in unfinished_runs(results_dir):
        for pid, ticks, name in _recorded_processes(run_dir):
            # psutil checks the process's creation time again before it signals: a pid reused since is spared
            proc = process.find(pid, ticks) if ticks is not None else None
            if proc is None:
                continue
            actions.append(f"kill {name} (pid {pid}) of {run_dir}")
            if not dry_run:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    if dry_run:
        return actions
    from chaosbench.registry import INJECTORS, RUNTIMES

    for name in RUNTIMES.names():
        try:
            runtime = RUNTIMES.get(name)
        except ImportError:  # an optional runtime whose client library is not installed made nothing
            continue
        actions.extend(runtime.cleanup_crashed(results_dir))
    run_ids = crashed_run_ids(results_dir)
    for name in INJECTORS.names():
        try:
            injector = INJECTORS.get(name)
        except ImportError:
            continue
        actions.extend(injector.cleanup_crashed(results_dir, run_ids))
    return actions
