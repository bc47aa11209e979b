"""A test-only framework whose detection delay is known, to calibrate time-to-detect.

``delayed-detect`` launches the ranks like ``none`` plus a watchdog process. The watchdog waits on the ranks
themselves (a pidfd per rank, polled together: the kernel wakes it when one has exited; the ranks are the
harness's children, not the watchdog's, so it cannot ``waitpid`` them); once one has died it sleeps ``delay_s``
and writes ``CALIBRATION DETECT`` with the moment it saw the death (``dead_ns``) and the moment right before its
``write(2)`` of the line (``printed_ns``), which becomes a ``detect`` event through the same log-pattern path real
adapters use; then a second line with the moment that write had returned (``written_ns``, read back from its log
by :func:`written_ns`); last, it writes the moment right before its own ``os._exit(0)`` to a file
(:func:`exit_ns`), against which the harness's ``proc_exit`` stamp of it is measured. Where the kernel has no
pidfds it falls back to reading the ranks' /proc entries every millisecond. On the docker runtime the ranks and
the watchdog share node0 (``nodes: 1``): it waits on the ranks' pids in that node's pid namespace.

The measured time-to-detect is therefore the kill's own latency (the signal delivered to the process gone: the
kernel tears down a large multi-threaded process, 1-25 ms on a loaded 2-core machine; up to ``dead_ns``), plus
``delay_s`` and the watchdog's oversleep (the calibrator's own error: ``printed_ns - dead_ns - delay_s``), plus the
line's write (the watchdog preempted inside it on a loaded machine: ``written_ns - printed_ns``, the calibrator's
too), plus the harness's own error: how much later than the write it stamped the line. With the kernel's stamp
of the write (:mod:`chaosbench.runtimes.capture`) the stamp lies between ``printed_ns`` and ``written_ns``; with
pipes it is the reader thread's wake-up. The calibration test and ``benchmarks/detect_calibration.py`` measure
it.

Register it with ``FRAMEWORKS.register("delayed-detect", DelayedDetectFramework)``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from chaosbench.frameworks.base import JobContext, JobResult, LaunchPlan, LogPattern, LogWatcher, RunControl
from chaosbench.frameworks.none import NoneFramework, NoneOptions
from chaosbench.runtimes.base import ProcessSpec

WATCHDOG = r"""
import os, select, sys, time
exit_fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
delay = float(sys.argv[2]); pids = [int(p) for p in sys.argv[3:]]
def dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
fds, gone = {}, []
try:
    for p in pids:
        try:
            fds[os.pidfd_open(p)] = p
        except ProcessLookupError:
            gone.append(p)
except (AttributeError, OSError):  # no pidfds here: poll /proc instead
    fds = None
if fds is None:
    while not gone:
        gone = [p for p in pids if dead(p)]
        if not gone:
            time.sleep(0.001)
elif not gone:
    waiter = select.poll()
    for fd in fds:
        waiter.register(fd, select.POLLIN)
    gone = [fds[fd] for fd, _ in waiter.poll()]  # readable: that process has exited (a zombie counts)
dead_ns = time.time_ns()
time.sleep(delay)
head = f"CALIBRATION DETECT pid={gone[0]} dead_ns={dead_ns} printed_ns="
printed_ns = time.time_ns()
os.write(1, f"{head}{printed_ns}\n".encode())  # one write(2), right after the stamp it carries
written_ns = time.time_ns()
os.write(1, f"CALIBRATION WRITTEN written_ns={written_ns}\n".encode())
exit_ns = time.time_ns()
os.write(exit_fd, str(exit_ns).encode())  # a file: this write wakes nobody who could preempt the exit
os._exit(0)
"""
_WRITTEN = re.compile(r"CALIBRATION WRITTEN written_ns=(\d+)")
#: Where the watchdog leaves its last stamp, taken right before its ``_exit`` (below the run directory).
EXIT_FILE = "logs/watchdog.exit"


def written_ns(run_dir: str | Path) -> int | None:
    """When the watchdog's write of its detection line had returned (from its log), or None."""
    try:
        m = _WRITTEN.search((Path(run_dir) / "logs" / "watchdog.out").read_text())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def exit_ns(run_dir: str | Path) -> int | None:
    """The watchdog's last clock reading, right before its ``os._exit(0)`` (one ``write(2)`` to a file between
    them), or None (it died before)."""
    try:
        return int((Path(run_dir) / EXIT_FILE).read_text() or "x")
    except (OSError, ValueError):
        return None


