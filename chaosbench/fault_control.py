"""Fault control for one run: watches the timeline, fires the fault when its trigger says so, resolves the
targets from the ranks' own ``rank_start`` events, and guarantees the reverts."""

from __future__ import annotations

import random
import threading
from typing import Any

from chaosbench.errors import ChaosbenchError, SpecError, TargetNotFound
from chaosbench.injectors.base import FaultContext, Injector, ResolvedTarget, RunSetup
from chaosbench.specs import RECOVERY_PHASES, FaultSpec
from chaosbench.timeline import Event, now_ns

#: Events that mark a job's first progress, from which ``after_s`` and ``poisson`` triggers count: a training
#: step, or the start of a serving run's load (the ``serve`` workload's ``load_start``).
PROGRESS_START = frozenset({"step", "load_start"})


class FaultController:
    """Fires one fault (once, or repeatedly for ``every_steps``/``poisson``/``max_fires``). Subscribe it to the
    run's :class:`~chaosbench.timeline.TimelineFollower`; call :meth:`close` at the end of the run (also on
    interruption) to cancel pending firings and revert every firing still in force."""

    def __init__(
        self, fault_name: str, spec: FaultSpec, injector: Injector, setup: RunSetup, rng_seed: int
    ) -> None:
        if spec.trigger is None:
            raise SpecError("has no trigger", obj=f"fault '{fault_name}'")
        self.fault_name = fault_name
        self.spec = spec
        self.trigger = spec.trigger
        self.injector = injector
        self.setup = setup
        self.runtime = setup.runtime
        self.timeline = setup.timeline
        self.rng = random.Random(rng_seed)
        self.fires = 0  # firings scheduled or done
        self._ranks: dict[int, Event] = {}  # rank -> its newest rank_start
        self._procs: dict[int, Event] = {}  # pid -> proc_start of the processes alive (role targets)
        self._events: list[Event] = []
        self._world_size: int | None = None
        self._active: list[FaultContext] = []
        self._timers: list[threading.Timer] = []
        self._fired_keys: set[Any] = set()
        self._reach: dict[int, dict[int, int]] = {}  # incarnation -> rank -> the highest step it reported
        self._job_step: dict[int, int] = {}  # incarnation -> the highest step every stepping rank reached
        self._started = False
        self._recovering = False  # on_phase: another fault of the run has fired
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._closed = False

    @property
    def fired(self) -> bool:
        return self.fires > 0

    def _exhausted(self) -> bool:
        limit = self.trigger.fire_limit
        return limit is not None and self.fires >= limit

    # -- timeline subscriber
    def __call__(self, ev: Event) -> None:
        with self._lock:
            self._events.append(ev)
            if ev.kind == "rank_start":
                rank = int(ev.get("rank", 0))
                old = self._ranks.get(rank)
                if old is None or int(ev.get("incarnation", 0)) >= int(old.get("incarnation", 0)):
                    self._ranks[rank] = ev
                self._world_size = int(ev.get("world_size") or 0) or self._world_size
            elif ev.kind in ("proc_start", "helper_start"):
                self._procs[int(ev.get("pid") or 0)] = ev
            elif ev.kind == "proc_exit":
                self._procs.pop(int(ev.get("pid") or 0), None)
            if self._closed or self._exhausted():
                return
            trig = self.trigger
            # time-based triggers count from the job's first progress: a training step, or served traffic
            first_step = ev.kind in PROGRESS_START and not self._started
            if ev.kind in PROGRESS_START:
                self._started = True
            if trig.after_s is not None and first_step:
                self._timer(trig.after_s + trig.delay_s, self.fire, f"{trig.after_s} s after the first step")
                self.fires += 1
            elif trig.poisson is not None and first_step:
                threading.Thread(target=self._poisson, args=(trig.poisson.mtbf_s,), daemon=True).start()
            elif trig.on_event is not None and self._matches(ev):
                self._schedule(f"event {ev.kind}")
            elif trig.on_phase is not None:
                self._phase(ev, trig.on_phase)
            elif ev.kind == "step" and (trig.at_step is not None or trig.every_steps is not None):
                reached = self._job_step_reached(ev)
                if reached is None:
                    return
                before, step = reached
                if trig.at_step is not None and step >= trig.at_step:
                    key = ("inc", int(ev.get("incarnation", 0)))  # at most once per incarnation
                    if key not in self._fired_keys:
                        self._fired_keys.add(key)
                        self._schedule(f"step {step} completed", step)
                elif trig.every_steps is not None and step // trig.every_steps > before // trig.every_steps:
                    passed = (
                        step // trig.every_steps * trig.every_steps
                    )  # the newest multiple the job got past
                    if ("step", passed) not in self._fired_keys:
                        self._fired_keys.add(("step", passed))
                        self._schedule(f"step {step} completed (every {trig.every_steps})", step)

    def _job_step_reached(self, ev: Event) -> tuple[int, int] | None:
        """Step triggers act on job steps, as the metrics count them (:class:`~chaosbench.analysis.timeline_index.
        JobSteps`): the job has done step N once every rank that reports steps in this incarnation has reported
        N or a later one (so a kill "at step N" never lands between two ranks' reports of step N, and a rank
        that logs every 5th step, or not at all, holds nothing up). (the job's step before this report, after
        it) when the report moved it on, else None."""
        inc, rank, step = int(ev.get("incarnation", 0)), int(ev.get("rank", 0)), int(ev.get("step", 0))
        reach = self._reach.setdefault(inc, {})
        reach[rank] = max(reach.get(rank, 0), step)
        before = self._job_step.get(inc, 0)
        job = min(reach.values())
        if job <= before:
            return None
        self._job_step[inc] = job
        return before, job

    def _phase(self, ev: Event, phase: str) -> None:
        """``on_phase``: the first event of ``phase`` (:data:`~chaosbench.specs.RECOVERY_PHASES`) after another
        fault of the run took effect."""
        if ev.kind == "fault_inject" and ev.get("fault") != self.fault_name:
            self._recovering = True
        elif self._recovering and ev.kind in RECOVERY_PHASES[phase]:
            what = f"{phase} phase ({ev.kind}" + (
                f" of rank {ev.get('rank')})" if ev.get("rank") is not None else ")"
            )
            self._schedule(what)

    def _matches(self, ev: Event) -> bool:
        m = self.trigger.on_event
        assert m is not None
        if ev.kind != m.kind:
            return False
        return all(
            v is None or ev.get(k) == v
            for k, v in (("step", m.step), ("rank", m.rank), ("incarnation", m.incarnation))
        )

    def _schedule(self, why: str, step: int | None = None) -> None:
        self.fires += 1
        delay = self.trigger.delay_s
        if delay > 0:
            self._timer(delay, self.fire, why + f" + {delay} s")
        else:
            self.fire(why, counted=True, trigger_step=step)

    def _timer(self, delay_s: float, fn: Any, *args: Any) -> None:
        t = threading.Timer(delay_s, fn, args=args, kwargs={"counted": True} if fn == self.fire else None)
        t.daemon = True
        self._timers.append(t)
        t.start()

    def _poisson(self, mtbf_s: float) -> None:
        """Poisson arrivals: exponential gaps with mean ``mtbf_s`` from the seeded generator."""
        while True:
            with self._lock:
                if self._closed or self._exhausted():
                    return
                gap = self.rng.expovariate(1.0 / mtbf_s)
            if self._stop.wait(gap):
                return
            with self._lock:
                if self._closed or self._exhausted():
                    return
                self.fires += 1
            self.fire(f"poisson arrival (mtbf {mtbf_s} s)", counted=True)

    # -- targets
    def _resolve_role(self, name: str) -> list[ResolvedTarget]:
        """A ``role`` target: the framework's process of that role (:class:`~chaosbench.injectors.base.Role`)."""
        role = self.setup.roles.get(name)
        if role is None:
            raise TargetNotFound(f"role {name}", "no such role", message=f"the framework has no {name}")
        if role.rank is not None:
            ev = self._ranks.get(role.rank)
            if ev is None:
                raise TargetNotFound(
                    f"rank {role.rank}",
                    "no rank_start event",
                    message=f"rank {role.rank} ({name}) has not reported a rank_start event",
                )
            return [_target_of(ev, role.rank, name)]
        node = self.spec.target.node or role.node
        alive = [e for e in self._procs.values() if e.get("role") == role.proc_role]
        mine = [e for e in alive if node is None or e.get("node") == node] or alive
        if not mine:
            raise TargetNotFound(
                f"role {name}",
                f"no live {role.proc_role} process",
                message=f"no live {role.proc_role} process for role {name}",
            )
        ev = max(mine, key=lambda e: e.t_ns)
        rank = ev.get("rank")  # a helper of one rank (nvrx's bridge) names it
        return [_target_of(ev, None if rank is None else int(rank), name)]

    def _resolve(self) -> list[ResolvedTarget]:
        tgt = self.spec.target
        with self._lock:
            if tgt.role is not None:
                return self._resolve_role(tgt.role)
            known = sorted(self._ranks)
            n = self._world_size or (max(known) + 1 if known else self.setup.ranks)
            if tgt.all:
                ranks = list(range(n))
            elif tgt.ranks is not None:
                ranks = list(tgt.ranks)
            elif tgt.node is not None:
                nodes = sorted({str(e.get("node")) for e in self._ranks.values()})
                node = self.rng.choice(nodes) if tgt.node == "random" and nodes else tgt.node
                ranks = [r for r, e in sorted(self._ranks.items()) if e.get("node") == node]
                if not ranks:
                    raise TargetNotFound(
                        f"node {node}", "no rank started", message=f"no rank has started on node {node}"
                    )
            elif tgt.rank == "random":
                ranks = [self.rng.randrange(n)]
            else:
                ranks = [int(tgt.rank)]  # type: ignore[arg-type]
            out = []
            for r in ranks:
                ev = self._ranks.get(r)
                if ev is None:
                    if self.injector.needs_process:
                        raise TargetNotFound(
                            f"rank {r}",
                            "no rank_start event",
                            message=f"rank {r} has not reported a rank_start event",
                        )
                    out.append(ResolvedTarget(r, None, None, f"node{r // max(1, n // self.setup.nodes)}", 0))
                    continue
                out.append(_target_of(ev, r))
            return out

    def fire(self, why: str, counted: bool = False, trigger_step: int | None = None) -> None:
        """Apply the fault now. ``trigger_step``: the job step a step trigger fired at (the fault should land
        right after it; the metrics report how far past it the fault actually landed)."""
        with self._lock:
            if self._closed:
                return
            if not counted:
                if self._exhausted():
                    return
                self.fires += 1
            index = len(self._active) + sum(1 for e in self._events if e.kind == "fault_skipped")
            base: dict[str, Any] = {
                "fault": self.fault_name,
                "injector": self.injector.name,
                "trigger": why,
                "index": index,
            }
            try:
                targets = self._resolve()
                ctx = FaultContext(
                    self.runtime,
                    self.timeline,
                    targets,
                    self.rng,
                    self.setup,
                    events=list(self._events),
                    index=index,
                )
                t_ns = now_ns()
                details = dict(self.injector.inject(ctx))
                returned_ns = now_ns()
            except (ChaosbenchError, ProcessLookupError, OSError) as exc:
                self.timeline.emit(
                    "fault_skipped", src="injector", reason=str(exc) or type(exc).__name__, **base
                )
                return
            self._active.append(ctx)
            # When the fault took effect: the injector's own stamp where it has one (a signal delivered on a
            # remote node), else the moment its action returned (the action was synchronous: done by then).
            effect_ns = details.pop("effect_t_ns", None)
            effect = (
                details.pop("effect", None) if effect_ns is not None else "the injector's action returned"
            )
            self.timeline.emit(
                "fault_inject",
                t_ns=t_ns,
                src="injector",
                target=[t.to_dict() for t in targets],
                params=self.injector.params.model_dump(),
                details=details,
                effect_t_ns=int(effect_ns) if effect_ns is not None else returned_ns,
                effect=effect,
                injection_latency_s=((int(effect_ns) if effect_ns is not None else returned_ns) - t_ns) / 1e9,
                trigger_step=trigger_step,
                **self.injector.declared(),
                **base,
            )
            if self.injector.duration_s is not None:
                t = threading.Timer(self.injector.duration_s, self._revert, args=(ctx, "duration elapsed"))
                t.daemon = True
                self._timers.append(t)
                t.start()

    def _revert(self, ctx: FaultContext, reason: str) -> None:
        with self._lock:
            if ctx not in self._active:
                return
            self._active.remove(ctx)
            base: dict[str, Any] = {
                "fault": self.fault_name,
                "injector": self.injector.name,
                "index": ctx.index,
                "reason": reason,
            }
            # The fault's effect ends somewhere in the revert (a rule deleted first, its helper stopped after):
            # when it began bounds the time it was certainly in force, as fault_inject's effect_t_ns does the start
            base["began_t_ns"] = now_ns()
            try:
                undone = self.injector.revert(ctx)
            except Exception as exc:  # noqa: BLE001 - report and keep the harness alive
                self.timeline.emit("fault_revert", src="injector", error=str(exc), **base)
                return
            self.timeline.emit("fault_revert", src="injector", undone=undone, **base)

    def close(self) -> None:
        """Cancel pending firings and revert every firing still in force. Idempotent."""
        with self._lock:
            self._closed = True
            self._stop.set()
            timers, self._timers = self._timers, []
            active = list(self._active)
        for t in timers:
            t.cancel()
        for ctx in active:
            self._revert(ctx, "run ended")


def _target_of(ev: Event, rank: int | None, role: str | None = None) -> ResolvedTarget:
    """The target a process's start event (``rank_start``, ``proc_start``, ``helper_start``) identifies."""
    return ResolvedTarget(
        rank,
        int(ev["pid"]),
        ev.get("pid_ticks"),
        str(ev.get("node", "node0")),
        int(ev.get("incarnation", 0)),
        role=role,
    )
