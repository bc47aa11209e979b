"""The typed timeline: one model per event kind, validated when written (the probe's standard-library check, the
harness's full models) and when read (the file and the line of an unknown kind or a malformed field), the
standard-library table and the docs pages' tables generated from the models and the metric docs."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import re
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from chaosbench import docgen
from chaosbench.analysis.metric_docs import TABLES, expand, metric_docs
from chaosbench.analysis.metrics import RunMetrics
from chaosbench.errors import ChaosbenchError, InvalidEvent, MalformedEvent, UnknownEventKind
from chaosbench.frameworks.base import LogPattern, LogWatcher
from chaosbench.probe import Probe
from chaosbench.signatures import RANK_ERROR_SIGNATURES
from chaosbench.timeline import (
    TIMELINE_VERSION,
    EventKind,
    TimelineFollower,
    TimelineWriter,
    kinds,
    read_events,
)
from chaosbench.timeline.events import COMMON_FIELDS, parse_lines
from chaosbench.timeline.schema import (
    MODELS,
    RankError,
    check_fields_declared,
    check_obj,
    events_json_schema,
    harness_writer,
    stdlib_table,
    typed_fields,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "timelines"
PACKAGE = Path(__file__).resolve().parent.parent.parent / "chaosbench"


def _line(kind: str, **fields: object) -> str:
    return json.dumps({"t_ns": 1, "kind": kind, "src": "harness", "host": "h", **fields}) + "\n"


# --------------------------------------------------------------------------------------------------- the models
def test_every_kind_has_one_documented_model() -> None:
    assert list(MODELS) == list(EventKind)
    for kind, m in MODELS.items():
        assert m.KIND is kind and m.__doc__ and m.WRITERS, m.__name__
        for name, f in m.model_fields.items():
            assert f.description, f"{kind.value}.{name} has no description"


def test_the_standard_library_table_is_generated_from_the_models() -> None:
    assert kinds.FIELDS == stdlib_table()
    assert Path(kinds.__file__).read_text() == docgen.kinds_module()
    assert set(kinds.FIELDS) == {k.value for k in EventKind}


def test_rank_error_signatures_are_the_ones_the_harness_watches_for() -> None:
    literal = RankError.model_fields["signature"].annotation
    assert set(typing.get_args(literal)) == set(RANK_ERROR_SIGNATURES)


def test_the_json_schema_names_every_kind() -> None:
    schema = events_json_schema()
    consts = {
        schema["$defs"][ref["$ref"].split("/")[-1]]["properties"]["kind"]["const"] for ref in schema["oneOf"]
    }
    assert consts == {k.value for k in EventKind}


# --------------------------------------------------------------------------------------- write side, in ranks
def test_the_probe_refuses_an_unknown_kind(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    probe = Probe(str(p), rank=1)
    with pytest.raises(UnknownEventKind) as exc:
        probe.emit("stepp", step=1)
    assert isinstance(exc.value, ChaosbenchError)
    assert exc.value.kind == "stepp" and exc.value.path == str(p) and exc.value.line is None
    probe.close()
    assert p.read_text() == ""  # nothing written


@pytest.mark.parametrize(
    ("kind", "fields", "field"),
    [
        ("ckpt_load_failed", {"step": 3, "path": "c"}, "error"),  # required, missing
        ("rank_start", {"pid": "123", "world_size": 2}, "pid"),  # of the wrong JSON type
        ("step", {"step": True}, "step"),  # a bool is no int
        ("step", {"step": 1, "lose": 0.5}, "lose"),  # a field its model does not declare
    ],
)
def test_the_probe_refuses_a_missing_or_ill_typed_field(
    tmp_path: Path, kind: str, fields: dict[str, object], field: str
) -> None:
    p = tmp_path / "events.jsonl"
    probe = Probe(str(p), rank=0)
    with pytest.raises(MalformedEvent) as exc:
        probe.emit(kind, **fields)
    assert exc.value.kind == kind and exc.value.field == field and exc.value.path == str(p)
    probe.step(1, 0.5, duration_s=0.1)  # a valid one still goes through
    probe.close()
    assert [e.kind for e in read_events(p)] == ["step"]


def test_the_probe_and_the_command_shim_check_without_pydantic() -> None:
    code = (
        "import sys; import chaosbench.probe, chaosbench.launchers.command, chaosbench.launchers.nvrx; "
        "sys.exit('pydantic' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


# ------------------------------------------------------------------------------------ write side, the harness
def test_the_harness_writer_refuses_what_only_the_full_model_knows(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    with harness_writer(p) as w:
        with pytest.raises(
            MalformedEvent
        ) as exc:  # a value outside the model's set (the table only knows str)
            w.emit("run_end", outcome="finished")
        assert exc.value.field == "outcome" and exc.value.kind == "run_end"
        with pytest.raises(MalformedEvent) as exc:  # a nested type
            w.emit("framework_info", framework="x", timeout_problems=[1])
        assert exc.value.field == "timeout_problems"
        with pytest.raises(MalformedEvent) as exc:
            w.emit("detect", framework="x", blame_rnak=1)
        assert exc.value.field == "blame_rnak"
        with pytest.raises(UnknownEventKind):
            w.emit("detected", framework="x")
        w.emit("run_end", outcome="completed", reason="")
    assert [e.kind for e in read_events(p)] == ["run_end"]


def test_the_default_writer_checks_too(tmp_path: Path) -> None:
    with TimelineWriter(tmp_path / "events.jsonl") as w, pytest.raises(MalformedEvent) as exc:
        w.emit("teardown_begin")
    assert exc.value.field == "reason"


# -------------------------------------------------------------------------------------------------- read side
def _timeline(tmp_path: Path, *lines: str, version: int | None = TIMELINE_VERSION) -> Path:
    p = tmp_path / "events.jsonl"
    start = _line("run_start", scenario="fw/x", **({} if version is None else {"timeline_version": version}))
    p.write_text(start + "".join(lines))
    return p


def test_read_events_names_the_file_and_line_of_an_unknown_kind(tmp_path: Path) -> None:
    p = _timeline(tmp_path, _line("step", src="rank", rank=0, step=1), "\n", _line("stepp", step=2))
    with pytest.raises(UnknownEventKind) as exc:
        read_events(p)
    assert exc.value.path == str(p) and exc.value.line == 4 and exc.value.kind == "stepp"
    assert str(exc.value).startswith(f"{p}:4: event 'stepp'")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (_line("step", src="rank", rank=0, step="2"), "step"),
        (_line("step", src="rank", rank=0), "step"),
        (_line("step", src="rank", rank=0, step=2, pad="x"), "pad"),
        (_line("restart", framework="f", attempts_left="3"), "attempts_left"),
        (_line("node_start", node="node1", reason="rebooted"), "reason"),
        (_line("step", src="ranks", rank=0, step=2), "src"),
    ],
)
def test_read_events_names_the_file_and_line_of_a_malformed_field(
    tmp_path: Path, line: str, field: str
) -> None:
    p = _timeline(tmp_path, _line("step", src="rank", rank=0, step=1), line)
    with pytest.raises(MalformedEvent) as exc:
        read_events(p)
    assert exc.value.path == str(p) and exc.value.line == 3 and exc.value.field == field


def test_a_torn_last_line_is_skipped_a_torn_line_before_others_is_not(tmp_path: Path) -> None:
    p = _timeline(tmp_path, _line("step", src="rank", rank=0, step=1), '{"t_ns": 9, "kind": "st')
    assert [e.kind for e in read_events(p)] == ["run_start", "step"]
    p.write_text(p.read_text() + "\n" + _line("step", src="rank", rank=0, step=2))
    with pytest.raises(MalformedEvent) as exc:
        read_events(p)
    assert exc.value.line == 3


def test_lines_that_are_no_events(tmp_path: Path) -> None:
    for bad in (
        "[1, 2]\n",
        '{"kind": "run_end", "outcome": "completed"}\n',
        '{"t_ns": 1.5, "kind": "log", "line": ""}\n',
    ):
        with pytest.raises(MalformedEvent) as exc:
            parse_lines([_line("run_end", outcome="completed"), bad], "f.jsonl")
        assert exc.value.line == 2 and exc.value.path == "f.jsonl"


def test_a_timeline_of_an_older_chaosbench_is_read_as_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _timeline(
        tmp_path,
        _line("detect", framework="torchrun", exitcode="-9", local_rank="1"),
        _line("heartbeat_lost", rank=0),
        "not json\n",
        _line("run_end", outcome="completed"),
        version=None,
    )
    with caplog.at_level(logging.WARNING, logger="chaosbench.timeline"):
        ev = read_events(p)
    assert [e.kind for e in ev] == ["run_start", "detect", "heartbeat_lost", "run_end"]
    assert ev[1]["exitcode"] == "-9"  # kept as written
    assert "2 event(s) do not match" in caplog.text
    with pytest.raises(MalformedEvent):
        read_events(p, strict=True)


def test_the_follower_hands_on_valid_events_and_keeps_the_errors(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    p.write_text(_line("run_start") + _line("stepp") + _line("run_end", outcome="completed"))
    seen: list[str] = []
    f = TimelineFollower(p, poll_s=0.002)
    f.subscribe(lambda e: seen.append(e.kind))
    f.start()
    deadline = time.monotonic() + 2
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    f.stop()
    assert seen == ["run_start", "run_end"]
    assert [(type(e), getattr(e, "line", None)) for e in f.errors] == [(UnknownEventKind, 2)]


# -------------------------------------------------------------------------------------------- log patterns
def _log_patterns() -> list[tuple[str, LogPattern]]:
    """Every ``LogPattern(...)`` written in the package, evaluated in its module (the frameworks' lists and the
    ones made inside a plan)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "LogPattern"
        ]
        if not calls:
            continue
        mod = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for call in calls:
            pattern = eval(compile(ast.Expression(call), str(path), "eval"), vars(mod))  # noqa: S307 - our own code
            out.append((f"{path.name}:{call.lineno}", pattern))
    return out


