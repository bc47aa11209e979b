"""chaosbench as a team installs it: from its wheel, into a fresh virtual environment, run from a folder of their
own (no checkout on the path) with `chaosbench run` and with `pytest --chaos-suite`; the suite's `use: kill-rank`
comes from the fault library shipped inside the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

SUITE = """\
name: wheel
seed: 5
defaults:
  deadline_s: 60
  workload: {name: ddp-mlp, ranks: 2, steps: 12, checkpoint_every: 4, step_sleep_s: 0.02, pg_timeout_s: 10}
frameworks:
  restart: {max_restarts: 2, heartbeat_timeout_s: 5}
faults:
  kill-rank1: {use: kill-rank, target: {rank: 1}, trigger: {at_step: 6}}
slos:
  outcome: recovered
matrix: {frameworks: [restart], faults: [kill-rank1], repeats: 1}
"""

#: What a build needs of the checkout (the rest, tests and results included, stays out of the copy).
SKIP = shutil.ignore_patterns(
    ".git",
    ".tox",
    ".venv",
    "build",
    "reports",
    "tests",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
)


def test_the_wheel_runs_a_users_suite_from_their_own_folder(tmp_path: Path) -> None:
    src, dist, venv, user = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "user"
    shutil.copytree(ROOT, src, symlinks=True, ignore=SKIP)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
    )
    wheel = next(dist.glob("chaosbench-*.whl"))
    # torch and the other dependencies come from the environment running these tests; chaosbench itself only from
    # the wheel. A venv made from inside a venv (tox's) is based on the base interpreter, whose site-packages
    # --system-site-packages would give (seen: a base Python without psutil, so `chaosbench run` failed to import
    # the local runtime): a .pth in the new venv puts this environment's site-packages after its own.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "tests-dependencies.pth").write_text(
        "\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))) + "\n"
    )
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed", str(wheel)],
        check=True,
        cwd=tmp_path,
    )
    (user / "chaos").mkdir(parents=True)
    (user / "chaos" / "ci.yaml").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=user, env=env, capture_output=True, text=True, timeout=300)

    where = run(
        str(py),
        "-c",
        "import chaosbench, chaosbench.specs as s; "
        "print(chaosbench.__file__); print(s.fault_library()['kill-rank'])",
    )
    module, library = where.stdout.splitlines()
    assert Path(module).is_relative_to(venv) and Path(library).is_relative_to(venv), where.stdout
    listed = run("chaosbench", "faults", "chaos/ci.yaml").stdout
    assert f"  kill-rank: {library} (shipped with chaosbench)" in listed.splitlines()

    cli = run("chaosbench", "run", "chaos/ci.yaml", "--out", "reports")
    assert cli.returncode == 0, cli.stderr[-3000:]
    rows = (user / "reports" / "wheel" / "results.csv").read_text().splitlines()
    assert len(rows) == 3  # header, the control, the kill
    result = json.loads(
        (user / "reports" / "wheel" / "restart__kill-rank1" / "0" / "metrics.json").read_text()
    )
    assert result["outcome"] == "recovered" and result["restart_count"] == 1

    plugin = run(
        str(py),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--chaos-suite",
        "chaos/ci.yaml",
        "--chaos-out",
        "pytest-reports",
        "-q",
    )
    assert plugin.returncode == 0, plugin.stdout[-3000:]
    assert "2 passed" in plugin.stdout
