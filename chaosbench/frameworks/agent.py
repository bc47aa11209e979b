"""What every launch through a torch elastic agent shares: ``torchrun`` (one agent, or several with
``chaosbench.launchers.elastic``), ``torchrun-elastic``, ``nvrx`` (ft_launcher is torchrun's agent plus rank
monitors) and ``torchft`` (one torchrun per replica group): the agent's command line and environment, the log
lines that mean a detection, a restart or giving up, and when the agent can detect a fault."""

from __future__ import annotations

from typing import Any, ClassVar

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    LogPattern,
    LogWatcher,
    O,
    Prediction,
    RunControl,
    chain,
    pg_timeout,
    supervise_job,
)
from chaosbench.injectors.base import Role

# torch.distributed.elastic's fixed grace between SIGTERM and SIGKILL when it stops a worker group
# (LocalElasticAgent shutdown_timeout / PContext.close timeout, torch 2.x).
TORCHRUN_SHUTDOWN_GRACE_S = 30.0
# torch.distributed.elastic's c10d rendezvous: how long a round waits for its nodes to join (DynamicRendezvousHandler
# _DEFAULT_TIMEOUTS["join"], torch 2.x), when the launcher passes no join_timeout
TORCH_RDZV_JOIN_TIMEOUT_S = 600.0

TORCHRUN_PATTERNS = [
    # The agent's first reaction to a failed worker: it stops the rest of the group (a WARNING line, printed
    # before the 30 s grace it gives the workers; the "failed (exitcode ...)" line comes after that grace).
    LogPattern(
        "detect", r"Sending process (?P<pid>\d+) closing signal (?P<signal>SIG\w+)", "agent", via="exit"
    ),
    LogPattern(
        "detect",
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)",
        "agent",
        via="exit",
    ),
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
    and then it SIGTERMs the stopped worker, which cannot act on it, and waits its fixed grace before SIGKILL (a
    stalled one, alive, dies of the SIGTERM at once)."""
    monitor = ("monitor_interval_s", timeouts.get("monitor_interval_s"))
    if mode == "crash":
        return Prediction(*chain(monitor), note="the agent polls its workers' exits")
    if mode not in ("hang", "stall"):
        return None
    pg_name, pg = pg_timeout(timeouts)
    bound, by = chain((pg_name, pg), monitor)
    if mode == "stall":
        return Prediction(
            bound,
            by,
            note="the peers' collective times out; the stalled worker, alive, dies of the agent's SIGTERM",
        )
    grace = timeouts.get("worker_shutdown_grace_s")
    return Prediction(
        bound,
        by,
        resume_floor_s=bound + float(grace or 0),
        note="the peers' collective times out; the stopped worker ignores SIGTERM, so the agent waits "
        f"worker_shutdown_grace_s={grace or 0:g} before SIGKILL",
    )


def rendezvous_wait(nodes: int, node: str | None, timeouts: dict[str, Any]) -> tuple[str, float] | None:
    """A fixed-size rendezvous hosted by node0's agent (torchrun, ft_launcher, torchrun-elastic at its minimum)
    after ``node`` is lost: the agents left wait in their next round for it until ``rdzv_join_timeout_s``; the
    loss of node0, the store host, ends the rendezvous for all at once instead (None, as for a node picked at
    random)."""
    join = timeouts.get("rdzv_join_timeout_s")
    known = node is not None and node.startswith("node") and node[4:].isdigit() and int(node[4:]) > 0
    if nodes < 2 or not known or not isinstance(join, (int, float)):
        return None
    return ("rdzv_join_timeout_s", float(join))


def pg_timeout_problems(timeouts: dict[str, Any]) -> list[str]:
    """A hang detected only through the process-group timeout: say so when the script sets none."""
    if timeouts.get("workload_pg_timeout_s") is None:
        return [
            "the workload sets no process-group timeout: torch's default (1800 s for gloo, 600 s for NCCL) is "
            "how long a hung rank goes unnoticed"
        ]
    return []


def agent_argv(
    job: JobContext,
    launcher: list[str],
    nnodes: str,
    max_restarts: int,
    monitor_interval_s: float,
    rendezvous: list[str],
    extra: list[str],
    rank_wrapper: list[str] | None = None,
    nproc_per_node: int | None = None,
) -> list[str]:
    """``python <launcher> --nnodes ... --no-python [rank_wrapper] <workload argv>``: ``launcher`` is e.g.
    ``["-m", "torch.distributed.run"]``; ``rendezvous`` the endpoint arguments (``--rdzv-*`` or
    ``--master-addr/--master-port``); ``extra`` the launcher's own options and the user's ``extra_args``;
    ``nproc_per_node`` defaults to the job's ranks per node."""
    python = job.workload_argv()[0]
    return [
        python,
        *launcher,
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc_per_node or job.ranks_per_node),
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        str(monitor_interval_s),
        *rendezvous,
        *extra,
        "--no-python",
        *(rank_wrapper or []),
        *job.workload_argv(),
    ]


def agent_env(
    job: JobContext, node: str, log_level: str, share_rdzv_tcp_store: bool = True
) -> dict[str, str]:
    """The agent's environment: every rank's (the job's) plus its log level and the rendezvous store setting
    (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` when not shared: pytorch#135712)."""
    env = job.rank_env(0, node)
    env["LOGLEVEL"] = log_level
    if not share_rdzv_tcp_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def supervise_agents(
    label: str, plan: LaunchPlan, control: RunControl, monitor_interval_s: float
) -> JobResult:
    """Start the plan's agents with their log lines watched and wait: the job completed when every agent exited
    0, failed when all have exited and one did not; the harness's stop (deadline, interrupt) ends the wait."""
    watcher = LogWatcher(label, plan.patterns, control.timeline)
    agents = [control.runtime.start(p, on_line=watcher) for p in plan.processes]

    def step() -> JobResult | None:
        codes = [a.poll() for a in agents]
        if all(c == 0 for c in codes):
            return JobResult("completed")
        if all(c is not None for c in codes):
            bad = [f"{a.name} exited with code {c}" for a, c in zip(agents, codes, strict=True) if c]
            return JobResult("failed", "; ".join(bad))
        return None

    return supervise_job(control, step, min(0.05, monitor_interval_s))


#: The roles of a job started by one launcher agent per node (torchrun, ft_launcher).
AGENT_ROLES = {
    "agent": Role(
        "a launcher agent: node0's, unless the target names a node", proc_role="agent", node="node0"
    ),
    "rendezvous-host": Role(
        "node0's agent: it hosts the c10d rendezvous store (is_host set by the adapter)",
        proc_role="agent",
        node="node0",
    ),
}


class AgentFramework(Framework[O]):
    """An adapter whose ranks run under torch elastic agents: the agents' timeouts in force, and when they can
    detect a fault (see :func:`predict_agent_detection`)."""

    roles: ClassVar[dict[str, Role]] = {**Framework.roles, **AGENT_ROLES}

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        # Any: torchrun's and torchrun-elastic's options both have these fields but share no model (a common
        # base model would reorder their fields in plans and docs)
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
