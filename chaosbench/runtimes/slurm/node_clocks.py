"""The clocks of the Slurm nodes a run uses: each measured once against the harness's
(:mod:`chaosbench.timeline.clocks`, through ``srun`` stdin/stdout) before its first process starts, written as a
``clock_offset`` event, and used to put a node's clock readings (a signal's moment) on the harness's clock."""

from __future__ import annotations

import threading
from collections.abc import Callable

from chaosbench.runtimes.base import RunInfo
from chaosbench.runtimes.slurm.commands import SlurmCommands, run_comment
from chaosbench.runtimes.slurm.options import SlurmOptions, job_args, node_python
from chaosbench.timeline import clocks


class NodeClocks:
    """The measured clock offsets of run ``run``'s Slurm nodes (options ``opts``; the probes run through the
    commands ``slurm()`` answers with, named ``<job_prefix>.clock``)."""

    def __init__(
        self, run: RunInfo, opts: SlurmOptions, slurm: Callable[[], SlurmCommands], job_prefix: str
    ) -> None:
        self.run, self.opts, self._slurm, self.job_prefix = run, opts, slurm, job_prefix
        self._lock = threading.Lock()
        self._clocks: dict[str, clocks.ClockOffset | None] = {}  # Slurm node -> its measured clock

    def measure(self, slurm_node: str, node: str | None = None, job_id: int | None = None) -> None:
        """Measure a Slurm node's clock offset once per run and write a ``clock_offset`` event (on failure the
        event carries the error instead of an offset). The probe runs as its own one-task job, or, with
        ``job_id``, as an extra step of that running job (a batch job's nodes are only free to it)."""
        with self._lock:
            if slurm_node in self._clocks:
                return
            self._clocks[slurm_node] = None
        slurm = self._slurm()
        where = (
            [f"--jobid={job_id}", "--overlap"]
            if job_id is not None
            else [
                *job_args(self.opts, slurm),
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
            node_python(self.opts),
            "-u",
            "-c",
            clocks.ECHO_PROGRAM,
        ]
        try:
            off = clocks.measure(
                argv, slurm_node, self.opts.clock_samples, self.opts.command_timeout_s, slurm.env
            )
        except ValueError as exc:
            self.run.timeline.emit("clock_offset", node=node, slurm_node=slurm_node, error=str(exc))
            return
        with self._lock:
            self._clocks[slurm_node] = off
        fields = off.event_fields()
        fields.update(node=node, slurm_node=slurm_node)
        self.run.timeline.emit("clock_offset", **fields)

    def offset_ns(self, slurm_node: str) -> int | None:
        """The measured offset of a Slurm node's clock (node - harness), None when not measured."""
        with self._lock:
            off = self._clocks.get(slurm_node)
        return off.offset_ns if off is not None else None
