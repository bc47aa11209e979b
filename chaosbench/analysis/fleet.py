"""Fleet-scale projection of goodput from the recovery costs measured on the test scale.

What is measured and what is assumed (the report says the same in every column):

- Measured, per framework and per fault class (:func:`fault_class`: a crashed rank, a lost node, a hang,
  silent corruption): the recovery cost of each fault run, its ``time_to_resume_s`` (the fault to the first step
  after recovery: detection, teardown, restart, rendezvous, restore; or the stall of a recovery in place), times
  ``recovery_scale`` (fleet restarts usually cost more than test restarts); for a
  framework that does not roll back (per-step commit, recovery in place) also the work it threw away
  (``lost_work_s``). A fault run that did not recover is a sample too: it costs ``manual_recovery_s`` (assumed:
  an operator restarts the job).
- Assumed, with defaults that say where they come from: the fleet's scale and node MTBF (Llama 3's), its fault mix
  (:data:`LLAMA3_MIX`), its checkpoint cost (:data:`DEFAULT_CHECKPOINT_COST_S`), the checkpoint interval (the
  Young/Daly optimum for that cost at the job's MTBF, unless given) and the manual recovery time
  (:data:`DEFAULT_MANUAL_RECOVERY_S`). The test suite's own checkpoint interval and cost play no part: a test
  checkpoints every quarter second, a fleet every hour, and the overhead of the first would swamp every recovery
  difference.

Model (seconds). A job on ``nodes`` nodes fails as a Poisson process with rate 1 / M, M = node MTBF / nodes. Each
failure has a class drawn from the mix (restricted to the classes measured for the framework: the coverage is
reported), costs a recovery R drawn from that class's samples and loses work L: the progress since the last
checkpoint (tau / 2 on average) for a framework that rolls back, its measured thrown-away work otherwise.
Checkpoints cost C every tau seconds of progress.

- Analytic, first order: goodput ~ 1 - C / (tau + C) - E[R + L] / M (floored at 0).
- Monte Carlo: ``horizon_days`` of wall time, failures from the exponential distribution, classes and samples
  drawn as above; goodput = progress that survived / wall time; mean and 5-95 % range over ``trials``.

Spare pools (:func:`spare_pool_point`, :func:`break_even_pool`): a lost node is out for a repair time (assumed,
:data:`DEFAULT_NODE_REPAIR_S`); a loss that finds a hot spare costs the measured hot-spare recovery, one that
finds the pool exhausted (:func:`spare_found`) waits for the repair and restarts in place. A spare idles its
node's GPUs: a pool of S costs S / nodes of the job's goodput, so the pool worth having is the one with the
highest goodput net of that (the break-even size: one more spare buys less than it idles).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaosbench.analysis.stats import young_daly_interval_s
from chaosbench.analysis.values import as_bool, as_float, fault_rows
from chaosbench.injectors.legacy import declared
from chaosbench.timeline import Event

DAY_S = 86_400.0


def fault_class(fault: Event | Mapping[str, Any]) -> str | None:
    """The fleet fault class of a ``fault_inject`` event (``crash``, ``node``, ``hang``, ``sdc``; None: not in a
    fleet's mix), as its injector declared it in the event (:attr:`chaosbench.injectors.base.Injector.fault_class`;
    an event written before injectors declared it: :mod:`chaosbench.injectors.legacy`)."""
    return declared(fault, "fault_class")


@dataclass(frozen=True)
class FaultMix:
    """Relative frequencies of the fault classes in a fleet, and where they come from."""

    weights: dict[str, float]
    source: str

    def share(self, cls: str) -> float:
        total = sum(self.weights.values())
        return self.weights.get(cls, 0.0) / total if total else 0.0


#: Llama 3 405B's 419 unexpected interruptions in 54 days on 16,384 GPUs (Meta, "The Llama 3 Herd of Models",
#: 2024, table 5), grouped into the classes chaosbench injects: a crashed rank = faulty GPU 148, HBM3 72, SRAM 19,
#: GPU system processor 17, thermal interface 6, software bug 54, dependency 2; a lost node = host maintenance 32,
#: network switch/cable 35, NIC 7, SSD 3, power supply 3, chassis 2, IO expansion board 2, CPU 2, system memory 2;
#: a hang = NCCL watchdog timeouts 7; silent data corruption 6.
LLAMA3_MIX = FaultMix(
    {"crash": 318.0, "node": 88.0, "hang": 7.0, "sdc": 6.0},
    "Llama 3 405B's 419 unexpected interruptions (Meta 2024): 318 crashed ranks (GPU, memory, software), 88 lost "
    "nodes (host, network, storage, power), 7 hangs (NCCL watchdog timeouts), 6 silent data corruptions",
)

#: Assumed fleet checkpoint cost: a blocking sharded save of a ~1 TB training state (a 70B-class model with Adam
#: moments) to a parallel file system. An assumption for orientation, not a measurement: set
#: ``projection.checkpoint_cost_s`` to your own.
DEFAULT_CHECKPOINT_COST_S = 60.0
#: Assumed cost of a failure the framework did not recover from: an operator notices and restarts the job
#: ("a dead node at 4 a.m. costs twenty minutes if a human restarts it"). ``projection.manual_recovery_s``.
DEFAULT_MANUAL_RECOVERY_S = 1200.0


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


#: Llama 3 405B's reported scale and failure rate, for orientation: 16,384 GPUs, 419 unexpected interruptions in
#: 54 days (466 with the 47 planned ones, which no fault of a fleet's mix stands for: the rate and the mix,
#: :data:`LLAMA3_MIX`, count the same 419).
LLAMA3 = FleetScale(nodes=2048, gpus_per_node=8, node_mtbf_h=2048 * 54 * 24 / 419)


@dataclass
class Assumptions:
    """What the projection assumes rather than measures (see the module docstring)."""

    checkpoint_cost_s: float = DEFAULT_CHECKPOINT_COST_S
    checkpoint_interval_s: float | None = None  # None: the Young/Daly optimum
    manual_recovery_s: float = DEFAULT_MANUAL_RECOVERY_S
    recovery_scale: float = 1.0
    mix: FaultMix = LLAMA3_MIX

    def interval_s(self, mtbf_s: float) -> float:
        if self.checkpoint_interval_s is not None:
            return self.checkpoint_interval_s
        return young_daly_interval_s(self.checkpoint_cost_s, mtbf_s)


@dataclass
class Sample:
    """One measured fault run: its recovery cost (None: it did not recover) and, for a framework that did not
    roll back, the work it threw away (None: it rolled back to its last checkpoint)."""

    recovery_s: float | None
    lost_s: float | None = None


@dataclass
class RecoveryCosts:
    """One framework's measured fault runs, by fault class."""

    framework: str
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def classes(self, mix: FaultMix) -> list[str]:
        """Classes of the mix with at least one sample."""
        return [c for c in mix.weights if self.samples.get(c) and mix.weights[c] > 0]


