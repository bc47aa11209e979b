"""Shared by the docker tests: engine check (skip, or fail when CHAOSBENCH_REQUIRE names docker), plugin
registration (works before and after the registry lists the docker plugins), timeline helpers."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from chaosbench.timeline import Event
from tests.helpers import events_of, kinds, require

__all__ = ["events_of", "kinds", "register_plugins", "require_docker", "run_objects", "step_interval_ms"]


def require_docker(tools: tuple[str, ...] = ()) -> None:
    """Module-level: skip when no Docker engine answers (or a host tool is missing); fail instead when
    ``CHAOSBENCH_REQUIRE`` contains ``docker``."""
    reason = None
    try:
        from chaosbench.runtimes.docker.image import connect

        connect(timeout_s=10).close()
    except Exception as exc:  # noqa: BLE001 - any reason the engine is unusable
        reason = str(exc).splitlines()[0]
    missing = [t for t in tools if shutil.which(t) is None]
    if reason is None and missing:
        reason = f"missing host tools: {', '.join(missing)}"
    require("docker", reason)


def register_plugins() -> None:
    """Register the test variants of the docker runtime (``docker-spare``: a hot spare replaces a lost node)."""
    from chaosbench.registry import RUNTIMES
    from chaosbench.runtimes.docker import DockerRuntime

    variants: dict[str, dict[str, Any]] = {
        "docker-spare": {"spare_nodes": 1, "lost_node": "spare"},
    }
    for name, opts in variants.items():
        if name not in RUNTIMES.names():
            RUNTIMES.register(name, type(name.replace("-", "_"), (DockerRuntime,), {"default_options": opts}))


def run_objects(run_dir: str | Path) -> list[str]:
    """Containers and networks labelled with the run id of ``run_dir`` that still exist."""
    import json

    from chaosbench.runtimes.docker.image import connect

    run_id = json.loads((Path(run_dir) / "config.json").read_text())["run_id"]
    client = connect()
    try:
        flt = {"label": f"chaosbench.run={run_id}"}
        out = [
            f"container {c.name}" for c in client.containers.list(all=True, filters=flt, ignore_removed=True)
        ]
        return out + [f"network {n.name}" for n in client.networks.list(filters=flt)]
    finally:
        client.close()


def step_interval_ms(events: list[Event], lo_ns: int, hi_ns: int, rank: int = 0) -> float | None:
    """Median interval between consecutive steps of ``rank`` completed in [lo, hi], in ms."""
    steps = [e for e in events if e.kind == "step" and e.get("rank") == rank and lo_ns <= e.t_ns <= hi_ns]
    gaps = [
        (b.t_ns - a.t_ns) / 1e6
        for a, b in zip(steps, steps[1:], strict=False)
        if b.get("step") == a.get("step") + 1
    ]
    return statistics.median(gaps) if gaps else None
