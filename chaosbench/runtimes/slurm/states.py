"""Slurm's job and node states, translated once into chaosbench's (:data:`SLURM_STATES`), and the parsing of
``scontrol``'s ``Key=value`` output. Plain data: nothing here runs a command."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from chaosbench.errors import EngineError


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
    through :data:`SLURM_STATES`; unknown states raise EngineError (never guessed)."""
    base = slurm_state.strip().split()[0].upper() if slurm_state.strip() else ""
    st = SLURM_STATES.get(("job", base))
    if not isinstance(st, JobState):
        raise EngineError("slurm", f"unknown Slurm job state {slurm_state!r}")
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
