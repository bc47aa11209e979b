"""A TorchFT workload: the ddp-mlp model trained through a ``torchft.Manager`` on gloo, over synthetic data.

One replica group is one ``torchrun --nproc-per-node K`` (the ``torchft`` adapter starts G of them and a
Lighthouse); every process runs::

    python -m chaosbench.workloads.ft_mlp --steps 60 --batch-size 32

with torchrun's ``env://`` variables (``RANK``/``WORLD_SIZE`` are *group-local*) plus ``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE``. TorchFT's own timeouts come from its environment variables
(``TORCHFT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_TIMEOUT_SEC``, ``TORCHFT_CONNECT_TIMEOUT_SEC``), the Manager's
heartbeat interval and ``min_replica_size`` from ``CHAOSBENCH_FT_HEARTBEAT_INTERVAL_S`` and
``CHAOSBENCH_FT_MIN_REPLICAS`` (the adapter sets all of them).

Contract (what the harness relies on):

- Ranks: the probe reports ``rank = REPLICA_GROUP_ID * K + group-local rank`` and ``world_size = G * K``, so
  ``target: {rank: 1}`` with K = 1 is the process of replica group 1. ``rank_start`` also carries
  ``replica_group``, ``group_rank``, ``group_world_size`` and ``global_batch`` and is emitted before torch is
  imported.
- Each step: ``Manager.start_quorum()`` (synchronous quorum: a replica group that is behind heals from a peer
  before it computes), forward/backward of this rank's share of the step's data, one fault-tolerant allreduce
  of the gradients (float64) through the Manager, then ``Manager.should_commit()``. A committed step steps the
  optimizer and the LR schedule and emits ``step`` (with ``participants``, ``quorum_id``, ``global_batch``,
  ``committed: true``); an uncommitted one is discarded and emits ``step_skipped`` (its index, the reason,
  ``duration_s``: its compute up to the gradient reduction, ``collective_s``: the time the failed reduction and
  commit vote took) and the same step index is tried again. Nothing is ever rolled back: the step index is
  the Manager's committed step count.
- Quorum changes emit ``quorum`` (``quorum_id``, ``participants``, ``previous_participants``,
  ``replica_rank``, ``step``); a quorum with fewer replica groups than before, and the first error the Manager
  reports in a streak of uncommitted steps, also emit ``detect`` (``framework`` from ``CHAOSBENCH_FRAMEWORK``,
  ``via: manager``). Healing emits ``heal_begin`` (fetch from a peer over HTTP starts; ``step``,
  ``src_replica_rank``) and ``heal_end`` (the fetched state is applied; ``step``, ``duration_s``); a replica
  serving its state emits ``heal_send``.
- Data (``--batch-mode global``, the default): step ``s`` has one global batch of ``--batch-size`` samples in
  ``G * K`` micro-batches, micro-batch ``m`` drawn from a generator seeded with ``(seed, s, m)``. The replica
  groups in the quorum split the micro-batches among themselves (participant ``p`` of ``n`` computes replica
  slots ``p, p + n, ...``; local rank ``r`` micro-batch ``slot * K + r``), so the update of step ``s`` is the
  gradient of the mean loss over the same global batch whichever groups take part. Gradients are summed in
  float64 (exact for these magnitudes, so the sum does not depend on who computed what) and rounded to float32
  once: a run that lost and healed a replica group ends with the same final digest as a fault-free run. The
  model has no dropout, so no RNG state is part of the training state.
  ``--batch-mode replica`` is upstream's data parallelism instead: each replica group trains its own stream of
  ``--batch-size`` samples per rank and gradients are averaged over the groups taking part, so a step without
  some group trains on fewer samples (``global_batch`` in ``step`` says how many) and the final state
  differs from the control's.
- Start: with ``CHAOSBENCH_FT_START_GROUPS=G`` (the adapter's ``start_together``) the first incarnation does not
  compute until a quorum holds G groups (or ``CHAOSBENCH_FT_START_TIMEOUT_S`` passed): with ``min_replica_size``
  below G the first group up would otherwise train alone and heal the others when they arrive.
- At the end ``train_end(step, loss, digest)`` is emitted and ``final digest <sha256 hex>`` printed; the
  process exits 0. A failure torchft does not absorb (an error in the group-local process group when K > 1, a
  quorum timeout) raises and exits non-zero, and the group's torchrun restarts it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.probe import ENV_EVENTS, ENV_NODE, Probe, incarnation_from_env
from chaosbench.procutil import start_ticks
from chaosbench.workloads.base import ProgramWorkload, RunPaths
from chaosbench.workloads.ft_loop import FtLoop, log_to_stderr
from chaosbench.workloads.planted import Planted
from chaosbench.workloads.skeleton import build_parser, mix_seed, params_digest, parse_args

#: The program, as ``python -m`` runs it.
PROGRAM = "chaosbench.workloads.ft_mlp"
ENV_GROUP = "REPLICA_GROUP_ID"
ENV_GROUPS = "NUM_REPLICA_GROUPS"
ENV_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"

IN_FEATURES = 64
OUT_FEATURES = 16
MOMENTUM = 0.9
LR_STEP_SIZE = 20
LR_GAMMA = 0.5


def replica_rank(group: int, group_rank: int, group_world_size: int) -> int:
    """The rank chaosbench reports for a process: replica groups laid out one after another."""
    return group * group_world_size + group_rank


def replica_slots(participant: int, participants: int, groups: int) -> list[int]:
    """Replica slots (of ``groups``) whose micro-batches participant ``participant`` of ``participants``
    computes in ``global`` mode: every slot exactly once over all participants."""
    if participants <= 0:
        return []
    return list(range(participant, groups, participants))


def global_batch(mode: str, batch_size: int, groups: int, group_world_size: int, participants: int) -> int:
    """Samples in one committed update: constant in ``global`` mode, ``participants * K * batch`` otherwise."""
    return batch_size if mode == "global" else participants * group_world_size * batch_size


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(
        build_parser(
            PROGRAM,
            "An MLP trained through a torchft Manager (per-step fault tolerance) on synthetic data.",
            FtMlpOptions,
            checkpoints=False,
        ),
        FtMlpOptions,
        argv,
    )
    env = os.environ
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", ENV_LIGHTHOUSE):
        if var not in env:
            raise SystemExit(
                f"ft_mlp: {var} is not set; run under the torchft adapter (torchrun per replica group)"
            )
    group = int(env.get(ENV_GROUP, "0"))
    groups = int(env.get(ENV_GROUPS, "1"))
    group_rank = int(env["RANK"])
    group_world_size = int(env["WORLD_SIZE"])
    if not 0 <= group < groups:
        raise SystemExit(f"ft_mlp: {ENV_GROUP}={group} is outside 0..{groups - 1}")
    if args.batch_mode == "global" and args.batch_size % (groups * group_world_size):
        raise SystemExit(
            f"ft_mlp: --batch-size {args.batch_size} is not a multiple of groups x ranks ({groups * group_world_size})"
        )
    probe = Probe(
        env.get(ENV_EVENTS),
        rank=replica_rank(group, group_rank, group_world_size),
        world_size=groups * group_world_size,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        node=env.get(ENV_NODE, "node0"),
        incarnation=incarnation_from_env(),
    )
    pid = os.getpid()
    probe.emit(
        "rank_start",
        pid=pid,
        pid_ticks=start_ticks(pid),
        world_size=probe.world_size,
        local_rank=probe.local_rank,
        node=probe.node,
        replica_group=group,
        group_rank=group_rank,
        group_world_size=group_world_size,
        global_batch=global_batch(args.batch_mode, args.batch_size, groups, group_world_size, groups),
        batch_mode=args.batch_mode,
    )
    try:
        return _train(args, probe, group, groups, group_rank, group_world_size)
    finally:
        probe.close()


def _model(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """The MLP, its SGD optimizer with momentum, its step LR schedule and the teacher matrix of the targets: the
    same in every process, from the seed (no init sync needed; no dropout: no RNG state to carry)."""
    import torch
    from torch import nn

    torch.manual_seed(mix_seed(args.seed, 0x6D6F64656C))
    layers: list[nn.Module] = []
    width = IN_FEATURES
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.ReLU()]
        width = args.hidden
    layers.append(nn.Linear(width, OUT_FEATURES))
    net = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(list(net.parameters()), lr=args.lr, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=LR_STEP_SIZE, gamma=LR_GAMMA)
    teacher_gen = torch.Generator().manual_seed(mix_seed(args.seed, 0x7465616368))
    teacher = torch.randn(IN_FEATURES, OUT_FEATURES, generator=teacher_gen) / IN_FEATURES**0.5
    return net, optimizer, scheduler, teacher


def _share(
    args: argparse.Namespace,
    participant: int | None,
    participants: int,
    groups: int,
    group: int,
    group_rank: int,
    group_world_size: int,
) -> tuple[int, list[int], int]:
    """This rank's part of a step: its microbatch size, the batch indices it computes (none when its group does
    not participate) and the divisor of its loss. ``global``: the global batch is split over every group's
    ranks, a participant computing the slots of the groups that are missing too; ``replica``: each rank computes
    a batch of its own, the loss averaged over the participants."""
    K = group_world_size
    if args.batch_mode == "global":
        slots = replica_slots(participant, participants, groups) if participant is not None else []
        return args.batch_size // (groups * K), [slot * K + group_rank for slot in slots], groups * K
    mine = [group * K + group_rank] if participant is not None else []
    return args.batch_size, mine, max(1, participants) * K


def _train(
    args: argparse.Namespace, probe: Probe, group: int, groups: int, group_rank: int, group_world_size: int
) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import ReduceOp

    log_to_stderr()
    torch.set_num_threads(1)
    K = group_world_size
    net, optimizer, scheduler, teacher = _model(args)
    params = list(net.parameters())
    if K > 1:  # the ranks of one group reduce among themselves first (torchft's pg spans the groups)
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    loop = FtLoop(probe, group, {"model": net, "optim": optimizer, "scheduler": scheduler}, args.pg_timeout_s)

    def batch(step: int, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, index))
        x = torch.randn(size, IN_FEATURES, generator=gen)
        return x, torch.tanh(x @ teacher)

    numel = sum(p.numel() for p in params)
    loss_fn = nn.MSELoss()
    planted = Planted(probe)
    loss_value: float | None = None
    while loop.current_step() < args.steps:
        if (q := loop.quorum()) is None:
            continue
        p, n, step = q.participant, q.participants, q.step
        planted.before_step(step)
        t_step = time.perf_counter()
        buf = torch.zeros(numel + 1, dtype=torch.float64)
        mb, mine, scale = _share(args, p, n, groups, group, group_rank, K)
        for index in mine:
            x, y = batch(step, index, mb)
            for param in params:
                param.grad = None
            loss = loss_fn(net(x), y) / scale
            loss.backward()
            off = 0
            for param in params:
                g = param.grad
                assert g is not None
                buf[off : off + param.numel()] += g.reshape(-1).double()
                off += param.numel()
            buf[numel] += float(loss.detach())
        if args.step_sleep_s > 0:
            time.sleep(args.step_sleep_s)
        t_comm = time.perf_counter()
        kind = planted.sync_fault(
            step
        )  # a planted collective-hang skip or mismatch of this rank's reductions
        if kind != "skip":
            sent = buf[:-1] if kind == "shape" else buf
            op = ReduceOp.MAX if kind == "op" else ReduceOp.SUM
            if K > 1:
                dist.all_reduce(sent, op=op)
            loop.manager.allreduce(sent, reduce_op=op).wait()
        off = 0
        for param in params:
            param.grad = buf[off : off + param.numel()].to(torch.float32).view_as(param).clone()
            off += param.numel()
        planted.after_backward(step, params)
        if loop.manager.should_commit():
            optimizer.step()
            scheduler.step()
            planted.after_update(step, params)
            loss_value = float(buf[numel])
            planted.check_loss(step, loss_value)
            loop.committed(
                q, loss_value, t_step, global_batch(args.batch_mode, args.batch_size, groups, K, n)
            )
        else:
            loop.skipped(q, t_step, t_comm)
    loop.finish(loss_value, params_digest(net))
    if K > 1:
        dist.destroy_process_group()
    return 0


class FtMlpOptions(BaseModel):
    """The workload's options: each (but ``groups``, the harness's) is also the program's ``--option``."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(default=60, ge=1, description="committed steps to train")
    batch_mode: Literal["global", "replica"] = Field(
        default="global",
        description="global: a fixed global batch split among the replica groups in the quorum; replica: a batch "
        "per rank, averaged over the groups taking part (upstream torchft)",
    )
    batch_size: int = Field(
        default=32,
        ge=1,
        description="global mode: samples per step over all groups (a multiple of G*K); replica "
        "mode: per rank",
    )
    hidden: int = Field(default=128, ge=1, description="hidden width")
    layers: int = Field(default=2, ge=1, description="hidden layers")
    lr: float = Field(default=0.01, gt=0, description="initial SGD learning rate")
    pg_timeout_s: float = Field(default=60.0, gt=0, description="gloo timeout of torchft's process group")
    step_sleep_s: float = Field(default=0.0, ge=0, description="sleep inside each step (emulated compute)")
    groups: int | None = Field(
        default=None,
        ge=1,
        description="replica groups (default: workload.nodes; ranks / groups per group)",
        json_schema_extra={"program": False},
    )


