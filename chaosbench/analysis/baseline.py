"""Comparing two result sets: ``chaosbench compare A B`` and the regression gate against a saved baseline.

A difference is a *regression* when the median moved the bad way by more than ``threshold`` (relative) and a
one-sided Mann-Whitney rank test over the repeats gives p <= ``alpha`` (in the spirit of pytest-benchmark's
``--benchmark-compare-fail``). With too few repeats the rank test cannot reach ``alpha`` (its smallest
possible p is 1 / C(n_a + n_b, n_a)); such a difference is reported, with that note, and does not fail.
Broken recovery needs no statistics: a scenario that recovered in every baseline run but not in every new
one, or whose fidelity went from exact to diverged, is always a regression.
"""

from __future__ import annotations

import math
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaosbench.analysis.stats import mann_whitney
from chaosbench.analysis.values import as_bool, as_float
from chaosbench.errors import ChaosbenchError

LOWER_IS_BETTER = (
    "time_to_detect_s", "time_to_resume_s", "time_to_catch_up_s", "lost_steps", "lost_work_s", "extra_wall_s",
    "restart_count", "badput_restart_init_s", "badput_restore_s", "failed_requests", "error_budget_burn",
)  # fmt: skip
HIGHER_IS_BETTER = ("goodput",)


@dataclass
class Difference:
    key: str
    metric: str
    a_median: float | None
    b_median: float | None
    change: float | None  # relative: (b - a) / |a|
    p_two_sided: float | None
    p_worse: float | None  # one-sided: b is worse than a
    n_a: int
    n_b: int
    regression: bool
    note: str = ""

    def describe(self) -> str:
        ch = "" if self.change is None else f" ({self.change:+.0%})"
        p = "" if self.p_worse is None else f", p={self.p_worse:.3g}"
        return f"{self.key}: {self.metric} {_f(self.a_median)} -> {_f(self.b_median)}{ch}{p}{'; ' + self.note if self.note else ''}"


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a result set: a suite directory (results.parquet/.csv) or a results CSV file (a baseline)."""
    p = Path(path)
    if p.is_dir():
        from chaosbench.analysis.results import load_results

        df = load_results(p)
    elif p.is_file():
        import pandas as pd

        df = pd.read_csv(p)
    else:
        raise ChaosbenchError(f"{p}: no such result set (a suite results directory or a results CSV)")
    return [{str(k): v for k, v in r.items()} for r in df.to_dict("records")]


def save_baseline(suite_dir: str | Path, to: str | Path) -> Path:
    src = Path(suite_dir) / "results.csv"
    if not src.is_file():
        raise ChaosbenchError(f"{suite_dir}: no results.csv to save as a baseline")
    dst = Path(to)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst




def _groups(rows: Sequence[dict[str, Any]], by: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if (as_bool(r.get("control")) is True):
            continue
        out.setdefault(str(r.get(by)), []).append(r)
    return out


def compare(
    a_rows: Sequence[dict[str, Any]],
    b_rows: Sequence[dict[str, Any]],
    by: str = "scenario",
    threshold: float = 0.2,
    alpha: float = 0.05,
) -> list[Difference]:
    """Differences of B against A for every key (``scenario`` or ``fault``) present in both."""
    ga, gb = _groups(a_rows, by), _groups(b_rows, by)
    out: list[Difference] = []
    for key in sorted(set(ga) & set(gb)):
        ra, rb = ga[key], gb[key]
        rec_a = sum(1 for r in ra if r.get("outcome") == "recovered")
        rec_b = sum(1 for r in rb if r.get("outcome") == "recovered")
        if rec_a == len(ra) and rec_b < len(rb):
            out.append(Difference(key, "recovered", 1.0, rec_b / len(rb), None, None, None, len(ra), len(rb), True,
                                  f"recovered {rec_a}/{len(ra)} before, {rec_b}/{len(rb)} now"))  # fmt: skip
        fid_a = {str(r.get("fidelity")) for r in ra}
        fid_b = {str(r.get("fidelity")) for r in rb}
        if fid_a == {"exact"} and "diverged" in fid_b:
            out.append(Difference(key, "fidelity", None, None, None, None, None, len(ra), len(rb), True,
                                  "exact before, diverged now"))  # fmt: skip
        for metric in LOWER_IS_BETTER + HIGHER_IS_BETTER:
            va = [v for r in ra if (v := as_float(r.get(metric))) is not None]
            vb = [v for r in rb if (v := as_float(r.get(metric))) is not None]
            if not va or not vb:
                continue
            ma, mb = statistics.median(va), statistics.median(vb)
            change = (mb - ma) / abs(ma) if ma else (0.0 if mb == ma else math.inf)
            test = mann_whitney(vb, va)
            assert test is not None
            lower = metric in LOWER_IS_BETTER
            p_worse = test.p_greater if lower else test.p_less
            worse = change > threshold if lower else change < -threshold
            min_p = 1 / math.comb(len(va) + len(vb), len(va))
            note = ""
            if worse and min_p > alpha:
                note = f"too few repeats for p <= {alpha} (smallest possible p = {min_p:.3g})"
            out.append(Difference(key, metric, ma, mb, change, test.p_two_sided, p_worse, len(va), len(vb),
                                  bool(worse and p_worse <= alpha), note))  # fmt: skip
    return out


def markdown(diffs: Sequence[Difference], title: str) -> str:
    lines = [f"## {title}", "", "| key | metric | A median | B median | change | p (two-sided) | regression | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]  # fmt: skip
    for d in diffs:
        ch = "—" if d.change is None or math.isinf(d.change) else f"{d.change:+.1%}"
        p = "—" if d.p_two_sided is None else f"{d.p_two_sided:.3g}"
        lines.append(f"| {d.key} | {d.metric} | {_f(d.a_median)} | {_f(d.b_median)} | {ch} | {p} | "
                     f"{'**yes**' if d.regression else 'no'} | {d.note} |")  # fmt: skip
    return "\n".join(lines) + "\n"
