"""Runs a user's training command as a child, reports its pid and turns its log lines into events.

    python -m chaosbench.launchers.command --patterns JSON [--subst JSON] [--env JSON] [--cwd DIR] \
        [--ready JSON] -- CMD [ARGS...]

Placeholders such as ``{ckpt_dir}`` or ``{rank}`` in the command, in every ``--env`` value and in ``--cwd`` are
substituted here, in the rank's own process, so that per-rank values (``{rank}``, ``{local_rank}``,
``{world_size}``, ``{node}``, ``{incarnation}``) are right under any launcher; ``--subst`` gives the run's values
(``{ckpt_dir}``, ``{run_dir}``, ``{work_dir}``, ``{seed}``, ``{project_dir}``, ``{suite_dir}``). ``{{`` and ``}}``
are literal braces. The child starts in ``--cwd`` (created if missing).

A serving replica (``--ready``, the ``serve-command`` workload) also has ``{port}`` and ``{host}``, the port and
address its framework gives it (``SERVE_PORT``, ``SERVE_HOST``); its ``rank_start`` carries them, and a thread
polls ``GET path`` on that port every ``interval_s`` (each request at most ``timeout_s``) until the answer's
status is ``expect_status``: then it writes ``replica_ready``, stamped when that answer came, the event the
built-in replicas write themselves once they listen.

Replica groups: under a framework whose job is replica groups of ``WORLD_SIZE`` ranks each, each group with its
own torch.distributed world (TorchFT: one torchrun per group, ``RANK`` group-local), the adapter sets
``CHAOSBENCH_REPLICA_GROUP`` (the group) and ``CHAOSBENCH_REPLICA_GROUPS`` (how many). The shim then reports
``rank = group * WORLD_SIZE + RANK`` of ``groups * WORLD_SIZE`` (the adapter's numbering, what targets name) and
the group, group rank and group size in ``rank_start``; ``{rank}`` and ``{world_size}`` are those numbers too.

The child's stdout and stderr are merged and forwarded as written to this process's stdout. Its lines (and
progress-bar redraws) become timeline events as :mod:`chaosbench.launchers.output_parser` reads them, stamped
when the child wrote them (the kernel's stamp of the write: :mod:`chaosbench.runtimes.capture`;
``CHAOSBENCH_OUTPUT_CAPTURE=pipe``: when read). SIGTERM, SIGINT and SIGHUP
are forwarded to the child. When the child dies of a signal, the shim dies of the same signal, so a launcher
above it (torchrun, the harness) sees the same exit as without the shim.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from chaosbench.launchers.output_parser import OutputParser, Parsed, earlier_step_base
from chaosbench.probe import ENV_EVENTS, Probe, incarnation_from_env
from chaosbench.runtimes.capture import ENV_OUTPUT_CAPTURE, Capture

#: Placeholders whose values differ per rank: resolved from the rank's environment.
RANK_PLACEHOLDERS = ("rank", "local_rank", "world_size", "node", "incarnation")
#: Placeholders whose values are the run's (given by the harness with ``--subst``).
RUN_PLACEHOLDERS = ("ckpt_dir", "run_dir", "work_dir", "seed", "project_dir", "suite_dir")
PLACEHOLDERS = RUN_PLACEHOLDERS + RANK_PLACEHOLDERS
#: Placeholders of a serving replica (``--ready``): the port and the address it must listen on, from its
#: framework (``SERVE_PORT``, ``SERVE_HOST``).
SERVE_PLACEHOLDERS = ("port", "host")
#: Set by a framework adapter whose ranks form replica groups with a torch.distributed world each (module docstring).
ENV_REPLICA_GROUP = "CHAOSBENCH_REPLICA_GROUP"
ENV_REPLICA_GROUPS = "CHAOSBENCH_REPLICA_GROUPS"


def placeholders(template: str) -> list[str]:
    """The placeholder names used in ``template`` (``{{``/``}}`` are literal braces). Raises ValueError for a
    malformed template, a positional ``{}`` or an attribute/index (``{a.b}``, ``{a[0]}``)."""
    names = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if not name or not name.isidentifier():
            raise ValueError(f"'{{{name}}}' is not a placeholder (write {{{{ and }}}} for literal braces)")
        names.append(name)
    return names


def substitute(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every placeholder replaced (KeyError for an unknown one)."""
    return template.format_map(dict(values))


