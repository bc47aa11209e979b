"""manifest.json and `chaosbench verify` on a hand-made suite directory laid out as chaosbench.rundir says: what
the manifest records, and which changes are problems (evidence, figures) and which are notes (derived files,
removed checkpoints)."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from chaosbench import manifest
from chaosbench.errors import ResultsError
from chaosbench.manifest import MANIFEST, check, definition_sha256, main_verify, verify, write_manifest
from chaosbench.rundir import RunDir

DEFINITION = {"name": "t", "seed": 7, "frameworks": {"restart": {"max_restarts": 3}}}
ARGV = ["chaosbench", "run", "suites/t.yaml", "--out", "reports"]


def _run_dir(suite: Path, scenario: str, repeat: int) -> Path:
    d = suite / scenario.replace("/", "__") / str(repeat)
    (d / "logs").mkdir(parents=True)
    (d / "checkpoints" / "step_00000010").mkdir(parents=True)
    framework, fault = scenario.split("/")
    argv = ["/usr/bin/python", "-m", "chaosbench.workloads.ddp_mlp", "--steps", "60", "--seed", str(repeat)]
    config = {
        "run_id": f"t-{scenario.replace('/', '__')}-{repeat}",
        "scenario": {
            "scenario": scenario,
            "framework": framework,
            "fault": fault,
            "repeat": repeat,
            "control": fault == "control",
            "runtime": "local",
        },
        "plan": {
            "framework": framework,
            "adapter": framework,
            "versions": {"chaosbench": "0.1.0"},
            "processes": [
                {
                    "name": f"rank{r}.i0",
                    "argv": argv,
                    "env": {"RANK": str(r)},
                    "role": "rank",
                    "node": "node0",
                    "incarnation": 0,
                }
                for r in range(2)
            ],
        },
    }
    (d / "config.json").write_text(json.dumps(config, indent=2))
    (d / "events.jsonl").write_text(
        "".join(json.dumps({"t_ns": i, "kind": "step", "step": i}) + "\n" for i in range(50))
    )
    (d / "metrics.json").write_text(json.dumps({"outcome": "recovered", "time_to_resume_s": 1.25}))
    (d / "logs" / "rank0.i0.out").write_text("step 1\n" * 100)
    (d / "logs" / "rank0.i0.err").write_text("")
    (d / "checkpoints" / "step_00000010" / "rank0.pt").write_bytes(b"\0" * 4096)
    (d / "checkpoints.json").write_text(json.dumps({"files": 1, "bytes": 4096}))
    (d / "result.json").write_text(json.dumps({"status": "completed"}))
    (d / "timeline.png").write_bytes(b"\x89PNG" + os.urandom(16))
    return d


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    """Two runs, the suite's table, its report and a plot; the suite file lies outside the directory."""
    suite = tmp_path / "reports" / "t"
    suite.mkdir(parents=True)
    (suite / "suite.json").write_text(
        json.dumps({"suite": "t", "source": "suites/t.yaml", "definition": DEFINITION})
    )
    _run_dir(suite, "restart/control", 0)
    _run_dir(suite, "restart/kill-rank1", 0)
    (suite / "results.csv").write_text(
        "suite,scenario,repeat,outcome\nt,restart/control,0,completed\nt,restart/kill-rank1,0,recovered\n"
    )
    (suite / "results.parquet").write_bytes(b"PAR1" + os.urandom(64) + b"PAR1")
    (suite / "report.md").write_text("# t\n- **Generated:** 2026-01-01T00:00:00+00:00\n")
    (suite / "report.html").write_text("<html>t</html>")
    (suite / "plots").mkdir()
    (suite / "plots" / "restart_kill-rank1__0.png").write_bytes(b"\x89PNG" + os.urandom(32))
    (tmp_path / "t.yaml").write_text("name: t\nseed: 7\n")
    return suite


