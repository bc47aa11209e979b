"""``stall-fs``: a real FUSE passthrough (mfusepy over fuse3) under torch.save, dcp and the runner.

Skipped without /dev/fuse, fusermount3 or mfusepy, unless CHAOSBENCH_REQUIRE contains "fuse" (then failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaosbench import procutil
from chaosbench.injectors.stall_fs import (
    FuseMount,
    StallFsInjector,
    StallFsParams,
    cleanup_stale_mounts,
    fuse_available,
    is_mounted,
    is_our_fusefs,
)
from chaosbench.registry import INJECTORS
from chaosbench.timeline import read_events
from tests.helpers import require

pytestmark = pytest.mark.integration

if "stall-fs" not in INJECTORS.names():
    INJECTORS.register("stall-fs", StallFsInjector)


@pytest.fixture(autouse=True)
def _need_fuse() -> None:
    require("fuse", fuse_available())


def fuse_mounts_under(root: Path) -> list[str]:
    """FUSE mount points below ``root``, from /proc/mounts (never touching the mounts)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        mp = parts[1].replace("\\040", " ")
        if parts[2].startswith("fuse") and (mp == str(root) or mp.startswith(str(root) + "/")):
            out.append(mp)
    return out


def our_fusefs_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and is_our_fusefs(int(p))]


@pytest.fixture
def mount(tmp_path: Path):
    m = FuseMount(tmp_path / "backing", tmp_path / "mnt", tmp_path / "state", tmp_path / "logs")
    m.start()
    yield m
    m.stop()
    assert fuse_mounts_under(tmp_path) == []
    assert m.pid is not None and not procutil.alive(m.pid)


# ------------------------------------------------------------------------------------------------ params
def test_params_validation() -> None:
    p = StallFsParams.model_validate({"errno": "EIO"})
    assert p.error_probability == 1.0 and p.error_ops == ["write", "fsync"]
    assert p.control(seed=1)["errno"] == {
        "name": "EIO",
        "probability": 1.0,
        "ops": ["fsync", "fsyncdir", "write"],
    }
    with pytest.raises(ValueError, match="only apply with errno"):
        StallFsParams.model_validate({"error_probability": 0.5})
    with pytest.raises(ValueError, match="unknown filesystem ops"):
        StallFsParams.model_validate({"errno": "EIO", "error_ops": ["wrte"]})
    with pytest.raises(ValueError):
        StallFsParams.model_validate({"errno": "EPERM"})
    with pytest.raises(ValueError):
        StallFsParams.model_validate({"write_delay_s": -1})


# ------------------------------------------------------------------------------------------------ fusefs
def test_passthrough_delay_inflates_torch_save_and_keeps_data(mount: FuseMount) -> None:
    import torch

    x = torch.randn(1024 * 1024)  # 4 MiB

    def save(name: str) -> float:
        t = time.monotonic()
        torch.save(x, mount.mountpoint / name)
        return time.monotonic() - t

    save("warm.pt")
    base_s = min(save("base1.pt"), save("base2.pt"))
    delay = 0.2
    assert mount.set_faults({"delay_s": {"write": delay}}) is not None
    writes_before = mount.stats(fresh=True)["ops"].get("write", 0)  # type: ignore[index]
    slow_s = save("slow.pt")
    assert mount.clear_faults() is not None
    stats = mount.stats()
    assert stats is not None
    n_writes = stats["ops"]["write"] - writes_before
    # the kernel hands writes over in chunks of up to 1 MiB: a 4 MiB file is >= 4 delayed writes
    assert n_writes >= 4 and stats["delayed"]["write"] == n_writes
    assert slow_s - base_s >= 0.9 * delay * n_writes, (base_s, slow_s, n_writes)
    assert slow_s - base_s >= 3 * delay
    assert torch.equal(torch.load(mount.mountpoint / "slow.pt"), x)
    assert (mount.backing / "slow.pt").stat().st_size == (mount.mountpoint / "slow.pt").stat().st_size
    print(f"torch.save 4 MiB: {base_s:.3f} s -> {slow_s:.3f} s with {delay} s x {n_writes} writes")


