"""The ``nvrx`` adapter: NVIDIA Resiliency Extension's ``ft_launcher`` (heartbeat and section hang detection).

``ft_launcher`` is torchrun's elastic agent plus one rank monitor per rank: each rank connects to its monitor
(``RankMonitorClient``) and sends heartbeats and opens/closes named sections; the monitor declares the rank hung
when a heartbeat or a section exceeds its timeout, kills it (``rank_termination_signal``, SIGKILL by default,
after a SIGCONT) and the launcher restarts the worker group. Measured here on CPU/gloo with nvidia-resiliency-ext
0.4.1 and 0.7.0 (docs/nvrx.md): both run; the GPU health check only logs that NVML is missing. The adapter drives
the installed one (:func:`launcher_generation`): 0.7 replaced torch's rendezvous with its own barrier rendezvous
(one restart budget for the job: every node restarts in the same cycle, ``TORCHELASTIC_RESTART_COUNT`` is the
cycle), dropped ``--ft-restart-policy min-healthy``, and added hot spares (``spares``: standby agents with
``--nnodes N:N+spares``), health checks before each rendezvous, a no-progress limit and a 15 s worker stop
timeout.

Store host: with several nodes, node0's agent hosts the rendezvous store (``--rdzv-conf is_host=true``, the others
``false``), as on a cluster whose endpoint is node0's; it is the ``rendezvous-host`` role. Unpinned, every agent on
one host matched the endpoint and the first to bind hosted the store: losing node1 then lost the store, and
node0's launcher ended at once (``RendezvousConnectionError``).

The built-in workloads do not call ``RankMonitorClient``. Each rank is therefore started through a bridge
(``python -m chaosbench.launchers.nvrx bridge -- <workload argv>``): a small parent process that connects to
the rank monitor, starts the real rank as its child (which dies with it) and turns the rank's own probe events
into the monitor's calls: ``rank_start`` opens nothing (the initial heartbeat timeout covers start-up and
checkpoint load), every ``step`` is a heartbeat and closes/reopens the ``step`` section, ``ckpt_save_begin`` /
``ckpt_save_end`` bracket a ``checkpoint`` section, ``train_end`` ends the monitoring (as nvrx's own Lightning
callbacks do at the end of fit, so the rank's exit is not watched). A hung rank stops writing events, the bridge stops talking,
the monitor times out and kills the bridge (and with it the rank). The bridge exits as its child did. What this
adds is the bridge's event polling (``bridge_poll_s``) to every heartbeat: negligible against timeouts of seconds.

Sections: nvrx 0.4.1 only accepts sections named in its config (``--ft-rank-section-timeouts``). An unknown one
makes ``RankMonitorClient`` raise ``TimeoutsCalcError: Unknown section: step`` (the bridge, and with it the rank,
died at its first step and ft_launcher restarted the group until its attempts ran out, in a fault-free control
too), after the monitor had already recorded it open, which kills the monitor's periodic check (``KeyError``).
The adapter therefore always declares ``step`` and ``checkpoint``, with ``null`` (no timeout) unless
``section_timeouts`` sets one, and the bridge only opens sections the monitor's config names.

Incarnations (0.4): ft_launcher (``--ft-restart-policy any-failed``) counts restarts per agent, and an agent that
restarts its group because a peer node re-joined the rendezvous (``Detected N new nodes``) does not count it, so
``TORCHELASTIC_RESTART_COUNT`` differs between nodes after one kill. As for torchrun-elastic, each agent runs
through this module (``python -m chaosbench.launchers.nvrx launcher <ft_launcher args>``), which only sets
``CHAOSBENCH_INCARNATION`` before each worker start so that the probe's incarnation is the rendezvous round.

Detection events: the rank monitors' timeout lines (``Section 'step' has been open for ...``, ``Was out of
section``, ``Did not get subsequent heartbeat``; the monitor's logger prefix ``[RankMonServer<pid>@<host>:<rank>]``
names the global rank, taken as ``blame_rank``), and as for torchrun the launcher's ``failed (exitcode ...)
local_rank: N (pid: P)``. Its restart decision is ``Worker group FAILED|UNHEALTHY. N/M attempts left; will
restart`` (N: left before this restart); when none are left it logs ``Some rank(s) exited with non-zero exit
code: ... Agent's exit code = 1`` (give_up: it catches torch's ChildFailedError itself). 0.7 adds: an agent whose
workers are healthy joining the restart another opened (``Joining cluster restart (group_rank=N)``, a restart),
a failed health check (``<check> failed for node ...``, a detection), and its other ways to stop (no progress,
another launcher's terminal failure, too many unhealthy nodes: give-ups). A give-up before any detection is the
framework's reaction (an agent that lost its store says nothing else).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.errors import Unsupported
from chaosbench.frameworks.agent import AGENT_ROLES, agent_argv, agent_env, rendezvous_wait
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
from chaosbench.launchers.nvrx import BRIDGE_SECTIONS
from chaosbench.runtimes.base import ProcessSpec, ProcHandle, Runtime

#: The launcher generations the adapter drives, by the installed nvidia-resiliency-ext: ``0.4`` (0.4.x: torch's
#: c10d rendezvous, restarts counted per agent, ``--ft-restart-policy any-failed|min-healthy``) and ``0.7``
#: (0.7.x: its own barrier rendezvous, one restart budget for the whole job, hot spares). 0.5 and 0.6 were never
#: run here and are refused.
Generation = Literal["0.4", "0.7"]


def launcher_generation(version: str | None) -> Generation:
    """The launcher generation of an installed nvidia-resiliency-ext ``version``; Unsupported for any other."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    major_minor = (int(m.group(1)), int(m.group(2))) if m else None
    if major_minor == (0, 4):
        return "0.4"
    if major_minor == (0, 7):
        return "0.7"
    raise Unsupported(
        f"nvrx: nvidia-resiliency-ext {version or 'is not installed'}"
        f"{'' if version is None else ' is installed'}: the adapter drives 0.4.x and 0.7.x "
        "(docs/nvrx.md)"
    )


