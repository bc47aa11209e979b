"""What the tests share: the engine requirement (skip, or fail when ``CHAOSBENCH_REQUIRE`` names it), reading a
run's events, and launching a built-in program's ranks directly (without the runner)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chaosbench.timeline import Event, read_events

REPO_ROOT = Path(__file__).resolve().parents[2]


def required(engine: str) -> bool:
    """Whether ``CHAOSBENCH_REQUIRE`` (comma-separated) names ``engine``: its absence must fail, not skip."""
    return engine in [e.strip() for e in os.environ.get("CHAOSBENCH_REQUIRE", "").split(",")]


def require(engine: str, problem: str | None) -> None:
    """Module level: ``problem`` (None: the engine is usable) skips the module, or fails it when CI requires the
    engine (``CHAOSBENCH_REQUIRE``)."""
    if problem is None:
        return
    if required(engine):
        pytest.fail(f"CHAOSBENCH_REQUIRE names {engine} but it is unusable: {problem}", pytrace=False)
    pytest.skip(f"{engine} unavailable: {problem}", allow_module_level=True)


def events_of(m: Any) -> list[Event]:
    """The timeline of a run, from its metrics' ``run_dir``."""
    assert m.run_dir is not None
    return read_events(Path(m.run_dir) / "events.jsonl")


def kinds(events: list[Event], kind: str, **match: Any) -> list[Event]:
    """The events of ``kind`` whose fields equal ``match``."""
    return [e for e in events if e.kind == kind and all(e.get(k) == v for k, v in match.items())]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RankJob:
    """A built-in program's ranks started directly (env:// rendezvous on 127.0.0.1), each logging to a file."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def wait(self, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]

    def finish(self, timeout_s: float) -> list[int | None]:
        """Exit codes, None for a rank still running after ``timeout_s`` (then killed); every rank is reaped."""
        deadline = time.monotonic() + timeout_s
        codes: list[int | None] = []
        try:
            for p in self.procs:
                try:
                    codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    codes.append(None)
        finally:
            self.kill()
        return codes

    def kill(self) -> None:
        """SIGKILL every rank still alive and reap it; safe to call twice."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def output(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')}" for log in self.logs if log.exists()
        )


def launch_ranks(module: str, args: list[str], world_size: int, events: Path, log_dir: Path, tag: str,
                 incarnation: int = 0) -> RankJob:  # fmt: skip
    """Start ``python -m module *args`` as ``world_size`` ranks writing their events to ``events``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAOSBENCH_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    job = RankJob([], [])
    try:
        for rank in range(world_size):
            rank_env = dict(env, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CHAOSBENCH_EVENTS=str(events),
                            CHAOSBENCH_INCARNATION=str(incarnation))  # fmt: skip
            log = log_dir / f"inc{incarnation}-{tag}-rank{rank}.log"
            job.logs.append(log)
            with log.open("wb") as out:
                job.procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=rank_env, cwd=REPO_ROOT,
                                                  stdout=out, stderr=subprocess.STDOUT))  # fmt: skip
    except BaseException:
        job.kill()
        raise
    return job
