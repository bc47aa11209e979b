"""Checkpoint format knowledge against real files: a DCP checkpoint written in this process (no process
group) and plain torch.save files. The payload ranges must be exactly the tensors' raw bytes."""

from __future__ import annotations

import pickle
import random
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from chaosbench.injectors.corrupt_checkpoint import formats as cf  # noqa: E402


def _state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "model": {"w": torch.randn(8, 4, generator=g), "b": torch.arange(5, dtype=torch.float64)},
        "rng": torch.randint(0, 255, (40,), dtype=torch.uint8, generator=g),
        "progress": {"step": 7},
    }


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    return {"model.w": state["model"]["w"], "model.b": state["model"]["b"], "rng": state["rng"]}


def _zeros_like(state: dict) -> dict:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "rng": torch.zeros_like(state["rng"]),
        "progress": {"step": 0},
    }


def _dcp_save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.save(state, checkpoint_id=str(path))


def _dcp_load(path: Path, like: dict) -> dict:
    out = _zeros_like(like)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, checkpoint_id=str(path))
    return out


@pytest.fixture(scope="module")
def dcp_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcp") / "step_00000007"
    _dcp_save(_state(), path)
    return path


@pytest.fixture
def dcp_copy(dcp_ckpt: Path, tmp_path: Path) -> Path:
    dst = tmp_path / dcp_ckpt.name
    shutil.copytree(dcp_ckpt, dst)
    return dst


def test_dcp_ranges_are_exactly_the_tensor_bytes(dcp_ckpt: Path) -> None:
    shard = dcp_ckpt / "__0_0.distcp"
    assert cf.shard_files(dcp_ckpt) == [shard] and cf.shard_rank(shard) == 0
    ranges = cf.tensor_payload_ranges(shard)
    data = shard.read_bytes()
    expected = _tensors(_state())
    assert sorted(r.name for r in ranges) == sorted(expected)  # the pickled 'progress.step' holds no tensor
    for r in ranges:
        assert 0 < r.offset and r.offset + r.length <= len(data)
        assert data[r.offset : r.offset + r.length] == expected[r.name].numpy().tobytes(), r.name
    # payloads do not overlap, and the rest of the file (zip headers, pickles) is outside them
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert a.offset + a.length <= b.offset
    assert sum(r.length for r in ranges) < len(data)


def test_dcp_scan_without_metadata_finds_the_same_ranges(dcp_copy: Path) -> None:
    shard = dcp_copy / "__0_0.distcp"
    with_md = cf.tensor_payload_ranges(shard)
    (dcp_copy / ".metadata").unlink()
    scanned = cf.tensor_payload_ranges(shard)
    assert [(r.offset, r.length) for r in scanned] == [(r.offset, r.length) for r in with_md]
    assert all(r.name.endswith("/data/0") for r in scanned)  # zip entry names: no metadata, no fqns


def test_dcp_one_flipped_payload_bit_changes_one_value_and_loads(dcp_copy: Path) -> None:
    shard = dcp_copy / "__0_0.distcp"
    ranges = [r for r in cf.tensor_payload_ranges(shard) if r.name == "model.w"]
    flips = cf.flip_bits(shard, ranges, 1, random.Random(5))
    assert len(flips) == 1 and flips[0].tensor == "model.w"
    assert ranges[0].offset <= flips[0].offset < ranges[0].offset + ranges[0].length
    state = _state()
    loaded = _dcp_load(dcp_copy, state)  # no checksum is verified: the damage loads silently
    changed = (loaded["model"]["w"] != state["model"]["w"]).sum().item()
    assert changed == 1
    assert torch.equal(loaded["model"]["b"], state["model"]["b"]) and torch.equal(loaded["rng"], state["rng"])
    assert loaded["progress"]["step"] == 7


def test_dcp_flip_in_a_header_breaks_loading(dcp_copy: Path) -> None:
    shard = dcp_copy / "__0_0.distcp"
    r = next(r for r in cf.tensor_payload_ranges(shard) if r.name == "model.w")
    data = bytearray(shard.read_bytes())
    header = data.rfind(b"PK\x03\x04", 0, r.offset)  # the local header right before the payload
    assert 0 <= header < r.offset
    data[header + 1] ^= 0x01
    shard.write_bytes(bytes(data))
    # dcp.load wraps the reader's RuntimeError into a CheckpointException, a BaseException (not an Exception)
    with pytest.raises(CheckpointException, match="data/0"):
        _dcp_load(dcp_copy, _state())


