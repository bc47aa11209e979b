"""What a real run's own records say happened, read directly in the integration tests (not through the metrics):
the steps a restart made the job do again and the boundaries of a recovery's four stages, so the tests can
assert exact values instead of ranges or sums that hold by construction."""

from __future__ import annotations

from typing import Any

from chaosbench.timeline import Event
from tests.helpers import events_of


def _inc(e: Event) -> int:
    return int(e.get("incarnation", 0))


def lost_steps_by_the_logs(m: Any) -> int:
    """Steps done before the first fault and done again after it, from the ranks' own step and checkpoint-load
    lines: the faulted incarnation's last step that every rank logging steps had logged (a step one rank still
    finished after the fault while its peer was dead is no job step; one both finished, in flight, is), less the
    step the incarnation that resumed loaded (or started from: its first step less one)."""
    events = events_of(m)
    fault = next(e for e in events if e.kind == "fault_inject")
    fault_inc = max((_inc(e) for e in events if e.kind == "rank_start" and e.t_ns <= fault.t_ns), default=0)
    new = next(e for e in events if e.kind == "rank_start" and e.t_ns > fault.t_ns and _inc(e) > fault_inc)
    last: dict[int, int] = {}
    for e in events:
        if e.kind == "step" and e.src == "rank" and _inc(e) == fault_inc and e.t_ns < new.t_ns:
            last[int(e["rank"])] = max(last.get(int(e["rank"]), 0), int(e["step"]))
    done = min(last.values())
    loads = [
        int(e["step"])
        for e in events
        if e.kind == "ckpt_load_end" and e.src == "rank" and _inc(e) == _inc(new)
    ]
    first = min(
        int(e["step"]) for e in events if e.kind == "step" and e.src == "rank" and _inc(e) == _inc(new)
    )
    restored = min([first - 1, *loads[-1:]])
    return max(0, done - restored)


def stage_ends_by_the_timeline(m: Any) -> dict[str, float]:
    """The four stages' boundaries (seconds after the fault took effect) of a recovery by restart, read from the
    timeline: the first detection, the last rank start of the incarnation that resumed, the end of its checkpoint
    load, and its first step beyond the step reached at the fault."""
    events = events_of(m)
    fault = next(e for e in events if e.kind == "fault_inject")
    tf = int(fault.get("effect_t_ns") or fault.t_ns)
    fault_inc = max((_inc(e) for e in events if e.kind == "rank_start" and e.t_ns <= tf), default=0)
    detect = next(e for e in events if e.kind == "detect" and e.t_ns >= tf)
    new_inc = min(_inc(e) for e in events if e.kind == "rank_start" and e.t_ns > tf and _inc(e) > fault_inc)
    starts = [e.t_ns for e in events if e.kind == "rank_start" and _inc(e) == new_inc]
    loads = [e.t_ns for e in events if e.kind == "ckpt_load_end" and _inc(e) == new_inc]
    reached = 0
    for r in {int(e["rank"]) for e in events if e.kind == "step" and _inc(e) == fault_inc}:
        mine = [
            int(e["step"])
            for e in events
            if e.kind == "step" and _inc(e) == fault_inc and int(e["rank"]) == r and e.t_ns < min(starts)
        ]
        reached = min(reached, max(mine)) if reached else max(mine)
    beyond: dict[int, int] = {}
    for e in events:
        if e.kind == "step" and _inc(e) == new_inc and int(e["step"]) > reached:
            beyond.setdefault(int(e["rank"]), e.t_ns)
    return {
        "detect": (detect.t_ns - tf) / 1e9,
        "reschedule": (max(starts) - tf) / 1e9,
        "reshard_or_replace": (max(loads) - tf) / 1e9,
        "resume": (max(beyond.values()) - tf) / 1e9,
    }


