"""After a harness that died: the Slurm jobs its unfinished runs left, and the nodes they had set DOWN or DRAIN
(``chaosbench cleanup``, through
:meth:`SlurmRuntime.cleanup_crashed <chaosbench.runtimes.slurm.SlurmRuntime.cleanup_crashed>`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from chaosbench.errors import ChaosbenchError
from chaosbench.runtimes.slurm.commands import SlurmCommands, job_prefix, run_comment
from chaosbench.runtimes.slurm.node_loss import reason, resume_nodes
from chaosbench.timeline.reader import crashed_run_ids


def cleanup_stale_jobs(results_dir: Path) -> list[str]:
    """Cancel the Slurm jobs of runs below ``results_dir`` whose harness died (a timeline without ``run_end``);
    one line per job cancelled. Jobs are matched by the run's job-name prefix and comment, so only jobs this
    harness submitted are touched. No Slurm client or no cluster: nothing to do."""
    if shutil.which("squeue") is None:
        return []
    runs = {
        job_prefix(run_id) + ".": (run_id, run_dir)
        for run_id, run_dir in crashed_run_ids(results_dir).items()
    }
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


def resume_stale_nodes(results_dir: Path) -> list[str]:
    """RESUME the Slurm nodes that runs below ``results_dir`` whose harness died (a timeline without ``run_end``)
    had set DOWN or DRAIN (the ``node-kill`` fault); one line per node resumed.

    The record is the reason the fault set on the node with its state, ``chaosbench <run id>``
    (:func:`~chaosbench.runtimes.slurm.node_loss.reason`), read back from ``scontrol show node``: it is written by
    the same ``scontrol update`` that downs the node, so no kill of the harness falls between the two (the
    ``fault_inject`` event, written after, may be missing). A run id is unique (it ends in a random part), so a node
    is resumed only when one of these crashed runs set it down and its reason is still that run's; a node
    anyone else set down or changed since (another reason) is left alone. No Slurm client, no cluster, or no
    rights to resume: nothing done for that node."""
    if shutil.which("scontrol") is None:
        return []
    runs = {reason(run_id): (run_id, run_dir) for run_id, run_dir in crashed_run_ids(results_dir).items()}
    if not runs:
        return []
    slurm = SlurmCommands(os.environ, timeout_s=15)
    try:
        nodes = slurm.nodes_info()  # every node of the cluster: no partition is known here
    except (ChaosbenchError, OSError):
        return []
    actions = []
    for snode, kv in nodes.items():
        run = runs.get(kv.get("Reason", "").split(" [")[0])  # Slurm appends " [user@time]" to a reason
        if run is None:
            continue
        state = kv.get("State", "")
        with contextlib.suppress(ChaosbenchError, OSError):
            if resume_nodes(slurm, [snode], run[0]):  # checks the reason again, right before
                actions.append(f"scontrol update nodename={snode} state=RESUME (was {state}) of {run[1]}")
    return actions
