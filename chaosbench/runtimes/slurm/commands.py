"""Slurm's client commands, as the ``slurm`` runtime (and what drives it: ``slurm-requeue``, ``slurm-node-down``)
runs them on the harness's host: one wrapper, :meth:`SlurmCommands.command`, that turns a failure into
:class:`~chaosbench.errors.ChaosbenchError` with Slurm's one-line reason, and the queries built on it
(``scontrol``, ``sinfo``, ``squeue``, ``scancel``, ``sacct``), answered in chaosbench's terms
(:mod:`chaosbench.runtimes.slurm.states`).

Requires the Slurm client commands on the harness's host (``srun``, ``sbatch``, ``squeue``, ``scontrol``,
``scancel``, ``sinfo``); ``sacct`` is optional (used only when it answers: clusters without an accounting
database, like the local test cluster, have no ``sacct``), since ``squeue -t all`` and ``scontrol show job``
know every job for ``MinJobAge`` seconds after it ended.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from chaosbench.errors import (
    ChaosbenchError,
    EngineCommandFailed,
    EngineError,
    ForeignTarget,
    MissingEngine,
    TargetNotFound,
)
from chaosbench.runtimes.slurm.states import (
    ACTIVE_JOB_STATES,
    JobInfo,
    JobState,
    NodeState,
    job_state,
    node_state,
    parse_kv,
)


def job_prefix(run_id: str) -> str:
    """The name prefix of every job of a run, ``cb-<run hash>``: how teardown, ``leftovers`` and
    ``chaosbench cleanup`` find exactly this run's jobs (``<prefix>.<process>``), never anyone else's."""
    return "cb-" + hashlib.sha256(run_id.encode()).hexdigest()[:10]


def run_comment(run_id: str) -> str:
    """The comment (``--comment``) every job of a run is submitted with: with the name prefix, what makes a job
    this run's (a job someone named like ours without it is not)."""
    return f"chaosbench.run={run_id}"


