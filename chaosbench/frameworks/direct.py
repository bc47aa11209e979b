"""Adapters that launch one process per rank directly: ``none`` (no recovery) and ``restart``
(job-level checkpoint-restart, as a scheduler requeue would do it)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    Prediction,
    RunControl,
    chain,
    pg_timeout,
)
from chaosbench.runtimes.base import ProcessSpec, ProcHandle
from chaosbench.timeline import Event, now_ns


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name} ({rc})"
        except ValueError:
            return f"signal {-rc} ({rc})"
    return f"code {rc}"


def rank_processes(job: JobContext, incarnation: int, master_port: int) -> list[ProcessSpec]:
    """One process per rank, with the torch.distributed env:// variables; ranks fill node0 first."""
    argv = job.workload_argv()
    procs = []
    per_node = job.ranks_per_node
    for rank in range(job.ranks):
        node = job.node_name(rank // per_node)
        env = job.rank_env(incarnation, node)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % per_node),
                "WORLD_SIZE": str(job.ranks),
                "LOCAL_WORLD_SIZE": str(per_node),
                "GROUP_RANK": str(rank // per_node),
                "MASTER_ADDR": job.runtime.master_addr,
                "MASTER_PORT": str(master_port),
            }
        )
        procs.append(
            ProcessSpec(name=f"rank{rank}.i{incarnation}", argv=argv, env=env, role="rank", node=node,
                        incarnation=incarnation)
        )  # fmt: skip
    return procs


@dataclass
class Failure:
    """Why the watchdog considers the incarnation failed, and the rank it blames (None: no one in particular)."""

    reason: str
    rank: int | None


class _Heartbeats:
    """Last sign of life of each rank of the current incarnation, fed from the timeline."""

    BEATS = ("rank_start", "step", "ckpt_save_begin", "ckpt_save_end", "ckpt_load_begin", "ckpt_load_end")

    def __init__(self) -> None:
        self.incarnation = 0
        self.last_ns: dict[int, int] = {}
        self.stepped: set[int] = set()
        self.finished: set[int] = set()  # ranks past train_end: a slow exit is not a hang
        self._lock = threading.Lock()

    def reset(self, incarnation: int) -> None:
        with self._lock:
            self.incarnation = incarnation
            self.last_ns.clear()
            self.stepped.clear()
            self.finished.clear()

    def __call__(self, ev: Event) -> None:
        if ev.src != "rank" or ev.kind not in (*self.BEATS, "train_end"):
            return
        with self._lock:
            if ev.get("incarnation") != self.incarnation:
                return
            rank = int(ev.get("rank", -1))
            if ev.kind == "train_end":
                self.finished.add(rank)
                return
            self.last_ns[rank] = max(self.last_ns.get(rank, 0), ev.t_ns)
            if ev.kind == "step":
                self.stepped.add(rank)

    def stale(self, ranks: int, timeout_s: float, now: int) -> tuple[int, float] | None:
        """The rank whose heartbeat is oldest, when older than ``timeout_s`` (armed after its first step)."""
        with self._lock:
            worst: tuple[int, float] | None = None
            for r in range(ranks):
                if r not in self.stepped or r in self.finished:
                    continue
                age = (now - self.last_ns.get(r, now)) / 1e9
                if age > timeout_s and (worst is None or age > worst[1]):
                    worst = (r, age)
            return worst

    def any_step(self) -> bool:
        with self._lock:
            return bool(self.stepped)


class NoneOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kill_on_bad_exit: bool = Field(
        default=True, description="when a rank fails, stop the others (as srun --kill-on-bad-exit does)"
    )
    monitor_interval_s: float = Field(default=0.05, gt=0)
    teardown_grace_s: float = Field(default=5.0, ge=0)


