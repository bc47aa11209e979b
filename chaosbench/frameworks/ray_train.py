"""The ``ray-train`` adapter: Ray Train's ``TorchTrainer`` on a Ray cluster that chaosbench starts per run
(Ray 2.60, Train V2: its controller actor polls the worker group and applies ``FailureConfig(max_failures)``).

What it starts (all through the runtime, so every process is captured, labelled and torn down, and the process
and node faults reach them):

- the head node, ``ray start --head --block`` with a free GCS port on the runtime's master address, no dashboard,
  no usage stats, a small object store, ``head_cpus`` CPUs (0 by default: no training worker lands on it; Ray
  Train's controller, which takes no CPU, runs there with the driver), role ``head``; on ``local`` on a node of
  its own named ``head``, on a runtime whose nodes are machines of their own (``docker``: :class:`NodeControl`) in
  ``node0``'s container, beside node0's Ray node (a second raylet with its own temp dir and ports: a lost ``node0``
  takes the head, its GCS and the driver with it, and the run fails, as torchrun's does with its rendezvous host);
- one Ray node per workload node, ``ray start --address <head> --block`` with ``ranks_per_node`` CPUs, role
  ``node`` on ``node<i>``: its raylet starts the Ray Train workers there, so they are that node's processes (a
  lost node takes its workers with it; a killed raylet ends its ``ray start``, which ends the node's processes);
- the driver (:mod:`chaosbench.launchers.ray_train`, role ``driver``, on the head's node): it waits for every
  node, then runs a ``TorchTrainer`` with ``ScalingConfig(num_workers=ranks, use_gpu=False)`` (``(min_workers,
  ranks)`` when ``min_workers`` is set: Ray's elastic worker count), ``TorchConfig(backend="gloo", timeout_s=
  the workload's process-group timeout)`` and ``RunConfig(storage_path, name, failure_config=FailureConfig(
  max_failures))`` whose run directory (``storage_path/name``) is the run's checkpoint directory.

Each Ray node's process is :mod:`chaosbench.launchers.ray_node`, which execs ``ray start`` once it has made the
node's temp-dir link and resolved its address. Ray's temp dirs (sessions, sockets, logs) are ``/tmp/cbray-<hash
of the run dir>/<node>``, one per node (each node's log monitor forwards every log file under its dir to the
driver: a shared one sent each line twice), under a link to ``<run dir>/ray`` that each node makes in its own
``/tmp`` (Ray's Unix sockets need a short path; its logs stay with the run). On ``local`` the link is the host's
and is removed once the run's processes are gone (:meth:`RayTrainFramework.cleanup`); a container's ``/tmp`` is
a tmpfs that goes with it. Addresses: on ``local`` Ray gives a node the host's own address even when told
``127.0.0.1`` (``resolve_ip_for_localhost``), its servers listen on every interface, and every connection stays
on this host; on docker a node is given its container's address on the run's network (its name, resolved when
it starts; the GCS address is ``node0:<port>``). A container's ``/dev/shm`` is 64 MB, less than a node's object
store: there the store is in the container's ``/tmp`` (``--plasma-directory``, a tmpfs as well).

A lost node on docker (``node-kill``: its container killed) takes its Ray node and workers with it; the node's
``ray start`` (role ``node``) is not run again unless the runtime's ``rerun_roles`` names ``node`` (then, once
the ``lost_node`` policy has brought the container back, it joins the cluster as a new Ray node). Ray Train goes
on only with an elastic worker count (``min_workers``) the remaining nodes can hold.

The workload: a built-in program whose checkpoints go through the training skeleton (``ddp-mlp``: its
``bridged_checkpoints``) runs inside the Ray Train worker, in the process group Ray made; its checkpoints are written into Ray Train's
run directory (the run's checkpoint directory) and reported with ``ray.train.report``, and a restarted worker group resumes from
``ray.train.get_checkpoint()`` (the restore is Ray's choice). Any other workload (``command``) runs as a child
of the worker and resumes from its own checkpoints. Each worker-group start is a new incarnation.

What counts as a reaction (Ray's own lines, which Ray forwards from its controller, raylets and workers to the
driver's output within milliseconds, stamped when the driver printed them):

- ``detect``: the raylet's report of a dead worker (``A worker died or was killed ... Worker PID: <pid>``; the rank
  whose ``rank_start`` gave that pid is its ``blame_rank``), and the controller's failure decision
  (``[FailurePolicy] RETRY`` / ``RAISE``: its poll of the worker group, every ``health_check_interval_s``,
  found a failed worker);
- ``restart``: ``[FailurePolicy] RETRY`` (the controller restarts the worker group, within ``max_failures``);
- ``give_up``: ``[FailurePolicy] RAISE`` and the driver's own ``Ray Train gave up`` line;
- the restore itself is the ranks' ``ckpt_load_begin``/``ckpt_load_end`` of the checkpoint Ray handed them (a
  worker prints ``ray train: restoring from checkpoint <path>``). A checkpoint reaches Ray's checkpoint manager
  only at the controller's next poll after its ``ray.train.report``: one reported less than a poll before a fault
  can be lost, and Ray then restores an older one.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    LogPattern,
    LogWatcher,
    Prediction,
    RunControl,
    base_versions,
    chain,
    package_version,
    pg_timeout,
    supervise_job,
)
from chaosbench.injectors.base import Role
from chaosbench.launchers.ray_train import DRIVER_GAVE_UP, EXIT_GAVE_UP
from chaosbench.runtimes.base import NodeControl, ProcessSpec, ProcHandle, Runtime
from chaosbench.timeline import Event, TimelineWriter

#: Where Ray's temp dir (sessions, sockets, logs) lives in the run directory.
RUN_DIR_RAY = "ray"
#: Ray's smallest object store (``--object-store-memory`` below it is refused), MiB.
MIN_OBJECT_STORE_MB = 75

RAY_TRAIN_PATTERNS = [
    # The controller's failure policy, logged when its poll of the worker group found an error (the first line of
    # a multi-line message; "Error count: N (max allowed: M)" follows):
    LogPattern("detect", r"\[FailurePolicy\] (?:RETRY|RAISE)", "driver", via="exit"),
    LogPattern("restart", r"\[FailurePolicy\] RETRY", "driver"),
    LogPattern("give_up", r"\[FailurePolicy\] RAISE", "driver"),
    LogPattern("give_up", DRIVER_GAVE_UP, "driver"),
]


#: The raylet's report of a worker process that died (Ray pushes it to the driver, ``(raylet) A worker died or was
#: killed while executing a task by an unexpected system error. ... Worker PID: 4903 ...``): it names the pid.
WORKER_DIED_RE = re.compile(r"A worker died or was killed while executing a task.*?Worker PID: (?P<pid>\d+)")


class _WorkerDeathWatch:
    """Turns the raylet's report of a dead worker into a ``detect`` event naming the rank whose process it was
    (``blame_rank``, from the ranks' ``rank_start`` pids on the timeline). A pid is a pid of its node's namespace
    (on docker, its container's): when ranks of two nodes last started with the pid the line names, which of them
    died is not known, and ``blame_rank`` is None."""

    def __init__(self, framework: str, timeline: TimelineWriter) -> None:
        self.framework = framework
        self.timeline = timeline
        self._ranks: dict[int, dict[str, int]] = {}  # pid -> {node: the rank that last started there with it}
        self._lock = threading.Lock()

    def on_event(self, ev: Event) -> None:
        if ev.kind == "rank_start" and ev.get("pid") is not None:
            with self._lock:
                self._ranks.setdefault(int(ev["pid"]), {})[str(ev.get("node"))] = int(ev.get("rank", 0))

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        if handle.spec.role != "driver":
            return
        m = WORKER_DIED_RE.search(line)
        if m is None:
            return
        pid = int(m["pid"])
        with self._lock:
            ranks = set(self._ranks.get(pid, {}).values())
        rank = ranks.pop() if len(ranks) == 1 else None
        self.timeline.emit(
            "detect",
            t_ns=t_ns,
            src="framework",
            framework=self.framework,
            proc=handle.name,
            via="exit",
            reason=f"raylet: worker process {pid} died",
            pid=pid,
            blame_rank=rank,
            line=line[:400],
        )


class RayTrainOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_failures: int = Field(
        default=3,
        ge=-1,
        description="FailureConfig(max_failures): worker-group restarts "
        "before Ray Train gives up (-1: no limit)",
    )
    min_workers: int | None = Field(
        default=None,
        ge=1,
        description="ScalingConfig(num_workers=(min_workers, ranks)): Ray Train's elastic "
        "worker count (null: a fixed ranks workers)",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK", description="ScalingConfig(placement_strategy) of the workers' placement group"
    )
    head_cpus: int = Field(
        default=0, ge=0, description="CPUs the head node offers (0: no training worker on it)"
    )
    object_store_mb: int = Field(
        default=100,
        ge=MIN_OBJECT_STORE_MB,
        description="--object-store-memory of every node, MiB (the workload passes nothing through it)",
    )
    health_check_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S: the controller polls the worker group "
        "this often (a dead worker is noticed at the next poll)",
    )
    worker_health_check_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S: a worker whose poll hangs "
        "this long is declared dead (a hung worker)",
    )
    worker_group_start_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S: the workers' placement group "
        "must be ready within it (else the start fails and counts as a controller failure)",
    )
    pg_shutdown_timeout_s: int = Field(
        default=30,
        ge=1,
        description="TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S: how long a worker group's shutdown "
        "waits for its ranks to destroy their process group",
    )
    node_health_check_period_s: float = Field(
        default=3.0, gt=0, description="RAY_health_check_period_ms: the GCS checks every node this often"
    )
    node_health_check_failure_threshold: int = Field(
        default=5, ge=1, description="RAY_health_check_failure_threshold: missed checks before a node is dead"
    )
    node_health_check_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="RAY_health_check_timeout_ms: a check unanswered this long is missed (a "
        "frozen raylet; a dead one refuses at once)",
    )
    cluster_start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="the driver waits this long for every node to join before it gives up",
    )
    teardown_grace_s: float = Field(
        default=2.0,
        ge=0,
        description="SIGTERM to SIGKILL of the cluster's processes once the driver has exited",
    )


def ray_temp_link(run_dir: Path) -> Path:
    """The short path Ray's processes use as their temp dir (a link to ``<run_dir>/ray``): Ray's Unix sockets
    live under it, and a socket's path may not exceed 107 bytes."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"cbray-{digest}"


@dataclass(frozen=True)
class _RayCluster:
    """What every process of a run's Ray cluster is planned from."""

    python: str  #: the workload's interpreter, which runs Ray's processes too
    addr: str  #: the runtime's master address
    gcs: str  #: the head's GCS address, ``<addr>:<port>``
    temp: Path  #: the short link Ray's temp dirs live under (:func:`ray_temp_link`)
    #: the runtime's nodes are machines of their own (docker's containers, :class:`NodeControl`)
    containers: bool
    head_node: str  #: where the head (and the driver) run: ``node0`` on container nodes, else ``head``


class RayTrainFramework(Framework[RayTrainOptions]):
    """Ray Train on a per-run Ray cluster; see the module docstring."""

    name: ClassVar[str] = "ray-train"
    roles: ClassVar[dict[str, Role]] = {
        **Framework.roles,
        "rendezvous-host": Role(
            "rank 0's Ray Train worker: it hosts the TCPStore of the process group Ray makes", rank=0
        ),
        "head": Role(
            "the Ray head node (ray start --head: the GCS, the head's raylet, the driver's node)",
            proc_role="head",
        ),
        "node": Role(
            "a Ray worker node's ray start (its raylet; node0's, unless the target names a node): the "
            "node's Ray processes end with it",
            proc_role="node",
            node="node0",
        ),
        "driver": Role("the Ray Train driver (TorchTrainer.fit)", proc_role="driver"),
    }

    @classmethod
    def missing_engine(cls, options: RayTrainOptions, runtime: type[Runtime]) -> str | None:
        if package_version("ray") is None:
            return "ray is not installed: pip install -e '.[ray]' (ray[train]==2.60.0)"
        return None

    def _num_workers(self, job: JobContext) -> int | list[int]:
        o = self.options
        return job.ranks if o.min_workers is None else [min(o.min_workers, job.ranks), job.ranks]

    def _env(self, job: JobContext, node: str, gcs: str) -> dict[str, str]:
        """The environment of every Ray process: the ranks' (Ray's workers inherit their raylet's) and Ray's own
        settings (the controller reads the RAY_TRAIN_* ones; the driver passes them on to it). ``RAY_ADDRESS``:
        a Ray client that is given no address (Ray Train's placement-group cleaner) would otherwise look for
        running GCS processes on the host and find other runs' clusters too."""
        o = self.options
        env = job.rank_env(0, node)
        env.update(
            {
                "RAY_ADDRESS": gcs,
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_DEDUP_LOGS": "0",  # every line of every worker reaches the driver's output, none folded
                # Ray Train's print patch sends each print of a worker to its logger as well: every line twice
                "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(o.health_check_interval_s),
                "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": str(o.worker_health_check_timeout_s),
                "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(o.worker_group_start_timeout_s),
                "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S": str(o.pg_shutdown_timeout_s),
                "RAY_health_check_period_ms": str(int(o.node_health_check_period_s * 1000)),
                "RAY_health_check_failure_threshold": str(o.node_health_check_failure_threshold),
                "RAY_health_check_timeout_ms": str(int(o.node_health_check_timeout_s * 1000)),
            }
        )
        return env

    def _cluster(self, job: JobContext) -> _RayCluster:
        """The run's cluster layout; takes the GCS port (the first of the plan's free ports)."""
        addr = job.runtime.master_addr
        # Nodes that are machines of their own (docker's containers): the head shares node0's, and each Ray node
        # is given its machine's own address (its name, resolved at start); on local every node is this host
        containers = isinstance(job.runtime, NodeControl)
        return _RayCluster(
            python=job.workload_argv()[0],
            addr=addr,
            gcs=f"{addr}:{job.runtime.free_port()}",
            temp=ray_temp_link(job.run_dir),
            containers=containers,
            head_node=job.node_name(0) if containers else "head",
        )

    def _ray_start(
        self, job: JobContext, cluster: _RayCluster, name: str, machine: str, cpus: int
    ) -> list[str]:
        """The command line of Ray node ``name`` (on ``machine``, offering ``cpus`` CPUs): the node entrypoint,
        then ``ray start --block``; takes one free port (the node's dashboard agent)."""
        # Every node on one machine needs ports of its own where Ray's are fixed (the agent's 52365), and a
        # temp dir of its own: each node's log monitor forwards every log file under it to the driver (one
        # shared dir: each line twice). The temp dir is under a short link the entrypoint makes in the
        # node's own /tmp (ray_node)
        python = cluster.python
        argv = [
            python,
            "-m",
            "chaosbench.launchers.ray_node",
            "--temp-link",
            str(cluster.temp),
            "--temp-target",
            str(job.run_dir / RUN_DIR_RAY),
            "--",
            python,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            "--node-ip-address",
            machine if cluster.containers else cluster.addr,
            "--node-name",
            name,
            "--num-cpus",
            str(cpus),
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(self.options.object_store_mb * 1024 * 1024),
            "--disable-usage-stats",
            "--temp-dir",
            str(cluster.temp / name),
            "--dashboard-agent-listen-port",
            str(job.runtime.free_port()),
        ]
        if cluster.containers:
            # a container's /dev/shm is 64 MB, less than one node's store: the store goes in its /tmp, a
            # tmpfs as /dev/shm is (Ray would fall back to the temp dir, here in the run dir on disk)
            argv += ["--plasma-directory", "/tmp"]
        return argv

    def _cluster_processes(self, job: JobContext, cluster: _RayCluster) -> list[ProcessSpec]:
        """The head (``ray.head``) and one Ray node per workload node (``ray.node<i>``), in that order."""
        gcs, head_node = cluster.gcs, cluster.head_node
        procs = [
            ProcessSpec(
                name="ray.head",
                role="head",
                node=head_node,
                env=self._env(job, head_node, gcs),
                argv=[
                    *self._ray_start(job, cluster, "head", head_node, self.options.head_cpus),
                    "--head",
                    "--port",
                    gcs.rsplit(":", 1)[1],
                    "--include-dashboard",
                    "false",
                ],
            )
        ]
        for n in range(job.nodes):
            node = job.node_name(n)
            procs.append(
                ProcessSpec(
                    name=f"ray.{node}",
                    role="node",
                    node=node,
                    env=self._env(job, node, gcs),
                    argv=[*self._ray_start(job, cluster, node, node, job.ranks_per_node), "--address", gcs],
                )
            )
        return procs

    def _driver_config(self, job: JobContext, cluster: _RayCluster, mode: str, pg_s: float) -> dict[str, Any]:
        """The driver's ``--config`` (:mod:`chaosbench.launchers.ray_train`): the cluster to wait for and the
        TorchTrainer's settings; ``mode`` is how the workload runs in a worker (``in-process``/``subprocess``),
        ``pg_s`` the workload's process-group timeout (s)."""
        o = self.options
        return {
            "address": cluster.gcs,
            "nodes": job.nodes + 1,
            "cpus": job.ranks_per_node * job.nodes + o.head_cpus,
            "cluster_start_timeout_s": o.cluster_start_timeout_s,
            "num_workers": self._num_workers(job),
            "placement_strategy": o.placement_strategy,
            "torch_timeout_s": _torch_timeout(pg_s),
            # Ray Train's run directory (storage_path/name) is the run's checkpoint directory itself: the program
            # writes its checkpoints there and Ray reports them as they are; the harness's checkpoint tools (the
            # corrupt-checkpoint injector, the listing) find them where they find every framework's
            "name": job.ckpt_dir.name,
            "storage_path": str(job.ckpt_dir.parent),
            "max_failures": o.max_failures,
            "loop": {
                "mode": mode,
                "argv": job.workload_argv(),
                "attempts_file": str(job.run_dir / "ray-train-starts"),
            },
        }

    def _notes(self, job: JobContext, config: dict[str, Any], in_process: bool, pg_name: str) -> list[str]:
        """The plan's notes: the cluster, the incarnation, how the workload runs and resumes, and the process-group
        timeout (``pg_name``: the timeout it comes from)."""
        return [
            f"Ray head (GCS {config['address']}) + {job.nodes} Ray node(s) x {job.ranks_per_node} CPUs; the "
            f"driver runs a TorchTrainer with num_workers={config['num_workers']}, "
            f"max_failures={self.options.max_failures}",
            "incarnation = the worker group's start (counted by rank 0 of each start)",
            (
                "the program runs inside each Ray Train worker; checkpoints go through ray.train.report and a "
                "restart resumes from ray.train.get_checkpoint()"
            )
            if in_process
            else "the workload runs as a child of each Ray Train worker and resumes from its own checkpoints",
            f"process-group timeout: TorchConfig(timeout_s={config['torch_timeout_s']}) from {pg_name}",
        ]

    def plan(self, job: JobContext) -> LaunchPlan:
        """The head, one Ray node per workload node, then the driver (``ray.driver``); see the module docstring."""
        cluster = self._cluster(job)
        procs = self._cluster_processes(job, cluster)
        workload_argv = job.workload_argv()
        in_process = job.workload.bridged_checkpoints and workload_argv[1:2] == ["-m"]
        pg_name, pg_s = pg_timeout(self.timeouts(job))
        mode = "in-process" if in_process else "subprocess"
        config = self._driver_config(job, cluster, mode, pg_s)
        procs.append(
            ProcessSpec(
                name="ray.driver",
                role="driver",
                node=cluster.head_node,
                env=self._env(job, cluster.head_node, cluster.gcs),
                argv=[cluster.python, "-m", "chaosbench.launchers.ray_train", "--config", json.dumps(config)],
            )
        )
        return self.launch_plan(
            job,
            procs,
            RAY_TRAIN_PATTERNS,
            options={
                **self.options.model_dump(),
                "num_workers": config["num_workers"],
                "gcs_address": cluster.gcs,
                "workload_mode": mode,
                "temp_dir": str(cluster.temp),
            },
            notes=self._notes(job, config, in_process, pg_name),
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        if t.get("workload_pg_timeout_s") is not None:
            # Ray makes the process group: TorchConfig(timeout_s) takes whole seconds
            t["workload_pg_timeout_s"] = float(_torch_timeout(float(t["workload_pg_timeout_s"] or 0)))
        t.update(
            {
                "health_check_interval_s": o.health_check_interval_s,
                "worker_health_check_timeout_s": o.worker_health_check_timeout_s,
                "worker_group_start_timeout_s": o.worker_group_start_timeout_s,
                "pg_shutdown_timeout_s": float(o.pg_shutdown_timeout_s),
                "node_health_check_period_s": o.node_health_check_period_s,
                "node_health_check_timeout_s": o.node_health_check_timeout_s,
                # a lost node's raylet refuses the GCS's checks at once: dead after `threshold` periods
                "node_dead_after_s": o.node_health_check_period_s * o.node_health_check_failure_threshold,
                "collective_timeout_s": None,  # RAY_TRAIN_COLLECTIVE_TIMEOUT_S: Ray's default, none
                "cluster_start_timeout_s": o.cluster_start_timeout_s,
                "teardown_grace_s": o.teardown_grace_s,
            }
        )
        return t

    def versions(self) -> dict[str, str | None]:
        v = base_versions()
        v["ray"] = package_version("ray")
        return v

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        poll = ("health_check_interval_s", timeouts.get("health_check_interval_s"))
        if mode == "crash":
            return Prediction(
                *chain(poll),
                note="the controller's next poll of the worker group finds the dead "
                "worker (its actor died); the raylet's report of a dead worker process usually comes "
                "first (measured: 0.05-0.1 s), a lost node's raylet makes none",
            )
        if mode not in ("hang", "stall"):
            return None
        pg_name, pg = pg_timeout(timeouts)
        hc = float(timeouts.get("worker_health_check_timeout_s") or 0)
        if mode == "hang" and hc < pg:
            return Prediction(
                *chain(("worker_health_check_timeout_s", hc), poll),
                note="the frozen worker's poll hangs until the controller declares it dead",
            )
        return Prediction(
            *chain((pg_name, pg), poll),
            note="the peers' collective times out and their train function fails; the controller's "
            "next poll sees it",
        )

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o = self.options
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        deaths = _WorkerDeathWatch(self.label, control.timeline)
        control.follower.subscribe(deaths.on_event)

        def on_line(handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
            watcher(handle, stream, line, t_ns)
            deaths(handle, stream, line, t_ns)

        head_spec, *rest = plan.processes
        node_specs, driver_spec = rest[:-1], rest[-1]
        head = control.runtime.start(head_spec, on_line=on_line)
        nodes = [control.runtime.start(p, on_line=on_line) for p in node_specs]
        driver = control.runtime.start(driver_spec, on_line=on_line)

        def step() -> JobResult | None:
            rc = driver.poll()
            if rc is None:
                return None
            control.runtime.terminate([head, *nodes], o.teardown_grace_s)
            if rc == 0:
                return JobResult("completed")
            if rc == EXIT_GAVE_UP:
                return JobResult("gave_up", f"Ray Train gave up (driver exit code {rc})")
            return JobResult("failed", f"ray.driver exited with code {rc}")

        return supervise_job(control, step, 0.05)

    def cleanup(self, job: JobContext) -> None:
        link = ray_temp_link(job.run_dir)
        if link.is_symlink():
            link.unlink()


def _torch_timeout(pg_s: float) -> int:
    """``TorchConfig(timeout_s)``: whole seconds, at least the workload's timeout."""
    whole = int(pg_s)
    return whole if whole == pg_s else whole + 1
