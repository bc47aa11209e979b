"""The nvrx adapter's helper processes:

    python -m chaosbench.launchers.nvrx launcher <ft_launcher arguments>
    python -m chaosbench.launchers.nvrx bridge [--poll-s S] -- <rank argv>

``launcher``: NVIDIA Resiliency Extension's ft_launcher, unchanged, with incarnations numbered by rendezvous round
(see :mod:`chaosbench.launchers.elastic`). ``bridge``: runs one rank as its child and feeds the rank monitor
(``RankMonitorClient``) from the rank's own probe events: every ``step`` is a heartbeat and closes/reopens the
``step`` section, ``ckpt_save_begin``/``ckpt_save_end`` bracket a ``checkpoint`` section, ``train_end`` ends the
monitoring. See :mod:`chaosbench.frameworks.nvrx` for why.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from chaosbench.launchers.elastic import install_round_incarnation

#: The sections the bridge opens (the adapter always declares them: ft_launcher refuses unknown ones).
BRIDGE_SECTIONS = ("step", "checkpoint")


# ---------------------------------------------------------------------------------------------------------------
# The launcher: python -m chaosbench.launchers.nvrx launcher <ft_launcher arguments>


def launcher_main(args: list[str]) -> int:
    """ft_launcher with incarnations numbered by rendezvous round; ft_launcher itself runs unchanged."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    # ft_launcher 0.4 (any-failed policy) counts restarts per agent and does not count a restart for a membership
    # change (a peer node restarted its group): without this, after one rank was killed on node1 the new group ran
    # as incarnation 1 on node1 and as incarnation 0 again on node0. 0.7 sets TORCHELASTIC_RESTART_COUNT to the
    # rendezvous round itself, and its barrier rendezvous has no torch round state: this changes nothing there.
    install_round_incarnation(getattr(launcher, "LocalElasticAgent", None))
    launcher.main(args)  # exits (sys.exit) with ft_launcher's own code
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The bridge: python -m chaosbench.launchers.nvrx bridge [--poll-s S] -- <rank argv>

_PR_SET_PDEATHSIG = 1
_SLOW_EXIT_S = 10.0  # the bridge says so on stderr when its rank has not exited this long after train_end


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _EventTail:
    """New lines of the run's events.jsonl that belong to one rank and incarnation."""

    def __init__(self, path: str, rank: int, incarnation: int, start: int = 0) -> None:
        self.path = path
        self.rank = rank
        self.incarnation = incarnation
        self._pos = start  # byte offset: only what is written from there on
        self._buf = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._pos += len(chunk)
        data = self._buf + chunk
        lines = data.split(b"\n")
        self._buf = lines.pop()
        out = []
        for raw in lines:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if (
                ev.get("src") == "rank"
                and ev.get("rank") == self.rank
                and ev.get("incarnation") == self.incarnation
            ):
                out.append(ev)
        return out


