"""``stall-fs``: the run's checkpoint directory served through a FUSE passthrough whose I/O the harness slows
down, freezes or fails (EIO/ENOSPC with a probability) within a window.

``prepare`` mounts :mod:`chaosbench.injectors.stall_fs.server` over ``setup.ckpt_dir`` (files live in ``<run_dir>/ckpt-backing``)
with every fault off, so the whole run pays the same passthrough overhead and only the window differs.
``inject`` turns the configured faults on, ``revert`` turns them off; ``cleanup`` unmounts, stops the server
and records its counters (calls per op, delays and errors injected, time frozen) as a ``log`` event, so a
report can tell whether injected errors ever reached the workload. Checkpoint save inflation and the training
stall are measured from the ranks' own events, as for any fault.

Crash safety: the mount and its server are recorded in ``<run_dir>/mounts.json`` before anything else
happens; the server clears its faults and unmounts itself when the harness process is gone, and
:func:`cleanup_stale_mounts` finds and removes whatever a killed harness left behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError, EngineError, MissingEngine
from chaosbench.injectors.base import FaultContext, Injector, RunSetup
from chaosbench.injectors.stall_fs.server import FS_OPS, default_stats_path, no_faults, write_json_atomic
from chaosbench.rundir import RunDir
from chaosbench.timeline import read_events
from chaosbench.waiting import wait_until

MOUNTS_FILE = "mounts.json"
MOUNT_TIMEOUT_S = 10.0
ACK_TIMEOUT_S = 2.0
#: How long ``fusermount3 -u`` is retried on EBUSY before falling back to a lazy unmount.
BUSY_RETRY_S = 2.0
STOP_GRACE_S = 3.0
FUSEFS_MODULE = "chaosbench.injectors.stall_fs.server"

#: What a user's op name covers: fsync(2) on a directory reaches the filesystem as ``fsyncdir``.
_OP_ALIASES: dict[str, tuple[str, ...]] = {"fsync": ("fsync", "fsyncdir")}


# ------------------------------------------------------------------------------------------------ mounts
def _unescape(field: str) -> str:
    """/proc/*/mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1 : i + 4]) == 3 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted_points() -> dict[str, str]:
    """Mount points of this mount namespace -> filesystem type, read from /proc without touching the mounts
    themselves (a frozen FUSE mount would block a stat)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        parts = left.split()
        if len(parts) >= 5:
            out[_unescape(parts[4])] = right.split()[0] if right else ""
    return out


def is_mounted(path: str | os.PathLike[str]) -> bool:
    return os.path.abspath(path) in mounted_points()


def fuse_available() -> str | None:
    """Why FUSE mounts cannot be made here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (in a container: --device /dev/fuse --cap-add SYS_ADMIN)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the Python package mfusepy is not installed (pip install mfusepy)"
    return None


def unmount(mountpoint: str | os.PathLike[str], busy_retry_s: float = BUSY_RETRY_S) -> str:
    """Unmount ``mountpoint``: ``fusermount3 -u``, retried while busy, then ``fusermount3 -u -z`` (lazy).

    Returns ``"not-mounted"``, ``"unmounted"`` or ``"lazy"``; raises ChaosbenchError when even the lazy
    unmount failed."""
    mp = os.path.abspath(mountpoint)
    if not is_mounted(mp):
        return "not-mounted"
    tool = shutil.which("fusermount3")
    plain = [tool, "-u", mp] if tool else ["umount", mp]
    lazy = [tool, "-u", "-z", mp] if tool else ["umount", "-l", mp]

    # A plain unmount, retried while the mount is busy (a process still in a call that is being released).
    def done_or_not_busy() -> bool:
        return "busy" not in _run_quiet(plain).lower() or not is_mounted(mp)

    wait_until(done_or_not_busy, busy_retry_s, interval_s=0.1)
    if not is_mounted(mp):
        return "unmounted"
    err = _run_quiet(lazy)
    if not is_mounted(mp):
        return "lazy"
    raise EngineError("fuse", f"cannot unmount {mp}: {err.strip() or 'still mounted'}")


def _run_quiet(argv: list[str]) -> str:
    try:
        res = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return res.stderr


def is_our_fusefs(pid: int, mountpoint: str | None = None) -> bool:
    """Whether ``pid`` runs ``python -m chaosbench.injectors.stall_fs.server`` (serving ``mountpoint``, if given)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in argv]
    if FUSEFS_MODULE not in args:
        return False
    return mountpoint is None or os.path.abspath(mountpoint) in args


def _stop_pid(pid: int, ticks: int | None, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM, wait, SIGKILL a process that is not our child. Returns whether it had to be signalled."""
    if not procutil.alive(pid, ticks):
        return False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait_until(lambda: not procutil.alive(pid, ticks), wait_s):
            return True
    return True


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _record_mount(run_dir: Path, entry: dict[str, Any]) -> None:
    path = run_dir / MOUNTS_FILE
    doc = _read_json(path) or {"mounts": []}
    doc["mounts"] = [m for m in doc.get("mounts", []) if m.get("mountpoint") != entry["mountpoint"]] + [entry]
    write_json_atomic(path, doc)


def _update_mount(run_dir: Path, mountpoint: str, **changes: Any) -> None:
    path = run_dir / MOUNTS_FILE
    doc = _read_json(path)
    if not doc:
        return
    for m in doc.get("mounts", []):
        if m.get("mountpoint") == mountpoint:
            m.update(changes)
    write_json_atomic(path, doc)


def _find_mount_files(root: Path) -> list[Path]:
    """Every ``mounts.json`` below ``root``, without entering mount points: a frozen FUSE mount would block
    the walk (uninterruptibly, for anything but SIGKILL)."""
    mounts = set(mounted_points())
    out: list[Path] = []
    todo = [root]
    while todo:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            # d_type comes from the parent's listing: no stat of a possibly frozen mount root
            if e.is_dir(follow_symlinks=False):
                if os.path.abspath(e.path) not in mounts:
                    todo.append(Path(e.path))
            elif e.name == MOUNTS_FILE:
                out.append(Path(e.path))
    return sorted(out)


def cleanup_stale_mounts(results_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Unmount what runs under ``results_dir`` left mounted, and stop their fusefs servers.

    Looks at every ``mounts.json`` below ``results_dir``; an entry is stale when its owner (the harness
    process that mounted it) is gone or its run already has a ``run_end`` event. For each stale entry:
    faults off (a live server unfreezes its callers), unmount (plain, then lazy), and the recorded fusefs
    process stopped if it is still alive and /proc confirms it is ours. Live runs are left alone.
    Returns one record per entry acted on."""
    done: list[dict[str, Any]] = []
    for path in _find_mount_files(Path(results_dir)):
        doc = _read_json(path)
        if not isinstance(doc, dict):
            continue
        run_dir = path.parent
        ended: bool | None = None
        for m in doc.get("mounts", []):
            mp = m.get("mountpoint")
            if not mp or m.get("unmounted_t_ns"):
                continue
            owner_alive = (
                procutil.alive(int(m.get("owner_pid") or 0), m.get("owner_ticks"))
                if m.get("owner_pid")
                else False
            )
            if ended is None:
                # leniently: a crashed run's mounts are removed even when a line of its timeline is not valid
                ended = any(e.kind == "run_end" for e in read_events(run_dir / "events.jsonl", strict=False))
            if owner_alive and not ended:
                continue
            rec: dict[str, Any] = {
                "mountpoint": mp,
                "run_dir": str(run_dir),
                "owner_alive": owner_alive,
                "run_ended": ended,
            }
            pid, ticks = m.get("fusefs_pid"), m.get("fusefs_ticks")
            live = bool(pid) and procutil.alive(int(pid), ticks) and is_our_fusefs(int(pid), mp)
            if live and m.get("control"):
                with contextlib.suppress(OSError):
                    write_json_atomic(m["control"], no_faults(int(time.time())))
                time.sleep(0.1)
            try:
                rec["unmount"] = unmount(mp)
            except ChaosbenchError as exc:
                rec["unmount"] = f"failed: {exc}"
            if live:
                rec["fusefs_signalled"] = _stop_pid(int(pid), ticks)
            if not is_mounted(mp):
                with contextlib.suppress(OSError):
                    _update_mount(
                        run_dir, mp, unmounted_t_ns=time.time_ns(), unmounted_by="cleanup_stale_mounts"
                    )
            done.append(rec)
    return done


# ------------------------------------------------------------------------------------------------ server
class FuseMount:
    """One :mod:`chaosbench.injectors.stall_fs.server` server serving ``backing`` at ``mountpoint``, started in its own session.

    :meth:`start` returns once the mount is up (or raises); :meth:`set_faults` writes the control file and
    waits for the server's acknowledgement; :meth:`stop` clears the faults, unmounts and stops the server
    (idempotent, also when the server already died) and returns its final counters."""

    def __init__(self, backing: Path, mountpoint: Path, state_dir: Path, log_dir: Path) -> None:
        self.backing = Path(backing).resolve()
        self.mountpoint = Path(mountpoint).absolute()
        self.control = Path(state_dir).resolve() / "control.json"
        self.stats_path = default_stats_path(self.control)
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ticks: int | None = None
        self.generation = 0
        self.unmount_result: str | None = None
        self._faults: dict[str, Any] = no_faults()
        self._logs: list[IO[bytes]] = []
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            FUSEFS_MODULE,
            "--backing",
            str(self.backing),
            "--mountpoint",
            str(self.mountpoint),
            "--control",
            str(self.control),
            "--stats",
            str(self.stats_path),
            "--foreground",
            "--owner-pid",
            str(os.getpid()),
            "--owner-ticks",
            str(procutil.start_ticks(os.getpid())),
        ]

    def start(self, timeout_s: float = MOUNT_TIMEOUT_S, on_started: Any = None) -> None:
        """Start the server and wait until the mount appears. ``on_started(self)`` runs right after the
        process exists (to record it). Raises MissingEngine / ChaosbenchError with the server's stderr."""
        why = fuse_available()
        if why is not None:
            raise MissingEngine(f"stall-fs needs FUSE: {why}")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.control.parent.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if is_mounted(self.mountpoint):
            raise EngineError("fuse", f"{self.mountpoint} is already a mount point")
        self.stats_path.unlink(missing_ok=True)
        write_json_atomic(self.control, no_faults(self.generation))
        out = open(self.log_dir / "fusefs.out", "ab")  # closed in stop()
        err = open(self.log_dir / "fusefs.err", "ab")
        self._logs = [out, err]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        self.ticks = procutil.start_ticks(self.proc.pid)
        if on_started is not None:
            on_started(self)
        proc = self.proc

        def mounted() -> bool:
            if is_mounted(self.mountpoint):
                return True
            if proc.poll() is not None:
                raise EngineError(
                    "fuse",
                    f"fusefs exited with code {proc.returncode} before mounting "
                    f"{self.mountpoint}: {self._stderr_tail()}",
                )
            return False

        if not wait_until(mounted, timeout_s, interval_s=0.02):
            raise EngineError(
                "fuse",
                f"fusefs did not mount {self.mountpoint} within {timeout_s:g} s: {self._stderr_tail()}",
            )

    def _stderr_tail(self) -> str:
        try:
            text = (self.log_dir / "fusefs.err").read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        lines = [ln for ln in text.strip().splitlines() if "Ignoring invalid max threads" not in ln]
        return " | ".join(lines[-5:]) or "(no stderr)"

    def set_faults(self, faults: dict[str, Any], timeout_s: float = ACK_TIMEOUT_S) -> float | None:
        """Write a control document (``faults`` as in :mod:`chaosbench.injectors.stall_fs.server`, without ``generation``) and
        wait until the server applied it. Returns the seconds that took, or None without an acknowledgement
        (a dead or stuck server)."""
        with self._lock:
            self.generation += 1
            gen = self.generation
            self._faults = dict(faults)
            write_json_atomic(self.control, {**faults, "generation": gen})
        t0 = time.monotonic()

        def outcome() -> str | None:
            stats = self.stats()
            if stats is not None and int(stats.get("generation", -1)) >= gen:
                return "applied"
            return None if self.alive else "dead"

        return time.monotonic() - t0 if wait_until(outcome, timeout_s, interval_s=0.01) == "applied" else None

    def clear_faults(self, timeout_s: float = ACK_TIMEOUT_S) -> float | None:
        return self.set_faults(no_faults(), timeout_s)

    def stats(self, fresh: bool = False) -> dict[str, Any] | None:
        """The server's counters as last written (every 0.5 s); ``fresh``: first make a live server write
        them now (by re-sending the faults in force)."""
        if fresh and self.alive:
            self.set_faults(self._faults)
        doc = _read_json(self.stats_path)
        return doc if isinstance(doc, dict) else None

    def stop(self) -> dict[str, Any] | None:
        """Faults off, unmount, stop the server; returns its last counters. Idempotent."""
        if self.proc is None:
            return self.stats()
        if self.alive:
            self.clear_faults(timeout_s=1.0)
        try:
            result = unmount(self.mountpoint)
            if self.unmount_result is None or result != "not-mounted":
                self.unmount_result = result
        finally:
            # Unmounting ends the server's loop; a server that does not go is signalled.
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            for f in self._logs:
                f.close()
            self._logs = []
        return self.stats()


# ------------------------------------------------------------------------------------------------ injector
class StallFsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    write_delay_s: float = Field(default=0.0, ge=0, description="seconds added to every write (~1 MiB chunk)")
    fsync_delay_s: float = Field(
        default=0.0, ge=0, description="seconds added to every fsync (files and dirs)"
    )
    read_delay_s: float = Field(default=0.0, ge=0, description="seconds added to every read")
    freeze: bool = Field(default=False, description="block every filesystem operation for the window")
    errno: Literal["EIO", "ENOSPC"] | None = Field(default=None, description="error returned by error_ops")
    error_probability: float = Field(
        default=1.0, ge=0, le=1, description="chance that an error_ops call fails"
    )
    error_ops: list[str] = Field(
        default_factory=lambda: ["write", "fsync"],
        description="operations that fail with errno ('fsync' covers dirs too)",
    )
    duration_s: float | None = Field(
        default=None, gt=0, description="window length; null: until the run ends"
    )

    @field_validator("error_ops")
    @classmethod
    def _known_ops(cls, v: list[str]) -> list[str]:
        unknown = [op for op in v if op not in FS_OPS]
        if unknown:
            raise ValueError(f"unknown filesystem ops {unknown} (known: {', '.join(FS_OPS)})")
        if not v:
            raise ValueError("error_ops must name at least one op")
        return v

    @model_validator(mode="after")
    def _errno_options(self) -> StallFsParams:
        if self.errno is None:
            given = sorted({"error_probability", "error_ops"} & self.model_fields_set)
            if given:
                raise ValueError(f"{', '.join(given)} only apply with errno (EIO or ENOSPC)")
        return self

    def control(self, seed: int | None) -> dict[str, Any]:
        """The fusefs control document for these faults."""
        delays: dict[str, float] = {}
        for op, d in (
            ("write", self.write_delay_s),
            ("fsync", self.fsync_delay_s),
            ("read", self.read_delay_s),
        ):
            if d > 0:
                for name in _OP_ALIASES.get(op, (op,)):
                    delays[name] = d
        err = None
        if self.errno is not None:
            ops = sorted({name for op in self.error_ops for name in _OP_ALIASES.get(op, (op,))})
            err = {"name": self.errno, "probability": self.error_probability, "ops": ops}
        return {"delay_s": delays, "freeze": self.freeze, "errno": err, "seed": seed}


class StallFsInjector(Injector[StallFsParams]):
    """Serves the checkpoint directory through a FUSE passthrough and, within the fault's window, adds
    latency to write/fsync/read, freezes every operation, or fails operations with EIO/ENOSPC."""

    name: ClassVar[str] = "stall-fs"

    @classmethod
    def cleanup_crashed(cls, results_dir: Path, run_ids: dict[str, Path]) -> list[str]:
        return [f"unmount {a.get('mountpoint', a)}" for a in cleanup_stale_mounts(results_dir)]

    summary: ClassVar[str] = (
        "checkpoint directory behind a FUSE passthrough: added I/O latency, a freeze, or EIO/ENOSPC errors"
    )
    needs_process: ClassVar[bool] = False

    @classmethod
    def missing_engine(cls) -> str | None:
        why = fuse_available()
        return None if why is None else f"stall-fs needs FUSE: {why}"

    def __init__(self, fault_name: str, params: StallFsParams) -> None:
        super().__init__(fault_name, params)
        self.mount: FuseMount | None = None
        self._setup: RunSetup | None = None
        self._active: set[int] = set()
        self._lock = threading.Lock()
        self._cleaned = False

    @property
    def p(self) -> StallFsParams:
        assert isinstance(self.params, StallFsParams)
        return self.params

    def prepare(self, setup: RunSetup) -> None:
        """Mount the passthrough over ``setup.ckpt_dir`` (created if missing), faults off. Raises
        MissingEngine without FUSE and ChaosbenchError when the mount does not come up within 10 s."""
        self._setup = setup
        run_dir = Path(setup.run_dir).resolve()
        mount = FuseMount(
            RunDir(run_dir).ckpt_backing, Path(setup.ckpt_dir), run_dir / "stallfs", run_dir / "logs"
        )
        self.mount = mount

        def record(m: FuseMount) -> None:
            _record_mount(
                run_dir,
                {
                    "mountpoint": str(m.mountpoint),
                    "backing": str(m.backing),
                    "control": str(m.control),
                    "stats": str(m.stats_path),
                    "fusefs_pid": m.pid,
                    "fusefs_ticks": m.ticks,
                    "owner_pid": os.getpid(),
                    "owner_ticks": procutil.start_ticks(os.getpid()),
                    "run_id": setup.run_id,
                    "fault": self.fault_name,
                    "t_ns": time.time_ns(),
                },
            )

        mount.start(on_started=record)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        mount = self.mount
        if mount is None or not mount.alive:
            raise EngineError("fuse", "stall-fs: the fusefs server is not running")
        control = self.p.control(seed=ctx.rng.randrange(1 << 31))
        ack_s = mount.set_faults(control)
        if ack_s is None:
            mount.clear_faults(timeout_s=0.5)  # no firing in force: nothing would revert it
            raise EngineError("fuse", f"stall-fs: fusefs (pid {mount.pid}) did not apply the faults")
        with self._lock:
            self._active.add(ctx.index)
        ctx.state["stall_fs"] = True
        return {
            "mountpoint": str(mount.mountpoint),
            "fusefs_pid": mount.pid,
            "control": control,
            "ack_s": round(ack_s, 4),
        }

    def revert(self, ctx: FaultContext) -> bool:
        if not ctx.state.pop("stall_fs", False):
            return False
        with self._lock:
            self._active.discard(ctx.index)
            still_active = bool(self._active)
        if not still_active and self.mount is not None:
            # A dead server needs no revert: its mount fails with ENOTCONN until cleanup removes it.
            self.mount.clear_faults()
        return True

    def cleanup(self) -> None:
        """Faults off, unmount (lazily if busy), stop the server, record its counters. Idempotent."""
        with self._lock:
            if self._cleaned or self.mount is None:
                return
            self._cleaned = True
        mount = self.mount
        error: str | None = None
        stats: dict[str, Any] | None = None
        try:
            stats = mount.stop()
        except ChaosbenchError as exc:
            error = str(exc)
            stats = mount.stats()
        setup = self._setup
        if setup is None:
            return
        if not is_mounted(mount.mountpoint):
            with contextlib.suppress(OSError):
                _update_mount(
                    Path(setup.run_dir).resolve(),
                    str(mount.mountpoint),
                    unmounted_t_ns=time.time_ns(),
                    unmounted_by="injector",
                    fusefs_returncode=mount.proc.returncode if mount.proc else None,
                )
        summary = _summary(stats)
        with contextlib.suppress(ValueError):  # the timeline was closed already
            setup.timeline.emit(
                "log",
                src="injector",
                proc="fusefs",
                fault=self.fault_name,
                injector=self.name,
                line=f"stall-fs counters: {summary}",
                stats=stats,
                unmount=mount.unmount_result,
                error=error,
                fusefs_returncode=None if mount.proc is None else mount.proc.returncode,
            )
        if error is not None:
            raise EngineError("fuse", error)


def _summary(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "no counters (the fusefs server wrote none)"
    ops = stats.get("ops", {})
    parts = [f"{sum(ops.values())} ops ({ops.get('write', 0)} writes, {ops.get('fsync', 0)} fsyncs)"]
    if stats.get("delayed"):
        total = sum(stats.get("delay_s", {}).values())
        parts.append(f"{sum(stats['delayed'].values())} delayed ({total:.2f} s)")
    if stats.get("errors"):
        parts.append(f"{sum(stats['errors'].values())} errors {stats.get('errors_by_errno')}")
    if stats.get("frozen_ops"):
        parts.append(f"{stats['frozen_ops']} frozen ({stats.get('frozen_s', 0):.2f} s)")
    return ", ".join(parts)
