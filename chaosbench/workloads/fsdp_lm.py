"""A small transformer language model sharded with FSDP2, on synthetic tokens, checkpointed with DCP.

Run one process per rank with the usual ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), either directly or under torchrun::

    python -m chaosbench.workloads.fsdp_lm --ckpt-dir /tmp/ckpt --steps 60 --checkpoint-every 10

The model is a token embedding plus a learned positional embedding, ``--layers`` pre-norm
``nn.TransformerEncoderLayer`` blocks under a causal mask, a final LayerNorm and a linear LM head. Every block and
then the root are wrapped with ``fully_shard`` (FSDP2) over a 1-D device mesh of all ranks, so each rank holds a
1/world_size slice (dim 0) of every parameter and of the AdamW state.

Contract (what the harness relies on; the same as :mod:`chaosbench.workloads.ddp_mlp`):

- ``probe.rank_start(global_batch=world_size * batch_size)`` is emitted before the process group is created, so
  the harness learns the pid early.
- Training is a pure function of ``--seed``, the world size and the hyper-parameters: model init comes from the
  seed (identical on every rank before sharding), the token batch of step ``s`` on rank ``r`` comes from a
  generator seeded with ``(seed, s, r)`` (the data position *is* the step index), dropout draws from the global
  RNG seeded per rank, and AdamW moments plus a warmup/cosine LR schedule carry state. A run killed and resumed
  from a checkpoint ends with bit-identical parameters (same ``final digest``) to an uninterrupted run.
- The synthetic language: each sequence starts at a uniformly drawn token and continues with
  ``next = (token * TOKEN_MUL + TOKEN_ADD) % vocab``, except that a ``NOISE_P`` fraction of positions is replaced
  by a uniformly drawn token (and the chain continues from it). The loss falls from about ``ln(vocab)`` towards
  the noise floor.
- After step ``K``, ``2K``, ... every rank writes its own shard file (``__<rank>_0.distcp``) of
  ``<ckpt-dir>/step_<8-digit step>/`` with ``dcp.save``: the sharded model and optimizer state dicts from
  ``get_state_dict`` (DTensors: each rank writes only its slice), the LR scheduler, step, data position and each
  rank's RNG state under the rank's own key ``rng.rank<r>``. After a barrier rank 0 atomically creates
  ``COMPLETE`` in that directory; a directory without ``COMPLETE`` is never loaded (it is deleted and rewritten if
  training reaches that step again). A checkpoint written at another world size loads too (DCP
  reshards the model and optimizer onto the new world: torchrun-elastic shrinking onto fewer nodes); the data
  and dropout streams are per rank, so a resized job trains on another global batch and diverges from one that
  was not, and a rank that did not exist when it was written reseeds its RNG (see ``Checkpoints.resume``).
- On start rank 0 picks the newest complete checkpoint and broadcasts its step; every rank loads it and training
  continues with the next step. Without one, training starts from scratch.
- After each optimizer step ``probe.step(step, loss, duration_s)`` is emitted (``loss``: this rank's mean
  cross-entropy in nats per token; ``duration_s``: that step's own compute, checkpointing excluded) and
  ``step <n> loss <x>`` is printed. At the end ``probe.train_end(steps, loss, digest)`` is emitted, where the
  digest is a sha256 over the *full* (all-gathered) parameters, identical on every rank and independent of the
  sharding; ``final digest <sha256 hex>`` is printed and the process exits 0. Any failure (a dead peer, a
  process-group timeout, an unreadable checkpoint) raises and exits non-zero.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from pydantic import Field

from chaosbench.probe import Probe
from chaosbench.workloads.base import TrainingProgram
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

#: The program, as ``python -m`` runs it.
PROGRAM = "chaosbench.workloads.fsdp_lm"
DROPOUT_P = 0.1
#: Feed-forward width of each block, as a multiple of ``--d-model``.
FF_MULT = 4
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.95)
#: LR schedule: linear warmup over the first ``WARMUP_FRACTION`` of ``--steps``, then cosine decay to
#: ``MIN_LR_FRACTION`` of ``--lr`` at the last step. Closed form of the step count, so resuming is exact.
WARMUP_FRACTION = 0.1
MIN_LR_FRACTION = 0.1
#: The synthetic language: ``next = (token * TOKEN_MUL + TOKEN_ADD) % vocab`` with ``NOISE_P`` random tokens.
TOKEN_MUL = 5
TOKEN_ADD = 3
NOISE_P = 0.1


class FsdpLmOptions(TrainingOptions):
    """The workload's options: each is also the program's ``--option`` (one place for every option)."""

    vocab: int = Field(default=128, ge=2, description="vocabulary size")
    seq_len: int = Field(default=32, ge=2, description="tokens per training sequence")
    d_model: int = Field(default=64, ge=8, description="model width")
    heads: int = Field(default=4, ge=1, description="attention heads per block")
    layers: int = Field(default=2, ge=1, description="transformer blocks")
    batch_size: int = Field(default=8, ge=1, description="sequences per rank")
    lr: float = Field(default=3e-3, gt=0, description="peak learning rate of AdamW")


class FsdpLmWorkload(TrainingProgram[FsdpLmOptions]):
    """A small transformer LM sharded with FSDP2 (every rank writes its own DCP shard); see the module
    docstring."""

    name: ClassVar[str] = "fsdp-lm"
    program: ClassVar[str] = PROGRAM
    #: FSDP's gradient collectives are its own reduce-scatters: it can leave one out, not reshape one
    desyncs: ClassVar[frozenset[str]] = frozenset({"skip"})


def parser() -> argparse.ArgumentParser:
    return build_parser(
        PROGRAM,
        "Deterministic FSDP2 training of a small transformer LM on synthetic tokens, "
        "with resumable per-rank-sharded DCP checkpoints.",
        FsdpLmOptions,
    )


def lr_factor(step: int, total_steps: int) -> float:
    """Multiplier of ``--lr`` for the update after ``step`` completed steps (LambdaLR's ``last_epoch``)."""
    warmup = max(1, math.ceil(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * 0.5 * (1.0 + math.cos(math.pi * progress))


def synthetic_tokens(gen: Any, rows: int, seq_len: int, vocab: int) -> Any:
    """``rows`` sequences of ``seq_len + 1`` tokens (int64, CPU) of the synthetic language (see the module
    docstring), drawn from the torch generator ``gen``: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    import torch

    n = seq_len + 1
    noise = torch.randint(vocab, (rows, n), generator=gen)
    is_noise = torch.rand(rows, n, generator=gen) < NOISE_P
    seq = torch.empty(rows, n, dtype=torch.int64)
    seq[:, 0] = noise[:, 0]
    for t in range(1, n):
        nxt = (seq[:, t - 1] * TOKEN_MUL + TOKEN_ADD) % vocab
        seq[:, t] = torch.where(is_noise[:, t], noise[:, t], nxt)
    return seq


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(parser(), FsdpLmOptions, argv)
    probe = Probe.from_env()
    # each rank trains on its own batch_size sequences: a job re-formed at another world size (torchrun-elastic
    # shrinking onto fewer nodes, DCP resharding the checkpoint) trains on another global batch
    probe.rank_start(global_batch=probe.world_size * args.batch_size)
    try:
        return _train(args, probe)
    finally:
        probe.close()


class _LocalShard:
    """A DTensor parameter seen through its local shard (for planted corruption of this rank's part)."""

    def __init__(self, p: Any) -> None:
        self.data = p.data.to_local() if hasattr(p.data, "to_local") else p.data
        g = p.grad
        self.grad = g.to_local() if g is not None and hasattr(g, "to_local") else g


def _local(p: Any) -> _LocalShard:
    return _LocalShard(p)


@contextmanager
def _no_gradient_sync(model: Any) -> Iterator[None]:
    """A planted ``collective-hang`` ``skip`` on this rank: this step's backward without FSDP's reduce-scatters."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _sharded_model(args: argparse.Namespace, mesh: Any, device: Any) -> Any:
    """The module docstring's transformer LM on ``device``, its init drawn from ``--seed`` alone (identical on
    every rank), then every block and the root wrapped with ``fully_shard`` over ``mesh``: this rank keeps its
    dim-0 slice of each parameter. Leaves the global RNG seeded for the init; the caller reseeds it."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb = nn.Embedding(args.vocab, args.d_model)
            self.pos_emb = nn.Embedding(args.seq_len, args.d_model)
            self.drop = nn.Dropout(DROPOUT_P)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    args.d_model,
                    args.heads,
                    dim_feedforward=FF_MULT * args.d_model,
                    dropout=DROPOUT_P,
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(args.layers)
            )
            self.norm = nn.LayerNorm(args.d_model)
            self.head = nn.Linear(args.d_model, args.vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            n = tokens.shape[1]
            pos = torch.arange(n, device=tokens.device)
            x = self.drop(self.tok_emb(tokens) + self.pos_emb(pos))
            mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            # Logits as (batch * seq, vocab): a 2-D Linear gives a fresh tensor, where a 3-D one returns a view,
            # which FSDP2 warns about for a root module's output.
            return self.head(self.norm(x).reshape(-1, x.shape[-1]))

    # Model init is identical on every rank; fully_shard then keeps each rank's dim-0 slice of it.
    torch.manual_seed(mix_seed(args.seed, 0x6D6F64656C))
    model = TinyLM().to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _train(args: argparse.Namespace, probe: Probe) -> int:
    # Heavy imports after rank_start so the harness sees the pid before torch's import time.
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    if args.d_model % args.heads:
        raise SystemExit(f"fsdp_lm: --d-model {args.d_model} is not divisible by --heads {args.heads}")
    # Embedding backward and attention backward use atomics on CUDA: a bit-identical resume needs the
    # deterministic kernels.
    d = init_distributed("fsdp_lm", args.pg_timeout_s, args.backend, deterministic=True)
    rank, device = d.rank, d.device
    mesh = init_device_mesh(device.type, (d.world_size,))
    model = _sharded_model(args, mesh, device)
    # Dropout draws from the global RNG, seeded per rank, so the RNG state is part of the resumable state.
    torch.manual_seed(mix_seed(args.seed, 0x64726F70, rank))

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY)
    # A plain function as lr_lambda: LambdaLR's state dict then holds last_epoch/base_lrs only, and the
    # schedule itself is rebuilt from --steps on resume.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of (1-based) step ``step`` on this rank: a function of (seed, step, rank) only."""
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, rank))
        seq = synthetic_tokens(gen, args.batch_size, args.seq_len, args.vocab).to(device)
        return seq[:, :-1], seq[:, 1:]

    ckpts = Checkpoints.for_training(args.ckpt_dir, probe, d, model, optimizer, scheduler)
    start_step, _ = ckpts.resume(args.seed)
    save = ckpts.save

    # ---- train ----------------------------------------------------------------------------------------
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    loss_value = train_steps(
        probe,
        range(start_step + 1, args.steps + 1),
        batch,
        lambda x, y: loss_fn(model(x), y.reshape(-1)),
        optimizer,
        scheduler,
        lambda: [_local(p) for p in model.parameters()],
        args.step_sleep_s,
        args.checkpoint_every,
        save,
        args.save_on_sigterm,
        desync=lambda kind: _no_gradient_sync(model),
    )
    end_training(probe, model, args.steps, start_step, loss_value)
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
