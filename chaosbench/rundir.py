"""Where a suite's results lie on disk: the one place that knows the layout.

    <out>/<suite>/                       SuiteDir: suite.json, results.csv/.parquet, report.md/.html, plots/
    <out>/<suite>/<framework>__<fault|control>/<repeat>/
                                         RunDir: config.json (resolved scenario and launch plan), events.jsonl,
                                         logs/ (stdout/stderr of every process), checkpoints/, work/ (a command
                                         workload's working directory), metrics.json, timeline.png,
                                         checkpoints.json (names and sizes of its checkpoint files), and last,
                                         result.json: the run has ended (a run without it is unfinished)

Everything a report shows can be recomputed from the run directories (``chaosbench report``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def replace_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Make ``path`` whole or not at all: ``write`` fills a temporary file beside it (given its path; what it
    returns is ignored), which is flushed to disk and renamed over ``path``; a reader, or a harness killed
    halfway, sees the old file or the whole new one, never a part. On any failure the temporary file goes and
    the error propagates."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes it private; results are as readable as any file here
        os.close(fd)
        write(tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`replace_atomic`)."""
    return replace_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def dirname(scenario_id: str) -> str:
    """A scenario's directory name: ``restart/kill-rank1`` -> ``restart__kill-rank1``."""
    return scenario_id.replace("/", "__")


class RunDir:
    """One run's directory."""

    CONFIG = "config.json"
    EVENTS = "events.jsonl"
    METRICS = "metrics.json"
    RESULT = "result.json"
    CHECKPOINT_LIST = "checkpoints.json"
    TIMELINE_PNG = "timeline.png"

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
    def ckpt_backing(self) -> Path:
        """Where the checkpoint files really lie while a FUSE filesystem (stall-fs) serves them at checkpoints/."""
        return self.path / "ckpt-backing"

    def checkpoint_dirs(self) -> list[Path]:
        """The directories holding the run's checkpoint files."""
        return [d for d in (self.checkpoints, self.ckpt_backing) if d.is_dir()]

    @property
    def work(self) -> Path:
        """A command workload's working directory (fresh per run, shared by its ranks and restarts)."""
        return self.path / "work"

    @property
    def result(self) -> Path:
        return self.path / self.RESULT

    @property
    def checkpoint_list(self) -> Path:
        return self.path / self.CHECKPOINT_LIST

    def read_config(self) -> dict[str, Any]:
        return dict(json.loads(self.config.read_text()))

    def read_result(self) -> dict[str, Any] | None:
        """The run's ``result.json`` (written last, atomically, when it ended), or None: the run is unfinished
        (or its result unreadable, which counts the same: it is run again on ``--resume``)."""
        try:
            data = json.loads(self.result.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("status") else None


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
