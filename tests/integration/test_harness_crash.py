"""The harness SIGKILLed again and again at chosen moments of a suite (before its first step, during a fault,
with a rank's cgroup in place, with the FUSE checkpoint mount up, with docker nodes up and a network fault's
userspace delayer running, with a run's Slurm jobs allocated, with a Slurm node set DOWN by a fault, while the
report is written): after each kill `chaosbench cleanup` leaves no process, container, network, mount, cgroup,
iptables rule, qdisc, output handover directory or Slurm job of chaosbench, no Slurm node the suite set DOWN or
DRAIN out of service, no finished run's result is lost, and `chaosbench run --resume` goes on; the last one
completes the suite with every run once.

Thirteen kills over three suites (six on the local runtime, four on docker, three on Slurm); the moments are
drawn from a seeded random generator (a delay after the moment's condition holds), the conditions are what makes
each kill land where it is meant to (the test fails when the harness ended before it could be killed there).
The Slurm test takes about 2 minutes (73-113 s measured) on the local cluster (scripts/slurm-local up) of a
loaded 2-core machine."""

from __future__ import annotations

import csv
import hashlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from chaosbench.injectors.straggler import CPU_ROOT, cgroup_v1_cpu_available
from chaosbench.rundir import RunDir, SuiteDir
from chaosbench.runtimes.docker.output import CAPTURE_DIR_PREFIX
from tests.helpers import require, slurm_problem

pytestmark = pytest.mark.integration

LOCAL = """
name: crash-local
seed: 3
defaults:
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.03}
frameworks: {restart: {max_restarts: 2}}
faults:
  kill: {use: kill-rank, target: {rank: 1}, trigger: {at_step: 12}}
  slow: {use: straggler, target: {rank: 1}, trigger: {at_step: 8}, params: {duration_s: 3, method: %s}}
  stall: {use: stall-fs, trigger: {at_step: 5}, params: {write_delay_s: 0.05, fsync_delay_s: 0.05, duration_s: 3}}
matrix: {frameworks: [restart], faults: [kill, slow, stall]}
"""

DOCKER = """
name: crash-docker
seed: 4
defaults:
  runtime: docker
  deadline_s: 120
  workload: {name: ddp-mlp, ranks: 2, nodes: 2, steps: 40, checkpoint_every: 10, step_sleep_s: 0.02, pg_timeout_s: 5}
frameworks: {restart: {heartbeat_timeout_s: 15}}
faults:
  delay: {injector: net-delay, target: {node: node1}, trigger: {at_step: 10}, params: {delay_ms: 30, duration_s: 4}}
matrix: {frameworks: [restart], faults: [delay]}
"""

SLURM = """
name: crash-slurm
seed: 5
defaults:
  runtime: slurm
  deadline_s: 120
  workload: {name: ddp-mlp, ranks: 2, nodes: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.03, pg_timeout_s: 5}
frameworks: {restart: {heartbeat_timeout_s: 10}}
faults:
  kill: {injector: kill, target: {rank: 1}, trigger: {at_step: 12}}
  down: {injector: slurm-node-down, target: {node: node1}, trigger: {at_step: 12}}
matrix: {frameworks: [restart], faults: [kill, down]}
"""


@dataclass
class Kill:
    """Kill the harness ``delay`` (drawn from ``[0, spread_s]``) after ``when`` holds, once ``after_progress``
    (a run finished since this harness started) when asked."""

    when: str  # start | fault | cgroup | mount | docker | slurm-job | node-down | report
    after_progress: bool = False
    spread_s: float = 0.3


