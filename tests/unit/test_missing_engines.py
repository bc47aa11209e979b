"""What a suite's faults need on this machine: each tool removed in turn (from PATH) or the module missing, the
dry-run names what to install, and a run of the fault fails with that reason while the suite goes on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from chaosbench.cli import main
from chaosbench.injectors.network import TOOLS, NetDelayInjector, PartitionInjector
from chaosbench.injectors.stall_fs import StallFsInjector
from chaosbench.rundir import RunDir, SuiteDir
from chaosbench.runner import Runner
from chaosbench.timeline import read_events
from tests.conftest import make_suite
from tests.helpers import local_nodes_runtime, module_missing, path_without

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
def test_network_faults_name_each_missing_tool(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path_without(tool, tmp_path, monkeypatch)
    want = f"network faults need {tool} on the host (apt-get install iproute2 iptables util-linux)"
    assert NetDelayInjector.missing_engine() == PartitionInjector.missing_engine() == want


def test_stall_fs_names_its_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("FUSE is not set up here")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mfusepy" else real(name, *a)
    )
    assert StallFsInjector.missing_engine() == (
        "stall-fs needs FUSE: the Python package mfusepy is not installed (pip install mfusepy)"
    )


def test_without_fusermount3_the_dry_run_names_the_package_and_the_runs_fail_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if StallFsInjector.missing_engine() is not None:
        pytest.skip(f"FUSE is not set up here: {StallFsInjector.missing_engine()}")
    suite_file = tmp_path / "s.yaml"
    suite_file.write_text(STALL)
    assert main(["run", str(suite_file), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert json.loads(capsys.readouterr().out)["missing_engines"] == {}  # FUSE is here: nothing missing
    path_without("fusermount3", tmp_path, monkeypatch)
    assert main(["run", str(suite_file), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["missing_engines"] == {
        "fault 'slow'": NO_FUSERMOUNT,
        "fault 'slow2'": NO_FUSERMOUNT,
    }
    assert f"warning: fault 'slow': {NO_FUSERMOUNT}; its runs will fail here" in captured.err.splitlines()
    records = Runner(make_suite(STALL), tmp_path / "out").run()  # no rank starts: the mount comes first
    assert [(r.scenario.id, r.result.status, r.result.reason) for r in records] == [
        ("restart/slow", "error", NO_FUSERMOUNT),
        ("restart/slow2", "error", NO_FUSERMOUNT),
    ]
    assert all(json.loads(RunDir(r.run_dir).result.read_text())["reason"] == NO_FUSERMOUNT for r in records)


@pytest.mark.parametrize("tool", ["sbatch", "srun", "squeue", "scontrol"])
def test_the_slurm_runtime_names_each_missing_client_command(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaosbench.runtimes.slurm.runtime import SlurmRuntime

    path_without(tool, tmp_path, monkeypatch)
    assert SlurmRuntime.missing_engine() == (
        f"the slurm runtime needs the Slurm client commands ({tool} not found; "
        "apt-get install slurm-client, or scripts/slurm-local up)"
    )


def test_the_docker_runtime_names_its_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.runtimes.docker import DockerRuntime

    module_missing("docker", monkeypatch)
    assert (
        DockerRuntime.missing_engine()
        == "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'"
    )


def test_the_docker_runtime_needs_no_local_engine_for_one_named_by_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaosbench.runtimes.docker import DockerRuntime

    if importlib.util.find_spec("docker") is None:
        pytest.skip("the Docker SDK is not installed here")
    monkeypatch.setenv("PATH", str(tmp_path))  # neither dockerd nor docker on it
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert DockerRuntime.missing_engine() == (
        "the docker runtime needs a Docker engine: scripts/docker-up (apt-get install docker.io)"
    )
    monkeypatch.setenv("DOCKER_HOST", "tcp://docker:2375")  # a CI job's engine in a service container
    assert DockerRuntime.missing_engine() is None


@pytest.mark.parametrize("package", ["locust", "uvicorn", "starlette"])
def test_the_balancer_names_each_missing_serve_package(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.frameworks.balancer import BalancerFramework
    from chaosbench.runtimes.local import LocalRuntime

    module_missing(package, monkeypatch)
    options = BalancerFramework.Options()
    assert BalancerFramework.missing_engine(options, LocalRuntime) == (
        f"balancer needs {package}: pip install 'chaosbench[serve]'"
    )


def test_without_haproxy_the_dry_run_of_the_serving_suite_names_it_and_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import ROOT

    if any(importlib.util.find_spec(p) is None for p in ("locust", "uvicorn", "starlette")):
        pytest.skip("the serve extra is not installed here")
    path_without("haproxy", tmp_path, monkeypatch)
    assert (
        main(["run", str(ROOT / "suites" / "serving.yaml"), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    why = "balancer needs haproxy: 'haproxy' not found (apt-get install -y haproxy)"
    assert set(doc["missing_engines"].values()) == {why}
    assert {r["plan"] for r in doc["runs"]} == {why}  # each run's plan: the reason it cannot be made here


def _serving(tmp_path: Path) -> str:
    return """
