"""``chaosbench init``: a starter suite and a CI job written into a user's own repository.

The suite uses only what ships with chaosbench (a built-in workload, the ``restart`` adapter, the fault library's
``kill-rank`` and ``torn-write``), so it runs wherever chaosbench is installed; the CI job runs it as the recovery
regression gate. Nothing is overwritten: an existing file is refused.
"""

from __future__ import annotations

from pathlib import Path

from chaosbench.errors import SpecError

STARTER_SUITE = """\
# A starter recovery suite (chaosbench init). Run it:
#   chaosbench run chaos/ci.yaml --dry-run        # validate it, print the plans
#   chaosbench run chaos/ci.yaml                  # run it: reports/ci/report.html; exit 3 on a missed SLO
#   pytest --chaos-suite chaos/ci.yaml            # every run as a pytest item
# `use: NAME` takes NAME.yaml from a faults/ folder beside this file or its parent, else the fault library shipped
# with chaosbench (`chaosbench faults chaos/ci.yaml` lists them and where each comes from).
name: ci
seed: 1
control: true
defaults:
  runtime: local
  deadline_s: 90
  workload: {name: ddp-mlp, ranks: 2, steps: 30, checkpoint_every: 10, step_sleep_s: 0.02, pg_timeout_s: 10}
frameworks:
  restart: {max_restarts: 3, heartbeat_timeout_s: 5}
faults:
  kill-rank1: {use: kill-rank, target: {rank: 1}, trigger: {at_step: 15}}
  torn-write: {use: torn-write, trigger: {on_event: {kind: ckpt_save_begin, step: 20}}}
slos:
  detected: true
  outcome: recovered
  time_to_resume_s: {max: 30}
matrix:
  frameworks: [restart]
  faults: [kill-rank1, torn-write]
  repeats: 2
"""

CI_JOB = """\
# The recovery regression gate (chaosbench init): runs chaos/ci.yaml on every push and pull request.
name: chaos
on: [push, pull_request]
jobs:
  recovery:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      - run: python -m pip install chaosbench   # or the wheel you built: python -m pip install chaosbench-*.whl
      - run: chaosbench run chaos/ci.yaml --junit reports/chaos.xml --summary reports/chaos.md
      - uses: actions/upload-artifact@v4
        if: always()
        with: {name: chaos-reports, path: reports/}
"""

#: Files ``chaosbench init`` writes, relative to the repository: path -> text.
STARTER_FILES = {"chaos/ci.yaml": STARTER_SUITE, ".github/workflows/chaos.yml": CI_JOB}


def write_starter(root: str | Path) -> list[Path]:
    """Write :data:`STARTER_FILES` under ``root``; returns their paths. Raises :class:`SpecError` (before writing
    anything) when one of them exists."""
    root = Path(root)
    paths = {root / rel: text for rel, text in STARTER_FILES.items()}
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise SpecError("already exists; chaosbench init overwrites nothing", file=existing[0])
    for p, text in paths.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return list(paths)
