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
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from chaosbench.probe import Probe
from chaosbench.workloads.planted import Planted

#: Width of the synthetic input and of the regression target.
IN_FEATURES = 64
OUT_FEATURES = 16
DROPOUT_P = 0.1
MOMENTUM = 0.9
#: StepLR: the learning rate is multiplied by ``LR_GAMMA`` every ``LR_STEP_SIZE`` steps.
LR_STEP_SIZE = 20
LR_GAMMA = 0.5
CKPT_DIR_PREFIX = "step_"
COMPLETE_MARKER = "COMPLETE"
#: Checkpoints load at another world size than the one that wrote them (see the module docstring).
RESUMES_ACROSS_WORLD_SIZES = True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaosbench.workloads.ddp_mlp",
        description="Deterministic DDP training of an MLP on synthetic data, with resumable DCP checkpoints.",
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
    p.add_argument("--hidden", type=int, default=256, help="hidden width of the MLP (default: 256)")
    p.add_argument("--layers", type=int, default=3, help="number of hidden layers (default: 3)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size per rank (default: 32)")
    p.add_argument("--lr", type=float, default=0.01, help="initial learning rate of SGD (default: 0.01)")
    p.add_argument(
        "--step-sleep-s",
        type=float,
        default=0.0,
        help="seconds of sleep inside each step (counted in its duration), to emulate a slower step (default: 0)",
    )
    p.add_argument(
        "--bug",
        choices=list(BUGS),
        default=None,
        help="plant a recovery bug, to prove a gate catches it: " + "; ".join(f"{k}: {v}" for k, v in BUGS.items()),
    )
    p.add_argument(
        "--load-fallback",
        action="store_true",
        help="when a checkpoint fails to load, try the next older complete one (default: fail)",
    )
    p.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="process-group backend (default: nccl if CUDA is available, else gloo)",
    )
    return p


