"""The ``slurm-requeue`` adapter: recovery by the scheduler itself.

The whole job is one batch job, submitted with ``sbatch --requeue``: a batch script that ``srun``'s one task
per rank (``--kill-on-bad-exit=1``, so one dead rank ends the step and the job). The adapter never talks to
the ranks: it polls the job's state (``scontrol show job``, ``sacct`` once the scheduler has forgotten it),
translates it through :data:`~chaosbench.runtimes.slurm.SLURM_STATES` and writes every transition as a
``sched_state`` event (``job_id, slurm_state, state, reason, restarts, slurm_nodes, exit_code``).

- The job ended badly (chaosbench state ``failed``: non-zero exit, out of memory, time limit): ``detect``
  (``by: harness``, the first poll that saw it), then ``scontrol requeue`` and ``restart`` (``by: harness``),
  up to ``max_restarts``; then ``give_up``. This is what a requeue-on-failure policy (a site's
  ``RequeueExit``, a watcher script, a workflow manager) does.
- The scheduler requeued the job on its own (a node failed under it: ``NODE_FAIL`` with ``--requeue`` and
  ``JobRequeue=1``): its restart count goes up without us; ``detect`` and ``restart`` (``by: scheduler``)
  are written at the first poll that saw it.
- A requeued job starts again from the top of its script with ``SLURM_RESTART_COUNT`` = the new incarnation;
  the workload resumes from its newest complete checkpoint on the shared run directory.

The scheduler's share of the delay is on the timeline: from ``restart`` to the ``sched_state`` event with
state ``running`` (the requeue hold, ``cred_expire``, 120 s by default, plus waiting for the next scheduling
pass and for free nodes); what follows up to the first step is the workload's own restart (batch script,
``srun``, Python and torch start-up, rendezvous, restore). :func:`scheduler_delays` computes the split.
The scheduler settings that shape it are recorded with the timeouts.

Hangs are not detected: a stopped rank keeps its job RUNNING until its time limit; that is a result.
Requires the ``slurm`` runtime.
"""

from __future__ import annotations

import os
import shlex
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.errors import ChaosbenchError, Unsupported
from chaosbench.frameworks.base import (
    Framework,
    JobContext,
    JobResult,
    LaunchPlan,
    Prediction,
    RunControl,
    chain,
    supervise_job,
    torchrun_worker_env,
)
from chaosbench.runtimes.base import BatchJobs, ProcessSpec
from chaosbench.timeline import Event

#: Job environment (of :meth:`~chaosbench.frameworks.base.JobContext.rank_env`) the batch script sets itself.
_PER_JOB = ("CHAOSBENCH_NODE", "CHAOSBENCH_INCARNATION")

#: What only the job knows, as the shell expressions that give it: srun's per-task variables, and what the batch
#: script computes before it starts the tasks.
_TASK_RANK = "$SLURM_PROCID"
_TASK_LOCAL_RANK = "$SLURM_LOCALID"
_TASK_NODE = "$SLURM_NODEID"
_JOB_MASTER_ADDR = "$MASTER_ADDR"
_JOB_MASTER_PORT = "$MASTER_PORT"
_JOB_INCARNATION = "$CHAOSBENCH_INCARNATION"
_EXPANDED = (_TASK_RANK, _TASK_LOCAL_RANK, _TASK_NODE, _JOB_MASTER_ADDR, _JOB_MASTER_PORT, _JOB_INCARNATION)


class SlurmRequeueOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_restarts: int = Field(
        default=3, ge=0, description="requeues (by us or by the scheduler) before giving up"
    )
    poll_interval_s: float = Field(default=0.2, gt=0, description="how often the job's state is polled")
    requeue_on: list[str] = Field(
        default_factory=lambda: ["failed", "lost"],
        description="chaosbench job states (failed, lost) after which the adapter requeues the job",
    )
    sbatch_args: list[str] = Field(default_factory=list, description="more sbatch arguments, as is")
    srun_args: list[str] = Field(default_factory=list, description="more arguments of the ranks' srun")

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _keeps_our_names(cls, v: list[str]) -> list[str]:
        from chaosbench.runtimes.slurm.runtime import keeps_job_identity

        return keeps_job_identity(v)