class FtMlpWorkload(ProgramWorkload[FtMlpOptions]):
    """The ft-mlp workload (see :mod:`chaosbench.workloads.ft_mlp`); needs the ``torchft`` adapter.

    ``workload.ranks`` is the total over all replica groups; the groups are ``groups`` (default: ``nodes``),
    so ``{name: ft-mlp, ranks: 2, nodes: 2}`` or ``{ranks: 2, groups: 2}`` is 2 groups of 1 rank."""

    name: ClassVar[str] = "ft-mlp"
    program: ClassVar[str] = PROGRAM
    desyncs: ClassVar[frozenset[str]] = frozenset({"skip", "shape", "op"})
    checkpoints: ClassVar[bool] = False  # no checkpoints: a restarted group heals from a live peer

    @property
    def pg_timeout_s(self) -> float | None:
        return self.options.pg_timeout_s

    @property
    def total_steps(self) -> int | None:
        return self.options.steps

    def replica_groups(self) -> int:
        o = self.options
        groups = int(o.groups or self.spec.nodes)
        if self.spec.ranks % groups:
            raise ValueError(f"ft-mlp: ranks ({self.spec.ranks}) must be a multiple of groups ({groups})")
        return groups

    def argv(self, run: RunPaths) -> list[str]:
        o = self.options
        if o.batch_mode == "global" and o.batch_size % self.spec.ranks:
            from chaosbench.errors import SpecError

            raise SpecError(
                f"batch_size {o.batch_size} must be a multiple of ranks ({self.spec.ranks}) in global mode",
                obj="ft-mlp",
            )
        return super().argv(run)


if __name__ == "__main__":
    sys.exit(main())
