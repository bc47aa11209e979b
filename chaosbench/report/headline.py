"""The report's first screen: one headline per framework, then the framework x fault scorecard, both built from
the results table (one row per run).

Counted over a framework's fault runs whose fault fired (outcome ``recovered``, ``outlasted`` or
``not_recovered``): the other fault runs (the fault did not fire, the run was contaminated, the harness failed)
are unusable rows, named with why (their verdict). A framework whose fault-free control did not run clean
(:func:`chaosbench.report.analysis.unusable_frameworks`) is unusable as a whole: its line says why, and none of
its runs is counted.

A headline says, in one line: recovered x/y with the Wilson 95 % interval; the median time to resume over the
recovered runs (a serving run's: time to recover; each run's last fault, as the framework comparison's whole-run
rows); what detected the faults (``detected_via``) and the timeout that decides that detection (``predicted_by``:
the deciding timeout plus the interval that polls it, from the timeouts in force the run recorded; missing with
the reason where the adapter has no model for the fault); and the unusable rows. The scorecard's cells give the
same counts and median per fault, and link the cell's runs.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from chaosbench.analysis.faults import FIRED_OUTCOMES
from chaosbench.analysis.stats import wilson
from chaosbench.analysis.values import fault_rows
from chaosbench.report.analysis import unusable_frameworks
from chaosbench.report.document import Block, Cell, Heading, KeyValues, Link, Scorecard, ScoreCell
from chaosbench.report.fmt import MISSING, as_bool, as_float, as_name, as_text, fmt_seconds
from chaosbench.report.tables import RunView, scenario_anchor

#: A headline names at most this many unusable rows, then counts the rest.
MAX_UNUSABLE_NAMED = 3
#: A scorecard cell links at most this many runs, then counts the rest (its scenario's section lists them all).
MAX_RUN_LINKS = 8


def _framework(run: RunView) -> str:
    return as_name(run.row.get("framework")) or MISSING


def _fault(run: RunView) -> str:
    return as_name(run.row.get("fault")) or MISSING


def _by_framework(runs: Sequence[RunView]) -> dict[str, list[RunView]]:
    """Each framework's fault runs (controls left out), frameworks in the order they first appear."""
    out: dict[str, list[RunView]] = {}
    for run in runs:
        if not run.control:
            out.setdefault(_framework(run), []).append(run)
    return out


def _fired(runs: Sequence[RunView]) -> list[RunView]:
    return [r for r in runs if r.outcome in FIRED_OUTCOMES]


def _unusable_rows(runs: Sequence[RunView]) -> list[RunView]:
    return [r for r in runs if r.outcome not in FIRED_OUTCOMES]


def _resume_s(run: RunView) -> float | None:
    """A recovered run's time to resume (its last fault's, as the framework comparison takes it); a serving
    run's time to recover (its error rate back under the SLO)."""
    if as_bool(run.row.get("serving")) is True:
        return as_float(run.row.get("time_to_recover_s"))
    faults = fault_rows(run.row)
    if faults:
        last = faults[-1]
        return as_float(last.get("time_to_resume_s")) if last.get("status") == "recovered" else None
    return run.value("time_to_resume_s")


def _median_resume(fired: Sequence[RunView]) -> tuple[float | None, str]:
    """The median time to resume of the recovered runs, and how to say it (with how many were measured, or why
    there is none)."""
    recovered = [r for r in fired if r.outcome == "recovered"]
    values = [v for r in recovered if (v := _resume_s(r)) is not None]
    if not recovered:
        return None, f"{MISSING} (none recovered)"
    if not values:
        why = next((w for r in recovered if (w := as_text(r.missing_reasons.get("time_to_resume_s")))), None)
        return None, f"{MISSING} ({why or 'not measured'})"
    median = statistics.median(values)
    text = f"{fmt_seconds(median)} s"
    if len(values) < len(recovered):
        text += f" ({len(values)} of {len(recovered)} recovered runs measured)"
    return median, text


