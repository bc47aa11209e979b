"""The ``none`` adapter: one process per rank, launched directly; a failed rank ends the job (no recovery: the
baseline). Its supervision loop also serves ``restart`` (:mod:`chaosbench.frameworks.restart`), which adds a
step watchdog and relaunches."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    Prediction,
    RunControl,
    Stopped,
    supervise_loop,
    torchrun_worker_env,
)
from chaosbench.injectors.base import Role
from chaosbench.runtimes.base import ProcessSpec, ProcHandle
from chaosbench.timeline import Event, now_ns


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name} ({rc})"
        except ValueError:
            return f"signal {-rc} ({rc})"
    return f"code {rc}"


def rank_processes(
    job: JobContext, incarnation: int, master_port: int, max_restarts: int = 0
) -> list[ProcessSpec]:
    """One process per rank of ``incarnation`` (the adapter's restarts so far; ``max_restarts``: its retry limit),
    each with torchrun's worker environment (:func:`~chaosbench.frameworks.base.torchrun_worker_env`); ranks fill
    node0 first."""
    argv = job.workload_argv()
    procs = []
    per_node = job.ranks_per_node
    for rank in range(job.ranks):
        node = job.node_name(rank // per_node)
        env = job.rank_env(incarnation, node)
        env.update(
            torchrun_worker_env(
                rank=rank,
                local_rank=rank % per_node,
                group_rank=rank // per_node,
                world_size=job.ranks,
                local_world_size=per_node,
                group_world_size=job.nodes,
                master_addr=job.runtime.master_addr,
                master_port=master_port,
                run_id=job.run_id,
                restart_count=incarnation,
                max_restarts=max_restarts,
                inherited={**os.environ, **env},
            )
        )
        procs.append(
            ProcessSpec(
                name=f"rank{rank}.i{incarnation}",
                argv=argv,
                env=env,
                role="rank",
                node=node,
                incarnation=incarnation,
            )
        )
    return procs


@dataclass
class Failure:
    """Why the watchdog considers the incarnation failed, and the rank it blames (None: no one in particular)."""

    reason: str
    rank: int | None
    via: str = "exit"  # what noticed it (the ``detect`` event's ``via``)


class Watchdog(Protocol):
    """A liveness watch fed from the timeline (subscribe it to the follower)."""

    def __call__(self, ev: Event) -> None: ...
    def reset(self, incarnation: int) -> None: ...
    def check(self, ranks: int, launched_ns: int) -> Failure | None: ...


class NoneOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kill_on_bad_exit: bool = Field(
        default=True, description="when a rank fails, stop the others (as srun --kill-on-bad-exit does)"
    )
    monitor_interval_s: float = Field(default=0.05, gt=0)
    teardown_grace_s: float = Field(default=5.0, ge=0)


#: The options of ``none`` or of an adapter built on it (``restart``): a NoneOptions.
NO = TypeVar("NO", bound=NoneOptions)


class NoneFramework(Framework[NO]):
    """No recovery: the baseline. Launches the ranks and waits; a failed rank ends the job.

    Typed by its options (NoneOptions, or a subclass's: ``RestartFramework(NoneFramework[RestartOptions])``)."""

    name: ClassVar[str] = "none"
    Options = NoneOptions
    restarts_allowed: ClassVar[bool] = False
    roles: ClassVar[dict[str, Role]] = {
        **Framework.roles,
        "rendezvous-host": Role("rank 0's process: it hosts the TCPStore of env:// initialization", rank=0),
    }

    def plan(self, job: JobContext) -> LaunchPlan:
        return self.launch_plan(job, rank_processes(job, 0, job.runtime.free_port(), self.max_restarts()))

    def max_restarts(self) -> int:
        """Relaunches before giving up (the ranks' ``TORCHELASTIC_MAX_RESTARTS``): none here."""
        return 0

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        t.update({"monitor_interval_s": o.monitor_interval_s, "teardown_grace_s": o.teardown_grace_s})
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        return Prediction(None, "", note="no detector: a failed rank ends the job, a hung one stalls it")

    def _failure(self, handles: list[ProcHandle]) -> Failure | None:
        """Why the current incarnation has failed, or None while it looks healthy."""
        for h in handles:
            rc = h.poll()
            if rc is not None and rc != 0:
                return Failure(f"{h.name} exited with {describe_exit(rc)}", int(h.spec.env["RANK"]))
        return None

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o = self.options
        watchdog = self.watchdog(job)
        if watchdog is not None:
            control.follower.subscribe(watchdog)
        incarnation, attempts = 0, 0
        specs = plan.processes
        while True:
            if watchdog is not None:
                watchdog.reset(incarnation)
            launched_ns = now_ns()
            handles = [control.runtime.start(s) for s in specs]

            def step(
                handles: list[ProcHandle] = handles, launched_ns: int = launched_ns
            ) -> JobResult | Failure | None:
                if control.stop_reason():  # the ranks are not looked at once the run is stopped
                    return None
                if all(h.poll() == 0 for h in handles):
                    return JobResult("completed")
                failure = self._failure(handles)
                if failure is None and watchdog is not None:
                    failure = watchdog.check(job.ranks, launched_ns)
                return failure

            # this loop is the framework: its poll every monitor_interval_s is how soon it detects (modelled)
            seen: JobResult | Failure | Stopped = supervise_loop(
                control, step, o.monitor_interval_s, wake_on_exit=False
            )
            if isinstance(seen, Stopped):
                return seen.result()
            if isinstance(seen, JobResult):
                return seen
            failure = seen
            if not self.restarts_allowed:
                if o.kill_on_bad_exit:
                    control.runtime.terminate(handles, o.teardown_grace_s)
                else:

                    def all_exited(handles: list[ProcHandle] = handles) -> bool | None:
                        return True if all(h.exited.is_set() for h in handles) else None

                    if isinstance(supervise_loop(control, all_exited, o.monitor_interval_s), Stopped):
                        return JobResult(control.stop_reason() or "deadline", failure.reason)
                return JobResult("failed", failure.reason)
            blame = {} if failure.rank is None else {"blame_rank": failure.rank}
            control.timeline.emit(
                "detect",
                src="framework",
                framework=self.label,
                reason=failure.reason,
                via=failure.via,
                **blame,
            )
            control.runtime.terminate(handles, o.teardown_grace_s)
            if attempts >= self.max_restarts():
                control.timeline.emit(
                    "give_up",
                    src="framework",
                    framework=self.label,
                    reason=f"retry limit reached ({self.max_restarts()} restarts): {failure.reason}",
                )
                return JobResult("gave_up", failure.reason)
            attempts += 1
            incarnation += 1
            control.timeline.emit(
                "restart", src="framework", framework=self.label, attempt=attempts, reason=failure.reason
            )
            if self.restart_delay_s():
                control.sleep(self.restart_delay_s())
            specs = rank_processes(job, incarnation, job.runtime.free_port(), self.max_restarts())

    def restart_delay_s(self) -> float:
        """Seconds to wait before a relaunch (a scheduler's delay): none here (nor any relaunch)."""
        return 0.0

    def watchdog(self, job: JobContext) -> Watchdog | None:
        """What watches the ranks' liveness beyond their exits (``restart``: a step heartbeat); none here."""
        return None
