"""Timeline events: the event kinds, the :class:`Event` record, appending to a run's ``events.jsonl``
(:class:`TimelineWriter`) and parsing its lines. Standard-library only: the probe imports it inside training
processes."""


from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Event kinds and the fields each carries besides ``t_ns``, ``kind``, ``src`` and ``host``.
EVENT_KINDS: dict[str, str] = {
    "run_start": "suite, scenario, repeat, framework, fault, control, seed",
    "run_end": "outcome (completed|failed|deadline|interrupted|error), reason",
    "teardown_begin": "reason (end|deadline|interrupted|error): the harness starts tearing the run down; nothing a "
    "framework does after it counts as its own reaction",
    "framework_info": "framework, versions{}, timeouts{} (seconds), options{}, timeout_problems[] (one line each)",
    "detection_prediction": "fault, injector, mode (crash|hang), framework, expected_s (when the timeouts in force let "
    "the framework detect it, seconds after the fault; null: never), decided_by, resume_floor_s, note, problems[]",
    "proc_start": "proc, pid, role (rank|agent|job|watchdog), node, incarnation",
    "proc_exit": "proc, pid, returncode (negative: killed by that signal), incarnation",
    "helper_start": "proc, pid, pid_ticks, role, node, rank, incarnation (a helper process a framework's own "
    "launcher started, e.g. nvrx's bridge, announcing itself for a role target)",
    "rank_start": "rank, world_size, pid, node, incarnation, local_rank, global_batch (samples per optimizer step "
    "over all ranks, when the workload reports it)",
    "rank_exit": "rank, pid, returncode, incarnation (written by the command shim)",
    "step": "rank, step (1-based count of completed optimizer steps), loss, incarnation",
    "ckpt_save_begin": "rank, step, path, incarnation; or, seen on the filesystem (src watcher, no rank: "
    "chaosbench.workloads.checkpoint_watch): path (relative to dir), dir (the watched directory), step, step_from "
    "(name|timeline|null: where the step came from), via (filesystem); t_ns is the first write seen",
    "ckpt_save_end": "rank, step, path, incarnation, complete (bool: every rank finished and it was marked); or, "
    "seen on the filesystem (src watcher, no rank): path, dir, step, step_from, via (filesystem), complete (bool: "
    "whole by its format), files (how many), bytes, incomplete (why not complete); t_ns is the last write, close "
    "or rename seen (the event may be written up to quiet_s or more later)",
    "ckpt_load_begin": "rank, step, path, incarnation; or, read on the filesystem (src watcher, no rank): path, dir, "
    "step, step_from (name|save|null), via (filesystem); t_ns is the first open of its files",
    "ckpt_load_end": "rank, step, path, incarnation; or, read on the filesystem (src watcher): path, dir, step, "
    "step_from, via, files (how many were read); t_ns is the last close",
    "ckpt_load_failed": "rank, step, path, error, incarnation (the workload rejected a checkpoint, tries an older one)",
    "preempt_save": "rank, step, noticed (bool: this rank got the SIGTERM), saved_already, incarnation "
    "(save_on_sigterm: the ranks agreed to save at this step's end after a preemption notice)",
    "train_end": "rank, step, loss, digest (sha256 of the final parameters), incarnation",
    "step_counting": "rank, base (0|1), how (declared, detected from the first step printed, or as an earlier "
    "incarnation counted), incarnation (the command shim: how the script's step numbers count)",
    "artifact_digest": "path, files[], tensors, bytes, digest (sha256 of the tensors of the final artifact the suite "
    "names, fidelity_from), skipped{file: why}, or error (written by the harness once the run's processes ended)",
    "fault_inject": "fault, injector, target{}, params{}, details{}, trigger, trigger_step (a step trigger's step), "
    "effect_t_ns (when it took effect, harness clock), effect (what that moment is), injection_latency_s; t_ns is "
    "when the injector began to act",
    "fault_revert": "fault, injector, reason",
    "fault_skipped": "fault, injector, reason (the trigger fired but the fault could not be applied)",
    "detect": "framework, reason, line, via (what noticed it, where the source says: exit, heartbeat, step watchdog, "
    "lighthouse, manager, loss guard) (the framework noticed a failure)",
    "capture_limit": "proc, pid, stream, line: a process printed that a write was refused for its size (EMSGSIZE, "
    "ENOBUFS) while its output went through a socket (output_capture: socket): perhaps its own output",
    "rank_error": "proc, pid, role, rank, signature (collective_timeout|collective_mismatch|rendezvous_lost|"
    "peer_lost), line: the first such line in a process's output (the harness watches every process)",
    "restart": "framework, attempt, reason (the framework relaunches the job or worker group)",
    "give_up": "framework, reason (the framework stopped trying)",
    "log": "proc, line, pattern (a user-defined pattern matched a log line)",
    "node_start": "node, container, spare (bool), reason (provision|reboot|takeover|spare), replaces (takeover)",
    "node_exit": "node, container, exit_code, reason (node-kill|cleanup|died): a node's container stopped",
    "node_pause": "node, container (docker pause: every process of the node frozen)",
    "node_unpause": "node, container",
    "step_skipped": "rank, step (the index attempted), reason, duration_s (compute thrown away), collective_s, "
    "participants, quorum_id, incarnation (per-step commit: a step computed but not committed; no rollback)",
    "quorum": "quorum_id, participants, previous_participants, then replica_rank, step, rank, incarnation (a "
    "rank's Manager joined a new quorum) or framework, via=lighthouse, replica_groups (the Lighthouse issued it)",
    "heal_begin": "rank, step, src_replica_rank, incarnation (a replica group fetches the live state from a peer)",
    "heal_end": "rank, step, duration_s, incarnation (the fetched state is applied)",
    "heal_send": "rank, step, dst_replica_ranks, incarnation (this rank serves its live state to healing peers)",
    "rendezvous": "framework, proc, world_size (an elastic agent completed a rendezvous round)",
    "clock_offset": "node, slurm_node, node_host, offset_ns (node clock - harness clock), bound_ns, rtt_ns, samples"
    " (or error)",
    "node_map": "node, slurm_node, previous, reason (a workload node placed on, or moved to, a Slurm node)",
    "signal_sent": "pid, signal, node, slurm_node, node_t_ns, stamp (node|harness): a signal delivered on the node",
    "sched_submit": "framework, job_id, script, slurm_version (a batch job handed to the scheduler)",
    "sched_state": "framework, job_id, slurm_state, state, reason, restarts, slurm_nodes, exit_code (a scheduler"
    " state transition, stamped when polled)",
    # serving runs (workload ``serve``, framework ``balancer``)
    "model_load_begin": "rank, path, incarnation (a replica starts loading its model file)",
    "model_load_end": "rank, path, bytes, duration_s, incarnation",
    "replica_ready": "rank, address, port, url, incarnation (a replica listens with its model loaded)",
    "load_start": "target, users, spawn_rate, duration_s, window_s, slo{} (the load process starts its traffic)",
    "load_window": "window_s, requests, failures, errors{kind: n}, latency_hist[] (successes, over the load's "
    "latency edges), p50_ms, p99_ms, max_ms; t_ns is the window's start, a request counts where it completed",
    "load_end": "requests, failures, duration_s",
    "balancer_down": "framework, rank, server, reason, line (the balancer took a replica out of rotation)",
    "balancer_up": "framework, rank, server, line (the balancer put a replica back)",
    "balancer_stats": "framework, retries, redispatches, requests, servers{name: {status, check_failures, "
    "went_down, downtime_s, ...}} (the balancer's counters at the end of the load; or missing: why not read)",
    "balancer_exit": "framework, reason (the balancer process died)",
}