def _failures_text(fired: Sequence[RunView]) -> str:
    """``1 outlasted, 2 not recovered``, or ``""``."""
    counts = Counter(r.outcome for r in fired)
    return ", ".join(
        f"{counts[o]} {o.replace('_', ' ')}" for o in ("outlasted", "not_recovered") if counts[o]
    )


def _percent(share: float) -> str:
    """A share as a whole percentage, with one decimal where rounding would hide that it is not 0 or 100 (the
    upper bound of 0 in 909 is 0.4 %, not 0)."""
    pct = share * 100
    return f"{pct:.1f}" if 0 < pct < 1 or 99 < pct < 100 else f"{pct:.0f}"


def _recovered_text(fired: Sequence[RunView]) -> str:
    """``recovered 4/5 (95 % CI 38-96 %; 1 not recovered)``."""
    ok = sum(1 for r in fired if r.outcome == "recovered")
    _, lo, hi = wilson(ok, len(fired))
    assert lo is not None and hi is not None
    text = f"recovered {ok}/{len(fired)} (95 % CI {_percent(lo)}-{_percent(hi)} %"
    failures = _failures_text(fired)
    return text + (f"; {failures})" if failures else ")")


def _detection_text(fired: Sequence[RunView]) -> str:
    """What detected the faults, each mechanism with its count and the timeout deciding it: ``detected by
    process exit ×3 (timeout: monitor_interval_s=0.05), step watchdog ×1 (timeout: heartbeat_timeout_s=3 +
    monitor_interval_s=0.05), not detected ×1``."""
    deciding: dict[str, Counter[str]] = {}
    undetected = 0
    for run in fired:
        if as_bool(run.row.get("detected")) is not True:
            undetected += 1
            continue
        via = as_text(run.row.get("detected_via"))
        if via is None:
            why = as_text(run.missing_reasons.get("detected_via"))
            via = f"a mechanism not named ({why})" if why else "a mechanism not named"
        by = as_text(run.row.get("predicted_by"))
        if by is None:
            why = as_text(run.missing_reasons.get("predicted_detect_s"))
            by = f"timeout: {MISSING} {why}" if why else f"timeout: {MISSING} not recorded"
        else:
            by = f"timeout: {by}"
        deciding.setdefault(via, Counter())[by] += 1
    parts = []
    for via, bys in sorted(deciding.items(), key=lambda kv: -sum(kv[1].values())):
        if len(bys) == 1:
            parts.append(f"{via} ×{sum(bys.values())} ({next(iter(bys))})")
        else:
            parts.append(
                f"{via} ×{sum(bys.values())} (" + "; ".join(f"{b} ×{n}" for b, n in bys.most_common()) + ")"
            )
    text = "detected by " + ", ".join(parts) if parts else "nothing detected"
    return text + (f", not detected ×{undetected}" if parts and undetected else "")


def _unusable_text(rows: Sequence[RunView]) -> str:
    """``unusable rows: restart/kill repeat 2 (fault_not_fired: the fault did not fire)``, naming at most
    :data:`MAX_UNUSABLE_NAMED`."""
    named = [
        f"{r.scenario} repeat {r.repeat_label} ({r.outcome or 'no outcome'}: "
        f"{as_text(r.row.get('verdict')) or 'no verdict recorded'})"
        for r in rows[:MAX_UNUSABLE_NAMED]
    ]
    more = len(rows) - len(named)
    return "unusable rows: " + "; ".join(named) + (f"; and {more} more (see their scenarios)" if more else "")


