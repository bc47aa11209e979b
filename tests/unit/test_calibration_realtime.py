"""The calibration watchdog's real-time priority (chaosbench.testing.calibration.realtime): the calibrator's own
scheduling taken out of benchmarks/detect_calibration.py's figures. Needs root; the fallback needs cgroup v1's cpu
hierarchy with real-time group scheduling (a new group has no real-time runtime, as docker's has none)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from chaosbench.testing.calibration import CPU_CGROUP_ROOT, realtime

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setting SCHED_FIFO needs root")


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "30"])
    yield p
    p.kill()
    p.wait()


def test_realtime_sets_sched_fifo(sleeper) -> None:
    realtime(sleeper.pid, 7)
    assert os.sched_getscheduler(sleeper.pid) == os.SCHED_FIFO
    assert os.sched_getparam(sleeper.pid).sched_priority == 7


def test_a_cpu_group_without_realtime_runtime_is_left_for_the_root_group(sleeper) -> None:
    if not (CPU_CGROUP_ROOT / "cpu.rt_runtime_us").exists():
        pytest.skip("no cgroup v1 cpu hierarchy with real-time group scheduling")
    group = CPU_CGROUP_ROOT / f"chaosbench-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        assert (group / "cpu.rt_runtime_us").read_text().strip() == "0"
        (group / "tasks").write_text(str(sleeper.pid))
        with pytest.raises(PermissionError):  # what the kernel says inside such a group (docker's)
            os.sched_setscheduler(sleeper.pid, os.SCHED_FIFO, os.sched_param(7))
        realtime(sleeper.pid, 7)
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_FIFO
        assert str(sleeper.pid) in (CPU_CGROUP_ROOT / "tasks").read_text().split()
    finally:
        for pid in (group / "tasks").read_text().split():  # the group must be empty to go: one pid a write
            (CPU_CGROUP_ROOT / "tasks").write_text(pid)
        group.rmdir()
