"""Comparing two result sets: ``chaosbench compare A B`` and the regression gate against a saved baseline.

Per key (``scenario``, or ``fault`` for two frameworks) present in both sets, every figure is compared
(:func:`compare`); control runs are left out (one per framework: nothing to test). Rules:

- **Shares** (:data:`SHARES`: the fault fired, recovered, detected, fidelity exact, culprit correct (``blame``),
  runs with a false detection, gave up, contaminated), each counted over the runs where it applies: one-sided
  Fisher's exact test that the new share is worse (:func:`~chaosbench.analysis.stats.fisher_worse`). Recovered
  counts the runs whose fault fired (outcome ``recovered``, ``outlasted``, ``not_recovered``): an
  ``outlasted`` run (the job finished, nothing reacted to the fault) is *not* recovered, a run whose fault did
  not fire is in no share but "the fault fired". No relative threshold: a significant worse share counts.
- **Timings and counts** (:data:`LOWER_IS_BETTER`, :data:`HIGHER_IS_BETTER`): the one-sided Mann-Whitney rank
  test over the repeats (:func:`~chaosbench.analysis.stats.mann_whitney`). The median must also move the bad
  way by more than the **noise floor**: both ``threshold`` relative to the baseline's median and the
  baseline's own *noise*, twice the interquartile range of the baseline's repeats of that figure in that key
  (:func:`noise`: 0 with one repeat, the range with two or three). A move inside either is ``within noise``
  whatever its p. The interquartile range, not the range: the range grows with the baseline's repeats (one
  slow run on a busy machine widens it for good), so a larger baseline would make the gate blinder; the
  middle half of the baseline's runs does not grow with their number. Measured on planted regressions
  (``benchmarks/gate_power.py``): with the range a +2 s restart delay (resume 6.75 -> 9.87 s) stayed inside a
  3.92 s range of 10 baseline repeats.
- **No longer measured**: a figure the baseline measured in every one of its runs of a key and the new set in
  none is a regression, without statistics. (Measured in only some baseline runs and in no new one: not
  compared, with a note; the share that explains it, e.g. recovered, is tested.)

**The whole verdict's false-alarm rate is at most ``alpha``**: the p-values of every comparison in the
*family* are Holm-adjusted together (:func:`~chaosbench.analysis.stats.holm`), and a comparison is a
regression only when its adjusted p is <= ``alpha``. The family is every figure x key compared whose
smallest attainable p (given the pooled values, as the exact tests condition on them) is <= ``alpha``; a
comparison that cannot reach ``alpha`` even on its own (a share that is 3/3 on both sides, a figure with the
same value in every run) can never be rejected, and leaving it out keeps the guarantee (Tarone 1990) while
not diluting the others. ``Comparison.family`` states its size.

With few repeats even complete separation may not reach Holm's level (3 vs 3 repeats: the smallest
one-sided p of either test is 1 / C(6, 3) = 0.05; over a family of m the first Holm level is 0.05 / m). A
comparison that moved the bad way beyond its noise floor and whose smallest attainable p times the family
size exceeds ``alpha`` is ``undecided``: "not decidable with 3 vs 3 repeats: needs N new repeats", N the
fewest new repeats (against the same baseline) that could reach ``alpha / m``. Undecided comparisons do not
fail the gate (:mod:`chaosbench.gate`); the verdict counts them. :func:`decide` classifies one key's
comparisons at a given level, for callers that add repeats until a key is decided.
"""

from __future__ import annotations

import enum
import math
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaosbench.analysis.faults import FIRED_OUTCOMES
from chaosbench.analysis.stats import fisher_worse, holm, mann_whitney, rank_min_p
from chaosbench.analysis.values import as_bool, as_float, is_missing
from chaosbench.errors import ResultsError

LOWER_IS_BETTER = (
    "time_to_detect_s",
    "time_to_resume_s",
    "time_to_catch_up_s",
    "lost_steps",
    "lost_work_s",
    "extra_wall_s",
    "restart_count",
    "badput_restart_init_s",
    "badput_restore_s",
    "failed_requests",
    "error_budget_burn",
)
HIGHER_IS_BETTER = ("goodput",)