def headline_items(runs: Sequence[RunView]) -> list[tuple[str, str]]:
    """One ``(framework, line)`` per framework with fault runs, in the order the frameworks first appear."""
    unusable = unusable_frameworks([r.row for r in runs])
    out: list[tuple[str, str]] = []
    for fw, fw_runs in _by_framework(runs).items():
        if fw in unusable:
            runs_text = f"{len(fw_runs)} fault run{'s' if len(fw_runs) > 1 else ''}"
            out.append((fw, f"unusable, not counted ({runs_text}): {unusable[fw]}"))
            continue
        fired = _fired(fw_runs)
        parts: list[str] = []
        if fired:
            serving = any(as_bool(r.row.get("serving")) is True for r in fired)
            parts += [
                _recovered_text(fired),
                f"median time to {'recover' if serving else 'resume'} {_median_resume(fired)[1]}",
                _detection_text(fired),
            ]
        else:
            parts.append(f"no fault fired in its {len(fw_runs)} fault runs")
        if rows := _unusable_rows(fw_runs):
            parts.append(_unusable_text(rows))
        out.append((fw, "; ".join(parts)))
    return out


def _cell(runs: Sequence[RunView], unusable: str | None) -> ScoreCell:
    ordered = sorted(runs, key=lambda r: (r.scenario, r.repeat is None, r.repeat or 0))
    links: list[Cell] = [
        Link(r.repeat_label, r.dir_rel, r.dir_rel) if r.dir_rel else r.repeat_label
        for r in ordered[:MAX_RUN_LINKS]
    ]
    cell = ScoreCell(
        [], anchor=scenario_anchor(ordered[0].scenario), runs=links, more_runs=len(ordered) - len(links)
    )
    if unusable is not None:
        cell.lines, cell.unusable = ["unusable", "its control was not clean"], unusable
        return cell
    fired = _fired(ordered)
    if not fired:
        cell.lines.append("no fault fired")
    else:
        counts = Counter(r.outcome for r in fired)
        cell.fired, cell.recovered = len(fired), counts["recovered"]
        cell.outlasted, cell.not_recovered = counts["outlasted"], counts["not_recovered"]
        cell.seconds, median_text = _median_resume(fired)
        cell.lines.append(f"{cell.recovered}/{cell.fired} recovered")
        if cell.recovered:
            cell.lines.append(f"median {median_text}")
        if failures := _failures_text(fired):
            cell.lines.append(failures)
    if rest := len(_unusable_rows(ordered)):
        cell.lines.append(f"{rest} unusable row{'s' if rest > 1 else ''}")
    return cell


def scorecard(runs: Sequence[RunView]) -> Scorecard:
    """One row per framework with fault runs, one column per fault (both in the order they first appear); a cell
    per framework x fault it ran (:class:`~chaosbench.report.document.ScoreCell`)."""
    unusable = unusable_frameworks([r.row for r in runs])
    by_fw = _by_framework(runs)
    faults = list(dict.fromkeys(_fault(r) for rs in by_fw.values() for r in rs))
    rows: list[tuple[str, list[ScoreCell | None]]] = []
    for fw, fw_runs in by_fw.items():
        cells: list[ScoreCell | None] = []
        for fault in faults:
            here = [r for r in fw_runs if _fault(r) == fault]
            cells.append(_cell(here, unusable.get(fw)) if here else None)
        rows.append((fw, cells))
    serving = any(as_bool(r.row.get("serving")) is True for r in runs)
    measure = "median time to resume (s)" + (", a serving run's time to recover" if serving else "")
    return Scorecard(
        faults,
        rows,
        measure,
        caption="Per framework x fault, of the runs whose fault fired: how many recovered, the median "
        "time to resume of those (colour), and those outlasted (the job went on with no "
        "framework reaction) or not recovered. Each cell links its scenario's section and its "
        "runs' directories.",
    )


def first_screen_blocks(runs: Sequence[RunView]) -> list[Block]:
    """The headline and the scorecard; nothing when no run is a fault run."""
    items = headline_items(runs)
    if not items:
        return []
    return [
        Heading(2, "Headline", anchor="headline"),
        KeyValues(items),
        Heading(2, "Scorecard: framework x fault", anchor="scorecard"),
        scorecard(runs),
    ]