def mix_seed(*parts: int) -> int:
    """A 63-bit seed derived from ``parts``; distinct tuples give unrelated seeds."""
    digest = hashlib.sha256(":".join(str(int(x)) for x in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def ckpt_path(ckpt_dir: str | os.PathLike[str], step: int) -> Path:
    """Directory of the checkpoint taken after ``step``: ``<ckpt_dir>/step_00000020``."""
    return Path(ckpt_dir) / f"{CKPT_DIR_PREFIX}{step:08d}"


def complete_steps(ckpt_dir: str | os.PathLike[str]) -> list[int]:
    """Steps of the checkpoints in ``ckpt_dir`` that have a ``COMPLETE`` marker, newest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        name = child.name
        if not name.startswith(CKPT_DIR_PREFIX):
            continue
        try:
            step = int(name[len(CKPT_DIR_PREFIX) :])
        except ValueError:
            continue
        if (child / COMPLETE_MARKER).is_file():
            steps.append(step)
    return sorted(steps, reverse=True)


def find_latest_complete(ckpt_dir: str | os.PathLike[str]) -> int | None:
    """Step of the newest checkpoint in ``ckpt_dir`` that has a ``COMPLETE`` marker, or None."""
    steps = complete_steps(ckpt_dir)
    return steps[0] if steps else None


#: Planted recovery bugs (``--bug``): each breaks resumption in a way a recovery regression gate must catch.
BUGS = {
    "forget-rng": "the RNG state is not restored on resume (dropout masks differ afterwards)",
    "forget-data-position": "the data position restarts at the first batch on resume",
    "non-atomic-ckpt": "COMPLETE is written before the shards, so a torn save looks complete",
}


def saved_world_size(path: Path) -> int | None:
    """World size recorded in a checkpoint's ``COMPLETE`` marker (None: not recorded or unreadable)."""
    try:
        return int(json.loads((path / COMPLETE_MARKER).read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mark_complete(path: Path, payload: dict[str, Any]) -> None:
    """Atomically create ``path/COMPLETE`` (temp file, fsync, rename, fsync of the directory)."""
    tmp = path / f".{COMPLETE_MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / COMPLETE_MARKER)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    probe = Probe.from_env()
    probe.rank_start(global_batch=probe.world_size * args.batch_size)
    try:
        return _train(args, probe)
    finally:
        probe.close()


def _train(args: argparse.Namespace, probe: Probe) -> int:
    # Heavy imports after rank_start so the harness sees the pid before torch's import time.
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise SystemExit(f"ddp_mlp: {var} is not set; launch with torchrun or set the env:// variables")
    if args.steps < 0 or args.checkpoint_every < 0:
        raise SystemExit("ddp_mlp: --steps and --checkpoint-every must be >= 0")

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    dist.init_process_group(backend=backend, timeout=timedelta(seconds=args.pg_timeout_s))

    def barrier() -> None:
        if backend == "nccl":
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

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

    model = DDP(net, device_ids=[local_rank] if backend == "nccl" else None)
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

    rng_key = f"rng.rank{rank}"

    def rng_state() -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(device)
        return state

    def resumable_state(step: int) -> dict[str, Any]:
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
    data_base = 0  # batch index = step - data_base (0 unless the forget-data-position bug is planted)
    box: list[Any] = [None]
    if rank == 0:
        candidates = complete_steps(args.ckpt_dir)
        box[0] = candidates if args.load_fallback else candidates[:1]
    dist.broadcast_object_list(box, src=0)
    tried: list[int] = box[0]
    for resume_step in tried:
        path = ckpt_path(args.ckpt_dir, resume_step)
        error: str | None = None
        try:
            with probe.ckpt_load(resume_step, str(path)):
                state = resumable_state(resume_step)
                written_by = saved_world_size(path)
                has_rng = written_by is None or rank < written_by
                if not has_rng:  # this rank did not exist when it was written: no RNG key of its own
                    del state[rng_key]
                dcp.load(state, checkpoint_id=str(path))
                set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
                scheduler.load_state_dict(state["scheduler"])
                if not has_rng:
                    torch.manual_seed(mix_seed(args.seed, 0x64726F70, rank, resume_step))
                elif args.bug != "forget-rng":
                    torch.set_rng_state(state[rng_key]["cpu"])
                    if device.type == "cuda":
                        torch.cuda.set_rng_state(state[rng_key]["cuda"], device)
                start_step = int(state["progress"]["data_position"])
                if args.bug == "forget-data-position":
                    data_base = start_step
                if int(state["progress"]["step"]) != resume_step:
                    raise RuntimeError(
                        f"checkpoint {path} holds step {state['progress']['step']}, not {resume_step}"
                    )
        # CheckpointException (dcp.load's wrapper of every rank's errors) is a BaseException, not an Exception.
        except (Exception, CheckpointException) as exc:
            if not args.load_fallback:
                raise
            error = f"{type(exc).__name__}: {exc}"
        if args.load_fallback:
            # All ranks must agree: a load can fail on one rank only. A later load overwrites every key.
            failed = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=device)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if int(failed.item()):
                why = (error or "failed on another rank")[:2000]
                probe.emit("ckpt_load_failed", step=resume_step, path=str(path), error=why)
                print(f"checkpoint {path} failed to load: {why}; trying an older one", flush=True)
                start_step = 0
                continue
        written_by = saved_world_size(path)
        resized = f" (written at world size {written_by})" if written_by not in (None, world_size) else ""
        print(f"resumed from {path} at step {start_step}{resized}", flush=True)
        break
    else:
        if tried:
            raise RuntimeError(f"no checkpoint in {args.ckpt_dir} could be loaded (tried steps {tried})")

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
            if args.bug == "non-atomic-ckpt" and rank == 0:
                mark_complete(path, {"step": step, "world_size": world_size, "t_ns": time.time_ns()})
            dcp.save(resumable_state(step), checkpoint_id=str(path))
            barrier()
            if rank == 0 and args.bug != "non-atomic-ckpt":
                mark_complete(path, {"step": step, "world_size": world_size, "t_ns": time.time_ns()})
            barrier()
            info["complete"] = True

    # ---- train ----------------------------------------------------------------------------------------
    loss_fn = nn.MSELoss()
    model.train()
    loss_value: float | None = None
    planted = Planted(probe)
    for step in range(start_step + 1, args.steps + 1):
        planted.before_step(step)
        t_step = time.perf_counter()
        x, y = batch(step - data_base)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        planted.after_backward(step, net.parameters())
        if args.step_sleep_s > 0:  # emulated extra compute: part of the step, before the optimizer update
            time.sleep(args.step_sleep_s)
        optimizer.step()
        scheduler.step()
        planted.after_update(step, net.parameters())
        loss_value = float(loss.item())
        planted.check_loss(step, loss_value)
        probe.step(step, loss_value, duration_s=time.perf_counter() - t_step)
        print(f"step {step} loss {loss_value:.6f}", flush=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)

    digest = params_digest(net)
    probe.train_end(max(args.steps, start_step), loss_value, digest)
    print(f"final digest {digest}", flush=True)
    dist.destroy_process_group()
    return 0


def params_digest(module: Any) -> str:
    """sha256 over ``name`` and the raw bytes of every parameter, in ``named_parameters`` order."""
    import torch

    h = hashlib.sha256()
    for name, param in module.named_parameters():
        h.update(name.encode())
        h.update(param.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
