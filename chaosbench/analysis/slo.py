"""Service-level objectives on run metrics, and the CI outputs built on them (JUnit XML, Markdown summary).

An SLO names a metric of :class:`~chaosbench.analysis.metrics.RunMetrics` and either a bound (``{max: 30}``,
``{min: 0.5}``) or a value it must equal (``fidelity: exact``, ``detected: true``). SLOs apply to fault runs;
controls are checked only for having completed. A metric that could not be measured fails its SLO, with the
reason it is missing.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from chaosbench.analysis.metrics import RunMetrics


@dataclass
class SloResult:
    metric: str
    expected: str
    measured: Any
    ok: bool
    note: str = ""

    def describe(self) -> str:
        shown = "not measured" if self.measured is None else self.measured
        return f"{self.metric} = {shown} (want {self.expected}){': ' + self.note if self.note else ''}"


def _expected(spec: Any) -> str:
    if isinstance(spec, dict):
        parts = []
        if spec.get("min") is not None:
            parts.append(f">= {spec['min']}")
        if spec.get("max") is not None:
            parts.append(f"<= {spec['max']}")
        return " and ".join(parts)
    return f"== {json.dumps(spec)}"


def evaluate(m: RunMetrics, slos: dict[str, Any]) -> list[SloResult]:
    """Check one run against its SLOs (``slos`` as in config.json: bounds as dicts)."""
    if m.control:
        ok = m.outcome == "completed"
        return [SloResult("outcome", '== "completed"', m.outcome, ok, "" if ok else "the control run did not finish")]
    out = []
    for metric, spec in slos.items():
        value = getattr(m, metric, None)
        exp = _expected(spec)
        if value is None:
            out.append(SloResult(metric, exp, None, False, m.missing.get(metric, "not measured")))
            continue
        if isinstance(spec, dict):
            ok = (spec.get("min") is None or float(value) >= float(spec["min"])) and (
                spec.get("max") is None or float(value) <= float(spec["max"])
            )
        else:
            ok = value == spec
        out.append(SloResult(metric, exp, value, ok))
    return out


def write_junit(path: Path, suite: str, metrics: Sequence[RunMetrics], errors: dict[str, str]) -> None:
    """One testcase per run: failure = an SLO missed, error = the harness failed the run."""
    cases = []
    failures = errs = 0
    for m in metrics:
        case = ET.Element("testcase", classname=f"{suite}.{m.scenario}", name=f"repeat {m.repeat}",
                          time=f"{m.wall_s or 0:.3f}")  # fmt: skip
        props = ET.SubElement(case, "properties")
        for key in ("outcome", "verdict", "time_to_detect_s", "time_to_resume_s", "lost_steps", "fidelity",
                    "run_dir"):  # fmt: skip
            ET.SubElement(props, "property", name=key, value=str(getattr(m, key)))
        err = errors.get(str(m.run_dir))
        if err:
            errs += 1
            ET.SubElement(case, "error", message=err[:500]).text = err
        elif m.slo_ok is False:
            failures += 1
            text = "\n".join(m.slo_failures) + f"\nrun directory: {m.run_dir}"
            ET.SubElement(case, "failure", message="; ".join(m.slo_failures)[:500]).text = text
        cases.append(case)
    root = ET.Element("testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors=str(errs))
    root.extend(cases)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def summary_markdown(suite: str, metrics: Sequence[RunMetrics], regressions: Sequence[str] = ()) -> str:
    """A short Markdown summary for a CI job page: one row per run, SLO misses and regressions."""
    lines = [f"## chaosbench: {suite}", ""]
    missed = [m for m in metrics if m.slo_ok is False]
    lines.append(f"{len(metrics)} runs, {len(missed)} missed an SLO, {len(regressions)} regressions.")
    lines += ["", "| run | verdict | detect (s) | resume (s) | lost steps | fidelity | SLOs |",
              "| --- | --- | ---: | ---: | ---: | --- | --- |"]  # fmt: skip

    def f(v: Any) -> str:
        return "—" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    for m in metrics:
        slo = "—" if m.slo_ok is None else ("ok" if m.slo_ok else "MISSED: " + "; ".join(m.slo_failures))
        lines.append(f"| {m.scenario} #{m.repeat} | {html.escape(m.verdict or '—')} | {f(m.time_to_detect_s)} | "
                     f"{f(m.time_to_resume_s)} | {f(m.lost_steps)} | {f(m.fidelity)} | {html.escape(slo)} |")  # fmt: skip
    if regressions:
        lines += ["", "### Regressions against the baseline", ""] + [f"- {r}" for r in regressions]
    return "\n".join(lines) + "\n"


def results_as_dicts(results: Sequence[SloResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
