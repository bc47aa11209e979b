"""A passthrough FUSE filesystem whose I/O the harness can slow down, freeze or fail.

Run as its own process (one per mount)::

    python -m chaosbench.injectors.stall_fs.server --backing DIR --mountpoint DIR --control FILE [--foreground] [--owner-pid PID]

It serves ``--backing`` at ``--mountpoint`` and applies the faults described by the JSON control file, re-read
whenever it is replaced or changes (polled every 50 ms)::

    {"generation": 3, "seed": 1,
     "delay_s": {"write": 0.5, "fsync": 0.5, "read": 0.0},      # seconds added to every call of that op
     "freeze": false,                                             # true: every op blocks until false again
     "errno": {"name": "EIO", "probability": 0.3, "ops": ["write", "fsync"]}}   # or null

A missing control file means no faults. A malformed one is ignored (the previous faults stay) and reported in
the stats. Faults apply before the real operation: a failed ``write`` writes nothing.

Counters (calls per op, delays and errors injected, time spent frozen, bytes moved) and the ``generation`` of
the control file last applied go to a JSON stats file (``--stats``, default ``<control stem>.stats.json``
beside the control file), rewritten every 0.5 s when they changed, right after each control change (the
harness waits for that acknowledgement) and at exit (with ``"final": true``).

``ready`` is printed on stdout once the filesystem is mounted. With ``--owner-pid`` the process watches its
owner (the harness): when the owner is gone it clears every fault, lazily unmounts and exits, so a crashed
harness never leaves ranks frozen on a dead mount. SIGTERM/SIGINT unmount and exit (libfuse's handlers).
Standard library, :mod:`chaosbench.procutil` and ``mfusepy`` (imported only when mounting).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosbench import procutil

#: Operations served (and counted); every name may carry a delay or an injected error.
FS_OPS: tuple[str, ...] = (
    "access",
    "chmod",
    "chown",
    "create",
    "flush",
    "fsync",
    "fsyncdir",
    "getattr",
    "link",
    "mkdir",
    "mknod",
    "open",
    "read",
    "readdir",
    "readlink",
    "release",
    "rename",
    "rmdir",
    "statfs",
    "symlink",
    "truncate",
    "unlink",
    "utimens",
    "write",
)

CONTROL_POLL_S = 0.05
STATS_EVERY_S = 0.5
OWNER_POLL_S = 0.2
#: fsname/subtype of our mounts: they show as ``chaosbench-fusefs ... fuse.chaosbench`` in /proc/mounts.
FSNAME = "chaosbench-fusefs"
SUBTYPE = "chaosbench"

_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2

log = logging.getLogger("chaosbench.stall_fs")


def default_stats_path(control: str | os.PathLike[str]) -> Path:
    p = Path(control)
    return p.with_name(p.stem + ".stats.json")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to a temporary file beside ``path`` and rename it over ``path``."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, p)


def no_faults(generation: int = 0) -> dict[str, Any]:
    """The control document that turns every fault off."""
    return {"generation": generation, "delay_s": {}, "freeze": False, "errno": None, "seed": None}


@dataclass(frozen=True)
class FaultConfig:
    """Parsed, validated control document."""

    generation: int = 0
    delay_s: dict[str, float] = field(default_factory=dict)
    freeze: bool = False
    errno_name: str | None = None
    errno_code: int = 0
    probability: float = 0.0
    error_ops: frozenset[str] = frozenset()
    seed: int | None = None

    @classmethod
    def from_obj(cls, obj: Any) -> FaultConfig:
        """Raises ValueError naming the bad field."""
        if not isinstance(obj, dict):
            raise ValueError("control document must be a JSON object")
        delays: dict[str, float] = {}
        for op, v in (obj.get("delay_s") or {}).items():
            if op not in FS_OPS:
                raise ValueError(f"delay_s: unknown op {op!r} (known: {', '.join(FS_OPS)})")
            if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
                raise ValueError(f"delay_s.{op}: expected seconds >= 0, got {v!r}")
            if v > 0:
                delays[op] = float(v)
        freeze = obj.get("freeze", False)
        if not isinstance(freeze, bool):
            raise ValueError(f"freeze: expected true/false, got {freeze!r}")
        name, code, prob, ops = None, 0, 0.0, frozenset[str]()
        err = obj.get("errno")
        if err is not None:
            if not isinstance(err, dict):
                raise ValueError("errno: expected an object {name, probability, ops} or null")
            name = str(err.get("name", ""))
            code = getattr(errno, name, 0) if name.isupper() else 0
            if not isinstance(code, int) or code <= 0:
                raise ValueError(f"errno.name: unknown errno {name!r}")
            prob = err.get("probability", 1.0)
            if not isinstance(prob, int | float) or not 0 <= prob <= 1:
                raise ValueError(f"errno.probability: expected 0..1, got {prob!r}")
            ops = frozenset(err.get("ops") or ("write", "fsync"))
            unknown = sorted(ops - set(FS_OPS))
            if unknown:
                raise ValueError(f"errno.ops: unknown ops {unknown}")
        seed = obj.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise ValueError(f"seed: expected an integer or null, got {seed!r}")
        gen = obj.get("generation", 0)
        if not isinstance(gen, int):
            raise ValueError(f"generation: expected an integer, got {gen!r}")
        return cls(gen, delays, freeze, name, code, float(prob), ops, seed)

    def to_obj(self) -> dict[str, Any]:
        err = None
        if self.errno_name is not None:
            err = {"name": self.errno_name, "probability": self.probability, "ops": sorted(self.error_ops)}
        return {
            "generation": self.generation,
            "delay_s": dict(self.delay_s),
            "freeze": self.freeze,
            "errno": err,
            "seed": self.seed,
        }


class FaultState:
    """The faults in force and the counters; shared by every FUSE worker thread.

    :meth:`before` is called at the start of each operation: it counts the call, blocks while frozen, sleeps
    the op's delay (cut short when the delay is lifted) and raises the configured OSError with the
    configured probability."""

    def __init__(self) -> None:
        self.cfg = FaultConfig()
        self._cond = threading.Condition()
        self._rng = random.Random()
        self.closing = False
        self.version = 0  # bumped on every counter change, so the stats writer skips idle periods
        self.ops: dict[str, int] = {}
        self.delayed: dict[str, int] = {}
        self.delay_s: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self.errors_by_errno: dict[str, int] = {}
        self.frozen_ops = 0
        self.frozen_s = 0.0
        self.waiting_frozen = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.control_error: str | None = None

    def apply(self, cfg: FaultConfig) -> None:
        with self._cond:
            if cfg.seed is not None and cfg.seed != self.cfg.seed:
                self._rng.seed(cfg.seed)
            self.cfg = cfg
            self.control_error = None
            self.version += 1
            self._cond.notify_all()

    def close(self) -> None:
        """Release every waiting operation for good (shutdown)."""
        with self._cond:
            self.closing = True
            self.cfg = FaultConfig(generation=self.cfg.generation)
            self._cond.notify_all()

    def _bump(self, table: dict[str, Any], op: str, by: float = 1) -> None:
        table[op] = table.get(op, 0) + by

    def before(self, op: str) -> None:
        with self._cond:
            self._bump(self.ops, op)
            self.version += 1
            if self.cfg.freeze and not self.closing:
                t0 = time.monotonic()
                self.frozen_ops += 1
                self.waiting_frozen += 1
                try:
                    while self.cfg.freeze and not self.closing:
                        self._cond.wait(0.5)
                finally:
                    self.waiting_frozen -= 1
                    self.frozen_s += time.monotonic() - t0
                    self.version += 1
            delay = self.cfg.delay_s.get(op, 0.0)
            if delay > 0 and not self.closing:
                t0 = time.monotonic()
                deadline = t0 + delay
                while not self.closing and self.cfg.delay_s.get(op, 0.0) > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._bump(self.delayed, op)
                self._bump(self.delay_s, op, time.monotonic() - t0)
                self.version += 1
            cfg = self.cfg
            if cfg.errno_name is not None and op in cfg.error_ops and self._rng.random() < cfg.probability:
                self._bump(self.errors, op)
                self._bump(self.errors_by_errno, cfg.errno_name)
                self.version += 1
                raise OSError(cfg.errno_code, os.strerror(cfg.errno_code))

    def count_bytes(self, written: int = 0, read: int = 0) -> None:
        with self._cond:
            self.bytes_written += written
            self.bytes_read += read
            self.version += 1

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {
                "generation": self.cfg.generation,
                "faults": self.cfg.to_obj(),
                "ops": dict(self.ops),
                "delayed": dict(self.delayed),
                "delay_s": {k: round(v, 6) for k, v in self.delay_s.items()},
                "errors": dict(self.errors),
                "errors_by_errno": dict(self.errors_by_errno),
                "frozen_ops": self.frozen_ops,
                "frozen_s": round(self.frozen_s, 6),
                "waiting_frozen": self.waiting_frozen,
                "bytes_written": self.bytes_written,
                "bytes_read": self.bytes_read,
                "control_error": self.control_error,
            }


class Passthrough:
    """mfusepy operations over a backing directory. Every op first goes through :meth:`FaultState.before`;
    OSErrors (real or injected) become the errno returned to the caller."""

    use_ns = True  # utimens/getattr times in integer nanoseconds

    def __init__(self, backing: Path, faults: FaultState, on_init: Any = None) -> None:
        self.backing = str(backing)
        self.faults = faults
        self.on_init = on_init

    def _p(self, path: str) -> str:
        return self.backing + path if path != "/" else self.backing

    # -- life cycle (not counted)
    def init(self, path: str) -> None:
        if self.on_init is not None:
            self.on_init()

    # -- metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self.faults.before("getattr")
        # By path: with no opendir the handle of a directory is 0, which is not ours to fstat.
        st = os.lstat(self._p(path))
        return {
            "st_mode": st.st_mode,
            "st_ino": st.st_ino,
            "st_nlink": st.st_nlink,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_size": st.st_size,
            "st_blocks": st.st_blocks,
            "st_blksize": st.st_blksize,
            "st_rdev": st.st_rdev,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def access(self, path: str, amode: int) -> int:
        self.faults.before("access")
        if not os.access(self._p(path), amode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self.faults.before("chmod")
        os.chmod(self._p(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self.faults.before("chown")
        os.lchown(self._p(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int | None, int | None] | None = None) -> int:
        """``times``: (atime_ns, mtime_ns); None for an entry means leave it (UTIME_OMIT)."""
        self.faults.before("utimens")
        p = self._p(path)
        if times is None:
            now = time.time_ns()
            times = (now, now)
        a, m = times
        if a is None or m is None:
            st = os.lstat(p)
            a = st.st_atime_ns if a is None else a
            m = st.st_mtime_ns if m is None else m
        os.utime(p, ns=(a, m), follow_symlinks=False)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self.faults.before("statfs")
        sv = os.statvfs(self._p(path))
        keys = (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_flag",
            "f_namemax",
        )
        return {k: getattr(sv, k) for k in keys}

    def readlink(self, path: str) -> str:
        self.faults.before("readlink")
        return os.readlink(self._p(path))

    # -- namespace
    def readdir(self, path: str, fh: int) -> list[str]:
        self.faults.before("readdir")
        return [".", "..", *os.listdir(self._p(path))]

    def mkdir(self, path: str, mode: int) -> int:
        self.faults.before("mkdir")
        os.mkdir(self._p(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self.faults.before("rmdir")
        os.rmdir(self._p(path))
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        self.faults.before("mknod")
        os.mknod(self._p(path), mode, dev)
        return 0

    def unlink(self, path: str) -> int:
        self.faults.before("unlink")
        os.unlink(self._p(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self.faults.before("rename")
        os.rename(self._p(old), self._p(new))
        return 0

    def symlink(self, target: str, source: str) -> int:
        """mfusepy's order: ``target`` is the new link's path, ``source`` what it points to."""
        self.faults.before("symlink")
        os.symlink(source, self._p(target))
        return 0

    def link(self, target: str, source: str) -> int:
        self.faults.before("link")
        os.link(self._p(source), self._p(target))
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self.faults.before("truncate")
        os.truncate(self._p(path), length)
        return 0

    # -- files
    def create(self, path: str, mode: int, flags: int) -> int:
        self.faults.before("create")
        return os.open(self._p(path), flags | os.O_CREAT, mode)

    def open(self, path: str, flags: int) -> int:
        self.faults.before("open")
        return os.open(self._p(path), flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.faults.before("read")
        data = os.pread(fh, size, offset)
        self.faults.count_bytes(read=len(data))
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.faults.before("write")
        n = os.pwrite(fh, data, offset)
        self.faults.count_bytes(written=n)
        return n

    def flush(self, path: str, fh: int) -> int:
        self.faults.before("flush")
        # close() of a duplicate surfaces the errors a real close would report, without closing fh.
        os.close(os.dup(fh))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.faults.before("fsync")
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.faults.before("fsyncdir")
        fd = os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    def release(self, path: str, fh: int) -> int:
        self.faults.before("release")
        os.close(fh)
        return 0


def _run_fuse(ops: Passthrough, mountpoint: str, foreground: bool) -> None:
    """Mount and serve until unmounted or signalled (multi-threaded)."""
    import mfusepy

    class _Fuse(mfusepy.FUSE):
        # mfusepy flattens utimens timespecs, losing UTIME_NOW/UTIME_OMIT, and drops rename flags.
        def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
            times: tuple[int | None, int | None] | None = None
            if buf:
                now = time.time_ns()
                pair: list[int | None] = []
                for ts in (buf.contents.actime, buf.contents.modtime):
                    if ts.tv_nsec == _UTIME_OMIT:
                        pair.append(None)
                    elif ts.tv_nsec == _UTIME_NOW:
                        pair.append(now)
                    else:
                        pair.append(ts.tv_sec * 10**9 + ts.tv_nsec)
                times = (pair[0], pair[1])
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.utimens(decoded, times))

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            if flags:  # RENAME_NOREPLACE/EXCHANGE: not emulated; callers fall back on EINVAL
                return -errno.EINVAL
            return int(self.rename_fuse_2(old, new))

    # libfuse 3.14 prints "Ignoring invalid max threads value 4294967295" here whatever the options: harmless.
    _Fuse(ops, mountpoint, foreground=foreground, nothreads=False, fsname=FSNAME, subtype=SUBTYPE)


class ControlLoop(threading.Thread):
    """Polls the control file, writes the stats file and watches the owner process."""

    def __init__(
        self,
        faults: FaultState,
        control: Path,
        stats: Path,
        mountpoint: str,
        backing: str,
        owner_pid: int | None,
        owner_ticks: int | None,
    ) -> None:
        super().__init__(name="fusefs-control", daemon=True)
        self.faults = faults
        self.control = control
        self.stats = stats
        self.mountpoint = mountpoint
        self.backing = backing
        self.owner_pid = owner_pid
        self.owner_ticks = owner_ticks
        self._stop_ev = threading.Event()
        self._seen: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self.owner_gone = False

    def read_control(self) -> bool:
        """Apply the control file if it changed; returns whether something was applied."""
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            return False
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return False
        self._seen = key
        try:
            cfg = FaultConfig.from_obj(json.loads(self.control.read_text()))
        except (OSError, ValueError) as exc:
            self.faults.control_error = f"{type(exc).__name__}: {exc}"
            log.warning("ignoring control file %s: %s", self.control, exc)
            return True
        self.faults.apply(cfg)
        return True

    def write_stats(self, final: bool = False) -> None:
        snap = self.faults.snapshot()
        snap.update(
            {
                "pid": os.getpid(),
                "mountpoint": self.mountpoint,
                "backing": self.backing,
                "final": final,
                "owner_gone": self.owner_gone,
                "t_ns": time.time_ns(),
            }
        )
        with self._lock:
            try:
                write_json_atomic(self.stats, snap)
            except OSError as exc:
                log.warning("cannot write stats %s: %s", self.stats, exc)

    def stop(self) -> None:
        self._stop_ev.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2)

    def _owner_alive(self) -> bool:
        return self.owner_pid is None or procutil.alive(self.owner_pid, self.owner_ticks)

    def run(self) -> None:
        last_version = -1
        last_write = 0.0
        next_owner_check = 0.0
        while not self._stop_ev.wait(CONTROL_POLL_S):
            now = time.monotonic()
            changed = self.read_control()
            if changed or (self.faults.version != last_version and now - last_write >= STATS_EVERY_S):
                last_version = self.faults.version
                last_write = now
                self.write_stats()
            if now >= next_owner_check:
                next_owner_check = now + OWNER_POLL_S
                if not self._owner_alive():
                    self.owner_gone = True
                    log.warning(
                        "owner pid %s is gone: clearing faults and unmounting %s",
                        self.owner_pid,
                        self.mountpoint,
                    )
                    self.faults.close()
                    self.write_stats()
                    lazy_unmount(self.mountpoint)
                    return


def lazy_unmount(mountpoint: str) -> None:
    """Detach ``mountpoint`` (``fusermount3 -u -z``; ``umount -l`` without fusermount3)."""
    tool = shutil.which("fusermount3")
    cmd = [tool, "-u", "-z", mountpoint] if tool else ["umount", "-l", mountpoint]
    try:
        subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("lazy unmount of %s failed: %s", mountpoint, exc)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaosbench.injectors.stall_fs.server",
        description="Passthrough FUSE filesystem with harness-controlled latency, freezes and errno faults.",
    )
    p.add_argument("--backing", required=True, help="directory whose contents are served")
    p.add_argument("--mountpoint", required=True, help="existing directory to mount on")
    p.add_argument("--control", required=True, help="JSON control file (faults); missing = no faults")
    p.add_argument("--stats", default=None, help="JSON stats file (default: <control stem>.stats.json)")
    p.add_argument("--foreground", action="store_true", help="do not daemonize")
    p.add_argument(
        "--owner-pid", type=int, default=None, help="unmount and exit when this process is gone (the harness)"
    )
    p.add_argument(
        "--owner-ticks",
        type=int,
        default=None,
        help="start time (clock ticks) of --owner-pid, to tell a reused pid apart",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s fusefs[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    backing = Path(args.backing).resolve()
    mountpoint = str(Path(args.mountpoint).resolve())
    control = Path(args.control).resolve()
    stats = Path(args.stats).resolve() if args.stats else default_stats_path(control)
    if not backing.is_dir():
        print(f"fusefs: backing directory {backing} does not exist", file=sys.stderr)
        return 2
    if not os.path.isdir(mountpoint):
        print(f"fusefs: mount point {mountpoint} is not a directory", file=sys.stderr)
        return 2
    faults = FaultState()
    loop = ControlLoop(faults, control, stats, mountpoint, str(backing), args.owner_pid, args.owner_ticks)
    loop.read_control()

    mounted = threading.Event()

    def on_init() -> None:
        # After mounting (and after daemonizing, which threads would not survive).
        mounted.set()
        loop.start()
        loop.write_stats()
        print("ready", flush=True)

    try:
        _run_fuse(Passthrough(backing, faults, on_init), mountpoint, args.foreground)
    except RuntimeError as exc:
        # libfuse's loop reports a non-zero status after a signal too: only a failure before mounting counts.
        if not mounted.is_set():
            print(f"fusefs: mounting {mountpoint} failed: {exc}", file=sys.stderr)
            return 1
    finally:
        faults.close()
        loop.stop()
        loop.write_stats(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
