"""What the tests share: the engine requirement (skip, or fail when ``CHAOSBENCH_REQUIRE`` names it), reading a
run's events, and launching a built-in program's ranks directly (without the runner)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chaosbench.timeline import Event, TimelineWriter, read_events

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


def path_without(tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH for the rest of the test: a folder of links to every program of the current PATH but ``tool``
    (skips when ``tool`` is not installed: its absence would prove nothing)."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in reversed(os.environ.get("PATH", "").split(os.pathsep)):
        for p in Path(d).glob("*") if Path(d).is_dir() else []:
            if p.name != tool and os.access(p, os.X_OK):
                (bin_dir / p.name).unlink(missing_ok=True)
                (bin_dir / p.name).symlink_to(p)
    monkeypatch.setenv("PATH", str(bin_dir))


def module_missing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """For the rest of the test, the Python package ``name`` is not installed: ``find_spec`` finds nothing and an
    import raises ImportError."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    monkeypatch.setitem(sys.modules, name, None)


def local_nodes_runtime() -> str:
    """The name of a runtime registered for tests: the local runtime declaring node control, so that a suite with a
    network fault loads without Docker. Its node methods refuse; a run reaches none of them when the fault's
    prepare fails first (its tool missing)."""
    from chaosbench.errors import Unsupported
    from chaosbench.registry import RUNTIMES
    from chaosbench.runtimes.local import LocalRuntime

    name = "test-local-nodes"
    if name in RUNTIMES.names():
        return name

    class LocalNodes(LocalRuntime):
        def _refuse(self, *args: object, **kwargs: object) -> None:
            raise Unsupported(f"{name} has no node control")

        node_names = pause_node = engine_event_ns = unpause_node = set_node_cpus = _refuse
        node_state = node_pid = node_ip = node_iface = _refuse

    LocalNodes.name = name
    RUNTIMES.register(name, LocalNodes)
    return name


def slurm_problem() -> str | None:
    """Why no Slurm cluster answers here (``sinfo`` fails or lists no partition), or None."""
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%a %D"], capture_output=True, text=True, timeout=15)
    except FileNotFoundError:
        return "sinfo not found (no Slurm client on this host)"
    except subprocess.TimeoutExpired:
        return "sinfo gave no answer within 15 s"
    if res.returncode != 0:
        return (res.stderr.strip() or f"sinfo exit code {res.returncode}").splitlines()[-1]
    if not res.stdout.strip():
        return "sinfo lists no partition"
    return None


