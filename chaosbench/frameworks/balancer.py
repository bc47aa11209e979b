"""The ``balancer`` adapter: a serving fleet's recovery policy. N replicas of a serving workload (the built-in
``serve``, or the user's own server through ``serve-command``) behind a real haproxy, configured per run, while a
locust load process drives traffic through it.

What a run starts, in order (each a process of the runtime, so every fault of the catalog can reach it):

1. ``init`` (``serve`` only): writes the model checkpoint file the replicas load (in the run's checkpoint
   directory);
2. the replicas (role ``rank``, ``RANK`` = replica index), each an HTTP server on its own port (``SERVE_PORT``);
   the run waits until every one has said ``replica_ready`` (``serve-command``: its shim, once the server's
   health path answered the expected status);
3. haproxy (role ``balancer``), round robin over the replicas, its log on stdout: ``Server b/r1 is DOWN`` and
   ``... is UP`` become ``balancer_down`` / ``balancer_up`` events (rank, reason), stamped as the runtime stamps
   output lines (local: when haproxy wrote them);
4. the load (role ``load``): its ``load_start`` starts the faults' ``after_s`` clocks; the run completes when it
   exits 0. At the end the balancer's counters (retries, redispatches, per-server checks) are read from its
   stats socket into a ``balancer_stats`` event.

The recovery policy is the options: ``health_checks`` (``option httpchk GET <the workload's health path>``, and
``http-check expect status`` where it names one, with ``check_interval_ms``,
``rise``, ``fall``; off: haproxy sends requests to a dead replica until the run ends), ``supervisor`` (restarts a
replica that exited, on the same port, as a new incarnation; ``liveness_restart_after_s``: also one the balancer
has held DOWN that long since it was ready, as a liveness probe would; ``startup_timeout_s``: one restarted that is
not ready that long after its start, as a startup probe would), ``retries`` (haproxy ``retries N`` with
``option redispatch``: a failed connection is retried on another replica). haproxy's own defaults are kept
where the policy says nothing (no request timeouts beyond ``timeout_server_ms``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chaosbench.errors import MissingEngine, Unsupported
from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    Prediction,
    RunControl,
    chain,
    package_version,
    supervise_job,
)
from chaosbench.frameworks.none import describe_exit
from chaosbench.injectors.base import Role
from chaosbench.runtimes.base import NodeControl, ProcessSpec, ProcHandle, Runtime
from chaosbench.timeline import Event, TimelineWriter
from chaosbench.workloads.base import ServingWorkload

#: The port every replica listens on inside its own container (container nodes each have their own address).
CONTAINER_REPLICA_PORT = 8000
#: haproxy's state-change lines (its raw log on stdout; the same text, prefixed ``[WARNING]``, on stderr).
SERVER_STATE_RE = re.compile(
    r"Server (?P<backend>[\w.-]+)/r(?P<rank>\d+) is (?P<state>DOWN|UP)(?:, reason: (?P<reason>[^,]*))?"
)
#: The docker engine's DNS server on a user-defined network, as a container sees it.
DOCKER_DNS = "127.0.0.11:53"
#: The backend's name in the generated configuration.
BACKEND = "replicas"
#: The run's haproxy configuration, in ``frameworks/templates``.
HAPROXY_TEMPLATE = "haproxy.cfg.j2"


class BalancerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    health_checks: bool = Field(
        default=True, description="haproxy active health checks (GET /health) of every replica"
    )
    check_interval_ms: int = Field(
        default=2000, gt=0, description="haproxy 'inter': time between two checks (its default: 2000)"
    )
    rise: int = Field(
        default=2, ge=1, description="consecutive passed checks that bring a replica back (haproxy default 2)"
    )
    fall: int = Field(
        default=3, ge=1, description="consecutive failed checks that take a replica out (haproxy default 3)"
    )
    retries: int = Field(
        default=0,
        ge=0,
        description="haproxy 'retries' with 'option redispatch': retry a failed "
        "connection on another replica (0: no retry)",
    )
    supervisor: bool = Field(
        default=False, description="restart a replica that exited (same port, new incarnation)"
    )
    liveness_restart_after_s: float | None = Field(
        default=None,
        gt=0,
        description="supervisor: also kill and restart a replica the balancer has held DOWN this "
        "long (counted from the replica's ready: a restarted replica still loading is not restarted for it)",
    )
    startup_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="supervisor: restart a restarted replica not "
        "ready this long after its start (a startup probe: a load that hangs)",
    )
    restart_delay_s: float = Field(
        default=0.0, ge=0, description="supervisor: wait before restarting a replica"
    )
    max_restarts: int = Field(default=20, ge=0, description="supervisor: restarts in all before it gives up")
    timeout_connect_ms: int = Field(default=1000, gt=0, description="haproxy 'timeout connect'")
    timeout_server_ms: int = Field(
        default=10000, gt=0, description="haproxy 'timeout server': a hung replica's requests fail after this"
    )
    timeout_client_ms: int = Field(default=30000, gt=0, description="haproxy 'timeout client'")
    ready_timeout_s: float = Field(
        default=60.0, gt=0, description="wait this long for the model file and every replica"
    )
    monitor_interval_s: float = Field(default=0.05, gt=0)
    teardown_grace_s: float = Field(default=5.0, ge=0)
    haproxy: str = Field(default="haproxy", description="the haproxy executable")

    @model_validator(mode="after")
    def _consistent(self) -> BalancerOptions:
        if self.liveness_restart_after_s is not None and not (self.supervisor and self.health_checks):
            raise ValueError("liveness_restart_after_s needs supervisor: true and health_checks: true")
        return self


def haproxy_config(
    o: BalancerOptions,
    bind: str,
    servers: list[tuple[int, str]],
    stats_bind: str,
    nameserver: str | None = None,
    health_path: str = "/health",
    health_status: int | None = None,
) -> str:
    """The run's haproxy configuration (the template ``frameworks/templates/haproxy.cfg.j2``): one frontend on ``bind`` (host:port), round robin over ``servers``
    (replica index, host:port), its stats socket on ``stats_bind`` (host:port, TCP: a unix socket's path is
    limited to 107 bytes); health-state changes logged raw on stdout, requests not logged. ``nameserver``
    (host:port): servers are names resolved there again while haproxy runs (a container node that comes back
    after a reboot may have another address). Health checks GET ``health_path``; a check passes on
    ``health_status`` (None: haproxy's default, any 2xx or 3xx)."""
    return (
        _templates()
        .get_template(HAPROXY_TEMPLATE)
        .render(
            o=o,
            bind=bind,
            servers=servers,
            stats_bind=stats_bind,
            nameserver=nameserver,
            health_path=health_path,
            health_status=health_status,
            backend=BACKEND,
        )
    )


@cache
def _templates() -> Any:
    """The templates of this package's frameworks (``frameworks/templates``): plain text, no escaping; a value
    missing from a render raises."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("chaosbench.frameworks", "templates"),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def read_stats(host: str, port: int, timeout_s: float = 2.0) -> dict[str, Any]:
    """haproxy's counters from its stats socket (``show stat``): the backend's retries and redispatches and each
    replica's status, check failures and downtime."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(b"show stat\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    text = b"".join(chunks).decode(errors="replace").lstrip("# ")
    out: dict[str, Any] = {"servers": {}}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") != BACKEND:
            continue

        def num(key: str, row: dict[str, str] = row) -> int | None:
            v = row.get(key) or ""
            return int(v) if v.isdigit() else None

        if row.get("svname") == "BACKEND":
            out.update(
                retries=num("wretr"),
                redispatches=num("wredis"),
                requests=num("stot"),
                connection_errors=num("econ"),
                response_errors=num("eresp"),
            )
        else:
            out["servers"][row["svname"]] = {
                "status": row.get("status"),
                "check_failures": num("chkfail"),
                "went_down": num("chkdown"),
                "downtime_s": num("downtime"),
                "sessions": num("stot"),
                "retries": num("wretr"),
                "redispatches": num("wredis"),
            }
    return out


class StateWatcher:
    """haproxy's log lines -> ``balancer_down`` / ``balancer_up`` events (once per change: each line comes on
    stdout and stderr), and the replicas the balancer holds DOWN now (for the supervisor's liveness restarts)."""

    def __init__(self, framework: str, timeline: TimelineWriter) -> None:
        self.framework = framework
        self.timeline = timeline
        self.down_since_ns: dict[int, int] = {}
        self._state: dict[int, str] = {}
        self._lock = threading.Lock()

    def __call__(self, handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
        if handle.spec.role != "balancer":
            return
        m = SERVER_STATE_RE.search(line)
        if m is None:
            return
        rank, state = int(m["rank"]), m["state"]
        with self._lock:
            if self._state.get(rank, "UP") == state:
                return
            self._state[rank] = state
            if state == "DOWN":
                self.down_since_ns[rank] = t_ns
            else:
                self.down_since_ns.pop(rank, None)
        reason = {"reason": m["reason"].strip()} if m["reason"] else {}
        self.timeline.emit(
            f"balancer_{state.lower()}",
            t_ns=t_ns,
            src="framework",
            framework=self.framework,
            rank=rank,
            server=f"r{rank}",
            line=line[:300],
            **reason,
        )


class ReadyWatch:
    """The replicas' ``replica_ready`` events, by incarnation (a timeline subscriber)."""

    def __init__(self) -> None:
        self.ready_ns: dict[tuple[int, int], int] = {}  # (rank, incarnation) -> when it was ready
        self.changed = threading.Event()

    def __call__(self, ev: Event) -> None:
        if ev.kind == "replica_ready":
            self.ready_ns.setdefault((int(ev.get("rank", 0)), int(ev.get("incarnation", 0))), ev.t_ns)
            self.changed.set()


class BalancerFramework(Framework[BalancerOptions]):
    """Replicas behind haproxy under locust load; the recovery policy is the options (see the module docstring)."""

    name: ClassVar[str] = "balancer"
    roles: ClassVar[dict[str, Role]] = {
        "rank0": Role("replica 0's server process", rank=0),
        "balancer": Role("haproxy, the load balancer in front of the replicas", proc_role="balancer"),
        "load": Role("the locust load process", proc_role="load"),
    }

    @classmethod
    def missing_engine(cls, options: BalancerOptions, runtime: type[Runtime]) -> str | None:
        import importlib.util

        missing = [p for p in ("locust", "uvicorn", "starlette") if importlib.util.find_spec(p) is None]
        if missing:
            return f"balancer needs {', '.join(missing)}: pip install 'chaosbench[serve]'"
        haproxy = options.haproxy
        if not issubclass(runtime, NodeControl) and shutil.which(haproxy) is None:
            return f"balancer needs haproxy: '{haproxy}' not found (apt-get install -y haproxy)"
        return None

    # -- planning
    def _serve(self, job: JobContext) -> ServingWorkload[Any]:
        if not isinstance(job.workload, ServingWorkload):
            raise Unsupported(
                f"balancer adapter: workload '{job.workload.name}' is not a server (use workload 'serve' "
                "or 'serve-command')"
            )
        return job.workload

    def _containers(self, job: JobContext) -> bool:
        return isinstance(job.runtime, NodeControl)

    def replica_spec(self, job: JobContext, rank: int, incarnation: int, port: int) -> ProcessSpec:
        """Replica ``rank``'s process: the serve workload's argv, the probe's environment and its address."""
        node = job.node_name(rank // job.ranks_per_node)
        env = job.rank_env(incarnation, node)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % job.ranks_per_node),
                "WORLD_SIZE": str(job.ranks),
                "SERVE_HOST": "0.0.0.0" if self._containers(job) else job.runtime.master_addr,
                "SERVE_PORT": str(port),
                "CHAOSBENCH_FRAMEWORK": self.label,
            }
        )
        return ProcessSpec(
            name=f"replica{rank}.i{incarnation}",
            argv=job.workload_argv(),
            env=env,
            role="rank",
            node=node,
            incarnation=incarnation,
        )

    def plan(self, job: JobContext) -> LaunchPlan:
        o = self.options
        serve = self._serve(job)
        containers = self._containers(job)
        if not containers and shutil.which(o.haproxy) is None:
            raise MissingEngine(
                f"balancer needs haproxy: '{o.haproxy}' not found (apt-get install -y haproxy)"
            )
        ports = [
            CONTAINER_REPLICA_PORT + r % job.ranks_per_node if containers else job.runtime.free_port()
            for r in range(job.ranks)
        ]
        # container nodes: the balancer and the load share a node of their own beyond the replicas' (started on
        # demand), so a replica's node can be lost or cut off without taking them along; the load reaches the
        # balancer over that node's loopback
        lb_node = job.node_name(job.nodes) if containers else "node0"
        addr = "0.0.0.0" if containers else job.runtime.master_addr
        lb_port = job.runtime.free_port() if not containers else 8080
        servers = [
            (r, f"{job.node_name(r // job.ranks_per_node) if containers else addr}:{ports[r]}")
            for r in range(job.ranks)
        ]
        cfg_path = job.run_dir / "haproxy.cfg"
        stats_port = 9999 if containers else job.runtime.free_port()
        init = serve.init_argv(job.paths)
        procs = (
            []
            if init is None
            else [ProcessSpec(name="init", argv=init, env=job.rank_env(0, "node0"), role="init")]
        )
        procs += [self.replica_spec(job, r, 0, ports[r]) for r in range(job.ranks)]
        procs.append(
            ProcessSpec(
                name="haproxy",
                argv=[o.haproxy, "-db", "-f", str(cfg_path)],
                role="balancer",
                node=lb_node,
                env={},
            )
        )
        target_host = "127.0.0.1" if containers else job.runtime.master_addr
        load_env = {
            k: v
            for k, v in job.rank_env(0, lb_node).items()
            if k.startswith("CHAOSBENCH_") or k == "PYTHONUNBUFFERED"
        }
        procs.append(
            ProcessSpec(
                name="load",
                argv=serve.load_argv(f"http://{target_host}:{lb_port}"),
                role="load",
                node=lb_node,
                env=load_env,
            )
        )
        return self.launch_plan(
            job,
            procs,
            options={
                **o.model_dump(),
                "balancer_bind": f"{addr}:{lb_port}",
                "haproxy_config": str(cfg_path),
                "stats_bind": f"{addr}:{stats_port}",
                "lb_node": lb_node,
                "servers": dict(servers),
            },
            notes=[
                f"{job.ranks} replicas behind haproxy ({'health checks' if o.health_checks else 'no health checks'}"
                f"{', supervisor' if o.supervisor else ''}{f', {o.retries} retries' if o.retries else ''})"
            ],
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        return {
            "check_interval_s": o.check_interval_ms / 1000 if o.health_checks else None,
            "fall": float(o.fall) if o.health_checks else None,
            "rise": float(o.rise) if o.health_checks else None,
            "timeout_connect_s": o.timeout_connect_ms / 1000,
            "timeout_server_s": o.timeout_server_ms / 1000,
            "liveness_restart_after_s": o.liveness_restart_after_s,
            "monitor_interval_s": o.monitor_interval_s,
        }

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        inter, fall = timeouts.get("check_interval_s"), timeouts.get("fall")
        if inter is None or fall is None:
            return Prediction(None, "", note="no health checks: the balancer never takes a replica out")
        if mode not in ("crash", "hang", "stall"):
            return None
        # fall failed checks, the first one up to an interval after the fault; a hung replica's check fails when
        # it times out (haproxy's check timeout is the interval when 'timeout check' is unset)
        per_check = inter if mode == "crash" else 2 * inter
        return Prediction(
            *chain(("check_interval_s x fall", per_check * fall)),
            note=f"{fall:g} failed health checks in a row take the replica out",
        )

    def versions(self) -> dict[str, str | None]:
        v = super().versions()
        o = self.options
        v["haproxy"] = haproxy_version(o.haproxy)
        for pkg in ("locust", "uvicorn", "starlette"):
            v[pkg] = package_version(pkg)
        return v

    # -- running
    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        """Starts the run's processes in order (init, the replicas, haproxy once every replica is ready, the
        load) and watches them until the load exits or the harness stops the run (see the module docstring)."""
        o = self.options
        rt = control.runtime
        specs = {p.role if p.role != "rank" else p.name: p for p in plan.processes}
        if "init" in specs:
            init = rt.start(specs["init"])
            if (failed := self._wait_exit(init, control, o.ready_timeout_s)) is not None:
                return failed
        ready = ReadyWatch()
        control.follower.subscribe(ready)
        replicas: dict[int, ProcHandle] = {}
        ports: dict[int, int] = {}
        for p in plan.processes:
            if p.role == "rank":
                rank = int(p.env["RANK"])
                ports[rank] = int(p.env["SERVE_PORT"])
                replicas[rank] = rt.start(p)
        if (failed := self._wait_ready(replicas, ready, control)) is not None:
            return failed
        cfg = self._write_config(job, plan)
        states = StateWatcher(self.label, control.timeline)
        balancer = rt.start(specs["balancer"], states)
        if not self._wait_listening(plan, control, balancer):
            return JobResult("error", f"haproxy did not start (see {cfg.parent}/logs/haproxy.err)")
        load = rt.start(specs["load"])
        supervisor = _ReplicaSupervisor(
            o,
            self.label,
            control,
            replicas,
            ports,
            failure=lambda h, rank, started_ns: self._replica_failure(h, rank, states, ready, started_ns, o),
            spec=lambda rank, incarnation, port: self.replica_spec(job, rank, incarnation, port),
        )
        return self._watch(plan, control, load, balancer, supervisor)

    def _wait_ready(
        self, replicas: dict[int, ProcHandle], ready: ReadyWatch, control: RunControl
    ) -> JobResult | None:
        """None once every replica's first incarnation said ``replica_ready``; else why the run ends: the harness
        stopped it, a replica exited first (``failed``) or ``ready_timeout_s`` passed (``error``)."""
        o = self.options
        deadline = time.monotonic() + o.ready_timeout_s
        while not all((r, 0) in ready.ready_ns for r in replicas):
            if (stop := control.stop_reason()) is not None:
                return JobResult(stop, f"harness stopped the run ({stop}) while the replicas loaded")
            dead = [h for h in replicas.values() if h.poll() is not None]
            if dead:
                return JobResult(
                    "failed",
                    f"{dead[0].name} exited with {describe_exit(dead[0].returncode or 0)} "
                    "before it was ready",
                )
            if time.monotonic() > deadline:
                return JobResult(
                    "error", f"replicas not ready after {o.ready_timeout_s:g} s (ready_timeout_s)"
                )
            ready.changed.wait(o.monitor_interval_s)
            ready.changed.clear()
        return None

    def _watch(
        self,
        plan: LaunchPlan,
        control: RunControl,
        load: ProcHandle,
        balancer: ProcHandle,
        supervisor: _ReplicaSupervisor,
    ) -> JobResult:
        """Every ``monitor_interval_s`` until the load exits (``completed`` on 0, else ``failed``; the balancer's
        counters are read first) or the harness stops the run: notes an exited haproxy (``balancer_exit``) and,
        with the supervisor on, restarts failed replicas."""
        o = self.options

        def step() -> JobResult | None:
            if control.stop_reason():  # the load's end is not read once the run is stopped
                return None
            rc = load.poll()
            if rc is not None:
                self._emit_stats(plan, control)
                if rc == 0:
                    return JobResult("completed")
                return JobResult("failed", f"the load process exited with {describe_exit(rc)}")
            if balancer.poll() is not None:
                control.timeline.emit(
                    "balancer_exit",
                    src="framework",
                    framework=self.label,
                    reason=f"haproxy exited with {describe_exit(balancer.returncode or 0)}",
                )
            if supervisor.enabled:
                supervisor.restart_failed()
            return None

        # the supervisor's detection is its poll every monitor_interval_s (modelled): an exit does not wake it
        return supervise_job(control, step, o.monitor_interval_s, wake_on_exit=False)

    def _replica_failure(
        self, h: ProcHandle, rank: int, states: StateWatcher, ready: ReadyWatch, started_ns: int, o: Any
    ) -> tuple[str, str] | None:
        """Why the supervisor restarts replica ``rank`` now (reason, via), or None. Its incarnation started at
        ``started_ns``: until it is ready only the startup timeout applies; from then on the liveness clock runs
        from the later of its ready and the balancer's DOWN (haproxy holds a restarted replica DOWN until ``rise``
        checks pass: that time is not a failure of the new incarnation)."""
        rc = h.poll()
        if rc is not None:
            return f"{h.name} exited with {describe_exit(rc)}", "exit"
        now = time.time_ns()
        ready_ns = ready.ready_ns.get((rank, h.spec.incarnation))
        if ready_ns is None:
            if now - started_ns >= o.startup_timeout_s * 1e9:
                return f"{h.name} not ready {o.startup_timeout_s:g} s after its start", "startup_timeout"
            return None
        since = states.down_since_ns.get(rank)
        if o.liveness_restart_after_s is not None and since is not None:
            if now - max(since, ready_ns) >= o.liveness_restart_after_s * 1e9:
                return f"r{rank} DOWN at the balancer for {o.liveness_restart_after_s:g} s", "health_check"
        return None

    def _wait_exit(self, h: ProcHandle, control: RunControl, timeout_s: float) -> JobResult | None:
        """None once ``h`` exited 0; else why the run ends."""
        deadline = time.monotonic() + timeout_s

        def step() -> JobResult | None:
            rc = h.poll()
            if rc is not None:
                return JobResult(
                    "completed" if rc == 0 else "failed", f"{h.name} exited with {describe_exit(rc)}"
                )
            if time.monotonic() > deadline:
                return JobResult("error", f"{h.name} did not finish in {timeout_s:g} s")
            return None

        out = supervise_job(control, step, 0.05)
        return None if out.status == "completed" else out

    def _write_config(self, job: JobContext, plan: LaunchPlan) -> Path:
        o = self.options
        servers = [(int(k), v) for k, v in plan.options["servers"].items()]
        path = Path(plan.options["haproxy_config"])
        # container nodes resolve each other through the engine's DNS (docker: 127.0.0.11)
        dns = DOCKER_DNS if self._containers(job) else None
        serve = self._serve(job)
        path.write_text(
            haproxy_config(
                o,
                plan.options["balancer_bind"],
                servers,
                plan.options["stats_bind"],
                dns,
                serve.health_path,
                serve.health_status,
            )
        )
        return path

    def _wait_listening(self, plan: LaunchPlan, control: RunControl, balancer: ProcHandle) -> bool:
        """Whether haproxy accepts connections on its frontend (within 10 s)."""
        host, port = self._reachable(control, plan, plan.options["balancer_bind"])
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and balancer.poll() is None and control.stop_reason() is None:
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.2):
                return True
            control.sleep(0.05)
        return False

    def _reachable(self, control: RunControl, plan: LaunchPlan, bind: str) -> tuple[str, int]:
        """Where the harness reaches a socket haproxy binds to ``bind`` (a container node's: its address)."""
        host, port = bind.rsplit(":", 1)
        if host == "0.0.0.0" and isinstance(control.runtime, NodeControl):
            host = control.runtime.node_ip(plan.options["lb_node"])
        return host, int(port)

    def _emit_stats(self, plan: LaunchPlan, control: RunControl) -> None:
        host, port = self._reachable(control, plan, plan.options["stats_bind"])
        try:
            stats = read_stats(host, port)
        except OSError as exc:
            control.timeline.emit(
                "balancer_stats",
                src="framework",
                framework=self.label,
                missing=f"stats socket {host}:{port}: {exc}",
            )
            return
        control.timeline.emit("balancer_stats", src="framework", framework=self.label, **stats)