@pytest.fixture(autouse=True)
def no_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines are not probed here (a busy Docker daemon would make these tests slow); test_versions does."""
    monkeypatch.setattr(manifest, "_docker_engine", lambda: {"missing": "not probed in unit tests"})
    monkeypatch.setattr(manifest, "_slurm", lambda: {"missing": "not probed in unit tests"})


def _write(suite_dir: Path) -> dict:
    path = write_manifest(suite_dir, ARGV, suite_dir.parent.parent / "t.yaml")
    assert path == suite_dir / MANIFEST
    return json.loads(path.read_text())


def test_manifest_records_files_commands_and_suite(suite_dir: Path) -> None:
    m = _write(suite_dir)
    assert m["format_version"] == manifest.FORMAT_VERSION
    assert datetime.fromisoformat(m["created_at"]).utcoffset().total_seconds() == 0
    assert m["command"] == {"argv": ARGV, "cwd": os.getcwd()}
    events = "restart__kill-rank1/0/events.jsonl"
    data = (suite_dir / events).read_bytes()
    assert m["files"][events] == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert {
        "suite.json",
        "results.csv",
        "results.parquet",
        "restart__control/0/metrics.json",
        "restart__control/0/logs/rank0.i0.err",
    } <= set(m["files"])
    assert set(m["derived"]) == {
        "report.md",
        "report.html",
        "plots/restart_kill-rank1__0.png",
        "restart__control/0/timeline.png",
        "restart__kill-rank1/0/timeline.png",
    }
    assert {"restart__control/0/result.json", "restart__control/0/checkpoints.json"} <= set(m["files"])
    ckpt = "restart__control/0/checkpoints/step_00000010/rank0.pt"
    assert m["checkpoints"] == {ckpt: {"size": 4096}, ckpt.replace("control", "kill-rank1"): {"size": 4096}}
    assert not any("checkpoints/" in rel for rel in m["files"]) and MANIFEST not in m["files"]
    yaml = (suite_dir.parent.parent / "t.yaml").read_bytes()
    assert m["suite"]["file"]["sha256"] == hashlib.sha256(yaml).hexdigest()
    assert m["suite"]["name"] == "t" and m["suite"]["definition_sha256"] == definition_sha256(DEFINITION)
    run = next(r for r in m["runs"] if r["scenario"] == "restart/kill-rank1")
    assert run["dir"] == "restart__kill-rank1/0" and run["repeat"] == 0 and run["fault"] == "kill-rank1"
    assert [p["argv"][-1] for p in run["processes"]] == ["0", "0"] and run["processes"][1]["env"] == {
        "RANK": "1"
    }
    assert m["versions"]["runs"] == [{"versions": {"chaosbench": "0.1.0"}, "runs": 2}]
    assert m["host"]["cpu"]["count"] == os.cpu_count() and m["host"]["hostname"]
    assert [p.name for p in suite_dir.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_versions_are_found_or_missing_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # this one probes the engines for real (short timeouts)
    v = manifest.versions()
    assert v["python"]["implementation"] and v["python"]["version"].count(".") == 2
    assert v["torch"] != manifest.NOT_INSTALLED  # a dependency of chaosbench
    assert set(v["frameworks"]) == {"torchft", "nvidia-resiliency-ext"}
    assert v["packages"]["pydantic"] != manifest.NOT_INSTALLED
    assert manifest._package("no-such-package-chaosbench") == manifest.NOT_INSTALLED
    for engine in v["engines"].values():
        assert set(engine) & {"server", "version", "missing"}
    git = v["chaosbench"]["git"]
    assert ("commit" in git and isinstance(git["dirty"], bool)) or git["missing"]


def test_clean_directory_verifies(suite_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(suite_dir)
    (suite_dir / ".manifest.json.123.abcd").write_text("{")  # what a crashed write_manifest leaves
    assert verify(suite_dir) == []
    assert main_verify(str(suite_dir)) == 0
    assert capsys.readouterr().out.strip() == "verified: 17 files, 2 runs, suite t"


def test_changed_result_file_is_a_problem_naming_it(
    suite_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(suite_dir)
    events = suite_dir / "restart__kill-rank1/0/events.jsonl"
    data = bytearray(events.read_bytes())
    data[10] ^= 1  # same size: only the hash can tell
    events.write_bytes(bytes(data))
    metrics = suite_dir / "restart__control/0/metrics.json"
    metrics.write_text(metrics.read_text().replace("1.25", "0.25"))
    problems = verify(suite_dir)
    assert len(problems) == 2
    assert problems[0].startswith("restart__control/0/metrics.json: content changed")
    assert problems[1].startswith("restart__kill-rank1/0/events.jsonl: content changed")
    # a figure's line says why `chaosbench report` may have changed it; the timeline's does not
    assert "chaosbench report" in problems[0] and "chaosbench report" not in problems[1]
    assert main_verify(str(suite_dir)) == 1
    assert capsys.readouterr().out.splitlines() == problems


def test_size_change_missing_and_unlisted_files_are_problems(suite_dir: Path) -> None:
    _write(suite_dir)
    with open(suite_dir / "results.csv", "a") as f:
        f.write("t,restart/kill-rank1,1,recovered\n")
    (suite_dir / "restart__control/0/logs/rank0.i0.out").unlink()
    (suite_dir / "restart__control/0/logs/rank1.i0.out").write_text("planted\n")
    problems = verify(suite_dir)
    assert "restart__control/0/logs/rank0.i0.out: result file listed in the manifest is missing" in problems
    assert "restart__control/0/logs/rank1.i0.out: result file not in the manifest" in problems
    assert any(p.startswith("results.csv: size changed") for p in problems)
    # the added row names a run that has no directory
    assert any(
        p.startswith("restart__kill-rank1/1: run restart/kill-rank1 #1 of results.csv has no run directory")
        for p in problems
    )
    assert len(problems) == 4


def test_changed_report_is_a_note_not_a_failure(suite_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(suite_dir)
    (suite_dir / "report.html").write_text("<html>regenerated</html>")
    (suite_dir / "plots" / "restart_kill-rank1__0.png").unlink()
    (suite_dir / "summary.md").write_text("summary\n")
    result = check(suite_dir)
    assert result.problems == []
    assert len(result.notes) == 3 and all("derived" in n for n in result.notes)
    assert any(n.startswith("report.html: size changed") for n in result.notes)
    assert main_verify(str(suite_dir)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("verified: ") and all(line.startswith("note: ") for line in out[1:])


def test_removed_checkpoints_are_not_a_failure(suite_dir: Path) -> None:
    import shutil

    _write(suite_dir)
    shutil.rmtree(suite_dir / "restart__control/0/checkpoints")
    result = check(suite_dir)
    assert result.problems == [] and result.notes == [
        "1 of 2 checkpoint files listed are gone (checkpoints are not verified: a keep-checkpoints policy may "
        "delete them)"
    ]
    assert main_verify(str(suite_dir), checkpoints=True) == 1
    strict = check(suite_dir, checkpoints=True).problems
    assert strict == [
        "restart__control/0/checkpoints/step_00000010/rank0.pt: checkpoint file listed in the "
        "manifest is missing"
    ]


def test_changed_suite_definition_is_a_problem(suite_dir: Path) -> None:
    _write(suite_dir)
    marker = suite_dir / "suite.json"
    data = json.loads(marker.read_text())
    data["definition"]["seed"] = 8
    marker.write_text(json.dumps(data))
    problems = verify(suite_dir)
    assert any(p.startswith("suite.json: the suite definition no longer matches its hash") for p in problems)
    assert any(p.startswith("suite.json: ") and "changed" in p for p in problems)


def test_suite_file_changed_outside_the_directory_is_a_note(suite_dir: Path) -> None:
    _write(suite_dir)
    (suite_dir.parent.parent / "t.yaml").write_text("name: t\nseed: 8\n")
    result = check(suite_dir)
    assert result.problems == [] and any("the suite file changed since the run" in n for n in result.notes)


def test_links_are_recorded_by_target(suite_dir: Path) -> None:
    link = suite_dir / "restart__control/0/work"
    link.symlink_to("/nonexistent/data")
    m = _write(suite_dir)
    assert m["files"]["restart__control/0/work"] == {"symlink": "/nonexistent/data"}
    link.unlink()
    link.symlink_to("/elsewhere")
    assert verify(suite_dir) == [
        "restart__control/0/work: link changed ('/nonexistent/data' -> '/elsewhere')"
    ]


def test_missing_manifest_is_a_clear_error(suite_dir: Path) -> None:
    with pytest.raises(ResultsError) as err:
        main_verify(str(suite_dir))
    assert (err.value.path, err.value.problem) == (
        str(suite_dir / MANIFEST),
        "no manifest (chaosbench run writes one when a suite ends)",
    )
    assert str(err.value).startswith(f"{suite_dir / MANIFEST}: no manifest")
    with pytest.raises(ResultsError) as err:
        verify(suite_dir / "nope")
    assert (err.value.path, err.value.problem) == (str(suite_dir / "nope"), "no such results directory")


def test_rewriting_keeps_the_earlier_command(suite_dir: Path) -> None:
    first = _write(suite_dir)
    (suite_dir / "restart__control/0/logs/rank1.i0.out").write_text("resumed\n")
    second = json.loads(write_manifest(suite_dir, ["chaosbench", "run", "--resume"], None).read_text())
    assert second["earlier_commands"] == [{**first["command"], "created_at": first["created_at"]}]
    assert second["suite"]["file"] == {"missing": "no suite file given"}
    assert "restart__control/0/logs/rank1.i0.out" in second["files"] and verify(suite_dir) == []


def test_derived_names_are_the_writers() -> None:
    from chaosbench.gate import COMPARISON_FILE, SUMMARY_FILE
    from chaosbench.report.plots import TIMELINE_PNG
    from chaosbench.report.writer import PLOTS_DIR, REPORT_HTML, REPORT_MD

    assert set(manifest.DERIVED_FILES) == {REPORT_MD, REPORT_HTML, SUMMARY_FILE, COMPARISON_FILE}
    assert manifest.DERIVED_DIRS == (PLOTS_DIR,)
    assert manifest.DERIVED_RUN_FILES == (TIMELINE_PNG,)


def test_checkpoint_dirs_are_the_run_dirs(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    run.ckpt_backing.mkdir()
    assert sorted(d.name for d in run.checkpoint_dirs()) == sorted(manifest.CHECKPOINT_DIRS)
    (run.ckpt_backing / "step_1").mkdir()
    rel = f"{tmp_path.parent.name}/{tmp_path.name}/ckpt-backing/step_1/x.pt"
    assert manifest._section(rel) == "checkpoints"
