"""Planted faults: failures that only the training process itself can produce.

The planted injectors (:class:`chaosbench.injectors.base.PlantedInjector`) each put one entry into the ranks'
environment before launch: ``CHAOSBENCH_PLANTED``, a JSON list of ``{"fault", "injector", "ranks", "at_step",
...the injector's params}`` (``ranks``: ``all`` or ``0,2``). A workload builds one :class:`Planted` and calls its
hooks in its loop (:meth:`Planted.before_step`, :meth:`Planted.after_backward`, :meth:`Planted.after_update`,
:meth:`Planted.check_loss`); a fault due on this rank fires from inside, writing its own ``fault_inject`` event
through the probe first (stamped at the moment it acts). The built-in workloads do this; a user's script can too.

What fires, at the ``at_step`` of its entry, on its ranks:

- ``crash-loop``: raises, in every incarnation (a deterministic bug), or in every one from ``from_incarnation`` on
  (a bug that arrives with the first restart: a replica restarted after a kill that then crash-loops as it loads).
- ``sdc``: corrupts this rank's gradients (after backward, before the update) or parameters (after the update,
  or right before the first checkpoint save at or after ``at_step``: :meth:`Planted.before_save`) with NaN, a
  scale or a flipped exponent bit; ``loss_check`` turns on the non-finite loss guard.
- ``segfault``: a real SIGSEGV from native code (a read of address 0).
- ``abort``: SIGABRT (``abort(3)``).
- ``thread-exception``: a background thread dies of an exception the main loop never sees; with
  ``mode: stall`` the main loop then waits for that thread's output for good (alive, heartbeats running).
- ``gil-hold``: native code holds the GIL for ``duration_s``: every Python thread of the rank starves.
- ``oom``: the rank joins the memory cgroup the harness prepared (``cgroup``) and grows until the kernel's
  OOM killer ends it.
- ``collective-hang``: ``mode: block``: the main loop waits before the step's first collective (for
  ``duration_s``, or for good), its other threads running on. ``skip`` / ``mismatch``: the workload changes this
  step's gradient collective (:meth:`Planted.sync_fault` says how: ``skip``, ``shape`` or ``op``).

Every fault but ``crash-loop`` fires once per run: a marker file in the run directory keeps a recomputed step
after a restart from firing again (a transient fault).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosbench.probe import Probe

#: The environment variable that carries the planted faults' entries.
ENV_PLANTED = "CHAOSBENCH_PLANTED"
#: Bytes an ``oom`` fault allocates (and touches) at a time.
OOM_CHUNK_BYTES = 16 << 20


class PlantedFault(RuntimeError):
    """Raised by a planted deterministic bug."""


@dataclass
class Plant:
    """One planted fault's entry, as the harness wrote it."""

    fault: str
    injector: str
    ranks: set[int] | None  # None: all ranks
    at_step: int
    params: dict[str, Any] = field(default_factory=dict)
    #: What the injector declares about the fault (``fault_class``, ``failure_mode``, ``damages_checkpoint``),
    #: written into the ``fault_inject`` event as it is (empty for an entry written without it).
    declared: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> Plant:
        entry = dict(entry)
        ranks = str(entry.pop("ranks", "all"))
        return cls(
            fault=str(entry.pop("fault")),
            injector=str(entry.pop("injector")),
            ranks=None if ranks == "all" else {int(r) for r in ranks.split(",") if r.strip()},
            at_step=int(entry.pop("at_step")),
            declared=dict(entry.pop("declared", None) or {}),
            params=entry,
        )


def plants_from_env(env: dict[str, str] | None = None) -> list[Plant]:
    env = dict(os.environ) if env is None else env
    return [Plant.from_entry(e) for e in json.loads(env.get(ENV_PLANTED) or "[]")]


