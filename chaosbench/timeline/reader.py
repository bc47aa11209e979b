"""Reading a whole timeline: validated, sorted by time, with other hosts' stamps moved onto the harness's clock.

Validation (:func:`read_events`): every line of a timeline is an event valid against its kind's model
(:mod:`chaosbench.timeline.schema`); an unknown kind or a malformed field raises
:class:`~chaosbench.errors.UnknownEventKind` / :class:`~chaosbench.errors.MalformedEvent` carrying the file
(``path``) and the 1-based ``line``: ``events.jsonl:17: event 'stepp': unknown kind``. Blank lines are skipped,
and so is a torn last line (a writer killed mid-write: no newline, not valid JSON), as always.

Timelines of older chaosbench versions (the ``reports/`` of earlier runs, which ``chaosbench report``
recomputes): a harness writes ``timeline_version`` (:data:`~chaosbench.timeline.events.TIMELINE_VERSION`) into
its ``run_start``. A timeline whose ``run_start`` has none was written before timelines were typed, and is read as
it was then: a line that does not parse is skipped, and an event its model refuses (a kind since renamed, a field
not declared then) is kept as it was written, untyped; how many there were, and the first of them, is logged
once per file as a warning (logger ``chaosbench.timeline``), so the metrics of old runs recompute as before
without hiding that the file is not of the current contract. Every other timeline, one with a versioned
``run_start`` or with none at all (a live one, a partial one, a hand-written one), is read strictly.
``strict=True``/``False`` forces either reading.

A ``fault_inject`` event written before injectors declared their fault class, failure mode and checkpoint
damage lacks those fields (in a versioned timeline too: they are optional); what analysis makes of such an
event is decided in one place, :func:`chaosbench.injectors.legacy.declared`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaosbench.errors import InvalidEvent
from chaosbench.timeline.clocks import correct
from chaosbench.timeline.events import Event, EventKind, parse_lines

logger = logging.getLogger("chaosbench.timeline")


def is_legacy(lines: list[str]) -> bool:
    """Whether a timeline was written by a chaosbench before typed timelines: it has a ``run_start`` without
    ``timeline_version``."""
    for raw in lines:
        if '"run_start"' not in raw:
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("kind") == EventKind.RUN_START.value:
            return obj.get("timeline_version") is None
    return False


def _read_legacy(lines: list[str], where: str) -> list[Event]:
    from chaosbench.timeline.schema import check_obj

    events = parse_lines(lines, where, strict=False)
    problems: list[InvalidEvent] = []
    for ev in events:
        try:
            check_obj(ev.to_obj(), where)
        except InvalidEvent as exc:
            problems.append(exc)
    if problems:
        logger.warning(
            "%s: a timeline of an older chaosbench (no timeline_version): %d event(s) do not match "
            "the current models and are read as written; the first: %s",
            where,
            len(problems),
            problems[0],
        )
    return events


def _check(obj: Mapping[str, Any], path: str | None, line: int | None) -> None:
    from chaosbench.timeline.schema import check_obj

    check_obj(obj, path, line)


def read_events(
    path: str | os.PathLike[str], correct_clocks: bool = True, strict: bool | None = None
) -> list[Event]:
    """All events of a timeline file, validated (module docstring), sorted by time (stable for equal stamps); a
    missing file has none. ``strict``: None decides by the file (an older chaosbench's timeline is read
    leniently), True/False forces it. With ``correct_clocks``, stamps written on other hosts are first moved onto
    the harness's clock by the measured offsets (``clock_offset`` events; :func:`chaosbench.timeline.clocks.correct`);
    a single-host timeline is unchanged. Raises :class:`~chaosbench.errors.InvalidEvent` (strict)."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open(encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    lenient = (not strict) if strict is not None else is_legacy(lines)
    events = _read_legacy(lines, str(p)) if lenient else parse_lines(lines, p, check=_check)
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
    ``chaosbench cleanup`` and each runtime's own cleanup of crashed runs act on. Their timelines are read
    leniently: a crashed harness's file is only looked at for its ``run_end``, and one bad line must not leave
    the rest of a crashed run behind."""
    out = []
    for events in sorted(_events_files(Path(results_dir))):
        evs = read_events(events, correct_clocks=False, strict=False)
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
