"""The command workload: placeholders substituted wherever the user writes a string for the script (command, env,
cwd), per rank where needed, validated before anything runs; each run gets its own working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaosbench.errors import SpecError
from tests.conftest import ROOT, make_suite


def _shim(
    args: list[str], env: dict[str, str], cwd: Path, events: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    full.pop("CHAOSBENCH_EVENTS", None)
    if events is not None:
        full["CHAOSBENCH_EVENTS"] = str(events)
    return subprocess.run(
        [sys.executable, "-m", "chaosbench.launchers.command", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_shim_substitutes_command_env_and_cwd_per_rank(tmp_path: Path) -> None:
    subst = {
        "ckpt_dir": str(tmp_path / "ck"),
        "run_dir": str(tmp_path),
        "work_dir": str(tmp_path / "work"),
        "seed": "7",
        "project_dir": str(ROOT),
        "suite_dir": str(ROOT),
    }
    script = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['CKPT_DIR'], os.getcwd()]))"
    res = _shim(
        [
            "--subst",
            json.dumps(subst),
            "--env",
            json.dumps({"CKPT_DIR": "{ckpt_dir}/r{rank}"}),
            "--cwd",
            "{work_dir}",
            "--",
            sys.executable,
            "-c",
            script,
            "{seed}",
            "{{literal}}",
            "{world_size}",
        ],
        env={"RANK": "1", "WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    argv, ckpt, cwd = json.loads(res.stdout.strip().splitlines()[-1])
    assert argv == ["7", "{literal}", "2"]
    assert ckpt == f"{tmp_path}/ck/r1"
    assert cwd == str(tmp_path / "work")
    assert not (tmp_path / "{ckpt_dir}").exists()


def test_shim_numbers_a_replica_groups_ranks_across_the_groups(tmp_path: Path) -> None:
    """Under TorchFT every group is its own torch.distributed world (RANK 0 in each): the adapter says which group
    and how many, and the shim reports rank = group * WORLD_SIZE + RANK, as ft-mlp does and targets name it."""
    events = tmp_path / "events.jsonl"
    res = _shim(
        ["--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "{rank}", "{world_size}"],
        env={
            "RANK": "1",
            "WORLD_SIZE": "2",
            "CHAOSBENCH_REPLICA_GROUP": "1",
            "CHAOSBENCH_REPLICA_GROUPS": "3",
            "PYTHONPATH": str(ROOT),
        },
        cwd=tmp_path,
        events=events,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "['3', '6']"
    start = next(e for e in map(json.loads, events.read_text().splitlines()) if e["kind"] == "rank_start")
    assert (start["rank"], start["world_size"]) == (3, 6)
    assert (start["replica_group"], start["group_rank"], start["group_world_size"]) == (1, 1, 2)


def test_shim_dies_like_its_child_on_sigkill(tmp_path: Path) -> None:
    res = _shim(
        ["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        env={"PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert res.returncode == -9, (res.returncode, res.stderr)


def _suite(workload: str) -> str:
    return f"""
    name: cmd
    defaults:
      workload:
        name: command
        ranks: 2
{workload}
    frameworks: {{restart: {{}}}}
    matrix: {{frameworks: [restart]}}
    """


def test_unknown_placeholder_is_a_one_line_error() -> None:
    with pytest.raises(
        SpecError,
        match=r"test.yaml:\d+: workload 'command': .*env.CKPT: unknown placeholder "
        r"\{ckptdir\} \(known: \{ckpt_dir\}",
    ):
        make_suite(_suite('        command: [python, /x/train.py]\n        env: {CKPT: "{ckptdir}"}'))
    with pytest.raises(SpecError, match=r"is not a placeholder"):
        make_suite(_suite("        command: [python, /x/train.py, '{}']"))


def test_relative_script_path_is_refused_with_the_fix(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(
        SpecError,
        match=r"'tests/fixtures/foreign/ddp_env.py' is a path relative to this directory.*"
        r"\{project_dir\}/tests/fixtures/foreign/ddp_env.py",
    ):
        make_suite(_suite("        command: [python, tests/fixtures/foreign/ddp_env.py]"))
    make_suite(_suite('        command: [python, "{project_dir}/tests/fixtures/foreign/ddp_env.py"]'))
    make_suite(
        _suite("        command: [python, tests/fixtures/foreign/ddp_env.py]\n        cwd: '{project_dir}'")
    )


def test_run_values_and_default_working_directory() -> None:
    from chaosbench.registry import WORKLOADS
    from chaosbench.runner import Runner

    suite = make_suite(
        _suite('        command: [python, "{project_dir}/t.py"]\n        env: {A: "{ckpt_dir}"}')
    )
    runner = Runner(suite, "/tmp/cb-out")
    sc = suite.scenarios()[0]
    job = runner._job(sc, Path("/tmp/cb-out/x/0"), None, "id")  # type: ignore[arg-type]
    argv = WORKLOADS.get("command")(sc.workload, job.workload.options).argv(job.paths)
    assert argv[argv.index("--cwd") + 1] == "{work_dir}"
    subst = json.loads(argv[argv.index("--subst") + 1])
    assert subst["ckpt_dir"] == "/tmp/cb-out/x/0/checkpoints" and subst["work_dir"] == "/tmp/cb-out/x/0/work"
    assert subst["project_dir"] == str(Path.cwd())
    assert json.loads(argv[argv.index("--env") + 1]) == {"A": "{ckpt_dir}"}
    assert argv[-2:] == ["python", "{project_dir}/t.py"]