#: p-values are compared with a level with this relative slack: 3 vs 3 repeats give 1/20 as 0.05000000000000001.
_SLACK = 1e-9


def at_most(p: float, level: float) -> bool:
    """``p <= level``, forgiving floating-point noise (1/20 computed as 0.05000000000000001 is 0.05)."""
    return p <= level * (1 + _SLACK)


@dataclass(frozen=True)
class Share:
    """An outcome-level figure: the share of a key's runs with some property. ``applies``: whether a result row
    is counted at all (None: not, e.g. detection in a run whose fault did not fire); ``holds``: whether it has
    the property (None: not measured in that row). ``good``: the property is the good side (recovered) rather
    than the bad one (gave up)."""

    name: str
    holds: Callable[[dict[str, Any]], bool | None]
    good: bool = True
    #: The fields of a run on the good side and of one on the bad side of this figure (a run recovered, one
    #: not): the extreme continuations of :mod:`chaosbench.analysis.sequential`.
    good_run: tuple[tuple[str, Any], ...] = ()
    bad_run: tuple[tuple[str, Any], ...] = ()


def _fired(r: dict[str, Any]) -> bool:
    return r.get("outcome") in FIRED_OUTCOMES


def _when_fired(f: Callable[[dict[str, Any]], bool | None]) -> Callable[[dict[str, Any]], bool | None]:
    return lambda r: f(r) if _fired(r) else None


def _fidelity_exact(r: dict[str, Any]) -> bool | None:
    v = r.get("fidelity")
    return None if is_missing(v) else v == "exact"


def _blame_correct(r: dict[str, Any]) -> bool | None:
    v = r.get("blame")
    return None if is_missing(v) else v == "correct"


def _false_detection(r: dict[str, Any]) -> bool | None:
    v = as_float(r.get("false_detections"))
    return None if v is None else v > 0


def _contaminated(r: dict[str, Any]) -> bool | None:
    if r.get("outcome") == "contaminated":
        return True
    flag = as_bool(r.get("contaminated"))
    if flag is not None:
        return flag
    return False if r.get("outcome") in (*FIRED_OUTCOMES, "fault_not_fired") else None


#: The outcome-level figures, each a share of a key's runs (controls left out).
SHARES = (
    Share(
        "fault fired",
        lambda r: _fired(r) if r.get("outcome") in (*FIRED_OUTCOMES, "fault_not_fired") else None,
        good_run=(("outcome", "recovered"),),
        bad_run=(("outcome", "fault_not_fired"),),
    ),
    Share(
        "recovered",
        _when_fired(lambda r: r.get("outcome") == "recovered"),
        good_run=(("outcome", "recovered"),),
        bad_run=(("outcome", "not_recovered"),),
    ),
    Share(
        "detected",
        _when_fired(lambda r: as_bool(r.get("detected"))),
        good_run=(("outcome", "recovered"), ("detected", True)),
        bad_run=(("outcome", "not_recovered"), ("detected", False)),
    ),
    Share(
        "fidelity exact",
        _fidelity_exact,
        good_run=(("fidelity", "exact"),),
        bad_run=(("fidelity", "diverged"),),
    ),
    Share("blame correct", _blame_correct, good_run=(("blame", "correct"),), bad_run=(("blame", "wrong"),)),
    Share(
        "false detection",
        _false_detection,
        good=False,
        good_run=(("false_detections", 0),),
        bad_run=(("false_detections", 1),),
    ),
    Share(
        "gave up",
        _when_fired(lambda r: as_bool(r.get("gave_up"))),
        good=False,
        good_run=(("outcome", "recovered"), ("gave_up", False)),
        bad_run=(("outcome", "not_recovered"), ("gave_up", True)),
    ),
    Share(
        "contaminated",
        _contaminated,
        good=False,
        good_run=(("outcome", "recovered"), ("contaminated", False)),
        bad_run=(("outcome", "contaminated"),),
    ),
)


