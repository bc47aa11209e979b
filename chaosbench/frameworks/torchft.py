"""The ``torchft`` adapter: per-step fault tolerance with a Lighthouse and replica groups (TorchFT 0.2.0).

What it starts (all through the runtime, so every process is captured, labelled and torn down):

- one Lighthouse (``torchft_lighthouse``, the console script of the installed torchft) bound to the runtime's
  master address on a free port, with its options from this adapter (``min_replicas``, ``quorum_tick_ms``,
  ``join_timeout_ms``, ``heartbeat_timeout_ms``) and ``RUST_LOG=info`` so it prints its quorum decisions;
- G replica groups, each one ``torchrun --nproc-per-node K --max-restarts R`` on its own master port (group
  ``g`` on node ``g`` when the workload has G nodes), with ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``,
  ``TORCHFT_LIGHTHOUSE`` and torchft's timeouts (``TORCHFT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_TIMEOUT_SEC``,
  ``TORCHFT_CONNECT_TIMEOUT_SEC``) in the environment. A group's torchrun restarts its own workers; the
  restarted group heals from a live peer (HTTP transfer of the live state), the others never stop.

Ranks: the workload (``ft-mlp``) reports ``rank = group * K + group-local rank``, so ``target: {rank: 1}`` with
K = 1 is replica group 1's worker and a ``node`` target is a whole group. A user's own script (``command``) is
numbered the same by the command shim, from ``CHAOSBENCH_REPLICA_GROUP(S)`` set here; its steps are per-step
commits, and torchft's Manager lines give its skipped steps and heals (docs/recipes/torchft.md). G is ``workload.groups`` (default
``workload.nodes``); K = ranks / G.

What counts as a reaction (``detect`` events, the first after the fault is the time to detect):

- from the group's torchrun agent: its worker died (``failed (exitcode: -9) local_rank: 0``); its restart
  decision (``Worker group FAILED ... will restart``) is the ``restart`` event;
- from the Lighthouse's own lines: a new quorum with fewer replica groups than the previous one, or fewer
  replica groups heartbeating than before (a heartbeat timed out: the only signal for a hung group besides the
  process-group timeout); each new quorum is also written as a ``quorum`` event (``via: lighthouse``);
- from the workload's Manager (written by the ranks): a step that was not committed, a quorum that shrank.

The job is complete when every group's torchrun has exited 0. A group whose torchrun gave up does not stop
the others (that is TorchFT's point); the run then ends ``gave_up`` once the rest have finished.
"""

from __future__ import annotations

import re
import shutil
import socket
import threading
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import Unsupported
from chaosbench.frameworks.agent import TORCHRUN_PATTERNS, TORCHRUN_SHUTDOWN_GRACE_S, agent_argv
from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    LogWatcher,
    Prediction,
    RunControl,
    base_versions,
    chain,
    package_version,
    pg_timeout,
    supervise_job,
)
from chaosbench.injectors.base import Role
from chaosbench.launchers.command import ENV_REPLICA_GROUP, ENV_REPLICA_GROUPS
from chaosbench.runtimes.base import NodeControl, ProcessSpec, ProcHandle
from chaosbench.timeline import Event, TimelineWriter
from chaosbench.waiting import wait_until

LIGHTHOUSE_SCRIPT = "torchft_lighthouse"

#: Lines of the Lighthouse (torchft 0.2.0, ``RUST_LOG=info``):
#: ``Quorum! Quorum { quorum_id: 3, participants: [QuorumMember { replica_id: "chaosbench_0:<uuid>", ...``
#: ``Quorum status: Valid quorum found [1/1 participants healthy][1 heartbeating][shrink_only=false]``
LIGHTHOUSE_QUORUM_RE = re.compile(r"Quorum! Quorum \{ quorum_id: (?P<quorum_id>\d+), participants: \[")
LIGHTHOUSE_MEMBER_RE = re.compile(r'replica_id: "(?P<replica_id>[^":]+)')
LIGHTHOUSE_STATUS_RE = re.compile(
    r"\[(?P<healthy>\d+)/(?P<total>\d+) participants healthy\]\[(?P<beating>\d+) heartbeating\]"
)

#: A replica id's group: its trailing digits, as torchft numbers the ranks of a quorum (``extract_trailing_digits``
#: in its Manager). ft-mlp's ids are ``chaosbench_<group>``, a user's script names its own (train_ddp.py:
#: ``train_ddp_<group>``); the Manager appends ``:<uuid>`` per incarnation, which the Lighthouse line's id lacks here.
REPLICA_GROUP_RE = re.compile(r"(\d+)$")


