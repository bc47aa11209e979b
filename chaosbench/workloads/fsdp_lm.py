"""A small transformer language model sharded with FSDP2, on synthetic tokens, checkpointed with DCP.

Run one process per rank with the usual ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), either directly or under torchrun::

    python -m chaosbench.workloads.fsdp_lm --ckpt-dir /tmp/ckpt --steps 60 --checkpoint-every 10

The model is a token embedding plus a learned positional embedding, ``--layers`` pre-norm
``nn.TransformerEncoderLayer`` blocks under a causal mask, a final LayerNorm and a linear LM head. Every block and
then the root are wrapped with ``fully_shard`` (FSDP2) over a 1-D device mesh of all ranks, so each rank holds a
1/world_size slice (dim 0) of every parameter and of the AdamW state.

Contract (what the harness relies on; the same as :mod:`chaosbench.workloads.ddp_mlp`):

- ``probe.rank_start()`` is emitted before the process group is created, so the harness learns the pid early.
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
  training reaches that step again). Resume with the world size that wrote it: the data and dropout streams
  are per rank, and a rank without its ``rng.rank<r>`` key fails to load.
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
import hashlib
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from chaosbench.probe import Probe
from chaosbench.workloads.ddp_mlp import (
    COMPLETE_MARKER,
    ckpt_path,
    find_latest_complete,
    mark_complete,
    mix_seed,
)
from chaosbench.workloads.planted import Planted

__all__ = ["build_parser", "main", "params_digest", "ckpt_path", "find_latest_complete"]

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaosbench.workloads.fsdp_lm",
        description="Deterministic FSDP2 training of a small transformer LM on synthetic tokens, "
        "with resumable per-rank-sharded DCP checkpoints.",
    )
    p.add_argument("--steps", type=int, default=60, help="total number of optimizer steps (default: 60)")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        help="save a checkpoint after every K-th step; 0 = never (default: 10)",
    )
    p.add_argument(
        "--ckpt-dir",
        required=True,
        help="directory holding step_<NNNNNNNN>/ checkpoints; the newest complete one is resumed from",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of model init, data and dropout (default: 0)")
    p.add_argument(
        "--pg-timeout-s",
        type=float,
        default=1800.0,
        help="process-group timeout in seconds for collectives (default: 1800)",
    )
    p.add_argument("--vocab", type=int, default=128, help="vocabulary size (default: 128)")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per training sequence (default: 32)")
    p.add_argument("--d-model", type=int, default=64, help="model width (default: 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads per block (default: 4)")
    p.add_argument("--layers", type=int, default=2, help="number of transformer blocks (default: 2)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step (default: 8)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of AdamW (default: 3e-3)")
    p.add_argument(
        "--step-sleep-s",
        type=float,
        default=0.0,
        help="seconds of sleep inside each step (counted in its duration), to emulate a slower step (default: 0)",
    )
    p.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="process-group backend (default: nccl if CUDA is available, else gloo)",
    )
    return p


def lr_factor(step: int, total_steps: int) -> float:
    """Multiplier of ``--lr`` for the update after ``step`` completed steps (LambdaLR's ``last_epoch``)."""
    warmup = max(1, math.ceil(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * 0.5 * (1.0 + math.cos(math.pi * progress))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    probe = Probe.from_env()
    probe.rank_start()
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


def _train(args: argparse.Namespace, probe: Probe) -> int:
    # Heavy imports after rank_start so the harness sees the pid before torch's import time.
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise SystemExit(f"fsdp_lm: {var} is not set; launch with torchrun or set the env:// variables")
    if args.steps < 0 or args.checkpoint_every < 0:
        raise SystemExit("fsdp_lm: --steps and --checkpoint-every must be >= 0")
    if min(args.vocab, args.seq_len, args.d_model, args.heads, args.layers, args.batch_size) < 1:
        raise SystemExit(
            "fsdp_lm: --vocab, --seq-len, --d-model, --heads, --layers, --batch-size must be >= 1"
        )
    if args.d_model % args.heads:
        raise SystemExit(f"fsdp_lm: --d-model {args.d_model} is not divisible by --heads {args.heads}")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # Embedding backward and attention backward use atomics on CUDA; a bit-identical resume needs the
        # deterministic kernels (and cuBLAS needs a fixed workspace for them, set before its first use).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    else:
        device = torch.device("cpu")

    dist.init_process_group(backend=backend, timeout=timedelta(seconds=args.pg_timeout_s))
    mesh = init_device_mesh(device.type, (world_size,))

    def barrier() -> None:
        if backend == "nccl":
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

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
    # Dropout draws from the global RNG, seeded per rank, so the RNG state is part of the resumable state.
    torch.manual_seed(mix_seed(args.seed, 0x64726F70, rank))

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY)
    # A plain function as lr_lambda: LambdaLR's state dict then holds last_epoch/base_lrs only, and the
    # schedule itself is rebuilt from --steps on resume.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of (1-based) step ``step`` on this rank: a function of (seed, step, rank) only."""
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, rank))
        n = args.seq_len + 1
        noise = torch.randint(args.vocab, (args.batch_size, n), generator=gen)
        is_noise = torch.rand(args.batch_size, n, generator=gen) < NOISE_P
        seq = torch.empty(args.batch_size, n, dtype=torch.int64)
        seq[:, 0] = noise[:, 0]
        for t in range(1, n):
            nxt = (seq[:, t - 1] * TOKEN_MUL + TOKEN_ADD) % args.vocab
            seq[:, t] = torch.where(is_noise[:, t], noise[:, t], nxt)
        seq = seq.to(device)
        return seq[:, :-1], seq[:, 1:]

    rng_key = f"rng.rank{rank}"

    def rng_state() -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(device)
        return state

    def resumable_state(step: int) -> dict[str, Any]:
        # FSDP2 parameters and AdamW moments are DTensors: these state dicts are sharded, and dcp.save writes
        # each rank's slice into that rank's own file.
        msd, osd = get_state_dict(model, optimizer)
        return {
            "model": msd,
            "optim": osd,
            "scheduler": scheduler.state_dict(),
            "progress": {"step": step, "data_position": step},
            # Rank-local: a key per rank, or DCP would keep one rank's copy of a "replicated" value.
            rng_key: rng_state(),
        }

    # ---- resume -------------------------------------------------------------------------------------
    start_step = 0
    latest = torch.tensor([-1], dtype=torch.int64, device=device)
    if rank == 0:
        found = find_latest_complete(args.ckpt_dir)
        latest[0] = -1 if found is None else found
    dist.broadcast(latest, src=0)
    resume_step = int(latest.item())
    if resume_step >= 0:
        path = ckpt_path(args.ckpt_dir, resume_step)
        with probe.ckpt_load(resume_step, str(path)):
            state = resumable_state(resume_step)
            dcp.load(state, checkpoint_id=str(path))
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state[rng_key]["cpu"])
            if device.type == "cuda":
                torch.cuda.set_rng_state(state[rng_key]["cuda"], device)
            start_step = int(state["progress"]["data_position"])
            if int(state["progress"]["step"]) != resume_step:
                raise RuntimeError(
                    f"checkpoint {path} holds step {state['progress']['step']}, not {resume_step}"
                )
        print(f"resumed from {path} at step {start_step}", flush=True)

    # ---- checkpoint -----------------------------------------------------------------------------------
    def save(step: int) -> None:
        path = ckpt_path(args.ckpt_dir, step)
        with probe.ckpt_save(step, str(path)) as info:
            if rank == 0:
                # A directory left by an interrupted save must not be reused: dcp.save would write new shards
                # beside stale ones. Drop the marker first so a crash mid-delete never leaves COMPLETE behind.
                if path.exists():
                    (path / COMPLETE_MARKER).unlink(missing_ok=True)
                    shutil.rmtree(path)
                path.mkdir(parents=True)
            barrier()
            dcp.save(resumable_state(step), checkpoint_id=str(path))
            barrier()
            if rank == 0:
                mark_complete(path, {"step": step, "world_size": world_size, "t_ns": time.time_ns()})
            barrier()
            info["complete"] = True

    # ---- train ----------------------------------------------------------------------------------------
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    loss_value: float | None = None
    planted = Planted(probe)
    for step in range(start_step + 1, args.steps + 1):
        planted.before_step(step)
        t_step = time.perf_counter()
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y.reshape(-1))
        loss.backward()
        planted.after_backward(step, [_local(p) for p in model.parameters()])
        if args.step_sleep_s > 0:  # emulated extra compute: part of the step, before the optimizer update
            time.sleep(args.step_sleep_s)
        optimizer.step()
        scheduler.step()
        planted.after_update(step, [_local(p) for p in model.parameters()])
        loss_value = float(loss.item())
        planted.check_loss(step, loss_value)
        probe.step(step, loss_value, duration_s=time.perf_counter() - t_step)
        print(f"step {step} loss {loss_value:.6f}", flush=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)

    digest = params_digest(model)
    probe.train_end(max(args.steps, start_step), loss_value, digest)
    print(f"final digest {digest}", flush=True)
    dist.destroy_process_group()
    return 0


def params_digest(module: Any) -> str:
    """sha256 over ``name`` and the raw bytes of every *full* parameter, in ``named_parameters`` order.

    Sharded (DTensor) parameters are all-gathered with ``full_tensor()``, a collective: every rank must call this
    at the same point, and every rank gets the same digest whatever the sharding."""
    import torch
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    for name, param in module.named_parameters():
        full = param.detach()
        if isinstance(full, DTensor):
            full = full.full_tensor()
        h.update(name.encode())
        h.update(full.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _exit_without_finalizing(code: int) -> None:
    """Flush and leave with ``os._exit``, skipping interpreter finalization.

    FSDP2's and DTensor's collectives on gloo are async works whose last reference a gloo worker thread may drop
    a moment after the main thread has moved on; dropping it decrefs Python-owned tensors, which needs the GIL.
    If that happens while the interpreter is finalizing, the worker is force-unwound inside a noexcept destructor
    and the process dies with SIGABRT ("terminate called without an active exception") after a successful run:
    about 1 run in 15 on a loaded 2-core machine. Everything this program writes is flushed and closed by then
    (the probe is closed in ``main``, the process group destroyed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_without_finalizing(main())
