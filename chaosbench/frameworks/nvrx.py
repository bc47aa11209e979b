"""The ``nvrx`` adapter: NVIDIA Resiliency Extension's ``ft_launcher`` (heartbeat and section hang detection).

``ft_launcher`` is torchrun's elastic agent plus one rank monitor per rank: each rank connects to its monitor
(``RankMonitorClient``) and sends heartbeats and opens/closes named sections; the monitor declares the rank hung
when a heartbeat or a section exceeds its timeout, kills it (``rank_termination_signal``, SIGKILL by default,
after a SIGCONT) and the launcher restarts the worker group. Measured here with nvidia-resiliency-ext 0.4.1 on
CPU/gloo (see docs/nvrx.md): it runs; the GPU/NIC health checks only log that NVML is missing.

The built-in workloads do not call ``RankMonitorClient``. Each rank is therefore started through a bridge
(``python -m chaosbench.frameworks.nvrx bridge -- <workload argv>``): a small parent process that connects to
the rank monitor, starts the real rank as its child (which dies with it) and turns the rank's own probe events
into the monitor's calls: ``rank_start`` opens nothing (the initial heartbeat timeout covers start-up and
checkpoint load), every ``step`` is a heartbeat and closes/reopens the ``step`` section, ``ckpt_save_begin`` /
``ckpt_save_end`` bracket a ``checkpoint`` section. A hung rank stops writing events, the bridge stops talking,
the monitor times out and kills the bridge (and with it the rank). The bridge exits as its child did. What this
adds is the bridge's event polling (``bridge_poll_s``) to every heartbeat: negligible against timeouts of seconds.

Detection events: the rank monitors' timeout lines (``Section 'step' has been open for ...``, ``Did not get
subsequent heartbeat``, ``FT timeout elapsed``), and as for torchrun the launcher's ``failed (exitcode ...)``;
its restart decision is ``Worker group FAILED|UNHEALTHY. N/M attempts left; will restart``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    LogPattern,
    LogWatcher,
    RunControl,
    base_versions,
    package_version,
)
from chaosbench.runtimes.base import ProcessSpec

NVRX_PATTERNS = [
    LogPattern("detect", r"Section '(?P<section>[^']+)' has been open for (?P<open_s>[\d.]+) seconds", "agent"),
    LogPattern("detect", r"Was out of section for (?P<open_s>[\d.]+) seconds", "agent"),
    LogPattern("detect", r"Did not get (?P<heartbeat>initial|subsequent) heartbeat\. Waited (?P<waited_s>[\d.]+)", "agent"),
    LogPattern("detect", r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)", "agent"),
    LogPattern(
        "restart",
        r"Worker group (?:FAILED|UNHEALTHY)\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left; will restart",
        "agent",
    ),
    LogPattern("give_up", r"ChildFailedError", "agent"),
]


def _opt(v: float | None) -> str:
    return "null" if v is None else str(v)


class NvrxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_restarts: int = Field(default=3, ge=0, description="ft_launcher --max-restarts")
    monitor_interval_s: float = Field(default=0.1, gt=0, description="ft_launcher --monitor-interval")
    workers_stop_timeout_s: float = Field(
        default=30.0, ge=0, description="--workers-stop-timeout: SIGTERM to SIGKILL when restarting ranks"
    )
    workload_check_interval_s: float = Field(default=1.0, gt=0, description="--ft-workload-check-interval")
    initial_rank_heartbeat_timeout_s: float = Field(
        default=120.0, gt=0, description="--ft-initial-rank-heartbeat-timeout (start-up + restore)"
    )
    rank_heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, description="--ft-rank-heartbeat-timeout (between steps)"
    )
    section_timeouts: dict[str, float | None] = Field(
        default_factory=dict, description="--ft-rank-section-timeouts, e.g. {step: 5, checkpoint: 60}"
    )
    out_of_section_timeout_s: float | None = Field(
        default=None, gt=0, description="--ft-rank-out-of-section-timeout (null: none; the CLI cannot say null)"
    )
    rank_termination_signal: str = Field(default="SIGKILL", description="--ft-rank-termination-signal")
    restart_policy: str = Field(default="any-failed", description="--ft-restart-policy (any-failed|min-healthy)")
    share_rdzv_tcp_store: bool = Field(default=True, description="false: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    bridge_poll_s: float = Field(default=0.02, gt=0, description="how often the bridge reads the rank's events")
    log_level: str = Field(default="INFO", description="LOGLEVEL of the launcher")
    extra_args: list[str] = Field(default_factory=list, description="more ft_launcher arguments, as is")
    teardown_grace_s: float = Field(default=5.0, ge=0)


class NvrxFramework(Framework):
    """nvidia-resiliency-ext ft_launcher with rank monitors; see the module docstring."""

    name: ClassVar[str] = "nvrx"
    Options = NvrxOptions  # type: ignore[assignment]

    def plan(self, job: JobContext) -> LaunchPlan:
        o: Any = self.options
        python = job.workload.argv(job)[0]
        endpoint = f"{job.runtime.master_addr}:{job.runtime.free_port()}"
        sections = ",".join(f"{k}:{_opt(v)}" for k, v in o.section_timeouts.items())
        procs = []
        for n in range(job.nodes):
            node = job.node_name(n)
            argv = [
                python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                "--nnodes", str(job.nodes),
                "--nproc-per-node", str(job.ranks_per_node),
                "--max-restarts", str(o.max_restarts),
                "--monitor-interval", str(o.monitor_interval_s),
                "--workers-stop-timeout", str(o.workers_stop_timeout_s),
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint,
                "--rdzv-id", job.run_id,
                "--ft-workload-check-interval", str(o.workload_check_interval_s),
                "--ft-initial-rank-heartbeat-timeout", str(o.initial_rank_heartbeat_timeout_s),
                "--ft-rank-heartbeat-timeout", str(o.rank_heartbeat_timeout_s),
                *(["--ft-rank-section-timeouts", sections] if sections else []),
                *(["--ft-rank-out-of-section-timeout", str(o.out_of_section_timeout_s)]
                  if o.out_of_section_timeout_s is not None else []),
                "--ft-rank-termination-signal", o.rank_termination_signal,
                "--ft-restart-policy", o.restart_policy,
                "--ft-enable-nic-monitor", "false",
                *o.extra_args,
                "--no-python",
                python, "-m", "chaosbench.frameworks.nvrx", "bridge", "--poll-s", str(o.bridge_poll_s), "--",
                *job.workload.argv(job),
            ]  # fmt: skip
            env = job.rank_env(0, node)
            env["LOGLEVEL"] = o.log_level
            if not o.share_rdzv_tcp_store:
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            name = "ft_launcher" if job.nodes == 1 else f"ft_launcher.{node}"
            procs.append(ProcessSpec(name=name, argv=argv, env=env, role="agent", node=node))
        return LaunchPlan(
            framework=self.label,
            adapter=self.name,
            processes=procs,
            patterns=list(NVRX_PATTERNS),
            timeouts=self.timeouts(job),
            versions=self.versions(),
            options=o.model_dump(),
            notes=[
                "each rank runs under a bridge that turns its step/checkpoint events into rank-monitor heartbeats "
                "and sections",
                "worker incarnation = CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT",
            ],
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o: Any = self.options
        t = super().timeouts(job)
        t.update(
            {
                "monitor_interval_s": o.monitor_interval_s,
                "workload_check_interval_s": o.workload_check_interval_s,
                "initial_rank_heartbeat_timeout_s": o.initial_rank_heartbeat_timeout_s,
                "rank_heartbeat_timeout_s": o.rank_heartbeat_timeout_s,
                "out_of_section_timeout_s": o.out_of_section_timeout_s,
                **{f"section_timeout_{k}_s": v for k, v in o.section_timeouts.items()},
                "workers_stop_timeout_s": o.workers_stop_timeout_s,
                "bridge_poll_s": o.bridge_poll_s,
                "teardown_grace_s": o.teardown_grace_s,
            }
        )
        return t

    def versions(self) -> dict[str, str | None]:
        v = base_versions()
        v["nvidia-resiliency-ext"] = package_version("nvidia-resiliency-ext")
        return v

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o: Any = self.options
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        agents = [control.runtime.start(p, on_line=watcher) for p in plan.processes]
        while True:
            codes = [a.poll() for a in agents]
            if all(c == 0 for c in codes):
                return JobResult("completed")
            if all(c is not None for c in codes):
                bad = [f"{a.name} exited with code {c}" for a, c in zip(agents, codes, strict=True) if c]
                return JobResult("failed", "; ".join(bad))
            stop = control.stop_reason()
            if stop:
                return JobResult(stop, f"harness stopped the run ({stop})")
            control.sleep(min(0.05, o.monitor_interval_s))


# ---------------------------------------------------------------------------------------------------------------
# The bridge: python -m chaosbench.frameworks.nvrx bridge [--poll-s S] -- <rank argv>

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _EventTail:
    """New lines of the run's events.jsonl that belong to one rank and incarnation."""

    def __init__(self, path: str, rank: int, incarnation: int) -> None:
        self.path = path
        self.rank = rank
        self.incarnation = incarnation
        self._pos = 0
        self._buf = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._pos += len(chunk)
        data = self._buf + chunk
        lines = data.split(b"\n")
        self._buf = lines.pop()
        out = []
        for raw in lines:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("src") == "rank" and ev.get("rank") == self.rank and ev.get("incarnation") == self.incarnation:
                out.append(ev)
        return out


