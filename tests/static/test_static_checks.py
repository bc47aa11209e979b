"""The static checks of the test run: ruff (its lint rules and ``ruff format --check``), mypy, the generated
reference pages up to date and the docs site's strict build, each its own test (tox used to run them one after another once pytest had ended, on one core while
the other idled; as tests they run beside the integration tests). ``tox -e lint``, ``tox -e type`` and
``tox -e docs`` still run them alone.

A tool that is not installed (ruff and mypy come with the ``dev`` extra, mkdocs with ``docs``) skips its check,
unless ``CHAOSBENCH_REQUIRE`` contains ``static`` (then it fails)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import require

ROOT = Path(__file__).resolve().parents[2]

CHECKS = {
    "ruff": ("ruff", [sys.executable, "-m", "ruff", "check", "."]),
    "ruff-format": ("ruff", [sys.executable, "-m", "ruff", "format", "--check", "."]),
    "mypy": ("mypy", [sys.executable, "-m", "mypy"]),
    "docgen": ("chaosbench", [sys.executable, "-m", "chaosbench.docgen", "--check"]),
    "mkdocs": ("mkdocs", [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", "{site}"]),
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_static_check_passes(check: str, tmp_path: Path) -> None:
    module, argv = CHECKS[check]
    require("static", None if importlib.util.find_spec(module) else f"{module} is not installed")
    argv = [a.replace("{site}", str(tmp_path / "site")) for a in argv]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (
        f"{' '.join(argv[2:])} exited {res.returncode}:\n{res.stdout[-4000:]}{res.stderr[-4000:]}"
    )
