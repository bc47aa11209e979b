"""The checkpoint watcher: saves seen on the filesystem (real files, real inotify), judged by their format."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from chaosbench.errors import Unsupported
from chaosbench.timeline import TimelineWriter, read_events
from chaosbench.timeline.events import Event
from chaosbench.waiting import wait_until
from chaosbench.workloads import checkpoint_watch as cw
from chaosbench.workloads.checkpoint_watch import CheckpointWatcher

QUIET_S = 0.2
# How long a test waits for the events it expects: a bound on a wait, no figure is asserted on it. 100 saves of
# test_many_files_are_many_saves took over 5 s while the integration tests ran beside (tox runs 2 files at once).
TIMEOUT_S = 30.0


class Watch:
    """A started watcher on ``dir`` (tmp_path/ckpt) writing to tmp_path/events.jsonl, and its events."""

    def __init__(
        self, tmp_path: Path, dirs: list[Path] | None = None, names: list[str] | None = None
    ) -> None:
        self.dir = tmp_path / "ckpt"
        self.step: int | None = None
        self.timeline = TimelineWriter(tmp_path / "events.jsonl")
        self.watcher = CheckpointWatcher(
            dirs or [self.dir], self.timeline, lambda: self.step, quiet_s=QUIET_S, names=names
        )

    def events(self, kind: str | None = None) -> list[Event]:
        return [
            e for e in read_events(self.timeline.path) if e.src == cw.SRC and (kind is None or e.kind == kind)
        ]

    def ends(self) -> list[Event]:
        return self.events("ckpt_save_end")

    def wait_ends(self, n: int) -> list[Event]:
        assert wait_until(lambda: len(self.ends()) >= n, TIMEOUT_S, interval_s=0.01), self.events()
        return self.ends()


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Watch]:
    w = Watch(tmp_path)
    w.dir.mkdir()
    w.watcher.start()
    yield w
    w.watcher.stop()
    w.timeline.close()


def _torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _state(n: int = 64) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(n, dtype=torch.float32), "b": torch.zeros(3)}


def _safetensors(path: Path) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError:  # the format by hand: u64 header length, JSON header, then the data
        data = torch.arange(16, dtype=torch.float32).numpy().tobytes()
        header = json.dumps({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, len(data)]}}).encode()
        path.write_bytes(struct.pack("<Q", len(header)) + header + data)
        return
    save_file({"w": torch.arange(16, dtype=torch.float32)}, str(path))


def test_a_torch_save_file_is_one_complete_save_with_the_step_from_its_name(watch: Watch) -> None:
    before = time.time_ns()
    torch.save(_state(), watch.dir / "epoch=0-step=20.ckpt")
    after = time.time_ns()
    (end,) = watch.wait_ends(1)
    (begin,) = watch.events("ckpt_save_begin")
    size = (watch.dir / "epoch=0-step=20.ckpt").stat().st_size
    for e in (begin, end):
        assert (e["path"], e["dir"], e["step"], e["step_from"], e["via"]) == (
            "epoch=0-step=20.ckpt",
            str(watch.dir),
            20,
            "name",
            "filesystem",
        )
        assert "rank" not in e.data
    assert (end["complete"], end["files"], end["bytes"]) == (True, 1, size)
    assert "incomplete" not in end.data
    assert before <= begin.t_ns <= end.t_ns
    assert end.t_ns - after < 1e9  # stamped when the close reached the watcher


def test_a_file_written_three_times_is_three_saves_with_the_timeline_step(watch: Watch) -> None:
    for i, step in enumerate((10, 20, 30), start=1):
        watch.step = step
        torch.save(_state(8 * i), watch.dir / "snapshot.pt")
        watch.wait_ends(i)
    ends = watch.ends()
    assert [(e["step"], e["step_from"], e["complete"]) for e in ends] == [
        (s, "timeline", True) for s in (10, 20, 30)
    ]
    assert [e["step"] for e in watch.events("ckpt_save_begin")] == [10, 20, 30]


def test_a_torn_torch_save_is_incomplete(watch: Watch) -> None:
    blob = _torch_bytes(_state(4096))
    (watch.dir / "ckpt-7.pt").write_bytes(blob[: len(blob) // 2])
    (end,) = watch.wait_ends(1)
    assert (end["step"], end["complete"], end["bytes"]) == (7, False, len(blob) // 2)
    assert isinstance(end["incomplete"], str) and end["incomplete"]


def test_an_atomic_save_is_complete_at_the_rename(watch: Watch) -> None:
    watch.step = 5
    t0 = time.time_ns()
    torch.save(_state(), watch.dir / "model.pt.tmp")
    time.sleep(0.1)  # the writer's own pause between writing and renaming
    t_rename = time.time_ns()
    os.replace(watch.dir / "model.pt.tmp", watch.dir / "model.pt")
    (end,) = watch.wait_ends(1)
    (begin,) = watch.events("ckpt_save_begin")
    assert (end["path"], end["complete"], end["step"], end["step_from"]) == ("model.pt", True, 5, "timeline")
    assert t0 <= begin.t_ns < t_rename <= end.t_ns  # begin: the temporary file's first write; end: the rename
    watch.watcher.stop()  # judges what is pending: nothing more can come
    assert len(watch.events()) == 2


def test_an_hf_checkpoint_dir_is_one_save_from_its_first_write_to_its_last(watch: Watch) -> None:
    d = watch.dir / "checkpoint-50"
    t0 = time.time_ns()
    d.mkdir()
    _safetensors(d / "model.safetensors")
    time.sleep(0.1)
    t_second = time.time_ns()
    torch.save({"state": {0: {"exp_avg": torch.ones(8)}}}, d / "optimizer.pt")
    time.sleep(0.1)
    t_last = time.time_ns()
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 50}))
    t_done = time.time_ns()
    (end,) = watch.wait_ends(1)
    (begin,) = watch.events("ckpt_save_begin")
    assert (end["path"], end["step"], end["step_from"], end["complete"], end["files"]) == (
        "checkpoint-50",
        50,
        "name",
        True,
        3,
    )
    assert end["bytes"] == sum(p.stat().st_size for p in d.iterdir())
    assert t0 <= begin.t_ns < t_second  # the first write (the directory's creation)
    assert t_last <= end.t_ns <= t_done + int(0.1e9)  # the last write, not the quiet period's end (0.2 s on)
    watch.watcher.stop()  # judges what is pending: nothing more can come
    assert [e.kind for e in watch.events()] == ["ckpt_save_begin", "ckpt_save_end"]  # its files: no saves


def test_a_truncated_safetensors_makes_its_dir_incomplete(watch: Watch) -> None:
    d = watch.dir / "checkpoint-60"
    d.mkdir()
    _safetensors(d / "model.safetensors")
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) - 8)
    (end,) = watch.wait_ends(1)
    assert (end["path"], end["complete"]) == ("checkpoint-60", False)
    assert "model.safetensors" in end["incomplete"]


def _dcp_save(state: dict[str, torch.Tensor], path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(path))


def test_a_dcp_dir_is_one_save(watch: Watch) -> None:
    _dcp_save(_state(), watch.dir / "step_70")
    (end,) = watch.wait_ends(1)
    assert (end["path"], end["step"], end["step_from"], end["complete"], end["files"]) == (
        "step_70",
        70,
        "name",
        True,
        2,
    )
    watch.watcher.stop()  # judges what is pending: nothing more can come
    assert len(watch.events()) == 2


def test_a_dcp_dir_without_a_step_takes_the_timeline_step(watch: Watch) -> None:
    watch.step = 7
    _dcp_save(_state(), watch.dir / "latest")
    (end,) = watch.wait_ends(1)
    assert (end["path"], end["step"], end["step_from"], end["complete"]) == ("latest", 7, "timeline", True)


def test_stop_judges_a_pending_dir_save(watch: Watch) -> None:
    d = watch.dir / "step_80"
    d.mkdir()
    with open(d / "__0_0.distcp", "wb") as f:  # still being written: the save cannot go quiet
        f.write(_torch_bytes(_state()))
        f.flush()
        assert wait_until(lambda: watch.events("ckpt_save_begin"), TIMEOUT_S, interval_s=0.01)
        f.write(b"more")  # a write the directory's watch surely sees (the first may precede it)
        f.flush()
        time.sleep(QUIET_S * 1.5)
        assert watch.ends() == []
        t_stop = time.time_ns()
        watch.watcher.stop()
    (end,) = watch.ends()
    assert (end["path"], end["step"], end["complete"]) == ("step_80", 80, False)
    assert ".metadata" in end["incomplete"]
    assert end.t_ns < t_stop  # the last write seen, not the stop


def test_what_exists_at_start_is_not_a_save(tmp_path: Path) -> None:
    w = Watch(tmp_path)
    w.dir.mkdir()
    torch.save(_state(), w.dir / "snapshot.pt")
    (w.dir / "checkpoint-5").mkdir()
    torch.save(_state(), w.dir / "checkpoint-5" / "optimizer.pt")
    with w.watcher:
        (w.dir / "snapshot.pt").read_bytes()  # a read is no write (a load, of a checkpoint of unknown step)
        torch.save(_state(), w.dir / "ckpt-9.pt")  # the marker: everything before it was seen
        (end,) = w.wait_ends(1)
        assert end["path"] == "ckpt-9.pt"
    assert [e["path"] for e in w.events("ckpt_save_begin") + w.ends()] == ["ckpt-9.pt", "ckpt-9.pt"]
    assert [(e.kind, e["path"], e["step"]) for e in w.events() if e.kind.startswith("ckpt_load")] == [
        ("ckpt_load_begin", "snapshot.pt", None),
        ("ckpt_load_end", "snapshot.pt", None),
    ]


def test_reads_of_a_checkpoint_are_its_load_with_the_step_it_was_saved_at(watch: Watch) -> None:
    """A resumed script reads the checkpoint it restores from: snapshot.pt (the step its save was written with)
    and HF's checkpoint-50/ (every file read in one burst: one load, the step from the name). The watcher's own
    reads while it judges a save are no load."""
    watch.step = 20
    torch.save(_state(), watch.dir / "snapshot.pt")
    unit = watch.dir / "checkpoint-50"
    unit.mkdir()
    _safetensors(unit / "model.safetensors")
    torch.save(_state(), unit / "optimizer.pt")
    (unit / "trainer_state.json").write_text("{}")
    watch.wait_ends(2)
    assert watch.events("ckpt_load_end") == []  # judging the saves read them: not a load
    watch.step = 33
    t0 = time.time_ns()
    for f in ("trainer_state.json", "model.safetensors", "optimizer.pt"):
        (unit / f).read_bytes()
    torch.load(watch.dir / "snapshot.pt", weights_only=True)
    assert wait_until(lambda: len(watch.events("ckpt_load_end")) >= 2, TIMEOUT_S, interval_s=0.01), (
        watch.events()
    )
    loads = {e["path"]: e for e in watch.events("ckpt_load_end")}
    assert (loads["snapshot.pt"]["step"], loads["snapshot.pt"]["step_from"]) == (20, "save")
    assert (
        loads["checkpoint-50"]["step"],
        loads["checkpoint-50"]["step_from"],
        loads["checkpoint-50"]["files"],
    ) == (50, "name", 3)
    begins = {e["path"]: e for e in watch.events("ckpt_load_begin")}
    assert t0 <= begins["checkpoint-50"].t_ns <= loads["checkpoint-50"].t_ns


def test_a_missing_dir_is_created_at_start(tmp_path: Path) -> None:
    w = Watch(tmp_path, dirs=[tmp_path / "not" / "yet"])
    with w.watcher:
        assert (tmp_path / "not" / "yet").is_dir()
        torch.save(_state(), tmp_path / "not" / "yet" / "a.pth")
        (end,) = w.wait_ends(1)
    assert (end["path"], end["dir"], end["complete"]) == ("a.pth", str(tmp_path / "not" / "yet"), True)


def test_a_rotated_old_checkpoint_and_a_link_write_nothing(tmp_path: Path) -> None:
    w = Watch(tmp_path)
    (w.dir / "checkpoint-40").mkdir(parents=True)
    torch.save(_state(), w.dir / "checkpoint-40" / "optimizer.pt")
    with w.watcher:
        d = w.dir / "checkpoint-50"
        d.mkdir()
        torch.save(_state(), d / "optimizer.pt")
        shutil.rmtree(w.dir / "checkpoint-40")  # save_total_limit, while checkpoint-50 is still pending
        os.symlink(d / "optimizer.pt", w.dir / "last.ckpt")  # Lightning's save_last="link"
        (end,) = w.wait_ends(1)
    assert (end["path"], end["complete"]) == ("checkpoint-50", True)
    assert len(w.events()) == 2


def test_a_save_removed_while_written_ends_incomplete(watch: Watch) -> None:
    path = watch.dir / "big.pt"
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + b"\0" * 1000)
        f.flush()
        assert wait_until(lambda: watch.events("ckpt_save_begin"), TIMEOUT_S, interval_s=0.01)
        path.unlink()
    (end,) = watch.wait_ends(1)
    assert (end["path"], end["complete"]) == ("big.pt", False)


def test_a_temporary_dir_renamed_to_a_checkpoint_is_one_save(watch: Watch) -> None:
    tmp = watch.dir / "checkpoint-90.tmp"
    t0 = time.time_ns()
    tmp.mkdir()  # begin: the temporary directory's creation
    blob = _torch_bytes(_state())
    with open(
        tmp / "model.pt", "wb"
    ) as f:  # in two writes: the second one surely after the dir's watch is added
        f.write(blob[:100])
        f.flush()
        time.sleep(0.05)
        f.write(blob[100:])
    t_rename = time.time_ns()
    tmp.rename(watch.dir / "checkpoint-90")
    (end,) = watch.wait_ends(1)
    (begin,) = watch.events("ckpt_save_begin")
    assert (end["path"], end["step"], end["complete"], end["files"]) == ("checkpoint-90", 90, True, 1)
    assert t0 <= begin.t_ns <= t_rename <= end.t_ns


def test_many_files_are_many_saves(watch: Watch) -> None:
    blob = _torch_bytes(_state(4))
    for i in range(100):
        (watch.dir / f"shard-{i}.pt").write_bytes(blob)
    ends = watch.wait_ends(100)
    assert sorted(e["step"] for e in ends) == list(range(100))
    assert all(e["complete"] for e in ends)


def test_a_nested_watched_dir_reports_each_save_once(tmp_path: Path) -> None:
    work = tmp_path / "work"
    w = Watch(tmp_path, dirs=[work, work / "ckpt"])
    with w.watcher:
        torch.save(_state(), work / "ckpt" / "step-3.pt")
        torch.save(_state(), work / "out.pt")
        w.wait_ends(2)
    ends = {e["path"]: e["dir"] for e in w.ends()}
    assert ends == {"step-3.pt": str(work / "ckpt"), "out.pt": str(work)}
    assert len(w.events()) == 4


def test_names_replace_the_default_suffixes(tmp_path: Path) -> None:
    w = Watch(tmp_path, names=[r"\.msgpack$"])
    w.dir.mkdir()
    with w.watcher:
        torch.save(_state(), w.dir / "ignored.pt")
        (w.dir / "state-4.msgpack").write_bytes(b"x" * 10)
        (end,) = w.wait_ends(1)
    assert (end["path"], end["step"], end["complete"]) == ("state-4.msgpack", 4, True)
    assert len(w.events()) == 2


def test_an_error_in_the_handler_is_a_log_event_and_the_watcher_goes_on(
    watch: Watch, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = cw.torch_save_complete
    calls: list[object] = []

    def once(path: object) -> bool:
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(cw, "torch_save_complete", once)
    torch.save(_state(), watch.dir / "a-1.pt")
    assert wait_until(lambda: watch.events("log"), TIMEOUT_S, interval_s=0.01)
    torch.save(_state(), watch.dir / "a-2.pt")
    (end,) = watch.wait_ends(1)
    (log,) = watch.events("log")
    assert (end["path"], end["complete"]) == ("a-2.pt", True)
    assert log["proc"] == cw.LOG_PROC and "RuntimeError" in log["line"]


def test_current_step_raising_is_a_log_event(tmp_path: Path) -> None:
    def broken() -> int:
        raise KeyError("no step yet")

    timeline = TimelineWriter(tmp_path / "events.jsonl")
    with CheckpointWatcher([tmp_path / "ckpt"], timeline, broken, quiet_s=QUIET_S):
        torch.save(_state(), tmp_path / "ckpt" / "snapshot.pt")
        assert wait_until(
            lambda: [e for e in read_events(timeline.path) if e.kind == "ckpt_save_end"],
            TIMEOUT_S,
            interval_s=0.01,
        )
    ev = read_events(timeline.path)
    end = next(e for e in ev if e.kind == "ckpt_save_end")
    assert (end["step"], end["step_from"], end["complete"]) == (None, None, True)
    assert any(e.kind == "log" and "KeyError" in e["line"] for e in ev)


def test_stop_is_idempotent_and_safe_when_never_started(tmp_path: Path) -> None:
    timeline = TimelineWriter(tmp_path / "events.jsonl")
    never = CheckpointWatcher([tmp_path / "a"], timeline)
    never.stop()
    never.stop()
    with pytest.raises(RuntimeError):
        never.start()
    w = CheckpointWatcher([tmp_path / "b"], timeline, quiet_s=QUIET_S)
    w.start()
    w.stop()
    w.stop()
    assert read_events(timeline.path) == []


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    timeline = TimelineWriter(tmp_path / "events.jsonl")
    with pytest.raises(ValueError):
        CheckpointWatcher([], timeline)
    with pytest.raises(ValueError):
        CheckpointWatcher([tmp_path], timeline, quiet_s=0)
    with pytest.raises(ValueError):
        CheckpointWatcher([tmp_path], timeline, names=["("])


def test_formats(tmp_path: Path) -> None:
    good = tmp_path / "m.safetensors"
    _safetensors(good)
    assert cw.format_problem(good) == (True, None)
    raw = good.read_bytes()
    for name, data in {
        "short.safetensors": raw[:5],
        "cut.safetensors": raw[:-1],
        "json.safetensors": struct.pack("<Q", 4) + b"{{{{",
    }.items():
        (tmp_path / name).write_bytes(data)
        known, problem = cw.format_problem(tmp_path / name)
        assert known and problem, name
    (tmp_path / "legacy.bin").write_bytes(b"\x80\x02legacy pickle")
    assert cw.format_problem(tmp_path / "legacy.bin") == (False, None)
    (tmp_path / "empty.pt").write_bytes(b"")
    assert cw.format_problem(tmp_path / "empty.pt")[1]
    assert cw.format_problem(tmp_path / "gone.pt") == (True, "vanished before it was judged")


@pytest.mark.parametrize(
    ("name", "is_dir"),
    [
        ("checkpoint-300", True),
        ("step_20", True),
        ("global_step40", True),
        ("iter_0000020", True),
        ("20", True),
        ("epoch=0-step=20.ckpt", True),
        ("version_0", False),
        ("mp_rank_00", False),
        ("latest", False),
        ("checkpoint-50.tmp", False),
        (".tmp-checkpoint-5", False),
    ],
)
def test_checkpoint_dir_names(name: str, is_dir: bool) -> None:
    assert cw.is_checkpoint_dir_name(name) is is_dir


def test_start_without_inotify_is_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "watchdog.observers.inotify", None)  # the import fails as off Linux
    with TimelineWriter(tmp_path / "events.jsonl") as timeline, pytest.raises(Unsupported):
        CheckpointWatcher([tmp_path], timeline).start()