def installed_generation() -> Generation:
    return launcher_generation(package_version("nvidia-resiliency-ext"))


#: What the launcher itself uses where the adapter passes nothing, per generation (from each version's source:
#: 0.4.1 and 0.7.0 ``fault_tolerance/launcher.py`` and ``config.py``; 0.7.0 ``ft_rendezvous_barrier.py``).
LAUNCHER_DEFAULTS: dict[Generation, dict[str, float]] = {
    "0.4": {
        "workers_stop_timeout_s": 30.0,
        "term_timeout_s": 1800.0,
        # what its launcher passes to the rendezvous (its start-up line "rdzv_configs : {...}")
        "rdzv_join_timeout_s": 900.0,
        "rdzv_last_call_timeout_s": 30.0,
        "rdzv_close_timeout_s": 600.0,
        "rdzv_read_timeout_s": 600.0,
        "exit_barrier_timeout_s": 300.0,
        "node_health_check_interval_s": 5.0,
        "restart_check_interval_s": 60.0,
    },
    "0.7": {
        "workers_stop_timeout_s": 15.0,
        # --term-timeout: a signal the launcher receives (the harness's teardown) reaches the ranks as SIGTERM,
        # SIGKILL after this long
        "term_timeout_s": 1800.0,
        # the rendezvous (0.4.1: its copy of torch's c10d one; 0.7.0: its barrier rendezvous), as the launcher
        # passes it (its start-up line "rdzv_configs : {...}"): join (a round must complete within it), last call
        # (0.7: a round with enough nodes waits this long for previously active ones before taking hot spares),
        # close, read (a store read), and how long a node waits for the store host to listen
        "rdzv_join_timeout_s": 300.0,
        "rdzv_last_call_timeout_s": 1.0,
        "rdzv_close_timeout_s": 30.0,
        "rdzv_read_timeout_s": 60.0,
        "store_connect_wait_s": 120.0,
        # LocalElasticAgent exit_barrier_timeout: a finished node waits this long for the others
        "exit_barrier_timeout_s": 300.0,
        "node_health_check_interval_s": 5.0,
        "restart_check_interval_s": 60.0,
        # the store host sleeps this long before exiting, so other nodes can read the final state
        "store_host_exit_grace_s": 3.0,
        # after stopping the workers, before restarting: wait for GPU memory to be reclaimed (no GPU here:
        # docs/nvrx.md)
        "gpu_memory_reclaim_timeout_s": 50.0,
    },
}