class SlurmRequeueFramework(Framework[SlurmRequeueOptions]):
    """The scheduler supervises the job: requeue on failure, restart from the newest checkpoint."""

    name: ClassVar[str] = "slurm-requeue"

    @staticmethod
    def _runtime(job: JobContext) -> Any:
        if not isinstance(job.runtime, BatchJobs):
            raise Unsupported(
                f"framework slurm-requeue needs the slurm runtime (a batch scheduler), not "
                f"'{job.runtime.name}'"
            )
        return job.runtime

    def script(self, job: JobContext) -> str:
        """The batch script (plain text; the same script runs again after every requeue)."""
        o = self.options
        rt = self._runtime(job)
        env = {k: v for k, v in job.rank_env(0).items() if k not in _PER_JOB}
        argv = rt.node_argv(job.workload_argv())
        logs = job.run_dir / "logs"
        rpn = job.ranks_per_node
        # torchrun's worker environment: the task's own values expanded by its shell, the rest fixed here
        worker = torchrun_worker_env(
            rank=_TASK_RANK,
            local_rank=_TASK_LOCAL_RANK,
            group_rank=_TASK_NODE,
            world_size=job.ranks,
            local_world_size=rpn,
            group_world_size=job.nodes,
            master_addr=_JOB_MASTER_ADDR,
            master_port=_JOB_MASTER_PORT,
            run_id=job.run_id,
            restart_count=_JOB_INCARNATION,
            max_restarts=o.max_restarts,
            inherited={**os.environ, **env},
        )
        per_task = {k: v for k, v in worker.items() if v in _EXPANDED and v != f"${k}"}
        env.update({k: v for k, v in worker.items() if v not in _EXPANDED})
        assigned = " ".join(f'{k}="{v}"' for k, v in per_task.items())
        task = f'export {assigned} CHAOSBENCH_NODE="node{_TASK_NODE}"; exec "$@"'
        port = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        lines = [
            "#!/bin/bash",
            f"# chaosbench slurm-requeue job of run {job.run_id}; a requeued job runs it again from the top.",
            *[f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())],
            'export CHAOSBENCH_INCARNATION="${SLURM_RESTART_COUNT:-0}"',
            'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "addr=$(scontrol show node -o \"$first\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')",
            'export MASTER_ADDR="${addr:-$first}"',
            f"export MASTER_PORT=$({shlex.quote(rt.python())} -c {shlex.quote(port)})",
            'inc="$CHAOSBENCH_INCARNATION"',
            'echo "chaosbench: incarnation $inc on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"',
            " ".join(
                [
                    "srun",
                    "--kill-on-bad-exit=1",
                    "--unbuffered",
                    f"-N {job.nodes}",
                    f"--ntasks-per-node={rpn}",
                    f"--output={shlex.quote(str(logs))}/rank%t.i$inc.out",
                    f"--error={shlex.quote(str(logs))}/rank%t.i$inc.err",
                    *[shlex.quote(a) for a in o.srun_args],
                    "bash",
                    "-c",
                    shlex.quote(task),
                    "rank",
                    *[shlex.quote(a) for a in argv],
                ]
            ),
            "rc=$?",
            'echo "chaosbench: ranks ended with $rc"',
            "exit $rc",
        ]
        return "\n".join(lines) + "\n"

    def plan(self, job: JobContext) -> LaunchPlan:
        o = self.options
        self._runtime(job)
        spec = ProcessSpec(
            name="job",
            argv=[
                "sbatch",
                "--requeue",
                "-N",
                str(job.nodes),
                f"--ntasks-per-node={job.ranks_per_node}",
                *o.sbatch_args,
                "slurm/job.sh",
            ],
            role="job",
        )
        return LaunchPlan(
            framework=self.label,
            adapter=self.name,
            processes=[spec],
            timeouts=self.timeouts(job),
            versions={**self.versions(), "slurm": self._slurm_version(job)},
            options=o.model_dump(),
            notes=["detection from the scheduler's job state; incarnation = SLURM_RESTART_COUNT"],
        )

    def _slurm_version(self, job: JobContext) -> str | None:
        return self._runtime(job).scheduler.get("slurm_version")

    def timeouts(self, job: JobContext) -> dict[str, float | None]:
        o = self.options
        t = super().timeouts(job)
        t["poll_interval_s"] = o.poll_interval_s
        cfg = self._runtime(job).scheduler  # read when the run started; empty in a dry run
        for k in (
            "requeue_hold_s",
            "backfill_interval_s",
            "sched_interval_s",
            "slurmd_timeout_s",
            "kill_wait_s",
        ):
            t[f"scheduler_{k}"] = cfg.get(k)
        return t

    def predict_detection(self, mode: str, timeouts: dict[str, Any]) -> Prediction | None:
        if mode == "crash":
            return Prediction(
                *chain(("poll_interval_s", timeouts.get("poll_interval_s"))),
                note="srun --kill-on-bad-exit ends the job; the adapter polls its state",
            )
        if mode in ("hang", "stall"):
            return Prediction(
                None, "", note="a stopped or stalled rank keeps its job RUNNING until its time limit"
            )
        return None

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        from chaosbench.runtimes.slurm import JobState

        o = self.options
        rt = self._runtime(job)
        script = job.run_dir / "slurm" / "job.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(self.script(job))
        script.chmod(0o755)
        version = self._slurm_version(job)
        job_id = rt.submit_batch(
            script, "job", job.nodes, job.ranks_per_node, extra=["--requeue", *o.sbatch_args]
        )
        control.timeline.emit(
            "sched_submit",
            src="framework",
            framework=self.label,
            job_id=job_id,
            script=str(script),
            slurm_version=version,
        )
        watch = _RequeueWatch(self.label, o, rt, control, job_id)

        def step() -> JobResult | None:
            if control.stop_reason():  # before asking the scheduler: the loop ends on it
                return None
            info = rt.slurm.job_info(job_id)
            if info is None:
                return JobResult("failed", f"job {job_id} is unknown to the scheduler")
            watch.note_state(info)
            if (ended := watch.requeued_by_the_scheduler(info)) is not None:
                return ended
            if info.state is JobState.COMPLETED:
                return JobResult("completed")
            if info.state is JobState.CANCELLED:
                return JobResult("failed", f"job {job_id} was cancelled ({info.reason or info.slurm_state})")
            return watch.failed(info)

        # the job's state is polled (the scheduler's own clock): no process exit of ours ends a wait
        return supervise_job(control, step, o.poll_interval_s, wake_on_exit=False)


