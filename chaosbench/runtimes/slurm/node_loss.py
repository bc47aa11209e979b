"""Losing a node of a Slurm cluster the way the scheduler sees a lost node (the ``node-kill`` fault on the
``slurm`` runtime, also spelled ``slurm-node-down``), and bringing it back.

Lose (:func:`down_nodes`, on the Slurm nodes the workload nodes run on now):

1. Refuse a node that is not ours to break: it must run a job of this run
   (:meth:`~chaosbench.runtimes.slurm.commands.SlurmCommands.our_jobs_on`: named and commented as this run's
   jobs are), and (unless ``allow_foreign_jobs``) no job of anyone else, since downing a node ends every job
   on it. Every node is checked before any is touched.
2. With ``kill_tasks``: SIGKILL every process of this run's jobs on the node (``scontrol listpids`` through an
   extra job step on the node), so they die at once as on a crashed host, not after Slurm's SIGTERM and
   ``KillWait``.
3. ``scontrol update nodename=X state=DOWN|DRAIN reason="chaosbench <run id>"``. A DOWN node ends its jobs
   (``NODE_FAIL``; a batch job submitted with ``--requeue`` goes back to the queue by itself, held for the
   cluster's requeue hold); a DRAIN node keeps running jobs but takes no new ones.

Restore (:func:`resume_nodes`): ``state=RESUME``, only while the node's reason is still the one we set (an
operator's later reason wins). Idempotent.

Defaults: ``state: down`` with ``kill_tasks: false`` (the scheduler's own node-failure handling is what is
measured); ``state: drain`` kills the run's tasks by default (a drained node does not stop them). Needs Slurm
operator rights (``scontrol update`` on nodes).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import ChaosbenchError, ForeignTarget
from chaosbench.runtimes.slurm.commands import SlurmCommands

# Kills every pid of the given jobs on the node: $1 node, then job ids. Prints the node's clock afterwards.
_KILL_TASKS = r"""
node=$1; shift
me=$$
for j in "$@"; do
    scontrol listpids "$j" "$node" 2>/dev/null | awk 'NR > 1 {print $1}'
done | while read -r pid; do
    [ "$pid" = "$me" ] && continue
    # not this helper's own step (it is in one of the jobs too)
    case "$(tr '\0' ' ' < /proc/$pid/environ 2>/dev/null)" in *CHAOSBENCH_KILL_HELPER=1*) continue ;; esac
    kill -KILL "$pid" 2>/dev/null && echo "$pid"
done
date +%s%N
"""


class SlurmNodeLossOptions(BaseModel):
    """How the slurm runtime loses a node (``node-kill`` / ``slurm-node-down``)."""

    model_config = ConfigDict(extra="forbid")
    state: Literal["down", "drain"] = Field(default="down", description="the state the node is put in")
    kill_tasks: bool | None = Field(
        default=None, description="SIGKILL the run's processes on the node first (default: only for drain)"
    )
    allow_foreign_jobs: bool = Field(
        default=False, description="down the node even when jobs of others run there (they end too)"
    )


def reason(run_id: str) -> str:
    """The reason set on a node this run took down; the node is resumed only while it is still this."""
    return f"chaosbench {run_id}"


def down_nodes(
    slurm: SlurmCommands, snodes: list[str], options: SlurmNodeLossOptions, run_id: str, restorable: list[str]
) -> dict[str, Any]:
    """Take the Slurm nodes ``snodes`` down (or drain them), killing the run's tasks there first when asked;
    appends each node to ``restorable`` once its state is set. Details: ``slurm_nodes``, ``state``, ``killed``
    (node -> pids), ``before`` and ``after`` (node -> Slurm's state spelling). Raises ChaosbenchError, touching
    nothing, when a node runs no job of this run or (without ``allow_foreign_jobs``) jobs of others."""
    details: dict[str, Any] = {
        "slurm_nodes": list(snodes),
        "state": options.state,
        "killed": {},
        "before": {},
    }
    for snode in snodes:
        slurm.our_jobs_on(snode, "touching it")
        foreign = slurm.foreign_jobs_on(snode)
        if foreign and not options.allow_foreign_jobs:
            raise ForeignTarget(f"Slurm node {snode}", f"also runs jobs of others ({foreign})", "touching it")
        details["before"][snode] = slurm.node_state(snode)[1]
    kill = options.kill_tasks if options.kill_tasks is not None else options.state == "drain"
    for snode in snodes:
        if kill:
            details["killed"][snode] = kill_tasks(slurm, snode)
        slurm.command(
            [
                "scontrol",
                "update",
                f"nodename={snode}",
                f"state={options.state.upper()}",
                f"reason={reason(run_id)}",
            ]
        )
        restorable.append(snode)
    details["after"] = {n: slurm.node_state(n)[1] for n in snodes}
    return details


def kill_tasks(slurm: SlurmCommands, snode: str) -> list[int]:
    """SIGKILL every process of this run's jobs on ``snode``, from an extra step of one of them; the pids.
    Refused (ChaosbenchError) when no job of this run runs there."""
    jobs = slurm.our_jobs_on(snode, "killing its tasks")
    argv = slurm.helper_step(snode, jobs, _KILL_TASKS, [], "--export=ALL,CHAOSBENCH_KILL_HELPER=1")
    out = slurm.command(argv, check=False)
    return [int(x) for x in out.split()[:-1] if x.isdigit()]


def resume_nodes(slurm: SlurmCommands, snodes: list[str], run_id: str) -> bool:
    """``state=RESUME`` of each node whose reason is still this run's (someone who changed it since keeps it);
    returns whether any was resumed."""
    undone = False
    for snode in snodes:
        kv = slurm.nodes_info([snode]).get(snode, {})
        if kv.get("Reason", "").split(" [")[0] != reason(run_id):
            continue  # someone else changed the node since: leave it to them
        with contextlib.suppress(ChaosbenchError):
            slurm.command(["scontrol", "update", f"nodename={snode}", "state=RESUME"])
            undone = True
    return undone
