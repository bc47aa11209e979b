"""Network faults on container nodes, applied inside each node's network namespace from the host
(``nsenter -t <node init pid> -n tc|iptables ...``): ``net-delay``, ``net-loss``, ``net-bandwidth``, ``partition``.

Each acts on the node's ``eth0`` (the run's internal network; traffic between ranks of one node over ``lo`` is
not touched) and, like ``tc netem`` on an interface, on what the node sends (``direction: egress``) unless
asked otherwise. How (``method``):

- ``net-delay`` (``delay_ms``, ``jitter_ms``): ``tc qdisc add dev eth0 root netem delay D J`` where the kernel
  has sch_netem; else (``nfqueue``) an iptables ``NFQUEUE --queue-bypass`` rule hands the packets to
  :mod:`chaosbench.injectors.network.delayer`, a userspace delayer started in the node's namespace, which accepts each packet
  after ``D`` +- uniform ``J`` ms. An in-container TCP proxy would not do: gloo connects directly between ranks.
- ``net-loss`` (``percent``): netem ``loss P%``; else (``iptables``) ``-m statistic --mode random --probability
  p -j DROP``.
- ``net-bandwidth`` (``rate``): ``tbf`` as the root qdisc (works without netem).
- ``partition`` (``groups`` of nodes): iptables DROP (or REJECT) of every packet between nodes of different
  groups, in both directions, in each node's namespace; nodes in no group keep talking to everyone.

Reverts delete exactly the rules and qdiscs the firing added (rules carry the comment
``chaosbench:<run id>:<fault>:<index>``) and stop the delayer (which first accepts every packet it still
holds). All of it lives in the node's network namespace, so it also ends with the container (a crashed
harness: ``chaosbench cleanup`` removes the containers; the delayer exits when the harness is gone). A node
rebooted since the fault has a fresh namespace: nothing is left to revert there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError, EngineCommandFailed, EngineError, MissingEngine, TargetNotFound
from chaosbench.injectors.base import FaultContext, Injector, P, RunSetup, target_nodes
from chaosbench.runtimes.base import NodeControl, node_control
from chaosbench.timeline import now_ns

if TYPE_CHECKING:
    from chaosbench.specs import Target, Trigger

TOOLS = ("nsenter", "tc", "iptables")
READY_TIMEOUT_S = 10.0
#: What ``tc`` says when the kernel lacks a qdisc (netem is a module many kernels do not ship).
NO_QDISC = re.compile(r"Specified qdisc kind is unknown|Unknown qdisc|No such file or directory")
Direction = Literal["egress", "ingress", "both"]


def missing_tools() -> str | None:
    """Which host tools network faults need are missing, with the packages to install; None: none."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"network faults need {', '.join(missing)} on the host (apt-get install iproute2 iptables util-linux)"
    return None


def check_tools() -> None:
    missing = missing_tools()
    if missing:
        raise MissingEngine(missing)


