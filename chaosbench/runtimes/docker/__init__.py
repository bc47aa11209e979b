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

Targets. The runtime acts only on what this run created (:meth:`DockerRuntime._owned`, called before every
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
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.errors import ChaosbenchError, Unsupported
from chaosbench.runtimes import process
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime, engine_effect
from chaosbench.runtimes.capture import OutputCapture
from chaosbench.runtimes.docker.launcher import FALLBACK
from chaosbench.runtimes.docker.output import CAPTURE_DIR_PREFIX, NODE_DIR, Offer, OutputHandover
from chaosbench.runtimes.process import (
    CaptureLimitWatcher,
    ProcessTrees,
    close_captures,
    open_captures,
    record_exit,
    record_start,
    start_pumps,
)
from chaosbench.timeline import now_ns
from chaosbench.timeline.reader import crashed_run_ids
from chaosbench.waiting import wait_until

RUN_LABEL = "chaosbench.run"
NODE_LABEL = "chaosbench.node"
RUN_DIR_LABEL = "chaosbench.run_dir"
#: Environment of the harness passed on to processes in the nodes (the rest of it stays on the host).
PASS_ENV_PREFIXES = ("TORCH_", "TORCHELASTIC_", "NCCL_", "GLOO_", "OMP_", "MKL_", "PYTHON", "LC_", "LANG", "TZ")
FIRST_PORT = 29500
PF_EXITING = 0x4  # task flag in /proc/<pid>/stat field 9
#: How the launcher's line saying it could not take the capture sockets starts (on the exec's stderr).
LAUNCHER_FALLBACK = FALLBACK.encode()
#: Longest wait for a started process's launcher to take its capture sockets (seconds; Python's start-up, a
#: frozen node): then its lines are stamped when read, and the launcher, connecting later, falls back.
HANDOVER_WAIT_S = 10.0
#: Exit codes of ``docker exec`` above 128 mean "killed by signal (code - 128)"; reported like Popen does.
SIGNAL_EXIT_BASE = 128
#: Docker container states -> what the runtime makes of them.
CONTAINER_STATES = {"running": "up", "paused": "paused", "restarting": "transient", "removing": "transient",
                    "created": "down", "exited": "down", "dead": "down"}  # fmt: skip


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
        default=None, description="node image; null: the built-in local image (built automatically if missing)"
    )
    python: str | None = Field(
        default=None,
        description="interpreter inside a user's image: replaces the harness's own sys.executable in argv",
    )
    cpus_per_node: float | None = Field(default=None, gt=0, description="CPU limit of each node container")
    cpuset: str | None = Field(
        default=None, pattern=r"^[0-9]+([-,][0-9]+)*$",
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
            if len(parts) not in (2, 3) or not parts[0].startswith("/") or not parts[1].startswith("/") or (
                len(parts) == 3 and parts[2] not in ("ro", "rw")
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


@dataclass
class _Node:
    """A logical node (``node1``) and the container now backing it."""

    name: str
    container: Any
    spare: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)
    former: list[Any] = field(default_factory=list)  # containers that backed it before a spare took over

    @property
    def cid(self) -> str:
        return str(self.container.id)


class ExecHandle(ProcHandle):
    """A process started with ``docker exec``: ``pid`` is its host pid, ``container_pid`` the pid inside."""

    def __init__(self, spec: ProcessSpec, pid: int, ticks: int | None) -> None:
        super().__init__(spec, pid, ticks)
        self.exec_id = ""
        self.container_id = ""
        self.container_pid: int | None = None
        self.exit_watch: process.ExitWatch | None = None
        self.runs = 0

    @property
    def pid_on_node(self) -> int | None:
        return self.container_pid


def _decode_exit(code: int | None) -> int:
    if code is None:
        return -signal.SIGKILL
    if SIGNAL_EXIT_BASE < code <= SIGNAL_EXIT_BASE + 64:
        return -(code - SIGNAL_EXIT_BASE)
    return int(code)


def _ns_inode(pid: int, ns: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{ns}")
    except OSError:
        return None


def _nspid(pid: int) -> list[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


class DockerRuntime(Runtime[DockerOptions]):
    """Nodes are containers of the local Docker engine (see the module docstring)."""

    name: ClassVar[str] = "docker"

    @classmethod
    def missing_engine(cls) -> str | None:
        import importlib.util

        if importlib.util.find_spec("docker") is None:
            return "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'"
        # an engine elsewhere (DOCKER_HOST) needs nothing installed here but the SDK; whether it answers is known
        # only by asking it, which a run does first (a run without one: "no Docker engine answers (...)")
        if not os.environ.get("DOCKER_HOST") and shutil.which("dockerd") is None and shutil.which("docker") is None:
            return "the docker runtime needs a Docker engine: scripts/docker-up (apt-get install docker.io)"
        return None

    @classmethod
    def concurrent_slots(cls, options: dict[str, Any], jobs: int, nodes: int) -> list[dict[str, Any]]:
        """Each concurrent run on CPUs of its own (``cpuset``: the harness's CPUs split in ``jobs`` contiguous
        parts) and, as every run, its own internal network. Refused when there are fewer CPUs than runs or the
        suite pins a ``cpuset`` itself."""
        if options.get("cpuset"):
            raise Unsupported("docker: the suite pins cpuset itself; --jobs cannot give concurrent runs CPUs of their own")
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < jobs:
            raise Unsupported(f"docker: {jobs} concurrent runs need a CPU each of their own; this host has {len(cpus)}")
        share = len(cpus) // jobs
        return [{"cpuset": ",".join(str(c) for c in cpus[i * share:(i + 1) * share])} for i in range(jobs)]

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
        self.network_name = f"{self.opts.network_prefix}-{self.run_hash}"
        self._client: Any = None
        self._stream_client: Any = None
        self._network: Any = None
        self._nodes: dict[str, _Node] = {}
        self._spares: list[_Node] = []
        self._all_containers: dict[str, Any] = {}  # id -> container, everything this run created
        self._handles: list[ExecHandle] = []
        self._threads: list[threading.Thread] = []
        self._trees = ProcessTrees()
        self._lock = threading.RLock()  # short critical sections only: never held across engine calls
        self._provision_lock = threading.Lock()
        self._port = FIRST_PORT
        self._closing = threading.Event()
        self._events_stream: Any = None
        self._events_thread: threading.Thread | None = None
        self._exit_reasons: dict[str, str] = {}
        # (container name, action) -> the engine's stamps of that event (die, pause, ...), for the moment a node
        # fault took effect; the engine runs on this host, so its clock is the harness's.
        self._engine_times: dict[tuple[str, str], list[int]] = {}
        self._engine_cv = threading.Condition()
        self._inits: dict[str, tuple[int, int | None]] = {}
        self._started: set[str] = set()  # containers seen starting  # container id -> its init's host pid, ticks
        self._provisioned = False
        self._closed = False
        self.image: str | None = None
        # the output capture's handover into the nodes (made at provision), or why lines are stamped when read
        self._handover: OutputHandover | None = None
        self._read_stamp_reason: str | None = None
        if self.opts.output_capture == "pipe":
            self._read_stamp_reason = "output_capture: pipe"
        elif self._launcher_python() is None:
            self._read_stamp_reason = (f"image {self.opts.image} without runtime_options.python: no interpreter known "
                                       "there to run the capture launcher")  # fmt: skip
        else:
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

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "image": self.image or self.opts.image or "default (local)",
                "network": self.network_name, "options": self.opts.model_dump()}  # fmt: skip

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

    def _labels(self, node: str | None = None) -> dict[str, str]:
        labels = {RUN_LABEL: self.run.run_id, RUN_DIR_LABEL: str(Path(self.run.run_dir).resolve())}
        if node is not None:
            labels[NODE_LABEL] = node
        return labels

    def _expected_nodes(self) -> int:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            cfg = json.loads((Path(self.run.run_dir) / "config.json").read_text())
            return int(cfg["scenario"]["workload"]["nodes"])
        return 1

    def provision(self, nodes: int | None = None) -> None:
        """Create the network, ``nodes`` node containers and the spares, and start them (in parallel).
        Called on the first :meth:`start` when nobody called it before. Idempotent."""
        with self._provision_lock:
            if self._provisioned:
                return
            if self._closed:
                raise ChaosbenchError("the docker runtime of this run has been cleaned up")
            nodes = self._expected_nodes() if nodes is None else nodes
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            if self._read_stamp_reason is None:
                try:
                    self._handover = OutputHandover()
                except OSError as exc:
                    self._read_stamp_reason = f"no capture socket on this host: {exc}"
            self._start_events()
            self._network = self.client.networks.create(
                self.network_name, driver="bridge", internal=True, labels=self._labels(), check_duplicate=True
            )
            self._create_spec = self._container_spec()
            names = [f"node{i}" for i in range(nodes)] + [f"spare{i}" for i in range(self.opts.spare_nodes)]
            errors: dict[str, list[str]] = {}  # the error -> the nodes that had it (each said once)
            created: dict[str, Any] = {}

            def make(name: str) -> None:
                try:
                    created[name] = self._create_container(name)
                except Exception as exc:  # noqa: BLE001 - collected and raised below as one error
                    with self._lock:
                        errors.setdefault(str(exc), []).append(name)

            threads = [threading.Thread(target=make, args=(n,), daemon=True) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with self._lock:
                for name in names:
                    if name in created:
                        node = _Node(name, created[name], spare=name.startswith("spare"))
                        (self._spares.append(node) if node.spare else self._nodes.__setitem__(name, node))
                self._provisioned = True
            if errors:
                why = "; ".join(f"{', '.join(sorted(who))}: {e}" for e, who in errors.items())
                raise ChaosbenchError(f"cannot start the nodes of run {self.run.run_id}: {why}")

    def _container_spec(self) -> dict[str, Any]:
        from docker.types import Mount

        from chaosbench.runtimes.docker.image import build_default_image, default_mounts, init_command

        run_dir = str(Path(self.run.run_dir).resolve())
        mounts = []
        if self.opts.image is None:
            self.image = build_default_image(self.client)
            mounts = [m.to_docker() for m in default_mounts() if not run_dir.startswith(m.source + "/")]
            mounts += [m.to_docker() for m in default_mounts() if run_dir.startswith(m.source + "/")]
            command, init = init_command(), False
        else:
            self.image = self.opts.image
            command, init = ["sleep", "infinity"], True
        for m in self.opts.mounts:
            src, dst, *mode = m.split(":")
            mounts.append(Mount(target=dst, source=src, type="bind", read_only=(mode or ["rw"])[0] == "ro"))
        mounts.append(Mount(target=run_dir, source=run_dir, type="bind", read_only=False))
        if self._handover is not None:
            # read-only: connecting to a Unix socket needs no write access to its file system
            mounts.append(Mount(target=NODE_DIR, source=self._handover.host_dir, type="bind", read_only=True))
        spec: dict[str, Any] = {
            "image": self.image, "command": command, "init": init, "detach": True, "mounts": mounts,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=1g"}, "network": self.network_name,
            "environment": {"GLOO_SOCKET_IFNAME": "eth0"}, "stop_signal": "SIGKILL",
        }  # fmt: skip
        if self.opts.cpus_per_node is not None:
            spec["nano_cpus"] = int(self.opts.cpus_per_node * 1e9)
        if self.opts.cpuset is not None:
            spec["cpuset_cpus"] = self.opts.cpuset
        if self.opts.memory_per_node is not None:
            spec["mem_limit"] = self.opts.memory_per_node
        return spec

    def _create_container(self, name: str) -> Any:
        import docker.errors
        from docker.types import EndpointConfig

        spec = dict(self._create_spec)
        cname = f"{self.opts.network_prefix}-{self.run_hash}-{name}"
        # The alias is what makes `node1` resolve on the network (it moves to a spare on takeover).
        endpoint = EndpointConfig(self.client.api.api_version, aliases=[name])
        try:
            c = self.client.containers.create(name=cname, hostname=name, labels=self._labels(name),
                                              networking_config={self.network_name: endpoint}, **spec)  # fmt: skip
        except docker.errors.ImageNotFound:
            raise ChaosbenchError(f"image {self.image!r} is not on this engine (no registry is reachable: "
                                  "build or load it first)") from None  # fmt: skip
        with self._lock:
            self._all_containers[c.id] = c
        c.start()
        self._note_init(c)
        if c.status != "running":
            raise ChaosbenchError(f"container {cname} did not start (status {c.status}); "
                                  f"see `docker logs {cname}`")  # fmt: skip
        return c

    # ------------------------------------------------------------------ engine events -> timeline
    def _start_events(self) -> None:
        since = time.time() - 1
        self._events_stream = self.stream_client.events(
            since=since, decode=True, filters={"label": f"{RUN_LABEL}={self.run.run_id}", "type": "container"}
        )
        t = threading.Thread(target=self._follow_events, daemon=True, name="docker-events")
        t.start()
        self._events_thread = t

    def _logical(self, cid: str) -> tuple[str | None, bool]:
        with self._lock:
            for n in list(self._nodes.values()) + self._spares:
                if n.cid == cid:
                    return n.name, n.spare
            for n in self._nodes.values():
                if any(c.id == cid for c in n.former):
                    return n.name, False
        return None, False

    def _follow_events(self) -> None:
        with contextlib.suppress(Exception):
            for ev in self._events_stream:
                action = ev.get("Action") or ev.get("status")
                actor = ev.get("Actor") or {}
                attrs = actor.get("Attributes") or {}
                cid = actor.get("ID") or ev.get("id") or ""
                t_ns = int(ev.get("timeNano") or now_ns())
                node, spare = self._logical(cid)
                if node is None:  # still being provisioned
                    node = attrs.get(NODE_LABEL)
                    spare = str(node).startswith("spare")
                base = {"node": node, "container": attrs.get("name"), "src": "runtime"}
                with self._engine_cv:
                    self._engine_times.setdefault((str(attrs.get("name")), str(action)), []).append(t_ns)
                    self._engine_cv.notify_all()
                if action == "start":
                    reason = "reboot" if cid in self._started else "provision"
                    self._started.add(cid)
                    self.run.timeline.emit("node_start", t_ns=t_ns, spare=spare, reason=reason, **base)
                elif action == "die":
                    code = int(attrs.get("exitCode", -1))
                    reason = self._exit_reasons.pop(cid, "cleanup" if self._closing.is_set() else "died")
                    self.run.timeline.emit("node_exit", t_ns=t_ns, exit_code=code, reason=reason, **base)
                elif action in ("pause", "unpause"):
                    self.run.timeline.emit(f"node_{action}", t_ns=t_ns, **base)

    # ------------------------------------------------------------------ nodes
    def _node(self, name: str) -> _Node:
        self.provision()
        with self._lock:
            node = self._nodes.get(name)
        if node is None:
            if not re.fullmatch(r"node\d+", name):
                known = ", ".join(sorted(self._nodes))
                raise ChaosbenchError(f"no node '{name}' in this run (nodes: {known})")
            node = self._add_node(name)
        return node

    def _add_node(self, name: str) -> _Node:
        """A node beyond the provisioned ones (a framework's own spare, e.g. ``torchrun-elastic``): a hot
        spare of the runtime takes the name when there is one, else a container is created and started."""
        with self._provision_lock:
            with self._lock:
                if name in self._nodes:
                    return self._nodes[name]
                spare = self._spares.pop(0) if self._spares else None
            if spare is not None:
                self._network.disconnect(spare.container)
                self._network.connect(spare.container, aliases=[name])
                node = _Node(name, spare.container)
                self.run.timeline.emit("node_start", src="runtime", node=name, container=spare.container.name,
                                       spare=True, reason="spare")  # fmt: skip
            else:
                node = _Node(name, self._create_container(name))
            with self._lock:
                self._nodes[name] = node
            return node

    def node_names(self) -> list[str]:
        self.provision()
        return sorted(self._nodes)

    def spares_left(self) -> int:
        with self._lock:
            return len(self._spares)

    def node_state(self, name: str) -> str:
        """``up``, ``paused``, ``down`` or ``transient``, from the engine."""
        node = self._node(name)
        with contextlib.suppress(Exception):
            node.container.reload()
            return CONTAINER_STATES.get(node.container.status, "transient")
        return "down"

    def node_pid(self, name: str) -> int:
        """Host pid of the node's init: ``nsenter -t PID -n`` enters its network namespace (so a network fault's
        rules go there). Refused for a container that is not this run's (:meth:`_owned`)."""
        node = self._owned(name, "entering its namespaces")
        pid = int(node.container.attrs["State"]["Pid"] or 0)
        if pid <= 0:
            raise ProcessLookupError(f"node {name} is not running")
        return pid

    def node_ip(self, name: str) -> str:
        node = self._node(name)
        node.container.reload()
        nets = node.container.attrs["NetworkSettings"]["Networks"]
        ip = (nets.get(self.network_name) or {}).get("IPAddress")
        if not ip:
            raise ProcessLookupError(f"node {name} has no address on {self.network_name}")
        return str(ip)

    def node_iface(self, name: str) -> str:
        """The node's interface on the run network (``eth0``; another name after a spare took over a node,
        since reconnecting a container to a network gives it a new interface)."""
        pid = self.node_pid(name)
        try:
            lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
        except OSError as exc:
            raise ProcessLookupError(f"node {name}: {exc}") from None
        names = [ln.split(":", 1)[0].strip() for ln in lines]
        names = [n for n in names if n != "lo" and not n.startswith(("tunl", "sit", "ip6tnl", "gre"))]
        return names[0] if len(names) == 1 else "eth0"

    def container_name(self, name: str) -> str:
        return str(self._node(name).container.name)

    def kill_node(self, name: str, sig: str = "SIGKILL", reason: str = "node-kill") -> str:
        """Kill the node's container (every process in it); returns the container's name. Refused for a
        container that is not this run's (:meth:`_owned`)."""
        node = self._owned(name, "killing it")
        with node.lock:
            self._exit_reasons[node.cid] = reason
            try:
                node.container.kill(signal=sig)
            except Exception as exc:  # noqa: BLE001 - the engine's refusal, as a skipped fault
                self._exit_reasons.pop(node.cid, None)
                raise ChaosbenchError(f"cannot kill node {name}: {exc}") from None
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
        return {"containers": killed, "signal": options.signal,
                **engine_effect(self, list(killed.values()), "die", since, "the container died")}  # fmt: skip

    def pause_node(self, name: str) -> str:
        """Freeze the node's container (docker pause); returns the container's name. Refused for a container that
        is not this run's (:meth:`_owned`)."""
        node = self._owned(name, "pausing it")
        with node.lock:
            node.container.pause()
            return str(node.container.name)

    def engine_event_ns(self, container: str, action: str, since_ns: int, timeout_s: float = 5.0) -> int | None:
        """When the engine reported ``action`` (``die``, ``pause``, ...) for a container of this run at or after
        ``since_ns`` (its own stamp: the moment a node fault took effect), waiting up to ``timeout_s`` for the
        event to arrive; None when it did not."""
        deadline = time.monotonic() + timeout_s
        with self._engine_cv:
            while True:
                seen = [t for t in self._engine_times.get((container, action), []) if t >= since_ns]
                if seen:
                    return min(seen)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._engine_cv.wait(left)

    def unpause_node(self, name: str) -> bool:
        """Unpause the node if it is paused; returns whether it was. Refused for a container that is not this
        run's (:meth:`_owned`)."""
        node = self._owned(name, "unpausing it")
        with node.lock:
            if node.container.status != "paused":
                return False
            node.container.unpause()
            return True

    def set_node_cpus(self, name: str, cpus: float | None) -> float | None:
        """Change the node's CPU limit live (``docker update --cpus``); returns the previous limit (None: none
        was set). None sets the host's CPU count: the engine cannot drop a CPU limit once set. Refused for a
        container that is not this run's (:meth:`_owned`)."""
        node = self._owned(name, "changing its CPU limit")
        before = int(node.container.attrs["HostConfig"].get("NanoCpus") or 0)
        nano = int((cpus if cpus else float(os.cpu_count() or 1)) * 1e9)
        api = self.client.api
        # The SDK's update_container() has no nano_cpus; the Engine API's update takes NanoCpus.
        res = api._post_json(api._url("/containers/{0}/update", node.cid), data={"NanoCpus": nano})
        api._result(res, True)
        return before / 1e9 if before else None

    def _node_ready(self, name: str) -> _Node:
        """The node, running: waits while it is paused or booting; brings a lost node back per ``lost_node``."""
        node = self._node(name)
        state = "transient"

        def look() -> str:
            with contextlib.suppress(Exception):
                node.container.reload()
            return CONTAINER_STATES.get(node.container.status, "transient")

        def ready() -> _Node | None:
            nonlocal node, state
            if self._closing.is_set():
                raise ChaosbenchError(f"run is being torn down; not starting anything on {name}")
            with node.lock:
                node = self._nodes[name]
                state = look()
                if state == "down":
                    self._recover(node)
                    state = look()  # right away: a rebooted node or a spare is up at once
                return node if state == "up" else None

        found = wait_until(ready, self.opts.node_wait_s)
        if found is None:
            raise ChaosbenchError(f"node {name} stayed {state} for {self.opts.node_wait_s} s")
        return found

    def _recover(self, node: _Node) -> None:
        """Bring a lost node back (called with ``node.lock`` held)."""
        policy = self.opts.lost_node
        if policy == "spare" and self._spares:
            with self._lock:
                spare = self._spares.pop(0)
            self._network.disconnect(spare.container)
            self._network.connect(spare.container, aliases=[node.name])
            node.former.append(node.container)
            node.container = spare.container
            self._note_init(node.container)
            self.run.timeline.emit("node_start", src="runtime", node=node.name, container=node.container.name,
                                   spare=True, reason="takeover", replaces=node.former[-1].name)  # fmt: skip
            return
        if policy == "none" or policy == "spare":
            why = "no spare left" if policy == "spare" else "lost_node: none"
            raise ChaosbenchError(f"node {node.name} is down ({why})")
        if self.opts.reboot_delay_s:
            time.sleep(self.opts.reboot_delay_s)
        try:
            node.container.start()
            self._note_init(node.container)
        except Exception as exc:  # noqa: BLE001
            raise ChaosbenchError(f"cannot reboot node {node.name}: {exc}") from None

    # ------------------------------------------------------------------ processes
    def _env(self, spec: ProcessSpec, iface: str = "eth0") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV_PREFIXES)}
        env.pop("PYTHONHOME", None)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if self.opts.image is None:
            # The built-in image carries the harness's interpreter and virtualenv at their host paths: a user's
            # command saying `python` (or torchrun) finds them first, as it does on the local runtime
            path = f"{os.path.dirname(sys.executable)}:{path}"
        env.update({"PATH": path, "HOME": "/tmp", "GLOO_SOCKET_IFNAME": iface, "PYTHONUNBUFFERED": "1"})
        env.update(self.opts.env)
        env.update(spec.env)
        return env

    def _argv(self, argv: list[str]) -> list[str]:
        if self.opts.python and argv and argv[0] == sys.executable:
            return [self.opts.python, *argv[1:]]
        return list(argv)

    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        on_line = self.observed(on_line)
        handle = ExecHandle(spec, 0, None)
        self._exec(handle, on_line, rerun=False)
        with self._lock:
            self._handles.append(handle)
        w = threading.Thread(target=self._wait, args=(handle, on_line), daemon=True, name=f"wait-{spec.name}")
        w.start()
        self._threads.append(w)
        return handle

    def _exec(self, handle: ExecHandle, on_line: LineCallback | None, rerun: bool) -> None:
        spec = handle.spec
        node = self._node_ready(spec.node)
        api = self.stream_client
        iface = "eth0"
        with contextlib.suppress(ProcessLookupError, OSError, ChaosbenchError):
            iface = self.node_iface(spec.node)
        env = self._env(spec, iface)
        if rerun:  # the node's entrypoint again: a new incarnation of whatever it runs
            env["CHAOSBENCH_INCARNATION"] = str(spec.incarnation + handle.runs)
        argv = self._argv(spec.argv)
        offer: Offer | None = None
        launcher_python = self._launcher_python()
        if self._handover is not None and launcher_python is not None:
            offer = self._handover.offer(open_captures("socket", env))
            argv = self._handover.launcher_argv(launcher_python, offer, argv)
        try:
            ex = api.exec_create(node.cid, argv, stdout=True, stderr=True, stdin=False, environment=env,
                                 workdir=spec.cwd)  # fmt: skip
            stream = api.exec_start(ex["Id"], stream=True, demux=True)
        except Exception as exc:  # noqa: BLE001 - the engine's refusal, as one line
            if offer is not None:
                offer.fail("the exec did not start")
                close_captures(offer.captures)
            raise ChaosbenchError(f"cannot start '{spec.name}' on {spec.node}: {exc}") from None

        def started() -> dict[str, Any] | None:  # the exec's inspect data once it has a pid, or an exit code
            info: dict[str, Any] = api.exec_inspect(ex["Id"])
            done = info.get("Pid") or not info.get("Running", True) and info.get("ExitCode") is not None
            return info if done else None

        info = wait_until(started, 10, interval_s=0.005) or {}
        t_start = now_ns()  # proc_start's moment: the process runs (the handover below takes its launcher's start-up)
        pid = int(info.get("Pid") or 0)
        handle.pid = pid
        handle.ticks = process.start_ticks(pid) if pid else None
        # the launcher execs the command in its own process: this pid and these ticks are the command's
        handle.exit_watch = process.EXITS.watch_pid(pid, handle.ticks) if pid else None
        handle.exec_id = ex["Id"]
        handle.container_id = node.cid
        ns = _nspid(pid) if pid else []
        handle.container_pid = ns[-1] if ns else None
        handle.runs += 1
        if pid:
            self._trees.add(pid, handle.ticks)
        # the exec's own stream: everything before the launcher took the sockets, or all of it when it could not
        t = threading.Thread(target=self._pump, args=(handle, stream, on_line, offer), daemon=True,
                             name=f"pump-{spec.name}")  # fmt: skip
        t.start()
        self._threads.append(t)
        stamp: dict[str, Any] = {"output_stamp": "read", "output_stamp_reason": self._read_stamp_reason}
        if offer is not None:
            if offer.wait(HANDOVER_WAIT_S):
                stamp = {"output_stamp": offer.captures["stdout"].stamp}
            else:
                close_captures(offer.captures)
                stamp["output_stamp_reason"] = offer.reason
        record_start(self.run.timeline, handle, t_ns=t_start, container=node.container.name,
                     container_pid=handle.container_pid, rerun=rerun, **stamp)  # fmt: skip
        if offer is not None and offer.handed:
            self._threads += start_pumps(handle, offer.captures, self.logs_dir, on_line)

    @property
    def capture_dir(self) -> str | None:
        """The host directory of the output handover's socket (mounted in every node), while it exists."""
        return self._handover.host_dir if self._handover is not None else None

    def _launcher_python(self) -> str | None:
        """The node's interpreter that runs the output launcher: the harness's own in the default image, the
        ``python`` option in a user's image; None when a user's image names none."""
        if self.opts.python:
            return self.opts.python
        return sys.executable if self.opts.image is None else None

    def _pump(self, handle: ExecHandle, stream: Any, on_line: LineCallback | None, offer: Offer | None) -> None:
        """The exec's own stream, stamped when read. With an ``offer``, the launcher's line saying it could not
        take the capture sockets, or the stream's end before they were taken, settles the offer as failed."""
        paths = {"stdout": self.logs_dir / f"{handle.name}.out", "stderr": self.logs_dir / f"{handle.name}.err"}
        files = {k: p.open("ab") for k, p in paths.items()}
        bufs = {"stdout": b"", "stderr": b""}
        try:
            with contextlib.suppress(Exception):
                for out, err in stream:
                    t = now_ns()
                    for name, chunk in (("stdout", out), ("stderr", err)):
                        if not chunk:
                            continue
                        data = bufs[name] + chunk
                        *lines, bufs[name] = data.split(b"\n")
                        for raw in lines:
                            if offer is not None and name == "stderr" and raw.startswith(LAUNCHER_FALLBACK):
                                offer.fail(raw[len(LAUNCHER_FALLBACK) :].decode(errors="replace"))
                            self._line(handle, name, raw + b"\n", files[name], on_line, t)
            for name, rest in bufs.items():
                if rest:
                    self._line(handle, name, rest, files[name], on_line, now_ns())
        finally:
            if offer is not None:
                offer.fail("the process's exec stream ended before it took the capture sockets")
            for f in files.values():
                f.close()

    @staticmethod
    def _line(handle: ProcHandle, stream: str, raw: bytes, out: Any, on_line: LineCallback | None, t: int) -> None:
        out.write(raw)
        out.flush()
        if on_line is not None:
            with contextlib.suppress(Exception):
                on_line(handle, stream, raw.decode(errors="replace").rstrip("\n"), t)

    def _exit_code(self, handle: ExecHandle) -> tuple[int, bool]:
        """The exec's exit status and whether its node went down with it."""
        api = self.stream_client

        def ended() -> dict[str, Any] | None:  # the exec's inspect data once it has an exit code
            with contextlib.suppress(Exception):
                info: dict[str, Any] = api.exec_inspect(handle.exec_id)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return info
            return None

        info = wait_until(ended, 3, interval_s=0.02)
        code = int(info["ExitCode"]) if info is not None else None
        rc = _decode_exit(code)
        # Killed with its node? The node's init (PID 1 of its pid namespace) dies first when a container
        # is killed, and the kernel then kills the rest; the engine's own state lags behind.
        node_lost = code is None or (rc == -signal.SIGKILL and not self._init_alive(handle.container_id))
        return rc, node_lost

    def _init_alive(self, cid: str) -> bool:
        """Whether the container's init still lives and is not exiting. The kernel kills the rest of a pid
        namespace while its init exits (PF_EXITING set, not yet a zombie), before the engine notices."""
        with self._lock:
            init = self._inits.get(cid)
        if init is None:
            return True
        if not process.alive(*init):
            return False
        try:
            raw = Path(f"/proc/{init[0]}/stat").read_text()
            flags = int(raw[raw.rindex(")") + 2 :].split()[6])
        except (OSError, ValueError, IndexError):
            return False
        return not flags & PF_EXITING

    def _note_init(self, container: Any) -> None:
        """Remember the host pid and start time of a (re)started container's init."""
        container.reload()
        pid = int(container.attrs["State"]["Pid"] or 0)
        if pid > 0:
            with self._lock:
                self._inits[container.id] = (pid, process.start_ticks(pid))

    def _wait(self, handle: ExecHandle, on_line: LineCallback | None) -> None:
        while True:
            # not the harness's child: the watch never reaps it; the exit code comes from the engine
            status = handle.exit_watch.wait() if handle.exit_watch is not None else None
            t_exit, exit_stamp = (status.t_ns, status.stamp) if status is not None else (now_ns(), "wait")
            rc, node_lost = self._exit_code(handle)
            rerun = (node_lost and handle.spec.role in self.opts.rerun_roles and self.opts.lost_node != "none"
                     and not self._closing.is_set())  # fmt: skip
            record_exit(self.run.timeline, handle, rc, t_exit, exit_stamp, node_lost=node_lost)
            if rerun:
                try:
                    self._exec(handle, on_line, rerun=True)
                    continue
                except ChaosbenchError as exc:
                    self.run.timeline.emit("log", src="runtime", proc=handle.name, line=f"not run again: {exc}")
            handle.t_exit_ns = t_exit
            handle.returncode = rc
            handle.exited.set()
            return

    # ------------------------------------------------------------------ signals
    def _owned(self, name: str, doing: str, target: str | None = None) -> _Node:
        """The one rule before this runtime acts on a node (pause, unpause, kill, CPU limit, ``nsenter``, a
        signal to a process in it): ``name`` must be a node of this run and its container must carry this run's
        label as the engine reports it now (the container is reloaded). Returns the node. Raises
        ChaosbenchError, and does nothing, when either does not hold: one line naming ``target`` (what would have
        been acted on, e.g. ``pid 12``) when given, the node or container, why, and ``doing`` (what would have
        been done: "pausing it"). ProcessLookupError when the node's container is gone."""
        import docker.errors

        who = f"{target}: " if target else ""
        with self._lock:
            known = name in self._nodes
        if not known:
            raise ChaosbenchError(f"{who}{name!r} is not a node of this run; not {doing}")
        node = self._node(name)
        try:
            node.container.reload()
        except docker.errors.NotFound:
            raise ProcessLookupError(f"node {name}: its container is gone") from None
        labels = (node.container.attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(RUN_LABEL) != self.run.run_id:
            raise ChaosbenchError(f"{who}container {node.container.name} has no label {RUN_LABEL}={self.run.run_id}; "
                                  f"not {doing}")  # fmt: skip
        return node

    def _host_pid(self, cpid: int, node_name: str | None) -> int | None:
        """Host pid of the process ``cpid`` of a node's pid namespace (None: no such process), searched in the
        named node (None: every node of this run). A node that is not this run's is refused
        (:meth:`_owned`)."""
        with self._lock:
            names = [node_name] if node_name is not None else list(self._nodes)
        for name in names:
            try:
                node = self._owned(name, "signalling it", f"pid {cpid}")
            except ProcessLookupError:
                continue  # the node's container is gone, and every process in it
            init = int(node.container.attrs["State"]["Pid"] or 0)
            if init <= 0:
                continue
            ns = _ns_inode(init)
            if ns is None:
                raise Unsupported("the docker runtime must run on the engine's host (no /proc of the nodes)")
            for entry in os.listdir("/proc"):
                if entry.isdigit() and _ns_inode(int(entry)) == ns:
                    nsp = _nspid(int(entry))
                    if nsp and nsp[-1] == cpid:
                        return int(entry)
        return None

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        """Signals ``pid`` of the named node's pid namespace; refused (ChaosbenchError) for a node that is not
        this run's or whose container lacks the run's label (:meth:`_owned`)."""
        host = self._host_pid(pid, node)
        proc = process.find(host) if host is not None else None
        if proc is None:
            raise ProcessLookupError(pid)
        if not process.same(proc, ticks):
            raise ChaosbenchError(f"pid {pid} on {node} now belongs to another process; not signalling it")
        # the engine's host: the same kernel and clock as the harness
        return process.signal_stamped(proc, sig)

    def process_alive(self, pid: int, ticks: int | None = None, node: str | None = None) -> bool:
        try:
            host = self._host_pid(pid, node)
        except (ChaosbenchError, ProcessLookupError):
            return False  # not a process of this run's nodes: none of ours is alive there
        return host is not None and process.alive(host, ticks)

    # ------------------------------------------------------------------ teardown
    @staticmethod
    def _roots(handles: list[ExecHandle]) -> list[tuple[int, int | None]]:
        return [(h.pid, h.ticks) for h in handles if h.pid and not h.exited.is_set()]

    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        ours = [h for h in handles if isinstance(h, ExecHandle)]
        self._trees.terminate(lambda: self._roots(ours), grace_s)
        for h in ours:
            # A process on a paused node dies only once the node is unpaused: do not wait for it here.
            if self._provisioned and self._paused_container(h.container_id):
                continue
            h.exited.wait(timeout=10)

    def _paused_container(self, cid: str) -> bool:
        with contextlib.suppress(Exception):
            return bool(self.client.containers.get(cid).status == "paused")
        return False

    def cleanup(self, grace_s: float = 5.0) -> None:
        """Terminate every process, remove every container and the network of this run. Idempotent."""
        with self._lock:
            if self._closed:
                return
            handles: list[ProcHandle] = list(self._handles)
        self._closing.set()
        self.terminate(handles, grace_s)
        self._trees.kill_known()
        if self._client is not None:
            self._remove_all()
        for h in handles:
            h.exited.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
        if self._events_stream is not None:
            time.sleep(0.3)  # let the engine deliver the last `die` events
            with contextlib.suppress(Exception):
                self._events_stream.close()
            if self._events_thread is not None:
                self._events_thread.join(timeout=5)
        if self._handover is not None:
            self._handover.close()
        with self._lock:
            self._closed = True
        for c in (self._stream_client, self._client):
            with contextlib.suppress(Exception):
                if c is not None:
                    c.close()

    def _remove_all(self) -> None:
        import docker.errors

        with self._lock:
            containers = list(self._all_containers.values())
        for c in containers:
            with contextlib.suppress(docker.errors.NotFound):
                c.reload()
                if c.status == "paused":
                    c.unpause()
                c.remove(force=True, v=True)
        if self._network is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._network.remove()

    def leftovers(self) -> list[int]:
        """Host pids of this run's processes still alive (containers removed: none can be)."""
        with self._lock:
            handles = [h for h in self._handles if isinstance(h, ExecHandle)]
        return self._trees.alive(self._roots(handles))

    def leftover_objects(self) -> list[str]:
        """Containers and networks labelled with this run's id that still exist."""
        if self._client is None:
            return []
        flt = {"label": f"{RUN_LABEL}={self.run.run_id}"}
        out = [f"container {c.name}" for c in self.client.containers.list(all=True, filters=flt, ignore_removed=True)]
        out += [f"network {n.name}" for n in self.client.networks.list(filters=flt)]
        return out


# ---------------------------------------------------------------------------------------------- cleanup
def remove_run_objects(results_dir: str | os.PathLike[str], dry_run: bool = False) -> list[str]:
    """``chaosbench cleanup`` for docker: remove the containers and networks labelled with the run id of a
    crashed run below ``results_dir`` (and only those; qdiscs and iptables rules live in the containers'
    network namespaces and go with them), and the output handover's host directory their containers mounted. Returns one line per action; nothing when no engine answers."""
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
        for c in client.containers.list(all=True, filters=flt, ignore_removed=True):
            capture_dirs |= {m.get("Source", "") for m in c.attrs.get("Mounts") or []
                             if m.get("Destination") == NODE_DIR
                             and os.path.basename(m.get("Source", "")).startswith(CAPTURE_DIR_PREFIX)}  # fmt: skip
            actions.append(f"remove container {c.name} of {run_dir}")
            if not dry_run:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    if c.status == "paused":
                        c.unpause()
                    c.remove(force=True, v=True)
        # the output handover's host directory, known from the run's own containers' mounts
        for d in sorted(capture_dirs):
            actions.append(f"remove capture directory {d} of {run_dir}")
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
        for n in client.networks.list(filters=flt):
            actions.append(f"remove network {n.name} of {run_dir}")
            if not dry_run:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    n.remove()
    client.close()
    return actions