def assert_stages_match_the_timeline(m: Any) -> None:
    """The metrics' four stages, each ending where the timeline says it does (not only adding up)."""
    ends = stage_ends_by_the_timeline(m)
    got = [m.stage_detect_s, m.stage_reschedule_s, m.stage_reshard_or_replace_s, m.stage_resume_s]
    assert all(v is not None for v in got), (got, m.missing)
    cumulative = 0.0
    for name, value in zip(("detect", "reschedule", "reshard_or_replace", "resume"), got, strict=True):
        cumulative += value
        assert abs(cumulative - ends[name]) < 1e-6, (name, cumulative, ends)
    assert abs(m.time_to_recover_s - ends["resume"]) < 1e-6


def assert_ray_blamed_by_the_logs(
    m: Any, events: list[Event], fault: Event, killed_pid: int, rank: int
) -> None:
    """Ray Train's first reaction to a killed worker, as its logs ordered it. Two lines report it: the raylet's
    (``A worker died ... Worker PID: N``, which the adapter turns into a detection blaming that pid's rank) and
    the controller's ``[FailurePolicy] RETRY`` (a detection and the restart, naming nobody). Ray forwards the
    raylet's line to the driver through its log monitor, so either may reach the timeline first (measured: the
    raylet's 0.02 s after the kill and the controller's 0.09 s on an idle machine; 0.11 s and 0.07 s in a loaded
    CI run). ``blame`` judges the detections up to the first restart: ``correct`` (``rank N``) when the raylet's
    line came by then, else ``none``."""
    raylet = [e for e in events if e.kind == "detect" and e.t_ns >= fault.t_ns and e.get("pid") is not None]
    assert [(e.get("pid"), e.get("blame_rank")) for e in raylet] == [(killed_pid, rank)]
    restart = next(e for e in events if e.kind == "restart" and e.t_ns >= fault.t_ns)
    if raylet[0].t_ns <= restart.t_ns:
        assert (m.blame, m.blamed) == ("correct", f"rank {rank}")
    else:
        assert (m.blame, m.blamed) == ("none", None)
    assert m.detected


def assert_torchrun_blamed_by_the_logs(m: Any, rank: int) -> None:
    """torchrun's first reaction to a killed rank ``rank``, as torch elastic decides whom to name. Its agent polls
    its workers every monitor interval and, once one has failed, names the failure with the smallest timestamp in
    whole seconds (``ProcessFailure``: the poll's ``time.time()``, or an error file's), ties going to the failure
    it recorded first, in local-rank order within one poll. So the killed rank is named unless a peer, finding
    the connection closed (gloo's "Connection closed by peer"), exited with an error of its own before that poll
    saw the kill: then the peer is named, and blame is ``wrong`` (measured in a loaded CI run: trainer_style's
    rank 0 exited with 1 inside torchrun's 0.1 s poll after rank 1's SIGKILL, and torchrun named local_rank 0;
    idle, the agent's SIGTERM ends rank 0 first, -15, and it names the killed rank)."""
    events = events_of(m)
    fault = next(e for e in events if e.kind == "fault_inject")
    fault_inc = max((_inc(e) for e in events if e.kind == "rank_start" and e.t_ns <= fault.t_ns), default=0)
    said = next(
        e for e in events if e.kind == "detect" and e.t_ns >= fault.t_ns and e.get("local_rank") is not None
    )
    named = next(
        int(e["rank"])
        for e in events
        if e.kind == "rank_start" and _inc(e) == fault_inc and int(e["local_rank"]) == int(said["local_rank"])
    )
    assert m.detected and m.blamed == f"rank {named}", (m.blamed, said.get("line"))
    if named == rank:
        assert m.blame == "correct" and int(said["exitcode"]) == -9, (m.blame, said.get("line"))
        return
    own = next(
        e for e in events if e.kind == "rank_exit" and _inc(e) == fault_inc and int(e["rank"]) == named
    )
    assert int(own["returncode"]) > 0 and own.t_ns <= said.t_ns, (own.data, said.get("line"))
    assert int(said["exitcode"]) == int(own["returncode"]) and m.blame == "wrong", (m.blame, said.get("line"))
