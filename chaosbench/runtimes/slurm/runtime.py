"""The ``slurm`` runtime: processes run as Slurm jobs on an existing cluster, the scale-out path.

How processes are started. Each :class:`~chaosbench.runtimes.base.ProcessSpec` becomes its own job of one
task, started by an ``srun`` that runs on the harness's host as a local subprocess::

    srun --job-name=cb-<run hash>.<proc> --comment=chaosbench.run=<run id> -N1 -n1 -w <slurm node>
         --kill-on-bad-exit=1 --unbuffered [-p PART] [-A ACCT] [-t LIMIT] [srun_args] -- <argv>

``srun`` forwards the task's stdout/stderr, so output is captured per process into ``logs/<name>.out|.err``
and log patterns see each line when it arrives, exactly as with the ``local`` runtime; ``srun``'s exit is
the process's exit (``proc_exit``; a task killed by signal N makes ``srun`` exit 128+N, reported as -N like
a local process; ``srun`` exits 0 when the node fails under it, so a job the scheduler ended as failed, lost
or cancelled is reported with return code 1 and its ``slurm_state``).

One job per process, rather than steps of one allocation, because that is what a restart framework on
Slurm does (it submits again), a lost node then only takes the jobs that ran there, and the scheduler's
view of every process (state, node) is one ``squeue`` away. Jobs are named after the run, so
teardown and ``leftovers`` find exactly this run's jobs, never anyone else's. Frameworks that hand the
whole job to the scheduler (``slurm-requeue``) submit a batch script with :meth:`SlurmRuntime.submit_batch`
instead; the runtime tracks and cleans those up too.

Nodes. The workload's nodes ``node0..nodeN-1`` map to Slurm nodes: the ``nodes`` option pins them
(``{node0: n1, node1: n2}``), otherwise the first usable nodes of the partition are taken in order. A node
whose Slurm state becomes unusable (down, drained, failing; see
:data:`~chaosbench.runtimes.slurm.states.SLURM_STATES`) is replaced by a free one when a process is started
there again (``replace_lost_nodes``; a ``node_map`` event records it), as a resubmitted job would land elsewhere. The rank's own events say which host it ran on.

Planning runs nothing on the cluster. :meth:`SlurmRuntime.resolve`, called when a run starts, chooses node0's
Slurm node (the master's address) and reads the scheduler's settings; a dry run never calls it and plans with
:data:`UNRESOLVED_MASTER_ADDR`. Ports are a per-run sequence (:meth:`SlurmRuntime.free_port`), asked of nobody.

Signals (``kill``, ``hang`` and the other signal injectors). The pid a rank reports lives on its node, so
the runtime runs a tiny shell helper there as an extra step of the job that owns the rank
(``srun --jobid=J --overlap -w NODE``): it checks with ``scontrol listpids J NODE`` that the pid belongs to
one of this run's jobs on that node (so torchrun's workers, children of the task, qualify and nothing else
does), checks its start time against the one the rank reported, and signals it. This works on a remote
node as on this host, needs only ``sh``/``sed``/``kill`` there, and hits exactly the rank, where
``scancel --signal`` would hit every task of the step (a whole torchrun agent tree). The helper's own clock
reading at the moment of the kill is written as a ``signal_sent`` event; its delay after ``fault_inject``
(one step launch, ~0.1 s) is the delivery cost of a fault through Slurm.

Targets. The runtime acts only on this run's jobs: those named ``<prefix>.*`` *and* commented
``chaosbench.run=<run id>`` (a job someone else named like ours is not one). Before any signal, kill of a
node's tasks or DOWN/DRAIN, :meth:`~chaosbench.runtimes.slurm.commands.SlurmCommands.our_jobs_on` lists this
run's jobs on the Slurm node and refuses (ChaosbenchError naming the target) when there is none; the node
helper then signals a pid only if ``scontrol listpids`` puts it in one of exactly those jobs, and a node is
taken down only if, besides, no one else's job runs there (unless ``allow_foreign_jobs``). ``cancel_batch``
cancels only a job this runtime submitted. ``srun_args``/``sbatch_args`` may not rename or re-comment jobs.

Clocks. Before the first process on a Slurm node starts, the runtime measures that node's clock against the
harness's (:mod:`chaosbench.timeline.clocks`, through ``srun`` stdin/stdout) and writes a ``clock_offset`` event.

Lost nodes (the ``node-kill`` fault, also spelled ``slurm-node-down``): the Slurm node is set DOWN or DRAIN,
refused on a node that runs no job of this run or jobs of others, and resumed on revert while our reason
stands (:mod:`~chaosbench.runtimes.slurm.node_loss`).

Teardown escalates through the scheduler: ``scancel --signal=CONT`` and ``--signal=TERM`` to the job's
steps, ``grace_s``, then ``scancel --signal=KILL`` and a full ``scancel``; the local ``srun`` is killed last.
Safe to call twice. ``cleanup`` waits until none of the run's jobs is pending, running or completing.

Requires the Slurm client commands on the harness's host: every one runs through
:class:`~chaosbench.runtimes.slurm.commands.SlurmCommands` (``self.slurm``), the one place that knows their
arguments and output.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.errors import ChaosbenchError, MissingEngine, Unsupported
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime
from chaosbench.runtimes.capture import OUTPUT_CAPTURE_HELP, OutputCapture
from chaosbench.runtimes.process import (
    EXITS,
    CaptureLimitWatcher,
    ExitWatch,
    close_captures,
    open_captures,
    record_exit,
    record_start,
    start_pumps,
    start_ticks,
)
from chaosbench.runtimes.slurm.cleanup import cleanup_stale_jobs, resume_stale_nodes
from chaosbench.runtimes.slurm.commands import SlurmCommands, job_prefix, run_comment
from chaosbench.runtimes.slurm.node_loss import SlurmNodeLossOptions, down_nodes, resume_nodes
from chaosbench.runtimes.slurm.states import USABLE_NODE_STATES, JobState, node_state
from chaosbench.timeline import clocks, now_ns
from chaosbench.waiting import wait_until

#: ``srun`` exits 128+N when its task was killed by signal N.
SIGNAL_EXIT_BASE = 128
#: What a plan holds for the master's address while the runtime is not resolved (a dry run).
UNRESOLVED_MASTER_ADDR = "<slurm:node0>"
#: Listener ports (rendezvous, stores) come from here: below Linux's ephemeral range (32768-60999), from which
#: every connection's local port is taken, so none of those can hold one of ours.
PORT_RANGE = (20000, 32768)


class SlurmOptions(BaseModel):
    """Options of the ``slurm`` runtime (``defaults.runtime_options`` in a suite)."""

    model_config = ConfigDict(extra="forbid")
    partition: str | None = Field(default=None, description="partition (-p); null: the cluster's default")
    account: str | None = Field(default=None, description="account (-A) the jobs are charged to")
    time_limit: str | None = Field(default="30:00", description="time limit of each job (-t), Slurm syntax")
    nodes: dict[str, str] = Field(
        default_factory=dict, description="pin workload nodes to Slurm nodes, e.g. {node0: n1, node1: n2}"
    )
    exclude: list[str] = Field(default_factory=list, description="Slurm nodes never used")
    replace_lost_nodes: bool = Field(
        default=True, description="start on a free Slurm node when a workload node's Slurm node is unusable"
    )
    sbatch_args: list[str] = Field(default_factory=list, description="more sbatch arguments, as is")
    srun_args: list[str] = Field(default_factory=list, description="more srun arguments, as is")
    python: str | None = Field(
        default=None, description="interpreter on the nodes; replaces the harness's sys.executable in argv"
    )
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for every Slurm command")
    measure_clocks: bool = Field(default=True, description="measure each node's clock offset before use")
    clock_samples: int = Field(default=8, ge=1, le=1000)
    command_timeout_s: float = Field(default=30.0, gt=0, description="longest wait for one Slurm command")
    job_wait_s: float = Field(
        default=60.0, gt=0, description="longest wait for the run's jobs to end at cleanup"
    )
    output_capture: OutputCapture = Field(default="socket", description=OUTPUT_CAPTURE_HELP + " (of srun)")

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _keeps_our_names(cls, v: list[str]) -> list[str]:
        return keeps_job_identity(v)


def _commands(opts: SlurmOptions, prefix: str = "", run_id: str | None = None) -> SlurmCommands:
    """The Slurm client commands with the harness's environment (and ``slurm_conf`` as SLURM_CONF), the options'
    timeout and partition, and the jobs of ``prefix``/``run_id`` as this run's."""
    env = dict(os.environ)
    if opts.slurm_conf:
        env["SLURM_CONF"] = opts.slurm_conf
    return SlurmCommands(env, opts.command_timeout_s, opts.partition, prefix, run_id)