#: The root of cgroup v1's cpu hierarchy: its tasks may run real-time (the kernel's whole budget is its own).
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def realtime(pid: int, priority: int) -> None:
    """Put process ``pid`` under ``SCHED_FIFO`` at ``priority``. Where its cgroup v1 cpu group has no real-time
    runtime (docker's: ``cpu.rt_runtime_us`` 0, so the kernel refuses with EPERM), the process moves to the root
    cpu group first: its namespaces stay its container's, only its CPU accounting leaves it. Raises OSError
    when it still cannot (no root, no cgroup v1 cpu hierarchy)."""
    param = os.sched_param(priority)
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, param)
    except PermissionError:
        if not (CPU_CGROUP_ROOT / "tasks").exists():
            raise
        (CPU_CGROUP_ROOT / "tasks").write_text(str(pid))
        os.sched_setscheduler(pid, os.SCHED_FIFO, param)


class DelayedDetectOptions(NoneOptions):
    delay_s: float = Field(default=0.5, ge=0, description="known delay between a rank's death and detection")
    realtime_priority: int | None = Field(
        default=None,
        ge=1,
        le=99,
        description="run the watchdog under SCHED_FIFO at this priority (root), so that its own wake-up after "
        "the delay and its exit are not preempted by a loaded machine's other processes: the "
        "calibrator's own error then leaves the measurement, the harness's stays in it",
    )


class DelayedDetectFramework(NoneFramework[DelayedDetectOptions]):
    name: ClassVar[str] = "delayed-detect"

    def plan(self, job: JobContext) -> LaunchPlan:
        plan = super().plan(job)
        plan.patterns = [
            LogPattern(
                "detect",
                r"CALIBRATION DETECT pid=(?P<pid>\d+) dead_ns=(?P<dead_ns>\d+) printed_ns=(?P<printed_ns>\d+)",
                "watchdog",
            )
        ]
        return plan

    def supervise(self, job: JobContext, plan: LaunchPlan, control: RunControl) -> JobResult:
        o = self.options
        ranks = [control.runtime.start(s) for s in plan.processes]
        watcher = LogWatcher(self.label, plan.patterns, control.timeline)
        exit_file = Path(job.run_dir) / EXIT_FILE
        exit_file.parent.mkdir(parents=True, exist_ok=True)
        # the ranks' pids as the watchdog sees them: it runs on node0, beside them (a docker node's pid namespace)
        pids = [str(h.pid_on_node) for h in ranks]
        dog = control.runtime.start(
            ProcessSpec(
                "watchdog",
                [sys.executable, "-c", WATCHDOG, str(exit_file), str(o.delay_s), *pids],
                role="watchdog",
            ),
            on_line=watcher,
        )
        if o.realtime_priority is not None:
            # by its host pid, from the harness (root): a docker node's process gets it too; before any rank
            # can die (the watchdog waits on them), so its sleep and write already run at this priority.
            # A refusal (no CAP_SYS_NICE, a cgroup without real-time runtime) is this run's error.
            realtime(dog.pid, o.realtime_priority)
        while True:
            if control.stop_reason():
                return JobResult(control.stop_reason() or "deadline")
            if all(h.poll() == 0 for h in ranks):
                return JobResult("completed")
            if dog.poll() is not None:
                time.sleep(0.1)  # let the pipe reader stamp the line before teardown
                control.runtime.terminate(ranks, o.teardown_grace_s)
                return JobResult("failed", "a rank died")
            control.sleep(0.01)
