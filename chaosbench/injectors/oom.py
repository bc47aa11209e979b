"""``oom``: the target ranks run out of memory at step N (once per run). Before launch the harness makes a memory
cgroup of its own for the fault (cgroup v1 ``memory``, or v2 with the memory controller) limited to ``limit_mb``;
at ``at_step`` the rank moves itself into it and allocates until the kernel's OOM killer ends it (SIGKILL), as a
leak or an outsized batch ends a real rank. Memory the rank held before stays charged where it was, so the limit
is the headroom of new memory it may take. Where no memory cgroup can be made, the fault is skipped with the
reason (a ``fault_skipped`` event), never let loose on the machine's own memory.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.injectors.base import PlantedInjector, RunSetup
from chaosbench.runtimes.base import Runtime

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
#: The folder below the memory hierarchy's root that holds chaosbench's cgroups: ``<run id>.<fault>``.
GROUP_DIR = "chaosbench"


class OomParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(
        ge=1, description="the rank starts to grow before computing this step (once per run)"
    )
    limit_mb: int = Field(
        default=256, ge=16, description="new memory the rank may take before the OOM killer"
    )


def memory_root() -> tuple[Path, str] | str:
    """(root of the memory hierarchy, ``v1`` or ``v2``), or why there is none to use."""
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        return (V1_ROOT, "v1") if _writable(V1_ROOT) else f"{V1_ROOT} is not writable"
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists():
        if "memory" not in controllers.read_text().split():
            return "the cgroup v2 hierarchy has no memory controller"
        return (V2_ROOT, "v2") if _writable(V2_ROOT) else f"{V2_ROOT} is not writable"
    return "no cgroup memory controller is mounted"


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


def _enable_v2(group: Path) -> None:
    """cgroup v2: the memory controller enabled for the children of ``group``."""
    control = group / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def make_group(name: str, limit_mb: int) -> Path:
    """A memory cgroup ``chaosbench/<name>`` limited to ``limit_mb`` (swap included where the kernel counts it)."""
    found = memory_root()
    if isinstance(found, str):
        raise OSError(found)
    root, version = found
    parent = root / GROUP_DIR
    if version == "v2":
        _enable_v2(root)
    parent.mkdir(exist_ok=True)
    if version == "v2":
        _enable_v2(parent)
    group = parent / name
    group.mkdir(exist_ok=True)
    limit = str(limit_mb << 20)
    if version == "v1":
        (group / "memory.limit_in_bytes").write_text(limit)
        with contextlib.suppress(OSError):  # memsw exists only with swap accounting on
            (group / "memory.memsw.limit_in_bytes").write_text(limit)
    else:
        (group / "memory.max").write_text(limit)
        with contextlib.suppress(OSError):
            (group / "memory.swap.max").write_text("0")
    return group


def oom_kills(group: Path) -> int | None:
    """How many processes the kernel's OOM killer ended in ``group`` (None: it does not say)."""
    for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
        with contextlib.suppress(OSError, ValueError):
            for line in (group / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
    return None


class OomInjector(PlantedInjector[OomParams]):
    """A rank runs out of memory: it grows inside a memory cgroup of ``limit_mb`` until the kernel kills it."""

    name: ClassVar[str] = "oom"
    failure_mode = "crash"
    fault_class = "crash"
    summary: ClassVar[str] = "a rank grows inside a memory cgroup until the kernel's OOM killer ends it"

    @classmethod
    def check_runtime(cls, runtime: type[Runtime], params: OomParams) -> str | None:
        if not runtime.ranks_on_harness_host:
            return f"oom needs ranks on the harness's own host, where it makes the memory cgroup (the local runtime), not '{runtime.name}'"
        return None

    def prepare(self, setup: RunSetup) -> None:
        self._group: Path | None = None
        self._setup = setup
        p = self.params
        try:
            self._group = make_group(f"{setup.run_id}.{self.fault_name}", p.limit_mb)
        except OSError as exc:
            setup.timeline.emit(
                "fault_skipped",
                src="injector",
                fault=self.fault_name,
                injector=self.name,
                reason=f"no memory cgroup for the fault: {exc}",
            )
            return
        setup.plant(
            self.name,
            self.fault_name,
            at_step=p.at_step,
            declared=self.declared(),
            limit_mb=p.limit_mb,
            cgroup=str(self._group),
        )

    def cleanup(self) -> None:
        group, self._group = getattr(self, "_group", None), None
        if group is None:
            return
        kills = oom_kills(group)
        if kills is not None:
            self._setup.timeline.emit(
                "log",
                src="injector",
                fault=self.fault_name,
                line=f"oom: the kernel's OOM killer ended {kills} process(es) in {group}",
            )
        with contextlib.suppress(OSError):
            group.rmdir()

    @classmethod
    def cleanup_crashed(cls, results_dir: Path, run_ids: dict[str, Path]) -> list[str]:
        """Remove the memory cgroups named after a crashed run (``chaosbench/<run id>.<fault>``)."""
        found = memory_root()
        if isinstance(found, str):
            return []
        actions = []
        for run_id, run_dir in run_ids.items():
            for group in (found[0] / GROUP_DIR).glob(f"{run_id}.*"):
                actions.append(f"remove cgroup {group} of {run_dir}")
                with contextlib.suppress(OSError):
                    group.rmdir()
        return actions
