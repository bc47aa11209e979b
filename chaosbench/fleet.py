"""Fleet-scale projection of goodput from the recovery costs measured on the test scale.

Model (all times in seconds). A job on ``nodes`` nodes fails as a Poisson process with rate 1 / M, where the
job MTBF is M = node MTBF / nodes. Each failure costs a fixed recovery R = detect + restart/init + restore
(measured medians of one framework), plus the recomputation of the work done since the last checkpoint.
Checkpoints cost C each (measured ``checkpoint_save_s``) every tau seconds of progress (the configured
interval: ``checkpoint_every`` x measured step time), or the Young/Daly optimum.

- Analytic, first order: goodput ~ 1 - C / (tau + C) - (R + tau / 2) / M (floored at 0).
- Monte Carlo: simulate ``horizon_s`` of wall time, failures drawn from the exponential distribution,
  R resampled from the measured repeats; goodput = useful progress / wall time; mean and 5-95 % range.

The recovery costs are those measured at test scale: at fleet scale restart and rendezvous usually cost more,
which a user can model by passing ``recovery_scale``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chaosbench.stats import young_daly_interval_s

DAY_S = 86_400.0


@dataclass
class FleetScale:
    nodes: int
    gpus_per_node: int
    node_mtbf_h: float

    @property
    def job_mtbf_s(self) -> float:
        return self.node_mtbf_h * 3600.0 / self.nodes

    @property
    def interruptions_per_day(self) -> float:
        return DAY_S / self.job_mtbf_s


@dataclass
class RecoveryCosts:
    """One framework's measured costs: recovery samples (detect + restart/init + restore, per repeat), the
    checkpoint cost and the configured checkpoint interval in seconds of progress."""

    framework: str
    recovery_s: list[float]
    checkpoint_cost_s: float
    checkpoint_interval_s: float


@dataclass
class Projection:
    framework: str
    nodes: int
    gpus: int
    job_mtbf_s: float
    interruptions_per_day: float
    recovery_s_median: float
    checkpoint_cost_s: float
    checkpoint_interval_s: float
    optimal_interval_s: float
    goodput_analytic: float
    goodput_analytic_at_optimum: float
    goodput_mc_mean: float
    goodput_mc_p5: float
    goodput_mc_p95: float
    trials: int
    horizon_days: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def analytic_goodput(recovery_s: float, ckpt_cost_s: float, interval_s: float, mtbf_s: float) -> float:
    """First-order goodput: checkpoint overhead plus, per failure, recovery and half an interval recomputed."""
    g = 1.0 - ckpt_cost_s / (interval_s + ckpt_cost_s) - (recovery_s + interval_s / 2) / mtbf_s
    return max(0.0, g)


def simulate(
    costs: RecoveryCosts,
    mtbf_s: float,
    horizon_s: float,
    rng: random.Random,
    recovery_scale: float = 1.0,
) -> float:
    """One Monte Carlo trajectory: the share of ``horizon_s`` spent on progress that survived.

    Between two failures the job completes whole checkpoint cycles (tau of progress + C of saving); the
    progress since the last completed checkpoint is lost at the failure, then a measured recovery time
    (resampled) passes. Failures are memoryless, so the next one is drawn after each recovery. Runs in
    O(failures), not O(checkpoints)."""
    tau, c = costs.checkpoint_interval_s, costs.checkpoint_cost_s
    cycle = tau + c
    t = saved = 0.0
    while t < horizon_s:
        end = min(t + rng.expovariate(1.0 / mtbf_s), horizon_s)
        span = end - t
        cycles = math.floor(span / cycle)
        saved += cycles * tau
        if end >= horizon_s:  # the run ends: the progress under way is not lost to a failure
            saved += min(span - cycles * cycle, tau)
            break
        t = end + rng.choice(costs.recovery_s) * recovery_scale
    return min(1.0, saved / horizon_s)


def project(
    costs: RecoveryCosts,
    scale: FleetScale,
    horizon_days: float = 30.0,
    trials: int = 200,
    seed: int = 0,
    recovery_scale: float = 1.0,
) -> Projection:
    if not costs.recovery_s:
        raise ValueError(f"framework {costs.framework}: no measured recovery")
    m = scale.job_mtbf_s
    r_med = statistics.median(costs.recovery_s) * recovery_scale
    opt = young_daly_interval_s(costs.checkpoint_cost_s, m)
    rng = random.Random(seed)
    runs = sorted(simulate(costs, m, horizon_days * DAY_S, rng, recovery_scale) for _ in range(trials))
    return Projection(
        framework=costs.framework,
        nodes=scale.nodes,
        gpus=scale.nodes * scale.gpus_per_node,
        job_mtbf_s=m,
        interruptions_per_day=scale.interruptions_per_day,
        recovery_s_median=r_med,
        checkpoint_cost_s=costs.checkpoint_cost_s,
        checkpoint_interval_s=costs.checkpoint_interval_s,
        optimal_interval_s=opt,
        goodput_analytic=analytic_goodput(r_med, costs.checkpoint_cost_s, costs.checkpoint_interval_s, m),
        goodput_analytic_at_optimum=analytic_goodput(r_med, costs.checkpoint_cost_s, opt, m),
        goodput_mc_mean=statistics.fmean(runs),
        goodput_mc_p5=runs[int(0.05 * (trials - 1))],
        goodput_mc_p95=runs[int(0.95 * (trials - 1))],
        trials=trials,
        horizon_days=horizon_days,
    )


def costs_from_rows(rows: Sequence[dict[str, Any]], checkpoint_every: int | None) -> list[RecoveryCosts]:
    """Per framework, from result rows of recovered fault runs (restart-type recoveries) and controls."""
    by_fw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_fw.setdefault(str(r.get("framework")), []).append(r)
    out = []
    for fw, rs in sorted(by_fw.items()):
        rec = []
        for r in rs:
            if r.get("control") or r.get("outcome") != "recovered":
                continue
            parts = [r.get("badput_detect_s"), r.get("badput_restart_init_s"), r.get("badput_restore_s")]
            vals = [float(p) for p in parts if p is not None and _num(p)]
            if vals:
                rec.append(sum(vals))
        saves = [float(r["checkpoint_save_s"]) for r in rs if _num(r.get("checkpoint_save_s"))]
        steps = [float(r["step_time_s"]) for r in rs if r.get("control") and _num(r.get("step_time_s"))]
        if not rec or not saves or not steps or not checkpoint_every:
            continue
        out.append(RecoveryCosts(fw, rec, statistics.median(saves), checkpoint_every * statistics.median(steps)))
    return out


def _num(v: Any) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return f == f  # not NaN


#: Llama 3 405B's reported scale and failure rate, for orientation: 16,384 GPUs, 466 interruptions in 54 days.
LLAMA3 = FleetScale(nodes=2048, gpus_per_node=8, node_mtbf_h=2048 * 54 * 24 / 466)
