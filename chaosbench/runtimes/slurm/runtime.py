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
The placement is kept by :class:`~chaosbench.runtimes.slurm.nodes.NodeMap`.

Planning runs nothing on the cluster. :meth:`SlurmRuntime.resolve`, called when a run starts, chooses node0's
Slurm node (the master's address) and reads the scheduler's settings; a dry run never calls it and plans with
:data:`~chaosbench.runtimes.slurm.nodes.UNRESOLVED_MASTER_ADDR`. Ports are a per-run sequence (:meth:`SlurmRuntime.free_port`), asked of nobody.

Signals (``kill``, ``hang`` and the other signal injectors). The pid a rank reports lives on its node, so
the runtime runs a tiny shell helper there as an extra step of the job that owns the rank
(``srun --jobid=J --overlap -w NODE``): it checks with ``scontrol listpids J NODE`` that the pid belongs to
one of this run's jobs on that node (so torchrun's workers, children of the task, qualify and nothing else
does), checks its start time against the one the rank reported, and signals it. This works on a remote
node as on this host, needs only ``sh``/``sed``/``kill`` there, and hits exactly the rank, where
``scancel --signal`` would hit every task of the step (a whole torchrun agent tree). The helper's own clock
reading at the moment of the kill is written as a ``signal_sent`` event; its delay after ``fault_inject``
(one step launch, ~0.1 s) is the delivery cost of a fault through Slurm. The helper and how its answer is
read: :mod:`~chaosbench.runtimes.slurm.signals`.

Targets. The runtime acts only on this run's jobs: those named ``<prefix>.*`` *and* commented
``chaosbench.run=<run id>`` (a job someone else named like ours is not one). Before any signal, kill of a
node's tasks or DOWN/DRAIN, :meth:`~chaosbench.runtimes.slurm.commands.SlurmCommands.our_jobs_on` lists this
run's jobs on the Slurm node and refuses (ChaosbenchError naming the target) when there is none; the node
helper then signals a pid only if ``scontrol listpids`` puts it in one of exactly those jobs, and a node is
taken down only if, besides, no one else's job runs there (unless ``allow_foreign_jobs``). ``cancel_batch``
cancels only a job this runtime submitted. ``srun_args``/``sbatch_args`` may not rename or re-comment jobs.

Clocks. Before the first process on a Slurm node starts, the runtime measures that node's clock against the
harness's (:mod:`chaosbench.timeline.clocks`, through ``srun`` stdin/stdout) and writes a ``clock_offset`` event
(:mod:`~chaosbench.runtimes.slurm.node_clocks`).

Lost nodes (the ``node-kill`` fault, also spelled ``slurm-node-down``): the Slurm node is set DOWN or DRAIN,
refused on a node that runs no job of this run or jobs of others, and resumed on revert while our reason
stands (:mod:`~chaosbench.runtimes.slurm.node_loss`).

Teardown escalates through the scheduler: ``scancel --signal=CONT`` and ``--signal=TERM`` to the job's
steps, ``grace_s``, then ``scancel --signal=KILL`` and a full ``scancel``; the local ``srun`` is killed last.
Safe to call twice. ``cleanup`` waits until none of the run's jobs is pending, running or completing.

Requires the Slurm client commands on the harness's host: every one runs through
:class:`~chaosbench.runtimes.slurm.commands.SlurmCommands` (``self.slurm``), the one place that knows their
arguments and output; the ``srun``/``sbatch`` command lines of the run's jobs are built in
:mod:`~chaosbench.runtimes.slurm.jobs`, with the arguments the options give
(:mod:`~chaosbench.runtimes.slurm.options`).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from chaosbench.errors import ChaosbenchError, ForeignTarget, MissingEngine
from chaosbench.runtimes.base import LineCallback, ProcessSpec, ProcHandle, Runtime
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
from chaosbench.runtimes.slurm.commands import job_prefix
from chaosbench.runtimes.slurm.jobs import (
    SIGNAL_EXIT_BASE,
    SlurmHandle,
    batch_job_node,
    process_returncode,
    sbatch_argv,
    srun_argv,
)
from chaosbench.runtimes.slurm.node_clocks import NodeClocks
from chaosbench.runtimes.slurm.node_loss import SlurmNodeLossOptions, down_nodes, resume_nodes
from chaosbench.runtimes.slurm.nodes import PORT_RANGE, UNRESOLVED_MASTER_ADDR, NodeMap, split_partition
from chaosbench.runtimes.slurm.options import (
    SlurmOptions,
    commands_for,
    keeps_job_identity,
    node_argv,
    node_python,
)
from chaosbench.runtimes.slurm.signals import refuse_unsent, run_signal_helper
from chaosbench.runtimes.slurm.states import JobState
from chaosbench.timeline import now_ns
from chaosbench.waiting import wait_until

__all__ = [
    "PORT_RANGE",
    "SIGNAL_EXIT_BASE",
    "UNRESOLVED_MASTER_ADDR",
    "SlurmHandle",
    "SlurmOptions",
    "SlurmRuntime",
    "keeps_job_identity",
]


