"""The command shim's reading of a user's script (chaosbench.launchers.output_parser): progress-bar redraws,
0- and 1-based counters, counted loss lines, each write read with its own stamp. The outputs are written the
way the real trainers write them (tqdm's ``\\r`` redraws as the Hugging Face Trainer draws them on a resume,
Lightning's ``global_step`` from 0, a tutorial's epoch header)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaosbench.launchers.output_parser import OutputParser, earlier_step_base, parse_all

BAR = "\r{pct:3d}%|#####     | {n}/600 [00:32<00:28,  9.95it/s]"


def steps(parsed) -> list[tuple[int, int]]:
    return [(p.fields["step"], p.t_ns) for p in parsed if p.kind == "step"]


def test_progress_bar_redraws_are_steps_once_and_a_resumed_bars_zero_is_none() -> None:
    """HF Trainer on a resume: the new bar draws 0/600 first, then jumps to the first step it completed (301)."""
    writes = [
        (BAR.format(pct=0, n=0).encode(), 10),
        (BAR.format(pct=50, n=301).encode(), 20),
        (BAR.format(pct=50, n=301).encode(), 25),  # redrawn in place: no new step
        (BAR.format(pct=51, n=305).encode(), 30),
        (b"\n{'loss': '5.3', 'epoch': '0.5'}\n", 40),
    ]
    out = parse_all(OutputParser({"progress": "tqdm"}), writes)
    # each redraw is read at the end of the write that carries it, with that write's stamp
    assert steps(out) == [(301, 20), (305, 30)]


def test_a_redraw_is_read_when_its_write_ends_not_when_the_next_begins() -> None:
    p = OutputParser({"progress": "tqdm"})
    assert steps(p.feed(BAR.format(pct=53, n=320).encode(), 7)) == [(320, 7)]  # the last draw before a kill
    assert p.end(9) == []


def test_zero_based_counter_is_detected_from_the_first_step_and_shifted() -> None:
    """Lightning prints global_step inside training_step: 0..N-1 for N steps."""
    lines = [f"global_step={i} train_loss=0.{i}\n".encode() for i in range(3)]
    out = parse_all(
        OutputParser({"step": r"global_step=(?P<step>\d+) train_loss=(?P<loss>[\d.]+)"}),
        [(b, i) for i, b in enumerate(lines)],
    )
    assert steps(out) == [(1, 0), (2, 1), (3, 2)]
    counting = [p for p in out if p.kind == "step_counting"]
    assert [c.fields for c in counting] == [{"base": 0, "how": "detected: the first step printed was 0"}]
    assert [p.fields["loss"] for p in out if p.kind == "step"] == [0.0, 0.1, 0.2]


def test_one_based_counter_and_a_declared_base() -> None:
    rx = {"step": r"step (?P<step>\d+)"}
    assert steps(parse_all(OutputParser(rx), [(b"step 1\nstep 2\n", 5)])) == [(1, 5), (2, 5)]
    # declared 0-based although the first line seen is 5 (a script that logs every 5th step from step 5)
    assert steps(parse_all(OutputParser(rx, step_base=0), [(b"step 5\n", 1)])) == [(6, 1)]
    # a later incarnation resumes at 20: it counts as the run's first incarnation did (0-based)
    later = parse_all(OutputParser(rx, earlier_base=0), [(b"step 20\n", 1)])
    assert steps(later) == [(21, 1)]
    assert next(p for p in later if p.kind == "step_counting").fields["base"] == 0


def test_an_epoch_header_repeated_by_every_line_of_the_same_step_counts_once() -> None:
    rx = {"step": r"\[GPU\d+\] Epoch (?P<step>\d+) \|"}
    out = parse_all(
        OutputParser(rx),
        [
            (b"[GPU0] Epoch 0 | Batchsize: 8 | Steps: 4\n", 1),
            (b"[GPU0] Epoch 0 | Batchsize: 8 | Steps: 4\n", 2),
            (b"[GPU0] Epoch 1 | Batchsize: 8 | Steps: 4\n", 3),
        ],
    )
    assert steps(out) == [(1, 1), (2, 3)]


def test_loss_lines_without_a_step_are_counted_beside_a_lagging_bar() -> None:
    """HF logs {'loss': ...} every logging_steps with no step; the bar beside it may lag a redraw behind."""
    rx = {"progress": "tqdm", "step": r"\{'loss': '(?P<loss>[\d.]+)'"}
    writes = [
        (BAR.format(pct=1, n=8).encode(), 1),
        (b"\n{'loss': '5.0'}\n", 2),  # the bar showed 8, not 10
        (BAR.format(pct=3, n=20).encode(), 3),
        (b"\n{'loss': '4.0'}\n", 4),  # the bar shows 20 first
        (b"{'loss': '3.0'}\n", 5),
    ]
    out = parse_all(OutputParser(rx, step_every=10), writes)
    assert [(p.fields["step"], p.fields["loss"]) for p in out if p.kind == "step"] == [
        (8, None),
        (10, 5.0),
        (20, None),
        (20, 4.0),
        (30, 3.0),
    ]


def test_a_counted_line_says_its_cadence_and_a_bar_or_numbered_line_does_not() -> None:
    """A counted loss line stands for the step_every steps up to it (the contamination check needs that: the
    first loss line of a fresh run is step 10, further in than the bar's redraws are apart)."""
    rx = {"progress": "tqdm", "step": r"\{'loss': '(?P<loss>[\d.]+)'"}
    out = parse_all(
        OutputParser(rx, step_every=10), [(b"{'loss': '5.0'}\n", 1), (BAR.format(pct=2, n=11).encode(), 2)]
    )
    assert [(p.fields["step"], p.fields.get("every")) for p in out if p.kind == "step"] == [
        (10, 10),
        (11, None),
    ]
    numbered = parse_all(OutputParser({"step": r"step (?P<step>\d+)"}, step_every=10), [(b"step 1\n", 1)])
    assert [p.fields.get("every") for p in numbered if p.kind == "step"] == [None]


def test_a_resumed_process_counts_its_loss_lines_from_where_its_bar_says_it_is() -> None:
    """HF resumed from checkpoint-50: the new bar draws 0/600, the first loss line (step 60) can come before the
    bar's next redraw, which jumps to the restored position: that loss line is no step 10 (seen in CI: lost 61
    instead of 20), the counting goes on from the bar's count."""
    rx = {"progress": "tqdm", "step": r"\{'loss': '(?P<loss>[\d.]+)'"}
    writes = [
        (BAR.format(pct=0, n=0).encode(), 1),
        (b"\n{'loss': '5.0'}\n", 2),  # step 60's line, bar still at 0
        (BAR.format(pct=10, n=62).encode(), 3),
        (b"\n{'loss': '4.0'}\n", 4),
    ]
    resumed = parse_all(OutputParser(rx, step_every=10, resumed=True), writes)
    assert [(p.fields["step"], p.fields["loss"]) for p in resumed if p.kind == "step"] == [
        (62, None),
        (70, 4.0),
    ]
    # the first incarnation starts at 0: its first loss line is step 10 whatever the bar shows
    first = parse_all(OutputParser(rx, step_every=10), writes)
    assert [p.fields["step"] for p in first if p.kind == "step"] == [10, 62, 70]


def test_counted_lines_start_after_the_position_a_resume_line_names() -> None:
    rx = {"step": r"loss (?P<loss>[\d.]+)", "ckpt_load_end": r"resumed at step (?P<step>\d+)"}
    out = parse_all(OutputParser(rx, step_every=10), [(b"resumed at step 300\nloss 1.0\nloss 0.9\n", 1)])
    assert [p.fields["step"] for p in out if p.kind == "step"] == [310, 320]
    assert [p.fields["step"] for p in out if p.kind == "ckpt_load_end"] == [300]


def test_a_checkpoint_or_closing_step_is_a_count_of_steps_done_never_shifted() -> None:
    rx = {
        "step": r"global_step=(?P<step>\d+)",
        "ckpt_save_end": r"saved step (?P<step>\d+)",
        "train_end": r"done after (?P<step>\d+) steps digest (?P<digest>\w+)",
    }
    out = parse_all(
        OutputParser(rx), [(b"global_step=0\nglobal_step=1\nsaved step 2\ndone after 2 steps digest ab\n", 1)]
    )
    assert [(p.kind, p.fields.get("step")) for p in out if p.kind != "step_counting"] == [
        ("step", 1),
        ("step", 2),
        ("ckpt_save_end", 2),
        ("train_end", 2),
    ]
    assert next(p for p in out if p.kind == "train_end").fields["digest"] == "ab"


def test_a_line_split_over_writes_and_utf8_split_over_writes() -> None:
    rx = {"progress": "tqdm", "step": r"step (?P<step>\d+) done"}
    bar = BAR.replace("#", "█").format(pct=1, n=3).encode()
    writes = [(b"step 1", 1), (b" done\n", 2), (bar[:8], 3), (bar[8:], 4)]
    assert steps(parse_all(OutputParser(rx), writes)) == [(1, 2), (3, 4)]


@pytest.mark.parametrize("first", [0, 1])
def test_the_run_counting_is_found_on_the_timeline(tmp_path: Path, first: int) -> None:
    events = tmp_path / "events.jsonl"
    assert earlier_step_base(str(events)) is None  # no timeline yet
    events.write_text(
        json.dumps({"t_ns": 1, "kind": "step", "src": "rank", "rank": 0, "step": 3})
        + "\n"
        + json.dumps(
            {"t_ns": 2, "kind": "step_counting", "src": "rank", "rank": 0, "base": first, "how": "x"}
        )
        + "\n"
    )
    assert earlier_step_base(str(events)) == first