def bridge(argv: list[str], poll_s: float) -> int:
    """Run ``argv`` as this rank's child and feed the rank monitor from its events; exit as the child did."""
    from chaosbench.probe import incarnation_from_env

    events_path = os.environ.get("CHAOSBENCH_EVENTS")
    rank = int(os.environ.get("RANK", "0"))
    tail = _EventTail(events_path, rank, incarnation_from_env()) if events_path else None
    tail_start = os.path.getsize(events_path) if events_path and os.path.exists(events_path) else 0
    if tail is not None:
        tail._pos = tail_start  # only what this incarnation writes from now on
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    # Imported after the child started: the import (torch included) overlaps the rank's own start-up.
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()

    def forward(sig: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    open_section: str | None = None

    def switch(section: str | None) -> None:
        nonlocal open_section
        if open_section is not None:
            client.end_section(open_section)
        if section is not None:
            client.start_section(section)
        open_section = section

    while child.poll() is None:
        time.sleep(poll_s)
        for ev in tail.read() if tail is not None else []:
            kind = ev.get("kind")
            if kind == "step":
                switch(None)
                client.send_heartbeat()
                switch("step")
            elif kind == "ckpt_save_begin":
                switch("checkpoint")
            elif kind == "ckpt_save_end":
                switch("step")
            elif kind == "train_end":
                switch(None)
    rc = child.returncode
    if rc == 0:
        switch(None)
        client.shutdown_workload_monitoring()
        return 0
    if rc < 0:  # die the way the child died, so the launcher reports the same exit
        died_by = -rc
        if died_by not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(died_by, signal.SIG_DFL)
        os.kill(os.getpid(), died_by)
        time.sleep(5)  # a signal that does not kill (e.g. ignored by default): fall through
    return rc if rc > 0 else 1


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaosbench.frameworks.nvrx")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bridge", help="run a rank under ft_launcher, heartbeats from its probe events")
    b.add_argument("--poll-s", type=float, default=0.02)
    b.add_argument("argv", nargs=argparse.REMAINDER)
    ns = p.parse_args(args)
    argv = list(ns.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        p.error("bridge: no rank command after --")
    return bridge(argv, ns.poll_s)


if __name__ == "__main__":
    sys.exit(main())
