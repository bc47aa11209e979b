"""Checkpoint formats on disk: where a checkpoint's tensor bytes live, and the primitive ways to damage them.

Format knowledge only (no harness imports; torch is imported lazily and only to read DCP ``.metadata``).

Two formats are understood:

- **torch.save files** (``*.pt``, ``*.pth``): a zip archive (entries stored, never compressed) with
  ``<archive>/data.pkl`` (the pickled object), ``<archive>/data/<n>`` (the raw bytes of storage ``n``, little
  endian, aligned to 64 bytes by padding in the local header's extra field), plus ``byteorder``, ``version``,
  ``.format_version``, ``.storage_alignment`` and ``.data/serialization_id``. ``<archive>`` is the file's stem
  (``archive`` inside DCP). The tensor bytes of an entry start right after its local header:
  ``header_offset + 30 + len(name) + len(extra)``.
- **torch.distributed.checkpoint (DCP) directories**: ``.metadata`` (a pickled ``Metadata``, written last by the
  coordinator) and one or more ``__<rank>_<n>.distcp`` files per rank. ``Metadata.storage_data`` maps every
  ``MetadataIndex(fqn, offset, index)`` to a ``_StorageInfo(relative_path, offset, length)`` byte range. With the
  default ``FileSystemWriter`` each range holds a complete ``torch.save`` archive of that one tensor (tensor
  items) or of a pickled object (byte items), so the raw tensor bytes are that archive's ``archive/data/0``
  entry, found by parsing the zip inside the range. Replicated values (DDP parameters, optimizer state) are
  written once, into *some* rank's file, and read by every rank on load: damage to one rank's file can reach
  every rank.

Nothing here checks integrity the way a loader would: torch.load and dcp.load in torch 2.13 do not verify the
zip CRCs, so a flipped bit inside a payload range loads silently as a different value, while a flip in a header
or in the pickle usually breaks loading.

Every function raises :class:`CheckpointFormatError` (a ``ValueError``) when a file is not in the format it
expects, and ``OSError`` for I/O problems.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import random
import re
import struct
import zipfile
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple

METADATA_FILE = ".metadata"
COMPLETE_MARKER = "COMPLETE"
DCP_SUFFIX = ".distcp"
TORCH_SAVE_GLOBS = ("*.pt", "*.pth")

_LOCAL_HEADER = b"PK\x03\x04"
_EOCD = b"PK\x05\x06"
_ZIP64_EOCD = b"PK\x06\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_DATA_ENTRY = re.compile(r"^[^/]+/data/(\d+)$")
_SHARD_NAME = re.compile(r"^__(\d+)_(\d+)" + re.escape(DCP_SUFFIX) + r"$")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


class CheckpointFormatError(ValueError):
    """A file or directory is not a checkpoint in a format this module understands."""


class PayloadRange(NamedTuple):
    """Raw tensor bytes in a file: ``length`` bytes at absolute byte ``offset``; ``name`` says which tensor
    (the DCP fully qualified name, or the zip entry of a torch.save file)."""

    offset: int
    length: int
    name: str


@dataclass(frozen=True)
class BitFlip:
    """One flipped bit: byte ``offset`` in the file, ``bit`` 0 (least significant) to 7, inside ``tensor``."""

    offset: int
    bit: int
    tensor: str

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "bit": self.bit, "tensor": self.tensor}


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint found on disk.

    ``kind``: ``dcp`` (a directory) or ``torch-save`` (one file). ``step``: the trailing number of the name
    (``step_00000020`` -> 20), None without one. ``complete``: DCP: ``.metadata`` present and, when any
    checkpoint in the same root uses ``COMPLETE`` markers, the marker too; torch.save: the zip's end record is
    there (``torch.save`` writes it last, so a torn file lacks it)."""

    path: Path
    kind: Literal["dcp", "torch-save"]
    step: int | None
    complete: bool
    has_metadata: bool = False
    has_marker: bool = False
    mtime_ns: int = 0
    files: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "kind": self.kind, "step": self.step, "complete": self.complete}


# --------------------------------------------------------------------------- finding checkpoints


def step_of(name: str) -> int | None:
    """The trailing number of a checkpoint's name without suffix: ``step_00000020`` -> 20, ``ckpt-7.pt`` -> 7."""
    m = _TRAILING_NUMBER.search(Path(name).stem if "." in name.lstrip(".") else name)
    return int(m.group(1)) if m else None


