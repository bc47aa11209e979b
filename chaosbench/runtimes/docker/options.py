"""The ``docker`` runtime's options (``defaults.runtime_options``) and how it loses a node (``node-kill``)."""

from __future__ import annotations

import signal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.runtimes.capture import OutputCapture


def _memory(v: Any) -> Any:
    if v is None or isinstance(v, int):
        return v
    s = str(v).strip().lower()
    if not s or not (s[:-1] if s[-1] in "bkmg" else s).replace(".", "", 1).isdigit():
        raise ValueError(f"memory {v!r}: give bytes or a number with b, k, m or g (e.g. 2g)")
    return s


class DockerOptions(BaseModel):
    """Options of the ``docker`` runtime (``defaults.runtime_options`` in a suite)."""

    model_config = ConfigDict(extra="forbid")
    image: str | None = Field(
        default=None,
        description="node image; null: the built-in local image (built automatically if missing)",
    )
    python: str | None = Field(
        default=None,
        description="interpreter inside a user's image: replaces the harness's own sys.executable in argv",
    )
    cpus_per_node: float | None = Field(default=None, gt=0, description="CPU limit of each node container")
    cpuset: str | None = Field(
        default=None,
        pattern=r"^[0-9]+([-,][0-9]+)*$",
        description="host CPUs the node containers may run on, e.g. '0-3' (chaosbench run --jobs gives each "
        "concurrent run its own)",
    )
    memory_per_node: str | int | None = Field(default=None, description="memory limit of each node (e.g. 4g)")
    spare_nodes: int = Field(default=0, ge=0, description="hot spare containers started with the nodes")
    lost_node: Literal["reboot", "spare", "none"] = Field(
        default="reboot", description="what brings a lost node back when it is needed: reboot, spare or none"
    )
    reboot_delay_s: float = Field(default=0.0, ge=0, description="delay before a lost node is started again")
    rerun_roles: list[str] = Field(
        default_factory=lambda: ["agent"], description="roles run again when their node comes back"
    )
    network_prefix: str = Field(default="chaosbench", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    mounts: list[str] = Field(default_factory=list, description="extra bind mounts, 'SRC:DST[:ro|rw]'")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of every process")
    node_wait_s: float = Field(default=120.0, gt=0, description="longest wait for a paused or booting node")
    output_capture: OutputCapture = Field(
        default="socket",
        description="socket: each output line stamped by the kernel when the process wrote it (its stdout and "
        "stderr are the harness's sockets, handed into the container; one write(2) is limited to ~4 MiB); pipe: "
        "the exec's own stream, lines stamped when the harness reads them",
    )

    @field_validator("memory_per_node", mode="before")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        return _memory(v)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if (
                len(parts) not in (2, 3)
                or not parts[0].startswith("/")
                or not parts[1].startswith("/")
                or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
            ):
                raise ValueError(f"mount {m!r}: give SRC:DST or SRC:DST:ro|rw with absolute paths")
        return v


class DockerNodeLossOptions(BaseModel):
    """How the docker runtime loses a node (``node-kill``): its container is killed with ``signal``."""

    model_config = ConfigDict(extra="forbid")
    signal: str = Field(default="SIGKILL", description="signal docker sends to the node's container")

    @field_validator("signal")
    @classmethod
    def _known(cls, v: str) -> str:
        name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {v!r}")
        return name