def nsexec(
    rt: NodeControl, node: str, argv: list[str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a host tool inside the node's network namespace."""
    cmd = ["nsenter", "-t", str(rt.node_pid(node)), "-n", *argv]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        said = res.stderr.strip() or res.stdout.strip()
        raise EngineCommandFailed(cmd, res.returncode, said, message=f"{node}: {' '.join(argv)}: {said}")
    return res


def congestion_controls(rt: NodeControl, nodes: list[str]) -> dict[str, str | None]:
    """Each node's TCP congestion control (``net.ipv4.tcp_congestion_control`` of its namespace): what a delay,
    a loss or a bandwidth cap costs a job is that TCP's answer to it. None where it could not be read."""
    out: dict[str, str | None] = {}
    for node in nodes:
        out[node] = None
        with contextlib.suppress(ChaosbenchError, ProcessLookupError, OSError, subprocess.SubprocessError):
            res = nsexec(rt, node, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], check=False)
            if res.returncode == 0:
                out[node] = res.stdout.strip() or None
    return out


def with_congestion_controls(rt: NodeControl, nodes: list[str], details: dict[str, Any]) -> dict[str, Any]:
    """``details`` of a shaping fault now in force, with its effect stamped first and then the nodes'
    congestion controls (``tcp_congestion_control``) read, so reading them does not delay the stamp."""
    effect = now_ns()
    return {
        **details,
        "tcp_congestion_control": congestion_controls(rt, nodes),
        "effect_t_ns": effect,
        "effect": "the rules, qdisc or delayer in place",
    }


def iface(rt: NodeControl, node: str) -> str:
    """The node's interface on the run network."""
    return rt.node_iface(node)


def rule_tag(ctx: FaultContext, fault: str) -> list[str]:
    return ["-m", "comment", "--comment", f"chaosbench:{ctx.setup.run_id}:{fault}:{ctx.index}"]


def chains(direction: Direction) -> list[tuple[str, str]]:
    """(chain, interface option) pairs for a direction."""
    out = []
    if direction in ("egress", "both"):
        out.append(("OUTPUT", "-o"))
    if direction in ("ingress", "both"):
        out.append(("INPUT", "-i"))
    return out


class _NetInjector(Injector[P]):
    """Shared life cycle: checks, per-node rules and qdiscs remembered in ``ctx.state``, guaranteed revert."""

    needs_process: ClassVar[bool] = True
    needs_node_control: ClassVar[bool] = True

    def prepare(self, setup: RunSetup) -> None:
        check_tools()

    @classmethod
    def missing_engine(cls) -> str | None:
        return missing_tools()

    def _add_rule(self, ctx: FaultContext, rt: NodeControl, node: str, chain: str, spec: list[str]) -> None:
        nsexec(rt, node, ["iptables", "-w", "5", "-A", chain, *spec])
        ctx.state.setdefault("rules", []).append((node, chain, spec))

    def _add_qdisc(self, ctx: FaultContext, rt: NodeControl, node: str, kind: str, args: list[str]) -> bool:
        """``tc qdisc add dev eth0 root KIND ARGS``; False when the kernel lacks the qdisc."""
        argv = ["tc", "qdisc", "add", "dev", iface(rt, node), "root", kind, *args]
        res = nsexec(rt, node, argv, check=False)
        if res.returncode != 0:
            if NO_QDISC.search(res.stderr):
                return False
            said = res.stderr.strip()
            raise EngineCommandFailed(
                list(res.args), res.returncode, said, message=f"{node}: tc qdisc add {kind}: {said}"
            )
        ctx.state.setdefault("qdiscs", []).append((node, kind, iface(rt, node)))
        return True

    def revert(self, ctx: FaultContext) -> bool:
        rt = node_control(ctx.runtime, self.name)
        undone = False
        for node, chain, spec in reversed(ctx.state.pop("rules", [])):
            with contextlib.suppress(
                ChaosbenchError, ProcessLookupError, OSError, subprocess.SubprocessError
            ):
                if nsexec(rt, node, ["iptables", "-w", "5", "-D", chain, *spec], check=False).returncode == 0:
                    undone = True
        for node, kind, dev in ctx.state.pop("qdiscs", []):
            with contextlib.suppress(
                ChaosbenchError, ProcessLookupError, OSError, subprocess.SubprocessError
            ):
                shown = nsexec(rt, node, ["tc", "qdisc", "show", "dev", dev, "root"], check=False).stdout
                if shown.startswith(f"qdisc {kind} "):  # a rebooted node has its default qdisc again
                    nsexec(rt, node, ["tc", "qdisc", "del", "dev", dev, "root"])
                    undone = True
        for delayer in ctx.state.pop("delayers", []):
            undone = _stop_delayer(ctx, self.fault_name, delayer) or undone
        return undone


class _ShapingParams(BaseModel):
    """What the packet-shaping faults (delay, loss) share: the window, the direction, netem on egress only."""

    model_config = ConfigDict(extra="forbid")
    duration_s: float | None = Field(default=None, gt=0, description="window length; null: till the end")
    direction: Direction = Field(default="egress", description="packets the node sends, receives, or both")
    method: str

    @model_validator(mode="after")
    def _netem_egress(self) -> _ShapingParams:
        if self.method == "netem" and self.direction != "egress":
            raise ValueError(
                "netem shapes egress only; use method auto (or the other method) for ingress/both"
            )
        return self


#: A shaping fault's params.
SP = TypeVar("SP", bound=_ShapingParams)


class _ShapingInjector(_NetInjector[SP]):
    """A packet-shaping fault (delay, loss): netem on the node's egress when the kernel has it and the params
    allow it, else the fault's own mechanism (``fallback``) per node."""

    fallback: ClassVar[str]

    def netem_args(self) -> list[str]:
        raise NotImplementedError

    def inject_fallback(self, ctx: FaultContext, rt: NodeControl, node: str) -> None:
        raise NotImplementedError

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        rt = node_control(ctx.runtime, self.name)
        used: dict[str, str] = {}
        nodes = target_nodes(ctx)
        for node in nodes:
            used[node] = "netem" if self._netem(ctx, rt, node) else self.fallback
            if used[node] != "netem":
                self.inject_fallback(ctx, rt, node)
        details = {"method": used, **self.params.model_dump(exclude={"method", "duration_s"})}
        return with_congestion_controls(rt, nodes, details)

    def _netem(self, ctx: FaultContext, rt: NodeControl, node: str) -> bool:
        """``netem`` on the node's egress when the params allow it (``method`` auto or netem, ``direction``
        egress): True when it took; False to use the fallback; an error when netem was asked for and the kernel
        lacks it."""
        p = self.params
        if p.method not in ("auto", "netem") or p.direction != "egress":
            return False
        if self._add_qdisc(ctx, rt, node, "netem", self.netem_args()):
            return True
        if p.method == "netem":
            raise MissingEngine(f"{node}: the kernel has no sch_netem (use method: {self.fallback})")
        return False


# ------------------------------------------------------------------------------------------------ delay
class NetDelayParams(_ShapingParams):
    delay_ms: float = Field(gt=0, description="added latency per packet (ms)")
    jitter_ms: float = Field(default=0.0, ge=0, description="uniform +- jitter (ms); packets may reorder")
    method: Literal["auto", "netem", "nfqueue"] = Field(
        default="auto", description="netem if the kernel has it, else an NFQUEUE userspace delayer"
    )

    @model_validator(mode="after")
    def _jitter(self) -> NetDelayParams:
        if self.jitter_ms > self.delay_ms:
            raise ValueError("jitter_ms must not exceed delay_ms")
        return self


def _start_delayer(ctx: FaultContext, rt: NodeControl, node: str, queue: int, p: Any) -> dict[str, Any]:
    cmd = [
        "nsenter",
        "-t",
        str(rt.node_pid(node)),
        "-n",
        sys.executable,
        "-m",
        "chaosbench.injectors.network.delayer",
        "--queue",
        str(queue),
        "--delay-ms",
        str(p.delay_ms),
        "--jitter-ms",
        str(p.jitter_ms),
        "--seed",
        str(ctx.rng.randrange(2**31)),
        "--parent-pid",
        str(os.getpid()),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                ready.set()

    reader = threading.Thread(target=read, daemon=True, name=f"netdelay-{node}")
    reader.start()
    if not ready.wait(READY_TIMEOUT_S):
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        raise EngineError("nfqueue", f"{node}: the NFQUEUE delayer did not start: {err.strip()[-300:]}")
    ctx.timeline.emit(
        "proc_start",
        src="injector",
        proc=f"netdelay.{node}.{ctx.index}",
        pid=proc.pid,
        pid_ticks=procutil.start_ticks(proc.pid),
        role="injector",
        node=node,
    )
    return {"node": node, "proc": proc, "reader": reader, "lines": lines}


def _stop_delayer(ctx: FaultContext, fault: str, d: dict[str, Any]) -> bool:
    proc: subprocess.Popen[str] = d["proc"]
    early = proc.poll()
    if early is not None:  # it should hold packets until now: say so, the delay ended early
        ctx.timeline.emit(
            "log",
            src="injector",
            proc=f"netdelay.{d['node']}.{ctx.index}",
            fault=fault,
            line=f"netdelay on {d['node']} exited (code {early}) before the fault was reverted: "
            "the delay ended early",
        )
    else:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    d["reader"].join(timeout=2)
    counters = next((ln for ln in reversed(d["lines"]) if ln.startswith("{")), None)
    ctx.timeline.emit(
        "proc_exit",
        src="injector",
        proc=f"netdelay.{d['node']}.{ctx.index}",
        pid=proc.pid,
        returncode=proc.returncode,
        role="injector",
        node=d["node"],
    )
    ctx.timeline.emit(
        "log",
        src="injector",
        proc=f"netdelay.{d['node']}.{ctx.index}",
        fault=fault,
        line=f"netdelay counters {counters}",
    )
    return True


class NetDelayInjector(_ShapingInjector[NetDelayParams]):
    """Adds latency (and jitter) to a node's packets: netem, else an NFQUEUE userspace delayer."""

    name: ClassVar[str] = "net-delay"
    summary: ClassVar[str] = (
        "add latency/jitter to a node's packets (netem, else an NFQUEUE userspace delayer)"
    )
    fallback: ClassVar[str] = "nfqueue"

    def netem_args(self) -> list[str]:
        p = self.params
        return ["delay", f"{p.delay_ms}ms"] + ([f"{p.jitter_ms}ms"] if p.jitter_ms else [])

    def inject_fallback(self, ctx: FaultContext, rt: NodeControl, node: str) -> None:
        queue = 4200 + ctx.index % 1000
        ctx.state.setdefault("delayers", []).append(_start_delayer(ctx, rt, node, queue, self.params))
        for chain, opt in chains(self.params.direction):
            spec = [
                opt,
                iface(rt, node),
                *rule_tag(ctx, self.fault_name),
                "-j",
                "NFQUEUE",
                "--queue-num",
                str(queue),
                "--queue-bypass",
            ]
            self._add_rule(ctx, rt, node, chain, spec)


# ------------------------------------------------------------------------------------------------ loss
class NetLossParams(_ShapingParams):
    percent: float = Field(gt=0, le=100, description="share of packets dropped (%)")
    method: Literal["auto", "netem", "iptables"] = Field(
        default="auto", description="netem if the kernel has it, else iptables statistic DROP"
    )


class NetLossInjector(_ShapingInjector[NetLossParams]):
    """Drops a random share of a node's packets: netem loss, else iptables ``statistic`` DROP."""

    name: ClassVar[str] = "net-loss"
    summary: ClassVar[str] = "drop a random share of a node's packets (netem, else iptables statistic)"
    fallback: ClassVar[str] = "iptables"

    def netem_args(self) -> list[str]:
        return ["loss", f"{self.params.percent}%"]

    def inject_fallback(self, ctx: FaultContext, rt: NodeControl, node: str) -> None:
        p = self.params
        for chain, opt in chains(p.direction):
            spec = [
                opt,
                iface(rt, node),
                *rule_tag(ctx, self.fault_name),
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                f"{p.percent / 100:.6f}",
                "-j",
                "DROP",
            ]
            self._add_rule(ctx, rt, node, chain, spec)


# ------------------------------------------------------------------------------------------------ bandwidth
class NetBandwidthParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rate: str = Field(description="egress rate limit in tc units, e.g. 1mbit, 500kbit")
    burst: str = Field(default="32kbit", description="tbf bucket size")
    latency_ms: float = Field(default=50.0, gt=0, description="tbf: longest a packet may wait in the bucket")
    duration_s: float | None = Field(default=None, gt=0, description="window length; null: till the end")

    @field_validator("rate", "burst")
    @classmethod
    def _units(cls, v: str) -> str:
        if not re.fullmatch(r"\d+(\.\d+)?([kmg]?(bit|bps)|[kmg]?b?)", v.strip().lower()):
            raise ValueError(f"{v!r}: give a tc rate/size like 1mbit, 500kbit or 32kb")
        return v.strip().lower()


class NetBandwidthInjector(_NetInjector[NetBandwidthParams]):
    """Limits a node's egress bandwidth with a token bucket (tbf root qdisc on eth0)."""

    name: ClassVar[str] = "net-bandwidth"
    summary: ClassVar[str] = "limit a node's egress bandwidth (tbf)"

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        p = self.params
        rt = node_control(ctx.runtime, self.name)
        nodes = target_nodes(ctx)
        for node in nodes:
            args = ["rate", p.rate, "burst", p.burst, "latency", f"{p.latency_ms}ms"]
            if not self._add_qdisc(ctx, rt, node, "tbf", args):
                raise MissingEngine(f"{node}: the kernel has no tbf qdisc")
        return with_congestion_controls(rt, nodes, {"method": "tbf", "rate": p.rate, "burst": p.burst})


# ------------------------------------------------------------------------------------------------ partition
class PartitionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    groups: list[list[str]] = Field(description="groups of nodes that can no longer reach each other")
    action: Literal["drop", "reject"] = Field(
        default="drop", description="drop silently, or reject (RST/ICMP)"
    )
    duration_s: float | None = Field(default=None, gt=0, description="window length; null: till the end")

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[list[str]]) -> list[list[str]]:
        if len(v) < 2 or any(not g for g in v):
            raise ValueError("give at least two non-empty groups, e.g. [[node0], [node1]]")
        flat = [n for g in v for n in g]
        if len(flat) != len(set(flat)):
            raise ValueError("a node may be in one group only")
        for n in flat:
            if not re.fullmatch(r"node\d+", n):
                raise ValueError(f"{n!r} is not a node name (node0, node1, ...)")
        return v


class PartitionInjector(_NetInjector[PartitionParams]):
    """Cuts the network between groups of nodes (iptables in each node's namespace, both directions)."""

    name: ClassVar[str] = "partition"
    failure_mode = "hang"
    fault_class = "node"
    summary: ClassVar[str] = "cut the network between groups of nodes (iptables DROP/REJECT)"
    needs_process: ClassVar[bool] = False

    @classmethod
    def check_target(cls, target: Target, trigger: Trigger | None) -> str | None:
        if target.node is not None or target.ranks is not None or isinstance(target.rank, int) or target.all:
            return "partition takes its nodes from params.groups; leave target out"
        return None

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        p = self.params
        rt = node_control(ctx.runtime, self.name)
        known = set(rt.node_names())
        unknown = [n for g in p.groups for n in g if n not in known]
        if unknown:
            raise TargetNotFound(
                ", ".join(unknown),
                f"no such nodes (nodes: {sorted(known)})",
                message=f"partition: no such nodes {unknown} (nodes: {sorted(known)})",
            )
        ips = {n: rt.node_ip(n) for g in p.groups for n in g}
        group_of = {n: i for i, g in enumerate(p.groups) for n in g}
        verdict = ["-j", "DROP"] if p.action == "drop" else ["-j", "REJECT"]
        tag = rule_tag(ctx, self.fault_name)
        for node, gi in group_of.items():
            for peer, gj in group_of.items():
                if gi == gj:
                    continue
                if p.action == "reject":  # a reset for TCP, so a peer's connect/recv fails at once
                    for chain, addr in (("OUTPUT", "-d"), ("INPUT", "-s")):
                        self._add_rule(
                            ctx,
                            rt,
                            node,
                            chain,
                            [
                                addr,
                                ips[peer],
                                "-p",
                                "tcp",
                                *tag,
                                "-j",
                                "REJECT",
                                "--reject-with",
                                "tcp-reset",
                            ],
                        )
                self._add_rule(ctx, rt, node, "OUTPUT", ["-d", ips[peer], *tag, *verdict])
                self._add_rule(ctx, rt, node, "INPUT", ["-s", ips[peer], *tag, *verdict])
        return {"groups": p.groups, "action": p.action, "addresses": ips}
