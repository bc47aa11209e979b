"""The timeline index answers exactly what a scan over the events would, and the harness cut and detection
episodes built on it."""

from __future__ import annotations

from chaosbench.analysis.attribution import detection_episodes, harness_cut
from chaosbench.analysis.timeline_index import TimelineIndex
from chaosbench.timeline import Event
from tests.unit.test_metrics import T0, S, restart_run


def _scan_first(events: list[Event], kind: str, after_ns: int | None = None, **match: object) -> Event | None:
    return next(
        (
            e
            for e in events
            if e.kind == kind
            and (after_ns is None or e.t_ns >= after_ns)
            and all(e.get(k) == v for k, v in match.items())
        ),
        None,
    )


def test_lookups_equal_scans() -> None:
    tl = restart_run()
    events = tl.sorted()
    ix = TimelineIndex(events)
    t_fault = T0 + int(tl.t_fault * S)  # type: ignore[attr-defined]
    for kind in {e.kind for e in events} | {"no_such_kind"}:
        assert ix.of(kind) == [e for e in events if e.kind == kind]
        assert ix.first(kind) is _scan_first(events, kind)
        assert ix.first(kind, after_ns=t_fault) is _scan_first(events, kind, t_fault)
        assert ix.last(kind) is next((e for e in reversed(events) if e.kind == kind), None)
        assert ix.count(kind) == sum(1 for e in events if e.kind == kind)
    assert ix.of("ckpt_save_begin", "step") == [e for e in events if e.kind in ("step", "ckpt_save_begin")]
    assert ix.first("rank_start", incarnation=1) is _scan_first(events, "rank_start", incarnation=1)
    assert ix.first("rank_start", incarnation=7) is None
    assert ix.incarnations() == [0, 1] and ix.max_incarnation == 1
    assert ix.rank_starts_of(1) == [e for e in events if e.kind == "rank_start" and e.get("incarnation") == 1]
    assert ix.world(1) == (2, None) and ix.world(None) == (None, None)
    final = ix.final
    assert final is not None and final.get("rank") == 0 and final.get("incarnation") == 1
    steps = ix.steps
    for t in (T0, t_fault, t_fault + 2 * S, T0 + 100 * S):
        assert steps.after(t) == sorted((ts, k) for k, ts in steps.t.items() if ts > t)
    resume_t, resume_key = steps.after(t_fault)[0]
    step = ix.step_event(resume_t, resume_key[0])
    assert step is not None and step.kind == "step" and step.t_ns == resume_t and step.get("incarnation") == 1
    assert not ix.per_step_commit


def test_harness_cut_and_episodes() -> None:
    tl = restart_run()
    assert harness_cut(TimelineIndex(tl.sorted()))[0].events == tl.sorted()
    t_end = tl.t_last + 1.0
    tl.add(t_end, "teardown_begin", reason="deadline")
    tl.add(t_end + 0.1, "detect", src="framework", framework="fw", reason="SIGTERM")
    tl.add(t_end + 0.2, "restart", src="framework", framework="fw")
    tl.add(t_end + 0.3, "proc_exit", rank=0, code=-15)
    whole = TimelineIndex(tl.sorted())
    cut, caused = harness_cut(whole)
    assert [e.kind for e in caused] == ["detect", "restart"]
    assert cut.last("proc_exit") is whole.last("proc_exit") and cut.has("teardown_begin")
    # the kill's detection, then the harness's: one episode each in the whole timeline, one before the cut
    assert detection_episodes(whole) == 2 and detection_episodes(cut) == 1
    fault = cut.first("fault_inject")
    assert fault is not None and detection_episodes(cut, before_ns=fault.t_ns) == 0
