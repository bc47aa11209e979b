"""The ``slurm`` runtime: processes run as Slurm jobs on an existing cluster, the scale-out path.

How processes are started. Each :class:`~chaosbench.runtimes.base.ProcessSpec` becomes its own job of one
task, started by an ``srun`` that runs on the harness's host as a local subprocess::

    srun --job-name=cb-<run hash>.<proc> --comment=chaosbench.run=<run id> -N1 -n1 -w <slurm node>
         --kill-on-bad-exit=1 --unbuffered [-p PART] [-A ACCT] [-t LIMIT] [srun_args] -- <argv>

``srun`` forwards the task's stdout/stderr, so output is captured per process into ``logs/<name>.out|.err``
and log patterns see each line when it arrives, exactly as with the ``local`` runtime; ``srun``'s exit is
the process's exit (``proc_exit``; a task killed by signal N makes ``srun`` exit 128+N, reported as -N like
a local process; ``srun`` exits 0 when the node fails under it, so a job the scheduler ended as failed, lost
or cancelled is reported with return code 1 and its ``slurm_state``).

One job per process, rather than steps of one allocation, because that is what a restart framework on
Slurm does (it submits again), a lost node then only takes the jobs that ran there, and the scheduler's
view of every process (state, node) is one ``squeue`` away. Jobs are named after the run, so
teardown and ``leftovers`` find exactly this run's jobs, never anyone else's. Frameworks that hand the
whole job to the scheduler (``slurm-requeue``) submit a batch script with :meth:`SlurmRuntime.submit_batch`
instead; the runtime tracks and cleans those up too.

Nodes. The workload's nodes ``node0..nodeN-1`` map to Slurm nodes: the ``nodes`` option pins them
(``{node0: n1, node1: n2}``), otherwise the first usable nodes of the partition are taken in order. A node
whose Slurm state becomes unusable (down, drained, failing; see :data:`SLURM_STATES`) is replaced by a
free one when a process is started there again (``replace_lost_nodes``; a ``node_map`` event records it),
as a resubmitted job would land elsewhere. The rank's own events say which host it ran on.

Signals (``kill``, ``hang`` and the other signal injectors). The pid a rank reports lives on its node, so
the runtime runs a tiny shell helper there as an extra step of the job that owns the rank
(``srun --jobid=J --overlap -w NODE``): it checks with ``scontrol listpids J NODE`` that the pid belongs to
one of this run's jobs on that node (so torchrun's workers, children of the task, qualify and nothing else
does), checks its start time against the one the rank reported, and signals it. This works on a remote
node as on this host, needs only ``sh``/``sed``/``kill`` there, and hits exactly the rank, where
``scancel --signal`` would hit every task of the step (a whole torchrun agent tree). The helper's own clock
reading at the moment of the kill is written as a ``signal_sent`` event; its delay after ``fault_inject``
(one step launch, ~0.1 s) is the delivery cost of a fault through Slurm.

Clocks. Before the first process on a Slurm node starts, the runtime measures that node's clock against the
harness's (:mod:`chaosbench.timeline.clocks`, through ``srun`` stdin/stdout) and writes a ``clock_offset`` event.

Teardown escalates through the scheduler: ``scancel --signal=CONT`` and ``--signal=TERM`` to the job's
steps, ``grace_s``, then ``scancel --signal=KILL`` and a full ``scancel``; the local ``srun`` is killed last.
Safe to call twice. ``cleanup`` waits until none of the run's jobs is pending, running or completing.

Requires the Slurm client commands on the harness's host (``srun``, ``sbatch``, ``squeue``, ``scontrol``,
``scancel``, ``sinfo``); ``sacct`` is optional (used only when it answers: clusters without an accounting
database, like the local test cluster, have no ``sacct``), since ``squeue -t all`` and ``scontrol show job``
know every job for ``MinJobAge`` seconds after it ended.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.errors import ChaosbenchError, MissingEngine
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime
from chaosbench.runtimes.process import record_exit, start_pumps
from chaosbench.timeline import clocks, now_ns
from chaosbench.timeline.reader import crashed_run_ids

#: ``srun`` exits 128+N when its task was killed by signal N.
SIGNAL_EXIT_BASE = 128


class JobState(str, enum.Enum):
    """What chaosbench makes of a Slurm job's state."""

    QUEUED = "queued"  # waiting for resources or its begin time
    HELD = "held"  # waiting for someone to release it
    STARTING = "starting"  # allocated, nodes booting / prolog
    RUNNING = "running"
    SUSPENDED = "suspended"
    STOPPING = "stopping"  # completing: processes being ended, epilog
    REQUEUED = "requeued"  # going back to the queue (auto or scontrol requeue)
    COMPLETED = "completed"  # ended with exit code 0
    FAILED = "failed"  # ended badly through its own fault (exit code, OOM, time limit)
    LOST = "lost"  # ended because a node failed under it
    CANCELLED = "cancelled"  # ended by someone (scancel, preemption)