def serve_problem() -> str | None:
    """Why the serving tests cannot run here (no haproxy, or the ``serve`` extra missing), or None."""
    if shutil.which("haproxy") is None:
        return "haproxy not found (apt-get install -y haproxy)"
    # found, not imported: importing locust monkey-patches this process with gevent
    missing = [m for m in ("locust", "uvicorn", "starlette") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[serve]')"
    return None


# the module a framework's engine is, and how to install it
ENGINE_MODULES = {
    "torchft": ("torchft", "pip install --no-deps torchft==0.2.0 and its opentelemetry deps"),
    "nvrx": ("nvidia_resiliency_ext.fault_tolerance", "pip install -e '.[nvrx]'"),
    "ray": ("ray.train.torch", "pip install -e '.[ray]'"),
}


def engine_problem(engine: str) -> str | None:
    """Why ``engine`` (a key of :data:`ENGINE_MODULES`) cannot be imported here, or None."""
    module, install = ENGINE_MODULES[engine]
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
        return f"{module} not importable ({exc}); {install}"
    return None


def require_engines(*engines: str) -> None:
    """:func:`require` for each framework engine named (keys of :data:`ENGINE_MODULES`)."""
    for engine in engines:
        require(engine, engine_problem(engine))


def run_suite_text(text: str, out: Path, name: str = "test.yaml") -> dict[str, Any]:
    """Run a suite given as YAML text into ``out``, checking that no run left a process behind; returns
    {scenario id: RunMetrics} (one repeat each)."""
    from chaosbench.analysis.results import collect
    from chaosbench.runner import Runner
    from tests.conftest import make_suite

    runner = Runner(make_suite(text, name), out)
    for rec in runner.run():
        assert rec.leftovers == [], f"{rec.scenario.id}: processes left running: {rec.leftovers}"
    return {m.scenario: m for m in collect(runner.suite_dir)}


def events_of(m: Any) -> list[Event]:
    """The timeline of a run, from its metrics' ``run_dir``."""
    assert m.run_dir is not None
    return read_events(Path(m.run_dir) / "events.jsonl")


#: The events that say why a run went as it did (an assertion's message shows them: a CI failure explains itself).
_STORY_KINDS = (
    "fault_inject",
    "detect",
    "restart",
    "rank_error",
    "proc_error",
    "rank_exit",
    "proc_exit",
    "ckpt_save_begin",
    "ckpt_save_end",
    "ckpt_load_end",
    "train_end",
    "run_end",
)


def story(m: Any, limit: int = 60) -> str:
    """``m``'s verdict and the timeline events that explain it (faults, detections, restarts, errors, exits,
    checkpoints), one line each with seconds since the run began: the message of an assertion on a run."""
    try:
        ev = events_of(m)
    except (AssertionError, OSError) as e:
        return f"{m.verdict} (no timeline: {e})"
    t0 = ev[0].t_ns if ev else 0
    lines = [
        f"{(e.t_ns - t0) / 1e9:8.2f} {e.src}/{e.kind} "
        + " ".join(
            f"{k}={str(v)[:120]}" for k, v in e.data.items() if k not in ("host", "pid_ticks", "output_stamp")
        )
        for e in ev
        if e.kind in _STORY_KINDS
    ]
    cut = [f"... {len(lines) - limit} more"] if len(lines) > limit else []
    return "\n".join([f"verdict: {m.verdict}", *lines[:limit], *cut])


def kinds(events: list[Event], kind: str, **match: Any) -> list[Event]:
    """The events of ``kind`` whose fields equal ``match``."""
    return [e for e in events if e.kind == kind and all(e.get(k) == v for k, v in match.items())]


def exit_stamp_here() -> str:
    """How this host's harness stamps a process's exit: ``kernel`` where it may listen to the proc connector (root
    on the host), else ``pidfd`` (the poller's wake-up)."""
    from chaosbench.runtimes.proc_events import open_listener

    listener = open_listener()
    if listener is None:
        return "pidfd"
    listener.close()
    return "kernel"


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


def launch_ranks(
    module: str, args: list[str], world_size: int, events: Path, log_dir: Path, tag: str, incarnation: int = 0
) -> RankJob:
    """Start ``python -m module *args`` as ``world_size`` ranks writing their events to ``events``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAOSBENCH_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    job = RankJob([], [])
    try:
        for rank in range(world_size):
            rank_env = dict(
                env,
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                CHAOSBENCH_EVENTS=str(events),
                CHAOSBENCH_INCARNATION=str(incarnation),
            )
            log = log_dir / f"inc{incarnation}-{tag}-rank{rank}.log"
            job.logs.append(log)
            with log.open("wb") as out:
                job.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, *args],
                        env=rank_env,
                        cwd=REPO_ROOT,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
    except BaseException:
        job.kill()
        raise
    return job


def of_kind(events: list[Event], kind: str, incarnation: int | None = None) -> list[Event]:
    """The events of ``kind`` (of one incarnation, when given)."""
    return [
        e for e in events if e.kind == kind and (incarnation is None or e.get("incarnation") == incarnation)
    ]


@dataclass
class Baseline:
    """An uninterrupted run of a checkpointing program: its final digest, checkpoints, events and ranks."""

    digest: str
    ckpt_dir: Path
    events: list[Event]
    job: RankJob


@dataclass
class CheckpointingProgram:
    """A built-in checkpointing program (ddp-mlp, fsdp-lm) run directly as ranks: the launch, a run to the end,
    its final digest, a kill mid-run and a resume."""

    module: str
    base_args: list[str]
    steps: int
    ckpt_every: int
    timeout_s: float
    world_size: int = 2

    def launch(self, tmp: Path, ckpt_dir: Path, events: Path, *extra: str, incarnation: int = 0) -> RankJob:
        args = [*self.base_args, "--ckpt-dir", str(ckpt_dir), "--steps", str(self.steps)]
        args += ["--checkpoint-every", str(self.ckpt_every), "--pg-timeout-s", "60", *extra]
        return launch_ranks(self.module, args, self.world_size, events, tmp, ckpt_dir.name, incarnation)

    def run_to_end(
        self, tmp: Path, ckpt_dir: Path, events: Path, *extra: str, incarnation: int = 0
    ) -> RankJob:
        job = self.launch(tmp, ckpt_dir, events, *extra, incarnation=incarnation)
        try:
            codes = job.wait(self.timeout_s)
        finally:
            job.kill()
        assert codes == [0] * self.world_size, job.output()
        return job

    def final_digest(self, events: list[Event], incarnation: int = 0) -> str:
        """The digest every rank reports at the last step (asserting they agree and all got there)."""
        ends = of_kind(events, "train_end", incarnation)
        assert sorted(e["rank"] for e in ends) == list(range(self.world_size))
        digests = {e["digest"] for e in ends}
        assert len(digests) == 1, f"ranks disagree on the final parameters: {digests}"
        assert all(e["step"] == self.steps for e in ends)
        return digests.pop()

    def baseline(self, tmp: Path) -> Baseline:
        """An uninterrupted run in ``tmp``."""
        job = self.run_to_end(tmp, tmp / "ckpt", tmp / "events.jsonl")
        events = read_events(tmp / "events.jsonl")
        return Baseline(self.final_digest(events), tmp / "ckpt", events, job)

    def kill_at(self, tmp: Path, kill_step: int, step_sleep_s: float) -> None:
        """Run in ``tmp`` until some rank reports ``kill_step``, SIGKILL rank 1, give rank 0 five seconds to
        fail on its next collective, then kill it; the run must have ended before its next checkpoint."""
        events_path = tmp / "events.jsonl"
        job = self.launch(tmp, tmp / "ckpt", events_path, "--step-sleep-s", str(step_sleep_s))
        try:
            deadline = time.monotonic() + self.timeout_s
            while not any(e["step"] >= kill_step for e in of_kind(read_events(events_path), "step")):
                assert time.monotonic() < deadline, f"step {kill_step} never appeared\n" + job.output()
                assert all(p.poll() is None for p in job.procs), "a rank exited early\n" + job.output()
                time.sleep(0.01)
            job.procs[1].send_signal(signal.SIGKILL)
            assert job.procs[1].wait(timeout=10) == -signal.SIGKILL
            try:
                job.procs[0].wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            job.kill()
        events = read_events(events_path)
        assert of_kind(events, "train_end") == []
        next_ckpt = (kill_step // self.ckpt_every + 1) * self.ckpt_every
        assert max(e["step"] for e in of_kind(events, "step")) < next_ckpt

    def assert_resumed_exactly(self, tmp: Path, baseline: Baseline, from_step: int) -> None:
        """Resume the run in ``tmp`` as incarnation 1: every rank loads ``from_step``, trains the rest, and
        ends bit-identical to ``baseline``."""
        self.run_to_end(tmp, tmp / "ckpt", tmp / "events.jsonl", incarnation=1)
        events = read_events(tmp / "events.jsonl")
        loads = of_kind(events, "ckpt_load_begin", incarnation=1)
        assert sorted((e["rank"], e["step"]) for e in loads) == [
            (r, from_step) for r in range(self.world_size)
        ]
        assert len(of_kind(events, "ckpt_load_end", incarnation=1)) == self.world_size
        for rank in range(self.world_size):
            steps = [e["step"] for e in of_kind(events, "step", incarnation=1) if e["rank"] == rank]
            assert steps == list(range(from_step + 1, self.steps + 1))
        assert self.final_digest(events, incarnation=1) == baseline.digest


#: The first error line of a TorchFT Lighthouse started in a damaged environment (seen by hand, issue 27).
OTLP = "ModuleNotFoundError: No module named 'opentelemetry.exporter.otlp.proto.common'"


def write_lighthouse_died_control(run_dir: Path, t0: int) -> list[Event]:
    """A TorchFT control run whose Lighthouse exited 1 at start-up with :data:`OTLP`, written as a timeline into
    ``run_dir`` (created) from ``t0``; returns its events as read back."""
    run_dir.mkdir(parents=True)
    with TimelineWriter(run_dir / "events.jsonl") as tl:
        tl.emit(
            "run_start",
            t_ns=t0,
            suite="broken",
            scenario="torchft/control",
            framework="torchft",
            repeat=0,
            control=True,
        )
        tl.emit("proc_start", t_ns=t0 + 10**7, proc="lighthouse", pid=4000, role="lighthouse")
        tl.emit(
            "proc_error",
            t_ns=t0 + 4 * 10**8,
            proc="lighthouse",
            pid=4000,
            role="lighthouse",
            stream="stderr",
            line=OTLP,
        )
        tl.emit(
            "proc_exit", t_ns=t0 + 4 * 10**8, proc="lighthouse", pid=4000, returncode=1, role="lighthouse"
        )
        tl.emit("teardown_begin", t_ns=t0 + 5 * 10**8, reason="end")
        tl.emit("run_end", t_ns=t0 + 6 * 10**8, outcome="failed")
    return read_events(run_dir / "events.jsonl")