def test_eio_on_write_makes_torch_save_raise(mount: FuseMount) -> None:
    import torch

    assert mount.set_faults({"errno": {"name": "EIO", "probability": 1.0, "ops": ["write"]}, "seed": 1})
    # torch.save reports the failed write as a RuntimeError from its zip writer, not as an OSError
    with pytest.raises((RuntimeError, OSError)):
        torch.save(torch.randn(1024 * 1024), mount.mountpoint / "bad.pt")
    stats = mount.stats(fresh=True)
    assert stats is not None and stats["errors"]["write"] >= 1 and stats["errors_by_errno"]["EIO"] >= 1
    mount.clear_faults()
    torch.save(torch.ones(3), mount.mountpoint / "good.pt")
    assert torch.equal(torch.load(mount.mountpoint / "good.pt"), torch.ones(3))


def test_dcp_save_and_load_through_the_mount(mount: FuseMount) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.randn(256, 256), "b": torch.arange(10)}
    dcp.save(state, checkpoint_id=str(mount.mountpoint / "ck"))
    out = {"w": torch.zeros(256, 256), "b": torch.zeros(10, dtype=torch.int64)}
    dcp.load(out, checkpoint_id=str(mount.mountpoint / "ck"))
    assert torch.equal(out["w"], state["w"]) and torch.equal(out["b"], state["b"])
    mount.set_faults({"errno": {"name": "ENOSPC", "probability": 1.0, "ops": ["write"]}})
    with pytest.raises(BaseException, match="No space left on device"):  # dcp raises CheckpointException
        dcp.save(state, checkpoint_id=str(mount.mountpoint / "ck2"))


def test_freeze_blocks_a_write_until_unfrozen(mount: FuseMount) -> None:
    assert mount.set_faults({"freeze": True}) is not None
    # a separate process: a thread of ours blocked in a FUSE request could hold the GIL (torch does)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({str(mount.mountpoint / 'f.bin')!r}, 'wb').write(b'x' * 100000)"]
    )
    try:
        time.sleep(1.5)
        assert writer.poll() is None, "the write finished while the filesystem was frozen"
        stats = mount.stats(fresh=True)
        assert stats is not None and stats["waiting_frozen"] >= 1
        t = time.monotonic()
        assert mount.clear_faults() is not None
        assert writer.wait(timeout=10) == 0
        assert time.monotonic() - t < 2
    finally:
        if writer.poll() is None:
            mount.clear_faults()
            writer.kill()
            writer.wait()
    assert (mount.backing / "f.bin").stat().st_size == 100000
    stats = mount.stats(fresh=True)
    assert stats is not None and stats["frozen_ops"] >= 1 and stats["frozen_s"] >= 1.0


def test_stop_is_idempotent_and_survives_a_dead_server(tmp_path: Path) -> None:
    m = FuseMount(tmp_path / "backing", tmp_path / "mnt", tmp_path / "state", tmp_path / "logs")
    m.start()
    (m.mountpoint / "a").write_text("a")
    assert m.pid is not None
    os.kill(m.pid, signal.SIGKILL)  # the server crashes: the mount stays, dead (ENOTCONN)
    m.proc.wait()  # type: ignore[union-attr]
    assert is_mounted(m.mountpoint)
    m.stop()
    m.stop()
    assert fuse_mounts_under(tmp_path) == []
    assert (m.backing / "a").read_text() == "a"


HARNESS = """
import sys, time
from pathlib import Path
from chaosbench.injectors.stall_fs import FuseMount
root = Path(sys.argv[1])
m = FuseMount(root / "backing", root / "mnt", root / "state", root / "logs")
m.start()
m.set_faults({"freeze": True})
print(m.pid, flush=True)
time.sleep(600)
"""


