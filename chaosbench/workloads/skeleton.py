"""What every built-in training program shares: its command line from its Options model, the distributed setup,
resuming from the newest complete DCP checkpoint, saving one with the ``COMPLETE`` marker, the rank's RNG state,
the final parameter digest and a clean exit. ``ddp_mlp`` and ``fsdp_lm`` train through it; ``ft_mlp`` (TorchFT,
no checkpoints) shares the command line, the seeds and the digest; ``pp_lm`` (pipeline stages) the command line,
the seeds, the distributed setup and the checkpoint directory's layout and marker.

Checkpoint layout: ``<ckpt-dir>/step_<8-digit step>/`` written by ``dcp.save`` (every rank its share, each rank's
RNG state under its own key ``rng.rank<r>``); after a barrier rank 0 atomically creates ``COMPLETE`` (a JSON with
the step and the world size); a directory without it is never loaded, and is deleted and rewritten if training
reaches that step again. Standard library plus pydantic at import; torch only inside the functions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import time
import types
import typing
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.probe import Probe
from chaosbench.workloads.planted import Planted

CKPT_DIR_PREFIX = "step_"
COMPLETE_MARKER = "COMPLETE"

# ------------------------------------------------------------------------------------------- the command line


class TrainingOptions(BaseModel):
    """The options every checkpointing built-in program has (each is also its ``--option``)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(default=60, ge=1, description="total optimizer steps")
    checkpoint_every: int = Field(default=10, ge=0, description="checkpoint after every K steps (0: never)")
    pg_timeout_s: float = Field(default=1800.0, gt=0, description="torch.distributed process-group timeout")
    step_sleep_s: float = Field(
        default=0.0, ge=0, description="sleep added to each step (emulates slower steps)"
    )
    save_on_sigterm: bool = Field(
        default=False,
        description="on SIGTERM (a preemption notice) every rank saves at the end of the step, then "
        "the noticed ranks die of it",
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def program_option(field: Any) -> bool:
    """Whether an Options field is passed to the training program (``json_schema_extra={"program": False}``:
    the harness alone reads it, e.g. ft-mlp's ``groups``)."""
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get("program") is False)


def options_argv(options: BaseModel) -> list[str]:
    """The program's command-line options from its Options model: ``--name value`` per field (``--flag`` for a
    true bool, nothing for a false one or None). One place for every option: the model."""
    out: list[str] = []
    for name, field in type(options).model_fields.items():
        value = getattr(options, name)
        if not program_option(field) or value is None or value is False:
            continue
        out += [_flag(name)] if value is True else [_flag(name), str(value)]
    return out


def _plain(annotation: Any) -> Any:
    """``int | None`` -> ``int``: the annotation without None."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def add_options(parser: argparse.ArgumentParser, options_model: type[BaseModel]) -> None:
    """One argparse option per program field of ``options_model``: its type, default and description."""
    for name, field in options_model.model_fields.items():
        if not program_option(field):
            continue
        kind = _plain(field.annotation)
        default = field.get_default(call_default_factory=True)
        text = f"{field.description or name} (default: {default})"
        if kind is bool:
            parser.add_argument(_flag(name), action="store_true", help=text)
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(_flag(name), choices=list(typing.get_args(kind)), default=default, help=text)
        else:
            parser.add_argument(_flag(name), type=kind, default=default, help=text)


def build_parser(
    prog: str, description: str, options_model: type[BaseModel], checkpoints: bool = True
) -> argparse.ArgumentParser:
    """The program's parser: its Options, plus what the harness passes for the run (``--seed``, and
    ``--ckpt-dir`` for a checkpointing program) and ``--backend``."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    add_options(p, options_model)
    if checkpoints:
        p.add_argument(
            "--ckpt-dir",
            required=True,
            help="directory of step_<NNNNNNNN>/ checkpoints; the newest complete one is resumed from",
        )
    p.add_argument("--seed", type=int, default=0, help="seed of model init, data and dropout (default: 0)")
    p.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="process-group backend (default: nccl if CUDA is available, else gloo)",
    )
    return p