def keeps_job_identity(args: list[str]) -> list[str]:
    """Refuse (ValueError) extra srun/sbatch arguments that would rename or re-comment a job: the runtime names
    and comments every job itself, and that is how it tells the run's jobs from anyone else's."""
    for arg in args:
        if arg.startswith(("--comment", "--job-name", "-J")):
            raise ValueError(
                f"{arg!r}: the runtime names and comments every job itself (that is how it "
                "knows the run's jobs from anyone else's)"
            )
    return args


# A shell helper run on the node (as an overlap step of one of our jobs): $1 signal (0: check only), $2 pid,
# $3 start ticks or '-', $4 Slurm node, then the run's job ids. Exit 3: no such process; 4: pid reused;
# 5: not in our jobs. Prints the node's clock (ns) right after the signal.
_SIGNAL_HELPER = r"""
sig=$1; pid=$2; ticks=$3; node=$4; shift 4
[ -r /proc/$pid/stat ] || exit 3
ours=0
for j in "$@"; do
    if scontrol listpids "$j" "$node" 2>/dev/null | awk -v p="$pid" '$1 == p {f = 1} END {exit !f}'; then
        ours=1; break
    fi
done
[ "$ours" = 1 ] || exit 5
if [ "$ticks" != "-" ]; then
    now=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)
    [ -n "$now" ] || exit 3
    [ "$now" = "$ticks" ] || exit 4
fi
state=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f1)
[ "$state" = Z ] && exit 3
date +%s%N
kill -s "$sig" "$pid" 2>/dev/null || exit 3
"""
#: How srun reports a step that Slurm ended under it (the job it overlapped ended).
_STEP_TERMINATED = "Terminated"


