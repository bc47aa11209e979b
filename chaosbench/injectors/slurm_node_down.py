"""``slurm-node-down``: lose a node of a Slurm cluster, the way the scheduler sees a lost node.

Targets are nodes (``target: {node: node1}``, or a rank, whose node is used): the workload node is mapped to
the Slurm node it runs on now (the ``slurm`` runtime's mapping, or the node of the run's batch job).

Inject:

1. Refuse a node that is not ours to break: it must run a job of this run, and (unless
   ``allow_foreign_jobs``) no job of anyone else, since downing a node ends every job on it.
2. With ``kill_tasks``: SIGKILL every process of this run's jobs on the node (``scontrol listpids`` through an
   extra job step on the node), so they die at once as on a crashed host, not after Slurm's SIGTERM and
   ``KillWait``.
3. ``scontrol update nodename=X state=DOWN|DRAIN reason="chaosbench <run id>"``. A DOWN node ends its jobs
   (``NODE_FAIL``; a batch job submitted with ``--requeue`` goes back to the queue by itself, held for the
   cluster's requeue hold); a DRAIN node keeps running jobs but takes no new ones.

Revert (after ``duration_s``, at the end of the run, or when the harness is interrupted):
``state=RESUME``, only while the node's reason is still the one we set (an operator's later reason wins).
Idempotent. The node's state before and after is in the ``fault_inject`` details.

Defaults: ``state: down`` with ``kill_tasks: false`` (the scheduler's own node-failure handling is what is
measured); ``state: drain`` kills the run's tasks by default (a drained node does not stop them).
Requires the ``slurm`` runtime; on any other the run fails before launch.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import ChaosbenchError, Unsupported
from chaosbench.injectors.base import FaultContext, Injector, RunSetup
from chaosbench.runtimes.base import Runtime

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


def slurm_runtime(runtime: Runtime, fault: str) -> Any:
    from chaosbench.runtimes.slurm import SlurmRuntime

    if not isinstance(runtime, SlurmRuntime):
        raise Unsupported(f"{fault} needs the slurm runtime, not '{runtime.name}'")
    return runtime


class SlurmNodeDownParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["down", "drain"] = Field(default="down", description="the state the node is put in")
    kill_tasks: bool | None = Field(
        default=None, description="SIGKILL the run's processes on the node first (default: only for drain)"
    )
    duration_s: float | None = Field(default=None, gt=0, description="seconds until RESUME; null: run end")
    allow_foreign_jobs: bool = Field(
        default=False, description="down the node even when jobs of others run there (they end too)"
    )


class SlurmNodeDownInjector(Injector):
    """Downs (or drains) the Slurm node a target rank runs on; revert resumes it."""

    name: ClassVar[str] = "slurm-node-down"
    failure_mode = "crash"  # type: ignore[assignment]
    summary: ClassVar[str] = "scontrol update state=DOWN|DRAIN of a rank's Slurm node (and kill its tasks)"
    Params = SlurmNodeDownParams  # type: ignore[assignment]

    @property
    def duration_s(self) -> float | None:
        return self.params.duration_s  # type: ignore[attr-defined, no-any-return]

    def prepare(self, setup: RunSetup) -> None:
        slurm_runtime(setup.runtime, self.name)
        self._run_id = setup.run_id

    def _reason(self, ctx: FaultContext) -> str:
        return f"chaosbench {ctx.setup.run_id}"

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        p: Any = self.params
        rt = slurm_runtime(ctx.runtime, self.name)
        nodes: list[str] = []
        for t in ctx.targets:
            snode = rt.slurm_node_now(t.node)
            if snode not in nodes:
                nodes.append(snode)
        details: dict[str, Any] = {"slurm_nodes": nodes, "state": p.state, "killed": {}, "before": {}}
        for snode in nodes:
            ours = rt.slurm.jobs_on(snode)
            if not ours:
                raise ChaosbenchError(f"Slurm node {snode} runs no job of this run; not touching it")
            foreign = rt.slurm.foreign_jobs_on(snode)
            if foreign and not p.allow_foreign_jobs:
                raise ChaosbenchError(
                    f"Slurm node {snode} also runs jobs of others ({foreign}); not touching it"
                )
            details["before"][snode] = rt.slurm.node_state(snode)[1]
        kill = p.kill_tasks if p.kill_tasks is not None else p.state == "drain"
        for snode in nodes:
            if kill:
                details["killed"][snode] = self._kill_tasks(rt, snode)
            rt.slurm.command(
                [
                    "scontrol",
                    "update",
                    f"nodename={snode}",
                    f"state={p.state.upper()}",
                    f"reason={self._reason(ctx)}",
                ]
            )
            ctx.state.setdefault("nodes", []).append(snode)
        details["after"] = {n: rt.slurm.node_state(n)[1] for n in nodes}
        return details

    @staticmethod
    def _kill_tasks(rt: Any, snode: str) -> list[int]:
        jobs = sorted(rt.slurm.jobs_on(snode))
        if not jobs:
            return []
        argv = [
            "srun",
            "-Q",
            f"--jobid={jobs[-1]}",
            "--overlap",
            "-w",
            snode,
            "-N1",
            "-n1",
            "--export=ALL,CHAOSBENCH_KILL_HELPER=1",
            "sh",
            "-c",
            _KILL_TASKS,
            "sh",
            snode,
            *[str(j) for j in jobs],
        ]
        out = rt.slurm.command(argv, check=False)
        return [int(x) for x in out.split()[:-1] if x.isdigit()]

    def revert(self, ctx: FaultContext) -> bool:
        rt = slurm_runtime(ctx.runtime, self.name)
        undone = False
        for snode in ctx.state.pop("nodes", []):
            kv = rt.slurm.nodes_info([snode]).get(snode, {})
            if kv.get("Reason", "").split(" [")[0] != self._reason(ctx):
                continue  # someone else changed the node since: leave it to them
            with contextlib.suppress(ChaosbenchError):
                rt.slurm.command(["scontrol", "update", f"nodename={snode}", "state=RESUME"])
                undone = True
        return undone
