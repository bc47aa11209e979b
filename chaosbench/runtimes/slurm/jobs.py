"""The Slurm jobs of a run, as command lines and answers: a process started as its own one-task job
(:func:`srun_argv`, :class:`SlurmHandle`, its ``srun``'s exit read as the process's: :func:`process_returncode`)
and a batch script handed to the scheduler (:func:`sbatch_argv`, :func:`batch_job_node`). Every job is named
``<job prefix>.<name>`` and commented :func:`~chaosbench.runtimes.slurm.commands.run_comment` of the run."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

from chaosbench.errors import TargetNotFound
from chaosbench.runtimes.base import ProcessSpec, ProcHandle
from chaosbench.runtimes.slurm.commands import SlurmCommands, run_comment
from chaosbench.runtimes.slurm.options import SlurmOptions, job_args, node_argv
from chaosbench.runtimes.slurm.states import JobState

#: ``srun`` exits 128+N when its task was killed by signal N.
SIGNAL_EXIT_BASE = 128


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


def srun_argv(
    opts: SlurmOptions, slurm: SlurmCommands, run_id: str, job_name: str, snode: str, spec: ProcessSpec
) -> list[str]:
    """The ``srun`` that runs ``spec`` as its own one-task job ``job_name`` of run ``run_id`` on Slurm node
    ``snode`` (the job's common arguments, ``srun_args`` and the nodes' Python from ``opts``)."""
    return [
        "srun",
        f"--job-name={job_name}",
        f"--comment={run_comment(run_id)}",
        "-N1",
        "-n1",
        "-w",
        snode,
        "--kill-on-bad-exit=1",
        "--unbuffered",
        *job_args(opts, slurm),
        *([f"--chdir={spec.cwd}"] if spec.cwd else []),
        *opts.srun_args,
        "--",
        *node_argv(opts, spec.argv),
    ]


def process_returncode(srun_rc: int) -> int:
    """The process's return code from its ``srun``'s: 128+N (a task killed by signal N) is -N, as for a local
    process; any other is itself."""
    if srun_rc > SIGNAL_EXIT_BASE and srun_rc - SIGNAL_EXIT_BASE in {int(s) for s in signal.Signals}:
        return -(srun_rc - SIGNAL_EXIT_BASE)
    return srun_rc


def sbatch_argv(
    opts: SlurmOptions,
    slurm: SlurmCommands,
    run_id: str,
    job_name: str,
    nodes: int,
    ntasks_per_node: int,
    output: Path,
    run_dir: Path,
    extra: list[str],
    script: Path,
) -> list[str]:
    """The ``sbatch`` that submits ``script`` as batch job ``job_name`` of run ``run_id`` on ``nodes`` nodes:
    output to ``<output>.out|.err`` (appended across requeues), run in ``run_dir``, then the job's common
    arguments, ``sbatch_args``, ``extra`` and ``--exclude`` from ``opts``."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--comment={run_comment(run_id)}",
        "-N",
        str(nodes),
        f"--ntasks-per-node={ntasks_per_node}",
        "--open-mode=append",
        f"--output={output}.out",
        f"--error={output}.err",
        f"--chdir={run_dir}",
        *job_args(opts, slurm),
        *opts.sbatch_args,
        *extra,
        str(script),
    ]
    if opts.exclude:
        argv[-1:-1] = [f"--exclude={','.join(opts.exclude)}"]
    return argv


def batch_job_node(slurm: SlurmCommands, job_ids: Iterable[int], node: str) -> str:
    """Where workload node ``node`` (``nodeK``) runs in the newest running batch job of ``job_ids``: the K-th node
    of its allocation. Raises TargetNotFound when no such job runs there."""
    m = re.fullmatch(r"node(\d+)", node)
    for job_id in sorted(job_ids, reverse=True):
        info = slurm.job_info(job_id)
        if info is not None and info.state is JobState.RUNNING and m and int(m.group(1)) < len(info.nodes):
            return info.nodes[int(m.group(1))]
    raise TargetNotFound(node, "no job of this run runs there", message=f"no job of this run runs on {node}")