@dataclass
class Projection:
    framework: str
    nodes: int
    gpus: int
    job_mtbf_s: float
    interruptions_per_day: float
    recovery_s: (
        float  # mix-weighted mean recovery per failure (measured; unrecovered runs at manual_recovery_s)
    )
    lost_s: float  # mix-weighted mean lost work per failure (modelled for rollback, measured otherwise)
    coverage: float  # share of the mix's weight whose classes were measured
    classes: list[str]
    missing_classes: list[str]
    unrecovered: float  # mix-weighted share of failures the framework did not recover from (measured)
    checkpoint_cost_s: float
    checkpoint_interval_s: float
    goodput_analytic: float
    goodput_mc_mean: float
    goodput_mc_p5: float
    goodput_mc_p95: float
    trials: int
    horizon_days: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def analytic_goodput(
    recovery_s: float, ckpt_cost_s: float, interval_s: float, mtbf_s: float, lost_s: float | None = None
) -> float:
    """First-order goodput: checkpoint overhead plus, per failure, recovery and lost work (half an interval
    recomputed when ``lost_s`` is None: a rollback to the last checkpoint)."""
    lost = interval_s / 2 if lost_s is None else lost_s
    return max(0.0, 1.0 - ckpt_cost_s / (interval_s + ckpt_cost_s) - (recovery_s + lost) / mtbf_s)


def _weights(costs: RecoveryCosts, mix: FaultMix) -> dict[str, float]:
    classes = costs.classes(mix)
    total = sum(mix.weights[c] for c in classes)
    return {c: mix.weights[c] / total for c in classes} if total else {}