def replica_group_of(replica_id: str) -> int | str:
    """The replica group a Manager's replica id names (its trailing digits), else the id itself."""
    m = REPLICA_GROUP_RE.search(replica_id)
    return int(m.group(1)) if m else replica_id


class TorchftOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Lighthouse
    min_replicas: int = Field(
        default=1, ge=1, description="Lighthouse --min_replicas (groups needed for a quorum)"
    )
    quorum_tick_ms: int = Field(default=100, ge=1, description="Lighthouse --quorum_tick_ms")
    join_timeout_ms: int = Field(
        default=10000, ge=0, description="Lighthouse --join_timeout_ms: wait for heartbeating stragglers"
    )
    heartbeat_timeout_ms: int = Field(
        default=5000, ge=1, description="Lighthouse --heartbeat_timeout_ms: a group silent this long is dead"
    )
    # Manager (workers)
    min_replica_size: int | None = Field(
        default=None,
        ge=1,
        description="Manager min_replica_size: groups needed to commit (default: min_replicas)",
    )
    manager_timeout_s: int = Field(
        default=60, ge=1, description="TORCHFT_TIMEOUT_SEC: collectives, should_commit, checkpoint transfer"
    )
    quorum_timeout_s: int = Field(default=60, ge=1, description="TORCHFT_QUORUM_TIMEOUT_SEC")
    connect_timeout_s: int = Field(default=60, ge=1, description="TORCHFT_CONNECT_TIMEOUT_SEC")
    manager_heartbeat_interval_s: float = Field(
        default=0.1, gt=0, description="Manager -> Lighthouse heartbeats"
    )
    start_together: bool = Field(
        default=True,
        description="the first quorum waits for every group (else the first group up trains alone, then heals "
        "the others)",
    )
    start_timeout_s: float = Field(default=120.0, gt=0, description="how long start_together waits")
    # per-group torchrun
    max_restarts: int = Field(default=3, ge=0, description="torchrun --max-restarts of each replica group")
    monitor_interval_s: float = Field(default=0.1, gt=0, description="torchrun --monitor-interval")
    log_level: str = Field(default="INFO", description="LOGLEVEL of the torchrun agents")
    lighthouse_log: str = Field(default="info", description="RUST_LOG of the Lighthouse (info: quorum lines)")
    worker_log: str = Field(default="warn", description="RUST_LOG of the workers' Manager servers")
    advertise_host: str | None = Field(
        default=None,
        description="hostname the Managers advertise to the Lighthouse and peers (default: the runtime's "
        "master address on the local runtime, else the node's hostname)",
    )
    extra_args: list[str] = Field(default_factory=list, description="more torchrun arguments, as is")
    teardown_grace_s: float = Field(default=5.0, ge=0)
    lighthouse_ready_timeout_s: float = Field(
        default=20.0, gt=0, description="wait for the Lighthouse's port"
    )


def lighthouse_command(python: str) -> list[str]:
    """How to run the Lighthouse with ``python``: its console script must be argv[1] (the Rust entry point
    parses the process's own argv, with argv[1] as its program name)."""
    script = Path(python).parent / LIGHTHOUSE_SCRIPT
    if not script.is_file():
        found = shutil.which(LIGHTHOUSE_SCRIPT)
        if found is None:
            raise Unsupported(
                f"torchft adapter: '{LIGHTHOUSE_SCRIPT}' not found next to {python} or on PATH; "
                "pip install --no-deps torchft==0.2.0 (see docs/frameworks.md)"
            )
        script = Path(found)
    return [python, str(script)]