# 0.4: a rank monitor logs under ``[RankMonServer<monitor pid>@<host>:<global rank of the connected rank>]``: the
# only place a monitor's timeout line names the rank it is about to kill (the message itself names none, and its
# "sent SIGCONT then SIGKILL to the rank (PID=...)" is DEBUG only).
_RMON_04 = r"(?:\[RankMonServer\d+@[^\]\s]*:(?P<blame_rank>\d+)\] )?"
# 0.7: through the launcher's own log format, ``[workload:<rank>(<local rank>) infra:...] <file>:<line> [Cycle N]
# <message>``; a monitor knows its local rank (its LOCAL_RANK), its rank shows as ``?``.
_RMON_07 = (
    r"(?:\[workload:(?:\?|(?P<blame_rank>\d+))\((?:\?|(?P<local_rank>\d+))\) infra:[^\]]*\] \S+ )?"
    r"\[Cycle \d+\] "
)


#: The rank monitors' timeout lines, as they read after the prefix of each version's log format (_RMON_04/07).
_MONITOR_LINES = [
    LogPattern(
        "detect",
        r"Section '(?P<section>[^']+)' has been open for (?P<open_s>[\d.]+) seconds",
        "agent",
        via="heartbeat",
    ),
    LogPattern("detect", r"Was out of section for (?P<open_s>[\d.]+) seconds", "agent", via="heartbeat"),
    LogPattern(
        "detect",
        r"Did not get (?P<heartbeat>initial|subsequent) heartbeat\. Waited (?P<waited_s>[\d.]+)",
        "agent",
        via="heartbeat",
    ),
]

#: The launcher's (torch's agent's) line on a failed worker, and its restart decision.
_AGENT_LINES = [
    # The launcher names the worker's local rank on its node and the pid of the worker it started (the bridge).
    LogPattern(
        "detect",
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)",
        "agent",
        via="exit",
    ),
    # the restart decision of an agent whose own worker failed (N: what was left before this one)
    LogPattern(
        "restart",
        r"Worker group (?:FAILED|UNHEALTHY)\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left; will restart",
        "agent",
    ),
]


def _monitor_patterns(rmon: str) -> list[LogPattern]:
    """The rank monitors' timeout lines (``rmon``: what comes before the message), then the agent's lines."""
    return [*(dataclasses.replace(p, regex=rmon + p.regex) for p in _MONITOR_LINES), *_AGENT_LINES]


NVRX_PATTERNS = [
    *_monitor_patterns(_RMON_04),
    # min-healthy (counted by rendezvous round, from the source; not measured here):
    LogPattern(
        "restart",
        r"(?P<attempts_left>\d+)/(?P<max_restarts>\d+) restart attempts left; restarting worker group",
        "agent",
    ),
    # ft_launcher catches torch's ChildFailedError itself and logs this instead (and exits 1):
    LogPattern(
        "give_up",
        r"Some rank\(s\) exited with non-zero exit code|Agent run ended with exception|\b0/\d+ restart attempts left"
        r"|ChildFailedError",
        "agent",
        via="exit",
    ),
]

