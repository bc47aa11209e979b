"""Where a suite's results lie on disk: the one place that knows the layout.

    <out>/<suite>/                       SuiteDir: suite.json, results.csv/.parquet, report.md/.html, plots/
    <out>/<suite>/<framework>__<fault|control>/<repeat>/
                                         RunDir: config.json (resolved scenario and launch plan), events.jsonl,
                                         logs/ (stdout/stderr of every process), checkpoints/, work/ (a command
                                         workload's working directory), metrics.json

Everything a report shows can be recomputed from the run directories (``chaosbench report``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def dirname(scenario_id: str) -> str:
    """A scenario's directory name: ``restart/kill-rank1`` -> ``restart__kill-rank1``."""
    return scenario_id.replace("/", "__")


class RunDir:
    """One run's directory."""

    CONFIG = "config.json"
    EVENTS = "events.jsonl"
    METRICS = "metrics.json"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, suite_dir: str | Path, scenario: Any) -> RunDir:
        """The run of a :class:`chaosbench.specs.Scenario` (its ``id`` and ``repeat``)."""
        return cls.at(suite_dir, scenario.id, scenario.repeat)

    @classmethod
    def at(cls, suite_dir: str | Path, scenario_id: str, repeat: int) -> RunDir:
        """The run of scenario ``framework/fault`` (or ``framework/control``), repeat ``repeat``."""
        return cls(Path(suite_dir) / dirname(scenario_id) / str(repeat))

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def events(self) -> Path:
        return self.path / self.EVENTS

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def work(self) -> Path:
        """A command workload's working directory (fresh per run, shared by its ranks and restarts)."""
        return self.path / "work"

    def read_config(self) -> dict[str, Any]:
        return dict(json.loads(self.config.read_text()))


class SuiteDir:
    """A suite's results directory."""

    MARKER = "suite.json"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def marker(self) -> Path:
        return self.path / self.MARKER

    def runs(self) -> list[RunDir]:
        """Run directories below the suite directory (those with a config.json), in a stable order."""
        return [RunDir(p.parent) for p in sorted(self.path.glob(f"*/*/{RunDir.CONFIG}"))]

    def definition(self) -> dict[str, Any] | None:
        """The suite's own definition as it ran (``suite.json``), when readable."""
        try:
            return dict(json.loads(self.marker.read_text()).get("definition") or {}) or None
        except (OSError, ValueError):
            return None
