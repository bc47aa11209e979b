"""The ``torchrun`` adapter: torch's elastic agent supervises the worker group and restarts it.

One agent (``python -m torch.distributed.run``) on one node with ``--nproc-per-node`` ranks and
``--max-restarts``. Its failure lines are the detection events and its restart decision the restart event
(see FIELD-NOTES: ``failed (exitcode: -9) local_rank: 1``, ``Worker group FAILED. 3/3 attempts left; will
restart worker group``). LOGLEVEL=INFO makes the agent print its rendezvous lines too.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    LogPattern,
    LogWatcher,
    Prediction,
    RunControl,
    chain,
    pg_timeout,
)
from chaosbench.runtimes.base import ProcessSpec

# torch.distributed.elastic's fixed grace between SIGTERM and SIGKILL when it stops a worker group
# (LocalElasticAgent shutdown_timeout / PContext.close timeout, torch 2.x).
TORCHRUN_SHUTDOWN_GRACE_S = 30.0

TORCHRUN_PATTERNS = [
    # The agent's first reaction to a failed worker: it stops the rest of the group (a WARNING line, printed
    # before the 30 s grace it gives the workers; the "failed (exitcode ...)" line comes after that grace).
    LogPattern("detect", r"Sending process (?P<pid>\d+) closing signal (?P<signal>SIG\w+)", "agent"),
    LogPattern("detect", r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)", "agent"),
    LogPattern(
        "restart",
        r"Worker group FAILED\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left; will restart",
        "agent",
    ),
    # Several agents: a node that (re)joins the rendezvous makes the running agents restart their workers too
    # (not counted against --max-restarts, but a restart of the job all the same).
    LogPattern(
        "restart",
        r"Detected (?P<waiting_nodes>\d+) new nodes from group_rank=(?P<group_rank>\d+); will restart worker group",
        "agent",
    ),
    LogPattern("give_up", r"ChildFailedError", "agent"),
]


def predict_agent_detection(mode: str, timeouts: dict[str, Any]) -> Prediction | None:
    """A torch elastic agent (torchrun, its elastic form, ft_launcher's base): it notices a worker's exit within
    its monitor interval; a hung worker only once its peers' collective times out (the process-group timeout),
    and then it SIGTERMs the stopped worker, which cannot act on it, and waits its fixed grace before SIGKILL."""
    monitor = ("monitor_interval_s", timeouts.get("monitor_interval_s"))
    if mode == "crash":
        return Prediction(*chain(monitor), note="the agent polls its workers' exits")
    if mode != "hang":
        return None
    pg_name, pg = pg_timeout(timeouts)
    bound, by = chain((pg_name, pg), monitor)
    grace = timeouts.get("worker_shutdown_grace_s")
    return Prediction(
        bound, by, resume_floor_s=bound + float(grace or 0),
        note="the peers' collective times out; the stopped worker ignores SIGTERM, so the agent waits "
        f"worker_shutdown_grace_s={grace or 0:g} before SIGKILL",
    )  # fmt: skip


def pg_timeout_problems(timeouts: dict[str, Any]) -> list[str]:
    """A hang detected only through the process-group timeout: say so when the script sets none."""
    if timeouts.get("workload_pg_timeout_s") is None:
        return ["the workload sets no process-group timeout: torch's default (1800 s for gloo, 600 s for NCCL) is "
                "how long a hung rank goes unnoticed"]  # fmt: skip
    return []


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


class TorchrunFramework(Framework):
    """torch elastic (torchrun) with ``--max-restarts``: restarts the whole local worker group."""

    name: ClassVar[str] = "torchrun"
    Options = TorchrunOptions  # type: ignore[assignment]

    def plan(self, job: JobContext) -> LaunchPlan:
        o: Any = self.options
        port = job.runtime.free_port()
        procs = []
        for n in range(job.nodes):
            node = job.node_name(n)
            argv = [
                *job.workload_argv()[:1],
                # Several agents: through the elastic adapter's launcher (torchrun unchanged; it only numbers
                # incarnations by rendezvous round, the same on every node; see frameworks/elastic.py).
                "-m", "chaosbench.frameworks.elastic" if job.nodes > 1 else "torch.distributed.run",
                "--nnodes", str(job.nodes),
                "--nproc-per-node", str(job.ranks_per_node),
                "--max-restarts", str(o.max_restarts),
                "--monitor-interval", str(o.monitor_interval_s),
                "--rdzv-backend", o.rdzv_backend,
                "--rdzv-endpoint", f"{job.runtime.master_addr}:{port}",
                "--rdzv-id", job.run_id,
                *o.extra_args,
                "--no-python",
                *job.workload_argv(),
            ]  # fmt: skip
            env = job.rank_env(0, node)
            env["LOGLEVEL"] = o.log_level
            if not o.share_rdzv_tcp_store:
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            name = "torchrun" if job.nodes == 1 else f"torchrun.{node}"
            procs.append(ProcessSpec(name=name, argv=argv, env=env, role="agent", node=node))
        return LaunchPlan(
            framework=self.label,
            adapter=self.name,
            processes=procs,
            patterns=list(TORCHRUN_PATTERNS),
            timeouts=self.timeouts(job),
            versions=self.versions(),
            options=o.model_dump(),
            notes=["worker incarnation = CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT"],
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o: Any = self.options
        t = super().timeouts(job)
        t.update(
            {
                "monitor_interval_s": o.monitor_interval_s,
                "worker_shutdown_grace_s": TORCHRUN_SHUTDOWN_GRACE_S,
                "teardown_grace_s": o.teardown_grace_s,
            }
        )
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        return predict_agent_detection(mode, timeouts)

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        return pg_timeout_problems(timeouts)

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o: Any = self.options
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        agents = [control.runtime.start(p, on_line=watcher) for p in plan.processes]
        while True:
            codes = [a.poll() for a in agents]
            if all(c == 0 for c in codes):
                return JobResult("completed")
            if all(c is not None for c in codes):
                bad = [f"{a.name} exited with code {c}" for a, c in zip(agents, codes, strict=True) if c]
                return JobResult("failed", "; ".join(bad))
            stop = control.stop_reason()
            if stop:
                return JobResult(stop, f"harness stopped the run ({stop})")
            control.sleep(min(0.05, o.monitor_interval_s))
