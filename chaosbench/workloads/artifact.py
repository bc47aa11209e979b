"""The digest of a program's final artifact: the tensors of the file(s) a suite names as its final state
(``fidelity_from``), for programs that print no digest of their own (a Hugging Face ``save_model`` directory, a
Lightning ``.ckpt``, a tutorial's ``snapshot.pt``).

Contract: :func:`digest_artifact` expands the path (a file; a directory: every file below it; a glob, ``**``
allowed), reads every file that holds tensors (``.safetensors`` through safetensors, anything else through
``torch.load(weights_only=True)``: a file that does not load that way holds no tensors and is listed as
skipped, e.g. a pickled ``TrainingArguments``; ``.json``, ``.txt`` and other text are skipped unread) and hashes,
in order of file path and then of each tensor's key path inside it, the key path, dtype, shape and raw bytes of
every tensor. Non-tensor values (ints, strings: an epoch counter, a path) are not part of it. The same tensors
in the same places give the same digest, whatever the file's own bytes (zip timestamps, pickle memo order).
It returns the record of an ``artifact_digest`` event: ``path`` (as asked), ``files``, ``tensors``, ``bytes``,
``digest`` and ``skipped``; or ``error`` (no file, no tensor, unreadable) with no digest. torch is imported only
here, when the run ends.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import Any

#: Suffixes read as text, never as tensors.
_TEXT = frozenset({".json", ".txt", ".md", ".yaml", ".yml", ".csv", ".log", ".model", ".py"})


def expand(path: str) -> list[Path]:
    """The files ``path`` names: itself, every file below a directory, or a glob's matches; sorted."""
    if glob.has_magic(path):
        found = [Path(p) for p in glob.glob(path, recursive=True)]
    else:
        found = [Path(path)] if os.path.exists(path) else []
    files: set[Path] = set()
    for p in found:
        if p.is_dir():
            files.update(q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            files.add(p)
    return sorted(files)


def _tensors(obj: Any, key: str, out: list[tuple[str, Any]]) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((key, obj))
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _tensors(obj[k], f"{key}/{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(v, f"{key}/{i}", out)


def _load(file: Path) -> list[tuple[str, Any]]:
    """The (key path, tensor) pairs of one file (ValueError: it holds no tensors it can give)."""
    import torch

    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        items = load_file(str(file), device="cpu")
        return [(k, items[k]) for k in sorted(items)]
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - weights_only refuses pickled objects: then it holds no tensors
        raise ValueError(
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
        ) from None
    out: list[tuple[str, Any]] = []
    _tensors(obj, "", out)
    return out


def digest_artifact(path: str) -> dict[str, Any]:
    """The ``artifact_digest`` record of ``path`` (module docstring)."""
    import torch

    files = expand(path)
    if not files:
        return {"path": path, "error": f"no file at {path}"}
    h = hashlib.sha256()
    read: list[str] = []
    skipped: dict[str, str] = {}
    tensors = 0
    size = 0
    root = Path(path) if Path(path).is_dir() else None
    for file in files:
        name = str(file.relative_to(root)) if root is not None else file.name
        if file.suffix in _TEXT:
            continue
        try:
            items = _load(file)
        except (ValueError, OSError) as exc:
            skipped[name] = str(exc)
            continue
        if not items:
            skipped[name] = "no tensors in it"
            continue
        read.append(name)
        for key, t in items:
            data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            h.update(f"{name}:{key}:{t.dtype}:{tuple(t.shape)}\n".encode())
            h.update(data)
            tensors += 1
            size += len(data)
    if not tensors:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "only text files"
        return {"path": path, "files": [], "skipped": skipped, "error": f"no tensors in {path} ({why})"}
    return {
        "path": path,
        "files": read,
        "tensors": tensors,
        "bytes": size,
        "digest": h.hexdigest(),
        "skipped": skipped,
    }
