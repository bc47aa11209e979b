"""What a ``net-delay`` does to a bulk TCP exchange between two docker nodes, per congestion control: the round
times of a 600 KB request and 600 KB reply (about a ddp-mlp step's gradients) before, during and after a delay on
node1's egress, with the nodes' ``net.ipv4.tcp_congestion_control`` set to each one named. By hand, with dockerd
up (scripts/docker-up); about 15 s per run:

    python benchmarks/net_delay_tcp.py [--delay-ms 50] [--repeats 4] [--cc bbr reno]

The delay is chaosbench's own injector (netem where the kernel has it, else the NFQUEUE delayer). A node's
network namespace may only choose a congestion control that the host's
``net.ipv4.tcp_allowed_congestion_control`` lists (the kernel refuses the rest with EPERM); the script says so and
skips it. Prints, per run, every round that took 20 ms or more (undelayed rounds take 1-2 ms) and, per
congestion control, the median and the slowest round while the delay was in force.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup  # noqa: E402
from chaosbench.injectors.network import NetDelayInjector, nsexec  # noqa: E402
from chaosbench.runtimes.base import ProcessSpec, RunInfo  # noqa: E402
from chaosbench.runtimes.docker import DockerRuntime  # noqa: E402
from chaosbench.timeline import TimelineWriter  # noqa: E402

N = 600_000
SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 7008)); s.listen()
print("listening", flush=True)
c, _ = s.accept()
while True:
    got = 0
    while got < {N}:
        d = c.recv(1 << 20)
        if not d:
            raise SystemExit
        got += len(d)
    c.sendall(b"y" * {N})
"""
CLIENT = f"""
import socket, sys, time
c = socket.create_connection(("node0", 7008))
t0 = time.monotonic()
while time.monotonic() - t0 < float(sys.argv[1]):
    t = time.monotonic()
    c.sendall(b"x" * {N})
    got = 0
    while got < {N}:
        got += len(c.recv(1 << 20))
    print(f"{{time.monotonic_ns()}} {{(time.monotonic() - t) * 1000:.1f}}", flush=True)
"""


def wait_for(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_text()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path.name}: no '{text}' after {timeout_s} s")
        time.sleep(0.05)


def one_run(cc: str, delay_ms: float, workdir: Path) -> list[tuple[str, float]] | str:
    """(phase, round ms) of every round of one exchange; a string saying why when the run could not be made."""
    timeline = TimelineWriter(workdir / "events.jsonl")
    rt = DockerRuntime(RunInfo("netdelay-tcp-" + os.urandom(4).hex(), workdir, timeline))
    try:
        rt.provision(2)
        for node in ("node0", "node1"):
            res = nsexec(rt, node, ["sysctl", "-w", f"net.ipv4.tcp_congestion_control={cc}"], check=False)
            if res.returncode != 0:
                return f"{node}: {res.stderr.strip()}"
        rt.start(ProcessSpec("server", [sys.executable, "-c", SERVER], node="node0"))
        wait_for(workdir / "logs" / "server.out", "listening", 30)
        client = rt.start(ProcessSpec("client", [sys.executable, "-c", CLIENT, "9"], node="node1"))
        time.sleep(2)
        setup = RunSetup(
            run_id=rt.run.run_id,
            run_dir=workdir,
            ckpt_dir=workdir / "checkpoints",
            runtime=rt,
            timeline=timeline,
            rng=random.Random(1),
            ranks=2,
            nodes=2,
        )
        delay = NetDelayInjector("delay", NetDelayInjector.Params(delay_ms=delay_ms, jitter_ms=0))
        delay.prepare(setup)
        target = ResolvedTarget(rank=1, pid=None, pid_ticks=None, node="node1", incarnation=0)
        ctx = FaultContext(rt, timeline, [target], random.Random(1), setup, index=1)
        delay.inject(ctx)
        effect_ns = time.monotonic_ns()  # the rule is in place once inject returns
        time.sleep(4)
        began_ns = time.monotonic_ns()
        delay.revert(ctx)
        client.exited.wait(30)
        out = workdir / "logs" / "client.out"
        wait_for(out, "\n", 10)
        rounds = []
        for line in out.read_text().splitlines():
            t_ns, ms = line.split()
            ended, took = int(t_ns), float(ms)
            started = ended - int(took * 1e6)
            phase = (
                "before"
                if ended < effect_ns
                else "during"
                if started >= effect_ns and ended < began_ns
                else "edge"
            )
            rounds.append((phase, took))
        return rounds
    finally:
        rt.cleanup()
        timeline.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay-ms", type=float, default=50.0, help="the delay on node1's egress (ms)")
    p.add_argument("--repeats", type=int, default=4, help="runs per congestion control")
    p.add_argument("--cc", nargs="+", default=["bbr", "reno"], help="congestion controls to try")
    args = p.parse_args()
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    print(
        f"host congestion control: {Path('/proc/sys/net/ipv4/tcp_congestion_control').read_text().strip()}; "
        f"allowed in a node's namespace: {' '.join(allowed)}; delay {args.delay_ms} ms on node1's egress"
    )
    for cc in args.cc:
        during: list[float] = []
        for i in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="netdelay-tcp-") as tmp:
                rounds = one_run(cc, args.delay_ms, Path(tmp))
            if isinstance(rounds, str):
                print(f"{cc}: not measured: {rounds}")
                break
            these = [ms for phase, ms in rounds if phase == "during"]
            during += these
            slow = " ".join(f"{ms:.0f}" for phase, ms in rounds if ms >= 20)
            print(f"{cc} run {i + 1}: {len(these)} rounds during the delay; rounds of 20 ms or more: {slow}")
        if during:
            print(
                f"{cc}: during the delay, median round {statistics.median(during):.0f} ms, slowest "
                f"{max(during):.0f} ms ({len(during)} rounds)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