class Planted:
    def __init__(self, probe: Probe, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.probe = probe
        self.rank = probe.rank
        plants = plants_from_env(env)
        self.plants = [p for p in plants if p.ranks is None or self.rank in p.ranks]
        # the loss guard runs on every rank (the corruption spreads through the next allreduce)
        self.loss_check = any(p.injector == "sdc" and p.params.get("loss_check") for p in plants)
        run_dir = env.get("CHAOSBENCH_RUN_DIR")
        self._run_dir = Path(run_dir) if run_dir else None
        self._before_step = {
            "crash-loop": self._crash,
            "segfault": self._segfault,
            "abort": self._abort,
            "thread-exception": self._thread_exception,
            "gil-hold": self._gil_hold,
            "oom": self._oom,
            "collective-hang": self._collective_block,
        }

    # ------------------------------------------------------------------------------------------ bookkeeping
    def _marker(self, plant: Plant) -> Path | None:
        return self._run_dir / f"planted-fired.{plant.fault}.rank{self.rank}" if self._run_dir else None

    def _due(self, plant: Plant, step: int, once: bool = True) -> bool:
        """Whether ``plant`` fires at ``step`` here; a once-per-run fault is marked fired as it is found due."""
        if step != plant.at_step:
            return False
        marker = self._marker(plant)
        if not once or marker is None:
            return True
        if marker.exists():
            return False
        marker.write_text(str(step))
        return True

    def _fired(self, plant: Plant, step: int, trigger: str = "", **details: Any) -> None:
        """The ``fault_inject`` event, written before the fault acts (a segfault leaves no later chance)."""
        self.probe.emit(
            "fault_inject",
            fault=plant.fault,
            injector=plant.injector,
            step=step,
            target=[{"rank": self.rank, "pid": os.getpid(), "incarnation": self.probe.incarnation}],
            trigger=trigger or f"planted {plant.injector} at step {step}",
            **plant.declared,
            **details,
        )

    # ------------------------------------------------------------------------------------------------ hooks
    def before_step(self, step: int) -> None:
        """Call before computing ``step``: the process-level faults fire here."""
        for plant in self.plants:
            act = self._before_step.get(plant.injector)
            if (
                act is not None
                and not _desync(plant)
                and self._due(plant, step, once=plant.injector != "crash-loop")
            ):
                act(plant, step)

    @property
    def desyncs(self) -> bool:
        """Whether a planted ``collective-hang`` will change one of this rank's gradient collectives (a workload
        that needs to prepare for it, a DDP comm hook, asks before training)."""
        return any(_desync(p) for p in self.plants)

    def sync_fault(self, step: int) -> str | None:
        """How this rank's gradient collective of ``step`` goes wrong: ``skip`` (it is left out), ``shape`` (called
        with one element fewer), ``op`` (MAX where the peers SUM), or None. Call once per step, before the
        collective: a due fault's ``fault_inject`` is written here."""
        for plant in self.plants:
            kind = _desync(plant)
            if kind is not None and self._due(plant, step):
                self._fired(
                    plant,
                    step,
                    mode=plant.params.get("mode"),
                    desync=kind,
                    trigger=f"planted collective desync ({kind}) at step {step}",
                )
                return kind
        return None

    def after_backward(self, step: int, params: Any) -> None:
        """Call after backward (gradients reduced), before the optimizer update."""
        self._sdc(step, "grad", lambda: [p.grad for p in params])

    def after_update(self, step: int, params: Any) -> None:
        """Call after the optimizer update."""
        self._sdc(step, "param", lambda: [p.data for p in params])

    def before_save(self, step: int, params: Any) -> None:
        """Call right before saving the checkpoint of ``step``: an ``sdc`` with ``where: save`` due at or before
        ``step`` corrupts the parameters now, so the checkpoint holds the damage."""
        for plant in self.plants:
            if plant.injector == "sdc" and plant.params.get("where") == "save" and step >= plant.at_step:
                marker = self._marker(plant)
                if marker is not None and marker.exists():
                    continue
                if marker is not None:
                    marker.write_text(str(step))
                self._corrupt(plant, [p.data for p in params], step, checkpoint_step=step)

    def check_loss(self, step: int, loss: float) -> None:
        """With the loss guard on, a non-finite loss is detected and raises."""
        if self.loss_check and not math.isfinite(loss):
            self.probe.emit(
                "detect", framework="loss-check", via="loss guard", reason=f"loss is {loss} at step {step}"
            )
            raise FloatingPointError(f"loss check: loss is {loss} at step {step} on rank {self.rank}")

    # ----------------------------------------------------------------------------------------------- faults
    def _crash(self, plant: Plant, step: int) -> None:
        if self.probe.incarnation < int(plant.params.get("from_incarnation", 0)):
            return
        self._fired(plant, step, trigger=f"planted bug at step {step}")
        raise PlantedFault(f"planted bug: deterministic failure at step {step} on rank {self.rank}")

    def _segfault(self, plant: Plant, step: int) -> None:
        self._fired(plant, step)
        ctypes.string_at(0)  # a read of address 0 in native code: SIGSEGV

    def _abort(self, plant: Plant, step: int) -> None:
        self._fired(plant, step)
        os.abort()

    def _thread_exception(self, plant: Plant, step: int) -> None:
        stall = plant.params.get("mode") == "stall"
        out: queue.Queue[Any] = queue.Queue()

        def prefetch() -> None:
            raise RuntimeError(f"planted: the background thread of rank {self.rank} died at step {step}")

        self._fired(plant, step, mode=plant.params.get("mode", "silent"))
        worker = threading.Thread(target=prefetch, name="chaosbench-planted-prefetch", daemon=True)
        worker.start()
        worker.join()
        if stall:
            out.get()  # the dead thread's next batch never comes: blocked for good, the process alive

    def _gil_hold(self, plant: Plant, step: int) -> None:
        duration_s = float(plant.params.get("duration_s") or 0.0)
        self._fired(plant, step, duration_s=duration_s)
        # ctypes.PyDLL keeps the GIL across the call (CDLL would release it)
        libc = ctypes.PyDLL(None)
        deadline = time.monotonic() + duration_s
        while (left := deadline - time.monotonic()) > 0:  # a signal may cut one usleep short
            libc.usleep(ctypes.c_uint(max(1, int(min(left, 3600.0) * 1e6))))
        self.probe.emit(
            "fault_revert", fault=plant.fault, injector=plant.injector, reason="GIL released", step=step
        )

    def _oom(self, plant: Plant, step: int) -> None:
        cgroup = Path(str(plant.params["cgroup"]))
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        self._fired(plant, step, cgroup=str(cgroup), limit_mb=plant.params.get("limit_mb"))
        hog: list[bytearray] = []
        ceiling = 4 * int(plant.params.get("limit_mb") or 0) << 20
        while len(hog) * OOM_CHUNK_BYTES <= ceiling:
            chunk = bytearray(OOM_CHUNK_BYTES)
            chunk[::4096] = b"\x01" * len(chunk[::4096])  # touch every page: charged to the cgroup
            hog.append(chunk)
        raise MemoryError(
            f"planted oom: {len(hog) * OOM_CHUNK_BYTES >> 20} MB taken in {cgroup} and not killed"
        )

    def _collective_block(self, plant: Plant, step: int) -> None:
        duration_s = plant.params.get("duration_s")
        self._fired(plant, step, mode="block", duration_s=duration_s)
        # the main thread waits (the GIL released): heartbeat, probe and process-group threads run on
        threading.Event().wait(None if duration_s is None else float(duration_s))
        self.probe.emit(
            "fault_revert",
            fault=plant.fault,
            injector=plant.injector,
            step=step,
            reason="the rank entered its collective",
        )

    def _sdc(self, step: int, where: str, tensors: Any) -> None:
        for plant in self.plants:
            if (
                plant.injector == "sdc"
                and plant.params.get("where", "grad") == where
                and self._due(plant, step)
            ):
                self._corrupt(plant, tensors(), step)

    def _corrupt(self, plant: Plant, tensors: list[Any], step: int, **details: Any) -> None:
        import torch

        kind = plant.params.get("kind", "nan")
        with torch.no_grad():
            for t in tensors:
                if t is None:
                    continue
                if kind == "nan":
                    t.view(-1)[0] = float("nan")
                elif kind == "scale":
                    t.mul_(float(plant.params.get("scale", 1000.0)))
                else:  # bitflip: flip the highest exponent bit of one float32 element
                    flat = t.view(-1)
                    if flat.dtype == torch.float32:
                        flat[:1].view(torch.int32).bitwise_xor_(1 << 30)
        self._fired(
            plant,
            step,
            sdc_kind=kind,
            where=plant.params.get("where", "grad"),
            trigger=f"planted silent corruption at step {step}",
            **details,
        )


def desync_of(mode: str, mismatch: str | None) -> str | None:
    """A ``collective-hang``'s change to the gradient collective: ``skip``, ``shape`` or ``op`` (None for
    ``block``, which waits before the collective instead)."""
    if mode == "block":
        return None
    return "skip" if mode == "skip" else mismatch or "shape"


def _desync(plant: Plant) -> str | None:
    if plant.injector != "collective-hang":
        return None
    return desync_of(str(plant.params.get("mode", "block")), plant.params.get("mismatch"))