class SlurmCommands:
    """The Slurm client commands of one run: every command gets ``env`` (the harness's environment, with
    ``SLURM_CONF`` when the run sets one) and waits at most ``timeout_s``; queries of nodes are limited to
    ``partition`` (None: the cluster's default one); "this run's jobs" are those named ``<prefix>.*`` and, when
    ``run_id`` is given, commented :func:`run_comment` of it (:meth:`our_jobs_on` is the rule every action on a
    node or a process of the cluster goes through)."""

    def __init__(
        self,
        env: Mapping[str, str],
        timeout_s: float,
        partition: str | None = None,
        prefix: str = "",
        run_id: str | None = None,
    ) -> None:
        self.env = dict(env)
        self.timeout_s = timeout_s
        self.partition = partition
        self.prefix = prefix
        self.run_id = run_id
        self._checked = False

    def command(
        self,
        argv: list[str],
        check: bool = True,
        timeout_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        """Run one Slurm client command (``extra_env`` added to the run's environment for this one); returns
        stdout. Failures raise ChaosbenchError with Slurm's one-line reason (a missing command raises
        MissingEngine)."""
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env={**self.env, **extra_env} if extra_env else self.env,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s or self.timeout_s,
            )
        except FileNotFoundError:
            raise MissingEngine(
                f"Slurm command '{argv[0]}' not found: is this host a Slurm client?"
            ) from None
        except subprocess.TimeoutExpired:
            raise EngineError("slurm", f"'{' '.join(argv[:3])}' gave no answer within the timeout") from None
        if check and res.returncode != 0:
            raise EngineCommandFailed(argv, res.returncode, res.stderr.strip() or res.stdout.strip())
        return res.stdout

    def partition_args(self) -> list[str]:
        """``-p PARTITION`` when one is set."""
        return ["-p", self.partition] if self.partition else []

    def check(self) -> None:
        """Raise MissingEngine when no cluster answers (or the partition does not exist). Asks once."""
        if self._checked:
            return
        try:
            out = self.command(["sinfo", "-h", "-o", "%R", *self.partition_args()], timeout_s=15)
        except ChaosbenchError as exc:
            raise MissingEngine(f"no Slurm cluster answers: {exc}") from None
        if not out.strip():
            raise MissingEngine(f"Slurm partition '{self.partition}' not found")
        self._checked = True

    # ------------------------------------------------------------------ the scheduler
    def scheduler_config(self) -> dict[str, Any]:
        """Scheduler settings that shape detection and recovery (seconds where a time), from
        ``scontrol show config``: the requeue hold (``cred_expire``, default 120 s), the node timeout, the
        kill wait, the backfill interval, the job record lifetime."""
        raw: dict[str, str] = {}
        for line in self.command(["scontrol", "show", "config"]).splitlines():
            if "=" in line:
                k, _, v = line.partition("=")
                raw[k.strip()] = v.strip()

        def secs(v: str | None) -> float | None:
            m = re.match(r"^(\d+)", v or "")
            return float(m.group(1)) if m else None

        auth = dict(kv.split("=", 1) for kv in raw.get("AuthInfo", "").split(",") if "=" in kv)
        sched = dict(kv.split("=", 1) for kv in raw.get("SchedulerParameters", "").split(",") if "=" in kv)
        return {
            "slurm_version": raw.get("SLURM_VERSION"),
            "cluster": raw.get("ClusterName"),
            "scheduler_type": raw.get("SchedulerType"),
            "requeue_hold_s": secs(auth.get("cred_expire")) or 120.0,
            "backfill_interval_s": secs(sched.get("bf_interval")) or 30.0,
            "sched_interval_s": secs(sched.get("sched_interval")) or 60.0,
            "slurmd_timeout_s": secs(raw.get("SlurmdTimeout")),
            "kill_wait_s": secs(raw.get("KillWait")),
            "min_job_age_s": secs(raw.get("MinJobAge")),
            "job_requeue": raw.get("JobRequeue"),
        }

    # ------------------------------------------------------------------ nodes
    def nodes_info(self, names: list[str] | None = None) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` of the partition's nodes (or of ``names``), keyed by node name."""
        argv = ["scontrol", "show", "node", "-o", *([",".join(names)] if names else [])]
        out = {}
        for line in self.command(argv).splitlines():
            kv = parse_kv(line)
            if "NodeName" in kv:
                out[kv["NodeName"]] = kv
        if self.partition and not names:
            out = {n: kv for n, kv in out.items() if self.partition in kv.get("Partitions", "").split(",")}
        return out

    def node_state(self, slurm_node: str) -> tuple[NodeState, str]:
        """A Slurm node's state: (chaosbench's, Slurm's raw spelling)."""
        kv = self.nodes_info([slurm_node]).get(slurm_node)
        if kv is None:
            raise TargetNotFound(
                f"Slurm node {slurm_node}", "not found", message=f"Slurm node {slurm_node} not found"
            )
        return node_state(kv.get("State", "UNKNOWN")), kv.get("State", "UNKNOWN")

    def partition_nodes(self) -> list[str]:
        """Nodes of the partition (the cluster's default partition when none is set), in Slurm's order."""
        out = self.command(["sinfo", "-h", "-N", "-o", "%N|%P", *self.partition_args()])
        names: list[str] = []
        for line in out.splitlines():
            n, _, p = line.partition("|")
            if n and n not in names and (self.partition or p.endswith("*")):
                names.append(n)
        return names

    def hostnames(self, expr: str) -> list[str]:
        """A Slurm host list expression (``n[1-3]``) expanded by ``scontrol show hostnames``."""
        return self.command(["scontrol", "show", "hostnames", expr]).split()

    # ------------------------------------------------------------------ jobs
    def job_info(self, job_id: int) -> JobInfo | None:
        """The scheduler's view of a job (``scontrol show job``; ``sacct`` once it is gone), or None."""
        out = self.command(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        kv = parse_kv(out.strip()) if out.strip() else {}
        if "JobState" not in kv:
            return self._sacct_info(job_id)
        nodes_expr = kv.get("NodeList", "")
        nodes = self.hostnames(nodes_expr) if nodes_expr and nodes_expr != "(null)" else []
        reason = kv.get("Reason", "")
        return JobInfo(
            job_id=job_id,
            slurm_state=kv["JobState"],
            state=job_state(kv["JobState"]),
            reason="" if reason == "None" else reason,
            restarts=int(kv.get("Restarts", "0") or 0),
            nodes=nodes,
            exit_code=kv.get("ExitCode", ""),
            name=kv.get("JobName", ""),
        )

    def _sacct_info(self, job_id: int) -> JobInfo | None:
        try:
            out = self.command(
                ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "State,Reason,NodeList,ExitCode"],
                timeout_s=10,
            )
        except ChaosbenchError:
            return None
        line = out.strip().splitlines()[-1] if out.strip() else ""
        if not line:
            return None
        st, reason, nodes_expr, code = (line.split("|") + ["", "", "", ""])[:4]
        return JobInfo(
            job_id=job_id,
            slurm_state=st,
            state=job_state(st),
            reason=reason,
            nodes=self.hostnames(nodes_expr) if nodes_expr not in ("", "None assigned") else [],
            exit_code=code,
        )

    def job_id_named(self, job_name: str) -> int | None:
        """The id of the newest of this run's jobs named ``job_name`` (``squeue -t all``), None when the scheduler
        knows none."""
        out = self.command(["squeue", "-h", "-t", "all", f"--name={job_name}", "-o", "%i|%k"], check=False)
        ids = [
            int(jid)
            for jid, _, comment in (ln.partition("|") for ln in out.splitlines())
            if jid.isdigit() and self._ours(job_name, comment)
        ]
        return max(ids) if ids else None

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: the job goes back to the queue (held until its begin time, see
        :meth:`scheduler_config`)."""
        self.command(["scontrol", "requeue", str(job_id)])

    def scancel(self, job_ids: list[int], *args: str) -> None:
        """``scancel [args] JOB...`` (nothing for no jobs); failures are ignored (a job may have just ended)."""
        if job_ids:
            self.command(["scancel", *args, *[str(j) for j in job_ids]], check=False)

    def _ours(self, name: str, comment: str) -> bool:
        """Whether a job named ``name`` with ``comment`` is this run's: our name prefix, and our comment where the
        run id is known."""
        return name.startswith(self.prefix + ".") and (
            self.run_id is None or comment == run_comment(self.run_id)
        )

    def our_jobs(self, active_only: bool = True) -> dict[int, str]:
        """This run's jobs known to the scheduler: job id -> name (only those not ended, by default)."""
        out = self.command(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%k"], check=False)
        jobs = {}
        for line in out.splitlines():
            jid, _, rest = line.partition("|")
            name, _, rest = rest.partition("|")
            st, _, comment = rest.partition("|")
            if not self._ours(name, comment) or not jid.isdigit():
                continue
            try:
                state = job_state(st)
            except ChaosbenchError:
                state = JobState.RUNNING
            if not active_only or state in ACTIVE_JOB_STATES:
                jobs[int(jid)] = name
        return jobs

    def _running_on(self, slurm_node: str) -> list[tuple[str, str, str]]:
        """(job id, name, comment) of every job running on ``slurm_node``, whoever's."""
        out = self.command(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING,SUSPENDED", "-w", slurm_node, "-o", "%i|%j|%k"],
            check=False,
        )
        rows = []
        for line in out.splitlines():
            jid, _, rest = line.partition("|")
            name, _, comment = rest.partition("|")
            if jid.isdigit():
                rows.append((jid, name, comment))
        return rows

    def jobs_on(self, slurm_node: str) -> dict[int, str]:
        """This run's running jobs with an allocation on ``slurm_node``: job id -> name."""
        return {
            int(jid): name for jid, name, comment in self._running_on(slurm_node) if self._ours(name, comment)
        }

    def our_jobs_on(self, slurm_node: str, doing: str, target: str | None = None) -> list[int]:
        """The rule before the runtime acts on ``slurm_node`` or a process there (a signal, a kill of its tasks,
        DOWN/DRAIN): the ids of this run's jobs running there, sorted. Raises ForeignTarget, naming ``target``
        (what would have been acted on, e.g. ``pid 1234``) when given, when none runs there; ``doing`` says what
        would have been done ("signalling it"). A pid is then checked, on the node, against exactly these jobs."""
        jobs = sorted(self.jobs_on(slurm_node))
        if not jobs:
            raise ForeignTarget(f"Slurm node {slurm_node}", "runs no job of this run", doing, target=target)
        return jobs

    def helper_step(
        self, slurm_node: str, jobs: list[int], script: str, args: list[str], *options: str
    ) -> list[str]:
        """argv of an extra step overlapping the newest of ``jobs`` (this run's jobs on ``slurm_node``, from
        :meth:`our_jobs_on`) that runs ``sh -c SCRIPT`` with ``ARGS``, then the node and the job ids."""
        step = ["srun", "-Q", f"--jobid={max(jobs)}", "--overlap", "-w", slurm_node, "-N1", "-n1", *options]
        return [*step, "sh", "-c", script, "sh", *args, slurm_node, *[str(j) for j in sorted(jobs)]]

    def foreign_jobs_on(self, slurm_node: str) -> list[int]:
        """Jobs of others (not this run's) running on ``slurm_node``."""
        return [
            int(jid) for jid, name, comment in self._running_on(slurm_node) if not self._ours(name, comment)
        ]
