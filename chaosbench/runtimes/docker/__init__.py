"""The ``docker`` runtime: one container per node on a per-run ``--internal`` bridge network.

What it creates, all labelled ``chaosbench.run=<run id>`` (and removed by :meth:`DockerRuntime.cleanup`, or by
``chaosbench cleanup`` after a crashed harness): one network ``<prefix>-<run hash>`` created ``--internal``
(no route off the host), one container per node (``node0`` ... ``nodeN-1``, also their hostnames and network
aliases, so ``MASTER_ADDR=node0`` works) and ``spare_nodes`` hot spares (``spare0`` ...), each with the CPU
and memory limits of the options. The run directory is bind-mounted read-write at the same path into every
node: it is the shared checkpoint storage, and every process appends to the same ``events.jsonl``.

Processes are started with ``docker exec`` (the Engine API through the Docker SDK). Their stdout and stderr
are the local runtime's captures (:mod:`chaosbench.runtimes.capture`), handed into the container: the exec
runs a small launcher first, which takes the two sockets from the harness through a Unix socket in a
bind-mounted host directory and execs the command on them (:mod:`chaosbench.runtimes.docker.output`), so the
kernel stamps every line in the writer's own ``write(2)`` (``proc_start``'s ``output_stamp: write``) and lines go
to ``logs/<name>.out|.err`` as on ``local``. Where that cannot be done (``output_capture: pipe``, a user's image
without ``python``, a launcher that could not connect) the exec's own stream is read frame by frame, split into
lines and stamped when read (``output_stamp: read``, with ``output_stamp_reason``). Exits are stamped when
the kernel made the process's pidfd readable (:class:`~chaosbench.runtimes.process.ExitPoller`; the exit code
then comes from the engine). A process is identified by its host pid (from the exec's inspect data): the harness
runs on the engine's host, so teardown signals the exec'd process and its descendants directly (SIGTERM,
SIGCONT, grace, SIGKILL), which really ends them; killing a ``docker exec`` client would not.
``signal_pid`` takes the pid a rank reported in its ``rank_start`` (in the container's pid namespace) and
maps it to the host pid through the container's pid namespace (``/proc/<pid>/status`` ``NSpid``), checks
its start time, and signals it: no ``kill`` binary is needed in the image, a paused node can be signalled,
and no ``docker exec`` round trip (~0.1 s) is added to a measured fault time.

Targets. The runtime acts only on what this run created (:meth:`~chaosbench.runtimes.docker.nodes.NodePool.owned`, called before every
pause, unpause, kill, CPU limit, signal and ``nsenter`` into a node for a network rule): the node's container
must carry the label ``chaosbench.run=<this run's id>`` as the engine reports it at that moment, and a signalled
pid must live in the pid namespace of such a container. A workload node name that is not one of this run's
(``node7`` of a timeline written by someone else, a container's name) is refused as well; a refusal is a
:class:`~chaosbench.errors.ChaosbenchError` naming the target and why, and nothing is done to it.

Nodes on the timeline: ``node_start`` (node, container, spare, reason), ``node_exit`` (node, container,
exit_code, reason), ``node_pause``/``node_unpause``, from the engine's event stream stamped with the engine's
time (one host, one clock).

Losing a node (:meth:`DockerRuntime.lose_nodes`, the ``node-kill`` fault) is ``docker kill`` of its container:
every process on the node dies at once, its network endpoint disappears and nothing on it gets to say
goodbye; the moment it took effect is the engine's own ``die`` event. Killing node0 under torchrun ends the
rendezvous host with it. A lost node comes back according to ``lost_node``: ``reboot`` starts the
same container again (after ``reboot_delay_s``), ``spare`` hands the node's name and network alias to a hot
spare, ``none`` leaves it down (starting a process there then fails). This happens when something needs the
node: a framework relaunching ranks there, or a process of a role in ``rerun_roles`` (default: ``agent``,
i.e. torchrun's per-node agent) that died with the node. Such a process is the node's entrypoint, as in a
Kubernetes pod: it is run again when its node is back, under the same handle (``proc_exit`` then
``proc_start`` with ``rerun: true``), so a framework sees one agent per node for the whole run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from chaosbench.errors import ChaosbenchError, EngineError, ForeignTarget, Unsupported
from chaosbench.runtimes import process
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime, engine_effect
from chaosbench.runtimes.docker.cleanup import remove_run_objects
from chaosbench.runtimes.docker.events import EngineEvents
from chaosbench.runtimes.docker.execs import ExecHandle, Execs
from chaosbench.runtimes.docker.nodes import (
    CAPTURE_DIR_LABEL,
    CFS_PERIOD_US,
    CONTAINER_STATES,
    NODE_LABEL,
    RUN_DIR_LABEL,
    RUN_LABEL,
    NodePool,
    cfs_quota_us,
)
from chaosbench.runtimes.docker.options import DockerNodeLossOptions, DockerOptions
from chaosbench.runtimes.process import CaptureLimitWatcher
from chaosbench.timeline import now_ns

__all__ = [
    "CAPTURE_DIR_LABEL",
    "CONTAINER_STATES",
    "NODE_LABEL",
    "RUN_DIR_LABEL",
    "RUN_LABEL",
    "DockerNodeLossOptions",
    "DockerOptions",
    "DockerRuntime",
    "ExecHandle",
    "remove_run_objects",
]

FIRST_PORT = 29500


class DockerRuntime(Runtime[DockerOptions]):
    """Nodes are containers of the local Docker engine (see the module docstring): the containers in a
    :class:`~chaosbench.runtimes.docker.nodes.NodePool`, the engine's events in an
    :class:`~chaosbench.runtimes.docker.events.EngineEvents`, the processes in an
    :class:`~chaosbench.runtimes.docker.execs.Execs`."""

    name: ClassVar[str] = "docker"

    @classmethod
    def missing_engine(cls) -> str | None:
        import importlib.util

        if importlib.util.find_spec("docker") is None:
            return "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'"
        # an engine elsewhere (DOCKER_HOST) needs nothing installed here but the SDK; whether it answers is known
        # only by asking it, which a run does first (a run without one: "no Docker engine answers (...)")
        if (
            not os.environ.get("DOCKER_HOST")
            and shutil.which("dockerd") is None
            and shutil.which("docker") is None
        ):
            return "the docker runtime needs a Docker engine: scripts/docker-up (apt-get install docker.io)"
        return None

    @classmethod
    def concurrent_slots(cls, options: dict[str, Any], jobs: int, nodes: int) -> list[dict[str, Any]]:
        """Each concurrent run on CPUs of its own (``cpuset``: the harness's CPUs split in ``jobs`` contiguous
        parts) and, as every run, its own internal network. Refused when there are fewer CPUs than runs or the
        suite pins a ``cpuset`` itself."""
        if options.get("cpuset"):
            raise Unsupported(
                "docker: the suite pins cpuset itself; --jobs cannot give concurrent runs CPUs of their own"
            )
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < jobs:
            raise Unsupported(
                f"docker: {jobs} concurrent runs need a CPU each of their own; this host has {len(cpus)}"
            )
        share = len(cpus) // jobs
        return [{"cpuset": ",".join(str(c) for c in cpus[i * share : (i + 1) * share])} for i in range(jobs)]

    @classmethod
    def cleanup_crashed(cls, results_dir: Path) -> list[str]:
        return remove_run_objects(results_dir)

    #: Option values used when the runner passes no options (variants registered under other names).
    default_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opts: DockerOptions = (
            self.options if isinstance(self.options, DockerOptions) else DockerOptions(**self.default_options)
        )
        self.logs_dir = Path(self.run.run_dir) / "logs"
        self.run_hash = hashlib.sha256(self.run.run_id.encode()).hexdigest()[:10]
        self._client: Any = None
        self._stream_client: Any = None
        self._lock = threading.Lock()
        self._port = FIRST_PORT
        self._closing = threading.Event()
        self._closed = False
        self.events = EngineEvents(self.run.timeline, self.run.run_id, self._closing)
        self.pool = NodePool(
            self.run, self.opts, self.run_hash, lambda: self.client, self.provision, self._closing
        )
        self.network_name = self.pool.network_name
        self.execs = Execs(self.run, self.opts, self.pool, lambda: self.stream_client, self._closing)
        if self.execs.read_stamp_reason is None:
            self.line_observers.append(CaptureLimitWatcher(self.run.timeline))

    # ------------------------------------------------------------------ plain data
    @property
    def master_addr(self) -> str:
        return "node0"

    def free_port(self) -> int:
        """A new port per call: each node has its own network namespace, so any port is free there."""
        with self._lock:
            self._port += 1
            return self._port

    @property
    def image(self) -> str | None:
        """The nodes' image (None until provisioned)."""
        return self.pool.image

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": self.name,
            "image": self.image or self.opts.image or "default (local)",
            "network": self.network_name,
            "options": self.opts.model_dump(),
        }

    # ------------------------------------------------------------------ engine
    @property
    def client(self) -> Any:
        if self._client is None:
            from chaosbench.runtimes.docker.image import connect

            self._client = connect()
        return self._client

    @property
    def stream_client(self) -> Any:
        """A second client without a read timeout, for long-lived streams (exec output, engine events)."""
        if self._stream_client is None:
            import docker

            # the engine reached once, through connect() (no engine: MissingEngine, one line), and its API version
            # taken from there instead of asked again
            version = self.client.api.api_version
            self._stream_client = docker.from_env(version=version, timeout=None, max_pool_size=256).api
        return self._stream_client

    def _expected_nodes(self) -> int:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            cfg = json.loads((Path(self.run.run_dir) / "config.json").read_text())
            return int(cfg["scenario"]["workload"]["nodes"])
        return 1

    def provision(self, nodes: int | None = None) -> None:
        """Create the network, ``nodes`` node containers and the spares, and start them (in parallel).
        Called on the first :meth:`start` when nobody called it before. Idempotent."""
        with self.pool.provision_lock:
            if self.pool.provisioned:
                return
            if self._closed:
                raise ChaosbenchError("the docker runtime of this run has been cleaned up")
            nodes = self._expected_nodes() if nodes is None else nodes
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            self.execs.open_handover()
            self.events.start(self.stream_client, self.pool.logical)
            self.pool.create(nodes, self.capture_dir)

    # ------------------------------------------------------------------ nodes
    def node_names(self) -> list[str]:
        self.provision()
        return sorted(self.pool.nodes)

    def spares_left(self) -> int:
        with self.pool.lock:
            return len(self.pool.spares)

    def node_state(self, name: str) -> str:
        """``up``, ``paused``, ``down`` or ``transient``, from the engine."""
        return self.pool.state(name)

    def node_pid(self, name: str) -> int:
        """Host pid of the node's init: ``nsenter -t PID -n`` enters its network namespace (so a network fault's
        rules go there). Refused for a container that is not this run's (:meth:`NodePool.owned`)."""
        return self.pool.init_pid(name)

    def node_ip(self, name: str) -> str:
        node = self.pool.node(name)
        node.container.reload()
        nets = node.container.attrs["NetworkSettings"]["Networks"]
        ip = (nets.get(self.network_name) or {}).get("IPAddress")
        if not ip:
            raise ProcessLookupError(f"node {name} has no address on {self.network_name}")
        return str(ip)

    def node_iface(self, name: str) -> str:
        """The node's interface on the run network (``eth0``; another name after a spare took over a node)."""
        return self.pool.iface(name)

    def container_name(self, name: str) -> str:
        return str(self.pool.node(name).container.name)

    def kill_node(self, name: str, sig: str = "SIGKILL", reason: str = "node-kill") -> str:
        """Kill the node's container (every process in it); returns the container's name. Refused for a
        container that is not this run's (:meth:`NodePool.owned`)."""
        node = self.pool.owned(name, "killing it")
        with node.lock:
            self.events.exit_reasons[node.cid] = reason
            try:
                node.container.kill(signal=sig)
            except Exception as exc:  # noqa: BLE001 - the engine's refusal, as a skipped fault
                self.events.exit_reasons.pop(node.cid, None)
                raise EngineError("docker", f"cannot kill node {name}: {exc}") from None
            return str(node.container.name)

    @classmethod
    def node_loss_options(cls) -> type[BaseModel]:
        return DockerNodeLossOptions

    def lose_nodes(self, nodes: list[str], options: BaseModel, restorable: list[str]) -> dict[str, Any]:
        """Kill each node's container (NodeLoss); details: ``containers`` (node -> container), ``signal`` and
        the engine's ``die`` stamp as the moment of effect. Nothing is restorable: the ``lost_node`` policy
        brings a node back when something needs it."""
        assert isinstance(options, DockerNodeLossOptions)
        since = now_ns()
        killed = {n: self.kill_node(n, options.signal) for n in nodes}
        return {
            "containers": killed,
            "signal": options.signal,
            **engine_effect(self, list(killed.values()), "die", since, "the container died"),
        }

    def pause_node(self, name: str) -> str:
        """Freeze the node's container (docker pause); returns the container's name. Refused for a container that
        is not this run's (:meth:`NodePool.owned`)."""
        node = self.pool.owned(name, "pausing it")
        with node.lock:
            node.container.pause()
            return str(node.container.name)

    def engine_event_ns(
        self, container: str, action: str, since_ns: int, timeout_s: float = 5.0
    ) -> int | None:
        """When the engine reported ``action`` (``die``, ``pause``, ...) for a container of this run at or after
        ``since_ns`` (its own stamp: the moment a node fault took effect), waiting up to ``timeout_s`` for the
        event to arrive; None when it did not."""
        return self.events.event_ns(container, action, since_ns, timeout_s)

    def unpause_node(self, name: str) -> bool:
        """Unpause the node if it is paused; returns whether it was. Refused for a container that is not this
        run's (:meth:`NodePool.owned`)."""
        node = self.pool.owned(name, "unpausing it")
        with node.lock:
            if node.container.status != "paused":
                return False
            node.container.unpause()
            return True

    def set_node_cpus(self, name: str, cpus: float | None) -> float | None:
        """Change the node's CPU limit live (``docker update --cpus``, as a CFS quota per 100 ms period: the
        SDK's public update has no ``--cpus``); returns the previous limit (None: none was set). None sets the host's CPU count: the engine cannot drop a CPU limit once set. Refused for a
        container that is not this run's (:meth:`NodePool.owned`)."""
        node = self.pool.owned(name, "changing its CPU limit")
        host = node.container.attrs["HostConfig"]
        quota, period = int(host.get("CpuQuota") or 0), int(host.get("CpuPeriod") or 0)
        node.container.update(
            cpu_period=CFS_PERIOD_US, cpu_quota=cfs_quota_us(cpus if cpus else float(os.cpu_count() or 1))
        )
        return quota / period if quota > 0 and period > 0 else None

    # ------------------------------------------------------------------ processes
    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        return self.execs.start(spec, self.observed(on_line))

    @property
    def capture_dir(self) -> str | None:
        """The host directory of the output handover's socket (mounted in every node), while it exists."""
        return self.execs.handover.host_dir if self.execs.handover is not None else None

    # ------------------------------------------------------------------ signals
    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        """Signals ``pid`` of the named node's pid namespace; refused (:class:`~chaosbench.errors.ForeignTarget`) for a node that is not
        this run's or whose container lacks the run's label (:meth:`NodePool.owned`)."""
        host = self.pool.host_pid(pid, node)
        proc = process.find(host) if host is not None else None
        if proc is None:
            raise ProcessLookupError(pid)
        if not process.same(proc, ticks):
            raise ForeignTarget(f"pid {pid} on {node}", "now belongs to another process", "signalling it")
        # the engine's host: the same kernel and clock as the harness
        return process.signal_stamped(proc, sig)

    def process_alive(self, pid: int, ticks: int | None = None, node: str | None = None) -> bool:
        try:
            host = self.pool.host_pid(pid, node)
        except (ChaosbenchError, ProcessLookupError):
            return False  # not a process of this run's nodes: none of ours is alive there
        return host is not None and process.alive(host, ticks)

    # ------------------------------------------------------------------ teardown
    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        self.execs.terminate(handles, grace_s)

    def cleanup(self, grace_s: float = 5.0) -> None:
        """Terminate every process, remove every container and the network of this run. Idempotent."""
        with self._lock:
            if self._closed:
                return
        self._closing.set()
        handles = self.execs.close(grace_s)
        if self._client is not None:
            self.pool.remove_containers()
        self.execs.join(handles)
        self.events.close()
        # the capture directory before the network that names it: a harness killed in between leaves what
        # `chaosbench cleanup` can find
        if self.execs.handover is not None:
            self.execs.handover.close()
        if self._client is not None:
            self.pool.remove_network()
        with self._lock:
            self._closed = True
        for c in (self._stream_client, self._client):
            with contextlib.suppress(Exception):
                if c is not None:
                    c.close()

    def leftovers(self) -> list[int]:
        """Host pids of this run's processes still alive (containers removed: none can be)."""
        return self.execs.leftovers()

    def leftover_objects(self) -> list[str]:
        """Containers and networks labelled with this run's id that still exist."""
        if self._client is None:
            return []
        return self.pool.leftover_objects()