def test_torch_save_file_ranges_and_flips(tmp_path: Path) -> None:
    state = _state()
    path = tmp_path / "ckpt-3.pt"
    torch.save(state, path)
    ranges = cf.tensor_payload_ranges(path)
    assert len(ranges) == 3 and all(r.name.startswith("ckpt-3/data/") for r in ranges)
    data = path.read_bytes()
    payloads = sorted(data[r.offset : r.offset + r.length] for r in ranges)
    assert payloads == sorted(t.numpy().tobytes() for t in _tensors(state).values())

    flips = cf.flip_bits(path, ranges, 1, random.Random(1))
    loaded = torch.load(path, weights_only=True)
    diffs = sum(
        int((loaded_t != t).sum().item())
        for loaded_t, t in [
            (loaded["model"]["w"], state["model"]["w"]),
            (loaded["model"]["b"], state["model"]["b"]),
            (loaded["rng"], state["rng"]),
        ]
    )
    assert diffs == 1, flips

    broken = bytearray(path.read_bytes())
    broken[0] ^= 0xFF  # the first local header's signature
    path.write_bytes(bytes(broken))
    with pytest.raises((RuntimeError, pickle.UnpicklingError)):
        torch.load(path, weights_only=True)


def test_legacy_or_garbage_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(b"\x80\x02not a zip")
    with pytest.raises(cf.CheckpointFormatError):
        cf.tensor_payload_ranges(path)


def test_list_and_select_dcp_checkpoints(dcp_ckpt: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for step in (10, 20, 30):
        shutil.copytree(dcp_ckpt, root / f"step_{step:08d}")
    (root / "step_00000010" / "COMPLETE").write_text("{}")
    (root / "step_00000030" / ".metadata").unlink()  # torn: shards only
    (root / "unrelated").mkdir()
    found = cf.list_checkpoints(root)
    assert [(c.step, c.complete, c.has_metadata) for c in found] == [
        (10, True, True),
        (20, False, True),
        (30, False, False),
    ]
    assert cf.select_checkpoint(found, "newest").step == 30
    assert cf.select_checkpoint(found, "newest-complete").step == 10  # markers are in use: 20 lacks one
    assert cf.select_checkpoint(found, 20).step == 20
    assert cf.select_checkpoint(found, 40) is None
    (root / "step_00000010" / "COMPLETE").unlink()  # no markers anywhere: .metadata means complete
    assert cf.select_checkpoint(cf.list_checkpoints(root), "newest-complete").step == 20
    assert cf.list_checkpoints(tmp_path / "missing") == []


def test_list_torch_save_files(tmp_path: Path) -> None:
    for step in (5, 12, 20):
        torch.save({"w": torch.ones(3)}, tmp_path / f"ckpt-{step}.pt")
    cf.truncate(tmp_path / "ckpt-20.pt", 0.5)  # a torn torch.save: no end record
    found = cf.list_checkpoints(tmp_path, "*.pt")
    assert [(c.step, c.complete) for c in found] == [(5, True), (12, True), (20, False)]
    assert cf.select_checkpoint(found, "newest-complete").step == 12


def test_damage_primitives(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(100)))
    assert cf.truncate(p, 0.25) == (100, 25) and p.read_bytes() == bytes(range(25))
    size, before, after = cf.garble(p, random.Random(0))
    assert size == 25 and before != after and len(p.read_bytes()) == 25
    assert cf.delete(p) == 25 and not p.exists()
    with pytest.raises(ValueError):
        cf.truncate(tmp_path, 1.0)


def test_flip_bits_draws_distinct_bits_inside_the_ranges(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(64))
    ranges = [cf.PayloadRange(8, 4, "a"), cf.PayloadRange(40, 2, "b")]
    flips = cf.flip_bits(p, ranges, 48, random.Random(2))  # every bit of both ranges
    assert len({(f.offset, f.bit) for f in flips}) == 48
    data = p.read_bytes()
    assert data[8:12] == b"\xff" * 4 and data[40:42] == b"\xff" * 2
    assert data.count(0) == 64 - 6
    with pytest.raises(ValueError):
        cf.flip_bits(p, ranges, 49, random.Random(2))


def test_step_of() -> None:
    assert cf.step_of("step_00000020") == 20
    assert cf.step_of("ckpt-7.pt") == 7
    assert cf.step_of("latest.pt") is None
