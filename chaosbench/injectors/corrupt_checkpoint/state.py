"""Damaged training state that loads without error: the corrupt-checkpoint modes that rewrite what a checkpoint
means, not its bytes.

- ``zero-optimizer``: every floating tensor of the optimizer's state set to zero (momentum, Adam's moments; a
  ``step`` count kept), so the resumed run takes its next steps without the optimizer's memory.
- ``drop-optimizer``: the optimizer's per-parameter state removed (its ``param_groups`` kept): a loader that
  expects it refuses the checkpoint, one that does not resumes with a fresh optimizer.
- ``rewind-rng``: the target ranks' RNG state replaced by the one of an older checkpoint of the same run.
- ``reset-data-position``: every data-position entry (``data_position``, ``sampler``, ``epoch``, ``consumed``
  ... below any key) set to 0: the resumed run reads its data from the start again.
- ``mixed-step``: the target ranks' shard files (DCP) or per-rank files (torch.save, ``file_glob`` with
  ``{rank}``) replaced by the same rank's files of an older checkpoint: a checkpoint whose parts come from two
  steps.

Which entries are the optimizer, the RNG and the data position is found by their names (:data:`OPTIMIZER_KEY`,
:data:`RNG_KEY`, :data:`DATA_POSITION_KEY`), the same in a DCP checkpoint (read whole with torch's
``dcp_to_torch_save`` and written back as one DCP checkpoint, which DCP reshards on load) and a torch.save file.
A checkpoint with no such entry is refused with the reason (the fault is then skipped, not faked)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosbench.injectors.corrupt_checkpoint import formats as cf

STATE_MODES = ("zero-optimizer", "drop-optimizer", "rewind-rng", "reset-data-position", "mixed-step")

#: Top-level keys holding an optimizer's state dict.
OPTIMIZER_KEY = re.compile(r"optim", re.IGNORECASE)
#: Top-level keys holding RNG state (``rng.rank1``, ``rng_state``, ``torch_rng``, ``generator``).
RNG_KEY = re.compile(r"rng|random|generator", re.IGNORECASE)
#: Keys (at any depth) holding how far through its data a run is.
DATA_POSITION_KEY = re.compile(
    r"data_position|data_pos|sampler|epoch|consumed|batch_idx|batches_seen", re.IGNORECASE
)


def _leaves(obj: Any, fn: Callable[[str, Any], Any], key: str = "") -> Any:
    """``obj`` with every leaf replaced by ``fn(its key, leaf)`` (dicts and lists walked)."""
    if isinstance(obj, dict):
        return {k: _leaves(v, fn, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_leaves(v, fn, key) for v in obj]
    return fn(key, obj)


def zero_optimizer(sd: dict[str, Any]) -> list[str]:
    import torch

    keys = [k for k in sd if OPTIMIZER_KEY.search(str(k))]
    for k in keys:
        opt = sd[k]
        state = opt.get("state") if isinstance(opt, dict) else None
        if not state:
            raise ValueError(f"optimizer entry '{k}' holds no per-parameter state to zero")

        def zero(name: str, v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.is_floating_point() and name != "step":
                return torch.zeros_like(v)
            return v

        opt["state"] = _leaves(state, zero)
    return keys


def drop_optimizer(sd: dict[str, Any]) -> list[str]:
    keys = [k for k in sd if OPTIMIZER_KEY.search(str(k))]
    for k in keys:
        if not isinstance(sd[k], dict) or not sd[k].get("state"):
            raise ValueError(f"optimizer entry '{k}' holds no per-parameter state to drop")
        sd[k]["state"] = {}
    return keys


def reset_data_position(sd: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def walk(obj: Any, path: str) -> None:
        if not isinstance(obj, dict):
            return
        for k, v in list(obj.items()):
            where = f"{path}.{k}" if path else str(k)
            if DATA_POSITION_KEY.search(str(k)) and isinstance(v, int | float) and not isinstance(v, bool):
                obj[k] = type(v)(0)
                found.append(where)
            else:
                walk(v, where)

    walk(sd, "")
    return found


def rng_keys(sd: dict[str, Any], ranks: list[int] | None) -> list[str]:
    """The RNG entries of ``sd``; per-rank ones (``rng.rank1``) of ``ranks`` only."""
    out = []
    for k in sd:
        if not RNG_KEY.search(str(k)):
            continue
        m = re.search(r"rank(\d+)", str(k))
        if m is None or ranks is None or int(m.group(1)) in ranks:
            out.append(str(k))
    return out


def rewind_rng(sd: dict[str, Any], older: dict[str, Any], ranks: list[int] | None) -> list[str]:
    keys = [k for k in rng_keys(sd, ranks) if k in older]
    for k in keys:
        sd[k] = older[k]
    return keys


# --------------------------------------------------------------------------- reading and writing whole checkpoints


def load_whole(ck: cf.Checkpoint) -> dict[str, Any]:
    """The full state dict of a DCP checkpoint directory or a torch.save file (no process group needed)."""
    import torch

    if ck.kind == "torch-save":
        sd = torch.load(ck.path, map_location="cpu", weights_only=False)
        if not isinstance(sd, dict):
            raise ValueError(f"{ck.path} holds a {type(sd).__name__}, not a state dict")
        return sd
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="chaosbench-ckpt-") as tmp:
        pt = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(ck.path), str(pt))
        return dict(torch.load(pt, map_location="cpu", weights_only=False))


def write_whole(ck: cf.Checkpoint, sd: dict[str, Any]) -> list[str]:
    """Write ``sd`` back in place of ``ck`` (a DCP checkpoint: as one rank's DCP checkpoint, its ``COMPLETE``
    marker kept); returns the files written."""
    import torch

    if ck.kind == "torch-save":
        part = ck.path.with_name(ck.path.name + ".chaosbench-tmp")
        torch.save(sd, part)
        os.replace(part, ck.path)
        return [str(ck.path)]
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp

    with tempfile.TemporaryDirectory(prefix="chaosbench-ckpt-", dir=ck.path.parent) as tmp:
        pt, fresh = Path(tmp) / "whole.pt", Path(tmp) / "dcp"
        torch.save(sd, pt)
        torch_save_to_dcp(str(pt), str(fresh))
        for old in [*cf.shard_files(ck.path), ck.path / cf.METADATA_FILE]:
            old.unlink(missing_ok=True)
        written = []
        for f in sorted(fresh.iterdir()):
            shutil.move(str(f), ck.path / f.name)
            written.append(str(ck.path / f.name))
    return written


def swap_from_older(files: list[Path], older: Path) -> list[dict[str, Any]]:
    """Replace each of ``files`` by the file of the same name in the ``older`` checkpoint (a directory), or by
    ``older`` itself (a torch.save file)."""
    out = []
    for f in files:
        src = older / f.name if older.is_dir() else older
        if not src.is_file():
            raise ValueError(f"the older checkpoint {older} has no {f.name}")
        size_before = f.stat().st_size
        shutil.copyfile(src, f)
        out.append(
            {"file": str(f), "from": str(src), "size_before": size_before, "size_after": f.stat().st_size}
        )
    return out