def test_every_framework_log_pattern_declares_its_fields(tmp_path: Path) -> None:
    patterns = _log_patterns()
    assert len(patterns) >= 10
    for where, p in patterns:
        check_fields_declared(p.kind, re.compile(p.regex).groupindex, where)
    LogWatcher("fw", [p for _, p in patterns], TimelineWriter(tmp_path / "events.jsonl"))


def test_a_pattern_with_an_undeclared_group_is_refused_when_the_watcher_is_made(tmp_path: Path) -> None:
    with pytest.raises(MalformedEvent) as exc:
        LogWatcher(
            "fw", [LogPattern("detect", r"lost (?P<lost_rank>\d+)")], TimelineWriter(tmp_path / "e.jsonl")
        )
    assert exc.value.field == "lost_rank"
    with pytest.raises(UnknownEventKind):
        LogWatcher("fw", [LogPattern("detection", r"lost")], TimelineWriter(tmp_path / "e.jsonl"))


def test_log_pattern_groups_are_typed_by_the_model() -> None:
    assert typed_fields(
        "detect", {"exitcode": "-9", "local_rank": "1", "open_s": "2.5", "signal": "SIGTERM"}
    ) == {"exitcode": -9, "local_rank": 1, "open_s": 2.5, "signal": "SIGTERM"}
    with pytest.raises(MalformedEvent):
        typed_fields("detect", {"heartbeat": "final"})