def _is_dcp_dir(d: Path) -> bool:
    return (d / METADATA_FILE).is_file() or any(d.glob("*" + DCP_SUFFIX))


def _dcp_checkpoint(d: Path, markers_used: bool) -> Checkpoint:
    has_md = (d / METADATA_FILE).is_file()
    has_marker = (d / COMPLETE_MARKER).is_file()
    try:
        mtime = max(p.stat().st_mtime_ns for p in [d, *d.iterdir()])
    except OSError:
        mtime = 0
    return Checkpoint(
        path=d,
        kind="dcp",
        step=step_of(d.name),
        complete=has_md and (has_marker or not markers_used),
        has_metadata=has_md,
        has_marker=has_marker,
        mtime_ns=mtime,
        files=tuple(sorted(p.name for p in d.iterdir() if p.is_file())),
    )


def torch_save_complete(path: str | os.PathLike[str] | BinaryIO) -> bool:
    """Whether a torch.save file (a path, or a file open for reading) was written to the end (its zip end record
    and central directory parse)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def list_checkpoints(root: str | os.PathLike[str], file_glob: str | None = None) -> list[Checkpoint]:
    """Checkpoints under ``root``, oldest first (by step, then modification time; unnumbered ones first).

    Without ``file_glob``: DCP checkpoints, i.e. ``root`` itself or its direct subdirectories holding
    ``.metadata`` or ``*.distcp`` files. With ``file_glob`` (relative to ``root``, ``**`` allowed): the
    torch.save files it matches. A missing ``root`` has no checkpoints."""
    base = Path(root)
    if not base.is_dir():
        return []
    out: list[Checkpoint] = []
    if file_glob is not None:
        for p in base.glob(file_glob):
            if not p.is_file():
                continue
            out.append(
                Checkpoint(
                    path=p,
                    kind="torch-save",
                    step=step_of(p.name),
                    complete=torch_save_complete(p),
                    mtime_ns=p.stat().st_mtime_ns,
                    files=(p.name,),
                )
            )
    else:
        dirs = [base] if _is_dcp_dir(base) else []
        dirs += sorted(d for d in base.iterdir() if d.is_dir() and _is_dcp_dir(d))
        markers_used = any((d / COMPLETE_MARKER).is_file() for d in dirs)
        out = [_dcp_checkpoint(d, markers_used) for d in dirs]
    out.sort(key=lambda c: (c.step is not None, c.step or 0, c.mtime_ns))
    return out


def select_checkpoint(checkpoints: list[Checkpoint], which: str | int) -> Checkpoint | None:
    """``newest`` (highest step, complete or not), ``newest-complete`` or the checkpoint of step ``which``
    (an int); None when nothing matches. ``checkpoints`` sorted as :func:`list_checkpoints` returns them."""
    if which == "newest":
        return checkpoints[-1] if checkpoints else None
    if which == "newest-complete":
        done = [c for c in checkpoints if c.complete]
        return done[-1] if done else None
    if isinstance(which, int):
        same = [c for c in checkpoints if c.step == which]
        return same[-1] if same else None
    raise ValueError(f"unknown checkpoint selector {which!r}")


def shard_files(ckpt_dir: str | os.PathLike[str], rank: int | None = None) -> list[Path]:
    """The ``__<rank>_<n>.distcp`` files of a DCP checkpoint (of one rank when ``rank`` is given), by name."""
    out = []
    for p in sorted(Path(ckpt_dir).glob("*" + DCP_SUFFIX)):
        m = _SHARD_NAME.match(p.name)
        if m and (rank is None or int(m.group(1)) == rank):
            out.append(p)
    return out


def shard_rank(path: str | os.PathLike[str]) -> int | None:
    """The rank that wrote a ``__<rank>_<n>.distcp`` file, None for other names."""
    m = _SHARD_NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- zip archives inside byte ranges


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``offset`` of an open binary file: lets zipfile parse
    an archive embedded in a larger file while reading only its headers."""

    def __init__(self, f: Any, offset: int, length: int) -> None:
        super().__init__()
        self._f, self._base, self._len, self._pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        ref = {0: 0, 1: self._pos, 2: self._len}[whence]
        self._pos = max(0, ref + pos)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._len - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._base + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _zip_data_entries(f: Any, offset: int, length: int, label: str) -> list[PayloadRange]:
    """``<archive>/data/<n>`` entries of the zip archive occupying ``[offset, offset + length)`` of ``f``,
    as absolute byte ranges of their (stored, uncompressed) contents."""
    try:
        z = zipfile.ZipFile(_Window(f, offset, length))
        infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, struct.error) as exc:
        raise CheckpointFormatError(f"{label}: not a torch.save zip archive ({exc})") from None
    out = []
    for info in infos:
        if not _DATA_ENTRY.match(info.filename):
            continue
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointFormatError(f"{label}: entry {info.filename} is compressed")
        f.seek(offset + info.header_offset)
        head = f.read(30)
        if len(head) < 30 or head[:4] != _LOCAL_HEADER:
            raise CheckpointFormatError(f"{label}: no local header for {info.filename}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = offset + info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > offset + length:
            raise CheckpointFormatError(f"{label}: entry {info.filename} runs past the archive")
        out.append(PayloadRange(start, info.file_size, info.filename))
    return out


def _scan_archives(f: Any, size: int) -> list[tuple[int, int]]:
    """(offset, length) of the zip archives laid end to end in a file, found from their end records: the
    fallback for a ``.distcp`` file whose ``.metadata`` is gone. Candidates that do not check out (a
    signature that happens to occur inside tensor data) are dropped."""
    if size == 0:
        return []
    blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # mapped, not copied: shards can be large
    found: list[tuple[int, int]] = []
    pos = blob.find(_EOCD)
    while pos >= 0:
        if pos + 22 <= size:
            cd_size, cd_offset, comment_len = struct.unpack("<IIH", blob[pos + 12 : pos + 22])
            end = pos + 22 + comment_len
            start = pos - cd_size - cd_offset
            loc, rec = pos - 20, pos - 20 - 56
            if rec >= 0 and blob[loc : loc + 4] == _ZIP64_LOCATOR and blob[rec : rec + 4] == _ZIP64_EOCD:
                # zip64 (torch always writes it): the central directory ends where the zip64 end record starts
                cd_size, cd_offset = struct.unpack("<QQ", blob[rec + 40 : rec + 56])
                start = rec - cd_size - cd_offset
            if 0 <= start and end <= size and blob[start : start + 4] == _LOCAL_HEADER:
                if not found or start >= found[-1][0] + found[-1][1]:
                    found.append((start, end - start))
        pos = blob.find(_EOCD, pos + 1)
    blob.close()
    return found


# --------------------------------------------------------------------------- payload ranges


def read_dcp_metadata(ckpt_dir: str | os.PathLike[str]) -> Any:
    """The ``Metadata`` of a DCP checkpoint, read with ``FileSystemReader``. A missing or unreadable
    ``.metadata`` raises :class:`CheckpointFormatError`."""
    from torch.distributed.checkpoint import FileSystemReader

    path = Path(ckpt_dir)
    if not (path / METADATA_FILE).is_file():
        raise CheckpointFormatError(f"{path}: no {METADATA_FILE}")
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - unpickling garbage raises anything
        raise CheckpointFormatError(
            f"{path / METADATA_FILE}: unreadable ({type(exc).__name__}: {exc})"
        ) from None


def _item_name(index: Any, kind: str) -> str:
    offs = tuple(getattr(index, "offset", None) or ())
    name = str(index.fqn)
    if any(offs):
        name += "@" + ",".join(str(int(o)) for o in offs)
    return name if kind == "tensor" else f"{name} (pickled object)"


def dcp_payload_ranges(file: str | os.PathLike[str], metadata: Any | None = None) -> list[PayloadRange]:
    """Tensor payloads of one ``.distcp`` file, from ``.metadata`` beside it (or ``metadata``): for every
    storage item the file holds, the ``data/<n>`` entries of the torch.save archive in the item's range.
    Items written through stream transforms (compression, ...) hold no raw bytes and are left out."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    p = Path(file)
    md = read_dcp_metadata(p.parent) if metadata is None else metadata
    out: list[PayloadRange] = []
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for index, info in md.storage_data.items():
            if info.relative_path != p.name or getattr(info, "transform_descriptors", None):
                continue
            if info.offset + info.length > size:
                raise CheckpointFormatError(
                    f"{p}: item {index.fqn} at [{info.offset}, {info.offset + info.length}) lies past the end "
                    f"of the file ({size} bytes)"
                )
            kind = (
                "tensor"
                if isinstance(md.state_dict_metadata.get(index.fqn), TensorStorageMetadata)
                else "bytes"
            )
            entries = _zip_data_entries(f, info.offset, info.length, f"{p} item {index.fqn}")
            for e in entries:
                suffix = "" if len(entries) == 1 else f"[{e.name.rsplit('/', 1)[1]}]"
                out.append(PayloadRange(e.offset, e.length, _item_name(index, kind) + suffix))
    out.sort()
    return out


def tensor_payload_ranges(file: str | os.PathLike[str], metadata: Any | None = None) -> list[PayloadRange]:
    """Byte ranges of raw tensor data in a checkpoint file, sorted by offset.

    ``.distcp``: from the DCP ``.metadata`` beside it (see :func:`dcp_payload_ranges`); without a readable
    ``.metadata``, from the torch.save archives found end to end in the file. Any other file: a torch.save
    zip archive, whose ``<archive>/data/<n>`` entries are the payloads. Empty ranges are left out."""
    p = Path(file)
    if p.suffix == DCP_SUFFIX:
        if metadata is not None or (p.parent / METADATA_FILE).is_file():
            try:
                return [r for r in dcp_payload_ranges(p, metadata) if r.length > 0]
            except CheckpointFormatError:
                if metadata is not None:
                    raise
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            out = []
            for off, ln in _scan_archives(f, size):
                try:
                    out += _zip_data_entries(f, off, ln, f"{p} archive at {off}")
                except CheckpointFormatError:  # a signature inside tensor data, not an archive
                    continue
        if not out and size:
            raise CheckpointFormatError(f"{p}: no torch.save archive found")
        return sorted(r for r in out if r.length > 0)
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(4) != _LOCAL_HEADER:
            raise CheckpointFormatError(f"{p}: not a torch.save zip archive (legacy or other format)")
        return sorted(r for r in _zip_data_entries(f, 0, size, str(p)) if r.length > 0)


# --------------------------------------------------------------------------- damage


def flip_bits(
    file: str | os.PathLike[str], ranges: list[PayloadRange], n: int, rng: random.Random
) -> list[BitFlip]:
    """Flip ``n`` distinct bits, drawn uniformly (by ``rng``) over all bits of ``ranges``, in place; fsynced.
    Returns the flips sorted by offset. Raises ValueError when the ranges hold fewer than ``n`` bits."""
    ranges = [r for r in ranges if r.length > 0]
    ends, total = [], 0
    for r in ranges:
        total += r.length * 8
        ends.append(total)
    if n < 1 or n > total:
        raise ValueError(f"cannot flip {n} bits in {total} payload bits")
    picks: set[int] = set()
    while len(picks) < n:
        picks.add(rng.randrange(total))
    flips = []
    for g in sorted(picks):
        i = bisect_right(ends, g)
        r = ranges[i]
        within = g - (ends[i] - r.length * 8)
        flips.append(BitFlip(r.offset + within // 8, within % 8, r.name))
    with open(file, "r+b") as f:
        for fl in flips:
            f.seek(fl.offset)
            byte = f.read(1)
            f.seek(fl.offset)
            f.write(bytes([byte[0] ^ (1 << fl.bit)]))
        f.flush()
        os.fsync(f.fileno())
    return flips


def truncate(file: str | os.PathLike[str], fraction: float) -> tuple[int, int]:
    """Cut a file to ``floor(size * fraction)`` bytes (``fraction`` of it kept), in place; returns the sizes
    (before, after)."""
    if not 0 <= fraction < 1:
        raise ValueError("fraction must be in [0, 1)")
    p = Path(file)
    before = p.stat().st_size
    after = int(before * fraction)
    with open(p, "r+b") as f:
        f.truncate(after)
        os.fsync(f.fileno())
    return before, after


def garble(file: str | os.PathLike[str], rng: random.Random) -> tuple[int, str, str]:
    """Overwrite a whole file with random bytes of the same length (so size checks still pass); fsynced.
    Returns (size, sha256 before, sha256 after)."""
    p = Path(file)
    old = p.read_bytes()
    new = rng.randbytes(len(old))
    with open(p, "r+b") as f:
        f.write(new)
        os.fsync(f.fileno())
    return len(old), hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()


def delete(file: str | os.PathLike[str]) -> int:
    """Remove a file; returns the size it had."""
    p = Path(file)
    size = p.stat().st_size
    p.unlink()
    return size


def sha256_file(file: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
