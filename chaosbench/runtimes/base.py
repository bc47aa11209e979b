"""The runtime interface: start, signal and tear down the processes of a run.

A runtime owns every process it starts for one run, captures each one's stdout and stderr into
``<run_dir>/logs/<name>.out|.err``, writes ``proc_start`` and ``proc_exit`` events, and only ever signals
processes it started (or their descendants). ``cleanup`` is idempotent and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from chaosbench.errors import Unsupported
from chaosbench.plugin_options import adopt_model
from chaosbench.timeline import TimelineWriter, now_ns


@dataclass
class ProcessSpec:
    """One process to start: plain data, printable in a dry run."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    role: str = "rank"  # rank | agent | job | watchdog
    node: str = "node0"
    incarnation: int = 0
    cwd: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": self.argv,
            "env": self.env,
            "role": self.role,
            "node": self.node,
            "incarnation": self.incarnation,
        }


class ProcHandle:
    """A started process. ``exited`` is set (and ``returncode`` known) once it has been reaped."""

    def __init__(self, spec: ProcessSpec, pid: int, ticks: int | None) -> None:
        self.spec = spec
        self.pid = pid
        self.ticks = ticks
        self.returncode: int | None = None
        self.t_exit_ns: int | None = None
        self.exited = threading.Event()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid_on_node(self) -> int | None:
        """The process's pid as the other processes of its node see it (in the node's pid namespace): ``pid``
        where nodes share the harness's; None while not known."""
        return self.pid

    def poll(self) -> int | None:
        return self.returncode if self.exited.is_set() else None

    def __repr__(self) -> str:
        return f"<ProcHandle {self.name} pid={self.pid} rc={self.returncode}>"


def bindable(addr: str, port: int) -> bool:
    """Whether a TCP socket can bind ``port`` on ``addr`` here now (``0.0.0.0``: nothing listens on it at any
    local address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


class ExitQueue:
    """The exits of one run's processes, as the runtime settles them: :meth:`settle` records a handle's exit
    (its ``returncode``, ``t_exit_ns`` and ``exited``) and counts it; a supervise loop waits for the count to move
    (:meth:`wait`), so it wakes when any process of the run exits instead of at its next poll
    (:func:`~chaosbench.frameworks.base.supervise_loop`). :meth:`wake` wakes the waiters without an exit (the
    harness stopping the run)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0  # exits settled so far

    def settle(self, handle: ProcHandle, returncode: int, t_ns: int | None) -> None:
        """``handle`` exited with ``returncode`` at ``t_ns``: recorded on it, its ``exited`` set, the waiters
        woken."""
        handle.t_exit_ns = t_ns
        handle.returncode = returncode
        handle.exited.set()
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiter now (they look at what ended their wait themselves)."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Block until an exit is settled after the ``seen``-th, ``stop`` is set, or ``timeout_s`` passed; True
        when an exit ended the wait."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.count != seen or (stop is not None and stop.is_set()), timeout_s
            ) and (self.count != seen)


#: Called from a reader thread for each line a process prints: (handle, stream, line, t_ns). ``t_ns`` is when the
#: process wrote the line where the runtime can tell (local and slurm: the kernel's stamp of the write; the
#: ``proc_start`` event's ``output_stamp`` says ``write``), else when it was read (docker; ``read``).
LineCallback = Callable[[ProcHandle, str, str, int], None]


@dataclass
class RunInfo:
    """What a runtime needs to know about the run it serves."""

    run_id: str
    run_dir: Path
    timeline: TimelineWriter
    #: The exits of the run's processes (each runtime settles its handles' exits here).
    exits: ExitQueue = field(default_factory=ExitQueue)


class NoOptions(BaseModel):
    """The options of a runtime that takes none."""

    model_config = ConfigDict(extra="forbid")


#: A runtime's options model: ``class LocalRuntime(Runtime[LocalOptions])`` makes ``self.options`` a LocalOptions (or None: the runtime's defaults).
O = TypeVar("O", bound=BaseModel)  # noqa: E741 - the options' type parameter, as in the issue's Framework[O]


