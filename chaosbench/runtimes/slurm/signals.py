"""Signals to a rank on its Slurm node (``kill``, ``hang`` and the other signal injectors, and ``process_alive``).

The pid a rank reports lives on its node, so a tiny shell helper runs there as an extra step of one of this
run's jobs on that node (``srun --jobid=J --overlap -w NODE``, :meth:`SlurmCommands.helper_step
<chaosbench.runtimes.slurm.commands.SlurmCommands.helper_step>`): it checks with ``scontrol listpids`` that the
pid belongs to one of exactly those jobs, checks its start time against the one the rank reported, reads the
node's clock and signals it (see :mod:`chaosbench.runtimes.slurm.runtime`)."""

from __future__ import annotations

import contextlib
import subprocess

from chaosbench.errors import EngineCommandFailed, EngineError, ForeignTarget
from chaosbench.runtimes.slurm.commands import SlurmCommands

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


def run_signal_helper(
    slurm: SlurmCommands,
    snode: str,
    sig: str,
    pid: int,
    ticks: int | None,
    job_prefix: str,
    timeout_s: float,
) -> tuple[int, int | None]:
    """Run the signal helper on Slurm node ``snode``: send ``sig`` (a signal's name without ``SIG``, or "0": check
    only) to ``pid`` if it started at ``ticks`` (None: not checked). Returns (helper exit code: 0 sent, 3 no such
    process, 4 pid reused, 5 not in a job of this run; the node's clock in ns right before the signal, or None).
    The helper runs as a step (named ``<job_prefix>.signal``) of one of this run's jobs there; refused
    (ChaosbenchError) when no job of this run runs there (:meth:`SlurmCommands.our_jobs_on`), and raises
    ChaosbenchError when the helper gets no answer within ``timeout_s`` or fails otherwise."""
    jobs = slurm.our_jobs_on(snode, "signalling it", f"pid {pid}")
    args = [sig, str(pid), str(ticks) if ticks is not None else "-"]
    argv = slurm.helper_step(snode, jobs, _SIGNAL_HELPER, args, f"--job-name={job_prefix}.signal")
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=slurm.env,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise EngineError("slurm", f"signalling pid {pid} on {snode}: no answer") from None
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
        raise EngineCommandFailed(
            argv, rc, res.stderr.strip(), message=f"signalling pid {pid} on {snode} failed: {err}"
        )
    return rc, t_node


def refuse_unsent(rc: int, pid: int, snode: str) -> None:
    """Raise for a signal the helper did not send (its exit code ``rc``): ProcessLookupError when ``pid`` is
    gone (3), ChaosbenchError when the pid now belongs to another process (4) or is not in a job of this run
    (5). Nothing for 0 (sent)."""
    if rc == 3:
        raise ProcessLookupError(pid)
    if rc == 4:
        raise ForeignTarget(f"pid {pid} on {snode}", "now belongs to another process", "signalling it")
    if rc == 5:
        raise ForeignTarget(f"pid {pid} on {snode}", "is not in a job of this run", "signalling it")