def now_ns() -> int:
    """Current wall-clock time in nanoseconds: the one clock of a timeline."""
    return time.time_ns()


_HOST = socket.gethostname()


@dataclass(frozen=True)
class Event:
    """One timeline event. ``data`` holds the kind-specific fields (see :data:`EVENT_KINDS`)."""

    t_ns: int
    kind: str
    src: str = "harness"
    host: str = _HOST
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def t_s(self) -> float:
        return self.t_ns / 1e9

    def to_json(self) -> str:
        obj = {"t_ns": self.t_ns, "kind": self.kind, "src": self.src, "host": self.host}
        obj.update(self.data)
        return json.dumps(obj, separators=(",", ":"), default=str)

    @classmethod
    def from_obj(cls, obj: dict[str, Any]) -> Event:
        obj = dict(obj)
        t_ns = int(obj.pop("t_ns"))
        kind = str(obj.pop("kind"))
        src = str(obj.pop("src", "harness"))
        host = str(obj.pop("host", ""))
        return cls(t_ns=t_ns, kind=kind, src=src, host=host, data=obj)


class TimelineWriter:
    """Appends events to an ``events.jsonl`` file; safe to share between threads and processes."""

    def __init__(self, path: str | os.PathLike[str], src: str = "harness") -> None:
        self.path = Path(path)
        self.src = src
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def emit(self, kind: str, t_ns: int | None = None, src: str | None = None, **data: Any) -> Event:
        """Write one event and return it. ``t_ns`` defaults to now."""
        ev = Event(t_ns=now_ns() if t_ns is None else t_ns, kind=kind, src=src or self.src, data=data)
        line = (ev.to_json() + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"timeline {self.path} is closed")
            os.write(self._fd, line)
        return ev

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> TimelineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_lines(lines: Iterator[str] | list[str]) -> list[Event]:
    """Parse JSONL lines; a torn last line (a writer killed mid-write) is skipped."""
    out = []
    for raw in lines:
        raw = raw.strip()
        if not raw:
            continue
        try:
            out.append(Event.from_obj(json.loads(raw)))
        except (ValueError, KeyError):
            continue
    return out