class NoneFramework(Framework):
    """No recovery: the baseline. Launches the ranks and waits; a failed rank ends the job."""

    name: ClassVar[str] = "none"
    Options = NoneOptions  # type: ignore[assignment]
    restarts_allowed: ClassVar[bool] = False

    def plan(self, job: JobContext) -> LaunchPlan:
        return LaunchPlan(
            framework=self.label,
            adapter=self.name,
            processes=rank_processes(job, 0, job.runtime.free_port()),
            timeouts=self.timeouts(job),
            versions=self.versions(),
            options=self.options.model_dump(),
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o: Any = self.options
        t = super().timeouts(job)
        t.update({"monitor_interval_s": o.monitor_interval_s, "teardown_grace_s": o.teardown_grace_s})
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        return Prediction(None, "", note="no detector: a failed rank ends the job, a hung one stalls it")

    def _failure(self, handles: list[ProcHandle], beats: _Heartbeats | None) -> Failure | None:
        """Why the current incarnation has failed, or None while it looks healthy."""
        for h in handles:
            rc = h.poll()
            if rc is not None and rc != 0:
                return Failure(f"{h.name} exited with {describe_exit(rc)}", int(h.spec.env["RANK"]))
        return None

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o: Any = self.options
        beats = _Heartbeats() if self.restarts_allowed else None
        if beats is not None:
            control.follower.subscribe(beats)
        incarnation, attempts = 0, 0
        specs = plan.processes
        while True:
            if beats is not None:
                beats.reset(incarnation)
            launched_ns = now_ns()
            handles = [control.runtime.start(s) for s in specs]
            failure: Failure | None = None
            while failure is None:
                stop = control.stop_reason()
                if stop:
                    return JobResult(stop, f"harness stopped the run ({stop})")
                if all(h.poll() == 0 for h in handles):
                    return JobResult("completed")
                failure = self._failure(handles, beats)
                if failure is None and beats is not None:
                    failure = self._hang(job, beats, launched_ns)
                if failure is None:
                    control.sleep(o.monitor_interval_s)
            if not self.restarts_allowed:
                if o.kill_on_bad_exit:
                    control.runtime.terminate(handles, o.teardown_grace_s)
                else:
                    while not all(h.exited.is_set() for h in handles):
                        if control.stop_reason():
                            return JobResult(control.stop_reason() or "deadline", failure.reason)
                        control.sleep(o.monitor_interval_s)
                return JobResult("failed", failure.reason)
            blame = {} if failure.rank is None else {"blame_rank": failure.rank}
            control.timeline.emit("detect", src="framework", framework=self.label, reason=failure.reason, **blame)
            control.runtime.terminate(handles, o.teardown_grace_s)
            if attempts >= o.max_restarts:
                control.timeline.emit(
                    "give_up", src="framework", framework=self.label,
                    reason=f"retry limit reached ({o.max_restarts} restarts): {failure.reason}",
                )  # fmt: skip
                return JobResult("gave_up", failure.reason)
            attempts += 1
            incarnation += 1
            control.timeline.emit(
                "restart", src="framework", framework=self.label, attempt=attempts, reason=failure.reason
            )
            if o.restart_delay_s:
                control.sleep(o.restart_delay_s)
            specs = rank_processes(job, incarnation, job.runtime.free_port())

    def _hang(self, job: JobContext, beats: _Heartbeats, launched_ns: int) -> Failure | None:
        return None


class RestartOptions(NoneOptions):
    max_restarts: int = Field(default=3, ge=0, description="relaunches before giving up")
    heartbeat_timeout_s: float = Field(default=10.0, gt=0, description="a rank with no step for this long is hung")
    startup_timeout_s: float = Field(default=120.0, gt=0, description="launch to first step, per incarnation")
    restart_delay_s: float = Field(default=0.0, ge=0, description="scheduler delay before relaunch")


class RestartFramework(NoneFramework):
    """Job-level checkpoint-restart: a dead rank (by its exit) or a hung one (no step heartbeat for
    ``heartbeat_timeout_s``) tears the whole job down and relaunches it; the workload resumes from its
    newest complete checkpoint. Gives up after ``max_restarts`` relaunches."""

    name: ClassVar[str] = "restart"
    Options = RestartOptions  # type: ignore[assignment]
    restarts_allowed: ClassVar[bool] = True

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o: Any = self.options
        t = super().timeouts(job)
        t.update({"heartbeat_timeout_s": o.heartbeat_timeout_s, "startup_timeout_s": o.startup_timeout_s,
                  "restart_delay_s": o.restart_delay_s})
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        monitor = ("monitor_interval_s", timeouts.get("monitor_interval_s"))
        if mode == "crash":
            return Prediction(*chain(monitor), note="the watchdog polls every rank's exit")
        if mode != "hang":
            return None
        pg_name, pg = pg_timeout(timeouts)
        hb = float(timeouts.get("heartbeat_timeout_s") or 0)
        if hb <= pg:
            return Prediction(*chain(("heartbeat_timeout_s", hb), monitor),
                              note="the watchdog sees no step for heartbeat_timeout_s")  # fmt: skip
        return Prediction(*chain((pg_name, pg), monitor),
                          note="the peers' process-group timeout fires first: their exit is detected, and blamed")  # fmt: skip

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        pg_name, pg = pg_timeout(timeouts)
        hb = float(timeouts.get("heartbeat_timeout_s") or 0)
        if hb >= pg:
            return [f"heartbeat_timeout_s ({hb:g} s) >= {pg_name} ({pg:g} s): a hung rank's peers always time out "
                    "first, so the heartbeat never decides and a survivor is blamed"]  # fmt: skip
        return []

    def _hang(self, job: JobContext, beats: _Heartbeats, launched_ns: int) -> Failure | None:
        o: Any = self.options
        now = now_ns()
        stale = beats.stale(job.ranks, o.heartbeat_timeout_s, now)
        if stale is not None:
            return Failure(f"rank {stale[0]}: no heartbeat for {stale[1]:.2f} s (timeout {o.heartbeat_timeout_s} s)",
                           stale[0])  # fmt: skip
        if not beats.any_step() and (now - launched_ns) / 1e9 > o.startup_timeout_s:
            return Failure(f"no step within startup timeout {o.startup_timeout_s} s", None)
        return None

