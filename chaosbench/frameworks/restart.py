"""The ``restart`` adapter: job-level checkpoint-restart, as a scheduler requeue would do it. A dead rank (by its
exit) or a hung one (no step for ``heartbeat_timeout_s``) tears the whole job down and relaunches every rank; the
workload resumes from its newest complete checkpoint."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from pydantic import Field

from chaosbench.frameworks.base import JobContext, Prediction, chain, pg_timeout
from chaosbench.frameworks.none import Failure, NoneFramework, NoneOptions
from chaosbench.timeline import Event, now_ns


class StepWatchdog:
    """Last sign of life of each rank of the current incarnation, fed from the timeline: a rank that has
    stepped and then shows nothing for ``heartbeat_timeout_s`` is hung; no step at all within
    ``startup_timeout_s`` of the launch is a failed start. A rank past its ``train_end``, or past the workload's
    last step (``total_steps``: a script that prints nothing at the end), is done: a slow exit is no hang."""

    BEATS = ("rank_start", "step", "ckpt_save_begin", "ckpt_save_end", "ckpt_load_begin", "ckpt_load_end")

    def __init__(
        self, heartbeat_timeout_s: float, startup_timeout_s: float, total_steps: int | None = None
    ) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.total_steps = total_steps  # a rank that reached it is done (a script with no closing line)
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
                if self.total_steps is not None and int(ev.get("step", 0)) >= self.total_steps:
                    self.finished.add(rank)

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

    def check(self, ranks: int, launched_ns: int) -> Failure | None:
        now = now_ns()
        stale = self.stale(ranks, self.heartbeat_timeout_s, now)
        if stale is not None:
            return Failure(
                f"rank {stale[0]}: no heartbeat for {stale[1]:.2f} s (timeout {self.heartbeat_timeout_s} s)",
                stale[0],
                via="step watchdog",
            )
        if not self.any_step() and (now - launched_ns) / 1e9 > self.startup_timeout_s:
            return Failure(
                f"no step within startup timeout {self.startup_timeout_s} s", None, via="step watchdog"
            )
        return None


class RestartOptions(NoneOptions):
    max_restarts: int = Field(default=3, ge=0, description="relaunches before giving up")
    heartbeat_timeout_s: float = Field(
        default=10.0, gt=0, description="a rank with no step for this long is hung"
    )
    startup_timeout_s: float = Field(default=120.0, gt=0, description="launch to first step, per incarnation")
    restart_delay_s: float = Field(default=0.0, ge=0, description="scheduler delay before relaunch")


class RestartFramework(NoneFramework[RestartOptions]):
    """Job-level checkpoint-restart: a dead rank (by its exit) or a hung one (no step heartbeat for
    ``heartbeat_timeout_s``) tears the whole job down and relaunches it; the workload resumes from its
    newest complete checkpoint. Gives up after ``max_restarts`` relaunches."""

    name: ClassVar[str] = "restart"
    restarts_allowed: ClassVar[bool] = True

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        t.update(
            {
                "heartbeat_timeout_s": o.heartbeat_timeout_s,
                "startup_timeout_s": o.startup_timeout_s,
                "restart_delay_s": o.restart_delay_s,
            }
        )
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        monitor = ("monitor_interval_s", timeouts.get("monitor_interval_s"))
        if mode == "crash":
            return Prediction(*chain(monitor), note="the watchdog polls every rank's exit")
        if mode not in ("hang", "stall"):  # the watchdog watches steps: a live rank without them is as hung
            return None
        pg_name, pg = pg_timeout(timeouts)
        hb = float(timeouts.get("heartbeat_timeout_s") or 0)
        if hb <= pg:
            return Prediction(
                *chain(("heartbeat_timeout_s", hb), monitor),
                note="the watchdog sees no step for heartbeat_timeout_s",
            )
        return Prediction(
            *chain((pg_name, pg), monitor),
            note="the peers' process-group timeout fires first: their exit is detected, and blamed",
        )

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        pg_name, pg = pg_timeout(timeouts)
        hb = float(timeouts.get("heartbeat_timeout_s") or 0)
        if hb >= pg:
            return [
                f"heartbeat_timeout_s ({hb:g} s) >= {pg_name} ({pg:g} s): a hung rank's peers always time out "
                "first, so the heartbeat never decides and a survivor is blamed"
            ]
        return []

    def max_restarts(self) -> int:
        o = self.options
        return int(o.max_restarts)

    def restart_delay_s(self) -> float:
        return self.options.restart_delay_s

    def watchdog(self, job: JobContext) -> StepWatchdog:
        o = self.options
        return StepWatchdog(o.heartbeat_timeout_s, o.startup_timeout_s, job.workload.total_steps)
