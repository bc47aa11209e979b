"""What a suite's faults need on this machine: each tool removed in turn (from PATH) or the module missing, the
dry-run names what to install, and a run of the fault fails with that reason while the suite goes on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from chaosbench.cli import main
from chaosbench.injectors.network import TOOLS, NetDelayInjector, PartitionInjector
from chaosbench.injectors.stall_fs import StallFsInjector
from chaosbench.rundir import RunDir
from chaosbench.runner import Runner
from tests.conftest import make_suite
from tests.helpers import path_without

STALL = """
name: nofuse
control: false
defaults:
  deadline_s: 30
  workload: {name: ddp-mlp, ranks: 2, steps: 10, pg_timeout_s: 10}
frameworks: {restart: {}}
faults:
  slow: {injector: stall-fs, trigger: {at_step: 3}, params: {write_delay_s: 1}}
  slow2: {injector: stall-fs, trigger: {at_step: 4}, params: {write_delay_s: 1}}
matrix: {frameworks: [restart], faults: [slow, slow2]}
"""
NO_FUSERMOUNT = "stall-fs needs FUSE: fusermount3 is not installed (apt-get install fuse3)"


@pytest.mark.parametrize("tool", TOOLS)
def test_network_faults_name_each_missing_tool(tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path_without(tool, tmp_path, monkeypatch)
    want = f"network faults need {tool} on the host (apt-get install iproute2 iptables util-linux)"
    assert NetDelayInjector.missing_engine() == PartitionInjector.missing_engine() == want


def test_stall_fs_names_its_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("FUSE is not set up here")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mfusepy" else real(name, *a))
    assert StallFsInjector.missing_engine() == (
        "stall-fs needs FUSE: the Python package mfusepy is not installed (pip install mfusepy)")


def test_without_fusermount3_the_dry_run_names_the_package_and_the_runs_fail_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse here")
    suite_file = tmp_path / "s.yaml"
    suite_file.write_text(STALL)
    assert main(["run", str(suite_file), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert json.loads(capsys.readouterr().out)["missing_engines"] == {}  # FUSE is here: nothing missing
    path_without("fusermount3", tmp_path, monkeypatch)
    assert main(["run", str(suite_file), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["missing_engines"] == {"fault 'slow'": NO_FUSERMOUNT, "fault 'slow2'": NO_FUSERMOUNT}
    assert f"warning: fault 'slow': {NO_FUSERMOUNT}; its runs will fail here" in captured.err.splitlines()
    records = Runner(make_suite(STALL), tmp_path / "out").run()  # no rank starts: the mount comes first
    assert [(r.scenario.id, r.result.status, r.result.reason) for r in records] == [
        ("restart/slow", "error", NO_FUSERMOUNT), ("restart/slow2", "error", NO_FUSERMOUNT)]
    assert all(json.loads(RunDir(r.run_dir).result.read_text())["reason"] == NO_FUSERMOUNT for r in records)


def _module_missing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))


@pytest.mark.parametrize("tool", ["sbatch", "srun", "squeue", "scontrol"])
def test_the_slurm_runtime_names_each_missing_client_command(tool: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from chaosbench.runtimes.slurm.runtime import SlurmRuntime

    path_without(tool, tmp_path, monkeypatch)
    assert SlurmRuntime.missing_engine() == (f"the slurm runtime needs the Slurm client commands ({tool} not found; "
                                             "apt-get install slurm-client, or scripts/slurm-local up)")  # fmt: skip


def test_the_docker_runtime_names_its_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.runtimes.docker import DockerRuntime

    _module_missing("docker", monkeypatch)
    assert DockerRuntime.missing_engine() == "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'"


@pytest.mark.parametrize("package", ["locust", "uvicorn", "starlette"])
def test_the_balancer_names_each_missing_serve_package(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.frameworks.balancer import BalancerFramework
    from chaosbench.runtimes.local import LocalRuntime

    _module_missing(package, monkeypatch)
    options = BalancerFramework.Options()
    assert BalancerFramework.missing_engine(options, LocalRuntime) == (
        f"balancer needs {package}: pip install 'chaosbench[serve]'")


def test_without_haproxy_the_dry_run_of_the_serving_suite_names_it_and_still_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.conftest import ROOT

    if any(importlib.util.find_spec(p) is None for p in ("locust", "uvicorn", "starlette")):
        pytest.skip("the serve extra is not installed here")
    path_without("haproxy", tmp_path, monkeypatch)
    assert main(["run", str(ROOT / "suites" / "serving.yaml"), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads(capsys.readouterr().out)
    why = "balancer needs haproxy: 'haproxy' not found (apt-get install -y haproxy)"
    assert set(doc["missing_engines"].values()) == {why}
    assert {r["plan"] for r in doc["runs"]} == {why}  # each run's plan: the reason it cannot be made here