class NodeState(str, enum.Enum):
    """What chaosbench makes of a Slurm node's state."""

    UP = "up"  # idle: can take a job
    BUSY = "busy"  # running jobs (allocated, mixed, completing)
    DRAINING = "draining"  # takes no new jobs, running ones go on
    DRAINED = "drained"  # takes no jobs, none running
    DOWN = "down"  # unusable: down, failed, not responding
    BOOTING = "booting"  # powering up / rebooting
    UNKNOWN = "unknown"


#: The one translation of Slurm's job and node states (``squeue``/``sacct``/``scontrol`` spellings, base
#: state without flags) into chaosbench's. Keyed by ("job"|"node", SLURM_STATE).
SLURM_STATES: dict[tuple[str, str], JobState | NodeState] = {
    ("job", "PENDING"): JobState.QUEUED,
    ("job", "CONFIGURING"): JobState.STARTING,
    ("job", "RUNNING"): JobState.RUNNING,
    ("job", "RESIZING"): JobState.RUNNING,
    ("job", "SIGNALING"): JobState.RUNNING,
    ("job", "STAGE_OUT"): JobState.STOPPING,
    ("job", "SUSPENDED"): JobState.SUSPENDED,
    ("job", "STOPPED"): JobState.SUSPENDED,
    ("job", "COMPLETING"): JobState.STOPPING,
    ("job", "REQUEUED"): JobState.REQUEUED,
    ("job", "REQUEUE_FED"): JobState.REQUEUED,
    ("job", "REQUEUE_HOLD"): JobState.HELD,
    ("job", "SPECIAL_EXIT"): JobState.HELD,
    ("job", "RESV_DEL_HOLD"): JobState.HELD,
    ("job", "COMPLETED"): JobState.COMPLETED,
    ("job", "FAILED"): JobState.FAILED,
    ("job", "TIMEOUT"): JobState.FAILED,
    ("job", "OUT_OF_MEMORY"): JobState.FAILED,
    ("job", "DEADLINE"): JobState.FAILED,
    ("job", "BOOT_FAIL"): JobState.LOST,
    ("job", "NODE_FAIL"): JobState.LOST,
    ("job", "CANCELLED"): JobState.CANCELLED,
    ("job", "PREEMPTED"): JobState.CANCELLED,
    ("job", "REVOKED"): JobState.CANCELLED,
    ("node", "IDLE"): NodeState.UP,
    ("node", "ALLOCATED"): NodeState.BUSY,
    ("node", "MIXED"): NodeState.BUSY,
    ("node", "COMPLETING"): NodeState.BUSY,
    ("node", "PLANNED"): NodeState.UP,
    ("node", "RESERVED"): NodeState.UP,
    ("node", "DRAINING"): NodeState.DRAINING,
    ("node", "DRAINED"): NodeState.DRAINED,
    ("node", "DRAIN"): NodeState.DRAINED,
    ("node", "DOWN"): NodeState.DOWN,
    ("node", "FAIL"): NodeState.DOWN,
    ("node", "FAILING"): NodeState.DRAINING,
    ("node", "FUTURE"): NodeState.DOWN,
    ("node", "INVAL"): NodeState.DOWN,
    ("node", "MAINT"): NodeState.DRAINED,
    ("node", "REBOOT_ISSUED"): NodeState.BOOTING,
    ("node", "POWERING_UP"): NodeState.BOOTING,
    ("node", "POWERED_DOWN"): NodeState.DOWN,
    ("node", "POWERING_DOWN"): NodeState.DOWN,
    ("node", "UNKNOWN"): NodeState.UNKNOWN,
}

#: Job states after which the job will not run again by itself.
FINAL_JOB_STATES = {JobState.COMPLETED, JobState.FAILED, JobState.LOST, JobState.CANCELLED}
#: Job states in which the job holds or may get resources (what teardown waits out).
ACTIVE_JOB_STATES = {
    JobState.QUEUED,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.STOPPING,
    JobState.REQUEUED,
}
#: Node states in which a new job can start on the node.
USABLE_NODE_STATES = {NodeState.UP, NodeState.BUSY}


def job_state(slurm_state: str) -> JobState:
    """A Slurm job state (``squeue %T``, ``scontrol JobState``, ``sacct State`` such as ``CANCELLED by 0``)
    through :data:`SLURM_STATES`; unknown states raise ChaosbenchError (never guessed)."""
    base = slurm_state.strip().split()[0].upper() if slurm_state.strip() else ""
    st = SLURM_STATES.get(("job", base))
    if not isinstance(st, JobState):
        raise ChaosbenchError(f"unknown Slurm job state {slurm_state!r}")
    return st


def node_state(slurm_state: str) -> NodeState:
    """A Slurm node state (``scontrol State=IDLE+DRAIN``, ``sinfo %T`` such as ``down*`` or ``drained``)
    through :data:`SLURM_STATES`. Flags: DRAIN makes a busy node draining and an idle one drained;
    NOT_RESPONDING (``*``) and FAIL make any node down; REBOOT/POWER flags make it booting."""
    s = slurm_state.strip().upper()
    not_responding = s.endswith("*") or "NOT_RESPONDING" in s
    parts = [p for p in re.split(r"[+]", s.rstrip("*~#!%$@^-")) if p]
    if not parts:
        return NodeState.UNKNOWN
    base = SLURM_STATES.get(("node", parts[0]), NodeState.UNKNOWN)
    flags = set(parts[1:])
    if not_responding or "FAIL" in flags or base is NodeState.DOWN:
        return NodeState.DOWN
    if "DRAIN" in flags:
        return NodeState.DRAINING if base is NodeState.BUSY else NodeState.DRAINED
    if flags & {"REBOOT_ISSUED", "POWERING_UP", "POWER_UP", "REBOOT_REQUESTED"}:
        return NodeState.BOOTING
    if flags & {"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"}:
        return NodeState.DOWN
    assert isinstance(base, NodeState)
    return base


