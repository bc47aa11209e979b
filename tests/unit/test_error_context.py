"""The errors of the tree in chaosbench/errors.py carry their context as fields: each test makes the real call
fail the way a user meets it and reads the fields (and the one line the CLI prints), not only the text."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from chaosbench.analysis.baseline import load_rows, save_baseline
from chaosbench.analysis.results import load_results
from chaosbench.cli import EXIT_HARNESS, EXIT_INPUT, main
from chaosbench.errors import EngineError, ResultsError, SpecError
from chaosbench.report.writer import write_report
from chaosbench.runtimes.base import ProcessSpec, RunInfo
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.runtimes.slurm.states import JobState, job_state
from chaosbench.timeline import TimelineWriter


def test_result_sets_that_are_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ResultsError) as err:
        load_rows(missing)
    assert (err.value.path, err.value.problem) == (
        str(missing),
        "no such result set (a suite results directory or a results CSV)",
    )
    with pytest.raises(ResultsError) as err:
        save_baseline(tmp_path, tmp_path / "baseline.csv")
    assert (err.value.path, err.value.problem) == (str(tmp_path), "no results.csv to save as a baseline")
    assert str(err.value) == f"{tmp_path}: no results.csv to save as a baseline"
    with pytest.raises(ResultsError) as err:
        load_results(tmp_path)
    assert err.value.path == str(tmp_path)
    assert str(err.value) == f"no results.parquet or results.csv in {tmp_path}"


def test_cli_prints_the_results_error_as_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == EXIT_HARNESS
    assert capsys.readouterr().err.strip().splitlines() == [
        f"chaosbench: error: {tmp_path / 'nope'}: no such results directory"
    ]
    assert main(["report", str(tmp_path)]) == EXIT_HARNESS
    assert "no chaosbench results found (expected suite.json)" in capsys.readouterr().err


def test_an_unknown_plots_mode_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        write_report(tmp_path, pd.DataFrame(), plots="some")
    assert (err.value.obj, err.value.file, err.value.line) == ("plots='some'", None, None)
    assert err.value.problem.startswith("expected one of ")


def test_a_local_process_that_cannot_start_is_an_engine_error(tmp_path: Path) -> None:
    rt = LocalRuntime(RunInfo("err-ctx", tmp_path, TimelineWriter(tmp_path / "events.jsonl")))
    try:
        with pytest.raises(EngineError) as err:
            rt.start(ProcessSpec("ghost", [str(tmp_path / "no-such-binary")]))
        assert err.value.engine == "local"
        assert err.value.problem == (
            f"cannot start process 'ghost' ({tmp_path / 'no-such-binary'}): No such file or directory"
        )
    finally:
        rt.cleanup(grace_s=1)


def test_an_unknown_slurm_job_state_is_never_guessed() -> None:
    assert job_state("CANCELLED by 0") is JobState.CANCELLED
    with pytest.raises(EngineError) as err:
        job_state("WEIRD")
    assert (err.value.engine, err.value.problem) == ("slurm", "unknown Slurm job state 'WEIRD'")


def test_the_cli_exit_code_tells_bad_input_from_a_harness_error(tmp_path: Path) -> None:
    # bad input (a suite that does not parse) exits 2, a results directory that is not there exits 1
    suite = tmp_path / "bad.yaml"
    suite.write_text("name: bad\nmatrix: [\n")
    assert main(["run", str(suite), "--dry-run"]) == EXIT_INPUT
    assert main(["verify", str(tmp_path / "nope")]) == EXIT_HARNESS
