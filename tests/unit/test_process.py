"""runtimes/process.py on real short-lived processes: identity by pid and start ticks, trees, the teardown
escalation, waits that never reap; and the standard-library identity (procutil) that ranks record."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from chaosbench import procutil
from chaosbench.errors import ChaosbenchError
from chaosbench.runtimes import process
from chaosbench.runtimes.base import ProcessSpec, RunInfo
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.runtimes.process import ProcessTrees
from chaosbench.timeline import TimelineWriter, read_events
from chaosbench.waiting import wait_until

#: A root whose child and grandchild all ignore SIGTERM (an ignored signal stays ignored across fork and exec).
DEAF_TREE = "trap '' TERM; sh -c 'sleep 30 & wait' & wait"
#: A root with a child and a grandchild that die on SIGTERM.
PLAIN_TREE = "sh -c 'sleep 30 & wait' & wait"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts (:func:`_start`); whatever is left of them is killed at the end, by process
    group (each has its own session), orphans included."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=5)


def _start(started: list[subprocess.Popen[bytes]], script: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    started.append(p)
    return p


def _tree_of(pid: int, ticks: int | None, size: int) -> dict[int, psutil.Process]:
    """The tree of ``pid`` once it has ``size`` processes."""

    def grown() -> dict[int, psutil.Process] | None:
        procs = process.tree([(pid, ticks)])
        return procs if len(procs) >= size else None

    found = wait_until(grown, 5.0, interval_s=0.01)
    assert found, f"the tree of {pid} never grew to {size}"
    return found


def _whole_tree(p: subprocess.Popen[bytes], size: int = 3) -> dict[int, psutil.Process]:
    return _tree_of(p.pid, procutil.start_ticks(p.pid), size)


def test_identity_is_pid_and_start_ticks(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "sleep 30")
    ticks = procutil.start_ticks(p.pid)
    assert ticks is not None and ticks > 0
    proc = process.find(p.pid, ticks)
    assert proc is not None and proc.pid == p.pid
    assert process.alive(p.pid) and process.alive(p.pid, ticks) and procutil.alive(p.pid, ticks)
    # the same pid with another start time: another process, not this one
    assert process.find(p.pid, ticks + 1) is None
    assert not process.alive(p.pid, ticks + 1) and not procutil.alive(p.pid, ticks + 1)
    # a process that just started may be in any live state (disk-sleep while exec pages in, on a loaded machine)
    assert process.state(p.pid) not in (None, psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    p.send_signal(signal.SIGSTOP)
    assert wait_until(lambda: process.state(p.pid) == psutil.STATUS_STOPPED, 5.0, interval_s=0.01)
    p.kill()
    # exited but not reaped yet: a zombie is gone for every check here
    assert wait_until(lambda: process.state(p.pid) == psutil.STATUS_ZOMBIE, 5.0, interval_s=0.01)
    assert not process.running(proc) and not process.alive(p.pid, ticks) and not procutil.alive(p.pid, ticks)
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert (
        process.find(p.pid) is None and process.state(p.pid) is None and procutil.start_ticks(p.pid) is None
    )


def test_tree_and_descent(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, PLAIN_TREE)
    procs = _whole_tree(p)
    assert len(procs) == 3 and p.pid in procs
    # the grandchild is in the tree once forked, and is `sleep` only once it has exec'd (seen: still `sh`)
    grandchild = wait_until(
        lambda: next((q for q in procs.values() if q.name() == "sleep"), None), 5.0, interval_s=0.01
    )
    assert grandchild is not None
    assert process.descends_from(grandchild, {p.pid}) and process.descends_from(procs[p.pid], {p.pid})
    assert not process.descends_from(psutil.Process(os.getpid()), {p.pid})
    ticks = procutil.start_ticks(p.pid)
    assert ticks is not None and process.tree([(p.pid, ticks + 1)]) == {}


def test_terminate_escalates_to_sigkill_and_takes_children_and_grandchildren(
    spawn: list[subprocess.Popen[bytes]],
) -> None:
    p = _start(spawn, DEAF_TREE)
    procs = _whole_tree(p)
    trees = ProcessTrees()
    roots = [(p.pid, procutil.start_ticks(p.pid))]
    t0 = time.monotonic()
    trees.terminate(lambda: roots, grace_s=0.5)
    assert time.monotonic() - t0 >= 0.5  # they ignored SIGTERM: the whole grace, then SIGKILL
    assert wait_until(lambda: not any(process.running(q) for q in procs.values()), 5.0, interval_s=0.01)
    # the teardown never reaps: the root's Popen still gets its exit status
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert trees.alive(roots) == [] and set(trees.known) >= set(procs)
    trees.terminate(lambda: roots, grace_s=0.5)  # safe to call twice


def test_terminate_ends_at_once_when_sigterm_is_enough(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, PLAIN_TREE)
    procs = _whole_tree(p)
    p.send_signal(signal.SIGSTOP)  # a stopped process acts on SIGTERM too: it gets SIGCONT with it
    t0 = time.monotonic()
    ProcessTrees().terminate(lambda: [(p.pid, procutil.start_ticks(p.pid))], grace_s=10)
    assert time.monotonic() - t0 < 5
    assert not any(process.running(q) for q in procs.values())
    assert p.wait(timeout=5) == -signal.SIGTERM


def test_a_pid_with_another_start_time_is_never_signalled(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "sleep 30")
    ticks = procutil.start_ticks(p.pid)
    assert ticks is not None
    stale = [(p.pid, ticks - 1)]  # as if recorded for an earlier process that had the same pid
    trees = ProcessTrees()
    trees.add(*stale[0])
    trees.terminate(lambda: stale, grace_s=0.2)
    trees.kill_known()
    assert trees.alive(stale) == []
    time.sleep(0.1)
    assert p.poll() is None and process.alive(p.pid, ticks)


def test_signal_stamped_reads_the_clock_right_before_the_signal(
    spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _start(spawn, "sleep 30")
    proc = psutil.Process(p.pid)
    # the pid is pinned by a pidfd and checked before the clock is read: the clock read is the last thing done
    # before pidfd_send_signal. Only this thread's calls count: the exit poller's thread (one per harness, woken by
    # any process exit its kernel listener hears, here another test's) reads the same clock (CI: a 'clock' after
    # the 'signal').
    calls: list[str] = []
    me = threading.get_ident()

    def note(what: str) -> None:
        if threading.get_ident() == me:
            calls.append(what)

    real_now, real_send = process.now_ns, signal.pidfd_send_signal
    monkeypatch.setattr(process, "now_ns", lambda: note("clock") or real_now())
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig: note("signal") or real_send(fd, sig))
    monkeypatch.setattr(proc, "is_running", lambda: note("identity") or True)
    before = time.time_ns()
    t = process.signal_stamped(proc, signal.SIGKILL)
    assert calls == ["identity", "clock", "signal"]
    assert before <= t <= time.time_ns()
    assert p.wait(timeout=5) == -signal.SIGKILL
    # gone: the process is reaped, its pid no one's
    with pytest.raises(ProcessLookupError):
        process.signal_stamped(proc, signal.SIGKILL)


def test_signal_stamped_never_signals_a_pid_given_to_another_process(
    spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _start(spawn, "sleep 30")
    proc = psutil.Process(p.pid)
    monkeypatch.setattr(proc, "is_running", lambda: False)  # as psutil says of a pid reused since the lookup
    with pytest.raises(ProcessLookupError):
        process.signal_stamped(proc, signal.SIGKILL)
    time.sleep(0.1)
    assert p.poll() is None


def test_kill_known_takes_orphans_that_outlived_their_parent(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "sleep 30 & wait")
    procs = _whole_tree(p, size=2)
    trees = ProcessTrees()
    roots = [(p.pid, procutil.start_ticks(p.pid))]
    trees.scan(roots)
    orphan = next(q for q in procs.values() if q.pid != p.pid)
    p.kill()
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert process.running(orphan) and trees.alive([]) == [orphan.pid]  # its root is gone; it is still known
    trees.kill_known()
    assert wait_until(lambda: not process.running(orphan), 5.0, interval_s=0.01)


def test_wait_exit_returns_at_the_exit_without_reaping(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "sleep 0.3")
    proc = process.find(p.pid)
    assert proc is not None
    t0 = time.monotonic()
    process.wait_exit(proc)
    assert 0.2 < time.monotonic() - t0 < 5
    assert process.state(p.pid) == psutil.STATUS_ZOMBIE  # exited; reaping is its Popen's
    assert p.wait(timeout=5) == 0
    stop = threading.Event()
    stop.set()
    q = _start(spawn, "sleep 30")
    proc = process.find(q.pid)
    assert proc is not None
    t0 = time.monotonic()
    process.wait_exit(proc, stop)
    assert time.monotonic() - t0 < 1 and q.poll() is None


def test_local_signal_pid_checks_identity_and_ownership(tmp_path: Path) -> None:
    rt = LocalRuntime(RunInfo("run-1", tmp_path, TimelineWriter(tmp_path / "events.jsonl")))
    try:
        h = rt.start(
            ProcessSpec("p", ["sh", "-c", "sleep 30 & wait"], role="agent", node="node1", incarnation=2)
        )
        assert h.ticks == procutil.start_ticks(h.pid)
        assert h.ticks is not None
        with pytest.raises(ChaosbenchError, match="belongs to another process"):
            rt.signal_pid(h.pid, signal.SIGKILL, h.ticks + 1)
        with pytest.raises(ChaosbenchError, match="not started by this run"):
            rt.signal_pid(os.getpid(), 0)
        procs = _tree_of(h.pid, h.ticks, 2)
        child = next(pid for pid in procs if pid != h.pid)
        assert rt.signal_pid(child, signal.SIGSTOP, procutil.start_ticks(child)) is not None  # a descendant
        assert wait_until(lambda: process.state(child) == psutil.STATUS_STOPPED, 5.0, interval_s=0.01)
        assert rt.process_alive(child)
        rt.terminate([h], grace_s=2)
        assert h.exited.is_set() and h.returncode == -signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            rt.signal_pid(h.pid, signal.SIGKILL, h.ticks)
    finally:
        rt.cleanup(grace_s=1)
    assert rt.leftovers() == []
    events = read_events(tmp_path / "events.jsonl")
    start = next(e for e in events if e.kind == "proc_start")
    assert {k: start[k] for k in ("proc", "pid", "pid_ticks", "role", "node", "incarnation")} == {
        "proc": "p",
        "pid": h.pid,
        "pid_ticks": h.ticks,
        "role": "agent",
        "node": "node1",
        "incarnation": 2,
    }
    end = next(e for e in events if e.kind == "proc_exit")
    assert end["pid"] == h.pid and end["returncode"] == -signal.SIGTERM


def test_code_that_runs_in_ranks_and_users_containers_needs_no_psutil() -> None:
    modules = [
        "chaosbench.probe",
        "chaosbench.procutil",
        "chaosbench.launchers.command",
        "chaosbench.launchers.elastic",
        "chaosbench.launchers.nvrx",
        "chaosbench.workloads.skeleton",
        "chaosbench.injectors.stall_fs.server",
    ]
    code = f"import sys; import {', '.join(modules)}; sys.exit('psutil' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


#: A child that says on stdout the moment right before its ``_exit(int(argv[1]))``, after ``argv[2]`` seconds.
EXITER = (
    "import os, sys, time; time.sleep(float(sys.argv[2])); os.write(1, str(time.time_ns()).encode()); "
    "os._exit(int(sys.argv[1]))"
)


def _exiter(code: int, after_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", EXITER, str(code), str(after_s)], stdout=subprocess.PIPE)


def test_exit_poller_stamps_a_childs_exit_at_the_kernels_notification_and_reaps_it() -> None:
    children = [_exiter(code, after) for code, after in ((3, 0.3), (0, 0.1), (-signal.SIGKILL, 30))]
    watches = [process.EXITS.watch_child(c) for c in children]
    assert watches[2].wait(timeout=0.2) is None  # still running: nothing settled
    children[2].kill()
    statuses = [w.wait(timeout=10) for w in watches]
    returned_ns = time.time_ns()
    # the kernel's own stamp where the harness may listen to the proc connector (root on the host), else the
    # poller's wake-up to the pidfd
    stamp = "kernel" if process.EXITS.kernel_stamps else "pidfd"
    assert [(s.returncode, s.stamp) for s in statuses if s is not None] == [
        (3, stamp),
        (0, stamp),
        (-signal.SIGKILL, stamp),
    ]
    for child, status in zip(children[:2], statuses[:2], strict=True):
        assert child.stdout is not None and status is not None
        before_exit_ns = int(child.stdout.read())
        # after the child's last clock reading (its _exit came later), before the wait here returned
        assert before_exit_ns <= status.t_ns <= returned_ns
    # reaped through its Popen, which has the status, so a reused pid can never be waited for
    assert [c.returncode for c in children] == [3, 0, -signal.SIGKILL]
    for c in children:
        assert c.stdout is not None
        c.stdout.close()


def test_exit_poller_says_when_the_exit_was_only_seen_after_the_fact() -> None:
    child = _exiter(5, 0)
    assert wait_until(lambda: process.state(child.pid) == psutil.STATUS_ZOMBIE, 10, interval_s=0.01)
    status = process.EXITS.watch_child(child).wait(timeout=10)
    # exited before its watch began: the poller's wake-up is not the exit, so the stamp says `wait`
    assert status is not None and (status.returncode, status.stamp) == (5, "wait")
    assert child.returncode == 5
    assert child.stdout is not None
    child.stdout.close()


def test_exit_poller_watches_a_process_it_must_not_reap(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "sleep 0.2")
    ticks = procutil.start_ticks(p.pid)
    status = process.EXITS.watch_pid(p.pid, ticks).wait(timeout=10)
    stamp = "kernel" if process.EXITS.kernel_stamps else "pidfd"
    assert status is not None and (status.returncode, status.stamp) == (None, stamp)
    assert process.state(p.pid) == psutil.STATUS_ZOMBIE  # not reaped: its status is still its parent's
    assert p.wait(timeout=5) == 0
    # a pid that does not name that process any more: settled at once, stamped when found (`wait`)
    q = _start(spawn, "sleep 30")
    gone = process.EXITS.watch_pid(q.pid, (procutil.start_ticks(q.pid) or 0) + 1).wait(timeout=0)
    assert gone is not None and gone.stamp == "wait" and q.poll() is None


#: A process of five threads that one of them, not the main one, ends with ``_exit(0)`` after ``argv[1]`` s.
THREADED = """
import os, sys, threading, time
def last():
    time.sleep(float(sys.argv[1])); os.write(1, str(time.time_ns()).encode()); os._exit(0)
