"""``corrupt-checkpoint``: damage a checkpoint on disk, knowing its format, or tear one while it is written.

Modes (``params.mode``):

- ``bitflip``: flip ``bits`` random bits inside the *tensor payload* bytes of each target rank's DCP shard
  (``__<rank>_<n>.distcp``), or of a torch.save file; never in zip headers or pickles (see
  :mod:`chaosbench.injectors.corrupt_checkpoint.formats`). torch 2.13 checks no checksums on load, so this loads silently.
- ``truncate``: cut each target rank's shard file to ``truncate_fraction`` of its size.
- ``delete-shard``: remove each target rank's shard file (or the torch.save file).
- ``delete-metadata`` / ``garble-metadata``: remove the DCP ``.metadata``, or overwrite it with random bytes of
  the same length (rank-independent: every rank reads it).
- ``zero-optimizer``, ``drop-optimizer``, ``rewind-rng``, ``reset-data-position``, ``mixed-step``: damaged
  training state that loads without error (the optimizer's memory zeroed or gone, the target ranks' RNG state or
  shards from an older checkpoint, the data position back at 0); see
  :mod:`chaosbench.injectors.corrupt_checkpoint.state`.
- ``torn-write``: SIGKILL each target rank's process while it writes a checkpoint. Use it with
  ``trigger: {on_event: {kind: ckpt_save_begin}}`` (optionally ``step`` and a small ``delay_s`` to land inside
  ``dcp.save``); it is skipped when no save is in progress on the target rank.

The checkpoint is chosen when the fault fires: ``newest``, ``newest-complete`` (default) or a step number. Note
that a checkpoint written after step ``K`` is complete only some time after the ``step K`` event: a fault at
``at_step: K`` with ``newest-complete`` hits the previous one.

Corruption on its own restarts nothing; ``kill_after: true`` SIGKILLs the target ranks right after the damage
(stopped with SIGSTOP while it is done, so that a short job cannot train to its end in the meantime), so the
framework must restore, and the run shows what it does with a damaged checkpoint (see
:func:`chaosbench.analysis.checkpoint_outcome.classify_checkpoint_outcome`).

Corruption is permanent damage by design: it is never reverted (``revert`` returns False), as on a real
disk. Everything the injector changed is in the ``fault_inject`` event's details.
"""

from __future__ import annotations

import fnmatch
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench.errors import ChaosbenchError, TargetNotFound, Unsupported
from chaosbench.injectors.base import FaultContext, Injector, ResolvedTarget, RunSetup, effect_of
from chaosbench.injectors.corrupt_checkpoint import formats as cf
from chaosbench.injectors.corrupt_checkpoint import state as damage
from chaosbench.timeline.schema import FailureMode
from chaosbench.waiting import wait_until

if TYPE_CHECKING:
    from chaosbench.specs import Target, Trigger

Mode = Literal[
    "bitflip",
    "truncate",
    "delete-shard",
    "delete-metadata",
    "garble-metadata",
    "torn-write",
    "zero-optimizer",
    "drop-optimizer",
    "rewind-rng",
    "reset-data-position",
    "mixed-step",
]
METADATA_MODES = ("delete-metadata", "garble-metadata")


#: How far a file's modification time may lag the clock that stamped an event: the kernel stamps files from its
#: coarse clock, up to one scheduler tick (4 ms at HZ=250) behind.
MTIME_LAG_NS = 10_000_000


class SaveInProgress(NamedTuple):
    """The checkpoint save a torn write kills: its step and path (its ``ckpt_save_begin``'s) and the earliest
    rank's begin of that step (ns)."""

    step: int | None
    path: str | None
    begun_ns: int


