"""The docker runtime's nodes: the run's ``--internal`` network and the containers backing its nodes and hot
spares, created at provision, looked up by node name, brought back when lost (``lost_node``), checked before every
action on them (:meth:`NodePool.owned`) and removed at cleanup."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosbench.errors import ChaosbenchError, EngineError, ForeignTarget, TargetNotFound, Unsupported
from chaosbench.runtimes import process
from chaosbench.runtimes.base import RunInfo
from chaosbench.runtimes.docker import pids
from chaosbench.runtimes.docker.options import DockerOptions
from chaosbench.runtimes.docker.output import NODE_DIR
from chaosbench.waiting import wait_until

#: The CFS period of a node's CPU limit, in microseconds (what ``docker run --cpus`` uses).
CFS_PERIOD_US = 100_000


def cfs_quota_us(cpus: float) -> int:
    """The CFS quota per :data:`CFS_PERIOD_US` that limits a container to ``cpus`` CPUs."""
    return int(round(cpus * CFS_PERIOD_US))


RUN_LABEL = "chaosbench.run"
NODE_LABEL = "chaosbench.node"
RUN_DIR_LABEL = "chaosbench.run_dir"
#: On the run's network: the output handover's host directory, so that ``chaosbench cleanup`` finds it after a
#: crash that left the network but no container (whose mounts name it too).
CAPTURE_DIR_LABEL = "chaosbench.capture_dir"
#: Docker container states -> what the runtime makes of them.
CONTAINER_STATES = {
    "running": "up",
    "paused": "paused",
    "restarting": "transient",
    "removing": "transient",
    "created": "down",
    "exited": "down",
    "dead": "down",
}


@dataclass
class Node:
    """A logical node (``node1``) and the container now backing it."""

    name: str
    container: Any
    spare: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)
    former: list[Any] = field(default_factory=list)  # containers that backed it before a spare took over

    @property
    def cid(self) -> str:
        return str(self.container.id)


class NodePool:
    """The nodes of run ``run`` (options ``opts``) on the engine ``client()`` answers for; ``provision()`` makes
    them on first need, ``closing`` is set while the run is torn down."""

    def __init__(
        self,
        run: RunInfo,
        opts: DockerOptions,
        run_hash: str,
        client: Callable[[], Any],
        provision: Callable[[], None],
        closing: threading.Event,
    ) -> None:
        self.run, self.opts, self.run_hash, self._client, self._provision = (
            run,
            opts,
            run_hash,
            client,
            provision,
        )
        self.closing = closing
        self.network_name = f"{opts.network_prefix}-{run_hash}"
        self.network: Any = None
        self.nodes: dict[str, Node] = {}
        self.spares: list[Node] = []
        self.containers: dict[str, Any] = {}  # id -> container, everything this run created
        self.inits: dict[str, tuple[int, int | None]] = {}  # container id -> its init's host pid, ticks
        self.lock = threading.RLock()  # short critical sections only: never held across engine calls
        self.provision_lock = threading.Lock()
        self.provisioned = False
        self.image: str | None = None
        self._create_spec: dict[str, Any] = {}

    @property
    def client(self) -> Any:
        return self._client()

    def labels(self, node: str | None = None) -> dict[str, str]:
        labels = {RUN_LABEL: self.run.run_id, RUN_DIR_LABEL: str(Path(self.run.run_dir).resolve())}
        if node is not None:
            labels[NODE_LABEL] = node
        return labels

    # ------------------------------------------------------------------ provisioning
    def create(self, nodes: int, capture_dir: str | None) -> None:
        """Create the network, ``nodes`` node containers and the spares, and start them (in parallel); the
        output handover's ``capture_dir`` is mounted in each. Called with :attr:`provision_lock` held."""
        labels = self.labels() | ({CAPTURE_DIR_LABEL: capture_dir} if capture_dir is not None else {})
        self.network = self.client.networks.create(
            self.network_name, driver="bridge", internal=True, labels=labels, check_duplicate=True
        )
        self._create_spec = self._container_spec(capture_dir)
        names = [f"node{i}" for i in range(nodes)] + [f"spare{i}" for i in range(self.opts.spare_nodes)]
        errors: dict[str, list[str]] = {}  # the error -> the nodes that had it (each said once)
        created: dict[str, Any] = {}

        def make(name: str) -> None:
            try:
                created[name] = self._create_container(name)
            except Exception as exc:  # noqa: BLE001 - collected and raised below as one error
                with self.lock:
                    errors.setdefault(str(exc), []).append(name)

        threads = [threading.Thread(target=make, args=(n,), daemon=True) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with self.lock:
            for name in names:
                if name in created:
                    node = Node(name, created[name], spare=name.startswith("spare"))
                    (self.spares.append(node) if node.spare else self.nodes.__setitem__(name, node))
            self.provisioned = True
        if errors:
            why = "; ".join(f"{', '.join(sorted(who))}: {e}" for e, who in errors.items())
            raise EngineError("docker", f"cannot start the nodes of run {self.run.run_id}: {why}")

    def _container_spec(self, capture_dir: str | None) -> dict[str, Any]:
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
        if capture_dir is not None:
            # read-only: connecting to a Unix socket needs no write access to its file system
            mounts.append(Mount(target=NODE_DIR, source=capture_dir, type="bind", read_only=True))
        spec: dict[str, Any] = {
            "image": self.image,
            "command": command,
            "init": init,
            "detach": True,
            "mounts": mounts,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=1g"},
            "network": self.network_name,
            "environment": {"GLOO_SOCKET_IFNAME": "eth0"},
            "stop_signal": "SIGKILL",
        }
        if self.opts.cpus_per_node is not None:
            # as `docker run --cpus` does (its NanoCpus is a CFS quota per 100 ms period), but through the
            # fields the SDK's public update() can change later (set_node_cpus)
            spec["cpu_period"] = CFS_PERIOD_US
            spec["cpu_quota"] = cfs_quota_us(self.opts.cpus_per_node)
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
            c = self.client.containers.create(
                name=cname,
                hostname=name,
                labels=self.labels(name),
                networking_config={self.network_name: endpoint},
                **spec,
            )
        except docker.errors.ImageNotFound:
            raise EngineError(
                "docker",
                f"image {self.image!r} is not on this engine (no registry is reachable: build or load it first)",
            ) from None
        with self.lock:
            self.containers[c.id] = c
        c.start()
        self.note_init(c)
        if c.status != "running":
            raise EngineError(
                "docker", f"container {cname} did not start (status {c.status}); see `docker logs {cname}`"
            )
        return c

    def note_init(self, container: Any) -> None:
        """Remember the host pid and start time of a (re)started container's init."""
        container.reload()
        pid = int(container.attrs["State"]["Pid"] or 0)
        if pid > 0:
            with self.lock:
                self.inits[container.id] = (pid, process.start_ticks(pid))

    def init_alive(self, cid: str) -> bool:
        """Whether the container's init still lives and is not exiting (:func:`pids.init_alive`)."""
        with self.lock:
            init = self.inits.get(cid)
        return pids.init_alive(init)

    def logical(self, cid: str) -> tuple[str | None, bool]:
        """The node a container backs or backed, and whether it is a spare; (None, False): none yet."""
        with self.lock:
            for n in list(self.nodes.values()) + self.spares:
                if n.cid == cid:
                    return n.name, n.spare
            for n in self.nodes.values():
                if any(c.id == cid for c in n.former):
                    return n.name, False
        return None, False

    # ------------------------------------------------------------------ nodes by name
    def node(self, name: str) -> Node:
        self._provision()
        with self.lock:
            node = self.nodes.get(name)
        if node is None:
            if not re.fullmatch(r"node\d+", name):
                known = ", ".join(sorted(self.nodes))
                raise TargetNotFound(
                    f"node {name}",
                    f"no such node in this run (nodes: {known})",
                    message=f"no node '{name}' in this run (nodes: {known})",
                )
            node = self._add_node(name)
        return node

    def _add_node(self, name: str) -> Node:
        """A node beyond the provisioned ones (a framework's own spare, e.g. ``torchrun-elastic``): a hot
        spare of the runtime takes the name when there is one, else a container is created and started."""
        with self.provision_lock:
            with self.lock:
                if name in self.nodes:
                    return self.nodes[name]
                spare = self.spares.pop(0) if self.spares else None
            if spare is not None:
                self.network.disconnect(spare.container)
                self.network.connect(spare.container, aliases=[name])
                node = Node(name, spare.container)
                self.run.timeline.emit(
                    "node_start",
                    src="runtime",
                    node=name,
                    container=spare.container.name,
                    spare=True,
                    reason="spare",
                )
            else:
                node = Node(name, self._create_container(name))
            with self.lock:
                self.nodes[name] = node
            return node

    def state(self, name: str) -> str:
        """``up``, ``paused``, ``down`` or ``transient``, from the engine."""
        node = self.node(name)
        with contextlib.suppress(Exception):
            node.container.reload()
            return CONTAINER_STATES.get(node.container.status, "transient")
        return "down"

    def ready(self, name: str) -> Node:
        """The node, running: waits while it is paused or booting; brings a lost node back per ``lost_node``."""
        node = self.node(name)
        state = "transient"

        def look() -> str:
            with contextlib.suppress(Exception):
                node.container.reload()
            return CONTAINER_STATES.get(node.container.status, "transient")

        def ready() -> Node | None:
            nonlocal node, state
            if self.closing.is_set():
                raise ChaosbenchError(f"run is being torn down; not starting anything on {name}")
            with node.lock:
                node = self.nodes[name]
                state = look()
                if state == "down":
                    self._recover(node)
                    state = look()  # right away: a rebooted node or a spare is up at once
                return node if state == "up" else None

        found = wait_until(ready, self.opts.node_wait_s)
        if found is None:
            raise EngineError("docker", f"node {name} stayed {state} for {self.opts.node_wait_s} s")
        return found

    def _recover(self, node: Node) -> None:
        """Bring a lost node back (called with ``node.lock`` held)."""
        policy = self.opts.lost_node
        if policy == "spare" and self.spares:
            with self.lock:
                spare = self.spares.pop(0)
            self.network.disconnect(spare.container)
            self.network.connect(spare.container, aliases=[node.name])
            node.former.append(node.container)
            node.container = spare.container
            self.note_init(node.container)
            self.run.timeline.emit(
                "node_start",
                src="runtime",
                node=node.name,
                container=node.container.name,
                spare=True,
                reason="takeover",
                replaces=node.former[-1].name,
            )
            return
        if policy == "none" or policy == "spare":
            why = "no spare left" if policy == "spare" else "lost_node: none"
            raise TargetNotFound(
                f"node {node.name}", f"is down ({why})", message=f"node {node.name} is down ({why})"
            )
        if self.opts.reboot_delay_s:
            time.sleep(self.opts.reboot_delay_s)
        try:
            node.container.start()
            self.note_init(node.container)
        except Exception as exc:  # noqa: BLE001
            raise EngineError("docker", f"cannot reboot node {node.name}: {exc}") from None

    # ------------------------------------------------------------------ the guard, and what it guards
    def owned(self, name: str, doing: str, target: str | None = None) -> Node:
        """The one rule before the runtime acts on a node (pause, unpause, kill, CPU limit, ``nsenter``, a
        signal to a process in it): ``name`` must be a node of this run and its container must carry this run's
        label as the engine reports it now (the container is reloaded). Returns the node. Raises
        :class:`~chaosbench.errors.ForeignTarget`, and does nothing, when either does not hold: one line naming ``target`` (what would have
        been acted on, e.g. ``pid 12``) when given, the node or container, why, and ``doing`` (what would have
        been done: "pausing it"). ProcessLookupError when the node's container is gone."""
        import docker.errors

        with self.lock:
            known = name in self.nodes
        if not known:
            raise ForeignTarget(repr(name), "is not a node of this run", doing, target=target)
        node = self.node(name)
        try:
            node.container.reload()
        except docker.errors.NotFound:
            raise ProcessLookupError(f"node {name}: its container is gone") from None
        labels = (node.container.attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(RUN_LABEL) != self.run.run_id:
            raise ForeignTarget(
                f"container {node.container.name}",
                f"has no label {RUN_LABEL}={self.run.run_id}",
                doing,
                target=target,
            )
        return node

    def init_pid(self, name: str) -> int:
        """Host pid of the node's init, for entering its namespaces (refused as :meth:`owned` says)."""
        node = self.owned(name, "entering its namespaces")
        pid = int(node.container.attrs["State"]["Pid"] or 0)
        if pid <= 0:
            raise ProcessLookupError(f"node {name} is not running")
        return pid

    def iface(self, name: str) -> str:
        """The node's interface on the run network (``eth0``; another name after a spare took over a node,
        since reconnecting a container to a network gives it a new interface)."""
        pid = self.init_pid(name)
        try:
            lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
        except OSError as exc:
            raise ProcessLookupError(f"node {name}: {exc}") from None
        names = [ln.split(":", 1)[0].strip() for ln in lines]
        names = [n for n in names if n != "lo" and not n.startswith(("tunl", "sit", "ip6tnl", "gre"))]
        return names[0] if len(names) == 1 else "eth0"

    def host_pid(self, cpid: int, node_name: str | None) -> int | None:
        """Host pid of the process ``cpid`` of a node's pid namespace (None: no such process), searched in the
        named node (None: every node of this run). A node that is not this run's is refused (:meth:`owned`)."""
        with self.lock:
            names = [node_name] if node_name is not None else list(self.nodes)
        for name in names:
            try:
                node = self.owned(name, "signalling it", f"pid {cpid}")
            except ProcessLookupError:
                continue  # the node's container is gone, and every process in it
            init = int(node.container.attrs["State"]["Pid"] or 0)
            if init <= 0:
                continue
            if pids.ns_inode(init) is None:
                raise Unsupported("the docker runtime must run on the engine's host (no /proc of the nodes)")
            found = pids.in_namespace(init, cpid)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ teardown
    def paused(self, cid: str) -> bool:
        with contextlib.suppress(Exception):
            return bool(self.client.containers.get(cid).status == "paused")
        return False

    def remove_containers(self) -> None:
        import docker.errors

        with self.lock:
            containers = list(self.containers.values())
        for c in containers:
            with contextlib.suppress(docker.errors.NotFound):
                c.reload()
                if c.status == "paused":
                    c.unpause()
                c.remove(force=True, v=True)

    def remove_network(self) -> None:
        """The run's network, last: until it is gone it names the capture directory (:data:`CAPTURE_DIR_LABEL`)."""
        import docker.errors

        if self.network is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self.network.remove()

    def leftover_objects(self) -> list[str]:
        """Containers and networks labelled with this run's id that still exist."""
        flt = {"label": f"{RUN_LABEL}={self.run.run_id}"}
        out = [
            f"container {c.name}"
            for c in self.client.containers.list(all=True, filters=flt, ignore_removed=True)
        ]
        out += [f"network {n.name}" for n in self.client.networks.list(filters=flt)]
        return out
