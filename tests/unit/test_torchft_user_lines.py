"""What chaosbench reads from a user's TorchFT script and its Lighthouse, on lines kept from a real run of
tests/fixtures/foreign/torchft_user.py (tests/fixtures/torchft/): replica ids of the user's own naming
(``train_ft_<group>``), torchft's Manager lines for commits, skipped steps and healing, and the Lighthouse's
heartbeat count falling to 0 as the groups leave at the end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from chaosbench.frameworks.torchft import _LighthouseWatch, replica_group_of
from chaosbench.launchers.output_parser import OutputParser, parse_all
from chaosbench.timeline import Event, TimelineWriter, read_events
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "torchft"
LIGHTHOUSE = (FIXTURES / "lighthouse_user_ids.log").read_text().splitlines()
MANAGER = (FIXTURES / "manager_user_script.log").read_text()
#: the workload's patterns for these lines (tests/integration/test_torchft_user_script.py, docs/recipes/torchft.md)
PATTERNS = {
    "step": r"INFO train_ft: step (?P<step>\d+) loss (?P<loss>[-+0-9.eE]+|nan|inf) participants (?P<participants>\d+)",
    "step_skipped": r"- step (?P<step>\d+)\] should_commit=False .*errored=(?P<reason>.*)",
    "heal_begin": r"healing required, fetching checkpoint metadata from .* max_step=(?P<step>\d+)",
    "heal_end": r"- step (?P<step>\d+)\] Loaded state dict\.",
}


def test_a_replica_ids_group_is_its_trailing_digits_as_torchft_numbers_them() -> None:
    assert [replica_group_of(r) for r in ("chaosbench_1", "train_ft_0", "train_ddp_12", "spare")] == [
        1,
        0,
        12,
        "spare",
    ]


def _watch(
    tmp_path: Path, lines: list[str], events: list[Event], total_steps: int | None = 30
) -> list[Event]:
    path = tmp_path / "events.jsonl"
    watch = _LighthouseWatch("torchft", TimelineWriter(path, src="framework"), total_steps)
    lighthouse = SimpleNamespace(spec=SimpleNamespace(role="lighthouse"))
    for i, line in enumerate(lines):
        for ev in events:
            if ev.t_ns <= i:
                watch.on_event(ev)
        watch(lighthouse, "stderr", line, 1000 + i)  # type: ignore[arg-type]
    return read_events(path) if path.exists() else []


def test_the_lighthouse_quorum_of_a_users_groups_names_them_and_blames_the_one_left_out(
    tmp_path: Path,
) -> None:
    out = _watch(tmp_path, LIGHTHOUSE[:2], [])
    assert [(e.kind, e.get("replica_groups")) for e in out if e.kind == "quorum"] == [
        ("quorum", [0, 1]),
        ("quorum", [0]),
    ]
    detect = [e for e in out if e.kind == "detect"]
    assert (
        len(detect) == 1
        and detect[0].get("blame_groups") == [1]
        and detect[0].get("mechanism") == "quorum change"
    )


def test_groups_leaving_after_the_last_step_are_no_fault_even_without_an_end_line(tmp_path: Path) -> None:
    """The script prints nothing at its end: its last step line says the job is finishing. Before that, the same
    heartbeat count falling is a detection."""
    status = LIGHTHOUSE[2:]  # [1 heartbeating], then [0 heartbeating], as both groups exit
    lines = [LIGHTHOUSE[2].replace("[1 heartbeating]", "[2 heartbeating]"), *status]
    early = [Event(t_ns=0, kind="step", src="rank", data={"step": 29, "rank": 0})]
    assert len([e for e in _watch(tmp_path / "a", lines, early) if e.kind == "detect"]) == 2
    last = [Event(t_ns=0, kind="step", src="rank", data={"step": 30, "rank": 0})]
    assert [e for e in _watch(tmp_path / "b", lines, last) if e.kind == "detect"] == []


def test_torchfts_manager_lines_are_commits_a_skipped_step_and_a_heal() -> None:
    out = parse_all(OutputParser(PATTERNS, 1, per_step_commit=True), [(MANAGER.encode(), 5)])
    got = [
        (p.kind, p.fields.get("step"), p.fields.get("participants"), p.fields.get("committed"))
        for p in out
        if p.kind != "step_counting"
    ]
    # step 1 committed by 2 groups; "- step 11] should_commit=False": step 12 not committed, and the script's
    # "step 11" line after it is no commit; a heal to step 11
    assert got == [
        ("step", 1, 2, True),
        ("step_skipped", 12, None, None),
        ("heal_begin", 11, None, None),
        ("heal_end", 11, None, None),
    ]
    assert next(p for p in out if p.kind == "step_skipped").fields["reason"] == "None"
