"""Runs a user's training command as a child, reports its pid and turns its log lines into events.

    python -m chaosbench.workloads.command_shim --patterns JSON -- CMD [ARGS...]

The child's stdout and stderr are merged and forwarded line by line to this process's stdout. Matching
lines become timeline events stamped when read. SIGTERM, SIGINT and SIGHUP are forwarded to the child. When
the child dies of a signal, the shim dies of the same signal, so a launcher above it (torchrun, the
harness) sees the same exit as without the shim.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys

from chaosbench.probe import Probe


def _num(v: str | None) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chaosbench.workloads.command_shim")
    ap.add_argument("--patterns", default="{}", help="JSON object: event kind -> regex")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")
    patterns = {k: re.compile(v) for k, v in json.loads(args.patterns).items()}
    probe = Probe.from_env()
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"chaosbench: cannot start {cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    probe.rank_start(pid=child.pid)

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)

    assert child.stdout is not None
    out = sys.stdout.buffer
    for raw in iter(child.stdout.readline, b""):
        out.write(raw)
        out.flush()
        line = raw.decode(errors="replace")
        for kind, rx in patterns.items():
            m = rx.search(line)
            if not m:
                continue
            g = m.groupdict()
            if kind == "step":
                probe.step(int(g["step"]), _num(g.get("loss")))
            elif kind == "train_end":
                probe.train_end(int(g.get("step") or 0), _num(g.get("loss")), g.get("digest") or "")
            else:
                data: dict[str, object] = {"step": int(g["step"]) if g.get("step") else None, "path": None}
                if kind == "ckpt_save_end":
                    data["complete"] = True  # the script said it saved
                probe.emit(kind, **data)
    rc = child.wait()
    probe.emit("rank_exit", pid=child.pid, returncode=rc)
    probe.close()
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
