"""The CI gate: a suite's per-run metrics, its harness errors and, with a baseline, the comparison with it,
turned into what CI sees: the runs that missed an SLO, the regressions, JUnit XML, a Markdown summary and one
exit code. ``chaosbench run``/``compare``/``fuzz``, the pytest plugin and the fuzzer all judge here, so each
rule lives once.

Exit codes: 0 every run met its SLOs (a suite without SLOs: whatever the recovery outcomes were), 1 a harness
error or an interrupted run, 2 bad input (the CLI's, before anything runs), 3 an SLO was missed, 4 a regression
against the baseline. When several apply, a harness error wins (the results are incomplete), then a regression,
then an SLO miss.

A run's SLO verdict (``slo_ok``, ``slo_failures``) is computed with its metrics
(:func:`chaosbench.analysis.results.run_metrics`, by :func:`chaosbench.analysis.slo.evaluate`); the gate only
reads it. A regression is as :func:`chaosbench.analysis.baseline.compare` defines it: over every figure x
scenario compared, with Holm's correction so that a clean rerun fails with chance at most ``alpha``.

A comparison the repeats cannot decide (it moved the bad way beyond its noise floor, and even complete separation
with these repeats could not reach the corrected level: "not decidable with 3 vs 3 repeats: needs 15 new
repeats") is no regression: it does not change the exit code (0, or 3 with an SLO miss). It is printed as a
note, counted in the summary ("2 comparisons undecidable"), listed in ``baseline-comparison.md`` and is a
skipped testcase in the JUnit XML, so the CI page shows that the gate did not decide it. Exit 4 stays a
regression the gate is confident of.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

from chaosbench.analysis.baseline import Difference, Status, compare, family, load_rows, markdown
from chaosbench.analysis.power import Power, power

if TYPE_CHECKING:
    from chaosbench.analysis.metrics import RunMetrics
    from chaosbench.runner import RunRecord

EXIT_OK, EXIT_HARNESS, EXIT_INPUT, EXIT_SLO, EXIT_REGRESSION = 0, 1, 2, 3, 4

#: Written into the suite directory by :meth:`Gate.write`.
COMPARISON_FILE = "baseline-comparison.md"
SUMMARY_FILE = "summary.md"


def harness_errors(records: Iterable[RunRecord]) -> dict[str, str]:
    """Run directory -> reason, for every run the harness itself failed (status ``error``): a failure of
    chaosbench, never credited to the system under test."""
    return {str(r.run_dir): r.result.reason for r in records if r.result.status == "error"}


def missed_slos(m: RunMetrics) -> list[str]:
    """The SLOs run ``m`` missed, each described (``fidelity = diverged (want == "exact")``); empty when it met
    them all or had none (``slo_ok`` None)."""
    return list(m.slo_failures) if m.slo_ok is False else []


@dataclass(frozen=True)
class Comparison:
    """Result set B against result set A (``chaosbench compare A B``, or a suite against its baseline):
    every figure x key compared (``diffs``), the family the Holm correction covered (``family_size``) and what
    the repeats compared could detect (``power``)."""

    title: str
    diffs: list[Difference]
    threshold: float
    alpha: float = 0.05
    family_size: int = 0
    power: Power | None = None
    looks: dict[str, int] = field(default_factory=dict)  # keys repeated until decided: their looks

    @classmethod
    def of(
        cls,
        a: str | Path,
        b: str | Path,
        *,
        by: str = "scenario",
        threshold: float = 0.2,
        alpha: float = 0.05,
        title: str | None = None,
    ) -> Comparison:
        """Load both result sets (suite directories or results CSVs) and compare them per ``by`` (``scenario``
        or ``fault``). Raises :class:`~chaosbench.errors.ChaosbenchError` when one cannot be read. A suite
        directory B whose scenarios were repeated until decided (``repeats.json``) has their p-values multiplied
        by their looks (:mod:`chaosbench.analysis.sequential`)."""
        from chaosbench.analysis.sequential import recorded_looks

        a_rows, b_rows = load_rows(a), load_rows(b)
        looks = recorded_looks(b) if by == "scenario" else {}
        return cls.between(
            a_rows,
            b_rows,
            by=by,
            threshold=threshold,
            alpha=alpha,
            title=title or f"{b} against {a}",
            looks=looks,
        )

    @classmethod
    def between(
        cls,
        a_rows: Sequence[dict[str, Any]],
        b_rows: Sequence[dict[str, Any]],
        *,
        by: str = "scenario",
        threshold: float = 0.2,
        alpha: float = 0.05,
        title: str = "B against A",
        looks: Mapping[str, int] | None = None,
    ) -> Comparison:
        """:meth:`of` on rows already loaded; ``looks``: key -> looks of a key repeated until decided."""
        from chaosbench.analysis.baseline import groups

        diffs = compare(a_rows, b_rows, by=by, threshold=threshold, alpha=alpha, looks=looks)
        m = len(family(diffs, alpha))
        new = {k: len(v) for k, v in groups(b_rows, by).items()}
        stated = power(a_rows, new, alpha=alpha, threshold=threshold, by=by, family_size=m)
        return cls(title, diffs, threshold, alpha, m, stated, dict(looks or {}))

    @property
    def regressions(self) -> list[Difference]:
        return [d for d in self.diffs if d.regression]

    @property
    def undecided(self) -> list[Difference]:
        """Comparisons that moved the bad way beyond their noise floor which these repeats cannot decide."""
        return [d for d in self.diffs if d.status is Status.UNDECIDED]

    @property
    def notes(self) -> list[Difference]:
        """What does not fail but needs saying: the undecided comparisons, and the figures not compared with a
        reason (measured in some baseline runs and in none now)."""
        return [
            d
            for d in self.diffs
            if not d.regression and d.note and d.status in (Status.UNDECIDED, Status.NOT_COMPARED)
        ]

    def verdict(self) -> str:
        """One line: regressions, undecidable comparisons and the family they were corrected over."""
        spent = {v for v in self.looks.values() if v > 1}
        looks = (
            ""
            if not spent
            else (
                f"; {len(self.looks)} scenarios repeated until decided: their p x their "
                f"looks ({', '.join(str(v) for v in sorted(spent))})"
            )
        )
        return (
            f"{len(self.regressions)} regressions, {len(self.undecided)} comparisons undecidable with these "
            f"repeats; Holm over a family of {self.family_size} comparisons at alpha {self.alpha:g} "
            f"(the whole verdict's false-alarm rate <= {self.alpha:g}){looks}"
        )

    def markdown(self) -> str:
        pre = [self.verdict()]
        if self.power is not None:
            pre += ["", "```", *self.power.lines(), "```"]
        return markdown(self.diffs, self.title, pre)

    def junit_cases(self, suite: str) -> tuple[list[ET.Element], int, int]:
        """One testcase per comparison that was tested (in the family), failed (no longer measured) or left
        undecided: what changed, by how much, with what p (raw and Holm-adjusted), as properties and in the
        message. A regression is a failure, an undecided one skipped. Returns the cases, failures, skipped."""
        cases, failures, skipped = [], 0, 0
        for d in self.diffs:
            if not (d.in_family or d.regression or d.status is Status.UNDECIDED):
                continue
            case = ET.Element("testcase", classname=f"{suite}.baseline.{d.key}", name=d.metric, time="0")
            props = ET.SubElement(case, "properties")
            values = {
                "finding": d.status.value,
                "baseline": _text(d.a_count, d.n_a, d.a_median, d.kind),
                "now": _text(d.b_count, d.n_b, d.b_median, d.kind),
                "change": _num(d.change),
                "p": _num(d.p_worse),
                "p_holm": _num(d.p_holm),
                "family": str(self.family_size),
                "alpha": f"{self.alpha:g}",
                "baseline_noise": _num(d.noise),
                "repeats": f"{d.n_a} vs {d.n_b}",
            }
            for name, value in values.items():
                ET.SubElement(props, "property", name=name, value=value)
            if d.regression:
                failures += 1
                ET.SubElement(case, "failure", message=d.describe()[:500]).text = d.describe()
            elif d.status is Status.UNDECIDED:
                skipped += 1
                ET.SubElement(case, "skipped", message=d.describe()[:500])
            cases.append(case)
        return cases, failures, skipped


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _text(count: int | None, n: int, value: float | None, kind: str) -> str:
    if kind == "share":
        return "" if count is None else f"{count}/{n}"
    return _num(value)


class Gate:
    """The verdict on one suite's runs.

    ``metrics``: every run's metrics (SLO verdicts included); ``errors``: run directory -> reason for the runs
    the harness failed (:func:`harness_errors`); ``comparison``: against the baseline, if any; ``interrupted``:
    the harness was stopped before the suite finished; ``repeats``: one line per scenario repeated until
    decided (how many repeats ran, why it stopped), for the summary.
    """

    def __init__(
        self,
        suite: str,
        metrics: Sequence[RunMetrics],
        errors: Mapping[str, str] | None = None,
        *,
        comparison: Comparison | None = None,
        interrupted: bool = False,
        repeats: Sequence[str] = (),
    ) -> None:
        self.suite = suite
        self.repeats = list(repeats)  # per scenario repeated until decided: how many ran and why it stopped
        self.metrics = list(metrics)
        self.errors = dict(errors or {})
        self.comparison = comparison
        self.interrupted = interrupted

    @property
    def misses(self) -> list[RunMetrics]:
        """The runs that missed an SLO."""
        return [m for m in self.metrics if missed_slos(m)]

    @property
    def regressions(self) -> list[Difference]:
        return self.comparison.regressions if self.comparison is not None else []

    @property
    def notes(self) -> list[Difference]:
        return self.comparison.notes if self.comparison is not None else []

    @property
    def undecided(self) -> list[Difference]:
        return self.comparison.undecided if self.comparison is not None else []

    def exit_code(self) -> int:
        if self.interrupted or self.errors:
            return EXIT_HARNESS
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_SLO if self.misses else EXIT_OK

    # ------------------------------------------------------------------------------------------ CI outputs
    def write(
        self, suite_dir: Path, junit: str | Path | None = None, summary: str | Path | None = None
    ) -> None:
        """``baseline-comparison.md`` (when compared) and ``summary.md`` into ``suite_dir``; the JUnit XML to
        ``junit`` and the summary also to ``summary`` when given."""
        if self.comparison is not None:
            (suite_dir / COMPARISON_FILE).write_text(self.comparison.markdown())
        if junit:
            self.write_junit(Path(junit))
        text = self.summary_markdown()
        (suite_dir / SUMMARY_FILE).write_text(text)
        if summary:
            Path(summary).write_text(text)

    def write_junit(self, path: Path) -> None:
        """One testcase per run: failure = an SLO missed, error = the harness failed the run; with a comparison,
        one per baseline comparison tested (:meth:`Comparison.junit_cases`): failure = a regression, skipped =
        undecidable with these repeats."""
        cases = []
        failures = errs = 0
        for m in self.metrics:
            case = ET.Element(
                "testcase",
                classname=f"{self.suite}.{m.scenario}",
                name=f"repeat {m.repeat}",
                time=f"{m.wall_s or 0:.3f}",
            )
            props = ET.SubElement(case, "properties")
            keys = (
                "outcome",
                "verdict",
                "time_to_detect_s",
                "time_to_resume_s",
                "lost_steps",
                "fidelity",
                "run_dir",
            )
            if m.serving:
                keys = (
                    "outcome",
                    "verdict",
                    "time_to_detect_s",
                    "time_to_recover_s",
                    "failed_requests",
                    "error_budget_burn",
                    "run_dir",
                )
            for key in keys:
                ET.SubElement(props, "property", name=key, value=str(getattr(m, key)))
            err = self.errors.get(str(m.run_dir))
            missed = missed_slos(m)
            if err:
                errs += 1
                ET.SubElement(case, "error", message=err[:500]).text = err
            elif missed:
                failures += 1
                text = "\n".join(missed) + f"\nrun directory: {m.run_dir}"
                ET.SubElement(case, "failure", message="; ".join(missed)[:500]).text = text
            cases.append(case)
        skipped = 0
        if self.comparison is not None:
            extra, failed, skipped = self.comparison.junit_cases(self.suite)
            cases += extra
            failures += failed
        root = ET.Element(
            "testsuite",
            name=self.suite,
            tests=str(len(cases)),
            failures=str(failures),
            errors=str(errs),
            skipped=str(skipped),
        )
        root.extend(cases)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

    def summary_markdown(self) -> str:
        """A short Markdown summary for a CI job page: one row per run, SLO misses and regressions."""
        regressions = [d.describe() for d in self.regressions]
        lines = [f"## chaosbench: {self.suite}", ""]
        lines.append(
            f"{len(self.metrics)} runs, {len(self.misses)} missed an SLO, {len(regressions)} regressions."
        )
        lines += [
            "",
            "| run | verdict | detect (s) | resume (s) | lost steps | fidelity | SLOs |",
            "| --- | --- | ---: | ---: | ---: | --- | --- |",
        ]

        def f(v: Any) -> str:
            return "—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

        for m in self.metrics:
            slo = "—" if m.slo_ok is None else ("ok" if m.slo_ok else "MISSED: " + "; ".join(m.slo_failures))
            lines.append(
                f"| {m.scenario} #{m.repeat} | {html.escape(m.verdict or '—')} | {f(m.time_to_detect_s)} | "
                f"{f(m.time_to_resume_s)} | {f(m.lost_steps)} | {f(m.fidelity)} | {html.escape(slo)} |"
            )
        if self.comparison is not None:
            lines += ["", "### Against the baseline", "", self.comparison.verdict()]
            if self.comparison.power is not None:
                lines += ["", "```", *self.comparison.power.lines(), "```"]
        if regressions:
            lines += ["", "### Regressions against the baseline", ""] + [f"- {r}" for r in regressions]
        if self.repeats:
            lines += ["", "### Repeated until decided", ""] + [f"- {r}" for r in self.repeats]
        undecided = [d.describe() for d in self.undecided]
        if undecided:
            lines += ["", "### Undecidable with these repeats (not failed)", ""] + [
                f"- {r}" for r in undecided
            ]
        return "\n".join(lines) + "\n"
