"""The ``torchrun-elastic`` adapter: one torch elastic agent per node with ``--nnodes MIN:MAX`` (c10d rendezvous).

Every node runs ``torchrun --nnodes MIN:MAX --nproc-per-node K --rdzv-backend c10d`` against one rendezvous
endpoint hosted by node0's agent (``is_host`` is set explicitly: node0 hosts, the others never do, so
losing node0 loses the rendezvous store and ends the job, as FIELD-NOTES measured). When a node is lost
(``local-node-kill`` on the local runtime, ``node-kill`` on docker) the survivors' workers fail on the dead
peer, their agents restart the worker group and re-rendezvous: after ``last_call_timeout_s`` with at least MIN
nodes the job continues with a smaller world. When a node joins later (``spares``: the adapter starts a spare
agent ``spare_delay_s`` after a node's agent died, as a scheduler would), the running agents see a waiting node
and restart again with the larger world.

A changed world size changes the training itself: the global batch (world size x per-rank batch), the data each
rank sees and, for a schedule tied to samples, the learning rate. The workload reports ``world_size`` (and
``global_batch`` where it can) in every ``rank_start``; the adapter writes a ``rendezvous`` event per agent and
completed round (``world_size``) from the agents' own lines.

Incarnations: torch elastic's ``TORCHELASTIC_RESTART_COUNT`` does not count restarts caused by membership
changes and starts at 0 on a node that joins later, so it cannot number the job's incarnations. Each agent is
therefore started through this module (``python -m chaosbench.launchers.elastic <torchrun args>``), which only
adds ``CHAOSBENCH_INCARNATION`` to the workers' environment so that the probe's incarnation equals the
rendezvous round (the same on every node, +1 per re-rendezvous); torchrun itself runs unchanged. Set
``round_incarnation: false`` to launch plain torchrun (incarnations are then the restart count).

Detection events: the agents' failure lines (as for ``torchrun``) and their restart decisions (worker failure,
or ``Detected N new nodes ... will restart worker group`` on growth).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chaosbench.frameworks.agent import (
    TORCHRUN_PATTERNS,
    AgentFramework,
    agent_argv,
    agent_env,
    rendezvous_wait,
)
from chaosbench.frameworks.base import (
    JobContext,
    JobResult,
    LaunchPlan,
    LogPattern,
    LogWatcher,
    RunControl,
    supervise_job,
)
from chaosbench.runtimes.base import ProcessSpec, ProcHandle

ELASTIC_PATTERNS = [
    # Not torchrun's "Sending process ... closing signal" detection: an elastic agent also stops its workers for a
    # membership change (a node joined), which is no failure.
    *(p for p in TORCHRUN_PATTERNS if "closing signal" not in p.regex),
    # The last line of the agent's "Rendezvous complete for workers. Result:" block (one per agent and round).
    LogPattern("rendezvous", r"\]\s+global_world_sizes=\[(?P<world_size>\d+)", "agent"),
]


class ElasticOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_nodes: int = Field(default=1, ge=1, description="--nnodes MIN:MAX, the MIN (default 1)")
    max_nodes: int | None = Field(
        default=None, ge=1, description="--nnodes MIN:MAX, the MAX (default: nodes)"
    )
    max_restarts: int = Field(default=3, ge=0, description="torchrun --max-restarts (worker failures only)")
    monitor_interval_s: float = Field(default=0.1, gt=0, description="torchrun --monitor-interval")
    last_call_timeout_s: int = Field(
        default=30, ge=0, description="rdzv last_call_timeout: wait for more nodes once MIN have joined"
    )
    join_timeout_s: int = Field(default=600, ge=1, description="rdzv join_timeout")
    close_timeout_s: int = Field(default=30, ge=1, description="rdzv close_timeout")
    keep_alive_interval_s: int = Field(
        default=5, ge=1, description="rdzv keep_alive_interval (node heartbeats)"
    )
    keep_alive_max_attempt: int = Field(default=3, ge=1, description="rdzv keep_alive_max_attempt")
    share_rdzv_tcp_store: bool = Field(
        default=True,
        description="torch's default; false sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (pytorch#135712)",
    )
    spares: int = Field(default=0, ge=0, description="spare nodes: each replaces one lost node, once")
    spare_delay_s: float = Field(
        default=5.0, ge=0, description="a lost node's agent exit to the spare's start"
    )
    round_incarnation: bool = Field(
        default=True, description="incarnation = rendezvous round (see the docstring)"
    )
    log_level: str = Field(default="INFO", description="LOGLEVEL of the agents (INFO: rendezvous lines)")
    extra_args: list[str] = Field(default_factory=list, description="more torchrun arguments, as is")
    teardown_grace_s: float = Field(default=5.0, ge=0)

    @model_validator(mode="after")
    def _range(self) -> ElasticOptions:
        if self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) < min_nodes ({self.min_nodes})")
        return self


class ElasticFramework(AgentFramework[ElasticOptions]):
    """torch elastic across nodes with a MIN:MAX node range; see the module docstring."""

    name: ClassVar[str] = "torchrun-elastic"

    def _max_nodes(self, job: JobContext) -> int:
        o = self.options
        return int(o.max_nodes or job.nodes)

    def agent_spec(self, job: JobContext, node_index: int, endpoint: str, spare: bool = False) -> ProcessSpec:
        o = self.options
        node = job.node_name(node_index)
        conf = (
            f"is_host={'true' if node_index == 0 else 'false'},last_call_timeout={o.last_call_timeout_s},"
            f"join_timeout={o.join_timeout_s},close_timeout={o.close_timeout_s},"
            f"keep_alive_interval={o.keep_alive_interval_s},keep_alive_max_attempt={o.keep_alive_max_attempt}"
        )
        launcher = (
            ["-m", "chaosbench.launchers.elastic"] if o.round_incarnation else ["-m", "torch.distributed.run"]
        )
        rendezvous = [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            job.run_id,
            "--rdzv-conf",
            conf,
        ]
        argv = agent_argv(
            job,
            launcher,
            f"{o.min_nodes}:{self._max_nodes(job)}",
            o.max_restarts,
            o.monitor_interval_s,
            rendezvous,
            o.extra_args,
        )
        env = agent_env(job, node, o.log_level, o.share_rdzv_tcp_store)
        name = f"torchrun.{node}" + (".spare" if spare else "")
        return ProcessSpec(name=name, argv=argv, env=env, role="agent", node=node)

    def plan(self, job: JobContext) -> LaunchPlan:
        o = self.options
        max_nodes = self._max_nodes(job)
        if job.nodes > max_nodes or job.nodes < o.min_nodes:
            from chaosbench.errors import SpecError

            raise SpecError(
                f"workload.nodes ({job.nodes}) is outside --nnodes {o.min_nodes}:{max_nodes}",
                obj="torchrun-elastic",
            )
        endpoint = f"{job.runtime.master_addr}:{job.runtime.free_port()}"
        procs = [self.agent_spec(job, n, endpoint) for n in range(job.nodes)]
        return self.launch_plan(
            job,
            procs,
            ELASTIC_PATTERNS,
            options={**o.model_dump(), "nnodes": f"{o.min_nodes}:{max_nodes}", "rdzv_endpoint": endpoint},
            notes=[
                f"{job.nodes} agents x {job.ranks_per_node} ranks, --nnodes {o.min_nodes}:{max_nodes}; node0 hosts "
                "the rendezvous",
                "incarnation = rendezvous round"
                if o.round_incarnation
                else "incarnation = TORCHELASTIC_RESTART_COUNT",
                f"{o.spares} spare node(s), started {o.spare_delay_s} s after a node's agent dies",
            ],
        )

    def node_loss_wait(
        self, nodes: int, node: str | None, timeouts: dict[str, Any]
    ) -> tuple[str, float] | None:
        """Without a spare, a round needs ``min_nodes``: when the nodes left are fewer, it waits for the lost one
        (:func:`~chaosbench.frameworks.agent.rendezvous_wait`)."""
        o = self.options
        return None if o.spares or nodes - 1 >= o.min_nodes else rendezvous_wait(nodes, node, timeouts)

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        t.update(
            {
                "rdzv_last_call_timeout_s": float(o.last_call_timeout_s),
                "rdzv_join_timeout_s": float(o.join_timeout_s),
                "rdzv_close_timeout_s": float(o.close_timeout_s),
                "rdzv_keep_alive_interval_s": float(o.keep_alive_interval_s),
                "rdzv_dead_node_timeout_s": float(o.keep_alive_interval_s * o.keep_alive_max_attempt),
                "spare_delay_s": o.spare_delay_s,
            }
        )
        return t

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o = self.options
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        endpoint = str(plan.options["rdzv_endpoint"])
        # All agents at once: the first round closes last_call_timeout_s after MIN nodes joined, and a node that
        # joins later forces a second round right away. Non-hosts retry connecting until node0 listens.
        agents: list[ProcHandle] = [control.runtime.start(p, on_line=watcher) for p in plan.processes]
        spares_left = o.spares
        next_node = job.nodes
        lost: set[str] = set()
        pending: list[float] = []  # monotonic times at which a spare starts

        def step() -> JobResult | None:
            nonlocal spares_left, next_node
            for a in agents:
                rc = a.poll()
                if rc is not None and rc < 0 and a.name not in lost:
                    lost.add(a.name)  # killed by a signal: the node is gone
                    if spares_left > 0:
                        spares_left -= 1
                        pending.append(time.monotonic() + o.spare_delay_s)
            now = time.monotonic()
            for due in [d for d in pending if d <= now]:
                pending.remove(due)
                spec = self.agent_spec(job, next_node, endpoint, spare=True)
                next_node += 1
                agents.append(control.runtime.start(spec, on_line=watcher))
            codes = [a.poll() for a in agents]
            if all(c is not None for c in codes) and not pending:
                ok = [a for a, c in zip(agents, codes, strict=True) if c == 0]
                bad = [
                    f"{a.name} exited with code {c}"
                    for a, c in zip(agents, codes, strict=True)
                    if c and a.name not in lost
                ]
                if ok and not bad:
                    return JobResult("completed")
                reason = "; ".join(bad) or "every node was lost"
                return JobResult("gave_up" if any(c and c > 0 for c in codes) else "failed", reason)
            return None

        # a spare's start is due at a time, not at an exit: the interval bounds how late it starts
        return supervise_job(control, step, min(0.05, o.monitor_interval_s))
