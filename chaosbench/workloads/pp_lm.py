"""fsdp-lm's small transformer LM split into pipeline stages (``torch.distributed.pipelining``), replicated over
data-parallel replicas, on the same synthetic tokens, checkpointed with DCP.

Run one process per rank with the usual ``env://`` variables, either directly or under torchrun::

    python -m chaosbench.workloads.pp_lm --ckpt-dir /tmp/ckpt --stages 2 --steps 60 --checkpoint-every 10

Layout: ``dp = world_size // stages`` replicas x ``--stages`` pipeline stages, pipeline as the outer dimension
(torchtitan's ``["pp", "dp"]`` mesh): ``rank = stage * dp + replica`` (:func:`placement`). With node-major rank
placement (node0 holds ranks 0..k-1) the stages of one replica sit on different nodes, so losing a node takes
whole pipeline replicas with it. Ranks ``>= dp * stages`` (a world size that is not a multiple of ``--stages``)
are idle: they say so on stdout and take part only in the world-level steps (the resume step's broadcast and
the final digest); a world size below ``--stages`` fails with a one-line error.

The model is fsdp-lm's (token plus positional embedding, ``--layers`` pre-norm ``nn.TransformerEncoderLayer``
blocks under a causal mask, a final LayerNorm, a linear head), built whole from the seed on every rank and then
cut: stage 0 keeps the embeddings, the last stage the norm, head and loss, and the blocks are divided as evenly
as possible (:func:`stage_blocks`; earlier stages get one more when they do not divide). Every stage keeps the
whole model's parameter names (``blocks.<i>`` with the global block index), so checkpoints and the digest name
parameters the same whatever the layout.

Contract (what the harness relies on; otherwise as :mod:`chaosbench.workloads.fsdp_lm`):

- ``probe.rank_start()`` is emitted before the process group is created, with ``stage``, ``replica`` (None on
  an idle rank), ``stages``, ``dp`` and ``global_batch = dp * microbatches * microbatch_size`` (sequences per
  optimizer step over all replicas).
- Step ``s``: replica ``d`` draws ``microbatches * microbatch_size`` sequences of the synthetic language from a
  generator seeded with ``(seed, s, d)`` (stage 0 takes the inputs, the last stage the targets) and runs them
  through its pipeline with ``--schedule`` (GPipe or 1F1B) in ``--microbatches`` micro-batches; the loss is the
  mean cross-entropy per token of each micro-batch, and the schedule averages the gradients over the
  micro-batches. Dropout in the forward of micro-batch ``m`` on stage ``k`` draws from the global RNG reseeded
  with ``(seed, s, d, k, m)``, so no RNG state is part of the training state. Each stage then averages its
  gradients over its data-parallel group (the same stage of every replica): one flat buffer in parameter order,
  one all-reduce, so the result is the same on every replica and from run to run. AdamW and fsdp-lm's
  warmup/cosine LR schedule follow, per stage.
- After each optimizer step every training rank emits ``probe.step(step, loss, duration_s)`` (``loss``: its
  replica's mean loss over the micro-batches, computed on the last stage and broadcast over the replica's
  pipeline group) and prints ``step <n> loss <x>``.
- Checkpoints: after step ``K``, ``2K``, ... the training ranks write one DCP checkpoint
  ``<ckpt-dir>/step_<8-digit step>/`` together (``dcp.save`` over the training ranks). Each stage's state is its
  own part under ``stage<k>.`` (``model``, ``optim``, ``scheduler``) beside ``progress`` (step, data position).
  The replicas of a stage hold identical state under identical keys, and DCP's save planner keeps one copy of a
  key written by several ranks: each stage's state is stored once, by one of its replicas. Then rank 0
  atomically creates ``COMPLETE`` (JSON: step, world size, stages, dp); a directory without it is never loaded,
  and is deleted and rewritten if training reaches that step again.
- Resume: rank 0 picks the newest complete checkpoint and broadcasts its step to every rank; each training rank
  loads its stage's part. The stage count must be the one that wrote it (a clear error otherwise); the number of
  replicas may differ (a shrunk or grown elastic job): every replica of stage ``k`` loads the same part. Then
  the global batch is ``dp * microbatches * microbatch_size`` for the new ``dp`` and replica ``d`` of the new
  layout trains on stream ``d``, so the run goes on with another global batch and other data than an
  uninterrupted one (its final state differs). At an unchanged dp the resume is bit-identical to an
  uninterrupted run.
- At the end every rank computes the digest: sha256 over the name and bytes of every full parameter in the
  whole model's ``named_parameters`` order, gathered from replica 0 of each stage, so it equals
  :func:`~chaosbench.workloads.skeleton.params_digest` of the uncut model and is the same on every rank and for
  every layout. ``probe.train_end(steps, loss, digest)`` is emitted (by idle ranks too, with no loss), ``final
  digest <sha256 hex>`` printed and the process exits 0. Any failure raises and exits non-zero.
- Idle ranks wait for the final digest on a CPU (gloo) group of all ranks whose timeout is
  :data:`IDLE_WAIT_S`, not ``--pg-timeout-s``: they wait out the whole training there. A peer that dies closes
  its connections, which ends that wait with an error.

Under the ``torchft`` adapter (``TORCHFT_LIGHTHOUSE`` set; :func:`_train_ft`) one replica group is one whole
pipeline: the group's torchrun world is the ``--stages`` stages (``RANK`` = stage), ``REPLICA_GROUP_ID`` the
replica, :meth:`PpLmWorkload.replica_groups` = ranks / stages, and the probe reports ``rank = group * stages +
stage`` (the adapter's numbering; group ``g`` runs on node ``g``, so a lost node is a lost pipeline replica).
Each stage has its own ``torchft.Manager`` (``replica_id`` the group, group rank the stage), whose process group
pairs it with the same stage of every other group. As ft-mlp's ``global`` mode: step ``s`` has ``G`` replica
slots (``G`` groups; slot ``j``'s batch from ``(seed, s, j)``, dropout keyed by the slot), the groups in the
quorum split the slots (participant ``p`` of ``n``: ``p, p + n, ...``), each slot is one pipeline pass whose
gradients are added in float64, the Manager sums the stages' buffers over the groups, and a committed step
divides by ``G``: the update does not depend on which groups took part, so a run that lost a group and healed
it (each stage from the same stage of a live peer, over HTTP) ends with the control's digest. ``step``,
``step_skipped``, ``quorum``, ``detect`` and ``heal_*`` events as ft-mlp's; no checkpoints (``--ckpt-dir`` and
``--checkpoint-every`` are not used). The global batch is ``G * microbatches * microbatch_size`` throughout.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaosbench.probe import ENV_EVENTS, ENV_NODE, Probe, incarnation_from_env
from chaosbench.workloads.base import TrainingProgram
from chaosbench.workloads.fsdp_lm import (
    ADAM_BETAS,
    DROPOUT_P,
    FF_MULT,
    WEIGHT_DECAY,
    lr_factor,
    synthetic_tokens,
)
from chaosbench.workloads.ft_loop import FtLoop, log_to_stderr
from chaosbench.workloads.ft_mlp import ENV_GROUP, ENV_GROUPS, ENV_LIGHTHOUSE, replica_rank, replica_slots
from chaosbench.workloads.planted import Planted
from chaosbench.workloads.skeleton import (
    COMPLETE_MARKER,
    Dist,
    PreemptionNotice,
    TrainingOptions,
    build_parser,
    ckpt_path,
    complete_steps,
    exit_without_finalizing,
    init_distributed,
    mark_complete,
    mix_seed,
    parse_args,
)

#: The program, as ``python -m`` runs it.
PROGRAM = "chaosbench.workloads.pp_lm"
#: Timeout of the all-ranks CPU group of the world-level steps: an idle rank waits there for the whole training.
IDLE_WAIT_S = 7 * 24 * 3600.0
#: Seed keys (see :func:`~chaosbench.workloads.skeleton.mix_seed`): model init as fsdp-lm's, dropout.
MODEL_KEY = 0x6D6F64656C
DROPOUT_KEY = 0x64726F70


class PpLmOptions(TrainingOptions):
    """The workload's options: each is also the program's ``--option`` (one place for every option)."""

    stages: int = Field(default=2, ge=1, description="pipeline stages (dp = world size // stages replicas)")
    microbatches: int = Field(default=4, ge=1, description="micro-batches per step and replica")
    microbatch_size: int = Field(default=2, ge=1, description="sequences per micro-batch")
    schedule: Literal["gpipe", "1f1b"] = Field(default="1f1b", description="pipeline schedule")
    vocab: int = Field(default=128, ge=2, description="vocabulary size")
    seq_len: int = Field(default=32, ge=2, description="tokens per training sequence")
    d_model: int = Field(default=64, ge=8, description="model width")
    heads: int = Field(default=4, ge=1, description="attention heads per block")
    layers: int = Field(default=2, ge=1, description="transformer blocks, divided among the stages")
    lr: float = Field(default=3e-3, gt=0, description="peak learning rate of AdamW")

    @model_validator(mode="after")
    def _consistent(self) -> PpLmOptions:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        if self.schedule == "1f1b" and self.microbatches < self.stages:
            raise ValueError(
                f"schedule 1f1b needs microbatches >= stages ({self.microbatches} < {self.stages})"
            )
        return self


class PpLmWorkload(TrainingProgram[PpLmOptions]):
    """fsdp-lm's transformer LM as pipeline stages x data-parallel replicas; see the module docstring."""

    name: ClassVar[str] = "pp-lm"
    program: ClassVar[str] = PROGRAM

    def replica_groups(self) -> int:
        """Under the ``torchft`` adapter one replica group is one whole pipeline: ``ranks / stages`` groups of
        ``stages`` ranks (other frameworks do not ask)."""
        stages = int(self.options.stages)
        if self.spec.ranks % stages:
            raise ValueError(
                f"pp-lm under torchft: ranks ({self.spec.ranks}) must be a multiple of stages ({stages})"
            )
        return self.spec.ranks // stages