def parse_kv(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (``Key=value Key2=value with spaces``) as a dict (first key wins)."""
    out: dict[str, str] = {}
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=", line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


@dataclass
class JobInfo:
    """One Slurm job as the scheduler sees it now."""

    job_id: int
    slurm_state: str
    state: JobState
    reason: str = ""
    restarts: int = 0
    nodes: list[str] = field(default_factory=list)
    exit_code: str = ""
    name: str = ""

    def to_event(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "slurm_state": self.slurm_state,
            "state": self.state.value,
            "reason": self.reason,
            "restarts": self.restarts,
            "slurm_nodes": self.nodes,
            "exit_code": self.exit_code,
        }


class SlurmOptions(BaseModel):
    """Options of the ``slurm`` runtime (``defaults.runtime_options`` in a suite)."""

    model_config = ConfigDict(extra="forbid")
    partition: str | None = Field(default=None, description="partition (-p); null: the cluster's default")
    account: str | None = Field(default=None, description="account (-A) the jobs are charged to")
    time_limit: str | None = Field(default="30:00", description="time limit of each job (-t), Slurm syntax")
    nodes: dict[str, str] = Field(
        default_factory=dict, description="pin workload nodes to Slurm nodes, e.g. {node0: n1, node1: n2}"
    )
    exclude: list[str] = Field(default_factory=list, description="Slurm nodes never used")
    replace_lost_nodes: bool = Field(
        default=True, description="start on a free Slurm node when a workload node's Slurm node is unusable"
    )
    sbatch_args: list[str] = Field(default_factory=list, description="more sbatch arguments, as is")
    srun_args: list[str] = Field(default_factory=list, description="more srun arguments, as is")
    python: str | None = Field(
        default=None, description="interpreter on the nodes; replaces the harness's sys.executable in argv"
    )
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for every Slurm command")
    measure_clocks: bool = Field(default=True, description="measure each node's clock offset before use")
    clock_samples: int = Field(default=8, ge=1, le=1000)
    command_timeout_s: float = Field(default=30.0, gt=0, description="longest wait for one Slurm command")
    job_wait_s: float = Field(
        default=60.0, gt=0, description="longest wait for the run's jobs to end at cleanup"
    )


# A shell helper run on the node (as an overlap step of one of our jobs): $1 signal (0: check only), $2 pid,
# $3 start ticks or '-', $4 Slurm node, then the run's job ids. Exit 3: no such process; 4: pid reused;
# 5: not in our jobs. Prints the node's clock (ns) right after the signal.
_SIGNAL_HELPER = r"""
sig=$1; pid=$2; ticks=$3; node=$4; shift 4
[ -r /proc/$pid/stat ] || exit 3
ours=0
for j in "$@"; do
    if scontrol listpids "$j" "$node" 2>/dev/null | awk -v p="$pid" '$1 == p {f = 1} END {exit !f}'; then
        ours=1; break
    fi
done
[ "$ours" = 1 ] || exit 5
if [ "$ticks" != "-" ]; then
    now=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)
    [ -n "$now" ] || exit 3
    [ "$now" = "$ticks" ] || exit 4