def replica_layout(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """``(group, groups, group_rank, group_world_size)`` when the adapter said this rank is in a replica group
    (module docstring), else None. Raises ValueError for a value that is not an integer."""
    if ENV_REPLICA_GROUP not in env:
        return None
    return (
        int(env[ENV_REPLICA_GROUP]),
        int(env.get(ENV_REPLICA_GROUPS, "1")),
        int(env.get("RANK", "0")),
        int(env.get("WORLD_SIZE", "1")),
    )


def job_rank(env: Mapping[str, str]) -> tuple[int, int]:
    """``(rank, world_size)`` as chaosbench numbers them: torch.distributed's, or across replica groups."""
    layout = replica_layout(env)
    if layout is None:
        return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    group, groups, group_rank, group_world_size = layout
    return group * group_world_size + group_rank, groups * group_world_size


def rank_values(env: Mapping[str, str]) -> dict[str, str]:
    rank, world_size = job_rank(env)
    return {
        "rank": str(rank),
        "local_rank": env.get("LOCAL_RANK", "0"),
        "world_size": str(world_size),
        "node": env.get("CHAOSBENCH_NODE", "node0"),
        "incarnation": str(incarnation_from_env(dict(env))),
    }


def serve_values(env: Mapping[str, str]) -> dict[str, str]:
    """A serving replica's ``{port}`` and ``{host}`` (``SERVE_PORT``, ``SERVE_HOST``); ValueError without a port."""
    if not env.get("SERVE_PORT", "").isdigit():
        raise ValueError(
            "no port for {port}: SERVE_PORT is not set to a number (the framework gives each replica one)"
        )
    return {"port": env["SERVE_PORT"], "host": env.get("SERVE_HOST", "127.0.0.1")}


def poll_host(bind: str) -> str:
    """Where this process reaches a server that binds ``bind``: a wildcard address through loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


def health_status(host: str, port: int, path: str, timeout_s: float) -> int | str:
    """One ``GET path`` to ``host:port``: the answer's status, or why there was none (the exception's class and
    message). Straight to the address (http.client: no proxy from the environment)."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def wait_ready(
    child: subprocess.Popen[bytes],
    probe: Probe,
    ready: Mapping[str, object],
    host: str,
    port: int,
    started_ns: int,
) -> None:
    """Poll the replica's health path until it answers ``expect_status``, then say ``replica_ready`` (stamped
    when that answer came) and print it on stderr; stops when the child exits. A different answer is printed
    once per kind, so a replica that never gets ready says why."""
    path, expect = str(ready["path"]), int(str(ready["expect_status"]))
    interval_s, timeout_s = float(str(ready["interval_s"])), float(str(ready["timeout_s"]))
    target = poll_host(host)
    url = f"http://{f'[{target}]' if ':' in target else target}:{port}{path}"
    last: str | None = None
    while child.poll() is None:
        got = health_status(target, port, path, timeout_s)
        if got == expect:
            t_ns = time.time_ns()
            probe.emit("replica_ready", t_ns=t_ns, address=host, port=port, url=url)
            print(
                f"chaosbench: replica {probe.rank} ready: GET {url} answered {got} "
                f"{(t_ns - started_ns) / 1e9:.2f} s after its start",
                file=sys.stderr,
                flush=True,
            )
            return
        kind = f"answered {got}" if isinstance(got, int) else got.split(":")[0]
        if kind != last:
            print(
                f"chaosbench: replica {probe.rank} not ready yet: GET {url}: "
                f"{f'answered {got}, expecting {expect}' if isinstance(got, int) else got}",
                file=sys.stderr,
                flush=True,
            )
            last = kind
        time.sleep(interval_s)


def emit(probe: Probe, parsed: list[Parsed]) -> None:
    """Put what the parser read on the timeline, each event with the stamp of the write it came in."""
    for p in parsed:
        if p.kind == "step":
            extra = {k: v for k, v in p.fields.items() if k not in ("step", "loss", "every")}
            probe.step(
                int(p.fields["step"]), p.fields.get("loss"), t_ns=p.t_ns, every=p.fields.get("every"), **extra
            )
        else:
            probe.emit(p.kind, t_ns=p.t_ns, **p.fields)