name: engine-gone
control: false
defaults:
  deadline_s: 30
  workload: {name: serve, ranks: 2, load: {users: 2, duration_s: 4}}
frameworks: {health: {adapter: balancer}}
faults:
  first: {injector: kill, target: {rank: 1}, trigger: {after_s: 1}}
  second: {injector: kill, target: {rank: 0}, trigger: {after_s: 1}}
matrix: {frameworks: [health], faults: [first, second]}
"""


def _training(runtime: str, fault: str = "{injector: kill, target: {rank: 1}, trigger: {at_step: 2}}") -> Any:
    def text(tmp_path: Path) -> str:
        return f"""
name: engine-gone
control: false
defaults:
  runtime: {runtime}
  deadline_s: 30
  workload: {{name: ddp-mlp, ranks: 2, steps: 5}}
frameworks: {{restart: {{}}}}
faults:
  first: {fault}
  second: {fault}
matrix: {{frameworks: [restart], faults: [first, second]}}
"""

    return text


def _no_tool(tool: str) -> Any:
    return lambda tmp_path, monkeypatch: path_without(tool, tmp_path, monkeypatch)


def _no_module(name: str, needs: tuple[str, ...] = ()) -> Any:
    def gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if any(importlib.util.find_spec(p) is None for p in (name, *needs)):
            pytest.skip(f"{name} is not installed here: its absence would prove nothing")
        module_missing(name, monkeypatch)

    return gone


def _needs_serve(then: Any) -> Any:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if any(importlib.util.find_spec(p) is None for p in ("locust", "uvicorn", "starlette")):
            pytest.skip("the serve extra is not installed here")
        then(tmp_path, monkeypatch)

    return setup


def _no_docker_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("docker") is None:
        pytest.skip("the Docker SDK is not installed here")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-dockerd.sock")


NET_DELAY = "{injector: net-delay, target: {rank: 1}, trigger: {at_step: 2}, params: {delay_ms: 50}}"
SLURM_WHY = (
    "the slurm runtime needs the Slurm client commands (sbatch not found; apt-get install slurm-client, or "
    "scripts/slurm-local up)"
)
NO_DOCKERD = "no Docker engine answers ("
# each: what is gone, the suite, the dry-run's key for it (None: the dry-run cannot know without asking the engine),
# and the reason every run of the suite ends with
GONE = {
    "iptables": (
        _no_tool("iptables"),
        _training("test-local-nodes", NET_DELAY),
        "fault 'first'",
        "network faults need iptables on the host (apt-get install iproute2 iptables util-linux)",
    ),
    "haproxy": (
        _needs_serve(_no_tool("haproxy")),
        _serving,
        "framework 'health'",
        "balancer needs haproxy: 'haproxy' not found (apt-get install -y haproxy)",
    ),
    "locust": (
        _no_module("locust"),
        _serving,
        "framework 'health'",
        "balancer needs locust: pip install 'chaosbench[serve]'",
    ),
    "sbatch": (_no_tool("sbatch"), _training("slurm"), "runtime 'slurm'", SLURM_WHY),
    "docker-sdk": (
        _no_module("docker"),
        _training("docker"),
        "runtime 'docker'",
        "the docker runtime needs the Docker SDK: pip install 'chaosbench[docker]'",
    ),
    "dockerd": (_no_docker_engine, _training("docker"), None, NO_DOCKERD),
}


@pytest.mark.parametrize("gone", GONE)
def test_each_engine_gone_is_named_by_the_dry_run_and_costs_each_run_with_its_reason(
    gone: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real ``chaosbench run`` of a two-run suite with the engine gone: both runs end as errors with the reason
    (no rank, container or job starts), the suite finishes with its report, and the exit code says a run erred."""
    take_away, text, key, why = GONE[gone]
    local_nodes_runtime()
    suite_file = tmp_path / "engine-gone.yaml"
    suite_file.write_text(text(tmp_path))
    take_away(tmp_path, monkeypatch)
    assert main(["run", str(suite_file), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads(capsys.readouterr().out)
    if key is None:
        assert doc["missing_engines"] == {}
    else:
        assert (
            doc["missing_engines"] == {key: why}
            if key.startswith(("runtime", "framework"))
            else (doc["missing_engines"] == {key: why, key.replace("first", "second"): why})
        )
    assert main(["run", str(suite_file), "--out", str(tmp_path / "o")]) == 1
    suite_dir = SuiteDir(tmp_path / "o" / "engine-gone")
    runs = suite_dir.runs()
    assert len(runs) == 2 and (suite_dir.path / "report.html").is_file()
    for run in runs:
        result = json.loads(RunDir(run).result.read_text())
        assert result["status"] == "error" and "\n" not in result["reason"]
        assert result["reason"] == why if why != NO_DOCKERD else result["reason"].startswith(why), result[
            "reason"
        ]
        kinds = {e.kind for e in read_events(RunDir(run).events)}
        assert "proc_start" not in kinds, f"{gone}: a process started: {sorted(kinds)}"
        assert json.loads(RunDir(run).metrics.read_text())["outcome"] == "error"
