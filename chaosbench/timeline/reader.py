"""Reading a whole timeline: sorted by time, with other hosts' stamps moved onto the harness's clock."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from chaosbench.timeline.clocks import correct
from chaosbench.timeline.events import Event, parse_lines


def read_events(path: str | os.PathLike[str], correct_clocks: bool = True) -> list[Event]:
    """All events of a timeline file, sorted by time (stable for equal stamps). With ``correct_clocks``,
    stamps written on other hosts are first moved onto the harness's clock by the measured offsets
    (``clock_offset`` events; :func:`chaosbench.timeline.clocks.correct`); a single-host timeline is unchanged."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open() as f:
        events = parse_lines(f.readlines())
    events.sort(key=lambda e: e.t_ns)
    if correct_clocks:
        events = correct(events)
    return events


def _events_files(root: Path) -> list[Path]:
    """Every events.jsonl below root, never descending into a mount point (a frozen FUSE mount would hang)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
        if "events.jsonl" in filenames:
            out.append(Path(dirpath) / "events.jsonl")
    return out


def unfinished_runs(results_dir: str | os.PathLike[str]) -> list[Path]:
    """Run directories below ``results_dir`` whose timeline has no ``run_end`` (their harness died): what
    ``chaosbench cleanup`` and each runtime's own cleanup of crashed runs act on."""
    out = []
    for events in sorted(_events_files(Path(results_dir))):
        evs = read_events(events)
        if evs and not any(e.kind == "run_end" for e in evs):
            out.append(events.parent)
    return out


def crashed_run_ids(results_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Run ids of the unfinished runs (no ``run_end``) below ``results_dir`` -> their run directories."""
    out: dict[str, Path] = {}
    for run_dir in unfinished_runs(results_dir):
        with contextlib.suppress(OSError, ValueError, KeyError):
            out[str(json.loads((run_dir / "config.json").read_text())["run_id"])] = run_dir
    return out