class Runtime(ABC, Generic[O]):
    """One kind of place to run processes, typed by its options model ``O``
    (``class LocalRuntime(Runtime[LocalOptions])``: that model is its ``Options``; ``self.options`` an instance of
    it, or None when the runtime was made without options and applies its defaults). Implementations: ``local``
    (subprocesses), ``docker``, ``slurm``."""

    name: ClassVar[str]
    #: Whether every rank runs on the harness's own host, in its namespaces (a rank can then use what the
    #: harness prepared there: a cgroup, a path below /sys).
    ranks_on_harness_host: ClassVar[bool] = False

    #: The options model: the type argument ``O`` (set from it when a subclass is made), or one set explicitly.
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_model(cls, Runtime, "Options")

    @classmethod
    def missing_engine(cls) -> str | None:
        """What this runtime needs on this machine and lacks (a client, a package), naming what to install; None
        when nothing is missing. Looked up without contacting any engine (a dry-run answers at once).

        Returns:
            What is missing, in words, naming what to install; None when nothing is (the default).
        """
        return None

    def __init__(self, run: RunInfo, options: O | None = None) -> None:
        self.run = run
        self.options: O | None = options
        #: Called with every output line of every process this runtime starts, before the starter's own
        #: ``on_line`` (the harness's own watchers: :class:`~chaosbench.frameworks.base.RankErrorWatcher`).
        self.line_observers: list[LineCallback] = []

    @classmethod
    def concurrent_slots(cls, options: dict[str, Any], jobs: int, nodes: int) -> list[dict[str, Any]]:
        """Options for ``jobs`` runs at once that share nothing being timed (``chaosbench run --jobs``): one
        dict per slot, merged over the suite's runtime options of each run placed in that slot (``nodes``: the
        workload's node count). Raises :class:`~chaosbench.errors.Unsupported` when this runtime cannot keep
        concurrent runs apart (the default).

        Args:
            options: The suite's default options for this runtime (a plain dict, as the suite gives them).
            jobs: How many runs go at once (``--jobs``): the number of slots asked for.
            nodes: The workload's node count, which each slot must hold.

        Returns:
            ``jobs`` dicts of options, one per slot, each merged over ``options`` for the runs in that slot.

        Raises:
            Unsupported: This runtime cannot keep concurrent runs apart (the base class always raises it).
        """
        raise Unsupported(f"the {cls.name} runtime cannot give concurrent runs resources of their own")

    def observed(self, on_line: LineCallback | None) -> LineCallback | None:
        """``on_line`` with :attr:`line_observers` called first; every ``start`` pumps its lines through it.

        Args:
            on_line: The starter's own callback for each output line, or None.

        Returns:
            A callback that calls every observer (an observer's exception is swallowed, so it never costs the
            starter its line), then ``on_line``; ``on_line`` itself when there are no observers (None included).
        """
        observers = list(self.line_observers)
        if not observers:
            return on_line

        def both(handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
            for observe in observers:
                with contextlib.suppress(Exception):  # a watcher's failure never costs the starter its line
                    observe(handle, stream, line, t_ns)
            if on_line is not None:
                on_line(handle, stream, line, t_ns)

        return both

    @property
    def master_addr(self) -> str:
        """Address ranks use to reach rank 0 / the rendezvous."""
        return "127.0.0.1"

    @abstractmethod
    def free_port(self) -> int:
        """A TCP port free at the time of the call on the master address.

        Returns:
            The port number (free when asked: another process may take it before it is bound).
        """

    def resolve(self) -> None:  # noqa: B027 - optional hook
        """Look up what plans need to know that only the place the run goes can tell (a scheduler's node for
        ``node0`` and its address, the scheduler's settings). The harness calls it once when a run starts,
        before the framework plans it; planning itself (``--dry-run``, the timeout outlook) never does, so it
        runs nothing on any engine or cluster, and an unresolved runtime plans with placeholders. Runs before
        :meth:`provision`; idempotent. Default: nothing (local and docker know it all up front)."""

    @abstractmethod
    def start(self, spec: ProcessSpec, on_line: LineCallback | None = None) -> ProcHandle:
        """Start a process; returns once it exists. Writes a ``proc_start`` event.

        Args:
            spec: What to start: its name, argv, environment, role, node and incarnation.
            on_line: Called from a reader thread for each line the process prints (after
                :attr:`line_observers`, see :meth:`observed`); None: only the observers and the logs get them.

        Returns:
            The handle of the started process; its ``exited`` event is set once it has been reaped.
        """

    @abstractmethod
    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> int | None:
        """Send ``sig`` to a process this runtime started (or a descendant of one); returns when it was delivered,
        in ns on the harness's clock (a remote node's own reading, corrected by its measured offset, where the
        runtime has one), or None when the runtime cannot tell.

        ``pid`` and ``ticks`` are as the process reported them in its ``rank_start`` event (for a container,
        in the container's pid namespace), ``node`` is where it runs. A pid that was reused raises
        :class:`~chaosbench.errors.ChaosbenchError`, as does a pid that is not ours; a process that is gone
        raises ProcessLookupError.

        Args:
            pid: The process's pid as it reported it in ``rank_start`` (in its container's pid namespace).
            sig: The signal number (``signal.SIGKILL``, ...).
            ticks: The process's start time in clock ticks, as reported in ``rank_start``, to tell a reused pid;
                None: not checked.
            node: The node the process runs on (``node0``, ...); None where the runtime does not need it.

        Returns:
            When the signal was delivered, in ns on the harness's clock; None when the runtime cannot tell.

        Raises:
            ChaosbenchError: The pid was reused by another process, or is not one of this runtime's processes
                (or a descendant of one).
            ProcessLookupError: The process is gone.
        """

    def process_alive(self, pid: int, ticks: int | None = None, node: str | None = None) -> bool:
        """Whether the process (as reported in ``rank_start``) still runs.

        Args:
            pid: The pid it reported in ``rank_start``.
            ticks: Its start time in clock ticks, as reported; a different process under the same pid is not
                alive. None: not checked.
            node: The node it runs on (unused by the default).

        Returns:
            True while the process exists and is not a zombie (and, when ``ticks`` is given, has that start
                time); the default looks on the harness's host.
        """
        from chaosbench import procutil

        return procutil.alive(pid, ticks)

    @abstractmethod
    def terminate(self, handles: list[ProcHandle], grace_s: float) -> None:
        """Stop these processes and all their descendants: SIGTERM (and SIGCONT, so a stopped process
        can act on it), wait up to ``grace_s``, then SIGKILL. Safe to call twice.

        Args:
            handles: The processes to stop (as :meth:`start` returned them).
            grace_s: Seconds to wait after SIGTERM before SIGKILL.
        """

    @abstractmethod
    def cleanup(self, grace_s: float = 5.0) -> None:
        """Terminate everything this runtime started for the run. Idempotent.

        Args:
            grace_s: Seconds between SIGTERM and SIGKILL (as in :meth:`terminate`).
        """

    def describe(self) -> dict[str, Any]:
        """What this runtime is, for the run's records.

        Returns:
            A JSON-serializable dict; the base gives ``{"runtime": name}``, subclasses add their settings.
        """
        return {"runtime": self.name}

    def provision(self, nodes: int | None = None) -> None:  # noqa: B027 - optional hook
        """Bring up the run's nodes before anything is launched (containers, all at once, after the faults'
        ``prepare``). Default: nothing (the local runtime's nodes are labels).

        Args:
            nodes: How many nodes the run needs; None: the runtime's own count.
        """

    def leftovers(self) -> list[int]:
        """Pids of this run's processes still alive (after ``cleanup``: none should be).

        Returns:
            The pids (on the harness's host) still alive; the base reports none.
        """
        return []

    def leftover_objects(self) -> list[str]:
        """Other objects of this run that still exist (containers, networks, jobs).

        Returns:
            One name per object still there; the base reports none.
        """
        return []

    @classmethod
    def cleanup_crashed(cls, results_dir: Path) -> list[str]:
        """``chaosbench cleanup``: remove what this runtime created outside the harness's own process tree for
        runs below ``results_dir`` whose harness died (containers, networks, scheduler jobs: found by the runs'
        labels or names, never anything else); one line per action. The recorded processes themselves are ended
        by ``chaosbench cleanup`` from the timelines. Default: nothing.

        Args:
            results_dir: The results directory whose crashed runs are cleaned up.

        Returns:
            One line per action taken, in words; empty when there was nothing to do.
        """
        return []


@runtime_checkable
class NodeControl(Protocol):
    """A runtime whose nodes are machines of their own (containers: ``docker``): what node and network faults
    need from it. Declared by implementing it; checked with ``isinstance`` (:func:`node_control`)."""

    def node_names(self) -> list[str]: ...
    def pause_node(self, name: str) -> str: ...
    def engine_event_ns(
        self, container: str, action: str, since_ns: int, timeout_s: float = 5.0
    ) -> int | None: ...
    def unpause_node(self, name: str) -> bool: ...
    def set_node_cpus(self, name: str, cpus: float | None) -> float | None: ...
    def node_state(self, name: str) -> str: ...
    def node_pid(self, name: str) -> int: ...
    def node_ip(self, name: str) -> str: ...
    def node_iface(self, name: str) -> str: ...


def node_control_problem(runtime: type[Runtime], fault: str) -> str | None:
    """Why a ``runtime`` (class) cannot serve ``fault``, which needs :class:`NodeControl`; None when it can."""
    if issubclass(runtime, NodeControl):
        return None
    return f"{fault} needs a runtime whose nodes are containers (docker), not '{runtime.name}'"


def node_control(runtime: Runtime, fault: str) -> NodeControl:
    problem = node_control_problem(type(runtime), fault)
    if problem or not isinstance(runtime, NodeControl):
        raise Unsupported(problem or f"{fault}: runtime '{runtime.name}' has no node control")
    return runtime


def engine_effect(
    rt: NodeControl, containers: list[str], action: str, since_ns: int, what: str
) -> dict[str, Any]:
    """``effect_t_ns``/``effect`` of a node fault: the engine's own stamp of the last container's ``action`` (it
    arrives on the runtime's event stream shortly after the call), else the moment the calls returned."""
    stamps = [rt.engine_event_ns(c, action, since_ns) for c in containers]
    if stamps and all(t is not None for t in stamps):
        return {
            "effect_t_ns": max(t for t in stamps if t is not None),
            "effect": f"the engine's '{action}' event: {what}",
        }
    return {"effect_t_ns": now_ns(), "effect": f"the engine call returned ({what}; no '{action}' event seen)"}


@runtime_checkable
class BatchJobs(Protocol):
    """A runtime that hands whole jobs to a batch scheduler (``slurm``), so that a framework can let the scheduler
    supervise the job (``slurm-requeue``): submit a batch script, hand a job back to the queue, end it. Declared
    by implementing it; checked with ``isinstance``."""

    def submit_batch(
        self,
        script: Path,
        name: str,
        nodes: int,
        ntasks_per_node: int,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> int: ...
    def requeue_batch(self, job_id: int) -> None: ...
    def cancel_batch(self, job_id: int) -> None: ...


@runtime_checkable
class NodeLoss(Protocol):
    """A runtime that can lose a whole node the way its platform loses one: the ``node-kill`` fault (also
    spelled ``local-node-kill`` and ``slurm-node-down``) asks it to. Declared by implementing it; checked with
    ``isinstance``/``issubclass``. Each runtime says what losing a node is there and which options it
    takes (:meth:`node_loss_options`):

    - ``docker``: the node's container is killed (option ``signal``); what brings it back is the runtime's
      ``lost_node`` policy;
    - ``local``: every process of the node's trees is frozen, then SIGKILLed; nothing brings it back (an
      adapter's spares may replace it);
    - ``slurm``: the Slurm node is set DOWN or DRAIN (options ``state``, ``kill_tasks``,
      ``allow_foreign_jobs``); it is :class:`NodeRestore`: revert resumes it.
    """

    @classmethod
    def node_loss_options(cls) -> type[BaseModel]:
        """The options this runtime's node loss takes (a model that forbids others; its defaults apply)."""
        ...

    def lose_nodes(self, nodes: list[str], options: BaseModel, restorable: list[str]) -> dict[str, Any]:
        """Lose the workload nodes ``nodes`` (``node1``, ...) at once; returns the details of the
        ``fault_inject`` event (what was done to which node, and ``effect_t_ns``/``effect`` where the runtime
        knows when it took effect better than "when the call returned"). ``options`` is an instance of
        :meth:`node_loss_options`. A runtime that is :class:`NodeRestore` appends to ``restorable``, as it
        goes, each node it took out that :meth:`NodeRestore.restore_nodes` can bring back, so what it did
        before an error is restored too. Raises ProcessLookupError when a node has nothing left to lose and
        :class:`~chaosbench.errors.ChaosbenchError` when it refuses or the platform does (the firing is then
        recorded as skipped)."""
        ...


@runtime_checkable
class NodeRestore(Protocol):
    """A :class:`NodeLoss` runtime whose lost nodes can be brought back on request (``slurm``: RESUME), so the
    ``node-kill`` fault can be reverted (after its ``duration_s``, at the end of the run)."""

    def restore_nodes(self, restorable: list[str]) -> bool:
        """Bring back what :meth:`NodeLoss.lose_nodes` recorded in ``restorable``, leaving alone a node that
        someone else changed since; returns whether anything was brought back. Idempotent."""
        ...
