"""Service-level objectives on run metrics. The CI outputs built on them (JUnit XML, Markdown summary, the exit
code) are the gate's: :mod:`chaosbench.gate`.

An SLO names a metric of :class:`~chaosbench.analysis.metrics.RunMetrics` and either a bound (``{max: 30}``,
``{min: 0.5}``) or a value it must equal (``fidelity: exact``, ``detected: true``). SLOs apply to fault runs;
controls are checked only for having completed. A metric that could not be measured fails its SLO, with the
reason it is missing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
        return [
            SloResult(
                "outcome", '== "completed"', m.outcome, ok, "" if ok else "the control run did not finish"
            )
        ]
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


def results_as_dicts(results: Sequence[SloResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