def bridge(argv: list[str], poll_s: float) -> int:
    """Run ``argv`` as this rank's child and feed the rank monitor from its events; exit as the child did."""
    from chaosbench.probe import Probe, incarnation_from_env
    from chaosbench.procutil import start_ticks

    events_path = os.environ.get("CHAOSBENCH_EVENTS")
    rank = int(os.environ.get("RANK", "0"))
    # only what this incarnation writes from now on
    tail_start = os.path.getsize(events_path) if events_path and os.path.exists(events_path) else 0
    tail = _EventTail(events_path, rank, incarnation_from_env(), tail_start) if events_path else None
    # this helper's identity, for a fault that targets the bridge role (its child dies with it)
    probe = Probe.from_env()
    probe.emit(
        "helper_start",
        proc=f"bridge.rank{rank}",
        pid=os.getpid(),
        pid_ticks=start_ticks(os.getpid()),
        role="bridge",
        node=probe.node,
    )
    probe.close()
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    # Imported after the child started: the import (torch included) overlaps the rank's own start-up.
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()

    def forward(sig: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    monitor = _Monitor(client)
    # Monitoring ends with training, as in nvrx's own Lightning callbacks (shutdown_workload_monitoring at the end
    # of fit): the process-group teardown and interpreter exit after train_end are not watched, so a slow exit
    # (once measured: one rank 30 s after its train_end) is no heartbeat timeout in a fault-free run.
    ended_at: float | None = None
    reported_slow_exit = False
    while child.poll() is None:
        time.sleep(poll_s)
        for ev in tail.read() if tail is not None and monitor.monitoring else []:
            if monitor.on_event(ev.get("kind")):
                ended_at = time.monotonic()
                break
        if ended_at is not None and not reported_slow_exit and time.monotonic() - ended_at > _SLOW_EXIT_S:
            reported_slow_exit = True
            print(
                f"chaosbench nvrx bridge: rank {rank} (pid {child.pid}) still running {_SLOW_EXIT_S:.0f} s after "
                "its train_end (no longer monitored)",
                file=sys.stderr,
                flush=True,
            )
    rc = child.returncode
    if rc == 0:
        monitor.stop()
        return 0
    return _exit_as(rc)


class _Monitor:
    """The rank monitor fed from the rank's events: a heartbeat per step, the ``step`` section open while a step
    computes and ``checkpoint`` while it saves; monitoring stops at ``train_end``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.open_section: str | None = None
        self.monitoring = True
        # Only sections the monitor's config names: any other one makes the client raise (TimeoutsCalcError:
        # Unknown section) after the monitor has already recorded it open, and kills the monitor's periodic check
        # (KeyError).
        self.known = set(getattr(client.cfg, "rank_section_timeouts", None) or {})
        skipped = [s for s in BRIDGE_SECTIONS if s not in self.known]
        if skipped:
            print(
                f"chaosbench nvrx bridge: the rank monitor's config names no section(s) {skipped}: not opening "
                "them (heartbeats are still sent)",
                file=sys.stderr,
                flush=True,
            )

    def switch(self, section: str | None) -> None:
        if section is not None and section not in self.known:
            section = None
        if section == self.open_section:
            return
        if self.open_section is not None:
            self.client.end_section(self.open_section)
        if section is not None:
            self.client.start_section(section)
        self.open_section = section

    def stop(self) -> None:
        if self.monitoring:
            self.switch(None)
            self.client.shutdown_workload_monitoring()
            self.monitoring = False

    def on_event(self, kind: str | None) -> bool:
        """One event of the rank's; True at its ``train_end`` (monitoring stopped)."""
        if kind == "step":
            self.switch(None)
            self.client.send_heartbeat()
            self.switch("step")
        elif kind == "ckpt_save_begin":
            self.switch("checkpoint")
        elif kind == "ckpt_save_end":
            self.switch("step")
        elif kind == "train_end":
            self.stop()
            return True
        return False


def _exit_as(rc: int) -> int:
    """Die the way the child died (a signal: the same one, so the launcher reports the same exit); else its
    exit code (1 for a signal that did not kill)."""
    if rc < 0:
        died_by = -rc
        if died_by not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(died_by, signal.SIG_DFL)
        os.kill(os.getpid(), died_by)
        time.sleep(5)  # a signal that does not kill (e.g. ignored by default): fall through
    return rc if rc > 0 else 1


def main(args: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["launcher"]:  # before argparse: ft_launcher's own options follow, as is
        return launcher_main(args[1:])
    p = argparse.ArgumentParser(prog="python -m chaosbench.launchers.nvrx")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("launcher", help="ft_launcher, worker incarnations numbered by rendezvous round")
    b = sub.add_parser("bridge", help="run a rank under ft_launcher, heartbeats from its probe events")
    b.add_argument("--poll-s", type=float, default=0.02)
    b.add_argument("argv", nargs=argparse.REMAINDER)
    ns = p.parse_args(args)
    argv = list(ns.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        p.error("bridge: no rank command after --")
    return bridge(argv, ns.poll_s)


if __name__ == "__main__":
    sys.exit(main())