class Suite:
    def __init__(self, tmp: Path, name: str, text: str, runs: int) -> None:
        self.file = tmp / f"{name}.yaml"
        self.file.write_text(text)
        self.out = tmp / "out"
        self.dir = self.out / name
        self.runs = runs
        self.kept: dict[Path, str] = {}  # finished runs: the digest of their result and metrics
        self.downed: set[str] = set()  # Slurm nodes seen set down by one of the suite's runs

    def harness(self, resume: bool, log: Path) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "chaosbench.cli", "run", str(self.file), "--out", str(self.out)]
        with log.open("ab") as f:
            return subprocess.Popen(
                argv + (["--resume"] if resume else []), stdout=f, stderr=subprocess.STDOUT
            )

    def finished(self) -> list[RunDir]:
        return [r for r in SuiteDir(self.dir).runs() if r.read_result() is not None]

    def unfinished(self) -> list[RunDir]:
        return [r for r in SuiteDir(self.dir).runs() if r.read_result() is None]

    def holds(self, when: str) -> bool:
        if when == "start":
            return self.dir.is_dir()
        if when == "report":
            return len(self.finished()) == self.runs
        live = self.unfinished()
        if when == "fault":
            return any(r.events.is_file() and '"kind":"fault_inject"' in r.events.read_text() for r in live)
        if when == "cgroup":
            return any((CPU_ROOT / "chaosbench").glob("crash-local-*"))
        if when == "mount":
            return str(self.out) in Path("/proc/self/mountinfo").read_text()
        if when == "docker":
            return any(o.startswith("container") for o in _docker_objects(self.out))
        if when == "slurm-job":
            return any(state == "RUNNING" for _, state in _slurm_jobs(self.dir.name).values())
        if when == "node-down":
            down = _slurm_nodes_down(self.dir.name)
            self.downed |= set(down)
            return bool(down)
        raise AssertionError(when)


def _digest(rd: RunDir) -> str:
    return hashlib.sha256(rd.result.read_bytes() + rd.metrics.read_bytes()).hexdigest()


def _docker_objects(out: Path) -> list[str]:
    from chaosbench.runtimes.docker import RUN_DIR_LABEL
    from chaosbench.runtimes.docker.image import connect

    client = connect()
    try:
        objs = [
            f"container {c.name}"
            for c in client.containers.list(all=True, filters={"label": RUN_DIR_LABEL}, ignore_removed=True)
            if c.labels.get(RUN_DIR_LABEL, "").startswith(str(out))
        ]
        return objs + [
            f"network {n.name}"
            for n in client.networks.list(filters={"label": RUN_DIR_LABEL})
            if (n.attrs.get("Labels") or {}).get(RUN_DIR_LABEL, "").startswith(str(out))
        ]
    finally:
        client.close()


def _slurm_jobs(suite: str) -> dict[str, tuple[str, str]]:
    """The Slurm jobs of the suite's runs the scheduler has not ended (commented with one of their run ids, which
    begin with the suite's name): job id -> (name, state)."""
    from chaosbench.runtimes.slurm.commands import run_comment

    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j|%T|%k"], capture_output=True, text=True, timeout=30
    ).stdout
    rows = [line.split("|", 3) for line in out.splitlines() if line.count("|") >= 3]
    return {
        jid: (name, state)
        for jid, name, state, comment in rows
        if comment.startswith(run_comment(suite + "-"))
    }