def parse_args(
    parser: argparse.ArgumentParser, options_model: type[BaseModel], argv: typing.Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse the command line and check the options against the model's bounds (a direct call can pass what the
    harness would refuse): an invalid one exits with the model's message."""
    from pydantic import ValidationError

    args = parser.parse_args(argv)
    fields = [n for n, f in options_model.model_fields.items() if program_option(f)]
    try:
        options_model.model_validate({n: getattr(args, n) for n in fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        # a check of several options together (a model validator) names none of them
        parser.error(f"{_flag(str(err['loc'][0]))}: {err['msg']}" if err["loc"] else str(err["msg"]))
    return args


def workload_argv(module: str, options: BaseModel, seed: int, ckpt_dir: Path | None = None) -> list[str]:
    """How the harness starts one rank of a built-in program."""
    run = ["--seed", str(seed), *(["--ckpt-dir", str(ckpt_dir)] if ckpt_dir is not None else [])]
    return [sys.executable, "-m", module, *options_argv(options), *run]


# ------------------------------------------------------------------------------------------------ seeds, digest


def mix_seed(*parts: int) -> int:
    """A 63-bit seed derived from ``parts``; distinct tuples give unrelated seeds."""
    digest = hashlib.sha256(":".join(str(int(x)) for x in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def params_digest(module: Any) -> str:
    """sha256 over ``name`` and the raw bytes of every *full* parameter, in ``named_parameters`` order.

    Sharded (DTensor) parameters are all-gathered with ``full_tensor()``, a collective: every rank must call this at
    the same point, and every rank gets the same digest whatever the sharding."""
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


# ----------------------------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    """This rank in its process group: rank, world size, local rank, backend and device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()


def init_distributed(
    program: str, pg_timeout_s: float, backend: str | None, deterministic: bool = False, store: Any = None
) -> Dist:
    """Check the env:// variables, pick the device (CUDA with NCCL when present), create the process group.
    ``deterministic``: deterministic CUDA kernels (a bit-identical resume needs them for embeddings and
    attention). ``store``: rendezvous through this c10d store instead of env://'s.

    A process group that already exists is used as it is (its rank, world size, backend and timeout; ``backend``
    and ``pg_timeout_s`` are then not applied): a launcher that runs the program inside its own worker made it
    (Ray Train's TorchTrainer, :mod:`chaosbench.launchers.ray_train`)."""
    import torch
    import torch.distributed as dist

    made = dist.is_available() and dist.is_initialized()
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ and not made:
            raise SystemExit(f"{program}: {var} is not set; launch with torchrun or set the env:// variables")
    torch.set_num_threads(1)
    rank = dist.get_rank() if made else int(os.environ["RANK"])
    world_size = dist.get_world_size() if made else int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = (
        str(dist.get_backend()) if made else backend or ("nccl" if torch.cuda.is_available() else "gloo")
    )
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if deterministic:
            # cuBLAS needs a fixed workspace for deterministic kernels, set before its first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
    else:
        device = torch.device("cpu")
    if not made:
        via = {} if store is None else {"store": store, "rank": rank, "world_size": world_size}
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=pg_timeout_s), **via)
    return Dist(rank, world_size, local_rank, backend, device)


class PreemptionNotice:
    """SIGTERM as a preemption notice (``save_on_sigterm``): the handler only notes it; at the end of each step the
    ranks agree (an allreduce of the flag, so all save at the same step), all save, and the noticed ranks then die
    of the SIGTERM they got (their peers find them gone at their next collective, as in a preemption)."""

    def __init__(self, group: Any = None) -> None:
        self.noticed = False
        #: The ranks that agree (a process group; None: all of them).
        self.group = group
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.noticed = True

    def agreed(self) -> bool:
        """Whether any rank has had a notice (a collective: every rank calls it at the same step)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.noticed else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item() > 0)

    def act(self, probe: Probe, step: int, saved: bool, save: Callable[[int], None]) -> None:
        """The step's end: save if any rank had a notice (unless this step was just saved), then die of it here."""
        if not self.agreed():
            return
        probe.emit("preempt_save", step=step, noticed=self.noticed, saved_already=saved)
        if not saved:
            save(step)
        print(f"preemption notice: saved step {step}", flush=True)
        if self.noticed:
            sys.stdout.flush()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()


def train_steps(
    probe: Probe,
    steps: range,
    batch: Callable[[int], tuple[Any, Any]],
    loss_of: Callable[[Any, Any], Any],
    optimizer: Any,
    scheduler: Any,
    params: Callable[[], list[Any]],
    step_sleep_s: float,
    checkpoint_every: int,
    save: Callable[[int], None],
    save_on_sigterm: bool = False,
    planted: Planted | None = None,
    desync: Callable[[str], AbstractContextManager[None]] | None = None,
) -> float | None:
    """The training loop every built-in program shares: for each (1-based) step of ``steps`` the planted faults'
    hooks (:class:`~chaosbench.workloads.planted.Planted`, ``planted`` or one of its own) around forward/backward
    (where a planted collective desync is due, inside ``desync(kind)``: the workload's change to the step's
    gradient collective, see :meth:`~chaosbench.workloads.planted.Planted.sync_fault`), the emulated extra compute
    (``step_sleep_s``, before the update), the optimizer and scheduler steps, the ``step`` event and line, a
    checkpoint every ``checkpoint_every`` steps and, with ``save_on_sigterm``, one when a rank got a preemption
    notice (:class:`PreemptionNotice`). ``params`` gives this rank's (local) parameter tensors. Returns the last
    step's loss (None when no step ran)."""
    loss_value: float | None = None
    planted = planted or Planted(probe)
    notice = PreemptionNotice() if save_on_sigterm else None
    for step in steps:
        planted.before_step(step)
        t_step = time.perf_counter()
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=True)
        kind = planted.sync_fault(step)
        if kind is not None and desync is None:
            raise RuntimeError(
                f"planted collective desync '{kind}': this program cannot change its collectives"
            )
        with desync(kind) if desync is not None and kind is not None else nullcontext():
            loss = loss_of(x, y)
            loss.backward()
        planted.after_backward(step, params())
        if step_sleep_s > 0:
            time.sleep(step_sleep_s)
        optimizer.step()
        scheduler.step()
        planted.after_update(step, params())
        loss_value = float(loss.item())
        planted.check_loss(step, loss_value)
        probe.step(step, loss_value, duration_s=time.perf_counter() - t_step)
        print(f"step {step} loss {loss_value:.6f}", flush=True)
        saved = bool(checkpoint_every) and step % checkpoint_every == 0
        if saved:
            planted.before_save(step, params())
            save(step)
        if notice is not None:
            notice.act(probe, step, saved, save)
    return loss_value


def end_training(probe: Probe, model: Any, steps: int, start_step: int, loss: float | None) -> None:
    """Training is over: the final step, loss and parameter digest as ``train_end`` (and printed), then the process
    group goes."""
    import torch.distributed as dist

    digest = params_digest(model)
    probe.train_end(max(steps, start_step), loss, digest)
    print(f"final digest {digest}", flush=True)
    dist.destroy_process_group()


def exit_without_finalizing(code: int) -> None:
    """Flush and leave with ``os._exit``, skipping interpreter finalization.

    Collectives on gloo are async works whose last reference a gloo worker thread may drop a moment after the main
    thread has moved on; dropping it decrefs Python-owned tensors, which needs the GIL. If that happens while the
    interpreter is finalizing, the worker is force-unwound inside a noexcept destructor and the process dies with
    SIGABRT ("terminate called without an active exception") after a successful run (FSDP2: about 1 run in 15 on
    a loaded 2-core machine), or hangs (a DDP rank once stayed alive 140 s after its train_end). Everything a
    program writes is flushed and closed by then (the probe is closed in ``main``, the process group
    destroyed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ----------------------------------------------------------------------------------------------- checkpoints


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


class CheckpointBridge(Protocol):
    """A launcher that keeps the run's checkpoints itself and decides which one a restart resumes from (Ray
    Train: ``ray.train.report`` and ``ray.train.get_checkpoint``, :mod:`chaosbench.launchers.ray_train`),
    installed in the rank's process with :func:`use_checkpoint_bridge` before the program's ``main`` runs.

    ``saved(step, path)``: every rank, once the checkpoint of ``step`` at ``path`` is complete (inside the save's
    ``ckpt_save`` bracket, so its cost counts); ``restore_from()``: rank 0, at start: the checkpoint directory to
    resume from (one this program wrote), or None to start from scratch."""

    def saved(self, step: int, path: Path) -> None: ...

    def restore_from(self) -> Path | None: ...


#: The checkpoint bridge of this process (None: the program picks the newest complete checkpoint itself).
_bridge: CheckpointBridge | None = None


def use_checkpoint_bridge(bridge: CheckpointBridge | None) -> None:
    """Make ``bridge`` the launcher that keeps this process's checkpoints (None: none): read by every
    :class:`Checkpoints` made afterwards."""
    global _bridge
    _bridge = bridge


def marked_step(path: Path) -> int:
    """The step of the checkpoint directory ``path``: its ``COMPLETE`` marker's, else its name's
    (``step_00000020``). Raises RuntimeError naming ``path`` when it has neither."""
    try:
        return int(json.loads((path / COMPLETE_MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if path.name.startswith(CKPT_DIR_PREFIX) and path.name[len(CKPT_DIR_PREFIX) :].isdigit():
        return int(path.name[len(CKPT_DIR_PREFIX) :])
    raise RuntimeError(
        f"checkpoint {path}: no {COMPLETE_MARKER} marker with its step, and no step in its name"
    )


class Checkpoints:
    """Saving and resuming the full resumable state of a program with DCP.

    ``state(step)`` builds the state dict to save or to load into (model and optimizer state dicts, scheduler,
    progress ``{"step", "data_position"}`` and this rank's RNG state under :attr:`rng_key`); ``apply(state)``
    puts a loaded one back into the model, optimizer and scheduler."""

    def __init__(
        self,
        ckpt_dir: str,
        probe: Probe,
        dist: Dist,
        state: Callable[[int], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
        skip_on_load: tuple[str, ...] = (),
    ) -> None:
        self.ckpt_dir = ckpt_dir
        self.probe = probe
        self.dist = dist
        self.state = state
        self.apply = apply
        self.rng_key = f"rng.rank{dist.rank}"
        #: Keys of ``state`` saved but neither read nor applied on resume (a planted bug: ``("optim",)``).
        self.skip_on_load = skip_on_load
        #: The launcher that keeps the checkpoints (:class:`CheckpointBridge`), when one runs this program.
        self.bridge = _bridge

    @classmethod
    def for_training(
        cls,
        ckpt_dir: str,
        probe: Probe,
        dist: Dist,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        restore_optimizer: bool = True,
    ) -> Checkpoints:
        """The full resumable state of a model trained with ``optimizer`` and ``scheduler``: their (possibly
        sharded: FSDP2's DTensors, each rank its slice) state dicts, the progress (the data position is the step
        index) and this rank's RNG state under its own key (or DCP would keep one rank's copy of a "replicated"
        value). ``restore_optimizer=False``: the planted ``forget-optimizer`` bug (the optimizer's state is
        saved but not loaded on resume: a resumed run starts with zero momentum and the optimizer's initial
        learning rate, the scheduler's step count restored). Not loading is what forgets it: ``dcp.load`` fills
        the optimizer's own tensors in place, so loading and not applying would still restore its momentum."""
        from torch.distributed.checkpoint.state_dict import (
            get_state_dict,
            set_model_state_dict,
            set_state_dict,
        )

        def state(step: int) -> dict[str, Any]:
            msd, osd = get_state_dict(model, optimizer)
            return {
                "model": msd,
                "optim": osd,
                "scheduler": scheduler.state_dict(),
                "progress": {"step": step, "data_position": step},
                ckpts.rng_key: ckpts.rng_state(),
            }

        def apply(loaded: dict[str, Any]) -> None:
            if "optim" in loaded:
                set_state_dict(
                    model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
                )
            else:
                set_model_state_dict(model, loaded["model"])
            scheduler.load_state_dict(loaded["scheduler"])

        ckpts = cls(ckpt_dir, probe, dist, state, apply, skip_on_load=() if restore_optimizer else ("optim",))
        return ckpts

    def rng_state(self) -> dict[str, Any]:
        import torch

        state = {"cpu": torch.get_rng_state()}
        if self.dist.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.dist.device)
        return state

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        import torch

        torch.set_rng_state(state["cpu"])
        if self.dist.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.dist.device)

    def save(self, step: int, marker_first: bool = False) -> None:
        """Every rank writes its share of step ``step``'s checkpoint; rank 0 marks it complete once all have.
        ``marker_first``: the planted ``non-atomic-ckpt`` bug (the marker before the shards)."""
        import torch.distributed.checkpoint as dcp

        path = ckpt_path(self.ckpt_dir, step)
        d = self.dist
        marker = {"step": step, "world_size": d.world_size}
        with self.probe.ckpt_save(step, str(path)) as info:
            if d.rank == 0:
                # A directory left by an interrupted save must not be reused: dcp.save would write new shards
                # beside stale ones. Drop the marker first so a crash mid-delete never leaves COMPLETE behind.
                if path.exists():
                    (path / COMPLETE_MARKER).unlink(missing_ok=True)
                    shutil.rmtree(path)
                path.mkdir(parents=True)
            d.barrier()
            if marker_first and d.rank == 0:
                mark_complete(path, {**marker, "t_ns": time.time_ns()})
            dcp.save(self.state(step), checkpoint_id=str(path))
            d.barrier()
            if d.rank == 0 and not marker_first:
                mark_complete(path, {**marker, "t_ns": time.time_ns()})
            d.barrier()
            info["complete"] = True
            if self.bridge is not None:
                self.bridge.saved(step, path)

    def resume(self, seed: int, fallback: bool = False, restore_rng: bool = True) -> tuple[int, Path | None]:
        """Load the newest complete checkpoint (``fallback``: on any rank's failure, the next older one; a
        ``ckpt_load_failed`` event says why), or under a launcher's :class:`CheckpointBridge` the one it names
        (and no other), and return (its data position, its path); (0, None) without one.
        A checkpoint written at another world size loads too; a rank that had no RNG key in it reseeds from
        ``(seed, 0x64726F70, rank, step)``. ``restore_rng=False``: the planted ``forget-rng`` bug."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        d = self.dist
        box: list[Any] = [None]
        if d.rank == 0:
            if self.bridge is not None:  # the launcher decides: its one checkpoint, or none
                source = self.bridge.restore_from()
                box[0] = [] if source is None else [(marked_step(source), str(source))]
            else:
                candidates = complete_steps(self.ckpt_dir)
                box[0] = [
                    (s, str(ckpt_path(self.ckpt_dir, s)))
                    for s in (candidates if fallback else candidates[:1])
                ]
        dist.broadcast_object_list(box, src=0)
        tried: list[tuple[int, str]] = box[0]
        for step, where in tried:
            path = Path(where)
            error: str | None = None
            position = 0
            try:
                with self.probe.ckpt_load(step, str(path)):
                    state = self.state(step)
                    for key in self.skip_on_load:
                        del state[key]
                    written_by = saved_world_size(path)
                    has_rng = written_by is None or d.rank < written_by
                    if not has_rng:  # this rank did not exist when it was written: no RNG key of its own
                        del state[self.rng_key]
                    dcp.load(state, checkpoint_id=str(path))
                    self.apply(state)
                    if not has_rng:
                        torch.manual_seed(mix_seed(seed, 0x64726F70, d.rank, step))
                    elif restore_rng:
                        self._set_rng_state(state[self.rng_key])
                    position = int(state["progress"]["data_position"])
                    if int(state["progress"]["step"]) != step:
                        raise RuntimeError(
                            f"checkpoint {path} holds step {state['progress']['step']}, not {step}"
                        )
            # CheckpointException (dcp.load's wrapper of every rank's errors) is a BaseException, not an Exception.
            except (Exception, CheckpointException) as exc:
                if not fallback:
                    raise
                error = f"{type(exc).__name__}: {exc}"
            if fallback:
                # All ranks must agree: a load can fail on one rank only. A later load overwrites every key.
                failed = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=d.device)
                dist.all_reduce(failed, op=dist.ReduceOp.MAX)
                if int(failed.item()):
                    why = (error or "failed on another rank")[:2000]
                    self.probe.emit("ckpt_load_failed", step=step, path=str(path), error=why)
                    print(f"checkpoint {path} failed to load: {why}; trying an older one", flush=True)
                    continue
            written_by = saved_world_size(path)
            resized = (
                f" (written at world size {written_by})" if written_by not in (None, d.world_size) else ""
            )
            print(f"resumed from {path} at step {position}{resized}", flush=True)
            return position, path
        if tried:
            raise RuntimeError(
                f"no checkpoint in {self.ckpt_dir} could be loaded (tried steps {[s for s, _ in tried]})"
            )
        return 0, None