# ------------------------------------------------------------------------------------------------ the layout


@dataclass(frozen=True)
class Placement:
    """Where one rank sits: its stage and replica (None for both on an idle rank), and the layout's size."""

    stage: int | None
    replica: int | None
    stages: int
    dp: int

    @property
    def idle(self) -> bool:
        return self.stage is None


def data_parallel(world_size: int, stages: int) -> int:
    """Replicas of the pipeline a world of ``world_size`` ranks holds; ValueError when it holds none."""
    if stages < 1 or world_size < stages:
        raise ValueError(f"pp_lm: world size {world_size} is below --stages {stages}: no whole pipeline fits")
    return world_size // stages


def placement(rank: int, world_size: int, stages: int) -> Placement:
    """``rank = stage * dp + replica`` for ``rank < dp * stages``; the ranks above are idle."""
    dp = data_parallel(world_size, stages)
    if not 0 <= rank < world_size:
        raise ValueError(f"pp_lm: rank {rank} is outside world size {world_size}")
    if rank >= dp * stages:
        return Placement(None, None, stages, dp)
    return Placement(rank // dp, rank % dp, stages, dp)


def rank_of(stage: int, replica: int, dp: int) -> int:
    return stage * dp + replica


def stage_blocks(layers: int, stages: int) -> list[range]:
    """The (global) block indices of each stage: as even as possible, earlier stages one more."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for k in range(stages):
        n = base + (1 if k < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def global_batch(dp: int, microbatches: int, microbatch_size: int) -> int:
    """Sequences per optimizer step over all replicas: changes with ``dp`` (a resized job)."""
    return dp * microbatches * microbatch_size


# ------------------------------------------------------------------------------------------------ the model


def build_model(opts: PpLmOptions) -> Any:
    """The whole LM (fsdp-lm's architecture; ``blocks`` a ModuleDict keyed by the global block index so that a
    stage cut from it keeps the whole model's parameter names). Call after seeding."""
    import torch
    from torch import nn

    class PipelineLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb: nn.Module | None = nn.Embedding(opts.vocab, opts.d_model)
            self.pos_emb: nn.Module | None = nn.Embedding(opts.seq_len, opts.d_model)
            self.drop = nn.Dropout(DROPOUT_P)
            self.blocks = nn.ModuleDict(
                {
                    str(i): nn.TransformerEncoderLayer(
                        opts.d_model,
                        opts.heads,
                        dim_feedforward=FF_MULT * opts.d_model,
                        dropout=DROPOUT_P,
                        batch_first=True,
                        norm_first=True,
                    )
                    for i in range(opts.layers)
                }
            )
            self.norm: nn.Module | None = nn.LayerNorm(opts.d_model)
            self.head: nn.Module | None = nn.Linear(opts.d_model, opts.vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """Tokens (stage 0) or hidden states (batch, seq, d_model) in; hidden states or, on the last stage,
            logits as (batch * seq, vocab) out."""
            n = x.shape[1]
            if self.tok_emb is not None and self.pos_emb is not None:
                x = self.drop(self.tok_emb(x) + self.pos_emb(torch.arange(n, device=x.device)))
            mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
            for block in self.blocks.values():
                x = block(x, src_mask=mask, is_causal=True)
            if self.norm is not None and self.head is not None:
                return self.head(self.norm(x).reshape(-1, x.shape[-1]))
            return x

    return PipelineLM()


def cut_stage(model: Any, stage: int, stages: int) -> Any:
    """``model`` cut down (in place) to stage ``stage`` of ``stages``."""
    keep = {str(i) for i in stage_blocks(len(model.blocks), stages)[stage]}
    for key in [k for k in model.blocks if k not in keep]:
        del model.blocks[key]
    if stage != 0:
        model.tok_emb = model.pos_emb = None
    if stage != stages - 1:
        model.norm = model.head = None
    return model


def named_param_bytes(module: Any) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of every parameter of ``module``, in ``named_parameters`` order."""
    import torch

    return [
        (name, p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        for name, p in module.named_parameters()
    ]


def digest_of_stages(parts: Sequence[Sequence[tuple[str, bytes]]]) -> str:
    """sha256 as :func:`~chaosbench.workloads.skeleton.params_digest` computes it for the uncut model, from its
    stages' :func:`named_param_bytes` in stage order (the stages' parameters, one after another, are the whole
    model's in its order)."""
    h = hashlib.sha256()
    for part in parts:
        for name, data in part:
            h.update(name.encode())
            h.update(data)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the program


def parser() -> argparse.ArgumentParser:
    return build_parser(
        PROGRAM,
        "Deterministic pipeline-parallel (x data-parallel) training of a small "
        "transformer LM on synthetic tokens, with resumable per-stage DCP checkpoints.",
        PpLmOptions,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(parser(), PpLmOptions, argv)
    opts = PpLmOptions.model_validate({n: getattr(args, n) for n in PpLmOptions.model_fields})
    if ENV_LIGHTHOUSE in os.environ:
        return _main_ft(args, opts)
    probe = Probe.from_env()
    try:
        where = placement(probe.rank, probe.world_size, opts.stages)
    except ValueError as exc:
        probe.rank_start()
        probe.close()
        raise SystemExit(str(exc)) from None
    probe.rank_start(
        global_batch=global_batch(where.dp, opts.microbatches, opts.microbatch_size),
        stage=where.stage,
        replica=where.replica,
        stages=where.stages,
        dp=where.dp,
    )
    try:
        return _run(args, opts, where, probe)
    finally:
        probe.close()


@dataclass
class _Groups:
    """The process groups, created identically on every rank: this rank's data-parallel group (its stage on
    every replica) and pipeline group (its replica's stages), the training ranks' group (None: all ranks are
    training) and the all-ranks CPU group of the world-level steps."""

    dp: Any
    pp: Any
    train: Any
    coord: Any


def _groups(where: Placement, world_size: int, pg_timeout_s: float) -> _Groups:
    import torch.distributed as dist

    dp_groups = [
        dist.new_group([rank_of(k, d, where.dp) for d in range(where.dp)]) for k in range(where.stages)
    ]
    pp_groups = [
        dist.new_group([rank_of(k, d, where.dp) for k in range(where.stages)]) for d in range(where.dp)
    ]
    training = where.dp * where.stages
    train = dist.new_group(list(range(training))) if training < world_size else None
    coord = dist.new_group(
        list(range(world_size)), backend="gloo", timeout=timedelta(seconds=max(IDLE_WAIT_S, pg_timeout_s))
    )
    if where.idle:
        return _Groups(None, None, train, coord)
    assert where.stage is not None and where.replica is not None
    return _Groups(dp_groups[where.stage], pp_groups[where.replica], train, coord)


def _resume_candidates(ckpt_dir: str, coord: Any) -> tuple[int | None, dict[str, Any]]:
    """Rank 0's newest complete checkpoint (step, marker), broadcast to every rank."""
    import json

    import torch.distributed as dist

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        steps = complete_steps(ckpt_dir)
        if steps:
            marker = json.loads((ckpt_path(ckpt_dir, steps[0]) / COMPLETE_MARKER).read_text())
            box[0] = (steps[0], marker)
        else:
            box[0] = (None, {})
    dist.broadcast_object_list(box, src=0, group=coord)
    step, marker = box[0]
    return step, marker


def _run(args: argparse.Namespace, opts: PpLmOptions, where: Placement, probe: Probe) -> int:
    # Heavy imports after rank_start so the harness sees the pid before torch's import time.
    import torch.distributed as dist

    d = init_distributed("pp_lm", opts.pg_timeout_s, args.backend, deterministic=True)
    groups = _groups(where, d.world_size, opts.pg_timeout_s)
    start_step, marker = _resume_candidates(args.ckpt_dir, groups.coord)
    if start_step is not None and int(marker.get("stages", opts.stages)) != opts.stages:
        raise SystemExit(
            f"pp_lm: checkpoint step {start_step} was written with {marker['stages']} stages; "
            f"it resumes only with --stages {marker['stages']} (not {opts.stages})"
        )
    if where.idle:
        used = where.dp * where.stages
        print(
            f"rank {d.rank} idle: world size {d.world_size} is not a multiple of --stages {opts.stages} "
            f"({where.dp} replicas use ranks 0..{used - 1})",
            flush=True,
        )
        parts: list[tuple[str, bytes]] = []
        loss: float | None = None
    else:
        loss, parts = _train(args, opts, where, probe, d, groups, start_step, marker)
    gathered: list[Any] = [None] * d.world_size
    dist.all_gather_object(gathered, parts, group=groups.coord)
    digest = digest_of_stages(gathered)
    probe.train_end(max(opts.steps, start_step or 0), loss, digest)
    print(f"final digest {digest}", flush=True)
    dist.destroy_process_group()
    return 0


class _StageRunner:
    """One rank's pipeline stage: its part of the model (the whole model built from the seed, the same init for
    every layout, then cut), AdamW and the LR schedule over its parameters, and its pipeline schedule over
    ``pp_group`` (the replica's stages, in stage order)."""

    def __init__(self, opts: PpLmOptions, seed: int, stage: int, device: Any, pp_group: Any) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.opts, self.seed, self.stage = opts, seed, stage
        self.first, self.last = stage == 0, stage == opts.stages - 1
        torch.manual_seed(mix_seed(seed, MODEL_KEY))
        self.module = cut_stage(build_model(opts), stage, opts.stages).to(device)
        self.module.train()
        self.params = list(self.module.parameters())
        self._dropout = {"step": 0, "stream": 0, "microbatch": 0}
        self.module.register_forward_pre_hook(self._reseed_dropout)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=opts.lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY
        )
        # A plain function of the step as lr_lambda: LambdaLR's state dict then holds last_epoch/base_lrs only.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, opts.steps))

        def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(logits, target.reshape(-1))

        # Static shapes: with them the stage runs no extra forward of its own to infer them in the first step
        # (which would draw dropout masks in a resumed run's first step that an uninterrupted run does not draw).
        mb, n, width = opts.microbatch_size, opts.seq_len, opts.d_model
        hidden = torch.empty(mb, n, width, device="meta")
        pipe = PipelineStage(
            self.module,
            stage,
            opts.stages,
            device,
            group=pp_group,
            input_args=torch.empty(mb, n, dtype=torch.int64, device="meta") if self.first else hidden,
            output_args=torch.empty(mb * n, opts.vocab, device="meta") if self.last else hidden,
            input_grads=(None,) if self.first else hidden,
            output_grads=(None,) if self.last else hidden,
        )
        schedule_class = ScheduleGPipe if opts.schedule == "gpipe" else Schedule1F1B
        self.schedule = schedule_class(pipe, n_microbatches=opts.microbatches, loss_fn=loss_fn)

    def _reseed_dropout(self, module: Any, inputs: Any) -> None:
        import torch

        d = self._dropout
        torch.manual_seed(
            mix_seed(self.seed, DROPOUT_KEY, d["step"], d["stream"], self.stage, d["microbatch"])
        )
        d["microbatch"] += 1

    def forward_backward(self, step: int, stream: int, x: Any, y: Any) -> list[Any]:
        """One pass of data stream ``stream``'s batch of step ``step`` through the pipeline (``x`` used on the
        first stage, ``y`` on the last): the gradients of the mean micro-batch loss accumulate into ``.grad``;
        the micro-batches' losses on the last stage (else an empty list)."""
        self._dropout.update(step=step, stream=stream, microbatch=0)
        losses: list[Any] = []
        if self.first and self.last:
            self.schedule.step(x, target=y, losses=losses)
        elif self.first:
            self.schedule.step(x)
        elif self.last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        if self._dropout["microbatch"] != self.opts.microbatches:
            raise RuntimeError(
                f"stage {self.stage} ran {self._dropout['microbatch']} forwards in step {step}, "
                f"not {self.opts.microbatches}"
            )
        return losses


class _StageCheckpoints:
    """This rank's stage in the job's DCP checkpoints (one per save, every rank of the job writing its stage's
    part under ``stage<N>``, the data position beside it; rank 0 marks it complete), saved and loaded over the
    job's training group."""

    def __init__(
        self,
        ckpt_dir: str,
        opts: PpLmOptions,
        where: Placement,
        probe: Probe,
        d: Dist,
        groups: _Groups,
        runner: _StageRunner,
    ) -> None:
        self.ckpt_dir, self.opts, self.where, self.probe, self.d, self.groups = (
            ckpt_dir,
            opts,
            where,
            probe,
            d,
            groups,
        )
        self.runner = runner
        self.part = f"stage{where.stage}"

    def state(self, step: int) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        r = self.runner
        msd, osd = get_state_dict(r.module, r.optimizer)
        return {
            self.part: {"model": msd, "optim": osd, "scheduler": r.scheduler.state_dict()},
            "progress": {"step": step, "data_position": step},
        }

    def _barrier(self) -> None:
        import torch.distributed as dist

        d = self.d
        dist.barrier(group=self.groups.train, device_ids=[d.local_rank] if d.backend == "nccl" else None)

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        d, path = self.d, ckpt_path(self.ckpt_dir, step)
        with self.probe.ckpt_save(step, str(path)) as info:
            if d.rank == 0:
                # A directory left by an interrupted save must not be reused (see skeleton.Checkpoints.save).
                if path.exists():
                    (path / COMPLETE_MARKER).unlink(missing_ok=True)
                    shutil.rmtree(path)
                path.mkdir(parents=True)
            self._barrier()
            dcp.save(self.state(step), checkpoint_id=str(path), process_group=self.groups.train)
            self._barrier()
            if d.rank == 0:
                mark_complete(
                    path,
                    {
                        "step": step,
                        "world_size": d.world_size,
                        "stages": self.opts.stages,
                        "dp": self.where.dp,
                        "t_ns": time.time_ns(),
                    },
                )
            self._barrier()
            info["complete"] = True

    def load(self, start_step: int, marker: dict[str, Any]) -> int:
        """Load checkpoint ``start_step`` (``marker``: its COMPLETE marker's fields); returns the data position."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        r, part = self.runner, self.part
        path = ckpt_path(self.ckpt_dir, start_step)
        with self.probe.ckpt_load(start_step, str(path)):
            loaded = self.state(start_step)
            dcp.load(loaded, checkpoint_id=str(path), process_group=self.groups.train)
            set_state_dict(
                r.module,
                r.optimizer,
                model_state_dict=loaded[part]["model"],
                optim_state_dict=loaded[part]["optim"],
            )
            r.scheduler.load_state_dict(loaded[part]["scheduler"])
            start = int(loaded["progress"]["data_position"])
            if int(loaded["progress"]["step"]) != start_step:
                raise RuntimeError(
                    f"checkpoint {path} holds step {loaded['progress']['step']}, not {start_step}"
                )
        written_dp = marker.get("dp")
        resized = f" (written at dp {written_dp})" if written_dp not in (None, self.where.dp) else ""
        print(f"resumed from {path} at step {start}{resized}", flush=True)
        return start


def _train(
    args: argparse.Namespace,
    opts: PpLmOptions,
    where: Placement,
    probe: Probe,
    d: Dist,
    groups: _Groups,
    start_step: int | None,
    marker: dict[str, Any],
) -> tuple[float | None, list[tuple[str, bytes]]]:
    """Train this rank's stage from ``start_step`` (None: from scratch); (last loss, this stage's parameter bytes
    if this is replica 0, else nothing)."""
    import torch
    import torch.distributed as dist

    assert where.stage is not None and where.replica is not None
    stage, replica = where.stage, where.replica
    last = stage == opts.stages - 1
    device = d.device

    runner = _StageRunner(opts, args.seed, stage, device, groups.pp)
    module, optimizer, scheduler = runner.module, runner.optimizer, runner.scheduler
    last_rank_of_replica = rank_of(opts.stages - 1, replica, where.dp)
    ckpt = _StageCheckpoints(args.ckpt_dir, opts, where, probe, d, groups, runner)
    save = ckpt.save
    start = 0 if start_step is None else ckpt.load(start_step, marker)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of (1-based) step ``step`` for this replica: a function of (seed, step, replica)."""
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, replica))
        rows = opts.microbatches * opts.microbatch_size
        seq = synthetic_tokens(gen, rows, opts.seq_len, opts.vocab).to(device)
        return seq[:, :-1], seq[:, 1:]

    params = runner.params
    planted = Planted(probe)
    notice = PreemptionNotice(groups.train) if opts.save_on_sigterm else None
    loss_value: float | None = None
    for step in range(start + 1, opts.steps + 1):
        planted.before_step(step)
        t_step = time.perf_counter()
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=True)
        losses = runner.forward_backward(step, replica, x, y)
        _average_gradients(params, groups.dp, where.dp)
        planted.after_backward(step, params)
        if opts.step_sleep_s > 0:
            time.sleep(opts.step_sleep_s)
        optimizer.step()
        scheduler.step()
        planted.after_update(step, params)
        mean_loss = torch.stack([t.detach().float() for t in losses]).mean() if last else torch.zeros(())
        mean_loss = mean_loss.reshape(1).to(device)
        if opts.stages > 1:
            dist.broadcast(mean_loss, src=last_rank_of_replica, group=groups.pp)
        loss_value = float(mean_loss.item())
        planted.check_loss(step, loss_value)
        probe.step(step, loss_value, duration_s=time.perf_counter() - t_step)
        print(f"step {step} loss {loss_value:.6f}", flush=True)
        saved = bool(opts.checkpoint_every) and step % opts.checkpoint_every == 0
        if saved:
            planted.before_save(step, params)
            save(step)
        if notice is not None:
            notice.act(probe, step, saved, save)
    return loss_value, named_param_bytes(module) if replica == 0 else []


