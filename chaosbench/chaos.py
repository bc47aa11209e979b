"""Fault control for one run: watches the timeline, fires the fault when its trigger says so, resolves the
target from the ranks' own ``rank_start`` events, and guarantees the revert."""

from __future__ import annotations

import random
import threading
from typing import Any

from chaosbench.errors import ChaosbenchError
from chaosbench.injectors.base import FaultContext, Injector, ResolvedTarget
from chaosbench.runtimes.base import Runtime
from chaosbench.specs import FaultSpec
from chaosbench.timeline import Event, TimelineWriter, now_ns


class FaultController:
    """Fires one fault once. Subscribe it to the run's :class:`~chaosbench.timeline.TimelineFollower`;
    call :meth:`close` at the end of the run (also on interruption) to cancel timers and revert."""

    def __init__(
        self,
        fault_name: str,
        spec: FaultSpec,
        injector: Injector,
        runtime: Runtime,
        timeline: TimelineWriter,
        rng_seed: int,
    ) -> None:
        self.fault_name = fault_name
        self.spec = spec
        self.injector = injector
        self.runtime = runtime
        self.timeline = timeline
        self.rng = random.Random(rng_seed)
        self.fired = threading.Event()
        self._ranks: dict[int, Event] = {}  # rank -> its newest rank_start
        self._world_size: int | None = None
        self._ctx: FaultContext | None = None
        self._timers: list[threading.Timer] = []
        self._lock = threading.RLock()
        self._closed = False

    # -- timeline subscriber
    def __call__(self, ev: Event) -> None:
        if ev.kind == "rank_start":
            with self._lock:
                rank = int(ev.get("rank", 0))
                old = self._ranks.get(rank)
                if old is None or int(ev.get("incarnation", 0)) >= int(old.get("incarnation", 0)):
                    self._ranks[rank] = ev
                self._world_size = int(ev.get("world_size") or 0) or self._world_size
            return
        if ev.kind != "step" or self.fired.is_set():
            return
        trig = self.spec.trigger
        if trig.at_step is not None and int(ev.get("step", 0)) >= trig.at_step:
            self.fire(f"step {ev.get('step')} completed")
        elif trig.after_s is not None and not self._timers:
            self._start_timer(trig.after_s, self.fire, f"{trig.after_s} s after the first step")

    def _start_timer(self, delay_s: float, fn: Any, *args: Any) -> None:
        with self._lock:
            if self._closed:
                return
            t = threading.Timer(delay_s, fn, args=args)
            t.daemon = True
            self._timers.append(t)
            t.start()

    def _resolve(self) -> ResolvedTarget:
        want = self.spec.target.rank
        with self._lock:
            if want == "random":
                n = self._world_size or (max(self._ranks) + 1 if self._ranks else 0)
                if n <= 0:
                    raise ChaosbenchError("no rank has started yet")
                want = self.rng.randrange(n)
            ev = self._ranks.get(int(want))
        if ev is None:
            raise ChaosbenchError(f"rank {want} has not reported a rank_start event")
        return ResolvedTarget(
            rank=int(want),
            pid=int(ev["pid"]),
            pid_ticks=ev.get("pid_ticks"),
            node=str(ev.get("node", "node0")),
            incarnation=int(ev.get("incarnation", 0)),
        )

    def fire(self, why: str) -> None:
        with self._lock:
            if self.fired.is_set() or self._closed:
                return
            self.fired.set()
            base: dict[str, Any] = {"fault": self.fault_name, "injector": self.injector.name, "trigger": why}
            try:
                target = self._resolve()
                ctx = FaultContext(self.runtime, self.timeline, target, self.rng)
                t_ns = now_ns()
                details = self.injector.inject(ctx)
            except (ChaosbenchError, ProcessLookupError, OSError) as exc:
                self.timeline.emit("fault_skipped", src="injector", reason=str(exc) or type(exc).__name__, **base)
                return
            self._ctx = ctx
            self.timeline.emit(
                "fault_inject",
                t_ns=t_ns,
                src="injector",
                target=target.to_dict(),
                params=self.injector.params.model_dump(),
                details=details,
                **base,
            )
            if self.injector.duration_s is not None:
                self._start_timer(self.injector.duration_s, self.revert, "duration elapsed")

    def revert(self, reason: str) -> None:
        with self._lock:
            ctx = self._ctx
            if ctx is None:
                return
            self._ctx = None
            try:
                undone = self.injector.revert(ctx)
            except Exception as exc:  # noqa: BLE001 - report and keep the harness alive
                self.timeline.emit("fault_revert", src="injector", fault=self.fault_name,
                                   injector=self.injector.name, reason=reason, error=str(exc))
                return
            self.timeline.emit("fault_revert", src="injector", fault=self.fault_name, injector=self.injector.name,
                               reason=reason, undone=undone)

    def close(self) -> None:
        """Cancel pending triggers and revert the fault if it is still in force. Idempotent."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()
        self.revert("run ended")