class Status(enum.StrEnum):
    """What a comparison found. ``REGRESSION`` and ``NO_LONGER_MEASURED`` fail the gate; ``UNDECIDED``: moved
    the bad way beyond its noise floor, but these repeats cannot reach the corrected level; ``NOT_SIGNIFICANT``:
    moved the bad way, could have been significant, was not; ``WITHIN_NOISE``: a move the bad way inside the
    threshold or the baseline's noise; ``UNCHANGED`` / ``IMPROVED``; ``NOT_COMPARED``: nothing to test (no
    value on one side, or the same value in every run: out of the family)."""

    REGRESSION = "regression"
    NO_LONGER_MEASURED = "no longer measured"
    UNDECIDED = "undecided"
    NOT_SIGNIFICANT = "not significant"
    WITHIN_NOISE = "within noise"
    UNCHANGED = "unchanged"
    IMPROVED = "improved"
    NOT_COMPARED = "not compared"

    @property
    def fails(self) -> bool:
        return self in (Status.REGRESSION, Status.NO_LONGER_MEASURED)


@dataclass
class Difference:
    """One figure of one key, B against A. For a timing, ``a_median``/``b_median`` are medians and ``noise``
    twice the baseline's interquartile range (:func:`noise`); for a share they are the share of runs with the
    property (``a_count`` of ``n_a``).
    ``p_worse``: the raw one-sided p that B is worse; ``p_min``: the smallest p these repeats (and pooled values)
    allow; ``p_holm``: Holm-adjusted over the family (None: not in it); ``needs``: new repeats that could decide
    an undecided comparison."""

    key: str
    metric: str
    a_median: float | None
    b_median: float | None
    change: float | None  # relative: (b - a) / |a|; a share: b - a (percentage points as a fraction)
    p_two_sided: float | None
    p_worse: float | None  # one-sided: b is worse than a
    n_a: int
    n_b: int
    regression: bool = False
    note: str = ""
    kind: str = "timing"  # or "share"
    a_count: int | None = None
    b_count: int | None = None
    noise: float | None = None
    p_min: float | None = None
    p_holm: float | None = None
    adverse: bool = False  # moved the bad way beyond its noise floor
    status: Status = Status.NOT_COMPARED
    needs: int | None = None
    #: Looks at this key's verdict (repeats until decided: :mod:`chaosbench.analysis.sequential`); every p of
    #: the comparison is multiplied by it before the family and Holm see it (Bonferroni over the looks).
    looks: int = 1

    @property
    def in_family(self) -> bool:
        return self.p_holm is not None

    @property
    def p_spent(self) -> float | None:
        """``p_worse`` times :attr:`looks` (at most 1): the p the family and Holm see."""
        return None if self.p_worse is None else min(1.0, self.p_worse * self.looks)

    @property
    def p_min_spent(self) -> float | None:
        """``p_min`` times :attr:`looks` (at most 1)."""
        return None if self.p_min is None else min(1.0, self.p_min * self.looks)

    def values_text(self) -> str:
        if self.kind == "share":
            return (
                f"{self.a_count}/{self.n_a} ({_pct(self.a_median)}) -> {self.b_count}/{self.n_b} "
                f"({_pct(self.b_median)})"
            )
        ch = "" if self.change is None or math.isinf(self.change) else f" ({self.change:+.0%})"
        return f"{_f(self.a_median)} -> {_f(self.b_median)}{ch}"

    def p_text(self) -> str:
        if self.p_worse is None:
            return ""
        holm_p = "" if self.p_holm is None else f", Holm p={self.p_holm:.3g}"
        looks = "" if self.looks == 1 else f" x {self.looks} looks"
        return f"p={self.p_worse:.3g}{looks}{holm_p}"

    def describe(self) -> str:
        """One line: what changed, by how much, with what p (raw and Holm-adjusted), and the finding."""
        p = self.p_text()
        tail = f"; {self.note}" if self.note else ""
        values = "" if self.p_worse is None and self.a_median is None else f" {self.values_text()}"
        return f"{self.key}: {self.metric}{values}{', ' + p if p else ''}: {self.status.value}{tail}"


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


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
        raise ResultsError(str(p), "no such result set (a suite results directory or a results CSV)")
    return [{str(k): v for k, v in r.items()} for r in df.to_dict("records")]


