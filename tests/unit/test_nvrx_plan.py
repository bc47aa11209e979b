"""The nvrx adapter's plan per launcher generation (the installed nvidia-resiliency-ext: 0.4.x or 0.7.x): the
store host pinned on node0, the options each generation takes, hot spares, what it refuses; and 0.7's lines as
events."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosbench.errors import SpecError, Unsupported
from chaosbench.frameworks import nvrx
from chaosbench.runner import Runner
from tests.conftest import make_suite

SUITE = """
name: nvrx-plan
seed: 1
defaults:
  workload: {{name: ddp-mlp, ranks: 2, nodes: {nodes}, steps: 5}}
frameworks:
  nvrx: {options}
matrix: {{frameworks: [nvrx], faults: [], repeats: 1}}
"""


def _plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, nodes: int = 2, options: str = "{}"):
    monkeypatch.setattr(nvrx, "package_version", lambda name: version)
    suite = make_suite(SUITE.format(nodes=nodes, options=options))
    ((_, plan),) = list(Runner(suite, tmp_path).plans())
    return plan


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize(("version", "generation"), [("0.4.1", "0.4"), ("0.7.0", "0.7"), ("0.7.2rc1", "0.7")])
def test_the_generation_is_the_installed_version(version: str, generation: str) -> None:
    assert nvrx.launcher_generation(version) == generation


@pytest.mark.parametrize("version", ["0.5.0", "0.6.0", "1.0.0", None])
def test_a_version_never_run_here_is_refused(version: str | None) -> None:
    with pytest.raises(Unsupported, match="the adapter drives 0.4.x and 0.7.x"):
        nvrx.launcher_generation(version)


@pytest.mark.parametrize("version", ["0.4.1", "0.7.0"])
def test_node0_hosts_the_rendezvous_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    plan = _plan(tmp_path, monkeypatch, version)
    hosts = {p.node: _arg(p.argv, "--rdzv-conf") for p in plan.processes}
    assert hosts == {"node0": "is_host=true", "node1": "is_host=false"}
    # one node: nothing to pin
    single = _plan(tmp_path, monkeypatch, version, nodes=1)
    assert [_arg(p.argv, "--rdzv-conf") for p in single.processes] == [None]


def test_04_takes_its_restart_policy_and_the_launchers_own_stop_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, monkeypatch, "0.4.1")
    argv = plan.processes[0].argv
    assert _arg(argv, "--ft-restart-policy") == "any-failed" and _arg(argv, "--nnodes") == "2"
    assert "--workers-stop-timeout" not in argv and "--ft-max-no-progress-cycles" not in argv
    assert "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE" not in plan.processes[0].env
    assert plan.timeouts["workers_stop_timeout_s"] == 30.0 and "store_host_exit_grace_s" not in plan.timeouts


def test_07_takes_its_own_options_and_records_its_timeouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, monkeypatch, "0.7.0", options="{workers_stop_timeout_s: 5}")
    for p in plan.processes:
        assert "--ft-restart-policy" not in p.argv  # deprecated in 0.7: any-failed only
        assert (
            _arg(p.argv, "--ft-max-no-progress-cycles") == "3"
            and _arg(p.argv, "--ft-enable-nic-healthcheck") == "true"
        )
        assert _arg(p.argv, "--workers-stop-timeout") == "5.0"
        # 0.7's rendezvous closes for good when two launchers share an address; the local nodes share this host
        assert p.env["NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"] == "1"
    t = plan.timeouts
    assert t["workers_stop_timeout_s"] == 5.0 and t["term_timeout_s"] == 1800.0
    assert t["rdzv_last_call_timeout_s"] == 1.0 and t["store_host_exit_grace_s"] == 3.0
    assert t["gpu_memory_reclaim_timeout_s"] == 50.0 and plan.options["launcher_generation"] == "0.7"


def test_07_hot_spares_are_standby_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(tmp_path, monkeypatch, "0.7.0", options="{spares: 1}")
    assert [p.name for p in plan.processes] == ["ft_launcher.node0", "ft_launcher.node1", "ft_launcher.node2"]
    assert {_arg(p.argv, "--nnodes") for p in plan.processes} == {"2:3"}
    assert [_arg(p.argv, "--rdzv-conf") for p in plan.processes] == [
        "is_host=true",
        "is_host=false",
        "is_host=false",
    ]
    # the infrastructure rank 0.7 orders nodes by: the active ranks go to node0 and node1, node2 waits
    assert [p.env["GROUP_RANK"] for p in plan.processes] == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("version", "options", "why"),
    [
        ("0.4.1", "{spares: 1}", "0.4 has no hot spares"),
        ("0.7.0", "{restart_policy: min-healthy}", "0.7 restarts on any failure only"),
    ],
)
def test_what_a_generation_lacks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, options: str, why: str
) -> None:
    # refused when the suite is planned, naming where the framework is in the suite
    with pytest.raises(SpecError, match=f"test.yaml:7: framework 'nvrx': .*{why}"):
        _plan(tmp_path, monkeypatch, version, options=options)


def test_without_the_package_the_adapter_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.runtimes.local import LocalRuntime

    monkeypatch.setattr(nvrx, "package_version", lambda name: None)
    missing = nvrx.NvrxFramework.missing_engine(nvrx.NvrxOptions(), LocalRuntime)
    assert missing is not None and "pip install 'chaosbench[nvrx]'" in missing


def _matches(patterns, line: str) -> list[tuple[str, dict[str, str]]]:
    import re

    return [
        (p.kind, {k: v for k, v in m.groupdict().items() if v is not None})
        for p in patterns
        if (m := re.search(p.regex, line))
    ]


# Lines of 0.7.0's launcher, copied from the runs of docs/nvrx.md (2026-12-05), but for the failed health check:
# no check fails on this machine, so that line is written as its source writes it (ft_rendezvous_barrier.py:2629).
_PREFIX = "2026-12-05 07:28:54,988 [INFO] [vm] [workload:?(?) infra:?(?)] "


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (
            "2026-12-05 07:27:10,315 [WARNING] [vm] [workload:?(0) infra:?(?)] rank_monitor_server.py:522 [Cycle 0] Section "
            "'step' has been open for 3.06 seconds. Timeout is 3.00 seconds.",
            [("detect", {"local_rank": "0", "section": "step", "open_s": "3.06"})],
        ),
        (
            _PREFIX + "launcher.py:636 [default] Joining cluster restart (group_rank=0)",
            [("restart", {"group_rank": "0"})],
        ),
        (
            _PREFIX
            + "launcher.py:636 [default] Worker group FAILED. 3/3 attempts left; will restart worker group",
            [("restart", {"attempts_left": "3", "max_restarts": "3"})],
        ),
        (
            "E1205 07:28:54.922000 22452 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            "(exitcode: -9) local_rank: 0 (pid: 22506) of binary: /work/venv-nvrx/bin/python",
            [("detect", {"exitcode": "-9", "local_rank": "0"})],
        ),
        (
            _PREFIX
            + "launcher.py:3750 Agent run ended with exception, e=DistNetworkError('Connection reset by peer'). "
            "Agent's exit code = 1",
            [("give_up", {})],
        ),
        (
            _PREFIX
            + "ft_rendezvous_barrier.py:2629 NIC link state health check failed for node localhost_1_0: Node "
            "localhost_1_0 has unhealthy NIC link(s).",
            [("detect", {})],
        ),
        (_PREFIX + "ft_rendezvous_barrier.py:2752 Assigned active rank 1 (round=1)", [("log", {})]),
        # on CPU, every rendezvous: no detection
        (
            "2026-12-05 07:28:38,820 [WARNING] [vm] [workload:?(?) infra:?(?)] health_check.py:344 Health checks are "
            "disabled; skipping synchronous check.",
            [],
        ),
    ],
)
def test_07_lines_become_events(line: str, want: list[tuple[str, dict[str, str]]]) -> None:
    assert _matches(nvrx.NVRX07_PATTERNS, line) == want


def test_a_health_check_failure_is_a_detection_by_a_node_health_check() -> None:
    (p,) = [p for p in nvrx.NVRX07_PATTERNS if p.via == "health check"]
    from chaosbench.analysis.attribution import DETECTION_MECHANISMS

    assert DETECTION_MECHANISMS[p.via] == "node health check"