def _average_gradients(params: list[Any], group: Any, dp: int) -> None:
    """Average the gradients over the stage's replicas: one flat buffer in parameter order, one all-reduce (the
    same sums in the same order on every replica and in every run)."""
    import torch
    import torch.distributed as dist

    if dp == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(dp)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


# ------------------------------------------------------------------------------------------------ under TorchFT


def _main_ft(args: argparse.Namespace, opts: PpLmOptions) -> int:
    """The program under the ``torchft`` adapter (``TORCHFT_LIGHTHOUSE`` set): this process is stage
    ``RANK`` of replica group ``REPLICA_GROUP_ID``, whose torchrun world is the pipeline's stages."""
    env = os.environ
    group, groups = int(env.get(ENV_GROUP, "0")), int(env.get(ENV_GROUPS, "1"))
    stage, stages = int(env["RANK"]), int(env["WORLD_SIZE"])
    if stages != opts.stages:
        raise SystemExit(
            f"pp_lm: a replica group has {stages} ranks, but --stages is {opts.stages}: under torchft "
            "a replica group is one whole pipeline"
        )
    if not 0 <= group < groups:
        raise SystemExit(f"pp_lm: {ENV_GROUP}={group} is outside 0..{groups - 1}")
    probe = Probe(
        env.get(ENV_EVENTS),
        rank=replica_rank(group, stage, stages),
        world_size=groups * stages,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        node=env.get(ENV_NODE, "node0"),
        incarnation=incarnation_from_env(),
    )
    probe.rank_start(
        global_batch=global_batch(groups, opts.microbatches, opts.microbatch_size),
        stage=stage,
        replica=group,
        stages=stages,
        dp=groups,
        replica_group=group,
        group_rank=stage,
        group_world_size=stages,
    )
    try:
        return _train_ft(args, opts, probe, group, groups, stage)
    finally:
        probe.close()