def save_baseline(suite_dir: str | Path, to: str | Path) -> Path:
    src = Path(suite_dir) / "results.csv"
    if not src.is_file():
        raise ResultsError(str(suite_dir), "no results.csv to save as a baseline")
    dst = Path(to)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def groups(rows: Sequence[dict[str, Any]], by: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if as_bool(r.get("control")) is True:
            continue
        out.setdefault(str(r.get(by)), []).append(r)
    return out


def share_difference(
    key: str, share: Share, ra: Sequence[dict[str, Any]], rb: Sequence[dict[str, Any]]
) -> Difference | None:
    """``share`` of B's runs against A's, with its raw test; None when the baseline never measured it."""
    ha = [h for r in ra if (h := share.holds(r)) is not None]
    hb = [h for r in rb if (h := share.holds(r)) is not None]
    if not ha:
        return None
    if not hb:
        return _unmeasured(key, share.name, len(ha), len(ra), len(rb), "share")
    ka, kb = sum(ha), sum(hb)
    good_a, good_b = (ka, kb) if share.good else (len(ha) - ka, len(hb) - kb)
    worse = fisher_worse(good_a, len(ha), good_b, len(hb))
    better = fisher_worse(good_b, len(hb), good_a, len(ha))
    sa, sb = ka / len(ha), kb / len(hb)
    d = Difference(
        key,
        share.name,
        sa,
        sb,
        sb - sa,
        min(1.0, 2 * min(worse.p, better.p)),
        worse.p,
        len(ha),
        len(hb),
        kind="share",
        a_count=ka,
        b_count=kb,
        p_min=worse.p_min,
    )
    d.adverse = good_b / len(hb) < good_a / len(ha)
    return d


def _unmeasured(key: str, metric: str, measured_a: int, runs_a: int, n_b: int, kind: str) -> Difference:
    d = Difference(key, metric, None, None, None, None, None, measured_a, 0, kind=kind)
    if measured_a == runs_a:
        d.status = Status.NO_LONGER_MEASURED
        d.note = f"measured in {measured_a}/{runs_a} baseline runs, in none of {n_b} now"
    else:
        d.note = f"measured in {measured_a}/{runs_a} baseline runs, in none of {n_b} now: not compared"
    return d


#: The noise floor in interquartile ranges (:func:`noise`). Two: about the range a normal sample of 7 or 8
#: repeats spans (2.7 sigma), without growing with the baseline's repeats or with one slow run. Chosen on
#: benchmarks/gate_power.py's sets: at one, a clean rerun's extra wall (+21 %, every run slower, the machine's
#: load drifting) failed; at two it stayed within noise (0.95 of the floor) and the planted +2 s restart
#: delay was still caught (its relaunch start-up at 3.6 times the floor).
NOISE_IQRS = 2.0


def noise(values: Sequence[float]) -> float:
    """A figure's noise in the baseline: :data:`NOISE_IQRS` times the interquartile range of its repeats
    (``statistics.quantiles``, inclusive method: the sample's own quartiles, interpolated), 0 with fewer than
    two."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return NOISE_IQRS * (q3 - q1)


def timing_difference(
    key: str, metric: str, ra: Sequence[dict[str, Any]], rb: Sequence[dict[str, Any]], threshold: float
) -> Difference | None:
    """A timing or count of B's runs against A's, with its raw rank test and its noise floor; None when the
    baseline never measured it."""
    va = [v for r in ra if (v := as_float(r.get(metric))) is not None]
    vb = [v for r in rb if (v := as_float(r.get(metric))) is not None]
    if not va:
        return None
    if not vb:
        return _unmeasured(key, metric, len(va), len(ra), len(rb), "timing")
    ma, mb = statistics.median(va), statistics.median(vb)
    change = (mb - ma) / abs(ma) if ma else (0.0 if mb == ma else math.copysign(math.inf, mb - ma))
    test = mann_whitney(vb, va)
    assert test is not None
    lower = metric in LOWER_IS_BETTER
    spread = noise(va)
    floor = max(threshold * abs(ma), spread)
    bad_move = (mb - ma) if lower else (ma - mb)
    d = Difference(
        key,
        metric,
        ma,
        mb,
        change,
        test.p_two_sided,
        test.p_greater if lower else test.p_less,
        len(va),
        len(vb),
        noise=spread,
        p_min=rank_min_p(va, vb, b_greater=lower),
    )
    d.adverse = bad_move > floor
    if bad_move > 0 and not d.adverse:
        d.note = (
            f"within the noise floor ({_f(floor)}: threshold {threshold:.0%} of the median, baseline "
            f"noise, twice its interquartile range, {_f(spread)})"
        )
    return d


def compare(
    a_rows: Sequence[dict[str, Any]],
    b_rows: Sequence[dict[str, Any]],
    by: str = "scenario",
    threshold: float = 0.2,
    alpha: float = 0.05,
    looks: Mapping[str, int] | None = None,
) -> list[Difference]:
    """Every figure of B against A for every key (``scenario`` or ``fault``) present in both, each classified
    (``status``, ``regression``) with the family-wise correction over all of them (:func:`assess`): the rules
    of this module's docstring. Keys in only one set are not compared. ``looks``: key -> how many times its
    verdict was looked at while it was repeated until decided (:attr:`Difference.looks`; default 1)."""
    ga, gb = groups(a_rows, by), groups(b_rows, by)
    out: list[Difference] = []
    for key in sorted(set(ga) & set(gb)):
        ra, rb = ga[key], gb[key]
        diffs = [d for share in SHARES if (d := share_difference(key, share, ra, rb)) is not None]
        diffs += [
            t
            for metric in LOWER_IS_BETTER + HIGHER_IS_BETTER
            if (t := timing_difference(key, metric, ra, rb, threshold)) is not None
        ]
        for d in diffs:
            d.looks = (looks or {}).get(key, 1)
        out += diffs
    assess(out, alpha)
    return out


def family(diffs: Sequence[Difference], alpha: float) -> list[Difference]:
    """The comparisons the correction covers: every tested one whose smallest attainable p is <= ``alpha``
    (one that cannot reach ``alpha`` alone is never rejected, so leaving it out keeps the guarantee); p times
    its looks (:attr:`Difference.p_min_spent`)."""
    return [
        d for d in diffs if d.p_worse is not None and (p := d.p_min_spent) is not None and at_most(p, alpha)
    ]


def assess(diffs: Sequence[Difference], alpha: float) -> int:
    """Holm-adjust the family's p-values together (``p_holm``) and classify every comparison (``status``,
    ``regression``, ``needs``), in place. Returns the family size m."""
    fam = family(diffs, alpha)
    for d, adjusted in zip(fam, holm([d.p_spent or 1.0 for d in fam]), strict=True):
        d.p_holm = adjusted
    for d in diffs:
        classify(d, alpha, len(fam))
    return len(fam)


def _good_a(d: Difference) -> int:
    """The baseline's count of the good side of a share (its runs recovered; its runs that did not give up)."""
    share = next(s for s in SHARES if s.name == d.metric)
    count = d.a_count or 0
    return count if share.good else d.n_a - count


