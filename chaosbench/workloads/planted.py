"""Planted faults: bugs and corruptions that only the training process itself can produce.

The ``crash-loop`` and ``sdc`` injectors put their settings into the ranks' environment before launch; a
workload calls :meth:`Planted.before_step` and :meth:`Planted.after_backward` / :meth:`Planted.after_update`
in its loop, and the planted fault fires from inside, writing its own ``fault_inject`` event through the probe
(stamped at the moment it acts). Built-in workloads do this; a user's script can do it too.

Environment (all optional):

- ``CHAOSBENCH_CRASH_AT_STEP=N``, ``CHAOSBENCH_CRASH_RANKS=1,2|all``, ``CHAOSBENCH_FAULT``: raise at step N,
  in every incarnation (a deterministic bug).
- ``CHAOSBENCH_SDC_STEP=N``, ``CHAOSBENCH_SDC_RANKS``, ``CHAOSBENCH_SDC_KIND=nan|scale|bitflip``,
  ``CHAOSBENCH_SDC_WHERE=grad|param``, ``CHAOSBENCH_SDC_SCALE=1000``: corrupt this rank's gradients (after
  backward, before the update) or parameters (after the update) once per run (a marker file in the run
  directory keeps a recomputed step from corrupting again: silent corruption is transient).
- ``CHAOSBENCH_LOSS_CHECK=1``: raise when the loss is not finite, writing a ``detect`` event (a loss guard).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from chaosbench.probe import Probe


def _ranks(value: str | None) -> set[int] | None:
    """None: all ranks."""
    if not value or value == "all":
        return None
    return {int(v) for v in value.split(",") if v.strip()}


class PlantedFault(RuntimeError):
    """Raised by a planted deterministic bug."""


class Planted:
    def __init__(self, probe: Probe, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.probe = probe
        self.rank = probe.rank
        self.fault = env.get("CHAOSBENCH_FAULT", "planted")
        self.crash_step = int(env["CHAOSBENCH_CRASH_AT_STEP"]) if env.get("CHAOSBENCH_CRASH_AT_STEP") else None
        self.crash_ranks = _ranks(env.get("CHAOSBENCH_CRASH_RANKS"))
        self.sdc_step = int(env["CHAOSBENCH_SDC_STEP"]) if env.get("CHAOSBENCH_SDC_STEP") else None
        self.sdc_ranks = _ranks(env.get("CHAOSBENCH_SDC_RANKS"))
        self.sdc_kind = env.get("CHAOSBENCH_SDC_KIND", "nan")
        self.sdc_where = env.get("CHAOSBENCH_SDC_WHERE", "grad")
        self.sdc_scale = float(env.get("CHAOSBENCH_SDC_SCALE", "1000"))
        self.loss_check = env.get("CHAOSBENCH_LOSS_CHECK", "0") == "1"
        run_dir = env.get("CHAOSBENCH_RUN_DIR")
        self._sdc_marker = Path(run_dir) / f"sdc-fired.rank{self.rank}" if run_dir else None

    def _mine(self, ranks: set[int] | None) -> bool:
        return ranks is None or self.rank in ranks

    def before_step(self, step: int) -> None:
        """Call before computing ``step``: a planted bug raises here."""
        if self.crash_step is not None and step == self.crash_step and self._mine(self.crash_ranks):
            self.probe.emit(
                "fault_inject", fault=self.fault, injector="crash-loop", step=step,
                target=[{"rank": self.rank, "pid": os.getpid(), "incarnation": self.probe.incarnation}],
                trigger=f"planted bug at step {step}",
            )  # fmt: skip
            raise PlantedFault(f"planted bug: deterministic failure at step {step} on rank {self.rank}")

    def _sdc_due(self, step: int, where: str) -> bool:
        if self.sdc_step is None or step != self.sdc_step or self.sdc_where != where:
            return False
        if not self._mine(self.sdc_ranks):
            return False
        return self._sdc_marker is None or not self._sdc_marker.exists()

    def _corrupt(self, tensors: list[Any], step: int) -> None:
        import torch

        with torch.no_grad():
            for t in tensors:
                if t is None:
                    continue
                if self.sdc_kind == "nan":
                    t.view(-1)[0] = float("nan")
                elif self.sdc_kind == "scale":
                    t.mul_(self.sdc_scale)
                else:  # bitflip: flip the highest exponent bit of one float32 element
                    flat = t.view(-1)
                    if flat.dtype == torch.float32:
                        flat[:1].view(torch.int32).bitwise_xor_(1 << 30)
        if self._sdc_marker is not None:
            self._sdc_marker.write_text(str(step))
        self.probe.emit(
            "fault_inject", fault=self.fault, injector="sdc", step=step, sdc_kind=self.sdc_kind, where=self.sdc_where,
            target=[{"rank": self.rank, "pid": os.getpid(), "incarnation": self.probe.incarnation}],
            trigger=f"planted silent corruption at step {step}",
        )  # fmt: skip

    def after_backward(self, step: int, params: Any) -> None:
        """Call after backward (gradients reduced), before the optimizer update."""
        if self._sdc_due(step, "grad"):
            self._corrupt([p.grad for p in params], step)

    def after_update(self, step: int, params: Any) -> None:
        """Call after the optimizer update."""
        if self._sdc_due(step, "param"):
            self._corrupt([p.data for p in params], step)

    def check_loss(self, step: int, loss: float) -> None:
        """With the loss guard on, a non-finite loss is detected and raises."""
        if self.loss_check and not math.isfinite(loss):
            self.probe.emit("detect", framework="loss-check", reason=f"loss is {loss} at step {step}")
            raise FloatingPointError(f"loss check: loss is {loss} at step {step} on rank {self.rank}")