class _ReplicaSupervisor:
    """The balancer's supervisor over one run (options ``supervisor``, ``max_restarts``, ``restart_delay_s``):
    each replica's process, port, incarnation and start, and the restarts made so far. Built once the load has
    started (that is every first incarnation's start, for the startup timeout); ``enabled`` is the ``supervisor``
    option until the restart limit is reached.

    ``failure(handle, rank, started_ns)``: why replica ``rank``, whose incarnation started at ``started_ns``, is
    to be restarted now (reason, via), or None; ``spec(rank, incarnation, port)``: the process of its next
    incarnation."""

    def __init__(
        self,
        options: BalancerOptions,
        label: str,
        control: RunControl,
        replicas: dict[int, ProcHandle],
        ports: dict[int, int],
        failure: Callable[[ProcHandle, int, int], tuple[str, str] | None],
        spec: Callable[[int, int, int], ProcessSpec],
    ) -> None:
        self.options = options
        self.label = label
        self.control = control
        self.replicas = replicas  # rank -> its current incarnation's process
        self.ports = ports  # rank -> its port (a restart keeps it)
        self.failure = failure
        self.spec = spec
        self.enabled = options.supervisor
        self.restarts = 0
        self.incarnation = dict.fromkeys(replicas, 0)
        self.started_ns = dict.fromkeys(replicas, time.time_ns())

    def restart_failed(self) -> None:
        """One pass over the replicas: each that failed is detected, killed if still running (a liveness
        restart) and started again as its next incarnation, on its port, after ``restart_delay_s``. At the
        restart limit: ``give_up``, the pass ends and the supervisor is off."""
        o, tl = self.options, self.control.timeline
        for rank, h in list(self.replicas.items()):
            why = self.failure(h, rank, self.started_ns[rank])
            if why is None:
                continue
            tl.emit(
                "detect", src="framework", framework=self.label, via=why[1], reason=why[0], blame_rank=rank
            )
            if h.poll() is None:  # a liveness restart: the hung replica goes first
                self.control.runtime.terminate([h], 0.0)
            if self.restarts >= o.max_restarts:
                tl.emit(
                    "give_up",
                    src="framework",
                    framework=self.label,
                    reason=f"supervisor: restart limit reached ({o.max_restarts})",
                )
                self.enabled = False
                return
            self.restarts += 1
            self.incarnation[rank] += 1
            if o.restart_delay_s:
                self.control.sleep(o.restart_delay_s)
            tl.emit(
                "restart",
                src="framework",
                framework=self.label,
                rank=rank,
                attempt=self.restarts,
                incarnation=self.incarnation[rank],
                reason=why[0],
            )
            self.replicas[rank] = self.control.runtime.start(
                self.spec(rank, self.incarnation[rank], self.ports[rank])
            )
            self.started_ns[rank] = time.time_ns()


def haproxy_version(exe: str) -> str | None:
    import subprocess

    path = shutil.which(exe)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else None