def best_p(d: Difference, n_b: int | None = None) -> float:
    """The smallest one-sided p that ``n_b`` new repeats (default: as many as ``d`` has) could give against
    the baseline's repeats of ``d``, whatever they turn out to be: complete separation, ``1 / C(n_a + n_b,
    n_a)`` for a timing (assuming no ties), B good in none of its runs for a share (Fisher's p with the
    baseline's good count). 1 for a share with no good baseline run (it cannot get worse)."""
    n = d.n_b if n_b is None else n_b
    if d.kind == "share":
        good_a = _good_a(d)
        return fisher_worse(good_a, d.n_a, 0, n).p if good_a and n else 1.0
    return 1 / math.comb(d.n_a + n, d.n_a) if n else 1.0


def needed_repeats(d: Difference, level: float, most: int = 1000) -> int | None:
    """The fewest new repeats, more than ``d`` has, against the same baseline repeats, that could give a
    one-sided p <= ``level`` (:func:`best_p`). None when no number up to ``most`` would."""
    for n in range(d.n_b + 1, most + 1):
        if at_most(best_p(d, n), level):
            return n
    return None


def classify(d: Difference, alpha: float, family_size: int) -> Status:
    """Set ``d.status`` (and ``regression``, ``needs``) for a family of ``family_size`` at ``alpha``: a
    regression when its Holm-adjusted p is <= ``alpha`` and it moved the bad way beyond its noise floor;
    undecided when it so moved but even complete separation with these repeats (:func:`best_p`) could not
    reach the first Holm level ``alpha / family_size``; not significant when it could have and did not. A key whose comparisons include no undecided one is decided at these
    repeats (:func:`decided`)."""
    if d.p_worse is None:  # not tested: no longer measured, or not compared
        d.regression = d.status.fails
        return d.status
    m = max(family_size, 1)
    if not d.adverse:
        if d.p_min is not None and d.p_min >= 1:
            d.status = Status.NOT_COMPARED  # the same value in every run of both sets: nothing to test
        elif d.note.startswith("within the noise floor"):
            d.status = Status.WITHIN_NOISE
        elif d.change == 0:
            d.status = Status.UNCHANGED
        else:
            d.status = Status.IMPROVED
    elif d.p_holm is not None and at_most(d.p_holm, alpha):
        d.status = Status.REGRESSION
    elif not at_most(best := best_p(d), alpha / m / d.looks):
        d.status = Status.UNDECIDED
        d.needs = needed_repeats(d, alpha / m / d.looks)
        looks = "" if d.looks == 1 else f" over {d.looks} looks"
        smallest = f" (smallest possible p {best:.3g} > {alpha / m / d.looks:.2g}{looks})"
        more = f": needs {d.needs} new repeats against the baseline's {d.n_a}" if d.needs else ""
        d.note = f"not decidable with {d.n_a} vs {d.n_b} repeats{smallest}{more}"
    else:
        d.status = Status.NOT_SIGNIFICANT
    d.regression = d.status.fails
    return d.status


