"""The exception tree (:mod:`chaosbench.errors`): errors carry their context as fields; these tests read the
fields and types, not the text (beyond the message being built from them)."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from chaosbench.errors import ChaosbenchError, EngineCommandFailed, MissingEngine, SpecError, TargetRefused
from tests.conftest import make_suite

SUITE = """\
name: x
defaults: {{workload: {{name: ddp-mlp, ranks: 2}}}}
frameworks: {{restart: {{}}}}
faults:
  kill-rank1:
    injector: {injector}
    target: 1
    trigger: {trigger}
matrix: {{frameworks: [restart], faults: [kill-rank1]}}
"""


def _refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        make_suite(text, "suites/x.yaml")
    return info.value


def test_an_unknown_injector_names_the_file_line_and_fault() -> None:
    err = _refused(SUITE.format(injector="kil", trigger="{at_step: 5}"))
    assert (err.file, err.line, err.obj) == ("suites/x.yaml", 6, "fault 'kill-rank1'")
    assert err.problem.startswith("unknown injector 'kil' (known: ")
    assert str(err) == f"suites/x.yaml:6: fault 'kill-rank1': {err.problem}"


def test_a_validation_error_names_the_field_in_its_problem() -> None:
    err = _refused(SUITE.format(injector="kill", trigger="{at_stepp: 5}"))
    assert (err.file, err.line, err.obj) == ("suites/x.yaml", 8, "fault 'kill-rank1'")
    assert err.problem.startswith("trigger.at_stepp: unknown key")


def test_invalid_yaml_has_a_line_and_no_object() -> None:
    err = _refused("name: x\nmatrix: [\n")
    assert (err.file, err.obj) == ("suites/x.yaml", None) and err.line is not None
    assert err.problem.startswith("invalid YAML: ")


def test_a_spec_error_without_a_place_is_its_problem() -> None:
    err = SpecError("--jobs 0: give 1 or more runs at once")
    assert (err.file, err.line, err.obj, str(err)) == (
        None,
        None,
        None,
        "--jobs 0: give 1 or more runs at once",
    )
    assert isinstance(err, ChaosbenchError)


def test_a_failed_slurm_command_carries_argv_rc_and_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.runtimes.slurm.commands import SlurmCommands

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            argv, 1, "", "sbatch: error: first\nsbatch: error: Batch job submission failed\n"
        )

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(EngineCommandFailed) as info:
        SlurmCommands(os.environ, 5.0).command(["sbatch", "--parsable", "job.sh"])
    err = info.value
    assert (err.argv, err.rc) == (["sbatch", "--parsable", "job.sh"], 1)
    assert err.stderr == "sbatch: error: first\nsbatch: error: Batch job submission failed"
    assert str(err) == "'sbatch --parsable job.sh' failed: sbatch: error: Batch job submission failed"


def test_a_failed_tool_in_a_node_namespace_carries_the_command_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaosbench.injectors import network

    class Node:
        def node_pid(self, name: str) -> int:
            return 4242

    monkeypatch.setattr(
        network.subprocess,
        "run",
        lambda argv, **kw: subprocess.CompletedProcess(argv, 4, "", "iptables: No chain\n"),
    )
    with pytest.raises(EngineCommandFailed) as info:
        network.nsexec(Node(), "node1", ["iptables", "-D", "X"])  # type: ignore[arg-type]
    err = info.value
    assert (err.argv, err.rc, err.stderr) == (
        ["nsenter", "-t", "4242", "-n", "iptables", "-D", "X"],
        4,
        "iptables: No chain",
    )
    assert str(err) == "node1: iptables -D X: iptables: No chain"


@pytest.mark.parametrize(
    ("stderr", "method", "raised"),
    [
        ("RTNETLINK answers: Operation not permitted\n", "auto", EngineCommandFailed),
        ("Error: Specified qdisc kind is unknown.\n", "netem", MissingEngine),
    ],
)
def test_a_qdisc_that_fails_says_which_command_or_which_engine_is_missing(
    monkeypatch: pytest.MonkeyPatch, stderr: str, method: str, raised: type[Exception]
) -> None:
    """net-delay's netem on a node: tc failing is an engine command that failed (argv, rc, stderr); the kernel
    lacking sch_netem when netem was asked for by name is a missing engine."""
    from chaosbench.injectors import network

    class Node:
        def node_pid(self, name: str) -> int:
            return 4242

        def node_iface(self, name: str) -> str:
            return "eth0"

    monkeypatch.setattr(
        network.subprocess,
        "run",
        lambda argv, **kw: subprocess.CompletedProcess(argv, 2, "", stderr),
    )
    inj = network.NetDelayInjector("slow", network.NetDelayParams(delay_ms=50, method=method))
    ctx: Any = SimpleNamespace(state={})
    with pytest.raises(raised) as info:
        inj._netem(ctx, Node(), "node1")  # type: ignore[arg-type]
    if raised is EngineCommandFailed:
        err = info.value
        assert isinstance(err, EngineCommandFailed)
        argv = ["nsenter", "-t", "4242", "-n", "tc", "qdisc", "add", "dev", "eth0", "root", "netem"]
        assert (err.argv[: len(argv)], err.rc, err.stderr) == (argv, 2, stderr.strip())
        assert str(err) == f"node1: tc qdisc add netem: {stderr.strip()}"
    else:
        assert str(info.value) == "node1: the kernel has no sch_netem (use method: nfqueue)"
    assert ctx.state == {}  # nothing to undo: no qdisc was added


@pytest.mark.parametrize(
    ("url", "cidrs", "target", "reason"),
    [
        ("ftp://127.0.0.1:1", (), "ftp://127.0.0.1:1", "expected http://host:port"),
        ("http://10.1.2.3:80", (), "http://10.1.2.3:80", "10.1.2.3 is not in an allowed network (loopback)"),
        ("http://127.0.0.1:80", ("not-a-net",), None, "--allow-cidr: "),
    ],
)
def test_a_refused_load_target_carries_target_and_reason(
    url: str, cidrs: tuple[str, ...], target: str | None, reason: str
) -> None:
    from chaosbench.workloads.serve_load import check_target

    with pytest.raises(TargetRefused) as info:
        check_target(url, cidrs)
    err = info.value
    assert err.target == target and err.reason.startswith(reason)
    assert isinstance(err, ChaosbenchError) and isinstance(err, ValueError)


def test_an_unknown_plugin_carries_kind_name_and_known() -> None:
    from chaosbench.errors import UnknownPlugin
    from chaosbench.registry import RUNTIMES

    with pytest.raises(UnknownPlugin) as info:
        RUNTIMES.get("k8s")
    assert (info.value.kind, info.value.name) == ("runtime", "k8s")
    assert {"docker", "local", "slurm"} <= set(info.value.known) and info.value.known == RUNTIMES.names()
