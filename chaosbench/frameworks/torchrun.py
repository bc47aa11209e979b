"""The ``torchrun`` adapter: torch's elastic agent supervises the worker group and restarts it.

One agent (``python -m torch.distributed.run``) on one node with ``--nproc-per-node`` ranks and
``--max-restarts``. Its failure lines are the detection events and its restart decision the restart event
(see FIELD-NOTES: ``failed (exitcode: -9) local_rank: 1``, ``Worker group FAILED. 3/3 attempts left; will
restart worker group``). LOGLEVEL=INFO makes the agent print its rendezvous lines too.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.agent import (
    TORCH_RDZV_JOIN_TIMEOUT_S,
    TORCHRUN_PATTERNS,
    AgentFramework,
    agent_argv,
    agent_env,
    rendezvous_wait,
    supervise_agents,
)
from chaosbench.frameworks.base import (
    JobContext,
    JobResult,
    LaunchPlan,
    RunControl,
)
from chaosbench.runtimes.base import ProcessSpec


class TorchrunOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_restarts: int = Field(default=3, ge=0, description="torchrun --max-restarts")
    monitor_interval_s: float = Field(default=0.1, gt=0, description="torchrun --monitor-interval")
    rdzv_backend: str = Field(default="c10d", description="torchrun --rdzv-backend")
    share_rdzv_tcp_store: bool = Field(
        default=True,
        description="torchrun's default; false sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (pytorch#135712)",
    )
    log_level: str = Field(default="INFO", description="LOGLEVEL for the agent (INFO shows rendezvous lines)")
    extra_args: list[str] = Field(default_factory=list, description="more torchrun arguments, as is")
    teardown_grace_s: float = Field(default=5.0, ge=0, description="harness teardown grace at the run's end")


class TorchrunFramework(AgentFramework[TorchrunOptions]):
    """torch elastic (torchrun) with ``--max-restarts``: restarts the whole local worker group."""

    name: ClassVar[str] = "torchrun"

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        t = super().timeouts(job)
        # the c10d rendezvous's join timeout (torchrun passes none; another backend: not known here)
        t["rdzv_join_timeout_s"] = TORCH_RDZV_JOIN_TIMEOUT_S if self.options.rdzv_backend == "c10d" else None
        return t

    def node_loss_wait(
        self, nodes: int, node: str | None, timeouts: dict[str, Any]
    ) -> tuple[str, float] | None:
        """Every round needs all ``--nnodes``: see :func:`~chaosbench.frameworks.agent.rendezvous_wait`."""
        return rendezvous_wait(nodes, node, timeouts)

    def plan(self, job: JobContext) -> LaunchPlan:
        o = self.options
        port = job.runtime.free_port()
        procs = []
        for n in range(job.nodes):
            node = job.node_name(n)
            # Several agents: through chaosbench.launchers.elastic (torchrun unchanged; it only numbers incarnations
            # by rendezvous round, the same on every node).
            launcher = ["-m", "chaosbench.launchers.elastic" if job.nodes > 1 else "torch.distributed.run"]
            rendezvous = [
                "--rdzv-backend",
                o.rdzv_backend,
                "--rdzv-endpoint",
                f"{job.runtime.master_addr}:{port}",
                "--rdzv-id",
                job.run_id,
            ]
            if o.rdzv_backend == "c10d" and job.nodes > 1:
                # node0's agent hosts the store, as on a cluster whose endpoint is node0's (on one host every agent
                # would match the endpoint and the first to bind would host it: the rendezvous-host role unknown)
                rendezvous += ["--rdzv-conf", f"is_host={'true' if n == 0 else 'false'}"]
            argv = agent_argv(
                job, launcher, str(job.nodes), o.max_restarts, o.monitor_interval_s, rendezvous, o.extra_args
            )
            env = agent_env(job, node, o.log_level, o.share_rdzv_tcp_store)
            name = "torchrun" if job.nodes == 1 else f"torchrun.{node}"
            procs.append(ProcessSpec(name=name, argv=argv, env=env, role="agent", node=node))
        return self.launch_plan(
            job,
            procs,
            TORCHRUN_PATTERNS,
            notes=["worker incarnation = CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT"],
        )

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        return supervise_agents(self.label, plan, control, self.options.monitor_interval_s)