# ------------------------------------------------------------------------------------------ real timelines
def test_real_timelines_validate_entirely() -> None:
    """Timelines of real runs are valid to the last line: tests/fixtures/timelines, copied from runs of
    tests/integration (test_recovery, test_command_workload, test_torchft, test_fault_catalog, test_serving,
    test_process_faults, test_elastic) under timeline version 1."""
    files = sorted(FIXTURES.glob("*.jsonl"))
    assert files
    kinds_seen: set[str] = set()
    for f in files:
        ev = read_events(f, strict=True)
        assert ev and ev[0].kind == "run_start" and ev[0]["timeline_version"] == TIMELINE_VERSION, f
        kinds_seen |= {e.kind for e in ev}
        for n, raw in enumerate(f.read_text().splitlines(), 1):
            check_obj(json.loads(raw), str(f), n)
    assert {
        "step",
        "detect",
        "restart",
        "fault_inject",
        "ckpt_save_end",
        "quorum",
        "heal_end",
        "rendezvous",
        "preempt_save",
        "load_window",
        "balancer_down",
        "log",
        "step_counting",
        "rank_exit",
    } <= kinds_seen


# -------------------------------------------------------------------------------------- the generated tables
def test_docs_tables_are_what_the_generator_gives() -> None:
    assert set(docgen.PAGES) == set(docgen.REGIONS)
    assert docgen.missing_regions() == []
    found = [name for page in docgen.pages() for name in docgen.regions(page.read_text())]
    assert sorted(found) == sorted(docgen.REGIONS), "each region once, in the page PAGES names"
    for page in docgen.pages():
        text = page.read_text()
        assert docgen.render_page(text) == text, f"{page} is stale: run python -m chaosbench.docgen --write"
    assert docgen.stale() == []