class SlurmRuntime(Runtime[SlurmOptions]):
    """Processes are jobs of an existing Slurm cluster (see the module docstring): the workload nodes' placement
    in a :class:`~chaosbench.runtimes.slurm.nodes.NodeMap`, the nodes' clocks in a
    :class:`~chaosbench.runtimes.slurm.node_clocks.NodeClocks`, the jobs' command lines from
    :mod:`~chaosbench.runtimes.slurm.jobs`, signals through :mod:`~chaosbench.runtimes.slurm.signals`."""

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
        nodes than the workload needs; a suite that pins ``nodes`` cannot be split either
        (:func:`~chaosbench.runtimes.slurm.nodes.split_partition`)."""
        return split_partition(SlurmOptions(**{**cls.default_options, **options}), jobs, nodes)

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
        self.slurm = commands_for(self.opts, self.job_prefix, self.run.run_id)
        #: Where the workload nodes run (the commands asked through ``self.slurm`` at each use).
        self.nodes = NodeMap(self.run, self.opts, lambda: self.slurm, self.job_prefix)
        self.clocks = NodeClocks(self.run, self.opts, lambda: self.slurm, self.job_prefix)
        self._handles: list[SlurmHandle] = []
        self._threads: list[threading.Thread] = []
        self._batch: dict[int, str] = {}  # job id -> name, batch jobs of this run
        self._resolved = False
        self._scheduler: dict[str, Any] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ nodes
    def resolve(self) -> None:
        """Choose node0's Slurm node (reserved: the ``node_map`` event is written when a process first starts
        there, and a batch job, placed by the scheduler, never uses it), look up its address, and read the
        scheduler's settings (:attr:`scheduler`). Runs Slurm commands: called when the run starts, never in a
        dry run (see :meth:`Runtime.resolve`). Idempotent."""
        with self.nodes.lock:
            if self._resolved:
                return
            self.nodes.reserve("node0")
        try:
            self._scheduler = self.slurm.scheduler_config()
        except ChaosbenchError:
            self._scheduler = {}
        self._resolved = True

    def slurm_node(self, node: str, for_start: bool = False) -> str:
        """The Slurm node a workload node runs on (:meth:`NodeMap.slurm_node
        <chaosbench.runtimes.slurm.nodes.NodeMap.slurm_node>`: taken on first use, replaced ``for_start`` when
        unusable)."""
        return self.nodes.slurm_node(node, for_start)

    def node_of_slurm(self, slurm_node: str) -> str | None:
        """The workload node mapped to a Slurm node, if any."""
        return self.nodes.node_of_slurm(slurm_node)

    def slurm_node_now(self, node: str) -> str:
        """Where workload node ``node`` runs now: the mapping of per-process jobs, else the matching node of
        this run's running batch job (``nodeK`` = the K-th node of its allocation)."""
        mapped = self.nodes.mapped_to(node)
        if mapped is not None:
            return mapped
        return batch_job_node(self.slurm, self._batch, node)

    def measure_clock(self, slurm_node: str, node: str | None = None, job_id: int | None = None) -> None:
        """Measure a Slurm node's clock offset once per run and write a ``clock_offset`` event
        (:meth:`NodeClocks.measure <chaosbench.runtimes.slurm.node_clocks.NodeClocks.measure>`; with ``job_id``
        the probe is an extra step of that running job)."""
        self.clocks.measure(slurm_node, node, job_id)

    def clock_offset_ns(self, slurm_node: str) -> int | None:
        """The measured offset of a Slurm node's clock (node - harness), None when not measured."""
        return self.clocks.offset_ns(slurm_node)

    # ------------------------------------------------------------------ plain data (no Slurm command)
    @property
    def master_addr(self) -> str:
        """The address (``NodeAddr``) of node0's Slurm node: where it runs, else where :meth:`resolve` reserved
        it; :data:`UNRESOLVED_MASTER_ADDR` before either (a dry run)."""
        return self.nodes.master_addr

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
        return self.nodes.free_port()

    def python(self) -> str:
        """The Python the nodes run (the ``python`` option, else the harness's own)."""
        return node_python(self.opts)

    def node_argv(self, argv: list[str]) -> list[str]:
        """``argv`` as the nodes run it: the harness's Python replaced by the nodes' (the ``python`` option)."""
        return node_argv(self.opts, argv)

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name, "options": self.opts.model_dump(), "nodes": dict(self.nodes.mapped)}

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
        argv = srun_argv(self.opts, self.slurm, self.run.run_id, job_name, snode, spec)
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
        srun_rc = status.returncode
        rc = process_returncode(srun_rc)
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
        record_exit(
            self.run.timeline,
            handle,
            rc,
            status.t_ns,
            status.stamp,
            slurm_node=handle.slurm_node,
            job_id=job_id,
            **extra,
        )
        self.run.exits.settle(handle, rc, status.t_ns)

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
        argv = sbatch_argv(
            self.opts,
            self.slurm,
            self.run.run_id,
            job_name,
            nodes,
            ntasks_per_node,
            self.logs_dir / name,
            self.run.run_dir,
            extra or [],
            script,
        )
        out = self.slurm.command(argv, extra_env=env)
        job_id = int(out.strip().split(";")[0])
        with self._lock:
            self._batch[job_id] = job_name
        return job_id

    def _own_batch(self, job_id: int, doing: str) -> None:
        with self._lock:
            ours = job_id in self._batch
        if not ours:
            raise ForeignTarget(f"Slurm job {job_id}", "was not submitted by this run", f"{doing} it")

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

    # ------------------------------------------------------------------ signals
    def _node_helper(
        self, sig: str, pid: int, ticks: int | None, node: str | None
    ) -> tuple[int, int | None, str]:
        """Run the signal helper on the rank's node (:func:`~chaosbench.runtimes.slurm.signals.run_signal_helper`):
        (helper exit code, node clock ns or None, Slurm node). Refused (ChaosbenchError) when no job of this run
        runs there."""
        snode = self.slurm_node_now(node or "node0")
        rc, t_node = run_signal_helper(
            self.slurm, snode, sig, pid, ticks, self.job_prefix, self.opts.command_timeout_s
        )
        return rc, t_node, snode

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        name = signal.Signals(sig).name if sig else "0"
        rc, t_node, snode = self._node_helper(name.removeprefix("SIG") if sig else "0", pid, ticks, node)
        refuse_unsent(rc, pid, snode)
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