fi
state=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f1)
[ "$state" = Z ] && exit 3
kill -s "$sig" "$pid" 2>/dev/null || exit 3
date +%s%N
"""


class SlurmHandle(ProcHandle):
    """A process started as its own Slurm job: the local ``srun``'s pid, plus the job's name and node."""

    def __init__(
        self, spec: ProcessSpec, pid: int, ticks: int | None, job_name: str, slurm_node: str
    ) -> None:
        super().__init__(spec, pid, ticks)
        self.job_name = job_name
        self.slurm_node = slurm_node
        self.job_id: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None


class SlurmRuntime(Runtime):
    """Processes are jobs of an existing Slurm cluster (see the module docstring)."""

    name: ClassVar[str] = "slurm"

    @classmethod
    def cleanup_crashed(cls, results_dir: Path) -> list[str]:
        return cleanup_stale_jobs(results_dir)
    Options = SlurmOptions  # type: ignore[assignment]
    #: Option values used when the runner passes no options (variants registered under other names).
    default_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opts: SlurmOptions = (
            self.options if isinstance(self.options, SlurmOptions) else SlurmOptions(**self.default_options)
        )
        self.logs_dir = Path(self.run.run_dir) / "logs"
        self.run_hash = hashlib.sha256(self.run.run_id.encode()).hexdigest()[:10]
        self.job_prefix = f"cb-{self.run_hash}"
        self._env = dict(os.environ)
        if self.opts.slurm_conf:
            self._env["SLURM_CONF"] = self.opts.slurm_conf
        self._handles: list[SlurmHandle] = []
        self._threads: list[threading.Thread] = []
        self._batch: dict[int, str] = {}  # job id -> name, batch jobs of this run
        self._node_map: dict[str, str] = {}  # workload node -> Slurm node
        self._clocks: dict[str, clocks.ClockOffset | None] = {}  # Slurm node -> its measured clock
        self._node_addr: dict[str, str] = {}
        self._lock = threading.RLock()
        self._map_lock = threading.Lock()
        self._checked = False

    # ------------------------------------------------------------------ Slurm commands
    def command(self, argv: list[str], check: bool = True, timeout_s: float | None = None) -> str:
        """Run one Slurm client command; returns stdout. Failures raise ChaosbenchError with Slurm's one-line
        reason (a missing command raises MissingEngine)."""
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self._env,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s or self.opts.command_timeout_s,
            )
        except FileNotFoundError:
            raise MissingEngine(
                f"Slurm command '{argv[0]}' not found: is this host a Slurm client?"
            ) from None
        except subprocess.TimeoutExpired:
            raise ChaosbenchError(f"'{' '.join(argv[:3])}' gave no answer within the timeout") from None
        if check and res.returncode != 0:
            err = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.returncode}").splitlines()[-1]
            raise ChaosbenchError(f"'{' '.join(argv[:3])}' failed: {err}")
        return res.stdout

    def check(self) -> None:
        """Raise MissingEngine when no cluster answers (or the partition does not exist)."""
        if self._checked:
            return
        try:
            out = self.command(["sinfo", "-h", "-o", "%R", *self._part()], timeout_s=15)
        except ChaosbenchError as exc:
            raise MissingEngine(f"no Slurm cluster answers: {exc}") from None
        if not out.strip():
            raise MissingEngine(f"Slurm partition '{self.opts.partition}' not found")
        self._checked = True

    def _part(self) -> list[str]:
        return ["-p", self.opts.partition] if self.opts.partition else []

    def _common(self) -> list[str]:
        out = self._part()
        if self.opts.account:
            out += ["-A", self.opts.account]
        if self.opts.time_limit:
            out += ["-t", self.opts.time_limit]
        return out

    def scheduler_config(self) -> dict[str, Any]:
        """Scheduler settings that shape detection and recovery (seconds where a time), from
        ``scontrol show config``: the requeue hold (``cred_expire``, default 120 s), the node timeout, the
        kill wait, the backfill interval, the job record lifetime."""
        raw: dict[str, str] = {}
        for line in self.command(["scontrol", "show", "config"]).splitlines():
            if "=" in line:
                k, _, v = line.partition("=")
                raw[k.strip()] = v.strip()

        def secs(v: str | None) -> float | None:
            m = re.match(r"^(\d+)", v or "")
            return float(m.group(1)) if m else None

        auth = dict(kv.split("=", 1) for kv in raw.get("AuthInfo", "").split(",") if "=" in kv)
        sched = dict(kv.split("=", 1) for kv in raw.get("SchedulerParameters", "").split(",") if "=" in kv)
        return {
            "slurm_version": raw.get("SLURM_VERSION"),
            "cluster": raw.get("ClusterName"),
            "scheduler_type": raw.get("SchedulerType"),
            "requeue_hold_s": secs(auth.get("cred_expire")) or 120.0,
            "backfill_interval_s": secs(sched.get("bf_interval")) or 30.0,
            "sched_interval_s": secs(sched.get("sched_interval")) or 60.0,
            "slurmd_timeout_s": secs(raw.get("SlurmdTimeout")),
            "kill_wait_s": secs(raw.get("KillWait")),
            "min_job_age_s": secs(raw.get("MinJobAge")),
            "job_requeue": raw.get("JobRequeue"),
        }

    # ------------------------------------------------------------------ nodes
    def nodes_info(self, names: list[str] | None = None) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` of the partition's nodes (or of ``names``), keyed by node name."""
        argv = ["scontrol", "show", "node", "-o", *([",".join(names)] if names else [])]
        out = {}
        for line in self.command(argv).splitlines():
            kv = parse_kv(line)
            if "NodeName" in kv:
                out[kv["NodeName"]] = kv
        if self.opts.partition and not names:
            out = {
                n: kv for n, kv in out.items() if self.opts.partition in kv.get("Partitions", "").split(",")
            }
        return out

    def node_state(self, slurm_node: str) -> tuple[NodeState, str]:
        """A Slurm node's state: (chaosbench's, Slurm's raw spelling)."""
        kv = self.nodes_info([slurm_node]).get(slurm_node)
        if kv is None:
            raise ChaosbenchError(f"Slurm node {slurm_node} not found")
        return node_state(kv.get("State", "UNKNOWN")), kv.get("State", "UNKNOWN")

    def partition_nodes(self) -> list[str]:
        """Nodes of the partition (the cluster's default partition when none is set), in Slurm's order."""
        out = self.command(["sinfo", "-h", "-N", "-o", "%N|%P", *self._part()])
        names: list[str] = []
        for line in out.splitlines():
            n, _, p = line.partition("|")
            if n and n not in names and (self.opts.partition or p.endswith("*")):
                names.append(n)
        return names

    def slurm_node(self, node: str, for_start: bool = False) -> str:
        """The Slurm node a workload node runs on. With ``for_start`` an unusable mapped node is replaced by
        a free one (``replace_lost_nodes``), recorded as a ``node_map`` event."""
        with self._map_lock:
            current = self._node_map.get(node)
            if current is not None and not for_start:
                return current
            self.check()
            infos = self.nodes_info()
            usable = {n for n, kv in infos.items() if node_state(kv.get("State", "")) in USABLE_NODE_STATES}
            if current is not None and current in usable:
                return current
            pinned = self.opts.nodes.get(node)
            if current is None and pinned is not None:
                if pinned not in infos:
                    raise ChaosbenchError(
                        f"runtime option nodes: {node} -> {pinned}: no such node in the partition"
                    )
                choice = pinned
            else:
                taken = set(self._node_map.values()) | set(self.opts.nodes.values())
                free = [
                    n
                    for n in self.partition_nodes()
                    if n in usable and n not in taken and n not in self.opts.exclude
                ]
                if current is not None and not self.opts.replace_lost_nodes:
                    raise ChaosbenchError(
                        f"{node}'s Slurm node {current} is unusable and replace_lost_nodes is off"
                    )
                if not free:
                    raise ChaosbenchError(
                        f"no usable Slurm node left for {node} (partition {self.opts.partition})"
                    )
                choice = free[0]
            self._node_map[node] = choice
            if current is not None:
                state = infos.get(current, {}).get("State", "?")
                self.run.timeline.emit(
                    "node_map", node=node, slurm_node=choice, previous=current, reason=f"{current} is {state}"
                )
            else:
                self.run.timeline.emit(
                    "node_map", node=node, slurm_node=choice, previous=None, reason="first use"
                )
            self._node_addr.setdefault(choice, infos.get(choice, {}).get("NodeAddr", choice))
            return choice

    def node_of_slurm(self, slurm_node: str) -> str | None:
        """The workload node mapped to a Slurm node, if any."""
        with self._map_lock:
            return next((n for n, s in self._node_map.items() if s == slurm_node), None)

    def _addr(self, slurm_node: str) -> str:
        if slurm_node not in self._node_addr:
            kv = self.nodes_info([slurm_node]).get(slurm_node, {})
            self._node_addr[slurm_node] = kv.get("NodeAddr", slurm_node)
        return self._node_addr[slurm_node]

    def measure_clock(self, slurm_node: str, node: str | None = None, job_id: int | None = None) -> None:
        """Measure a Slurm node's clock offset once per run and write a ``clock_offset`` event (on failure the
        event carries the error instead of an offset). The probe runs as its own one-task job, or, with
        ``job_id``, as an extra step of that running job (a batch job's nodes are only free to it)."""
        with self._lock:
            if slurm_node in self._clocks:
                return
            self._clocks[slurm_node] = None
        where = (
            [f"--jobid={job_id}", "--overlap"]
            if job_id is not None
            else [
                *self._common(),
                f"--job-name={self.job_prefix}.clock",
                f"--comment=chaosbench.run={self.run.run_id}",
            ]
        )
        argv = [
            "srun",
            "-Q",
            "-N1",
            "-n1",
            "-w",
            slurm_node,
            "--unbuffered",
            *where,
            self.python(),
            "-u",
            "-c",
            clocks.ECHO_PROGRAM,
        ]
        try:
            off = clocks.measure(
                argv, slurm_node, self.opts.clock_samples, self.opts.command_timeout_s, self._env
            )
        except ValueError as exc:
            self.run.timeline.emit("clock_offset", node=node, slurm_node=slurm_node, error=str(exc))
            return
        with self._lock:
            self._clocks[slurm_node] = off
        fields = off.event_fields()
        fields.update(node=node, slurm_node=slurm_node)
        self.run.timeline.emit("clock_offset", **fields)

    def clock_offset_ns(self, slurm_node: str) -> int | None:
        """The measured offset of a Slurm node's clock (node - harness), None when not measured."""
        with self._lock:
            off = self._clocks.get(slurm_node)
        return off.offset_ns if off is not None else None

    # ------------------------------------------------------------------ plain data
    @property
    def master_addr(self) -> str:
        return self._addr(self.slurm_node("node0"))

    def free_port(self) -> int:
        """A port free on the master node: checked here when that node's address is this host's, else
        asked of the node itself (one short job step)."""
        addr = self.master_addr
        if _is_local(addr):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((addr, 0))
                return int(s.getsockname()[1])
        prog = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        out = self.command(
            [
                "srun",
                "-Q",
                "-N1",
                "-n1",
                "-w",
                self.slurm_node("node0"),
                *self._common(),
                f"--job-name={self.job_prefix}.port",
                self.python(),
                "-c",
                prog,
            ]
        )
        return int(out.split()[-1])

    def python(self) -> str:
        """The Python the nodes run (the ``python`` option, else the harness's own)."""
        return self.opts.python or sys.executable

    def node_argv(self, argv: list[str]) -> list[str]:
        """``argv`` as the nodes run it: the harness's Python replaced by the nodes' (the ``python`` option)."""
        if self.opts.python:
            return [self.opts.python if a == sys.executable else a for a in argv]
        return list(argv)

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "options": self.opts.model_dump(), "nodes": dict(self._node_map)}

    # ------------------------------------------------------------------ processes
    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        self.check()
        snode = self.slurm_node(spec.node, for_start=True)
        if self.opts.measure_clocks:
            self.measure_clock(snode, spec.node)
        job_name = f"{self.job_prefix}.{spec.name}"
        argv = [
            "srun",
            f"--job-name={job_name}",
            f"--comment=chaosbench.run={self.run.run_id}",
            "-N1",
            "-n1",
            "-w",
            snode,
            "--kill-on-bad-exit=1",
            "--unbuffered",
            *self._common(),
            *([f"--chdir={spec.cwd}"] if spec.cwd else []),
            *self.opts.srun_args,
            "--",
            *self.node_argv(spec.argv),
        ]
        env = dict(self._env)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise MissingEngine(f"cannot run srun for '{spec.name}': {exc.strerror}") from None
        from chaosbench import procutil

        handle = SlurmHandle(spec, popen.pid, procutil.start_ticks(popen.pid), job_name, snode)
        handle.popen = popen
        with self._lock:
            self._handles.append(handle)
        self.run.timeline.emit(
            "proc_start",
            proc=spec.name,
            pid=handle.pid,
            pid_ticks=handle.ticks,
            role=spec.role,
            node=spec.node,
            incarnation=spec.incarnation,
            slurm_node=snode,
            job_name=job_name,
        )
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._threads += start_pumps(handle, {"stdout": popen.stdout, "stderr": popen.stderr}, self.logs_dir, on_line)
        w = threading.Thread(target=self._wait, args=(handle, popen), daemon=True, name=f"wait-{spec.name}")
        w.start()
        self._threads.append(w)
        return handle

    def _wait(self, handle: SlurmHandle, popen: subprocess.Popen[bytes]) -> None:
        srun_rc = rc = popen.wait()
        handle.t_exit_ns = now_ns()
        if rc > SIGNAL_EXIT_BASE and rc - SIGNAL_EXIT_BASE in {int(s) for s in signal.Signals}:
            rc = -(rc - SIGNAL_EXIT_BASE)
        extra: dict[str, Any] = {}
        job_id = None
        with contextlib.suppress(ChaosbenchError):
            job_id = self.job_id(handle)
            # srun (22.05) exits 0 when its node fails under it ("srun: error: Node failure on n2"): the job's
            # state says what happened, so a lost node is not reported as a process that finished its work.
            info = self.job_info(job_id) if rc == 0 and job_id is not None else None
            if info is not None and info.state in (JobState.FAILED, JobState.LOST, JobState.CANCELLED):
                rc = 1
                extra = {"srun_returncode": srun_rc, "slurm_state": info.slurm_state, "reason": info.reason}
        handle.returncode = rc
        assert handle.t_exit_ns is not None
        record_exit(self.run.timeline, handle, rc, handle.t_exit_ns, slurm_node=handle.slurm_node, job_id=job_id,
                    **extra)  # fmt: skip
        handle.exited.set()

    def job_id(self, handle: SlurmHandle) -> int | None:
        """The Slurm job id of a process (looked up by its unique job name; None before it is known)."""
        if handle.job_id is None:
            out = self.command(
                ["squeue", "-h", "-t", "all", f"--name={handle.job_name}", "-o", "%i"], check=False
            )
            ids = [int(x) for x in out.split() if x.isdigit()]
            handle.job_id = max(ids) if ids else None
        return handle.job_id

    # ------------------------------------------------------------------ batch jobs (slurm-requeue)
    def submit_batch(
        self,
        script: Path,
        name: str,
        nodes: int,
        ntasks_per_node: int,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> int:
        """``sbatch`` a batch script as a job of this run; returns its job id. Output goes to
        ``logs/<name>.out`` (appended across requeues)."""
        self.check()
        job_name = f"{self.job_prefix}.{name}"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={job_name}",
            f"--comment=chaosbench.run={self.run.run_id}",
            "-N",
            str(nodes),
            f"--ntasks-per-node={ntasks_per_node}",
            "--open-mode=append",
            f"--output={self.logs_dir / name}.out",
            f"--error={self.logs_dir / name}.err",
            f"--chdir={self.run.run_dir}",
            *self._common(),
            *self.opts.sbatch_args,
            *(extra or []),
            str(script),
        ]
        if self.opts.exclude:
            argv[-1:-1] = [f"--exclude={','.join(self.opts.exclude)}"]
        saved = self._env
        if env:
            self._env = {**self._env, **env}
        try:
            out = self.command(argv)
        finally:
            self._env = saved
        job_id = int(out.strip().split(";")[0])
        with self._lock:
            self._batch[job_id] = job_name
        return job_id

    def job_info(self, job_id: int) -> JobInfo | None:
        """The scheduler's view of a job (``scontrol show job``; ``sacct`` once it is gone), or None."""
        out = self.command(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        kv = parse_kv(out.strip()) if out.strip() else {}
        if "JobState" not in kv:
            return self._sacct_info(job_id)
        nodes_expr = kv.get("NodeList", "")
        nodes = self.hostnames(nodes_expr) if nodes_expr and nodes_expr != "(null)" else []
        reason = kv.get("Reason", "")
        return JobInfo(
            job_id=job_id,
            slurm_state=kv["JobState"],
            state=job_state(kv["JobState"]),
            reason="" if reason == "None" else reason,
            restarts=int(kv.get("Restarts", "0") or 0),
            nodes=nodes,
            exit_code=kv.get("ExitCode", ""),
            name=kv.get("JobName", ""),
        )

    def _sacct_info(self, job_id: int) -> JobInfo | None:
        try:
            out = self.command(
                ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "State,Reason,NodeList,ExitCode"],
                timeout_s=10,
            )
        except ChaosbenchError:
            return None
        line = out.strip().splitlines()[-1] if out.strip() else ""
        if not line:
            return None
        st, reason, nodes_expr, code = (line.split("|") + ["", "", "", ""])[:4]
        return JobInfo(
            job_id=job_id,
            slurm_state=st,
            state=job_state(st),
            reason=reason,
            nodes=self.hostnames(nodes_expr) if nodes_expr not in ("", "None assigned") else [],
            exit_code=code,
        )

    def hostnames(self, expr: str) -> list[str]:
        """A Slurm host list expression (``n[1-3]``) expanded by ``scontrol show hostnames``."""
        return self.command(["scontrol", "show", "hostnames", expr]).split()

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: the job goes back to the queue (held until its begin time, see
        :meth:`scheduler_config`)."""
        self.command(["scontrol", "requeue", str(job_id)])

    # ------------------------------------------------------------------ signals
    def our_jobs(self, active_only: bool = True) -> dict[int, str]:
        """This run's jobs known to the scheduler: job id -> name (only those not ended, by default)."""
        out = self.command(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T"], check=False)
        jobs = {}
        for line in out.splitlines():
            jid, _, rest = line.partition("|")
            name, _, st = rest.partition("|")
            if not name.startswith(self.job_prefix + ".") or not jid.isdigit():
                continue
            try:
                state = job_state(st)
            except ChaosbenchError:
                state = JobState.RUNNING
            if not active_only or state in ACTIVE_JOB_STATES:
                jobs[int(jid)] = name
        return jobs

    def jobs_on(self, slurm_node: str) -> dict[int, str]:
        """This run's running jobs with an allocation on ``slurm_node``."""
        out = self.command(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING,SUSPENDED", "-w", slurm_node, "-o", "%i|%j"],
            check=False,
        )
        jobs = {}
        for line in out.splitlines():
            jid, _, name = line.partition("|")
            if name.startswith(self.job_prefix + ".") and jid.isdigit():
                jobs[int(jid)] = name
        return jobs

    def foreign_jobs_on(self, slurm_node: str) -> list[int]:
        """Jobs of others (not this run's) running on ``slurm_node``."""
        out = self.command(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING,SUSPENDED", "-w", slurm_node, "-o", "%i|%j"],
            check=False,
        )
        return [
            int(j)
            for j, _, n in (ln.partition("|") for ln in out.splitlines())
            if j.isdigit() and not n.startswith(self.job_prefix + ".")
        ]

    def slurm_node_now(self, node: str) -> str:
        """Where workload node ``node`` runs now: the mapping of per-process jobs, else the matching node of
        this run's running batch job (``nodeK`` = the K-th node of its allocation)."""
        with self._map_lock:
            mapped = self._node_map.get(node)
        if mapped is not None:
            return mapped
        m = re.fullmatch(r"node(\d+)", node)
        for job_id in sorted(self._batch, reverse=True):
            info = self.job_info(job_id)
            if (
                info is not None
                and info.state is JobState.RUNNING
                and m
                and int(m.group(1)) < len(info.nodes)
            ):
                return info.nodes[int(m.group(1))]
        raise ChaosbenchError(f"no job of this run runs on {node}")

    def _node_helper(
        self, sig: str, pid: int, ticks: int | None, node: str | None
    ) -> tuple[int, int | None, str]:
        """Run the signal helper on the rank's node: (helper exit code, node clock ns or None, Slurm node)."""
        snode = self.slurm_node_now(node or "node0")
        jobs = sorted(self.jobs_on(snode))
        if not jobs:
            raise ProcessLookupError(pid)
        argv = [
            "srun",
            "-Q",
            f"--jobid={jobs[-1]}",
            "--overlap",
            "-w",
            snode,
            "-N1",
            "-n1",
            f"--job-name={self.job_prefix}.signal",
            "sh",
            "-c",
            _SIGNAL_HELPER,
            "sh",
            sig,
            str(pid),
            str(ticks) if ticks is not None else "-",
            snode,
            *[str(j) for j in jobs],
        ]
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self._env,
                stdin=subprocess.DEVNULL,
                timeout=self.opts.command_timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise ChaosbenchError(f"signalling pid {pid} on {snode}: no answer") from None
        t_node = None
        with contextlib.suppress(ValueError, IndexError):
            t_node = int(res.stdout.split()[-1])
        if res.returncode not in (0, 3, 4, 5):
            err = (res.stderr.strip() or f"exit code {res.returncode}").splitlines()[-1]
            raise ChaosbenchError(f"signalling pid {pid} on {snode} failed: {err}")
        return res.returncode, t_node, snode

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        name = signal.Signals(sig).name if sig else "0"
        rc, t_node, snode = self._node_helper(name.removeprefix("SIG") if sig else "0", pid, ticks, node)
        if rc == 3:
            raise ProcessLookupError(pid)
        if rc == 4:
            raise ChaosbenchError(f"pid {pid} on {snode} now belongs to another process; not signalling it")
        if rc == 5:
            raise ChaosbenchError(f"pid {pid} on {snode} is not in a job of this run; not signalling it")
        if sig:
            # The node's clock reading at the kill, moved onto the harness's clock when the offset is known.
            off = self.clock_offset_ns(snode)
            exact = t_node is not None and off is not None
            t = t_node - off if t_node is not None and off is not None else now_ns()
            self.run.timeline.emit(
                "signal_sent",
                t_ns=t,
                src="runtime",
                pid=pid,
                signal=name,
                node=node,
                slurm_node=snode,
                node_t_ns=t_node,
                stamp="node" if exact else "harness",
            )
            return t
        return None

    def process_alive(self, pid: int, ticks: int | None = None, node: str | None = None) -> bool:
        try:
            rc, _, _ = self._node_helper("0", pid, ticks, node)
        except (ProcessLookupError, ChaosbenchError):
            return False
        return rc == 0

    # ------------------------------------------------------------------ teardown
    def _scancel(self, job_ids: list[int], *args: str) -> None:
        if job_ids:
            self.command(["scancel", *args, *[str(j) for j in job_ids]], check=False)

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        hs = [h for h in handles if isinstance(h, SlurmHandle)]
        live = [h for h in hs if not h.exited.is_set()]
        if live:
            ids = [j for j in (self.job_id(h) for h in live) if j is not None]
            self._scancel(ids, "--signal=CONT")
            self._scancel(ids, "--signal=TERM")
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not all(h.exited.is_set() for h in live):
                time.sleep(0.02)
            rest = [h for h in live if not h.exited.is_set()]
            ids = [j for j in (self.job_id(h) for h in rest) if j is not None]
            self._scancel(ids, "--signal=KILL")
            self._scancel(ids)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not all(h.exited.is_set() for h in rest):
                time.sleep(0.02)
            for h in rest:
                if h.popen is not None and h.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        h.popen.kill()
        for h in hs:
            h.exited.wait(timeout=10)

    def cancel_batch(self, job_id: int) -> None:
        """End a batch job of this run for good (``scancel``)."""
        self._scancel([job_id])

    def cleanup(self, grace_s: float = 5.0) -> None:
        with self._lock:
            handles = list(self._handles)
        self.terminate(list(handles), grace_s)
        with contextlib.suppress(ChaosbenchError):
            deadline = time.monotonic() + self.opts.job_wait_s
            while True:
                jobs = self.our_jobs()
                if not jobs or time.monotonic() > deadline:
                    break
                self._scancel(sorted(jobs))
                time.sleep(0.2)
        for t in self._threads:
            t.join(timeout=5)

    def leftovers(self) -> list[int]:
        """This run's jobs the scheduler still has pending, running or completing (job ids), and local
        ``srun`` processes still alive (pids)."""
        with self._lock:
            handles = list(self._handles)
        alive = [h.pid for h in handles if h.popen is not None and h.popen.poll() is None]
        try:
            jobs = sorted(self.our_jobs())
        except ChaosbenchError:
            jobs = []
        return jobs + alive


def _is_local(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(addr))
    except (OSError, ValueError):
        return False
    if ip.is_loopback:
        return True
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((str(ip), 0))
        return True
    return False


def cleanup_stale_jobs(results_dir: Path) -> list[str]:
    """For ``chaosbench cleanup``: cancel the Slurm jobs of runs below ``results_dir`` whose harness died
    (a timeline without ``run_end``). Jobs are matched by the run's job-name prefix, so only jobs this
    harness submitted are touched. No Slurm client or no cluster: nothing to do."""
    import shutil

    if shutil.which("squeue") is None:
        return []
    prefixes = {"cb-" + hashlib.sha256(run_id.encode()).hexdigest()[:10] + ".": run_dir
                for run_id, run_dir in crashed_run_ids(results_dir).items()}  # fmt: skip
    if not prefixes:
        return []
    try:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, timeout=15
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    actions = []
    for line in out.splitlines():
        jid, _, name = line.partition("|")
        owner = next((d for p, d in prefixes.items() if name.startswith(p)), None)
        if owner is not None and jid.isdigit():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", jid], capture_output=True, timeout=15)
            actions.append(f"scancel Slurm job {jid} ({name}) of {owner}")
    return actions