def test_reference_pages_name_every_builtin_plugin_and_command() -> None:
    from chaosbench.cli import build_parser
    from chaosbench.registry import FRAMEWORKS, INJECTORS

    injectors = docgen.injectors_reference()
    assert all(f"### `{n}`" in injectors for n in INJECTORS.builtins())
    frameworks = docgen.frameworks_reference()
    assert all(f"### `{n}`" in frameworks for n in FRAMEWORKS.builtins())
    sub = next(a for a in build_parser()._actions if a.choices and "run" in a.choices)
    cli = docgen.cli_reference()
    assert all(f"### `chaosbench {n}`" in cli for n in sub.choices)


def test_every_run_metrics_field_has_a_documented_row() -> None:
    fields = list(RunMetrics.__dataclass_fields__)
    documented = metric_docs()
    assert [f for f in fields if f not in documented] == [], "RunMetrics fields without a row in metric_docs"
    assert [f for f in documented if f not in fields] == [], "rows naming fields RunMetrics does not have"
    for rows in TABLES.values():
        for row in rows:
            assert row.fields and row.meaning, row


def test_brace_expansion() -> None:
    assert expand("latency_p{50,99}_{before,after}_ms") == [
        "latency_p50_before_ms",
        "latency_p50_after_ms",
        "latency_p99_before_ms",
        "latency_p99_after_ms",
    ]


def test_render_page_replaces_only_the_regions() -> None:
    text = "a\n<!-- generated: metrics -->\nold\n<!-- end generated -->\nb\n"
    out = docgen.render_page(text)
    assert out.startswith("a\n<!-- generated: metrics -->\n\n| metric | meaning |") and out.endswith(
        "\n\n<!-- end generated -->\nb\n"
    )
    with pytest.raises(ValueError):
        docgen.render_page("<!-- generated: nothing -->\n<!-- end generated -->")
    with pytest.raises(ValueError):
        docgen.render_page("<!-- generated: events -->\n")


def test_invalid_event_errors_carry_their_context() -> None:
    exc = MalformedEvent("step", "required field 'step' is missing", path="e.jsonl", line=3, field="step")
    assert isinstance(exc, InvalidEvent) and (exc.kind, exc.path, exc.line, exc.field) == (
        "step",
        "e.jsonl",
        3,
        "step",
    )
    assert COMMON_FIELDS == ("t_ns", "kind", "src", "host")