def decided(diffs: Sequence[Difference]) -> bool:
    """Whether these comparisons (one key's, say) are decided: none is :attr:`Status.UNDECIDED`. A caller that
    repeats a scenario until it is decided asks this after each repeat (with :func:`compare` or
    :func:`classify` at the level it spends)."""
    return not any(d.status is Status.UNDECIDED for d in diffs)


def markdown(diffs: Sequence[Difference], title: str, preamble: Sequence[str] = ()) -> str:
    """The comparison as a Markdown table, one row per comparison that was tested or noted (a figure with the
    same value in every run of both sets is left out), after ``preamble`` lines."""
    lines = [f"## {title}", ""]
    if preamble:
        lines += [*preamble, ""]
    lines += [
        "| key | metric | A | B | change | noise (A IQR) | p (one-sided) | Holm p | finding | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for d in diffs:
        if d.status is Status.NOT_COMPARED and not d.note:
            continue
        if d.kind == "share":
            a = "—" if d.a_count is None else f"{d.a_count}/{d.n_a}"
            b = "—" if d.b_count is None else f"{d.b_count}/{d.n_b}"
            ch = "—" if d.change is None else f"{d.change * 100:+.0f} pp"
        else:
            a, b = _f(d.a_median), _f(d.b_median)
            ch = "—" if d.change is None or math.isinf(d.change) else f"{d.change:+.1%}"
        noise = "—" if d.noise is None else _f(d.noise)
        p = "—" if d.p_worse is None else f"{d.p_worse:.3g}"
        ph = "—" if d.p_holm is None else f"{d.p_holm:.3g}"
        finding = f"**{d.status.value}**" if d.regression else d.status.value
        lines.append(
            f"| {d.key} | {d.metric} | {a} | {b} | {ch} | {noise} | {p} | {ph} | {finding} | {d.note} |"
        )
    return "\n".join(lines) + "\n"