threading.Thread(target=last).start()
for _ in range(3):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
"""


def test_a_multithreaded_process_ended_by_another_thread_is_stamped_at_its_exit() -> None:
    # every thread's exit is a kernel event: the process's is the last of them, after the reading before _exit
    child = subprocess.Popen([sys.executable, "-c", THREADED, "0.3"], stdout=subprocess.PIPE)
    status = process.EXITS.watch_child(child).wait(timeout=10)
    returned_ns = time.time_ns()
    assert child.stdout is not None
    before_exit_ns = int(child.stdout.read())
    child.stdout.close()
    assert status is not None and status.returncode == 0
    assert before_exit_ns <= status.t_ns <= returned_ns


def test_proc_events_convert_the_kernels_clock_to_the_wall_clock() -> None:
    from chaosbench.runtimes.proc_events import monotonic_to_wall_ns

    before = time.time_ns()
    converted = monotonic_to_wall_ns(time.monotonic_ns())
    after = time.time_ns()
    assert before <= converted <= after


def test_free_port_is_below_the_kernels_ephemeral_range_and_free(tmp_path, monkeypatch) -> None:
    import socket

    from chaosbench.runtimes import local

    rt = LocalRuntime(RunInfo("run-1", tmp_path, TimelineWriter(tmp_path / "events.jsonl")))
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(local, "EPHEMERAL_RANGE_FILE", str(ranges))
    assert local.listen_port_range() == (20000, 32767)
    ports = {rt.free_port() for _ in range(20)}
    assert all(20000 <= p <= 32767 for p in ports) and len(ports) > 1
    port = ports.pop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # free, as it said
    ranges.write_text("1024 60999\n")  # no room below: above the range
    assert local.listen_port_range() == (61000, 65535)
    ranges.write_text("1024 65000\n")  # no room either side: the kernel's own pick
    assert local.listen_port_range() is None and rt.free_port() > 0


def test_free_port_never_gives_one_run_the_same_port_twice(tmp_path, monkeypatch) -> None:
    """A run asks for all its ports before any is bound: a port drawn again is skipped (CI: two serving replicas
    were given one port)."""
    from chaosbench.runtimes import local

    rt = LocalRuntime(RunInfo("run-1", tmp_path, TimelineWriter(tmp_path / "events.jsonl")))
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(local, "EPHEMERAL_RANGE_FILE", str(ranges))
    draws = iter([24001, 24001, 24001, 24002])

    class Drawn:
        def randint(self, lo: int, hi: int) -> int:
            return next(draws)

    monkeypatch.setattr(local.random, "SystemRandom", Drawn)
    monkeypatch.setattr(local, "bindable", lambda addr, port: True)
    assert [rt.free_port(), rt.free_port()] == [24001, 24002]
