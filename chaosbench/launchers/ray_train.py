"""The Ray Train driver of the ``ray-train`` adapter, and the training function its workers run:

    python -m chaosbench.launchers.ray_train --config '<JSON>'

The driver connects to the Ray cluster the adapter started (``ray.init(address=...)``), waits until every node
has joined, and runs a ``TorchTrainer`` (``ScalingConfig(num_workers, use_gpu=False)``, ``TorchConfig(backend=
"gloo", timeout_s)``, ``RunConfig(name, storage_path, failure_config=FailureConfig(max_failures))``) to its end.
It exits 0 when ``fit()`` returned, 3 when Ray Train gave up (``TrainingFailedError``), 4 when the cluster never
came up. Its own lines (``DRIVER_*``) and Ray's (the controller's and the workers', which Ray forwards to the
driver's output) are what the adapter watches.

Each Ray Train worker runs :func:`train_loop`: it numbers the worker group's start (the incarnation: rank 0
counts the starts in a file of the run and broadcasts the count over the process group Ray made), then runs the
workload in one of two ways:

- ``in-process`` (a built-in program whose checkpoints go through the training skeleton, ``bridged_checkpoints``):
  the program's ``main`` runs in the worker itself, in the process group Ray made, with a :class:`RayCheckpoints`
  bridge: every complete checkpoint is reported with ``ray.train.report`` (rank 0 reports the directory, written in
  Ray's own run directory under the storage path, with ``CheckpointUploadMode.NO_UPLOAD``: nothing is copied), and
  at start the program resumes from ``ray.train.get_checkpoint()``, the checkpoint Ray hands a restarted worker
  group, or from scratch when Ray has none. The worker process is the rank (its pid in ``rank_start``).
- ``subprocess`` (any other workload, e.g. ``command``): the workload's command line runs as a child of the worker
  with the torch.distributed variables of the worker's rank and a rendezvous port of its own (rank 0 picks it);
  the child dies with the worker (PR_SET_PDEATHSIG) and its failure (a non-zero exit) fails the worker. Ray's
  checkpoints are not used: the script resumes from its own.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: The driver's own lines, watched by the adapter.
DRIVER_CLUSTER_UP = "chaosbench ray driver: cluster up"
DRIVER_GAVE_UP = "chaosbench ray driver: Ray Train gave up"
DRIVER_FINISHED = "chaosbench ray driver: Ray Train finished"

#: Exit codes of the driver (not 1: an uncaught exception's).
EXIT_GAVE_UP = 3
EXIT_NO_CLUSTER = 4

_PR_SET_PDEATHSIG = 1


def next_attempt(path: Path) -> int:
    """The number of worker-group starts recorded in ``path`` before this one (0 for the first), recording this
    one (the file is replaced atomically)."""
    try:
        done = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        done = 0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(done + 1))
    os.replace(tmp, path)
    return done


class RayCheckpoints:
    """The :class:`~chaosbench.workloads.skeleton.CheckpointBridge` of a Ray Train worker: a complete checkpoint
    is reported with ``ray.train.report`` (every rank calls it, as Ray requires; rank 0 passes the directory,
    already in Ray's run directory, with ``NO_UPLOAD``); a start resumes from ``ray.train.get_checkpoint()``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def saved(self, step: int, path: Path) -> None:
        import ray.train
        from ray.train import Checkpoint, CheckpointUploadMode

        checkpoint = Checkpoint(str(path)) if self.rank == 0 else None
        ray.train.report(
            {"step": step}, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD
        )

    def restore_from(self) -> Path | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        print(f"ray train: restoring from checkpoint {checkpoint.path}", flush=True)
        return Path(checkpoint.path)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((os.environ.get("MASTER_ADDR", "127.0.0.1"), 0))
        return int(s.getsockname()[1])


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: number the worker group's start, then run the workload (module docstring).
    Raises when the workload fails, which fails the worker group."""
    import ray.train
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    box: list[Any] = [None, None]
    if rank == 0:
        box[0] = next_attempt(Path(config["attempts_file"]))
        box[1] = _free_port() if config["mode"] == "subprocess" else None
    dist.broadcast_object_list(box, src=0)
    os.environ["CHAOSBENCH_INCARNATION"] = str(box[0])
    argv: list[str] = list(config["argv"])
    if config["mode"] == "in-process":
        from chaosbench.workloads.skeleton import use_checkpoint_bridge

        use_checkpoint_bridge(RayCheckpoints(rank))
        program = importlib.import_module(argv[2])  # argv: python -m <program> <args>
        code = program.main(argv[3:])
        if code:
            raise RuntimeError(f"{argv[2]} exited with code {code}")
        return
    env = dict(os.environ, MASTER_PORT=str(box[1]))
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    code = proc.wait()
    if code:
        raise RuntimeError(f"the workload's process exited with code {code}")


def _wait_for_nodes(ray: Any, nodes: int, cpus: float, timeout_s: float) -> tuple[int, float] | None:
    """Wait until ``nodes`` nodes are alive with ``cpus`` CPUs in all; (nodes, cpus) then, None after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        total = sum(float(n.get("Resources", {}).get("CPU", 0)) for n in alive)
        if len(alive) >= nodes and total >= cpus:
            return len(alive), total
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaosbench.launchers.ray_train")
    ap.add_argument("--config", required=True, help="JSON object: the run (written by the ray-train adapter)")
    cfg = json.loads(ap.parse_args(argv).config)

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address=cfg["address"], log_to_driver=True)
    up = _wait_for_nodes(ray, cfg["nodes"], cfg["cpus"], cfg["cluster_start_timeout_s"])
    if up is None:
        print(
            f"chaosbench ray driver: the cluster did not reach {cfg['nodes']} nodes and {cfg['cpus']:g} CPUs "
            f"within {cfg['cluster_start_timeout_s']:g} s",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_NO_CLUSTER
    print(f"{DRIVER_CLUSTER_UP}: {up[0]} nodes, {up[1]:g} CPUs", flush=True)
    # an int, or (min, max) for an elastic worker group: Ray Train v2 takes the tuple where its annotation says int
    workers: Any = tuple(cfg["num_workers"]) if isinstance(cfg["num_workers"], list) else cfg["num_workers"]
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=cfg["loop"],
        scaling_config=ScalingConfig(
            num_workers=workers, use_gpu=False, placement_strategy=cfg["placement_strategy"]
        ),
        torch_config=TorchConfig(backend="gloo", timeout_s=cfg["torch_timeout_s"]),
        run_config=RunConfig(
            name=cfg["name"],
            storage_path=cfg["storage_path"],
            failure_config=FailureConfig(max_failures=cfg["max_failures"]),
        ),
    )
    from ray.train.v2.api.exceptions import TrainingFailedError

    try:
        result = trainer.fit()
    except TrainingFailedError as exc:
        print(
            f"{DRIVER_GAVE_UP}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            flush=True,
        )
        return EXIT_GAVE_UP
    finally:
        sys.stdout.flush()
    print(
        f"{DRIVER_FINISHED}: last checkpoint {result.checkpoint.path if result.checkpoint else None}",
        flush=True,
    )
    # No ray.shutdown(): the adapter tears the whole cluster down next, and the disconnect took seconds here
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # Ray's atexit disconnect would add its seconds to every run