def _expected(costs: RecoveryCosts, a: Assumptions, interval_s: float) -> tuple[float, float, float]:
    """(mean recovery, mean lost work, share unrecovered) per failure, over the mix's measured classes."""
    rec = lost = unrec = 0.0
    for cls, w in _weights(costs, a.mix).items():
        ss = costs.samples[cls]
        rec += w * statistics.fmean(_recovery(s, a) for s in ss)
        lost += w * statistics.fmean(interval_s / 2 if s.lost_s is None else s.lost_s for s in ss)
        unrec += w * sum(1 for s in ss if s.recovery_s is None) / len(ss)
    return rec, lost, unrec


def _recovery(s: Sample, a: Assumptions) -> float:
    return a.manual_recovery_s if s.recovery_s is None else s.recovery_s * a.recovery_scale


def simulate(
    costs: RecoveryCosts,
    a: Assumptions,
    interval_s: float,
    mtbf_s: float,
    horizon_s: float,
    rng: random.Random,
) -> float:
    """One Monte Carlo trajectory: the share of ``horizon_s`` spent on progress that survived.

    Between two failures the job completes whole checkpoint cycles (tau of progress + C of saving). At a failure,
    a framework that rolls back loses the progress since its last completed checkpoint; one that does not keeps
    it and throws away its sample's lost work instead. Then the sample's recovery passes. Failures are
    memoryless, so the next one is drawn after each recovery. O(failures)."""
    weights = _weights(costs, a.mix)
    if not weights:
        raise ValueError(f"framework {costs.framework}: no measured fault class of the mix")
    classes, probs = list(weights), list(weights.values())
    tau, c = interval_s, a.checkpoint_cost_s
    cycle = tau + c
    t = saved = 0.0
    while t < horizon_s:
        end = min(t + rng.expovariate(1.0 / mtbf_s), horizon_s)
        span = end - t
        cycles = math.floor(span / cycle)
        saved += cycles * tau
        partial = min(span - cycles * cycle, tau)
        if end >= horizon_s:  # the run ends: the progress under way is not lost to a failure
            saved += partial
            break
        sample = rng.choice(costs.samples[rng.choices(classes, probs)[0]])
        t = end + _recovery(sample, a)
        if (
            sample.lost_s is not None
        ):  # no rollback: the progress is kept, the sample's thrown-away work is not
            saved += partial
            t += sample.lost_s
    return min(1.0, saved / horizon_s)


def project(
    costs: RecoveryCosts,
    scale: FleetScale,
    a: Assumptions | None = None,
    horizon_days: float = 30.0,
    trials: int = 200,
    seed: int = 0,
) -> Projection:
    a = a or Assumptions()
    m = scale.job_mtbf_s
    tau = a.interval_s(m)
    rec, lost, unrec = _expected(costs, a, tau)
    classes = costs.classes(a.mix)
    rng = random.Random(seed)
    runs = sorted(simulate(costs, a, tau, m, horizon_days * DAY_S, rng) for _ in range(trials))
    return Projection(
        framework=costs.framework,
        nodes=scale.nodes,
        gpus=scale.nodes * scale.gpus_per_node,
        job_mtbf_s=m,
        interruptions_per_day=scale.interruptions_per_day,
        recovery_s=rec,
        lost_s=lost,
        coverage=sum(a.mix.share(c) for c in classes),
        classes=classes,
        missing_classes=[c for c in a.mix.weights if c not in classes and a.mix.weights[c] > 0],
        unrecovered=unrec,
        checkpoint_cost_s=a.checkpoint_cost_s,
        checkpoint_interval_s=tau,
        goodput_analytic=analytic_goodput(rec, a.checkpoint_cost_s, tau, m, lost_s=lost),
        goodput_mc_mean=statistics.fmean(runs),
        goodput_mc_p5=runs[int(0.05 * (trials - 1))],
        goodput_mc_p95=runs[int(0.95 * (trials - 1))],
        trials=trials,
        horizon_days=horizon_days,
    )