def test_server_unfreezes_and_unmounts_when_the_harness_dies(tmp_path: Path) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    writer = None
    try:
        assert harness.stdout is not None
        fusefs_pid = int(harness.stdout.readline())
        writer = subprocess.Popen(
            [sys.executable, "-c", f"open({str(tmp_path / 'mnt' / 'w.bin')!r}, 'wb').write(b'x' * 1000)"]
        )
        time.sleep(1.0)
        assert writer.poll() is None  # frozen
        harness.kill()  # a harness crash: no revert, no cleanup
        harness.wait()
        assert writer.wait(timeout=10) == 0  # the server noticed, cleared the faults ...
        deadline = time.monotonic() + 10
        while (fuse_mounts_under(tmp_path) or procutil.alive(fusefs_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fuse_mounts_under(tmp_path) == []  # ... unmounted and exited
        assert not procutil.alive(fusefs_pid)
        assert (tmp_path / "backing" / "w.bin").stat().st_size == 1000
        stats = json.loads((tmp_path / "state" / "control.stats.json").read_text())
        assert stats["owner_gone"] and stats["final"]
    finally:
        for p in (harness, writer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for mp in fuse_mounts_under(tmp_path):
            subprocess.run(["fusermount3", "-u", "-z", mp], check=False)


def test_cleanup_stale_mounts_after_a_harness_crash(tmp_path: Path) -> None:
    run_dir = tmp_path / "res" / "s" / "restart__x" / "0"
    m = FuseMount(run_dir / "ckpt-backing", run_dir / "checkpoints", run_dir / "stallfs", run_dir / "logs")
    m.start()
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        entry = {
            "mountpoint": str(m.mountpoint),
            "control": str(m.control),
            "fusefs_pid": m.pid,
            "fusefs_ticks": m.ticks,
            "owner_pid": os.getpid(),
            "owner_ticks": procutil.start_ticks(os.getpid()),
        }
        (run_dir / "mounts.json").write_text(json.dumps({"mounts": [entry]}))
        assert cleanup_stale_mounts(tmp_path / "res") == []  # owner alive, run not ended: left alone
        assert is_mounted(m.mountpoint)
        m.set_faults({"freeze": True})
        entry.update(owner_pid=dead.pid, owner_ticks=None)  # the harness that mounted it is gone
        (run_dir / "mounts.json").write_text(json.dumps({"mounts": [entry]}))
        done = cleanup_stale_mounts(tmp_path / "res")
        assert [d["mountpoint"] for d in done] == [str(m.mountpoint)]
        assert done[0]["unmount"] in ("unmounted", "lazy")
        assert not is_mounted(m.mountpoint)
        assert m.proc is not None and m.proc.wait(timeout=10) is not None
        assert json.loads((run_dir / "mounts.json").read_text())["mounts"][0]["unmounted_t_ns"]
        assert cleanup_stale_mounts(tmp_path / "res") == []
    finally:
        m.stop()
    assert fuse_mounts_under(tmp_path) == []


# ------------------------------------------------------------------------------------------------ runner
WORKLOAD = "{name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.02, pg_timeout_s: 10}"

SUITE = f"""
name: sfs
seed: 5
control: true
defaults:
  deadline_s: 150
  workload: {WORKLOAD}
frameworks:
  restart: {{heartbeat_timeout_s: 20, max_restarts: 2}}
faults:
  slow:
    injector: stall-fs
    trigger: {{at_step: 12}}
    params: {{write_delay_s: 0.05, fsync_delay_s: 0.05, duration_s: 20}}
  eio:
    injector: stall-fs
    trigger: {{at_step: 12}}
    params: {{errno: EIO}}
matrix: {{frameworks: [restart], faults: [slow, eio], repeats: 1}}
"""


def _assert_torn_down(run_dir: Path) -> dict:
    """Nothing mounted or serving for this run; returns the fusefs counters from the timeline."""
    assert fuse_mounts_under(run_dir) == []
    entries = json.loads((run_dir / "mounts.json").read_text())["mounts"]
    assert len(entries) == 1 and entries[0]["unmounted_t_ns"]
    assert not procutil.alive(entries[0]["fusefs_pid"], entries[0]["fusefs_ticks"])
    logs = [e for e in read_events(run_dir / "events.jsonl") if e.kind == "log" and e.get("proc") == "fusefs"]
    assert len(logs) == 1 and logs[0]["unmount"] == "unmounted", logs
    return logs[0]["stats"]


def test_runner_delay_and_eio(run_suite, tmp_path: Path) -> None:
    res = run_suite(SUITE)
    ctl, slow, eio = res["restart/control#0"], res["restart/slow#0"], res["restart/eio#0"]
    assert fuse_mounts_under(tmp_path) == [] and our_fusefs_pids() == []

    assert ctl.outcome == "completed" and ctl.checkpoint_save_s is not None
    assert slow.outcome == "outlasted", slow.missing  # a slow filesystem only slows training down
    assert slow.final_step == 30 and slow.fidelity == "exact"
    # saves at steps 20 and 30 (4 of 6 rank-saves) fall in the window: the median save is a slow one
    assert slow.checkpoint_save_s > ctl.checkpoint_save_s + 0.2, (
        ctl.checkpoint_save_s,
        slow.checkpoint_save_s,
    )
    stats = _assert_torn_down(Path(slow.run_dir))
    assert stats["delayed"]["write"] >= 4 and stats["delayed"]["fsync"] >= 4 and not stats["errors"]
    print(f"checkpoint_save_s: control {ctl.checkpoint_save_s:.3f} s, delayed {slow.checkpoint_save_s:.3f} s")

    # EIO on every write: the save at step 20 fails in every incarnation
    assert eio.outcome == "not_recovered" or eio.restart_count >= 1, (eio.outcome, eio.restart_count)
    assert eio.restart_count >= 1
    logs = "\n".join(p.read_text(errors="replace") for p in (Path(eio.run_dir) / "logs").glob("rank*"))
    assert "Input/output error" in logs and ("OSError" in logs or "RuntimeError" in logs)
    stats = _assert_torn_down(Path(eio.run_dir))
    assert stats["errors_by_errno"]["EIO"] >= 1


# ------------------------------------------------------------------------------------------------ interrupt
INTR_SUITE = """
name: sfsintr
seed: 3
control: false
defaults:
  deadline_s: 200
  workload: {name: ddp-mlp, ranks: 2, steps: 400, checkpoint_every: 10, step_sleep_s: 0.01}
frameworks:
  restart: {heartbeat_timeout_s: 120}
faults:
  freeze: {injector: stall-fs, trigger: {at_step: 5}, params: {freeze: true}}
matrix: {frameworks: [restart], faults: [freeze], repeats: 1}
"""

# The CLI as `python -m chaosbench.cli`.
CLI = "import sys; from chaosbench.cli import main; sys.exit(main(sys.argv[1:]))\n"


def test_sigint_while_frozen_unmounts_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(INTR_SUITE)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "run", str(tmp_path / "s.yaml"), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = out / "sfsintr" / "restart__freeze" / "0"
    stats_path = run_dir / "stallfs" / "control.stats.json"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (run_dir / "events.jsonl").exists() and any(
                e.kind == "fault_inject" for e in read_events(run_dir / "events.jsonl")
            ):
                break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        else:
            pytest.fail("the fault never fired")
        # wait until a rank is actually stuck in the frozen filesystem (the checkpoint at step 10)
        while time.monotonic() < deadline:
            stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
            if stats.get("waiting_frozen", 0) >= 1:
                break
            time.sleep(0.1)
        else:
            pytest.fail("no filesystem operation ever blocked")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, output
    assert fuse_mounts_under(tmp_path) == [] and our_fusefs_pids() == []
    ev = read_events(run_dir / "events.jsonl")
    assert [e for e in ev if e.kind == "run_end"][-1]["outcome"] == "interrupted"
    assert any(e.kind == "fault_revert" for e in ev)
    pids = {(e["pid"], e.get("pid_ticks")) for e in ev if e.kind in ("proc_start", "rank_start")}
    assert pids
    # nothing of the run is left: not running, not stopped (T), not stuck in the filesystem (D)
    assert [p for p, t in pids if procutil.alive(p, t)] == []
    stats = _assert_torn_down(run_dir)
    assert stats["frozen_ops"] >= 1 and stats["waiting_frozen"] == 0
