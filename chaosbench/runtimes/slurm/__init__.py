"""The ``slurm`` runtime: processes run as Slurm jobs on an existing cluster, the scale-out path.

- :mod:`~chaosbench.runtimes.slurm.runtime`: :class:`SlurmRuntime` (start, wait, signals, batch jobs, node
  loss, teardown);
- :mod:`~chaosbench.runtimes.slurm.options`: :class:`SlurmOptions` and the arguments every job gets from them;
- :mod:`~chaosbench.runtimes.slurm.nodes`: :class:`~chaosbench.runtimes.slurm.nodes.NodeMap`, the placement of
  workload nodes on Slurm nodes (replacing lost ones), the master's address and the run's ports;
- :mod:`~chaosbench.runtimes.slurm.jobs`: :class:`SlurmHandle` and the ``srun``/``sbatch`` command lines of the
  run's jobs, an ``srun``'s exit read as its process's;
- :mod:`~chaosbench.runtimes.slurm.signals`: the helper that signals a rank on its node;
- :mod:`~chaosbench.runtimes.slurm.node_clocks`: the nodes' clock offsets (``clock_offset``);
- :mod:`~chaosbench.runtimes.slurm.commands`: :class:`SlurmCommands`, the Slurm client commands (``scontrol``,
  ``sinfo``, ``squeue``, ``scancel``, ``sacct``) and what they answer;
- :mod:`~chaosbench.runtimes.slurm.states`: the one translation of Slurm's job and node states
  (:data:`SLURM_STATES`), :class:`JobInfo`;
- :mod:`~chaosbench.runtimes.slurm.node_loss`: losing a node (DOWN/DRAIN, the run's tasks killed) and
  resuming it (the ``node-kill`` fault);
- :mod:`~chaosbench.runtimes.slurm.cleanup`: the jobs a harness that died left behind and the nodes
  its runs had set DOWN/DRAIN (``chaosbench cleanup``).
"""

from __future__ import annotations

from chaosbench.runtimes.slurm.cleanup import cleanup_stale_jobs, resume_stale_nodes
from chaosbench.runtimes.slurm.commands import SlurmCommands, job_prefix
from chaosbench.runtimes.slurm.jobs import SlurmHandle
from chaosbench.runtimes.slurm.node_loss import SlurmNodeLossOptions
from chaosbench.runtimes.slurm.options import SlurmOptions
from chaosbench.runtimes.slurm.runtime import SlurmRuntime
from chaosbench.runtimes.slurm.states import (
    ACTIVE_JOB_STATES,
    FINAL_JOB_STATES,
    SLURM_STATES,
    USABLE_NODE_STATES,
    JobInfo,
    JobState,
    NodeState,
    job_state,
    node_state,
    parse_kv,
)

__all__ = [
    "ACTIVE_JOB_STATES",
    "FINAL_JOB_STATES",
    "SLURM_STATES",
    "USABLE_NODE_STATES",
    "JobInfo",
    "JobState",
    "NodeState",
    "SlurmCommands",
    "SlurmHandle",
    "SlurmNodeLossOptions",
    "SlurmOptions",
    "SlurmRuntime",
    "cleanup_stale_jobs",
    "job_prefix",
    "job_state",
    "node_state",
    "parse_kv",
    "resume_stale_nodes",
]
