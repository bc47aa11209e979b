"""A run that failed for a reason outside the system under test says why: a process that died before the job's
first step is named with its exit status and its first error line (issue 27, item 5)."""

from __future__ import annotations

import sys
from pathlib import Path

from chaosbench.analysis.metrics import compute_metrics
from chaosbench.frameworks.base import ProcErrorWatcher
from chaosbench.report.analysis import unusable_frameworks
from chaosbench.runtimes.base import ProcessSpec, RunInfo
from chaosbench.runtimes.local import LocalRuntime
from chaosbench.signatures import error_line
from chaosbench.timeline import TimelineWriter, read_events
from tests.helpers import OTLP
from tests.unit.test_metrics import TL


def _lighthouse_died(printed: str | None) -> TL:
    """A TorchFT control whose Lighthouse exited 1 at once; the ranks never stepped; the job failed."""
    tl = TL(control=True)
    tl.events[0].data["framework"] = "torchft"
    tl.add(0.05, "proc_start", proc="lighthouse", pid=4000, role="lighthouse")
    for r in range(2):
        tl.add(0.06, "proc_start", proc=f"rank{r}", pid=4001 + r, role="rank")
    if printed is not None:
        tl.add(
            0.40, "proc_error", proc="lighthouse", pid=4000, role="lighthouse", stream="stderr", line=printed
        )
    tl.add(0.41, "proc_exit", proc="lighthouse", pid=4000, returncode=1, role="lighthouse")
    tl.add(0.50, "teardown_begin", reason="job ended")
    for r in range(2):
        tl.add(0.60, "proc_exit", proc=f"rank{r}", pid=4001 + r, returncode=-15, role="rank")
    tl.add(0.70, "run_end", outcome="failed")
    return tl


def test_a_helper_that_died_at_start_up_is_named_with_its_first_error_line() -> None:
    m = compute_metrics(_lighthouse_died(OTLP).sorted(), total_steps=30)
    why = f"'lighthouse' exited 1 before the job's first step: {OTLP}"
    assert m.startup_failure == why
    assert m.verdict == f"control failed (failed); {why}"
    # the report's unusable row carries it (the control's verdict)
    row = {**m.to_dict(), "framework": "torchft"}
    assert unusable_frameworks([row]) == {
        "torchft": f"its control run did not complete (control failed (failed); {why})"
    }


def test_a_process_that_printed_no_error_line_is_still_named() -> None:
    m = compute_metrics(_lighthouse_died(None).sorted(), total_steps=30)
    assert m.startup_failure == (
        "'lighthouse' exited 1 before the job's first step, with no error line in its "
        "output (logs/lighthouse.err)"
    )


def test_exits_after_the_first_step_a_fault_or_the_teardown_or_by_a_signal_are_not_start_up_failures() -> (
    None
):
    # a rank that exits 1 once the job stepped: the system under test's business (or the fault's)
    tl = TL(control=True).incarnation(0, 0.1, 1, 5)
    tl.add(tl.t_last + 0.1, "proc_exit", proc="rank1", pid=101, returncode=1, role="rank")
    assert compute_metrics(tl.sorted()).startup_failure is None
    # killed by a signal before the first step: a kill, not a failure to start
    tl = TL(control=True)
    tl.add(0.2, "proc_exit", proc="rank1", pid=101, returncode=-9, role="rank")
    assert compute_metrics(tl.sorted()).startup_failure is None
    # exited 1 after a fault before the first step (an at-time trigger), or after the harness's teardown began
    for first in ("fault_inject", "teardown_begin"):
        tl = TL()
        if first == "fault_inject":
            tl.add(0.1, "fault_inject", src="injector", fault="kill", injector="kill", target=[{"rank": 1}])
        else:
            tl.add(0.1, "teardown_begin", reason="deadline")
        tl.add(0.2, "proc_exit", proc="rank0", pid=100, returncode=1, role="rank")
        assert compute_metrics(tl.sorted()).startup_failure is None, first


def test_error_lines() -> None:
    said = [
        OTLP,
        "[rank0]: RuntimeError: boom",
        "KeyboardInterrupt",
        "error: bad flag",
        "FATAL: no such file",
        "thread 'main' panicked at src/lighthouse.rs:10",
        "torch.distributed.DistStoreError: timed out",
    ]
    not_said = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "errors: 0",
        "INFO step 3 Error: none",
        "ErrorCount: 3",
    ]
    assert [error_line(s) for s in said] == [True] * len(said)
    assert [error_line(s) for s in not_said] == [False] * len(not_said)


def test_the_harness_records_a_real_processs_first_error_line(tmp_path: Path) -> None:
    """A real process failing at import: its traceback's exception line is its ``proc_error`` (the first only)."""
    timeline = TimelineWriter(tmp_path / "events.jsonl")
    rt = LocalRuntime(RunInfo("run-1", tmp_path, timeline), LocalRuntime.Options())
    rt.line_observers.append(ProcErrorWatcher(timeline))
    code = (
        "import sys; print('error: first', file=sys.stderr); import opentelemetry.exporter.no_such_module_xyz"
    )
    try:
        h = rt.start(ProcessSpec("helper", [sys.executable, "-c", code], role="lighthouse"))
        assert h.exited.wait(30)
    finally:
        rt.cleanup(grace_s=1)
    timeline.close()
    errors = [e for e in read_events(tmp_path / "events.jsonl") if e.kind == "proc_error"]
    assert [(e["proc"], e["pid"], e["role"], e["stream"], e["line"]) for e in errors] == [
        ("helper", h.pid, "lighthouse", "stderr", "error: first")
    ]
