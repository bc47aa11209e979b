"""``straggler``: slow one rank down for a window. cgroup v1 CPU quota where the cpu controller is mounted
and writable, else a SIGSTOP/SIGCONT duty cycle. One slow rank gates every collective of the job."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError, MissingEngine
from chaosbench.injectors.base import FaultContext, Injector, RunSetup

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def cgroup_v1_cpu_available(root: Path = CPU_ROOT) -> bool:
    return (root / "cgroup.procs").exists() and os.access(root, os.W_OK)


def _current_cpu_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return "/"


class StragglerParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu_fraction: float = Field(default=0.1, gt=0, lt=1, description="share of one CPU the rank keeps")
    duration_s: float | None = Field(
        default=None, gt=0, description="window length; null: until the run ends"
    )
    method: Literal["auto", "cgroup", "duty-cycle"] = Field(default="auto", description="how to slow it down")
    period_s: float = Field(default=0.1, gt=0, description="duty-cycle period (duty-cycle method)")


class StragglerInjector(Injector[StragglerParams]):
    """Slows the target ranks to ``cpu_fraction`` of a CPU for ``duration_s``."""

    name: ClassVar[str] = "straggler"
    summary: ClassVar[str] = (
        "slow a rank down (cgroup CPU quota, else SIGSTOP/SIGCONT duty cycle) for a window"
    )

    @classmethod
    def cleanup_crashed(cls, results_dir: Path, run_ids: dict[str, Path]) -> list[str]:
        """Remove the cgroups named after a crashed run (``chaosbench/<run id>.<firing>.r<rank>``)."""
        actions = []
        for run_id, run_dir in run_ids.items():
            for group in (CPU_ROOT / "chaosbench").glob(f"{run_id}.*"):
                actions.append(f"remove cgroup {group} of {run_dir}")
                with contextlib.suppress(OSError):
                    group.rmdir()
        return actions

    def prepare(self, setup: RunSetup) -> None:
        self._setup = setup
        self._groups: list[Path] = []

    def _method(self) -> str:
        m: str = self.params.method
        if m == "auto":
            return "cgroup" if cgroup_v1_cpu_available() else "duty-cycle"
        if m == "cgroup" and not cgroup_v1_cpu_available():
            raise MissingEngine(f"cgroup v1 cpu controller not writable at {CPU_ROOT}")
        return m

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        p = self.params
        method = self._method()
        for t in ctx.targets:
            if t.pid is None or not procutil.alive(t.pid, t.pid_ticks):
                raise ProcessLookupError(f"rank {t.rank} has no live process")
        if method == "cgroup":
            moved = []
            for t in ctx.targets:
                assert t.pid is not None
                group = CPU_ROOT / "chaosbench" / f"{ctx.setup.run_id}.{ctx.index}.r{t.rank}"
                group.mkdir(parents=True, exist_ok=True)
                self._groups.append(group)
                (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(p.cpu_fraction * PERIOD_US))))
                original = _current_cpu_cgroup(t.pid)
                (group / "cgroup.procs").write_text(str(t.pid))
                moved.append((t.pid, t.pid_ticks, original, group))
            ctx.state["cgroup"] = moved
        else:
            stop = threading.Event()
            pids = [(t.pid, t.pid_ticks, t.node) for t in ctx.targets]
            thread = threading.Thread(target=self._duty_cycle, args=(ctx, pids, stop), daemon=True)
            thread.start()
            ctx.state["duty"] = (stop, thread, pids)
        return {"method": method, "cpu_fraction": p.cpu_fraction}

    def _duty_cycle(
        self, ctx: FaultContext, pids: list[tuple[int, int | None, str]], stop: threading.Event
    ) -> None:
        p = self.params
        on, off = p.period_s * p.cpu_fraction, p.period_s * (1 - p.cpu_fraction)
        while not stop.is_set():
            for pid, ticks, node in pids:
                with contextlib.suppress(ProcessLookupError, ChaosbenchError):
                    ctx.runtime.signal_pid(pid, signal.SIGSTOP, ticks, node)
            stopped = stop.wait(off)
            for pid, ticks, node in pids:
                with contextlib.suppress(ProcessLookupError, ChaosbenchError):
                    ctx.runtime.signal_pid(pid, signal.SIGCONT, ticks, node)
            if stopped:
                return
            stop.wait(on)

    def revert(self, ctx: FaultContext) -> bool:
        undone = False
        for pid, ticks, original, group in ctx.state.pop("cgroup", []):
            if procutil.alive(pid, ticks):
                with contextlib.suppress(OSError):
                    (CPU_ROOT / original.lstrip("/") / "cgroup.procs").write_text(str(pid))
                    undone = True
            with contextlib.suppress(OSError):
                group.rmdir()
        duty = ctx.state.pop("duty", None)
        if duty is not None:
            stop, thread, pids = duty
            stop.set()
            thread.join(timeout=5)
            undone = True
        return undone

    def cleanup(self) -> None:
        """Remove this run's cgroups (their processes are gone by now)."""
        setup = getattr(self, "_setup", None)
        if setup is None:
            return
        parent = CPU_ROOT / "chaosbench"
        for group in list(getattr(self, "_groups", [])) + list(parent.glob(f"{setup.run_id}.*")):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            if parent.exists() and not any(parent.iterdir()):
                parent.rmdir()
