"""``chaosbench cleanup``: remove what crashed harnesses left behind, and only that.

A harness killed outright cannot run its ``finally`` blocks. Everything it started is on record: processes
in its runs' timelines (``proc_start``/``rank_start`` with pid and start time), cgroups named after the run
id, FUSE mounts in ``mounts.json``, containers and networks labelled with the run id. A run whose timeline
has no ``run_end`` is unfinished; cleanup ends its recorded processes (only when pid *and* start time still
match, so a reused pid is never touched) and removes its other leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from chaosbench import procutil
from chaosbench.timeline import read_events


def _stale_mounts(results_dir: Path) -> list[str]:
    from chaosbench.injectors.stallfs import cleanup_stale_mounts

    return [f"unmount {a.get('mountpoint', a)}" for a in cleanup_stale_mounts(results_dir)]


def _stale_slurm_jobs(results_dir: Path) -> list[str]:
    from chaosbench.runtimes.slurm import cleanup_stale_jobs

    return cleanup_stale_jobs(results_dir)


def _docker_objects(results_dir: Path) -> list[str]:
    """Containers and networks labelled with a crashed run's id (qdiscs and rules go with the containers)."""
    try:
        from chaosbench.runtimes.docker import remove_run_objects
    except ImportError:
        return []
    return remove_run_objects(results_dir)


#: Extra cleaners (FUSE mounts, containers, ...): each gets the results directory and returns what it did.
CLEANERS: list[Callable[[Path], list[str]]] = [_stale_mounts, _stale_slurm_jobs, _docker_objects]


def _events_files(root: Path) -> list[Path]:
    """Every events.jsonl below root, never descending into a mount point (a frozen FUSE mount would hang)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
        if "events.jsonl" in filenames:
            out.append(Path(dirpath) / "events.jsonl")
    return out


def unfinished_runs(results_dir: Path) -> list[Path]:
    """Run directories below ``results_dir`` whose timeline has no ``run_end``."""
    out = []
    for events in sorted(_events_files(Path(results_dir))):
        evs = read_events(events)
        if evs and not any(e.kind == "run_end" for e in evs):
            out.append(events.parent)
    return out


def _recorded_processes(run_dir: Path) -> list[tuple[int, int | None, str]]:
    procs = []
    events = read_events(run_dir / "events.jsonl")
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
    """Clean up after crashed runs below ``results_dir``; returns one line per action."""
    results_dir = Path(results_dir)
    actions: list[str] = []
    for run_dir in unfinished_runs(results_dir):
        for pid, ticks, name in _recorded_processes(run_dir):
            if ticks is None or not procutil.alive(pid, ticks):
                continue
            actions.append(f"kill {name} (pid {pid}) of {run_dir}")
            if not dry_run:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        run_id = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
        if run_id:
            for group in Path("/sys/fs/cgroup/cpu/chaosbench").glob(f"{run_id}.*"):
                actions.append(f"remove cgroup {group}")
                if not dry_run:
                    with contextlib.suppress(OSError):
                        group.rmdir()
    for cleaner in CLEANERS:
        actions.extend(cleaner(results_dir) if not dry_run else [])
    return actions