class SlurmHandle(ProcHandle):
    """A process started as its own Slurm job: the local ``srun``'s pid, plus the job's name and node."""

    def __init__(
        self, spec: ProcessSpec, pid: int, ticks: int | None, job_name: str, slurm_node: str
    ) -> None:
        super().__init__(spec, pid, ticks)
        self.job_name = job_name
        self.slurm_node = slurm_node
        self.job_id: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None


class SlurmRuntime(Runtime[SlurmOptions]):
    """Processes are jobs of an existing Slurm cluster (see the module docstring)."""

    name: ClassVar[str] = "slurm"

    @classmethod
    def missing_engine(cls) -> str | None:
        missing = [c for c in ("sbatch", "srun", "squeue", "scontrol") if shutil.which(c) is None]
        if missing:
            return (
                f"the slurm runtime needs the Slurm client commands ({', '.join(missing)} not found; apt-get "
                "install slurm-client, or scripts/slurm-local up)"
            )
        return None

    #: Option values used when the runner passes no options (variants registered under other names).
    default_options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def cleanup_crashed(cls, results_dir: Path) -> list[str]:
        """The crashed runs' jobs cancelled, then the nodes they had set DOWN/DRAIN resumed (a drained node's jobs
        end first; see :mod:`~chaosbench.runtimes.slurm.cleanup`)."""
        return cleanup_stale_jobs(results_dir) + resume_stale_nodes(results_dir)

    @classmethod
    def concurrent_slots(cls, options: dict[str, Any], jobs: int, nodes: int) -> list[dict[str, Any]]:
        """Each concurrent run on Slurm nodes of its own: the partition's usable nodes (less ``exclude``) split
        in ``jobs`` groups, each slot excluding every other group's, so no node is shared between two runs
        being timed (a lost node is replaced from the slot's own group). Refused when a group would have fewer
        nodes than the workload needs; a suite that pins ``nodes`` cannot be split either."""
        opts = SlurmOptions(**{**cls.default_options, **options})
        if opts.nodes:
            raise Unsupported(
                "slurm: the suite pins workload nodes to Slurm nodes; --jobs cannot place runs apart"
            )
        slurm = _commands(opts)
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
        groups = [
            usable[i::jobs] for i in range(jobs)
        ]  # the remainder's nodes too: spares of the first groups
        return [{"exclude": [*opts.exclude, *(n for n in usable if n not in group)]} for group in groups]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opts: SlurmOptions = (
            self.options if isinstance(self.options, SlurmOptions) else SlurmOptions(**self.default_options)
        )
        if self.opts.output_capture == "socket":
            self.line_observers.append(CaptureLimitWatcher(self.run.timeline))
        self.logs_dir = Path(self.run.run_dir) / "logs"
        self.job_prefix = job_prefix(self.run.run_id)
        #: The Slurm client commands, with this run's environment, timeout, partition and job names.
        self.slurm = _commands(self.opts, self.job_prefix, self.run.run_id)
        self._handles: list[SlurmHandle] = []
        self._threads: list[threading.Thread] = []
        self._batch: dict[int, str] = {}  # job id -> name, batch jobs of this run
        self._node_map: dict[str, str] = {}  # workload node -> Slurm node
        self._reserved: dict[str, str] = {}  # workload node -> Slurm node chosen by resolve(), not yet used
        self._resolved = False
        self._scheduler: dict[str, Any] = {}
        self._local_addrs: dict[str, bool] = {}  # node address -> whether it is this host
        lo, hi = PORT_RANGE
        self._next_port = int(self.job_prefix.removeprefix("cb-"), 16) % (hi - lo)  # this run's first port
        self._clocks: dict[str, clocks.ClockOffset | None] = {}  # Slurm node -> its measured clock
        self._node_addr: dict[str, str] = {}
        self._lock = threading.RLock()
        self._map_lock = threading.Lock()

    # ------------------------------------------------------------------ job submission
    def _common(self) -> list[str]:
        """Arguments every job of the run is submitted with: partition, account, time limit."""
        out = self.slurm.partition_args()
        if self.opts.account:
            out += ["-A", self.opts.account]
        if self.opts.time_limit:
            out += ["-t", self.opts.time_limit]
        return out

    # ------------------------------------------------------------------ nodes
    def resolve(self) -> None:
        """Choose node0's Slurm node (reserved: the ``node_map`` event is written when a process first starts
        there, and a batch job, placed by the scheduler, never uses it), look up its address, and read the
        scheduler's settings (:attr:`scheduler`). Runs Slurm commands: called when the run starts, never in a
        dry run (see :meth:`Runtime.resolve`). Idempotent."""
        with self._map_lock:
            if self._resolved:
                return
            if "node0" not in self._node_map:
                self._reserved["node0"] = self._choose("node0", None)[0]
        try:
            self._scheduler = self.slurm.scheduler_config()
        except ChaosbenchError:
            self._scheduler = {}
        self._resolved = True

    def _choose(self, node: str, current: str | None) -> tuple[str, dict[str, dict[str, str]]]:
        """Where workload node ``node`` goes (``current``: where it is now; None: first use), without taking it,
        and the partition's nodes as ``scontrol`` shows them. Remembers the chosen node's address. Call with
        ``_map_lock`` held."""
        self.slurm.check()
        infos = self.slurm.nodes_info()
        usable = {n for n, kv in infos.items() if node_state(kv.get("State", "")) in USABLE_NODE_STATES}
        pinned = self.opts.nodes.get(node)
        reserved = self._reserved.get(node)
        if current is not None and current in usable:
            choice = current
        elif current is None and pinned is not None:
            if pinned not in infos:
                raise ChaosbenchError(
                    f"runtime option nodes: {node} -> {pinned}: no such node in the partition"
                )
            choice = pinned
        elif current is None and reserved is not None and reserved in usable:
            choice = reserved
        else:
            taken = (
                set(self._node_map.values())
                | set(self.opts.nodes.values())
                | {s for n, s in self._reserved.items() if n != node}
            )
            free = [
                n
                for n in self.slurm.partition_nodes()
                if n in usable and n not in taken and n not in self.opts.exclude
            ]
            if current is not None and not self.opts.replace_lost_nodes:
                raise ChaosbenchError(
                    f"{node}'s Slurm node {current} is unusable and replace_lost_nodes is off"
                )
            if not free:
                raise ChaosbenchError(
                    f"no usable Slurm node left for {node} (partition {self.opts.partition})"
                )
            choice = free[0]
        if choice not in self._node_addr:
            addr = infos.get(choice, {}).get("NodeAddr", choice)
            self._node_addr[choice] = addr
            self._local_addrs.setdefault(addr, _is_local(addr))
        return choice, infos

    def slurm_node(self, node: str, for_start: bool = False) -> str:
        """The Slurm node a workload node runs on, taken on first use (the one :meth:`resolve` reserved for it,
        if still usable). With ``for_start`` an unusable mapped node is replaced by a free one
        (``replace_lost_nodes``). Either is recorded as a ``node_map`` event."""
        with self._map_lock:
            current = self._node_map.get(node)
            if current is not None and not for_start:
                return current
            choice, infos = self._choose(node, current)
            if choice == current:
                return current
            self._node_map[node] = choice
            self._reserved.pop(node, None)
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

    def node_of_slurm(self, slurm_node: str) -> str | None:
        """The workload node mapped to a Slurm node, if any."""
        with self._map_lock:
            return next((n for n, s in self._node_map.items() if s == slurm_node), None)

    def measure_clock(self, slurm_node: str, node: str | None = None, job_id: int | None = None) -> None:
        """Measure a Slurm node's clock offset once per run and write a ``clock_offset`` event (on failure the
        event carries the error instead of an offset). The probe runs as its own one-task job, or, with
        ``job_id``, as an extra step of that running job (a batch job's nodes are only free to it)."""
        with self._lock:
            if slurm_node in self._clocks:
                return
            self._clocks[slurm_node] = None
        where = (
            [f"--jobid={job_id}", "--overlap"]
            if job_id is not None
            else [
                *self._common(),
                f"--job-name={self.job_prefix}.clock",
                f"--comment={run_comment(self.run.run_id)}",
            ]
        )
        argv = [
            "srun",
            "-Q",
            "-N1",
            "-n1",
            "-w",
            slurm_node,
            "--unbuffered",
            *where,
            self.python(),
            "-u",
            "-c",
            clocks.ECHO_PROGRAM,
        ]
        try:
            off = clocks.measure(
                argv, slurm_node, self.opts.clock_samples, self.opts.command_timeout_s, self.slurm.env
            )
        except ValueError as exc:
            self.run.timeline.emit("clock_offset", node=node, slurm_node=slurm_node, error=str(exc))
            return
        with self._lock:
            self._clocks[slurm_node] = off
        fields = off.event_fields()
        fields.update(node=node, slurm_node=slurm_node)
        self.run.timeline.emit("clock_offset", **fields)

    def clock_offset_ns(self, slurm_node: str) -> int | None:
        """The measured offset of a Slurm node's clock (node - harness), None when not measured."""
        with self._lock:
            off = self._clocks.get(slurm_node)
        return off.offset_ns if off is not None else None

    # ------------------------------------------------------------------ plain data (no Slurm command)
    @property
    def master_addr(self) -> str:
        """The address (``NodeAddr``) of node0's Slurm node: where it runs, else where :meth:`resolve` reserved
        it; :data:`UNRESOLVED_MASTER_ADDR` before either (a dry run)."""
        with self._map_lock:
            snode = self._node_map.get("node0") or self._reserved.get("node0")
            return self._node_addr.get(snode, snode) if snode is not None else UNRESOLVED_MASTER_ADDR

    @property
    def scheduler(self) -> dict[str, Any]:
        """The scheduler's settings (:meth:`SlurmCommands.scheduler_config`) as :meth:`resolve` read them;
        empty before (a dry run) or when ``scontrol show config`` failed."""
        return dict(self._scheduler)

    def free_port(self) -> int:
        """A port for a listener on the master node, chosen without asking the cluster: the next of this run's
        sequence in :data:`PORT_RANGE` (it starts where the run id says, so concurrent runs rarely meet, and a
        dry run plans the same ports every time). Where the master is known to be this host (:meth:`resolve`),
        a port something here already listens on is skipped."""
        lo, hi = PORT_RANGE
        addr = self.master_addr
        local = self._local_addrs.get(addr, False)
        with self._lock:
            for _ in range(hi - lo):
                port = lo + self._next_port % (hi - lo)
                self._next_port += 1
                if not local or _bindable(addr, port):
                    return port
        raise ChaosbenchError(f"no free port left in {lo}-{hi - 1} on {addr}")

    def python(self) -> str:
        """The Python the nodes run (the ``python`` option, else the harness's own)."""
        return self.opts.python or sys.executable

    def node_argv(self, argv: list[str]) -> list[str]:
        """``argv`` as the nodes run it: the harness's Python replaced by the nodes' (the ``python`` option)."""
        if self.opts.python:
            return [self.opts.python if a == sys.executable else a for a in argv]
        return list(argv)

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "options": self.opts.model_dump(), "nodes": dict(self._node_map)}

    # ------------------------------------------------------------------ processes
    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        on_line = self.observed(on_line)
        if any(UNRESOLVED_MASTER_ADDR in a for a in [*spec.argv, *spec.env.values()]):
            raise ChaosbenchError(
                f"'{spec.name}' was planned before the slurm runtime was resolved (its master address is "
                f"{UNRESOLVED_MASTER_ADDR}): call resolve() before planning a run"
            )
        self.slurm.check()
        snode = self.slurm_node(spec.node, for_start=True)
        if self.opts.measure_clocks:
            self.measure_clock(snode, spec.node)
        job_name = f"{self.job_prefix}.{spec.name}"
        argv = [
            "srun",
            f"--job-name={job_name}",
            f"--comment={run_comment(self.run.run_id)}",
            "-N1",
            "-n1",
            "-w",
            snode,
            "--kill-on-bad-exit=1",
            "--unbuffered",
            *self._common(),
            *([f"--chdir={spec.cwd}"] if spec.cwd else []),
            *self.opts.srun_args,
            "--",
            *self.node_argv(spec.argv),
        ]
        env = dict(self.slurm.env)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        captures = open_captures(self.opts.output_capture, env)
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=captures["stdout"].child_fd,
                stderr=captures["stderr"].child_fd,
                start_new_session=True,
            )
        except OSError as exc:
            close_captures(captures)
            raise MissingEngine(f"cannot run srun for '{spec.name}': {exc.strerror}") from None
        exit_watch = EXITS.watch_child(popen)  # at once: nothing else may reap it before its pidfd is open
        handle = SlurmHandle(spec, popen.pid, start_ticks(popen.pid), job_name, snode)
        handle.popen = popen
        with self._lock:
            self._handles.append(handle)
        record_start(
            self.run.timeline,
            handle,
            slurm_node=snode,
            job_name=job_name,
            output_stamp=captures["stdout"].stamp,
        )
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._threads += start_pumps(handle, captures, self.logs_dir, on_line)
        w = threading.Thread(
            target=self._wait, args=(handle, exit_watch), daemon=True, name=f"wait-{spec.name}"
        )
        w.start()
        self._threads.append(w)
        return handle

    def _wait(self, handle: SlurmHandle, exit_watch: ExitWatch) -> None:
        status = exit_watch.wait()
        assert status is not None and status.returncode is not None  # a child's watch reaps it: never None
        srun_rc = rc = status.returncode
        handle.t_exit_ns = status.t_ns
        if rc > SIGNAL_EXIT_BASE and rc - SIGNAL_EXIT_BASE in {int(s) for s in signal.Signals}:
            rc = -(rc - SIGNAL_EXIT_BASE)
        extra: dict[str, Any] = {}
        job_id = None
        with contextlib.suppress(ChaosbenchError):
            job_id = self.job_id(handle)
            # srun (22.05) exits 0 when its node fails under it ("srun: error: Node failure on n2"): the job's
            # state says what happened, so a lost node is not reported as a process that finished its work.
            info = self.slurm.job_info(job_id) if rc == 0 and job_id is not None else None
            if info is not None and info.state in (JobState.FAILED, JobState.LOST, JobState.CANCELLED):
                rc = 1
                extra = {"srun_returncode": srun_rc, "slurm_state": info.slurm_state, "reason": info.reason}
        handle.returncode = rc
        assert handle.t_exit_ns is not None
        record_exit(
            self.run.timeline,
            handle,
            rc,
            handle.t_exit_ns,
            status.stamp,
            slurm_node=handle.slurm_node,
            job_id=job_id,
            **extra,
        )
        handle.exited.set()

    def job_id(self, handle: SlurmHandle) -> int | None:
        """The Slurm job id of a process (looked up by its unique job name; None before it is known)."""
        if handle.job_id is None:
            handle.job_id = self.slurm.job_id_named(handle.job_name)
        return handle.job_id

    # ------------------------------------------------------------------ batch jobs (slurm-requeue)
    def submit_batch(
        self,
        script: Path,
        name: str,
        nodes: int,
        ntasks_per_node: int,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> int:
        """``sbatch`` a batch script as a job of this run; returns its job id. Output goes to
        ``logs/<name>.out`` (appended across requeues)."""
        self.slurm.check()
        job_name = f"{self.job_prefix}.{name}"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={job_name}",
            f"--comment={run_comment(self.run.run_id)}",
            "-N",
            str(nodes),
            f"--ntasks-per-node={ntasks_per_node}",
            "--open-mode=append",
            f"--output={self.logs_dir / name}.out",
            f"--error={self.logs_dir / name}.err",
            f"--chdir={self.run.run_dir}",
            *self._common(),
            *self.opts.sbatch_args,
            *(extra or []),
            str(script),
        ]
        if self.opts.exclude:
            argv[-1:-1] = [f"--exclude={','.join(self.opts.exclude)}"]
        out = self.slurm.command(argv, extra_env=env)
        job_id = int(out.strip().split(";")[0])
        with self._lock:
            self._batch[job_id] = job_name
        return job_id

    # ------------------------------------------------------------------ signals
    def slurm_node_now(self, node: str) -> str:
        """Where workload node ``node`` runs now: the mapping of per-process jobs, else the matching node of
        this run's running batch job (``nodeK`` = the K-th node of its allocation)."""
        with self._map_lock:
            mapped = self._node_map.get(node)
        if mapped is not None:
            return mapped
        m = re.fullmatch(r"node(\d+)", node)
        for job_id in sorted(self._batch, reverse=True):
            info = self.slurm.job_info(job_id)
            if (
                info is not None
                and info.state is JobState.RUNNING
                and m
                and int(m.group(1)) < len(info.nodes)
            ):
                return info.nodes[int(m.group(1))]
        raise ChaosbenchError(f"no job of this run runs on {node}")

    # ------------------------------------------------------------------ node loss (NodeLoss, NodeRestore)
    @classmethod
    def node_loss_options(cls) -> type[BaseModel]:
        return SlurmNodeLossOptions

    def lose_nodes(self, nodes: list[str], options: BaseModel, restorable: list[str]) -> dict[str, Any]:
        """Down (or drain) the Slurm nodes the workload nodes run on now (see
        :mod:`~chaosbench.runtimes.slurm.node_loss`); ``restorable`` gets each Slurm node once it is down."""
        assert isinstance(options, SlurmNodeLossOptions)
        snodes: list[str] = []
        for node in nodes:
            snode = self.slurm_node_now(node)
            if snode not in snodes:
                snodes.append(snode)
        return down_nodes(self.slurm, snodes, options, self.run.run_id, restorable)

    def restore_nodes(self, restorable: list[str]) -> bool:
        """RESUME the Slurm nodes this run took down, only while the reason on each is still ours."""
        return resume_nodes(self.slurm, restorable, self.run.run_id)

    def _node_helper(
        self, sig: str, pid: int, ticks: int | None, node: str | None
    ) -> tuple[int, int | None, str]:
        """Run the signal helper on the rank's node: (helper exit code, node clock ns or None, Slurm node). The
        helper runs as a step of one of this run's jobs there and acts only on a pid of those jobs (exit 5
        otherwise); refused (ChaosbenchError) when no job of this run runs there
        (:meth:`SlurmCommands.our_jobs_on`)."""
        snode = self.slurm_node_now(node or "node0")
        jobs = self.slurm.our_jobs_on(snode, "signalling it", f"pid {pid}")
        args = [sig, str(pid), str(ticks) if ticks is not None else "-"]
        argv = self.slurm.helper_step(
            snode, jobs, _SIGNAL_HELPER, args, f"--job-name={self.job_prefix}.signal"
        )
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.slurm.env,
                stdin=subprocess.DEVNULL,
                timeout=self.opts.command_timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise ChaosbenchError(f"signalling pid {pid} on {snode}: no answer") from None
        t_node = None
        with contextlib.suppress(ValueError, IndexError):
            t_node = int(res.stdout.split()[-1])
        rc = res.returncode
        if rc not in (0, 3, 4, 5) and t_node is not None and _STEP_TERMINATED in res.stderr:
            # The helper had passed every check and read its clock for the kill (printed right before it) when
            # Slurm ended its step: the step overlaps a job of this run there, and a SIGKILL of that job's own
            # task (the target) ends the job and every step in it (seen: "srun: error: n1: task 0: Terminated"
            # right as the killed rank exited). The kill was sent (or, had the job ended for another reason in
            # that same instant, was about to be: its task had gone anyway).
            rc = 0
        if rc not in (0, 3, 4, 5):
            err = (res.stderr.strip() or f"exit code {rc}").splitlines()[-1]
            raise ChaosbenchError(f"signalling pid {pid} on {snode} failed: {err}")
        return rc, t_node, snode

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        name = signal.Signals(sig).name if sig else "0"
        rc, t_node, snode = self._node_helper(name.removeprefix("SIG") if sig else "0", pid, ticks, node)
        if rc == 3:
            raise ProcessLookupError(pid)
        if rc == 4:
            raise ChaosbenchError(f"pid {pid} on {snode} now belongs to another process; not signalling it")
        if rc == 5:
            raise ChaosbenchError(f"pid {pid} on {snode} is not in a job of this run; not signalling it")
        if sig:
            # The node's clock reading right before the kill, on the harness's clock when the offset is known.
            off = self.clock_offset_ns(snode)
            exact = t_node is not None and off is not None
            t = t_node - off if t_node is not None and off is not None else now_ns()
            self.run.timeline.emit(
                "signal_sent",
                t_ns=t,
                src="runtime",
                pid=pid,
                signal=name,
                node=node,
                slurm_node=snode,
                node_t_ns=t_node,
                stamp="node" if exact else "harness",
            )
            return t
        return None

    def process_alive(self, pid: int, ticks: int | None = None, node: str | None = None) -> bool:
        try:
            rc, _, _ = self._node_helper("0", pid, ticks, node)
        except (ProcessLookupError, ChaosbenchError):
            return False
        return rc == 0

    # ------------------------------------------------------------------ teardown
    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        hs = [h for h in handles if isinstance(h, SlurmHandle)]
        live = [h for h in hs if not h.exited.is_set()]
        if live:
            ids = [j for j in (self.job_id(h) for h in live) if j is not None]
            self.slurm.scancel(ids, "--signal=CONT")
            self.slurm.scancel(ids, "--signal=TERM")
            wait_until(lambda: all(h.exited.is_set() for h in live), grace_s, interval_s=0.02)
            rest = [h for h in live if not h.exited.is_set()]
            ids = [j for j in (self.job_id(h) for h in rest) if j is not None]
            self.slurm.scancel(ids, "--signal=KILL")
            self.slurm.scancel(ids)
            wait_until(lambda: all(h.exited.is_set() for h in rest), 5, interval_s=0.02)
            for h in rest:
                if h.popen is not None and h.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        h.popen.kill()
        for h in hs:
            h.exited.wait(timeout=10)

    def _own_batch(self, job_id: int, doing: str) -> None:
        with self._lock:
            ours = job_id in self._batch
        if not ours:
            raise ChaosbenchError(f"Slurm job {job_id} was not submitted by this run; not {doing} it")

    def cancel_batch(self, job_id: int) -> None:
        """End a batch job of this run for good (``scancel``); refused (ChaosbenchError) for a job this runtime
        did not submit."""
        self._own_batch(job_id, "cancelling")
        self.slurm.scancel([job_id])

    def requeue_batch(self, job_id: int) -> None:
        """Hand a batch job of this run back to the scheduler (``scontrol requeue``); refused (ChaosbenchError)
        for a job this runtime did not submit."""
        self._own_batch(job_id, "requeueing")
        self.slurm.requeue(job_id)

    def cleanup(self, grace_s: float = 5.0) -> None:
        with self._lock:
            handles = list(self._handles)
        self.terminate(list(handles), grace_s)
        with contextlib.suppress(ChaosbenchError):
            wait_until(self._cancel_our_jobs, self.opts.job_wait_s, interval_s=0.2)
        for t in self._threads:
            t.join(timeout=5)

    def _cancel_our_jobs(self) -> bool:
        """Whether this run has no job left with the scheduler; ``scancel`` of those it still has."""
        jobs = self.slurm.our_jobs()
        if jobs:
            self.slurm.scancel(sorted(jobs))
        return not jobs

    def leftovers(self) -> list[int]:
        """This run's jobs the scheduler still has pending, running or completing (job ids), and local
        ``srun`` processes still alive (pids)."""
        with self._lock:
            handles = list(self._handles)
        alive = [h.pid for h in handles if h.popen is not None and h.popen.poll() is None]
        try:
            jobs = sorted(self.slurm.our_jobs())
        except ChaosbenchError:
            jobs = []
        return jobs + alive


def _bindable(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


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
