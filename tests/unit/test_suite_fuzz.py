"""Suites generated from the suite schema (chaosbench.testing.suite_fuzz): every one is refused with one line
naming its file and line, or accepted with a dry-run that finishes within seconds; nothing else escapes.
The bounded version of ``benchmarks/suite_fuzz.py``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from chaosbench.cli import suite_schema
from chaosbench.testing.suite_fuzz import FuzzCase, check_suite_file, project_suites, suites
from tests.conftest import ROOT

SCHEMA = suite_schema()
BASES = project_suites(ROOT)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=suites(BASES, SCHEMA))
def test_every_generated_suite_is_refused_with_its_line_or_dry_runs_in_seconds(
    case: FuzzCase, tmp_path: Path
) -> None:
    path = tmp_path / "chaos" / "ci.yaml"  # a folder of its own: `use:` finds the shipped fault library
    path.parent.mkdir(exist_ok=True)
    path.write_text(case.text)
    verdict = check_suite_file(path, tmp_path / "out", limit_s=10.0)
    assert verdict.kind in ("refused", "accepted"), f"{case.how}: {verdict.detail}"
    assert verdict.elapsed_s < 10.0


def test_the_generated_suites_are_mostly_refused_and_some_accepted(tmp_path: Path) -> None:
    """The generator reaches both answers (a generator whose every suite is refused would test little)."""
    kinds: list[str] = []
    why: list[str] = []

    @settings(max_examples=30, deadline=None, derandomize=True, database=None)
    @given(case=suites(BASES, SCHEMA))
    def collect(case: FuzzCase) -> None:
        path = tmp_path / "chaos" / "ci.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(case.text)
        verdict = check_suite_file(path, tmp_path / "out")
        kinds.append(verdict.kind)
        why.append(f"{case.how}: {verdict.kind} {verdict.detail}")

    collect()
    assert len(kinds) >= 30 and set(kinds) == {"refused", "accepted"}, "\n".join(why)


def _suite(tmp_path: Path, text: str = "name: x\nmatrix: {frameworks: [none]}\n") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_the_check_tells_refused_accepted_and_escaped_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = check_suite_file(_suite(tmp_path), tmp_path / "out")
    assert (ok.kind, ok.detail) == ("accepted", "")
    bad = check_suite_file(
        _suite(tmp_path, "name: x\nseed: true\nmatrix: {frameworks: [none]}\n"), tmp_path / "out"
    )
    assert (bad.kind, bad.detail) == (
        "refused",
        f"{tmp_path / 's.yaml'}:2: seed: Input should be a valid integer (got True)",
    )
    import chaosbench.runner

    def boom(*_a: object, **_k: object) -> None:
        raise KeyError("plans")

    monkeypatch.setattr(chaosbench.runner.Runner, "plans", boom)
    crash = check_suite_file(_suite(tmp_path), tmp_path / "out")
    assert (crash.kind, crash.detail) == ("escaped", "KeyError: 'plans'")

    def hang(*_a: object, **_k: object) -> None:
        time.sleep(30)

    monkeypatch.setattr(chaosbench.runner.Runner, "plans", hang)
    slow = check_suite_file(_suite(tmp_path), tmp_path / "out", limit_s=0.5)
    assert (slow.kind, slow.detail) == ("escaped", "no answer within 0.5 s") and slow.elapsed_s < 5

    def no_line(*_a: object, **_k: object) -> None:
        from chaosbench.errors import SpecError

        raise SpecError("something is wrong somewhere")

    monkeypatch.setattr(chaosbench.runner.Runner, "plans", no_line)
    vague = check_suite_file(_suite(tmp_path), tmp_path / "out")
    assert (vague.kind, vague.detail) == (
        "escaped",
        "refused without file:line: something is wrong somewhere",
    )