def _attempt_stores(timeout_s: float) -> tuple[Any, Any]:
    """(store for the group's process group, TCPStore for its Managers), both fresh in each worker-group attempt.

    The torchft adapter starts each group with torchrun's static rendezvous, whose store lives as long as the
    agent: after a restart, env:// keys (gloo's peer addresses) and torchft's ``manager_addr`` key still hold
    the dead attempt's values, and a new rank that reads one before its peer rewrites it connects to a dead
    address (seen: group restarts failing with "connection refused" in ``connectFullMesh``). So the group's
    process group rendezvouses under the prefix ``pp_lm/attempt_<TORCHELASTIC_RESTART_COUNT>``, and group rank 0
    serves the Managers a new TCPStore whose port it publishes there."""
    import torch.distributed as dist

    env = os.environ
    addr, rank, world_size = env["MASTER_ADDR"], int(env["RANK"]), int(env["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    hosted_by_agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        addr,
        int(env["MASTER_PORT"]),
        world_size,
        not hosted_by_agent and rank == 0,
        timeout,
        wait_for_workers=False,
    )
    attempt = dist.PrefixStore(f"pp_lm/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
    if rank == 0:
        manager_store = dist.TCPStore(addr, 0, world_size, True, timeout, wait_for_workers=False)
        attempt.set("manager_store_port", str(manager_store.port))
    else:
        port = int(attempt.get("manager_store_port").decode())
        manager_store = dist.TCPStore(addr, port, world_size, False, timeout, wait_for_workers=False)
    return attempt, manager_store


def _sum_slot_passes(
    runner: _StageRunner,
    step: int,
    slots: Iterable[int],
    batch: Callable[[int, int], tuple[Any, Any]],
    numel: int,
) -> Any:
    """This group's share of step ``step`` on this stage: one pipeline pass per replica slot in ``slots`` (its
    batch: ``batch(step, slot)``), from zeroed gradients each. Returns a float64 CPU buffer of ``numel + 1``:
    the sum over the passes of the stage's gradients (flat, in parameter order; ``numel``: their element count),
    then, on the last stage, the sum of each pass's mean loss (else 0). No slots: all zeros."""
    import torch

    params = runner.params
    buf = torch.zeros(numel + 1, dtype=torch.float64)
    for slot in slots:
        x, y = batch(step, slot)
        runner.optimizer.zero_grad(set_to_none=True)
        losses = runner.forward_backward(step, slot, x, y)
        off = 0
        for q in params:
            if q.grad is not None:
                buf[off : off + q.numel()] += q.grad.reshape(-1).double().cpu()
            off += q.numel()
        if runner.last:
            buf[numel] += float(torch.stack([t.detach().double() for t in losses]).mean())
    return buf


def _set_gradients(params: list[Any], flat: Any) -> None:
    """Each parameter's ``.grad`` from ``flat`` (float64, parameters in order, as :func:`_sum_slot_passes`
    lays them out): a float32 copy on the parameter's device."""
    import torch

    off = 0
    for q in params:
        q.grad = flat[off : off + q.numel()].to(torch.float32).view_as(q).to(q.device).clone()
        off += q.numel()


def _train_ft(
    args: argparse.Namespace, opts: PpLmOptions, probe: Probe, group: int, groups: int, stage: int
) -> int:
    """Every step: a synchronous quorum (a group that is behind heals each stage from the same stage of a peer),
    the global batch's replica slots this group computes (participant ``p`` of ``n``: slots ``p, p + n, ...``; one
    pipeline pass each, its gradients added in float64), one fault-tolerant SUM of the stage's gradients and
    loss over the groups through the Manager (this stage's torchft process group pairs it with the same stage of
    every group), the commit vote; a committed step divides by the slots (``groups``) and steps. Ends with the
    digest of the whole model, gathered over the group's stages."""
    import torch
    import torch.distributed as dist
    from torch.distributed import ReduceOp

    log_to_stderr()
    group_store, manager_store = _attempt_stores(opts.pg_timeout_s)
    d = init_distributed("pp_lm", opts.pg_timeout_s, args.backend, deterministic=True, store=group_store)
    runner = _StageRunner(opts, args.seed, stage, d.device, None)
    module, optimizer, scheduler, params = runner.module, runner.optimizer, runner.scheduler, runner.params
    loop = FtLoop(
        probe,
        group,
        {"model": module, "optim": optimizer, "scheduler": scheduler},
        opts.pg_timeout_s,
        healed=f"stage {stage} ",
        store=(os.environ["MASTER_ADDR"], manager_store.port),
    )

    def batch(step: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(mix_seed(args.seed, step, slot))
        rows = opts.microbatches * opts.microbatch_size
        seq = synthetic_tokens(gen, rows, opts.seq_len, opts.vocab).to(d.device)
        return seq[:, :-1], seq[:, 1:]

    numel = sum(q.numel() for q in params)
    planted = Planted(probe)
    loss_value: float | None = None
    while loop.current_step() < opts.steps:
        if (quorum := loop.quorum()) is None:
            continue
        step = quorum.step
        planted.before_step(step)
        t_step = time.perf_counter()
        p, n = quorum.participant, quorum.participants
        slots = replica_slots(p, n, groups) if p is not None else []
        buf = _sum_slot_passes(runner, step, slots, batch, numel)
        if opts.step_sleep_s > 0:
            time.sleep(opts.step_sleep_s)
        t_comm = time.perf_counter()
        loop.manager.allreduce(buf, reduce_op=ReduceOp.SUM).wait()
        buf.div_(groups)
        _set_gradients(params, buf)
        planted.after_backward(step, params)
        if loop.manager.should_commit():
            optimizer.step()
            scheduler.step()
            planted.after_update(step, params)
            # the loss lives on the last stage: the group's stages share it over the group's own process group
            loss_t = buf[numel : numel + 1].to(torch.float32).to(d.device)
            if opts.stages > 1:
                dist.broadcast(loss_t, src=opts.stages - 1)
            loss_value = float(loss_t.item())
            planted.check_loss(step, loss_value)
            loop.committed(
                quorum, loss_value, t_step, global_batch(groups, opts.microbatches, opts.microbatch_size)
            )
        else:
            loop.skipped(quorum, t_step, t_comm)

    gathered: list[Any] = [None] * opts.stages
    dist.all_gather_object(gathered, named_param_bytes(module))
    loop.finish(loss_value, digest_of_stages(gathered))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
