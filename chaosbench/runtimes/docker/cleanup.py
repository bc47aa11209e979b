"""``chaosbench cleanup`` for the docker runtime: what a crashed harness left on the engine."""

from __future__ import annotations

import contextlib
import os
import shutil

from chaosbench.errors import ChaosbenchError
from chaosbench.runtimes.docker.nodes import CAPTURE_DIR_LABEL, RUN_LABEL
from chaosbench.runtimes.docker.output import CAPTURE_DIR_PREFIX, CAPTURE_RECORD, NODE_DIR
from chaosbench.timeline.reader import crashed_run_ids


def remove_run_objects(results_dir: str | os.PathLike[str], dry_run: bool = False) -> list[str]:
    """``chaosbench cleanup`` for docker: remove the containers and networks labelled with the run id of a
    crashed run below ``results_dir`` (and only those; qdiscs and iptables rules live in the containers'
    network namespaces and go with them), and the output handover's host directory that their containers mounted
    or their network names (:data:`~chaosbench.runtimes.docker.nodes.CAPTURE_DIR_LABEL`). Returns one line per
    action; nothing when no engine answers."""
    runs = crashed_run_ids(results_dir)
    if not runs:
        return []
    try:
        from chaosbench.runtimes.docker.image import connect

        client = connect(timeout_s=10)
    except ChaosbenchError:
        return []
    import docker.errors

    actions: list[str] = []
    for run_id, run_dir in runs.items():
        flt = {"label": f"{RUN_LABEL}={run_id}"}
        capture_dirs: set[str] = set()
        with contextlib.suppress(OSError):  # named before it was made: found even when nothing else names it
            capture_dirs.add((run_dir / CAPTURE_RECORD).read_text().strip())
        networks = client.networks.list(filters=flt)
        capture_dirs |= {(n.attrs.get("Labels") or {}).get(CAPTURE_DIR_LABEL) or "" for n in networks}
        for c in client.containers.list(all=True, filters=flt, ignore_removed=True):
            capture_dirs |= {
                m.get("Source", "") for m in c.attrs.get("Mounts") or [] if m.get("Destination") == NODE_DIR
            }
            actions.append(f"remove container {c.name} of {run_dir}")
            if not dry_run:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    if c.status == "paused":
                        c.unpause()
                    c.remove(force=True, v=True)
        # the output handover's host directory, known from the run's own containers' mounts and network's label:
        # only a directory the handover makes (absolute, its prefix, not a link) and only while it is there
        for d in sorted(capture_dirs):
            if not (
                os.path.isabs(d)
                and os.path.basename(d).startswith(CAPTURE_DIR_PREFIX)
                and os.path.isdir(d)
                and not os.path.islink(d)
            ):
                continue
            actions.append(f"remove capture directory {d} of {run_dir}")
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
        for n in networks:
            actions.append(f"remove network {n.name} of {run_dir}")
            if not dry_run:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    n.remove()
    client.close()
    return actions