class _RequeueWatch:
    """What :meth:`SlurmRequeueFramework.supervise` keeps between its polls of job ``job_id``: the requeues so
    far (its own, and the scheduler's once seen), the restart count accounted for, whether the current
    incarnation's failure was detected (and requeued), the last state seen and the last requeue error."""

    def __init__(
        self, label: str, options: SlurmRequeueOptions, rt: Any, control: RunControl, job_id: int
    ) -> None:
        self.label, self.o, self.rt, self.control, self.job_id = label, options, rt, control, job_id
        self.requested = 0
        self.handled_restarts = 0
        self.handled_failure = False
        self.last: tuple[str, str, int] | None = None
        self.requeue_error = ""
        self.clock_threads: list[threading.Thread] = []

    def _emit(self, kind: str, **data: Any) -> None:
        self.control.timeline.emit(kind, src="framework", framework=self.label, **data)

    def note_state(self, info: Any) -> None:
        """A new scheduler state is a ``sched_state`` event; once running, each node's clock is measured."""
        from chaosbench.runtimes.slurm import JobState

        key = (info.slurm_state, info.reason, info.restarts)
        if key == self.last:
            return
        self.last = key
        self._emit("sched_state", **info.to_event())
        if info.state is JobState.RUNNING:
            for i, snode in enumerate(info.nodes):
                th = threading.Thread(
                    target=self.rt.measure_clock, args=(snode, f"node{i}", self.job_id), daemon=True
                )
                th.start()
                self.clock_threads.append(th)

    def requeued_by_the_scheduler(self, info: Any) -> JobResult | None:
        """A requeue the harness did not ask for is the scheduler's detection and restart; past ``max_restarts``
        the job is cancelled (the result then)."""
        if info.restarts <= self.handled_restarts:
            return None
        if info.restarts > self.requested and not self.handled_failure:
            why = (
                f"the scheduler requeued job {self.job_id} ({info.slurm_state}, {info.reason or 'no reason'})"
            )
            self._emit(
                "detect",
                by="scheduler",
                via="scheduler",
                reason=why,
                job_id=self.job_id,
                slurm_state=info.slurm_state,
            )
            self._emit("restart", by="scheduler", attempt=info.restarts, reason=why, job_id=self.job_id)
        self.handled_restarts = self.requested = max(self.requested, info.restarts)
        self.handled_failure = False
        if info.restarts > self.o.max_restarts:
            reason = f"retry limit reached ({self.o.max_restarts} requeues)"
            self._emit("give_up", reason=reason)
            self.rt.cancel_batch(self.job_id)
            return JobResult("gave_up", reason)
        return None

    def failed(self, info: Any) -> JobResult | None:
        """A job that failed, was lost or is ending badly: detected once, requeued (``scontrol requeue``, tried
        again at the next poll while the scheduler refuses), or the result when its state is not one to requeue
        on or the retry limit is reached."""
        from chaosbench.runtimes.slurm import JobState

        o, job_id = self.o, self.job_id
        # A job that ended badly is "completing" for a while (its processes end, the epilog runs) with its exit
        # code already known: that is when the scheduler knows, so detection does not wait for it.
        ending_badly = (
            info.state is JobState.STOPPING
            and info.exit_code not in ("", "0:0")
            and info.restarts == self.handled_restarts
        )
        if info.state not in (JobState.FAILED, JobState.LOST) and not ending_badly:
            return None
        state = JobState.FAILED if ending_badly else info.state
        why = f"job {job_id} {info.slurm_state} (exit {info.exit_code}, {info.reason or 'no reason'})"
        if state.value not in o.requeue_on:
            return JobResult("failed", why)
        if not self.handled_failure:
            self.handled_failure = True
            self._emit(
                "detect",
                by="harness",
                via="scheduler",
                reason=f"scheduler state: {why}",
                job_id=job_id,
                slurm_state=info.slurm_state,
            )
            if self.requested >= o.max_restarts:
                self._emit("give_up", reason=f"retry limit reached ({o.max_restarts} requeues): {why}")
                return JobResult("gave_up", why)
        try:
            self.rt.requeue_batch(job_id)
        except ChaosbenchError as exc:  # e.g. still completing: try again at the next poll
            if str(exc) != self.requeue_error:
                self.requeue_error = str(exc)
                self._emit("log", line=self.requeue_error[:400])
        else:
            self.requested += 1
            self._emit(
                "restart",
                by="harness",
                attempt=self.requested,
                reason=why,
                job_id=job_id,
                action="scontrol requeue",
            )
        return None


def scheduler_delays(events: Sequence[Event]) -> list[dict[str, float | None]]:
    """For each ``restart``: seconds until the scheduler ran the job again (``sched_state`` running:
    ``scheduler_s``), and from then until the new incarnation's first step (``workload_s``: batch script,
    srun, start-up, rendezvous, restore). None where the job never ran or stepped again."""
    out = []
    ordered = sorted(events, key=lambda e: e.t_ns)
    for r in (e for e in ordered if e.kind == "restart"):
        run = next(
            (
                e
                for e in ordered
                if e.kind == "sched_state" and e.t_ns >= r.t_ns and e.get("state") == "running"
            ),
            None,
        )
        inc = run.get("restarts") if run is not None else None
        step = next(
            (
                e
                for e in ordered
                if e.kind == "step" and run is not None and e.t_ns >= run.t_ns and e.get("incarnation") == inc
            ),
            None,
        )
        out.append(
            {
                "restart_t_ns": float(r.t_ns),
                "scheduler_s": (run.t_ns - r.t_ns) / 1e9 if run is not None else None,
                "workload_s": (step.t_ns - run.t_ns) / 1e9 if run is not None and step is not None else None,
            }
        )
    return out