def _slurm_nodes_down(suite: str) -> dict[str, str]:
    """Slurm nodes whose reason says one of the suite's runs set them down or drained them: node -> state."""
    from chaosbench.runtimes.slurm import parse_kv
    from chaosbench.runtimes.slurm.node_loss import reason

    out = subprocess.run(
        ["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=30
    ).stdout
    nodes = [parse_kv(line) for line in out.splitlines()]
    return {
        kv["NodeName"]: kv.get("State", "")
        for kv in nodes
        if kv.get("Reason", "").startswith(reason(suite + "-"))
    }


def _slurm_leftovers(suite: Suite) -> list[str]:
    """The suite's Slurm jobs still with the scheduler, and nodes still down or drained by one of its runs. A job
    cancelled by cleanup may be completing for a moment (its steps being killed): given up to 20 s to end."""
    deadline = time.monotonic() + 20
    while (jobs := _slurm_jobs(suite.dir.name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    down = _slurm_nodes_down(suite.dir.name)
    suite.downed |= set(down)
    return [f"Slurm job {j} {name} {state}" for j, (name, state) in sorted(jobs.items())] + [
        f"Slurm node {n} {state}, set down by the suite" for n, state in sorted(down.items())
    ]


def _wait_in_service(nodes: set[str], timeout_s: float = 60.0) -> dict[str, str]:
    """Wait until every node in ``nodes`` takes jobs again (idle, mixed or allocated, responding); the states of
    those that do not by then. A node resumed after DOWN shows idle* until its slurmd registers again."""
    from chaosbench.runtimes.slurm import NodeState, node_state

    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, timeout=30
        ).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        bad = {
            n: states.get(n, "missing")
            for n in nodes
            if node_state(states.get(n, "UNKNOWN")) not in (NodeState.UP, NodeState.BUSY)
        }
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(1)


def _host_net_state() -> set[str]:
    """iptables rules of chaosbench and netem/tbf qdiscs on the host (a fault's rules live in the nodes'
    namespaces and go with them; anything here would have leaked)."""
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.splitlines()
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout.splitlines()
    return {f"iptables: {r}" for r in rules if "chaosbench" in r} | {
        f"qdisc: {q}" for q in qdiscs if q.split()[1:2] in (["netem"], ["tbf"])
    }


def _capture_dirs() -> set[str]:
    """The docker runtime's output handover directories on the host (a crashed run's would have leaked)."""
    return {f"capture directory {d}" for d in Path(tempfile.gettempdir()).glob(f"{CAPTURE_DIR_PREFIX}*")}


def leftovers(suite: Suite, procs: list[psutil.Process], docker: bool, slurm: bool = False) -> list[str]:
    """Everything of chaosbench the killed harness (and its runs) could have left."""
    out = []
    for p in procs:  # every descendant the harness had at the moment it was killed
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"process {p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    for p in psutil.process_iter(["pid", "cmdline"]):  # and anything else naming the results directory
        if str(suite.out) in " ".join(p.info["cmdline"] or []):
            out.append(f"process {p.info['pid']} {' '.join(p.info['cmdline'])[:120]}")
    out += [
        f"mount {line}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(suite.out) in line
    ]
    if (CPU_ROOT / "chaosbench").is_dir():
        out += [f"cgroup {g}" for g in (CPU_ROOT / "chaosbench").glob("crash-*")]
    if docker:
        out += _docker_objects(suite.out) + sorted(_capture_dirs())
    if slurm:
        out = (
            _slurm_leftovers(suite) + out
        )  # first: a job still completing is waited for, its processes with it
    return out + sorted(_host_net_state())


def crash_and_resume(
    tmp: Path,
    suite: Suite,
    plan: list[Kill],
    seed: int,
    docker: bool,
    slurm: bool = False,
    recovered: tuple[str, ...] = ("kill",),
    expected: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> None:
    """Kill the harness at each moment of ``plan``, clean up and check, resume; finish with ``--resume``. Faults in
    ``recovered`` end as ``recovered``, the others only slow the job (``outlasted``); or, with ``expected``, each
    (scenario, repeat) ends with the (outcome, fidelity) given (an uninterrupted run's)."""
    rng = random.Random(seed)
    log = tmp / f"{suite.dir.name}.log"
    net_before = _host_net_state() | _capture_dirs()  # what was there before is not this test's
    for i, kill in enumerate(plan):
        done_before = len(suite.finished())
        harness = suite.harness(resume=i > 0, log=log)
        try:
            deadline = time.monotonic() + 240
            while not (
                suite.holds(kill.when) and (not kill.after_progress or len(suite.finished()) > done_before)
            ):
                assert harness.poll() is None, (
                    f"kill {i} ({kill.when}): the harness ended first:\n{log.read_text()[-3000:]}"
                )
                assert time.monotonic() < deadline, f"kill {i}: {kill.when} never held"
                time.sleep(0.05)
            time.sleep(rng.uniform(0, kill.spread_s))
            procs = psutil.Process(harness.pid).children(recursive=True)
            assert harness.poll() is None, f"kill {i} ({kill.when}): the harness ended first"
            harness.send_signal(signal.SIGKILL)
            harness.wait(timeout=30)
        finally:
            if harness.poll() is None:
                harness.kill()
                harness.wait()
        down = _slurm_nodes_down(suite.dir.name) if slurm else {}  # left down by the killed harness
        suite.downed |= set(down)
        with log.open("a") as f:
            f.write(f"\n=== test: SIGKILL {i} ({kill.when}); chaosbench cleanup\n")
        clean = subprocess.run(
            [sys.executable, "-m", "chaosbench.cli", "cleanup", str(suite.out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        with log.open("a") as f:
            f.write(clean.stdout + clean.stderr + f"=== test: cleanup done; nodes it found down: {down}\n")
        assert clean.returncode == 0, clean.stderr
        for node in down:  # resumed by cleanup itself: nothing else runs that could have
            assert f"scontrol update nodename={node} state=RESUME" in clean.stdout, clean.stdout
        assert kill.when != "node-down" or down, f"kill {i}: no node was down any more when the harness died"
        time.sleep(0.5)  # processes signalled by cleanup: let them go
        left = [x for x in leftovers(suite, procs, docker, slurm) if x not in net_before]
        assert left == [], f"after kill {i} ({kill.when}): {left}\n{clean.stdout}"
        # no finished result lost: every run finished so far is still there, byte for byte
        for rd, digest in suite.kept.items():
            assert RunDir(rd).read_result() is not None and _digest(RunDir(rd)) == digest, (
                f"kill {i}: {rd} lost"
            )
        suite.kept.update({rd.path: _digest(rd) for rd in suite.finished()})
    final = subprocess.run(
        [sys.executable, "-m", "chaosbench.cli", "run", str(suite.file), "--out", str(suite.out), "--resume"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert final.returncode == 0, final.stdout + final.stderr[-3000:]
    assert final.stderr.count("skipped: finished earlier") == len(suite.kept), final.stderr
    for rd, digest in suite.kept.items():
        assert _digest(RunDir(rd)) == digest, f"{rd} was run again"
    with (suite.dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    # the table an uninterrupted suite ends with: every run once, each as it should end
    assert sorted((r["scenario"], r["repeat"]) for r in rows) == sorted(
        {(r["scenario"], r["repeat"]) for r in rows}
    )
    assert len(rows) == suite.runs
    if expected is not None:
        got = {(r["scenario"], r["repeat"]): (r["outcome"], r["fidelity"]) for r in rows}
        assert got == expected, sorted(set(got.items()) ^ set(expected.items()))
    for r in rows if expected is None else []:
        # a kill or a lost node is recovered from; a slowed rank, filesystem or network only slows the job
        want = (
            "completed" if r["control"] == "True" else "recovered" if r["fault"] in recovered else "outlasted"
        )
        assert r["outcome"] == want, r
        assert r["control"] == "True" or r["fidelity"] == "exact", r
    assert (suite.dir / "report.html").is_file()
    # the manifest written at the end of the resumed suite holds for every file of it
    verify = subprocess.run(
        [sys.executable, "-m", "chaosbench.cli", "verify", str(suite.dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0 and verify.stdout.startswith("verified:"), verify.stdout + verify.stderr
    assert [x for x in leftovers(suite, [], docker, slurm) if x not in net_before] == []
    if slurm:  # every node the suite set down takes jobs again
        assert suite.downed, "no kill landed while a node was down"
        assert _wait_in_service(suite.downed) == {}


def test_sigkilled_harness_local_runtime(tmp_path: Path) -> None:
    method = "cgroup" if cgroup_v1_cpu_available() else "duty-cycle"
    require("cgroup", None if method == "cgroup" else f"cgroup v1 cpu controller not writable at {CPU_ROOT}")
    suite = Suite(tmp_path, "crash-local", LOCAL % method, runs=4)
    plan = [
        Kill("start", spread_s=3.0),  # anywhere in the control's start
        Kill("fault", after_progress=True),  # the kill fault has fired: its restart under way
        Kill("cgroup" if method == "cgroup" else "fault", after_progress=True),  # rank 1 in its cgroup
        Kill("mount", after_progress=True, spread_s=1.0),  # the stall run's FUSE mount up
        Kill("fault"),  # the stall run again, its filesystem slowed
        Kill("report", spread_s=0.2),  # every run finished: the report being written
    ]
    crash_and_resume(tmp_path, suite, plan, seed=13, docker=False)


def test_sigkilled_harness_docker_runtime(tmp_path: Path) -> None:
    from docker_support import require_docker

    require_docker(tools=("nsenter", "tc", "iptables"))
    suite = Suite(tmp_path, "crash-docker", DOCKER, runs=2)
    plan = [
        Kill("docker", spread_s=2.0),  # the control's containers up
        Kill("fault", after_progress=True),  # the delay's NFQUEUE rule and its delayer in place
        Kill("fault", spread_s=2.0),  # again, later in the fault window
        Kill("report", spread_s=0.2),
    ]
    crash_and_resume(tmp_path, suite, plan, seed=14, docker=True)


def test_sigkilled_harness_slurm_runtime(tmp_path: Path) -> None:
    require(
        "slurm",
        None
        if (problem := slurm_problem()) is None
        else f"no cluster answers: {problem} (start one with scripts/slurm-local up)",
    )
    suite = Suite(tmp_path, "crash-slurm", SLURM, runs=3)
    plan = [
        Kill("slurm-job", spread_s=1.0),  # the control's jobs allocated and running
        Kill(
            "node-down", after_progress=True
        ),  # node1's Slurm node set DOWN by the fault, the restart under way
        Kill("report", spread_s=0.2),
    ]
    crash_and_resume(tmp_path, suite, plan, seed=15, docker=False, slurm=True, recovered=("kill", "down"))