def _whole_at_kill(d: Path, begun_ns: int) -> bool:
    """Whether the DCP save into ``d``, begun at ``begun_ns``, had finished when the kill landed: its coordinator
    writes ``.metadata`` (a temporary file, renamed) only after every rank's shards were written and gathered,
    so a ``.metadata`` written since the save began means that the target had written its part. A workload's
    own marker says nothing of the kind (a non-atomic save writes it first), and a ``.metadata`` older than the
    save is an earlier save's, into the same directory."""
    try:
        return (d / cf.METADATA_FILE).stat().st_mtime_ns >= begun_ns - MTIME_LAG_NS
    except OSError:
        return False


class CorruptParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Mode = Field(default="bitflip", description="what to do to the checkpoint (see the module docs)")
    bits: int = Field(default=8, ge=1, description="bits flipped per target rank (bitflip only)")
    truncate_fraction: float = Field(
        default=0.5, ge=0, lt=1, description="fraction of the file kept (truncate only)"
    )
    checkpoint: Literal["newest", "newest-complete"] | int = Field(
        default="newest-complete", description="which checkpoint: newest, newest-complete or a step number"
    )
    file_glob: str | None = Field(
        default=None,
        description="plain torch.save checkpoints: files under the checkpoint directory matching this glob "
        "(e.g. '*.pt'; '{rank}' is replaced by the target rank); unset: DCP checkpoint directories",
    )
    tensors: str | None = Field(
        default=None,
        description="bitflip only: flip bits only in tensors whose name matches this glob (e.g. 'model.*')",
    )
    kill_after: bool = Field(
        default=False, description="SIGKILL the target ranks right after the damage, forcing a restore"
    )
    torn_at: Literal["begin", "shard-write"] = Field(
        default="begin",
        description="torn-write only: kill as soon as the trigger fires (begin), or once the target rank's "
        "shard file has appeared in the checkpoint being written (shard-write: the shards are surely torn)",
    )

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _step(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().isdigit():
            return int(v)
        if isinstance(v, str) and v not in ("newest", "newest-complete"):
            raise ValueError(f"give newest, newest-complete or a step number (got {v!r})")
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            raise ValueError("a checkpoint step must be >= 0")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> CorruptParams:
        given = self.model_fields_set
        only = {
            "bits": ("bitflip",),
            "tensors": ("bitflip",),
            "truncate_fraction": ("truncate",),
            "torn_at": ("torn-write",),
        }
        for key, modes in only.items():
            if key in given and self.mode not in modes:
                raise ValueError(f"{key} applies to mode {modes[0]} only (mode is {self.mode})")
        if self.mode == "torn-write":
            for key in ("checkpoint", "file_glob", "kill_after"):
                if key in given:
                    raise ValueError(f"{key} does not apply to mode torn-write (it kills the rank mid-save)")
        if self.file_glob is not None and self.mode in METADATA_MODES:
            raise ValueError(f"mode {self.mode} needs a DCP checkpoint; torch.save files have no .metadata")
        return self


class CorruptCheckpointInjector(Injector[CorruptParams]):
    """Damages a checkpoint on disk (bit flips in tensor data, truncation, deletion of a shard or of the DCP
    metadata) or kills a rank in the middle of a checkpoint save. Not reverted: permanent damage."""

    name: ClassVar[str] = "corrupt-checkpoint"

    @property
    def failure_mode(self) -> FailureMode | None:
        return "crash" if self.params.mode == "torn-write" else None

    damages_checkpoint = True
    summary: ClassVar[str] = (
        "corrupt a checkpoint on disk (bitflip in tensor data, truncate, delete shard/metadata, garble "
        "metadata) or kill a rank mid-save (torn-write)"
    )
    needs_process: ClassVar[bool] = False

    @classmethod
    def check_target(cls, target: Target, trigger: Trigger | None) -> str | None:
        """Every target kind works: damage modes need only rank numbers (``node`` targets expand to that
        node's ranks, ``all`` to every rank); torn-write needs the rank's process, which it looks up when it
        fires (no process: the firing is skipped). Mode-specific checks are in :class:`CorruptParams`,
        since this hook does not see the parameters."""
        return None

    def prepare(self, setup: RunSetup) -> None:
        """Import torch's DCP reader now when a firing will need it: imported at fire time it takes seconds
        on a busy machine, long enough for training to run past the checkpoint the fault is aimed at."""
        p = self.params
        if p.mode in ("bitflip", *damage.STATE_MODES) and p.file_glob is None:
            import torch.distributed.checkpoint  # noqa: F401
            import torch.distributed.checkpoint.format_utils  # noqa: F401

    # ------------------------------------------------------------------ inject
    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        p = self.params
        if p.mode == "torn-write":
            return self._torn_write(ctx)
        # kill_after: the target ranks stopped (SIGSTOP) while the checkpoint is rewritten, so that they cannot
        # train to the end before the kill lands (reading and rewriting a DCP checkpoint took 0.5 s on a busy
        # 2-core machine, longer than the last steps of a short job); the SIGKILL ends them stopped
        stopped = self._signal(ctx.targets, ctx, signal.SIGSTOP) if p.kill_after else []
        try:
            if p.mode in damage.STATE_MODES:
                details = self._damage_state(ctx)
            elif p.file_glob is not None:
                details = self._corrupt_files(ctx, p.file_glob)
            else:
                details = self._corrupt_dcp(ctx)
        except (cf.CheckpointFormatError, ValueError) as exc:
            self._signal(ctx.targets, ctx, signal.SIGCONT)  # the firing is skipped: nothing was damaged
            raise TargetNotFound("checkpoint", str(exc), message=str(exc)) from None
        except BaseException:
            self._signal(ctx.targets, ctx, signal.SIGCONT)
            raise
        details["mode"] = p.mode
        if p.kill_after:
            details["stopped"] = stopped
            details["killed"] = self._signal(ctx.targets, ctx, signal.SIGKILL)
        return details

    def _older(self, root: Path, file_glob: str | None, than: cf.Checkpoint) -> cf.Checkpoint:
        """The newest complete checkpoint before ``than`` (for rewind-rng and mixed-step)."""
        older = [
            c
            for c in cf.list_checkpoints(root, file_glob)
            if c.complete and c.step is not None and than.step is not None and c.step < than.step
        ]
        if not older:
            raise TargetNotFound(
                str(root),
                f"no complete checkpoint older than {than.path.name} to take state from",
                message=f"no complete checkpoint older than {than.path.name} in {root} to take state from",
            )
        return older[-1]

    def _damage_state(self, ctx: FaultContext) -> dict[str, Any]:
        """The state modes (:mod:`~chaosbench.injectors.corrupt_checkpoint.state`), on the chosen checkpoint of
        each target rank's file (a per-rank ``file_glob``) or on the one checkpoint (DCP, a shared file)."""
        p = self.params
        root, glob = ctx.setup.ckpt_dir, p.file_glob
        ranks = sorted({t.rank for t in ctx.targets if t.rank is not None})
        per_rank = glob is not None and "{rank}" in glob
        globs: list[str | None] = (
            [glob.replace("{rank}", str(r)) for r in ranks] if glob and per_rank else [glob]
        )
        changes: list[dict[str, Any]] = []
        chosen = [self._select(root, g) for g in globs]
        for g, ck in zip(globs, chosen, strict=True):
            rec: dict[str, Any] = {"checkpoint": str(ck.path)}
            if p.mode == "mixed-step":
                older = self._older(root, g, ck)
                if ck.kind == "dcp":
                    files = [f for r in ranks for f in cf.shard_files(ck.path, r)]
                    if not files:
                        raise TargetNotFound(str(ck.path), f"no shard file of ranks {ranks}")
                elif per_rank:
                    files = [ck.path]
                else:
                    raise Unsupported(
                        "mixed-step on torch.save files needs one file per rank: a file_glob with {rank}"
                    )
                rec.update(
                    older=str(older.path),
                    older_step=older.step,
                    files=damage.swap_from_older(files, older.path),
                )
            else:
                sd = damage.load_whole(ck)
                if p.mode == "rewind-rng":
                    older = self._older(root, g, ck)
                    keys = damage.rewind_rng(sd, damage.load_whole(older), None if per_rank else ranks)
                    rec.update(older=str(older.path), older_step=older.step)
                else:
                    keys = {
                        "zero-optimizer": damage.zero_optimizer,
                        "drop-optimizer": damage.drop_optimizer,
                        "reset-data-position": damage.reset_data_position,
                    }[p.mode](sd)
                if not keys:
                    what = {
                        "rewind-rng": "RNG state (of the target ranks) also in the older checkpoint",
                        "reset-data-position": "data-position entry",
                    }.get(p.mode, "optimizer state")
                    raise TargetNotFound(
                        str(ck.path), f"no {what} found to damage (keys: {', '.join(map(str, sd))})"
                    )
                rec.update(keys=keys, files=damage.write_whole(ck, sd))
            changes.append(rec)
        return {
            "checkpoint": str(chosen[0].path) if len(chosen) == 1 else [str(c.path) for c in chosen],
            "step": chosen[0].step,
            "complete": all(c.complete for c in chosen),
            "format": chosen[0].kind,
            "changes": changes,
        }

    def _select(self, root: Path, file_glob: str | None) -> cf.Checkpoint:
        which = self.params.checkpoint
        found = cf.list_checkpoints(root, file_glob)
        ck = cf.select_checkpoint(found, which)
        if ck is None:
            what = f"files matching {file_glob!r}" if file_glob else "DCP checkpoints"
            seen = ", ".join(f"{c.path.name}{'' if c.complete else ' (incomplete)'}" for c in found) or "none"
            raise TargetNotFound(
                str(root),
                f"no checkpoint matches {which!r} among the {what} (found: {seen})",
                message=f"no checkpoint matches {which!r} among the {what} in {root} (found: {seen})",
            )
        return ck

    def _corrupt_dcp(self, ctx: FaultContext) -> dict[str, Any]:
        p = self.params
        ck = self._select(ctx.setup.ckpt_dir, None)
        out: dict[str, Any] = {
            "checkpoint": str(ck.path),
            "step": ck.step,
            "complete": ck.complete,
            "format": "dcp",
        }
        if p.mode in METADATA_MODES:
            md = ck.path / cf.METADATA_FILE
            if not md.is_file():
                raise TargetNotFound(str(ck.path), f"no {cf.METADATA_FILE} to {p.mode.split('-')[0]}")
            out["files"] = [self._damage(md, None, None, ctx)]
            return out
        # Find every target's files (and payload ranges) before touching anything: all or nothing.
        plan = []
        for t in ctx.targets:
            shards = cf.shard_files(ck.path, t.rank)
            if not shards:
                have = ", ".join(s.name for s in cf.shard_files(ck.path)) or "none"
                raise TargetNotFound(str(ck.path), f"no shard file of rank {t.rank} (shards: {have})")
            ranges = {s: self._ranges(s) for s in shards} if p.mode == "bitflip" else None
            plan.append((shards, ranges, t.rank))
        out["files"] = [
            rec for shards, ranges, rank in plan for rec in self._damage_rank(shards, ranges, rank, ctx)
        ]
        return out

    def _corrupt_files(self, ctx: FaultContext, file_glob: str) -> dict[str, Any]:
        """The damage on plain torch.save files matching ``file_glob`` (the params' ``file_glob``)."""
        p = self.params
        per_rank = "{rank}" in file_glob
        groups: list[tuple[int | None, str]] = (
            [(t.rank, file_glob.replace("{rank}", str(t.rank))) for t in ctx.targets]
            if per_rank
            else [(None, file_glob)]
        )
        chosen = [self._select(ctx.setup.ckpt_dir, glob) for _, glob in groups]
        ranges = {ck.path: self._ranges(ck.path) for ck in chosen} if p.mode == "bitflip" else None
        files = []
        for (rank, _), ck in zip(groups, chosen, strict=True):
            files += self._damage_rank([ck.path], ranges, rank, ctx)
        return {
            "checkpoint": str(chosen[0].path) if len(chosen) == 1 else [str(c.path) for c in chosen],
            "step": chosen[0].step,
            "complete": all(c.complete for c in chosen),
            "format": "torch-save",
            "files": files,
        }

    def _ranges(self, file: Path) -> list[cf.PayloadRange]:
        pattern = self.params.tensors
        ranges = cf.tensor_payload_ranges(file)
        if pattern is not None:
            ranges = [r for r in ranges if fnmatch.fnmatchcase(r.name, pattern)]
        if not ranges:
            raise TargetNotFound(
                str(file), "no tensor data" + (f" in tensors matching {pattern!r}" if pattern else "")
            )
        return ranges

    def _damage_rank(
        self,
        files: list[Path],
        ranges: dict[Path, list[cf.PayloadRange]] | None,
        rank: int | None,
        ctx: FaultContext,
    ) -> list[dict[str, Any]]:
        p = self.params
        if p.mode != "bitflip" or ranges is None:
            return [self._damage(f, rank, None, ctx) for f in files]
        # Spread the rank's bits over its files in proportion to their payload, then flip per file.
        weights = [sum(r.length for r in ranges[f]) for f in files]
        counts = dict.fromkeys(files, 0)
        for f in ctx.rng.choices(files, weights=weights, k=p.bits):
            counts[f] += 1
        return [self._damage(f, rank, ranges[f], ctx, counts[f]) for f in files if counts[f]]

    def _damage(
        self,
        file: Path,
        rank: int | None,
        ranges: list[cf.PayloadRange] | None,
        ctx: FaultContext,
        bits: int = 0,
    ) -> dict[str, Any]:
        p = self.params
        rec: dict[str, Any] = {"file": str(file), "rank": rank if rank is not None else cf.shard_rank(file)}
        rec["size_before"] = file.stat().st_size
        if p.mode == "bitflip":
            assert ranges is not None
            flips = cf.flip_bits(file, ranges, bits, ctx.rng)
            rec["offsets"] = [f.offset for f in flips]
            rec["flips"] = [f.to_dict() for f in flips]
        elif p.mode == "truncate":
            rec["size_before"], rec["size_after"] = cf.truncate(file, p.truncate_fraction)
        elif p.mode in ("delete-shard", "delete-metadata"):
            cf.delete(file)
            rec["size_after"] = None
        elif p.mode == "garble-metadata":
            _, rec["sha256_before"], rec["sha256_after"] = cf.garble(file, ctx.rng)
        return rec

    # ------------------------------------------------------------------ kills
    def _signal(
        self, targets: list[ResolvedTarget], ctx: FaultContext, sig: signal.Signals
    ) -> list[dict[str, Any]]:
        """Send ``sig`` to each target's process; records what happened instead of failing (after SIGKILL:
        the damage is done)."""
        out = []
        for t in targets:
            rec: dict[str, Any] = {"rank": t.rank, "pid": t.pid}
            if t.pid is None:
                rec["error"] = "no process"
            else:
                try:
                    ctx.runtime.signal_pid(t.pid, sig, t.pid_ticks, t.node)
                except (ProcessLookupError, ChaosbenchError) as exc:
                    rec["error"] = str(exc) or type(exc).__name__
            out.append(rec)
        return out

    def _torn_write(self, ctx: FaultContext) -> dict[str, Any]:
        saves = []
        for t in ctx.targets:
            if t.pid is None:
                raise ProcessLookupError(f"rank {t.rank} has no process")
            saves.append(self._save_in_progress(ctx, t))
        if self.params.torn_at == "shard-write":
            for t, save in zip(ctx.targets, saves, strict=True):
                assert t.rank is not None  # no role targets here (role_targets is False)
                self._wait_for_shard(Path(save.path) if save.path else None, t.rank)
        delivered = [
            ctx.runtime.signal_pid(t.pid, signal.SIGKILL, t.pid_ticks, t.node)
            for t in ctx.targets
            if t.pid is not None
        ]  # each has one: checked above
        step, path, _ = saves[0]
        out: dict[str, Any] = {
            "mode": "torn-write",
            "checkpoint": path,
            "step": step,
            "killed": [{"rank": t.rank, "pid": t.pid} for t in ctx.targets],
            **effect_of(delivered, "SIGKILL delivered during the save"),
        }
        d = Path(path) if path else None
        if d is not None:  # what the dead rank left (the others may still be writing)
            # the kill can land before the save has made its directory (rank 0 makes it after the begin): no
            # files, no marker, said as such (dir_at_kill)
            out["dir_at_kill"] = d.is_dir()
            out["files_at_kill"] = (
                {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}
                if out["dir_at_kill"]
                else {}
            )
            out["marker_at_kill"] = out["dir_at_kill"] and (d / cf.COMPLETE_MARKER).is_file()
            if _whole_at_kill(d, saves[0].begun_ns):
                out["damaged"] = False
                out["undamaged"] = (
                    f"the torn write missed: the save of step {step} was whole when the kill landed (its "
                    f"{cf.METADATA_FILE} had been written since the save began)"
                )
        return out

    @staticmethod
    def _wait_for_shard(path: Path | None, rank: int, timeout_s: float = 10.0) -> None:
        """Block until the rank's shard file exists in the checkpoint being written (polled every ms)."""
        if path is None:
            raise TargetNotFound(
                "checkpoint save",
                "the save in progress has no path",
                message="the checkpoint save in progress has no path",
            )
        shard = path / f"__{rank}_0.distcp"
        if not wait_until(shard.exists, timeout_s, interval_s=0.001):
            raise TargetNotFound(
                str(path),
                f"rank {rank} wrote no shard within {timeout_s} s",
                message=f"rank {rank} wrote no shard into {path} within {timeout_s} s",
            )

    @staticmethod
    def _save_in_progress(ctx: FaultContext, t: ResolvedTarget) -> SaveInProgress:
        """The checkpoint save running in the target's incarnation: the newest ``ckpt_save_begin`` seen from any
        rank (the trigger may be another rank's begin, seen before the target's own) that the target has not
        ended; ``begun_ns``: the earliest rank's begin of that step."""
        inc = t.incarnation
        begins = [e for e in ctx.events if e.kind == "ckpt_save_begin" and e.get("incarnation", 0) == inc]
        if not begins:
            raise TargetNotFound(
                f"rank {t.rank}",
                f"no checkpoint save in progress (incarnation {inc})",
                message=f"no checkpoint save in progress on rank {t.rank} (incarnation {inc})",
            )
        begin = max(begins, key=lambda e: (e.get("step") or 0, e.t_ns))
        step = begin.get("step")
        ended = any(
            e.kind == "ckpt_save_end"
            and e.get("rank") == t.rank
            and e.get("step") == step
            and e.get("incarnation", 0) == inc
            for e in ctx.events
        )
        if ended:
            raise TargetNotFound(
                f"rank {t.rank}",
                f"the checkpoint save of step {step} had already ended",
                message=f"the checkpoint save of step {step} had already ended on rank {t.rank}",
            )
        begun_ns = min(e.t_ns for e in begins if e.get("step") == step)
        return SaveInProgress(step, begin.get("path"), begun_ns)

    def revert(self, ctx: FaultContext) -> bool:
        """Nothing to undo: damage to a checkpoint is permanent, by design (as on a real disk)."""
        return False