#: 0.7.0's lines (fault_tolerance/launcher.py, ft_rendezvous_barrier.py).
NVRX07_PATTERNS = [
    *_monitor_patterns(_RMON_07),
    # One restart budget for the whole job: an agent whose workers are healthy sees the next rendezvous round
    # opened by the one that failed and restarts too, spending one of its own attempts.
    LogPattern("restart", r"Joining cluster restart \(group_rank=(?P<group_rank>\d+)\)", "agent"),
    # A health check before the rendezvous (GPU, NIC link state, storage paths, node health service, Slurm
    # segment) failed: the node leaves as unhealthy.
    LogPattern("detect", r"\b\w[\w ]* failed for node \S+: ", "agent", via="health check"),
    # Ends without restarting: no attempts left (ChildFailedError), no progress across restarts or a stop
    # recommended (NoRestartRequested), another launcher's terminal failure, too many unhealthy nodes, or any
    # other exception (a lost rendezvous store: RendezvousConnectionError).
    LogPattern(
        "give_up",
        r"Some rank\(s\) exited with non-zero exit code|Agent run ended with exception"
        r"|NVRx decided the job must not be restarted|Another launcher reported a no-restart decision"
        r"|Rendezvous closed because another launcher reported a terminal worker-group failure"
        r"|Rendezvous cannot complete: \d+ unhealthy nodes",
        "agent",
        via="exit",
    ),
    # Hot spares: a node that waits as standby, and one that is given an active rank (round R).
    LogPattern("log", r"Standby \(rank=\d+\) for round \d+; waiting for round \d+ to open", "agent"),
    LogPattern("log", r"Assigned active rank \d+ \(round=\d+\)", "agent"),
]


def _opt(v: float | None) -> str:
    return "null" if v is None else str(v)


class NvrxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_restarts: int = Field(default=3, ge=0, description="ft_launcher --max-restarts")
    monitor_interval_s: float = Field(default=0.1, gt=0, description="ft_launcher --monitor-interval")
    workers_stop_timeout_s: float | None = Field(
        default=None,
        ge=0,
        description="--workers-stop-timeout: SIGTERM to SIGKILL when restarting ranks (null: "
        "the launcher's default, 30 s in 0.4.1, 15 s in 0.7.0)",
    )
    workload_check_interval_s: float = Field(default=1.0, gt=0, description="--ft-workload-check-interval")
    initial_rank_heartbeat_timeout_s: float = Field(
        default=120.0, gt=0, description="--ft-initial-rank-heartbeat-timeout (start-up + restore)"
    )
    rank_heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, description="--ft-rank-heartbeat-timeout (between steps)"
    )
    section_timeouts: dict[str, float | None] = Field(
        default_factory=dict,
        description="--ft-rank-section-timeouts, e.g. {step: 5, checkpoint: 60}; the bridge's sections (step, "
        "checkpoint) are always declared, with no timeout (null) unless set here",
    )
    out_of_section_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="--ft-rank-out-of-section-timeout (null: none; the CLI cannot say null)",
    )
    rank_termination_signal: str = Field(default="SIGKILL", description="--ft-rank-termination-signal")
    restart_policy: Literal["any-failed", "min-healthy"] = Field(
        default="any-failed", description="--ft-restart-policy (0.4 only; 0.7 has any-failed alone)"
    )
    spares: int = Field(
        default=0,
        ge=0,
        description="0.7: hot spare nodes: agents that wait as standby (--nnodes N:N+spares), "
        "started once the first round assigned the active ranks, one taking a lost node's place at the next restart",
    )
    max_no_progress_cycles: int = Field(
        default=3,
        description="0.7: --ft-max-no-progress-cycles (its default; inactive without a checkpoint "
        "iteration file, which the adapter does not pass)",
    )
    nic_healthcheck: bool = Field(
        default=True,
        description="0.7: --ft-enable-nic-healthcheck, the NIC link state check before each "
        "rendezvous (its default; no InfiniBand device here: it passes)",
    )
    share_rdzv_tcp_store: bool = Field(
        default=True, description="false: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    )
    bridge_poll_s: float = Field(
        default=0.02, gt=0, description="how often the bridge reads the rank's events"
    )
    log_level: str = Field(default="INFO", description="LOGLEVEL of the launcher")
    extra_args: list[str] = Field(default_factory=list, description="more ft_launcher arguments, as is")
    teardown_grace_s: float = Field(default=5.0, ge=0)

    @field_validator("section_timeouts")
    @classmethod
    def _check_sections(cls, v: dict[str, float | None]) -> dict[str, float | None]:
        for name, timeout in v.items():
            if not name or any(c in name for c in ",: "):
                raise ValueError(f"section name {name!r}: must be non-empty, without ',', ':' or spaces")
            if timeout is not None and not timeout > 0:
                raise ValueError(f"section {name!r}: timeout must be > 0 or null (no timeout), not {timeout}")
        return v

    def all_section_timeouts(self) -> dict[str, float | None]:
        """What ``--ft-rank-section-timeouts`` declares: the bridge's sections (None: no timeout), then the user's."""
        return {**dict.fromkeys(BRIDGE_SECTIONS), **self.section_timeouts}


class NvrxFramework(Framework[NvrxOptions]):
    """nvidia-resiliency-ext ft_launcher with rank monitors; see the module docstring."""

    name: ClassVar[str] = "nvrx"
    roles: ClassVar[dict[str, Role]] = {
        **Framework.roles,
        "agent": AGENT_ROLES["agent"],
        "rendezvous-host": AGENT_ROLES["rendezvous-host"],
        "bridge": Role(
            "a rank's bridge to the rank monitor (node0's newest, unless the target names a node); the "
            "rank dies with it",
            proc_role="bridge",
            node="node0",
        ),
    }

    @classmethod
    def missing_engine(cls, options: NvrxOptions, runtime: type[Runtime]) -> str | None:
        try:
            installed_generation()
        except Unsupported as exc:
            return f"{exc}: pip install 'chaosbench[nvrx]'"
        return None

    def _generation(self) -> Generation:
        """The installed launcher's generation, refused (one line) where these options cannot run on it."""
        gen = installed_generation()
        o = self.options
        if gen == "0.7" and o.restart_policy != "any-failed":
            raise Unsupported(
                f"restart_policy '{o.restart_policy}': nvidia-resiliency-ext 0.7 restarts on "
                "any failure only (--ft-restart-policy any-failed)"
            )
        if gen == "0.4" and o.spares:
            raise Unsupported(f"spares: {o.spares}: nvidia-resiliency-ext 0.4 has no hot spares (0.7 has)")
        return gen

    def _ft_options(self, gen: Generation, sections: str) -> list[str]:
        """ft_launcher's own options for the installed generation (every agent the same)."""
        o = self.options
        ft_options = [
            *(
                ["--workers-stop-timeout", str(o.workers_stop_timeout_s)]
                if o.workers_stop_timeout_s is not None
                else []
            ),
            "--ft-workload-check-interval",
            str(o.workload_check_interval_s),
            "--ft-initial-rank-heartbeat-timeout",
            str(o.initial_rank_heartbeat_timeout_s),
            "--ft-rank-heartbeat-timeout",
            str(o.rank_heartbeat_timeout_s),
            "--ft-rank-section-timeouts",
            sections,
            *(
                ["--ft-rank-out-of-section-timeout", str(o.out_of_section_timeout_s)]
                if o.out_of_section_timeout_s is not None
                else []
            ),
            "--ft-rank-termination-signal",
            o.rank_termination_signal,
            "--ft-enable-nic-monitor",
            "false",
        ]
        if gen == "0.4":
            return [*ft_options, "--ft-restart-policy", o.restart_policy]
        return [
            *ft_options,
            "--ft-enable-nic-healthcheck",
            str(o.nic_healthcheck).lower(),
            "--ft-max-no-progress-cycles",
            str(o.max_no_progress_cycles),
        ]

    def _notes(self, gen: Generation, sections: str, agents: int, nnodes: str) -> list[str]:
        o = self.options
        notes = [
            f"nvidia-resiliency-ext {package_version('nvidia-resiliency-ext')} (launcher generation {gen})",
            "each rank runs under a bridge that turns its step/checkpoint events into rank-monitor heartbeats "
            "and sections",
            f"--ft-rank-section-timeouts {sections}: the bridge's sections are always declared (null: no "
            "timeout)",
        ]
        if gen == "0.4":
            notes.append(
                "worker incarnation = CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT, with "
                "CHAOSBENCH_INCARNATION set per start so that it is the rendezvous round (the same on "
                "every node)"
            )
        else:
            notes.append(
                "worker incarnation = TORCHELASTIC_RESTART_COUNT, which 0.7 sets to the rendezvous round "
                "(the job's cycle) on every node"
            )
        if agents > 1:
            notes.append("node0's agent hosts the rendezvous store (is_host)")
        if o.spares:
            notes.append(
                f"{o.spares} hot spare node(s): --nnodes {nnodes}, the last {o.spares} agent(s) standby"
            )
        return notes

    def plan(self, job: JobContext) -> LaunchPlan:
        o = self.options
        gen = self._generation()
        python = job.workload_argv()[0]
        endpoint = f"{job.runtime.master_addr}:{job.runtime.free_port()}"
        sections = ",".join(f"{k}:{_opt(v)}" for k, v in o.all_section_timeouts().items())
        agents = job.nodes + o.spares
        nnodes = str(job.nodes) if not o.spares else f"{job.nodes}:{agents}"
        ft_options = self._ft_options(gen, sections)
        procs = []
        for n in range(agents):
            node = job.node_name(n)
            rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job.run_id]
            if agents > 1:
                # node0's agent hosts the store, as on a cluster whose endpoint is node0's: on one host every agent
                # matches the endpoint and the first to bind hosts it (a lost node1 then took the store with it,
                # and node0's launcher ended at once with RendezvousConnectionError); the rendezvous-host role
                rendezvous += ["--rdzv-conf", f"is_host={'true' if n == 0 else 'false'}"]
            argv = agent_argv(
                job,
                # ft_launcher, unchanged, with incarnations numbered by rendezvous round (chaosbench.launchers.nvrx)
                ["-m", "chaosbench.launchers.nvrx", "launcher"],
                nnodes,
                o.max_restarts,
                o.monitor_interval_s,
                rendezvous,
                [*ft_options, *o.extra_args],
                rank_wrapper=[
                    python,
                    "-m",
                    "chaosbench.launchers.nvrx",
                    "bridge",
                    "--poll-s",
                    str(o.bridge_poll_s),
                    "--",
                ],
            )
            env = agent_env(job, node, o.log_level, o.share_rdzv_tcp_store)
            if gen == "0.7" and agents > 1:
                # 0.7's rendezvous closes for good when two participants share an address ("more than one
                # ft_launcher per node (misconfiguration)"); chaosbench's local nodes share this host
                env["NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"] = "1"
                # its infrastructure rank (without Slurm's): active ranks go to the lowest, so node0..node{N-1} are
                # the active nodes and the spares standby, in node order (unset: ordered by a random node id)
                env["GROUP_RANK"] = str(n)
            name = "ft_launcher" if agents == 1 else f"ft_launcher.{node}"
            procs.append(ProcessSpec(name=name, argv=argv, env=env, role="agent", node=node))
        notes = self._notes(gen, sections, agents, nnodes)
        return self.launch_plan(
            job,
            procs,
            NVRX_PATTERNS if gen == "0.4" else NVRX07_PATTERNS,
            options={**o.model_dump(), "launcher_generation": gen, "nnodes": nnodes},
            notes=notes,
        )

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        defaults: dict[str, Any]
        if getattr(job, "documenting", False):  # the reference page: per version, not the one installed there
            defaults = {
                k: " / ".join(f"`{LAUNCHER_DEFAULTS[g].get(k, 'null')}` ({g})" for g in LAUNCHER_DEFAULTS)
                for k in {**LAUNCHER_DEFAULTS["0.4"], **LAUNCHER_DEFAULTS["0.7"]}
            }
        else:
            defaults = LAUNCHER_DEFAULTS[installed_generation()]
        t = super().timeouts(job)
        t.update(
            {
                "monitor_interval_s": o.monitor_interval_s,
                "workload_check_interval_s": o.workload_check_interval_s,
                "initial_rank_heartbeat_timeout_s": o.initial_rank_heartbeat_timeout_s,
                "rank_heartbeat_timeout_s": o.rank_heartbeat_timeout_s,
                "out_of_section_timeout_s": o.out_of_section_timeout_s,
                **{f"section_timeout_{k}_s": v for k, v in o.all_section_timeouts().items()},
                **defaults,
                "workers_stop_timeout_s": (
                    o.workers_stop_timeout_s
                    if o.workers_stop_timeout_s is not None
                    else defaults["workers_stop_timeout_s"]
                ),
                "bridge_poll_s": o.bridge_poll_s,
                "teardown_grace_s": o.teardown_grace_s,
            }
        )
        return t

    def _hang_detectors(self, timeouts: dict[str, Any]) -> list[tuple[str, float]]:
        """What can notice a hung rank, earliest first: the monitor's step section and heartbeat timeouts, and
        the peers' process-group timeout (their exit is then what ft_launcher sees, and blames)."""
        out = [
            (k, float(timeouts[k]))
            for k in ("section_timeout_step_s", "rank_heartbeat_timeout_s")
            if timeouts.get(k) is not None
        ]
        out.append(pg_timeout(timeouts))
        return sorted(out, key=lambda kv: kv[1])

    def node_loss_wait(
        self, nodes: int, node: str | None, timeouts: dict[str, Any]
    ) -> tuple[str, float] | None:
        """Without a hot spare every round needs all the nodes (:func:`~chaosbench.frameworks.agent.rendezvous_wait`,
        with the launcher's own join timeout per version: :data:`LAUNCHER_DEFAULTS`)."""
        return None if self.options.spares else rendezvous_wait(nodes, node, timeouts)

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        if mode == "crash":
            return Prediction(
                *chain(("monitor_interval_s", timeouts.get("monitor_interval_s"))),
                note="ft_launcher polls its workers' exits",
            )
        if mode not in (
            "hang",
            "stall",
        ):  # the bridge heartbeats from the rank's events: a stall stops them too
            return None
        name, value = self._hang_detectors(timeouts)[0]
        if name.startswith(("workload_pg", "torch_default_pg")):
            poll = ("monitor_interval_s", timeouts.get("monitor_interval_s"))
            note = "the peers' process-group timeout fires before the rank monitor's: their exit is detected, and blamed"
        else:
            poll = ("workload_check_interval_s", timeouts.get("workload_check_interval_s"))
            note = "the rank monitor sees no heartbeat / an open section past its timeout and kills the rank"
        return Prediction(*chain((name, value), poll), note=note)

    def timeout_problems(self, timeouts: dict[str, Any]) -> list[str]:
        first, value = self._hang_detectors(timeouts)[0]
        if first.startswith(("workload_pg", "torch_default_pg")):
            hb = timeouts.get("rank_heartbeat_timeout_s")
            return [
                f"rank_heartbeat_timeout_s ({hb:g} s) and every section timeout >= {first} ({value:g} s): a hung "
                "rank's peers always time out first, so the rank monitor never decides and a survivor is blamed"
            ]
        return []

    def versions(self) -> dict[str, str | None]:
        v = base_versions()
        v["nvidia-resiliency-ext"] = package_version("nvidia-resiliency-ext")
        return v

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        """Start the agents and wait: completed when every agent exited 0, except those a signal killed (a lost
        node's) when another finished; failed when all have exited otherwise. Hot spares start once every active
        node's agent logged its rank of the first round (``Assigned active rank``): 0.7 closes a round as soon as
        the minimum number of nodes is there, so spares started with the others took an active rank whenever they
        joined first (measured: node2 active and node1 standby, and a fault on node1 hit an idle spare)."""
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        assigned: set[str] = set()

        def on_line(handle: ProcHandle, stream: str, line: str, t_ns: int) -> None:
            watcher(handle, stream, line, t_ns)
            if "Assigned active rank" in line:
                assigned.add(handle.name)

        active, spares = plan.processes[: job.nodes], plan.processes[job.nodes :]
        agents: list[ProcHandle] = [control.runtime.start(p, on_line=on_line) for p in active]

        def step() -> JobResult | None:
            nonlocal spares
            if spares and len(assigned) >= len(active):
                agents.extend(control.runtime.start(p, on_line=on_line) for p in spares)
                spares = []
            codes = [a.poll() for a in agents]
            if all(c is not None for c in codes):
                lost = [a.name for a, c in zip(agents, codes, strict=True) if c is not None and c < 0]
                bad = [f"{a.name} exited with code {c}" for a, c in zip(agents, codes, strict=True) if c]
                if all(c == 0 or (c is not None and c < 0) for c in codes) and any(c == 0 for c in codes):
                    return JobResult("completed", f"lost: {', '.join(lost)}" if lost else "")
                return JobResult("failed", "; ".join(bad))
            return None

        return supervise_job(control, step, min(0.05, self.options.monitor_interval_s))
