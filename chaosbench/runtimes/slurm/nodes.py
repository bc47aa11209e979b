"""Where the ``slurm`` runtime's workload nodes run: ``node0..nodeN-1`` placed on Slurm nodes (pinned by the
``nodes`` option, else the partition's first usable ones) and replaced when theirs becomes unusable
(:class:`NodeMap`), node0's address as the master's and the run's listener ports, and the partition split
between concurrent runs (:func:`split_partition`). Nothing here runs a Slurm command before a run starts: a dry
run plans with :data:`UNRESOLVED_MASTER_ADDR` and the port sequence alone."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable
from typing import Any

from chaosbench.errors import EngineError, SpecError, Unsupported
from chaosbench.runtimes.base import RunInfo, bindable
from chaosbench.runtimes.slurm.commands import SlurmCommands
from chaosbench.runtimes.slurm.options import SlurmOptions, commands_for
from chaosbench.runtimes.slurm.states import USABLE_NODE_STATES, node_state

#: What a plan holds for the master's address while the runtime is not resolved (a dry run).
UNRESOLVED_MASTER_ADDR = "<slurm:node0>"
#: Listener ports (rendezvous, stores) come from here: below Linux's ephemeral range (32768-60999), from which
#: every connection's local port is taken, so none of those can hold one of ours.
PORT_RANGE = (20000, 32768)


def split_partition(opts: SlurmOptions, jobs: int, nodes: int) -> list[dict[str, Any]]:
    """Runtime options for ``jobs`` concurrent runs of ``nodes`` nodes each, on Slurm nodes of their own: the
    partition's usable nodes (less ``exclude``) split in ``jobs`` groups, each slot excluding every other
    group's. Raises Unsupported when a group would have fewer nodes than ``nodes``, or when ``opts`` pins
    ``nodes``. Runs ``sinfo``/``scontrol`` (MissingEngine or ChaosbenchError when they fail)."""
    if opts.nodes:
        raise Unsupported(
            "slurm: the suite pins workload nodes to Slurm nodes; --jobs cannot place runs apart"
        )
    slurm = commands_for(opts)
    infos = slurm.nodes_info()
    usable = [
        n
        for n in slurm.partition_nodes()
        if n not in opts.exclude and node_state(infos.get(n, {}).get("State", "")) in USABLE_NODE_STATES
    ]
    share = len(usable) // jobs  # the smallest group's size
    if share < nodes:
        raise Unsupported(
            f"slurm: {jobs} concurrent runs of {nodes} node(s) each need {jobs * nodes} usable "
            f"nodes; the partition has {len(usable)} ({', '.join(usable) or 'none'})"
        )
    groups = [usable[i::jobs] for i in range(jobs)]  # the remainder's nodes too: spares of the first groups
    return [{"exclude": [*opts.exclude, *(n for n in usable if n not in group)]} for group in groups]


class NodeMap:
    """The placement of run ``run``'s workload nodes on the Slurm nodes of the cluster ``slurm()`` answers for
    (the runtime's commands, asked at each use), under the options ``opts``; and the run's listener ports, a
    sequence that starts where ``job_prefix`` (the run's job-name prefix, ``cb-<hex hash>``) says.

    ``mapped`` (workload node -> Slurm node it runs on) and ``reserved`` (workload node -> Slurm node chosen by
    :meth:`reserve`, not yet used) change only under ``lock``; each new placement is a ``node_map`` event."""

    def __init__(
        self, run: RunInfo, opts: SlurmOptions, slurm: Callable[[], SlurmCommands], job_prefix: str
    ) -> None:
        self.run, self.opts, self._slurm = run, opts, slurm
        self.lock = threading.Lock()
        self.mapped: dict[str, str] = {}  # workload node -> Slurm node
        self.reserved: dict[str, str] = {}  # workload node -> Slurm node chosen by reserve(), not yet used
        self._node_addr: dict[str, str] = {}  # Slurm node -> its NodeAddr
        self._local_addrs: dict[str, bool] = {}  # node address -> whether it is this host
        lo, hi = PORT_RANGE
        self._next_port = int(job_prefix.removeprefix("cb-"), 16) % (hi - lo)  # this run's first port
        self._port_lock = threading.Lock()

    def reserve(self, node: str) -> None:
        """Choose ``node``'s Slurm node without taking it (unless it is placed already): its ``node_map`` event
        is written when a process first starts there. Runs Slurm commands. Call with ``lock`` held."""
        if node not in self.mapped:
            self.reserved[node] = self._choose(node, None)[0]

    def _choose(self, node: str, current: str | None) -> tuple[str, dict[str, dict[str, str]]]:
        """Where workload node ``node`` goes (``current``: where it is now; None: first use), without taking it,
        and the partition's nodes as ``scontrol`` shows them. Remembers the chosen node's address. Raises
        ChaosbenchError when a pinned node does not exist or no usable node is left. Call with ``lock`` held."""
        slurm = self._slurm()
        slurm.check()
        infos = slurm.nodes_info()
        usable = {n for n, kv in infos.items() if node_state(kv.get("State", "")) in USABLE_NODE_STATES}
        pinned = self.opts.nodes.get(node)
        reserved = self.reserved.get(node)
        if current is not None and current in usable:
            choice = current
        elif current is None and pinned is not None:
            if pinned not in infos:
                raise SpecError(
                    f"{node} -> {pinned}: no such node in the partition", obj="runtime option nodes"
                )
            choice = pinned
        elif current is None and reserved is not None and reserved in usable:
            choice = reserved
        else:
            choice = self._free_node(slurm, node, current, usable)
        if choice not in self._node_addr:
            addr = infos.get(choice, {}).get("NodeAddr", choice)
            self._node_addr[choice] = addr
            self._local_addrs.setdefault(addr, _is_local(addr))
        return choice, infos

    def _free_node(self, slurm: SlurmCommands, node: str, current: str | None, usable: set[str]) -> str:
        """The partition's first usable Slurm node that no other workload node has, is pinned to or reserved,
        and that is not excluded. Raises EngineError when there is none, or when ``node`` already runs on
        ``current`` (unusable) and ``replace_lost_nodes`` is off. Call with ``lock`` held."""
        taken = (
            set(self.mapped.values())
            | set(self.opts.nodes.values())
            | {s for n, s in self.reserved.items() if n != node}
        )
        free = [
            n
            for n in slurm.partition_nodes()
            if n in usable and n not in taken and n not in self.opts.exclude
        ]
        if current is not None and not self.opts.replace_lost_nodes:
            raise EngineError(
                "slurm", f"{node}'s Slurm node {current} is unusable and replace_lost_nodes is off"
            )
        if not free:
            raise EngineError(
                "slurm", f"no usable Slurm node left for {node} (partition {self.opts.partition})"
            )
        return free[0]

    def slurm_node(self, node: str, for_start: bool = False) -> str:
        """The Slurm node a workload node runs on, taken on first use (the one :meth:`reserve` chose for it, if
        still usable). With ``for_start`` an unusable mapped node is replaced by a free one
        (``replace_lost_nodes``). Either is recorded as a ``node_map`` event."""
        with self.lock:
            current = self.mapped.get(node)
            if current is not None and not for_start:
                return current
            choice, infos = self._choose(node, current)
            if choice == current:
                return current
            self.mapped[node] = choice
            self.reserved.pop(node, None)
            if current is not None:
                self.run.timeline.emit(
                    "node_map",
                    node=node,
                    slurm_node=choice,
                    previous=current,
                    reason=f"{current} is {infos.get(current, {}).get('State', '?')}",
                )
            else:
                self.run.timeline.emit(
                    "node_map", node=node, slurm_node=choice, previous=None, reason="first use"
                )
            return choice

    def mapped_to(self, node: str) -> str | None:
        """The Slurm node workload node ``node`` runs on, None when it has not been placed."""
        with self.lock:
            return self.mapped.get(node)

    def node_of_slurm(self, slurm_node: str) -> str | None:
        """The workload node mapped to a Slurm node, if any."""
        with self.lock:
            return next((n for n, s in self.mapped.items() if s == slurm_node), None)

    @property
    def master_addr(self) -> str:
        """The address (``NodeAddr``) of node0's Slurm node: where it runs, else where :meth:`reserve` chose
        it; :data:`UNRESOLVED_MASTER_ADDR` before either (a dry run)."""
        with self.lock:
            snode = self.mapped.get("node0") or self.reserved.get("node0")
            return self._node_addr.get(snode, snode) if snode is not None else UNRESOLVED_MASTER_ADDR

    def free_port(self) -> int:
        """A port for a listener on the master node, chosen without asking the cluster: the next of this run's
        sequence in :data:`PORT_RANGE`. Where the master is known to be this host, a port something here
        already listens on is skipped. Raises ChaosbenchError when the whole range is taken."""
        lo, hi = PORT_RANGE
        addr = self.master_addr
        local = self._local_addrs.get(addr, False)
        with self._port_lock:
            for _ in range(hi - lo):
                port = lo + self._next_port % (hi - lo)
                self._next_port += 1
                if not local or bindable(addr, port):
                    return port
        raise EngineError("slurm", f"no free port left in {lo}-{hi - 1} on {addr}")


def _is_local(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(addr))
    except (OSError, ValueError):
        return False
    if ip.is_loopback:
        return True
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((str(ip), 0))
        return True
    return False