def group_node(job: JobContext, group: int, groups: int) -> str:
    return job.node_name(group * job.nodes // groups)


class _LighthouseWatch:
    """Turns the Lighthouse's quorum lines into ``quorum`` events, and a quorum or a heartbeating set that
    shrank into ``detect`` events (while no group has finished: groups leaving at the end are not faults). A group
    has finished once a rank says training ended (``train_end``) or reports the last step (``total_steps``): a
    user's script may print nothing at its end."""

    def __init__(self, framework: str, timeline: TimelineWriter, total_steps: int | None = None) -> None:
        self.framework = framework
        self.timeline = timeline
        self.total_steps = total_steps
        self.finishing = threading.Event()
        self._quorum_id: int | None = None
        self._members = 0
        self._groups: list[Any] = []
        self._beating = 0
        self._lock = threading.Lock()

    def on_event(self, ev: Event) -> None:
        if ev.kind == "train_end":
            self.finishing.set()
        elif ev.kind == "step" and self.total_steps and int(ev.get("step") or 0) >= self.total_steps:
            self.finishing.set()

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        if handle.spec.role != "lighthouse":
            return
        m = LIGHTHOUSE_QUORUM_RE.search(line)
        if m:
            self._quorum(int(m["quorum_id"]), line, t_ns)
            return
        s = LIGHTHOUSE_STATUS_RE.search(line)
        if s:
            self._status(int(s["beating"]), line, t_ns)

    def _quorum(self, quorum_id: int, line: str, t_ns: int) -> None:
        groups = sorted(
            (replica_group_of(mm["replica_id"]) for mm in LIGHTHOUSE_MEMBER_RE.finditer(line)),
            key=lambda g: (isinstance(g, str), g if isinstance(g, int) else 0, str(g)),
        )
        with self._lock:
            if quorum_id == self._quorum_id:
                return
            previous = self._members if self._quorum_id is not None else None
            left = [g for g in self._groups if g not in groups]
            self._quorum_id, self._members, self._groups = quorum_id, len(groups), list(groups)
        self.timeline.emit(
            "quorum",
            t_ns=t_ns,
            src="framework",
            framework=self.framework,
            via="lighthouse",
            quorum_id=quorum_id,
            participants=len(groups),
            previous_participants=previous,
            replica_groups=groups,
        )
        if previous is not None and len(groups) < previous and not self.finishing.is_set():
            self.timeline.emit(
                "detect",
                t_ns=t_ns,
                src="framework",
                framework=self.framework,
                via="lighthouse",
                mechanism="quorum change",
                reason=f"lighthouse quorum {quorum_id}: {len(groups)} of {previous} replica groups",
                blame_groups=left,  # the groups the new quorum left out: whom the Lighthouse gave up on
            )

    def _status(self, beating: int, line: str, t_ns: int) -> None:
        with self._lock:
            before, self._beating = self._beating, beating
        if beating < before and not self.finishing.is_set():
            self.timeline.emit(
                "detect",
                t_ns=t_ns,
                src="framework",
                framework=self.framework,
                via="lighthouse",
                mechanism="framework heartbeat",
                reason=f"lighthouse: {before} -> {beating} replica groups heartbeating",
                line=line[:300],
            )


class TorchftFramework(Framework[TorchftOptions]):
    """TorchFT: a Lighthouse plus one torchrun per replica group; see the module docstring."""

    name: ClassVar[str] = "torchft"
    roles: ClassVar[dict[str, Role]] = {
        **Framework.roles,
        "agent": Role(
            "a replica group's torchrun: group 0's (node0), unless the target names a node",
            proc_role="agent",
            node="node0",
        ),
        "lighthouse": Role(
            "the Lighthouse: the quorum service every replica group heartbeats to", proc_role="lighthouse"
        ),
    }
    heals: ClassVar[bool] = True

    def groups(self, job: JobContext) -> int:
        declared = job.workload.replica_groups()
        if declared is None and not job.workload.users_script:
            raise Unsupported(
                f"torchft adapter: workload '{job.workload.name}' does not train through torchft's Manager "
                "(use ft-mlp, or a command workload whose script does)"
            )
        groups = declared or job.nodes
        if job.ranks % groups:
            raise Unsupported(f"torchft: ranks ({job.ranks}) must be a multiple of replica groups ({groups})")
        return groups

    def _lighthouse(self, job: JobContext, python: str, bind: str) -> ProcessSpec:
        """The lighthouse (role ``lighthouse``, on ``node0``), listening on ``bind`` (``host:port``)."""
        o = self.options
        return ProcessSpec(
            name="lighthouse",
            argv=[
                *lighthouse_command(python),
                "--min_replicas",
                str(o.min_replicas),
                "--quorum_tick_ms",
                str(o.quorum_tick_ms),
                "--join_timeout_ms",
                str(o.join_timeout_ms),
                "--heartbeat_timeout_ms",
                str(o.heartbeat_timeout_ms),
                "--bind",
                bind,
            ],
            env={"RUST_LOG": o.lighthouse_log, "PYTHONUNBUFFERED": "1"},
            role="lighthouse",
            node=job.node_name(0),
        )

    def _group_env(
        self, job: JobContext, group: int, groups: int, node: str, lighthouse_url: str
    ) -> dict[str, str]:
        """The environment of replica group ``group`` (of ``groups``) on ``node``: the ranks' and torchft's
        settings (its group, the lighthouse, the Manager's timeouts) and the address its ranks advertise."""
        o = self.options
        env = job.rank_env(0, node)
        env.update(
            {
                "REPLICA_GROUP_ID": str(group),
                "NUM_REPLICA_GROUPS": str(groups),
                # the command shim's numbering of a user's script: rank = group * K + group-local rank
                ENV_REPLICA_GROUP: str(group),
                ENV_REPLICA_GROUPS: str(groups),
                "TORCHFT_LIGHTHOUSE": lighthouse_url,
                "TORCHFT_TIMEOUT_SEC": str(o.manager_timeout_s),
                "TORCHFT_QUORUM_TIMEOUT_SEC": str(o.quorum_timeout_s),
                "TORCHFT_CONNECT_TIMEOUT_SEC": str(o.connect_timeout_s),
                "CHAOSBENCH_FT_MIN_REPLICAS": str(o.min_replica_size or o.min_replicas),
                "CHAOSBENCH_FT_HEARTBEAT_INTERVAL_S": str(o.manager_heartbeat_interval_s),
                "CHAOSBENCH_FT_START_GROUPS": str(groups if o.start_together else 1),
                "CHAOSBENCH_FT_START_TIMEOUT_S": str(o.start_timeout_s),
                "CHAOSBENCH_FRAMEWORK": self.label,
                "LOGLEVEL": o.log_level,
                "RUST_LOG": o.worker_log,
            }
        )
        # ranks on the harness's host advertise the runtime's master address; on nodes of their own, the node's hostname
        advertise = o.advertise_host or (job.runtime.master_addr if job.runtime.ranks_on_harness_host else "")
        if advertise:
            env["CHAOSBENCH_FT_HOSTNAME"] = advertise
        return env

    def plan(self, job: JobContext) -> LaunchPlan:
        """The lighthouse, then one torchrun (``torchrun.g<i>``, role ``agent``) per replica group."""
        o = self.options
        groups = self.groups(job)
        per_group = job.ranks // groups
        python = job.workload_argv()[0]
        addr = job.runtime.master_addr
        lh_port = job.runtime.free_port()
        lighthouse_url = f"http://{addr}:{lh_port}"
        procs = [self._lighthouse(job, python, f"{addr}:{lh_port}")]
        for g in range(groups):
            node = group_node(job, g, groups)
            env = self._group_env(job, g, groups, node, lighthouse_url)
            # A group's torchrun hosts its own store: on container nodes that is the group's node (node0's name
            # would send a group elsewhere to a store nobody serves); on one host, the master address
            group_addr = node if isinstance(job.runtime, NodeControl) else addr
            argv = agent_argv(
                job,
                ["-m", "torch.distributed.run"],
                "1",
                o.max_restarts,
                o.monitor_interval_s,
                ["--master-addr", group_addr, "--master-port", str(job.runtime.free_port())],
                o.extra_args,
                nproc_per_node=per_group,
            )
            procs.append(ProcessSpec(name=f"torchrun.g{g}", argv=argv, env=env, role="agent", node=node))
        return self.launch_plan(
            job,
            procs,
            TORCHRUN_PATTERNS,
            options={**o.model_dump(), "replica_groups": groups, "ranks_per_group": per_group},
            notes=[
                f"{groups} replica groups x {per_group} ranks; rank = group * {per_group} + group-local rank",
                f"lighthouse at {lighthouse_url}",
                "no rollback: lost work is the steps computed but not committed (step_skipped events)",
            ],
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        t.update(
            {
                "lighthouse_heartbeat_timeout_s": o.heartbeat_timeout_ms / 1000,
                "lighthouse_join_timeout_s": o.join_timeout_ms / 1000,
                "lighthouse_quorum_tick_s": o.quorum_tick_ms / 1000,
                "manager_timeout_s": float(o.manager_timeout_s),
                "quorum_timeout_s": float(o.quorum_timeout_s),
                "connect_timeout_s": float(o.connect_timeout_s),
                "manager_heartbeat_interval_s": o.manager_heartbeat_interval_s,
                "monitor_interval_s": o.monitor_interval_s,
                "worker_shutdown_grace_s": TORCHRUN_SHUTDOWN_GRACE_S,
                "teardown_grace_s": o.teardown_grace_s,
            }
        )
        return t

    def versions(self) -> dict[str, str | None]:
        v = base_versions()
        v["torchft"] = package_version("torchft")
        return v

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        if mode == "crash":
            return Prediction(
                *chain(("monitor_interval_s", timeouts.get("monitor_interval_s"))),
                note="the group's torchrun polls its workers' exits",
            )
        if mode not in ("hang", "stall"):
            return None
        hb = float(timeouts.get("lighthouse_heartbeat_timeout_s") or 0)
        pg_name, pg = pg_timeout(timeouts)
        tick = ("lighthouse_quorum_tick_s", timeouts.get("lighthouse_quorum_tick_s"))
        if mode == "hang" and hb <= pg:
            return Prediction(
                *chain(("lighthouse_heartbeat_timeout_s", hb), tick),
                note="a frozen group stops heartbeating; the Lighthouse drops it",
            )
        if mode == "stall":
            return Prediction(
                *chain((pg_name, pg), tick),
                note="a stalled group keeps heartbeating (the Manager's "
                "native threads run on): only the survivors' allreduce timeout sees it",
            )
        return Prediction(
            *chain((pg_name, pg), tick),
            note="the survivors' allreduce times out before the Lighthouse drops the group",
        )

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        out = []
        hb = timeouts.get("lighthouse_heartbeat_timeout_s")
        for name in ("quorum_timeout_s", "manager_timeout_s"):
            v = timeouts.get(name)
            if v is not None and hb is not None and float(v) < float(hb):
                out.append(
                    f"{name} ({v:g} s) < lighthouse_heartbeat_timeout_s ({hb:g} s): the survivors give up on "
                    "the quorum before the Lighthouse drops a silent group"
                )
        return out

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o = self.options
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        lighthouse = _LighthouseWatch(self.label, control.timeline, job.workload.total_steps)
        control.follower.subscribe(lighthouse.on_event)

        def on_line(handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
            watcher(handle, stream, line, t_ns)
            lighthouse(handle, stream, line, t_ns)

        lh_spec, group_specs = plan.processes[0], plan.processes[1:]
        lh = control.runtime.start(lh_spec, on_line=on_line)
        port = int(lh_spec.argv[lh_spec.argv.index("--bind") + 1].rsplit(":", 1)[1])
        # The harness probes from the host: a container node's name resolves only inside its network
        addr = job.runtime.master_addr
        if isinstance(control.runtime, NodeControl):
            addr = control.runtime.node_ip(addr)
        ready = self._wait_port(addr, port, lh, control, o.lighthouse_ready_timeout_s)
        if ready is not None:
            return ready
        agents = [control.runtime.start(p, on_line=on_line) for p in group_specs]
        lighthouse_gone = False

        def step() -> JobResult | None:
            nonlocal lighthouse_gone
            codes = [a.poll() for a in agents]
            if all(c is not None for c in codes):
                bad = [f"{a.name} exited with code {c}" for a, c in zip(agents, codes, strict=True) if c]
                control.runtime.terminate([lh], o.teardown_grace_s)
                if not bad:
                    return JobResult("completed")
                # A group's torchrun exits non-zero only once its restarts are used up, the others going on; one
                # killed by a signal (a fault on the agent itself) gave up nothing.
                gave_up = len(bad) < len(agents) and all(c is None or c >= 0 for c in codes)
                return JobResult("gave_up" if gave_up else "failed", "; ".join(bad))
            if lh.poll() is not None and not lighthouse_gone:
                # No detection of ours and no teardown: what TorchFT's groups do without their Lighthouse (a
                # killed one among the faults) is what is measured; they fail or stall on their own.
                lighthouse_gone = True
                control.timeline.emit(
                    "log",
                    src="framework",
                    framework=self.label,
                    proc=lh.name,
                    line=f"lighthouse exited with code {lh.poll()}",
                )
            return None

        return supervise_job(control, step, min(0.05, o.monitor_interval_s))

    @staticmethod
    def _wait_port(
        addr: str, port: int, lh: ProcHandle, control: RunControl, timeout_s: float
    ) -> JobResult | None:
        def listening() -> JobResult | bool:
            """True once the lighthouse listens; a result when the wait must end otherwise."""
            if lh.poll() is not None:
                return JobResult("failed", f"lighthouse exited with code {lh.poll()} before listening")
            stop = control.stop_reason()
            if stop:
                return JobResult(stop, f"harness stopped the run ({stop})")
            try:
                with socket.create_connection((addr, port), timeout=0.5):
                    return True
            except OSError:
                return False

        ended = wait_until(listening, timeout_s, sleep=control.sleep)
        if ended is None or ended is False:
            return JobResult("failed", f"lighthouse did not listen on {addr}:{port} within {timeout_s} s")
        return None if ended is True else ended
