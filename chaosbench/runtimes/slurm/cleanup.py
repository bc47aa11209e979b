"""After a harness that died: the Slurm jobs its unfinished runs left (``chaosbench cleanup``, through
:meth:`SlurmRuntime.cleanup_crashed <chaosbench.runtimes.slurm.SlurmRuntime.cleanup_crashed>`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from chaosbench.errors import ChaosbenchError
from chaosbench.runtimes.slurm.commands import SlurmCommands, job_prefix, run_comment
from chaosbench.timeline.reader import crashed_run_ids


def cleanup_stale_jobs(results_dir: Path) -> list[str]:
    """Cancel the Slurm jobs of runs below ``results_dir`` whose harness died (a timeline without ``run_end``);
    one line per job cancelled. Jobs are matched by the run's job-name prefix and comment, so only jobs this
    harness submitted are touched. No Slurm client or no cluster: nothing to do."""
    if shutil.which("squeue") is None:
        return []
    runs = {job_prefix(run_id) + ".": (run_id, run_dir) for run_id, run_dir in crashed_run_ids(results_dir).items()}
    if not runs:
        return []
    slurm = SlurmCommands(os.environ, timeout_s=15)
    try:
        out = slurm.command(["squeue", "-h", "-o", "%i|%j|%k"], check=False)
    except (ChaosbenchError, OSError):
        return []
    actions = []
    for line in out.splitlines():
        jid, _, rest = line.partition("|")
        name, _, comment = rest.partition("|")
        run = next((r for p, r in runs.items() if name.startswith(p)), None)
        if run is None or comment != run_comment(run[0]):
            continue  # not a job of that run: named like one, but not submitted by it
        owner = run[1]
        if jid.isdigit():
            with contextlib.suppress(ChaosbenchError, OSError):
                slurm.scancel([int(jid)])
            actions.append(f"scancel Slurm job {jid} ({name}) of {owner}")
    return actions
