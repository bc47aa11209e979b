"""The command line: one-line errors, exit codes, dry runs, the injector list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chaosbench.cli import main
from tests.conftest import ROOT


def test_bad_suite_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: b\nfaults:\n  k: {injector: kil, trigger: {at_step: 2}}\nmatrix: {frameworks: [none]}\n"
    )
    assert main(["run", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    from chaosbench.registry import INJECTORS

    known = ", ".join(INJECTORS.names())
    assert err == f"chaosbench: error: {bad}:3: fault 'k': unknown injector 'kil' (known: {known})"
    assert "hang, kill" in known
    assert not (tmp_path / "o").exists()  # nothing ran


def test_missing_suite_file(tmp_path: Path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read suite" in capsys.readouterr().err


def test_dry_run_prints_every_plan(tmp_path: Path, capsys) -> None:
    assert main(["run", str(ROOT / "suites" / "smoke.yaml"), "--dry-run", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["runs"]) == 15
    tr = next(r for r in doc["runs"] if r["scenario"] == "torchrun/kill-rank1")
    argv = tr["plan"]["processes"][0]["argv"]
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--max-restarts" in argv
    assert tr["plan"]["processes"][0]["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert tr["plan"]["timeouts"]["workload_pg_timeout_s"] == 10
    assert tr["fault"]["trigger"]["at_step"] == 25
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_faults_lists_injectors_with_params(capsys) -> None:
    assert main(["faults"]) == 0
    out = capsys.readouterr().out
    assert "kill:" in out and "signal (default 'SIGKILL')" in out
    assert "hang:" in out and "duration_s" in out


def test_faults_lists_definitions_with_where_each_came_from(tmp_path: Path, capsys, monkeypatch) -> None:
    from chaosbench.specs import fault_library

    monkeypatch.chdir(tmp_path)
    (tmp_path / "chaos" / "faults").mkdir(parents=True)
    (tmp_path / "chaos" / "faults" / "kill-rank.yaml").write_text("injector: kill\n")
    (tmp_path / "chaos" / "faults" / "mine.yaml").write_text("injector: hang\n")
    (tmp_path / "chaos" / "ci.yaml").write_text("name: x\n")
    assert main(["faults", "chaos/ci.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    own = tmp_path / "chaos" / "faults"
    assert (
        f"  kill-rank: {own / 'kill-rank.yaml'} (the suite's own; overrides the one shipped with chaosbench)"
        in lines
    )
    assert f"  mine: {own / 'mine.yaml'} (the suite's own)" in lines
    assert f"  sdc: {fault_library()['sdc']} (shipped with chaosbench)" in lines
    assert main(["faults", "chaos/nope.yaml"]) == 2
    assert capsys.readouterr().err == "chaosbench: error: chaos/nope.yaml: no such suite file\n"


def test_init_writes_a_starter_suite_and_a_ci_job_that_load(tmp_path: Path, capsys, monkeypatch) -> None:
    from chaosbench.specs import load_suite

    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    assert capsys.readouterr().out == "wrote chaos/ci.yaml\nwrote .github/workflows/chaos.yml\n"
    suite = load_suite("chaos/ci.yaml")  # its `use:` names resolve from the shipped library
    assert (suite.name, suite.run_count(), suite.faults["kill-rank1"].injector) == ("ci", 5, "kill")
    assert "chaosbench run chaos/ci.yaml" in (tmp_path / ".github" / "workflows" / "chaos.yml").read_text()
    assert main(["init"]) == 2  # nothing is overwritten
    assert (
        capsys.readouterr().err
        == "chaosbench: error: chaos/ci.yaml: already exists; chaosbench init overwrites nothing\n"
    )


def test_report_of_nothing_is_an_error(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 1
    assert "no chaosbench results found" in capsys.readouterr().err


def test_console_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chaosbench.cli", "run", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--dry-run" in out.stdout


def test_suite_schema_file_is_fresh() -> None:
    """suites/suite.schema.json is what `chaosbench schema` writes (regenerate it with
    `chaosbench schema --out suites/suite.schema.json`)."""
    import json

    from chaosbench.cli import suite_schema
    from tests.conftest import ROOT

    shipped = json.loads((ROOT / "suites" / "suite.schema.json").read_text())
    assert shipped == json.loads(json.dumps(suite_schema(), sort_keys=True))
    assert set(shipped["properties"]) == {
        "name",
        "description",
        "seed",
        "control",
        "defaults",
        "frameworks",
        "faults",
        "matrix",
        "projection",
        "slos",
        "keep_checkpoints",
    }


def test_a_framework_that_cannot_run_the_workload_is_refused_with_its_line(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: ft\ndefaults: {workload: {name: ddp-mlp, ranks: 2, steps: 10}}\n"
        "frameworks:\n  torchft: {}\nmatrix: {frameworks: [torchft]}\n"
    )
    assert main(["run", str(suite), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"chaosbench: error: {suite}:4: framework 'torchft': torchft adapter: workload 'ddp-mlp' does not train "
        "through torchft's Manager (use ft-mlp, or a command workload whose script does)"
    )


def test_python_dash_m_chaosbench_is_the_cli() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "chaosbench", "--version"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.startswith("chaosbench "), out.stderr