def costs_from_rows(rows: Sequence[dict[str, Any]]) -> list[RecoveryCosts]:
    """Per framework, a sample of every fault of its fault runs (each fault on its own: a run with two faults
    gives two samples), by the fault's class: a recovered or outlasted fault costs its time to resume (for an
    outlasted one, its stall) and, without a rollback, its measured thrown-away work; one not recovered costs a
    manual recovery; one interrupted by the next fault is none (its recovery is that fault's). A sample whose
    figures are missing (a resume, or the lost work of a recovery without rollback) is left out, never guessed."""
    out: dict[str, RecoveryCosts] = {}
    for r in rows:
        if as_bool(r.get("control")) is True:
            continue
        fw = str(r.get("framework"))
        for f in fault_rows(r):
            cls = f.get("fault_class")
            status = f.get("status")
            if not isinstance(cls, str) or status not in ("recovered", "outlasted", "not_recovered"):
                continue
            if status == "not_recovered":
                sample = Sample(None)
            else:
                resume = as_float(f.get("time_to_resume_s"))
                rollback = as_bool(f.get("rollback")) is True
                lost = as_float(f.get("lost_work_s"))
                if resume is None or (not rollback and lost is None):
                    continue
                sample = Sample(resume, None if rollback else lost)
            out.setdefault(fw, RecoveryCosts(fw)).samples.setdefault(cls, []).append(sample)
    return [out[k] for k in sorted(out)]


# ---------------------------------------------------------------------------------------- spare pools
#: Assumed time a lost node stays out of service before it is back (a reboot, a health check, a re-image; a
#: hardware repair takes days and is better modelled as a longer time). ``projection.node_repair_s``.
DEFAULT_NODE_REPAIR_S = 3600.0
#: Spare-pool sizes (nodes) the report shows by default. ``projection.spare_pools``.
DEFAULT_SPARE_POOLS = (0, 1, 2, 4, 8, 16, 32)


def spare_found(pool: int, nodes_in_repair: float) -> float:
    """Share of node losses that find a spare in a pool of ``pool`` nodes.

    Model: node losses arrive as a Poisson process and each lost node is out for the repair time, so the number
    of nodes in repair is Poisson with mean ``nodes_in_repair`` (= loss rate x repair time: an M/G/inf queue); a
    loss finds the pool exhausted when ``pool`` or more nodes are in repair (each holds one spare until it is
    back and becomes the new spare). A loss sees that distribution (Poisson arrivals see time averages)."""
    if pool <= 0:
        return 0.0
    if nodes_in_repair <= 0:
        return 1.0
    from scipy.stats import poisson

    return float(poisson.cdf(pool - 1, nodes_in_repair))


@dataclass(frozen=True)
class PoolPoint:
    """The projection with a spare pool of ``pool`` nodes: the share of losses a spare absorbed, the mean
    recovery per loss, the job's analytic goodput, the pool's share of the job's nodes (GPUs idling) and the
    goodput net of it."""

    pool: int
    spare_found: float
    recovery_s: float
    goodput: float
    idle_share: float
    net_goodput: float


def spare_pool_point(
    pool: int,
    spare_s: float,
    no_spare_s: float,
    scale: FleetScale,
    a: Assumptions,
    repair_s: float,
    lost_s: float | None = None,
) -> PoolPoint:
    """A loss costs ``spare_s`` when it finds a spare and ``no_spare_s`` (the job waits for the node's repair
    and restarts in place) when the pool is exhausted; ``lost_s``: work lost per loss (None: half a checkpoint
    interval, a rollback). Goodput: :func:`analytic_goodput` at the job's MTBF."""
    m = scale.job_mtbf_s
    found = spare_found(pool, repair_s / m)
    rec = found * spare_s + (1 - found) * no_spare_s
    g = analytic_goodput(rec, a.checkpoint_cost_s, a.interval_s(m), m, lost_s=lost_s)
    idle = pool / scale.nodes
    return PoolPoint(pool, found, rec, g, idle, g - idle)


def break_even_pool(
    spare_s: float,
    no_spare_s: float,
    scale: FleetScale,
    a: Assumptions,
    repair_s: float,
    lost_s: float | None = None,
) -> int:
    """The pool size beyond which one more spare buys less goodput than the 1/nodes of the job's GPUs it idles:
    the smallest pool with the highest net goodput (searched until a spare is found for all but 1e-9 of the
    losses, where more spares cannot buy anything)."""
    best, best_net = 0, -math.inf
    for pool in range(scale.nodes + 1):
        p = spare_pool_point(pool, spare_s, no_spare_s, scale, a, repair_s, lost_s)
        if p.net_goodput > best_net:
            best, best_net = pool, p.net_goodput
        if 1 - p.spare_found < 1e-9:
            break
    return best
