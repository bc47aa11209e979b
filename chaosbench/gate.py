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
reads it. A regression is as :func:`chaosbench.analysis.baseline.compare` defines it.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

from chaosbench.analysis.baseline import Difference, compare, load_rows, markdown

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
    """Result set B against result set A (``chaosbench compare A B``, or a suite against its baseline)."""

    title: str
    diffs: list[Difference]
    threshold: float

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
        or ``fault``). Raises :class:`~chaosbench.errors.ChaosbenchError` when one cannot be read."""
        diffs = compare(load_rows(a), load_rows(b), by=by, threshold=threshold, alpha=alpha)
        return cls(title or f"{b} against {a}", diffs, threshold)

    @property
    def regressions(self) -> list[Difference]:
        return [d for d in self.diffs if d.regression]

    @property
    def notes(self) -> list[Difference]:
        """Changes beyond the threshold that do not fail, with their reason (too few repeats for confidence)."""
        return [d for d in self.diffs if d.note and not d.regression and d.change is not None
                and abs(d.change) > self.threshold]  # fmt: skip

    def markdown(self) -> str:
        return markdown(self.diffs, self.title)


class Gate:
    """The verdict on one suite's runs.

    ``metrics``: every run's metrics (SLO verdicts included); ``errors``: run directory -> reason for the runs
    the harness failed (:func:`harness_errors`); ``comparison``: against the baseline, if any; ``interrupted``:
    the harness was stopped before the suite finished.
    """

    def __init__(
        self,
        suite: str,
        metrics: Sequence[RunMetrics],
        errors: Mapping[str, str] | None = None,
        *,
        comparison: Comparison | None = None,
        interrupted: bool = False,
    ) -> None:
        self.suite = suite
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

    def exit_code(self) -> int:
        if self.interrupted or self.errors:
            return EXIT_HARNESS
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_SLO if self.misses else EXIT_OK

    # ------------------------------------------------------------------------------------------ CI outputs
    def write(self, suite_dir: Path, junit: str | Path | None = None, summary: str | Path | None = None) -> None:
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
        """One testcase per run: failure = an SLO missed, error = the harness failed the run."""
        cases = []
        failures = errs = 0
        for m in self.metrics:
            case = ET.Element("testcase", classname=f"{self.suite}.{m.scenario}", name=f"repeat {m.repeat}",
                              time=f"{m.wall_s or 0:.3f}")  # fmt: skip
            props = ET.SubElement(case, "properties")
            keys = ("outcome", "verdict", "time_to_detect_s", "time_to_resume_s", "lost_steps", "fidelity", "run_dir")
            if m.serving:
                keys = ("outcome", "verdict", "time_to_detect_s", "time_to_recover_s", "failed_requests",
                        "error_budget_burn", "run_dir")  # fmt: skip
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
        root = ET.Element("testsuite", name=self.suite, tests=str(len(cases)), failures=str(failures),
                          errors=str(errs))  # fmt: skip
        root.extend(cases)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

    def summary_markdown(self) -> str:
        """A short Markdown summary for a CI job page: one row per run, SLO misses and regressions."""
        regressions = [d.describe() for d in self.regressions]
        lines = [f"## chaosbench: {self.suite}", ""]
        lines.append(f"{len(self.metrics)} runs, {len(self.misses)} missed an SLO, {len(regressions)} regressions.")
        lines += ["", "| run | verdict | detect (s) | resume (s) | lost steps | fidelity | SLOs |",
                  "| --- | --- | ---: | ---: | ---: | --- | --- |"]  # fmt: skip

        def f(v: Any) -> str:
            return "—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

        for m in self.metrics:
            slo = "—" if m.slo_ok is None else ("ok" if m.slo_ok else "MISSED: " + "; ".join(m.slo_failures))
            lines.append(f"| {m.scenario} #{m.repeat} | {html.escape(m.verdict or '—')} | {f(m.time_to_detect_s)} | "
                         f"{f(m.time_to_resume_s)} | {f(m.lost_steps)} | {f(m.fidelity)} | {html.escape(slo)} |")  # fmt: skip
        if regressions:
            lines += ["", "### Regressions against the baseline", ""] + [f"- {r}" for r in regressions]
        return "\n".join(lines) + "\n"