def build_parser() -> argparse.ArgumentParser:
    """The shim's command line (module docstring)."""
    ap = argparse.ArgumentParser(prog="chaosbench.launchers.command")
    ap.add_argument("--patterns", default="{}", help="JSON object: event kind -> regex")
    ap.add_argument("--subst", default="{}", help="JSON object: the run's placeholder values")
    ap.add_argument(
        "--env", default="{}", help="JSON object: environment of the command (values are templates)"
    )
    ap.add_argument(
        "--cwd", default=None, help="working directory of the command (a template; created if missing)"
    )
    ap.add_argument(
        "--step-base",
        default="auto",
        choices=["auto", "0", "1"],
        help="how the script counts steps: from 0, from 1, or detected from the first step it prints",
    )
    ap.add_argument(
        "--step-every",
        type=int,
        default=None,
        help="a step pattern without a step number: the cadence of its lines, in steps",
    )
    ap.add_argument(
        "--ready",
        default=None,
        metavar="JSON",
        help="a serving replica: JSON {path, expect_status, interval_s, timeout_s}; {port} and {host} "
        "come from SERVE_PORT/SERVE_HOST, and replica_ready is said once GET path answers expect_status",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command (module docstring) and return its exit status: 2 for a bad placeholder, 127 when it
    cannot start; a child killed by a signal kills this process with the same signal."""
    ap = build_parser()
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")
    patterns = dict(json.loads(args.patterns))
    values = {**json.loads(args.subst), **rank_values(os.environ)}
    ready = json.loads(args.ready) if args.ready else None
    try:
        cmd, env, cwd, values = _resolve(args, cmd, values, ready is not None)
    except (KeyError, ValueError, IndexError) as exc:
        print(f"chaosbench: bad placeholder in the command: {exc}", file=sys.stderr, flush=True)
        return 2
    probe = Probe.from_env()
    layout = replica_layout(os.environ)
    probe.rank, probe.world_size = job_rank(os.environ)
    parser = _output_parser(args, patterns, probe, layout is not None)
    last_ns = time.time_ns()
    capture = Capture("pipe" if os.environ.get(ENV_OUTPUT_CAPTURE) == "pipe" else "socket")
    try:
        if cwd:
            os.makedirs(cwd, exist_ok=True)
        child = subprocess.Popen(
            cmd, stdout=capture.child_fd, stderr=capture.child_fd, stdin=subprocess.DEVNULL, env=env, cwd=cwd
        )
    except OSError as exc:
        capture.close()
        print(f"chaosbench: cannot start {cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    capture.spawned()
    poller = _announce(child, probe, layout, ready, values)
    _forward_signals(child)
    _pump(capture, probe, parser, last_ns)
    capture.close()
    rc = child.wait()
    if poller is not None:  # it stops once it sees the exit: at most one health request and one pause later
        poller.join()
    probe.emit("rank_exit", pid=child.pid, returncode=rc)
    probe.close()
    if rc < 0:
        _die_of(-rc)
    return rc


def _resolve(
    args: argparse.Namespace, cmd: list[str], values: Mapping[str, str], serving: bool
) -> tuple[list[str], dict[str, str], str | None, dict[str, str]]:
    """``(command, environment, working directory, placeholder values)`` of the child: the placeholders of
    ``cmd``, ``--env`` and ``--cwd`` substituted with ``values`` (the run's and this rank's) and, for a
    ``serving`` replica, its port and host (module docstring). Raises KeyError for an unknown placeholder and
    ValueError or IndexError for a malformed template or a missing port."""
    values = dict(values)
    if serving:
        values.update(serve_values(os.environ))
    cmd = [substitute(part, values) for part in cmd]
    env = dict(os.environ)
    env.update({k: substitute(v, values) for k, v in json.loads(args.env).items()})
    cwd = substitute(args.cwd, values) if args.cwd else None
    return cmd, env, cwd, values


def _output_parser(
    args: argparse.Namespace, patterns: dict[str, str], probe: Probe, per_step_commit: bool
) -> OutputParser:
    """The parser of the child's output: ``--step-base`` (``auto``: detected, or in a restarted incarnation
    the one an earlier incarnation detected), ``--step-every``; ``per_step_commit`` under replica groups."""
    step_base = None if args.step_base == "auto" else int(args.step_base)
    earlier = (
        earlier_step_base(os.environ.get(ENV_EVENTS)) if step_base is None and probe.incarnation else None
    )
    return OutputParser(
        patterns,
        step_base,
        args.step_every,
        earlier_base=earlier,
        resumed=probe.incarnation > 0,
        per_step_commit=per_step_commit,
    )


def _announce(
    child: subprocess.Popen[bytes],
    probe: Probe,
    layout: tuple[int, int, int, int] | None,
    ready: Mapping[str, object] | None,
    values: Mapping[str, str],
) -> threading.Thread | None:
    """Say ``rank_start`` for ``child`` (with its replica group from ``layout``, and for a serving replica,
    ``ready`` not None, its address and port from ``values``) and, for a serving replica, start the thread that
    says ``replica_ready`` (:func:`wait_ready`): returned to be joined, None otherwise."""
    extra: dict[str, object] = {}
    if layout is not None:
        extra.update(replica_group=layout[0], group_rank=layout[2], group_world_size=layout[3])
    if ready is None:
        probe.rank_start(pid=child.pid, **extra)
        return None
    host, port = values["host"], int(values["port"])
    probe.rank_start(pid=child.pid, address=host, port=port, **extra)
    poller = threading.Thread(
        target=wait_ready,
        args=(child, probe, ready, host, port, time.time_ns()),
        daemon=True,
        name="ready",
    )
    poller.start()
    return poller


def _forward_signals(child: subprocess.Popen[bytes]) -> None:
    """Forward SIGTERM, SIGINT and SIGHUP to ``child`` (one that has exited already is left alone)."""

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)


def _pump(capture: Capture, probe: Probe, parser: OutputParser, last_ns: int) -> None:
    """Forward the child's output to this process's stdout as written, and put what ``parser`` reads in it on
    the timeline, until the output ends (``last_ns``: the stamp to end the parser at when nothing came)."""
    out = sys.stdout.buffer
    for data, t_ns in capture.records():
        out.write(data)
        out.flush()
        emit(probe, parser.feed(data, t_ns))
        last_ns = t_ns
    emit(probe, parser.end(last_ns))


def _die_of(signum: int) -> None:
    """End this process with signal ``signum``, as the child did, so a launcher above sees the same exit
    (SIGKILL and SIGSTOP cannot be caught: no handler to reset)."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


if __name__ == "__main__":
    sys.exit(main())
