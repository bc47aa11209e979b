"""What a run leaves for its suite: its :class:`RunRecord` (with the :class:`CleanupFailure` of each cleanup that
raised, and the :class:`SuiteHalt` they may cause), its checkpoints listed and kept or deleted
(:func:`retain_checkpoints`), and, read back from its ``result.json``, the record of a run an earlier harness
finished (:func:`finished_record`, ``--resume``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from chaosbench.analysis.metrics import RunMetrics
from chaosbench.frameworks.base import JobResult
from chaosbench.rundir import RunDir, write_atomic
from chaosbench.specs import Scenario


@dataclass(frozen=True)
class CleanupFailure:
    """A cleanup of a run that raised: ``step`` names it (``runtime cleanup``, ``fault 'kill' cleanup``,
    ``fault 'kill' controller``, ``checkpoint watcher``, ``leftover check``, ...), ``error`` is the one line it
    raised (``RuntimeError: the engine went away``)."""

    step: str
    error: str

    def describe(self) -> str:
        return f"{self.step}: {self.error}"


@dataclass(frozen=True)
class SuiteHalt:
    """Why a suite stopped before its end (:attr:`Runner.halted`): run ``label`` (in ``run_dir``) failed the
    cleanups ``failures``, and after them ``left`` may still be running (pids, containers, networks, jobs, or
    whatever the runtime could not list), which the next run could collide with. Finished runs are kept."""

    label: str
    run_dir: Path
    failures: list[CleanupFailure]
    left: list[str]

    def describe(self) -> str:
        """One line: what failed, what may be left, what to do."""
        return (
            f"suite stopped after run {self.label}: its cleanup failed "
            f"({'; '.join(f.describe() for f in self.failures)}) and may have left {', '.join(self.left)} "
            f"running; finished runs are kept (chaosbench cleanup {self.run_dir.parent.parent}, then "
            "--resume, runs the rest)"
        )


@dataclass
class RunRecord:
    """One run of the suite as the runner keeps it: its scenario, directory and result, its metrics once
    computed, the pids the runtime still listed after its teardown (``leftovers``)."""

    scenario: Scenario
    run_dir: Path
    result: JobResult
    metrics: RunMetrics | None = None
    leftovers: list[int] = field(default_factory=list)
    index: int = 0  # 1-based place in the suite's order
    #: The run's cleanups that failed (each also named in ``result.reason``).
    cleanup_failures: list[CleanupFailure] = field(default_factory=list)


def retain_checkpoints(rd: RunDir, m: RunMetrics, policy: str) -> bool:
    """Record the run's checkpoint files (names, sizes) in ``checkpoints.json``, then delete them unless the
    suite's ``keep_checkpoints`` ``policy`` keeps them (``all``; ``failed``: runs that did not recover or
    diverged). Whether they were kept."""
    files = sorted(p for d in rd.checkpoint_dirs() for p in d.rglob("*") if p.is_file())
    listing = [{"path": str(p.relative_to(rd.path)), "bytes": p.stat().st_size} for p in files]
    failed = m.outcome not in ("completed", "recovered", "outlasted") or m.fidelity == "diverged"
    keep = policy == "all" or (policy == "failed" and failed)
    write_atomic(
        rd.checkpoint_list,
        json.dumps(
            {
                "policy": policy,
                "kept": keep,
                "files": len(listing),
                "bytes": sum(f["bytes"] for f in listing),
                "checkpoints": listing,
            },
            indent=2,
        ),
    )
    if not keep:
        for d in rd.checkpoint_dirs():
            shutil.rmtree(d, ignore_errors=True)
    return keep


def finished_record(suite_dir: Path, sc: Scenario) -> RunRecord | None:
    """The record of a run of ``sc`` an earlier harness finished (its ``result.json``, and its metrics
    readable), or None: run it (again)."""
    rd = RunDir.of(suite_dir, sc)
    res = rd.read_result()
    if res is None or res["status"] == "interrupted":
        return None
    rec = RunRecord(
        sc,
        rd.path,
        JobResult(res["status"], res.get("reason") or ""),
        leftovers=list(res.get("leftover_pids") or []),
    )
    try:
        rec.metrics = RunMetrics.from_dict(json.loads(rd.metrics.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return rec
