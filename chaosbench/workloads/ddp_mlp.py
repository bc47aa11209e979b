"""A small but real DDP training program: an MLP on synthetic data, checkpointed with torch.distributed.checkpoint.

Run one process per rank with the usual ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), either directly or under torchrun::

    python -m chaosbench.workloads.ddp_mlp --ckpt-dir /tmp/ckpt --steps 60 --checkpoint-every 10

Contract (what the harness relies on):

- ``probe.rank_start()`` is emitted before the process group is created, so the harness learns the pid early.
- Training is a pure function of ``--seed`` and the hyper-parameters: model init comes from the seed, the batch of
  step ``s`` on rank ``r`` comes from a generator seeded with ``(seed, s, r)`` (the data position *is* the step
  index), dropout draws from the global RNG seeded per rank, and SGD momentum plus a StepLR schedule carry state.
  A run killed and resumed from a checkpoint ends with bit-identical parameters (same ``final digest``) to an
  uninterrupted run with the same seed and world size.
- After step ``K``, ``2K``, ... every rank writes its share of ``<ckpt-dir>/step_<8-digit step>/`` with
  ``dcp.save``: model, optimizer, LR scheduler, step, data position and each rank's RNG state under the rank's own
  key ``rng.rank<r>``. After a barrier rank 0 atomically creates ``COMPLETE`` in that directory; a directory
  without ``COMPLETE`` is never loaded (it is deleted and rewritten if training reaches that step again).
- On start rank 0 picks the newest complete checkpoint and broadcasts its step; every rank loads it and training
  continues with the next step. Without one, training starts from scratch. A checkpoint written at another world
  size (an elastic job that shrank or grew) loads too: the replicated model, optimizer and scheduler state
  reshard, and a rank that had no RNG key in it (it did not exist then) reseeds from ``(seed, step, rank)``;
  training then goes on with another global batch (``world_size * batch_size``, ``global_batch`` in
  ``rank_start``) and other data per rank, so it no longer matches an uninterrupted run.
  With ``--load-fallback`` a checkpoint
  that fails to load on any rank is reported (``ckpt_load_failed`` event) and the next older complete one is
  tried; when none loads, the process fails.
- After each optimizer step ``probe.step(step, loss, duration_s)`` is emitted (``duration_s``: that step's
  own compute, checkpointing excluded) and ``step <n> loss <x>`` is printed. At the end
  ``probe.train_end(steps, loss, digest)`` is emitted, ``final digest <sha256 hex>`` is printed and the process
  exits 0. Any failure (a dead peer, a process-group timeout, an unreadable checkpoint) raises and exits non-zero.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaosbench.probe import Probe
from chaosbench.workloads.base import TrainingProgram
from chaosbench.workloads.planted import Planted
from chaosbench.workloads.skeleton import (
    Checkpoints,
    TrainingOptions,
    build_parser,
    end_training,
    exit_without_finalizing,
    init_distributed,
    mix_seed,
    parse_args,
    train_steps,
)

#: Width of the synthetic input and of the regression target.
IN_FEATURES = 64
OUT_FEATURES = 16
DROPOUT_P = 0.1
MOMENTUM = 0.9
#: StepLR: the learning rate is multiplied by ``LR_GAMMA`` every ``LR_STEP_SIZE`` steps.
LR_STEP_SIZE = 20
LR_GAMMA = 0.5

#: The program, as ``python -m`` runs it.
PROGRAM = "chaosbench.workloads.ddp_mlp"

#: Planted recovery bugs (``bug``): each breaks resumption in a way a recovery regression gate must catch.
BUGS = {
    "forget-rng": "the RNG state is not restored on resume (dropout masks differ afterwards)",
    "forget-data-position": "the data position restarts at the first batch on resume",
    "non-atomic-ckpt": "COMPLETE is written before the shards, so a torn save looks complete",
    "forget-optimizer": "the optimizer state (momentum, learning rate) is not restored on resume",
}


class DdpMlpOptions(TrainingOptions):
    """The workload's options: each is also the program's ``--option`` (one place for every option)."""

    hidden: int = Field(default=256, ge=1, description="hidden width of the MLP")
    layers: int = Field(default=3, ge=1, description="hidden layers")
    batch_size: int = Field(default=32, ge=1, description="per rank")
    lr: float = Field(default=0.01, gt=0, description="initial SGD learning rate")
    load_fallback: bool = Field(
        default=False, description="a checkpoint that fails to load is skipped for the next older one"
    )
    bug: Literal["forget-rng", "forget-data-position", "non-atomic-ckpt", "forget-optimizer"] | None = Field(
        default=None, description="plant a recovery bug (to prove that a gate catches it)"
    )


class DdpMlpWorkload(TrainingProgram[DdpMlpOptions]):
    """A DDP MLP on gloo (NCCL when CUDA is present) over synthetic data; see the module docstring."""

    name: ClassVar[str] = "ddp-mlp"
    program: ClassVar[str] = PROGRAM
    desyncs: ClassVar[frozenset[str]] = frozenset({"skip", "shape", "op"})
    bridged_checkpoints: ClassVar[bool] = True


class GradSync:
    """A DDP comm hook doing what DDP's own gradient allreduce does (the bucket scaled by 1/world size, then
    summed), except inside ``with grad_sync(kind)`` (a planted ``collective-hang``): ``skip`` leaves the
    allreduce out (the rank's own gradients stay), ``shape`` reduces the bucket but its last element, ``op``
    reduces with MAX. Registered only on a rank where such a fault is planted."""

    def __init__(self, model: Any, world_size: int) -> None:
        self.kind: str | None = None
        self.world_size = world_size
        # DDP checks a hook's annotations against its own types: a lambda has none
        model.register_comm_hook(None, lambda state, bucket: self._hook(bucket))

    @contextmanager
    def __call__(self, kind: str) -> Iterator[None]:
        self.kind = kind
        try:
            yield
        finally:
            self.kind = None

    def _hook(self, bucket: Any) -> Any:
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        if self.kind == "skip":
            fut: Any = torch.futures.Future()
            fut.set_result(buf)
            return fut
        buf.mul_(1.0 / self.world_size)
        if self.kind == "shape":
            work = dist.all_reduce(buf[:-1], async_op=True)
        else:
            work = dist.all_reduce(
                buf, op=dist.ReduceOp.MAX if self.kind == "op" else dist.ReduceOp.SUM, async_op=True
            )
        return work.get_future().then(lambda _: buf)


def parser() -> argparse.ArgumentParser:
    return build_parser(
        PROGRAM,
        "Deterministic DDP training of an MLP on synthetic data, with resumable DCP checkpoints.",
        DdpMlpOptions,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(parser(), DdpMlpOptions, argv)
    probe = Probe.from_env()
    probe.rank_start(global_batch=probe.world_size * args.batch_size)
    try:
        return _train(args, probe)
    finally:
        probe.close()


def _train(args: argparse.Namespace, probe: Probe) -> int:
    # Heavy imports after rank_start so the harness sees the pid before torch's import time.
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    d = init_distributed("ddp_mlp", args.pg_timeout_s, args.backend)
    rank, device = d.rank, d.device

    # Model init is identical on every rank (DDP broadcasts rank 0's parameters anyway).
    torch.manual_seed(mix_seed(args.seed, 0x6D6F64656C))
    layers: list[nn.Module] = []
    width = IN_FEATURES
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.ReLU(), nn.Dropout(DROPOUT_P)]
        width = args.hidden
    layers.append(nn.Linear(width, OUT_FEATURES))
    net = nn.Sequential(*layers).to(device)
    # Dropout draws from the global RNG, seeded per rank, so the RNG state is part of the resumable state.
    torch.manual_seed(mix_seed(args.seed, 0x64726F70, rank))

    model = DDP(net, device_ids=[d.local_rank] if d.backend == "nccl" else None)
    planted = Planted(probe)
    desync = GradSync(model, d.world_size) if planted.desyncs else None
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=LR_STEP_SIZE, gamma=LR_GAMMA)

    teacher_gen = torch.Generator().manual_seed(mix_seed(args.seed, 0x7465616368))
    teacher = torch.randn(IN_FEATURES, OUT_FEATURES, generator=teacher_gen) / IN_FEATURES**0.5
    teacher = teacher.to(device)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch of (1-based) step ``step`` on this rank: a function of (seed, step, rank) only."""
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, rank))
        x = torch.randn(args.batch_size, IN_FEATURES, generator=gen).to(device)
        return x, torch.tanh(x @ teacher)

    ckpts = Checkpoints.for_training(
        args.ckpt_dir, probe, d, model, optimizer, scheduler, restore_optimizer=args.bug != "forget-optimizer"
    )
    start_step, _ = ckpts.resume(args.seed, fallback=args.load_fallback, restore_rng=args.bug != "forget-rng")
    # batch index = step - data_base (0 unless the forget-data-position bug is planted)
    data_base = start_step if args.bug == "forget-data-position" else 0

    def save(step: int) -> None:
        ckpts.save(step, marker_first=args.bug == "non-atomic-ckpt")

    # ---- train ----------------------------------------------------------------------------------------
    loss_fn = nn.MSELoss()
    model.train()
    loss_value = train_steps(
        probe,
        range(start_step + 1, args.steps + 1),
        lambda step: batch(step - data_base),
        lambda x, y: loss_fn(model(x), y),
        optimizer,
        scheduler,
        lambda: list(net.parameters()),
        args.step_sleep_s,
        args.checkpoint_every,
        save,
        args.save_on_sigterm,
        planted,
        desync,
    )
    end_training(probe, net, args.steps, start_step, loss_value)
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
