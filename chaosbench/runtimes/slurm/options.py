"""The ``slurm`` runtime's options (``defaults.runtime_options``), the Slurm client commands they configure, and
the arguments every job of a run is submitted with."""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaosbench.runtimes.capture import OUTPUT_CAPTURE_HELP, OutputCapture
from chaosbench.runtimes.slurm.commands import SlurmCommands


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


def commands_for(opts: SlurmOptions, prefix: str = "", run_id: str | None = None) -> SlurmCommands:
    """The Slurm client commands with the harness's environment (and ``slurm_conf`` as SLURM_CONF), the options'
    timeout and partition, and the jobs of ``prefix``/``run_id`` as this run's."""
    env = dict(os.environ)
    if opts.slurm_conf:
        env["SLURM_CONF"] = opts.slurm_conf
    return SlurmCommands(env, opts.command_timeout_s, opts.partition, prefix, run_id)


def node_python(opts: SlurmOptions) -> str:
    """The Python the nodes run (the ``python`` option, else the harness's own)."""
    return opts.python or sys.executable


def job_args(opts: SlurmOptions, slurm: SlurmCommands) -> list[str]:
    """Arguments every job of the run is submitted with: partition (``slurm``'s), account, time limit."""
    out = slurm.partition_args()
    if opts.account:
        out += ["-A", opts.account]
    if opts.time_limit:
        out += ["-t", opts.time_limit]
    return out


def node_argv(opts: SlurmOptions, argv: list[str]) -> list[str]:
    """``argv`` as the nodes run it: the harness's Python replaced by the nodes' (the ``python`` option)."""
    if opts.python:
        return [opts.python if a == sys.executable else a for a in argv]
    return list(argv)
