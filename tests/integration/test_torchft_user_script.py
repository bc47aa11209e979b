"""A user's own TorchFT script (tests/fixtures/foreign/torchft_user.py: a ``torchft.Manager`` with its own
ProcessGroupGloo, torchft's DistributedDataParallel and Optimizer wrappers, its own log lines; no chaosbench
import) under the ``torchft`` adapter as a ``command`` workload: 2 replica groups x 1 rank, group 1's process
killed, and frozen, after step 10.

Every expected figure is read from the run's own logs, not from chaosbench's events (but for when the fault took
effect: the harness's record of its own action): the script's step lines
(the Manager's committed count) and torchft's Manager lines (``should_commit=False``: a step computed and
thrown away), the groups' torchrun lines (the worker's death and the restart, with their own stamps) and the
Lighthouse's (its quorums and how many groups it heard heartbeats from, with its own stamps); the final weights
the script saves.

The suite is the shipped suites/trainer-torchft.yaml (docs/recipes/torchft.md). The script runs with
``--min-replicas 2`` (no step commits without both groups), so whatever the machine's load, the survivor waits
for group 1 and the replacement heals from it (with 1, a replacement slow to start on a loaded machine found the
survivor finished and trained every step again alone). Measured here: 61-100 s with the machine shared (load
average 9-12); each run's figures differ with the load, the checks read each run's own logs.

Skipped when torchft is not importable, unless CHAOSBENCH_REQUIRE contains "torchft" (then failed).
"""

from __future__ import annotations

import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from chaosbench.analysis.metrics import RunMetrics
from tests.conftest import ROOT
from tests.helpers import events_of, require

pytestmark = pytest.mark.integration

STEPS = 30


def _torchft_problem() -> str | None:
    try:
        import torchft  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
        return (
            f"torchft not importable ({exc}); pip install --no-deps torchft==0.2.0 and its opentelemetry deps"
        )
    return None


require("torchft", _torchft_problem())


def _suite() -> str:
    """The shipped suite (the one docs/recipes/torchft.md shows), its script found from this checkout."""
    data = yaml.safe_load((ROOT / "suites" / "trainer-torchft.yaml").read_text())
    wl = data["defaults"]["workload"]
    wl["command"] = [
        sys.executable if a == "python" else a.replace("{suite_dir}/..", str(ROOT)) for a in wl["command"]
    ]
    assert wl["steps"] == STEPS
    return yaml.safe_dump(data, sort_keys=False)


#: the script's own lines: ``2026-12-05 07:32:55,159 INFO train_ft: step 12 loss 2.2274 participants 2``
STEP_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO train_ft: step (\d+) loss \S+ participants (\d+)",
    re.MULTILINE,
)
#: torchft's Manager: ``[train_ft_0:<uuid>/0 - step 11] should_commit=False ...``: step 12 was not committed
COMMIT_RE = re.compile(r"\[train_ft_\d+:[0-9a-f-]+/\d+ - step (\d+)\] should_commit=(True|False)")
SKIP_RE = re.compile(r"\[train_ft_\d+:[0-9a-f-]+/\d+ - step (\d+)\] should_commit=False")
HEAL_RE = re.compile(r"\[(train_ft_1:[0-9a-f-]+)/0 - step \d+\] healing required, .* max_step=(\d+)")
#: torchrun's (glog-style) lines: ``E1205 07:26:01.352000 15812 ...api.py:1002] failed (exitcode: -9) ...``
AGENT_RE = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*")
#: the Lighthouse's lines: ``2026-12-05T07:32:55.159 [INFO] [torchft::lighthouse] - ...``
LIGHTHOUSE_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+) ")
BEATING_RE = re.compile(r"Quorum status: .*\[(\d+) heartbeating\]")
#: ``Quorum! Quorum { quorum_id: 2, participants: [QuorumMember { replica_id: "train_ft_0:<uuid>", ..., step: 11,
#: ... }], created: Some(Timestamp { seconds: 1796455975, nanos: 159183162 }) }``: formed at that instant
QUORUM_RE = re.compile(
    r"Quorum! Quorum \{ quorum_id: (\d+), participants: \[(.*)\], created: Some\(Timestamp "
    r"\{ seconds: (\d+), nanos: (\d+) \}\)"
)
MEMBER_RE = re.compile(r'replica_id: "([^"]+)", .*?step: (\d+),')


def _log(m: RunMetrics, name: str) -> str:
    return (Path(str(m.run_dir)) / "logs" / name).read_text(errors="replace")


def _fault_s(m: RunMetrics) -> float:
    """When the fault took effect (the harness's record of its own action), in epoch seconds."""
    fault = next(e for e in events_of(m) if e.kind == "fault_inject")
    return int(fault.get("effect_t_ns") or fault.t_ns) / 1e9


def _step_lines(m: RunMetrics, group: int) -> list[tuple[float, int]]:
    """(stamp, committed step count) of a group's step lines, in order (a step that did not commit repeats one;
    the stamp is the script's own: this host's UTC clock, ms resolution)."""
    out = []
    for stamp, n, _ in STEP_RE.findall(_log(m, f"torchrun.g{group}.out")):
        t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp()
        out.append((t, int(n)))
    return out


def _steps(m: RunMetrics, group: int) -> list[int]:
    return [n for _, n in _step_lines(m, group)]


def _commits(m: RunMetrics, group: int) -> dict[int, float]:
    """step -> when the group committed it, by its own lines: torchft's ``- step N] should_commit=True`` and then
    the script's step line for N + 1 (stamped by the script). A step line after ``should_commit=False`` is no
    commit, even when its count moved (a replacement that healed to step 11 logs ``step 11`` without committing
    it)."""
    out: dict[int, float] = {}
    pending: int | None = None
    for line in _log(m, f"torchrun.g{group}.out").splitlines():
        c = COMMIT_RE.search(line)
        if c:
            pending = int(c.group(1)) + 1 if c.group(2) == "True" else None
            continue
        s = STEP_RE.match(line)
        if s and pending is not None and int(s.group(2)) == pending:
            t = datetime.strptime(s.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp()
            out.setdefault(pending, t)
            pending = None
    return out


def _job_step_after(m: RunMetrics, fault_s: float, reaction_s: float) -> tuple[int, float]:
    """The job's first step beyond the fault, by the groups' own lines: the first step index above the last one
    both groups had committed before the fault that both groups committed (with min_replica_size 2 every commit
    is both groups'; a step the killed group never committed, its replacement having healed past it, is none),
    done when the later of the two logged it, after the framework's first reaction."""
    g0, g1 = _commits(m, 0), _commits(m, 1)
    before = min(max((n for n, t in c.items() if t <= fault_s), default=0) for c in (g0, g1))
    return min(
        (n, max(g0[n], g1[n])) for n in set(g0) & set(g1) if n > before and max(g0[n], g1[n]) > reaction_s
    )


def _skipped(m: RunMetrics) -> set[int]:
    """The steps torchft's Manager said it did not commit, in either group: step N + 1 for ``- step N]``."""
    return {int(n) + 1 for g in (0, 1) for n in SKIP_RE.findall(_log(m, f"torchrun.g{g}.out"))}


def _agent_s(m: RunMetrics, group: int, text: str) -> list[float]:
    """The stamps (epoch s, ms resolution, this host's UTC clock) of the group's torchrun lines that contain ``text``."""
    year = datetime.fromtimestamp(_fault_s(m), tz=timezone.utc).year
    out = []
    for line in _log(m, f"torchrun.g{group}.err").splitlines():
        a = AGENT_RE.match(line)
        if a and text in line:
            mon, day, hh, mm, ss = a.groups()
            t = datetime(year, int(mon), int(day), int(hh), int(mm), tzinfo=timezone.utc).timestamp()
            out.append(t + float(ss))
    return out


def _beating(m: RunMetrics) -> list[tuple[float, int]]:
    """(stamp, replica groups heartbeating) of the Lighthouse's status lines."""
    out = []
    for line in _log(m, "lighthouse.err").splitlines():
        s, b = LIGHTHOUSE_RE.match(line), BEATING_RE.search(line)
        if s and b:
            out.append(
                (datetime.fromisoformat(s.group(1)).replace(tzinfo=timezone.utc).timestamp(), int(b.group(1)))
            )
    return out


def _quorums(m: RunMetrics) -> list[tuple[float, int, dict[str, int]]]:
    """(when formed, quorum id, {replica id: its committed steps}) of every quorum the Lighthouse handed out."""
    out = []
    for line in _log(m, "lighthouse.err").splitlines():
        q = QUORUM_RE.search(line)
        if q:
            members = {rid: int(step) for rid, step in MEMBER_RE.findall(q.group(2))}
            out.append((int(q.group(3)) + int(q.group(4)) / 1e9, int(q.group(1)), members))
    return out


def _final_weights(m: RunMetrics) -> bytes:
    """The weights replica group 0 saved at the end, as bytes."""
    import torch

    sd = torch.load(Path(str(m.run_dir)) / "work" / "model_final.pt", weights_only=True)
    return b"".join(sd[k].numpy().tobytes() for k in sorted(sd))


def test_users_torchft_script_under_kill_and_hang(run_suite) -> None:
    res = run_suite(_suite())
    check_against_the_logs(res["torchft/control#0"], res["torchft/kill#0"], res["torchft/hang#0"])


def check_against_the_logs(ctl: RunMetrics, kill: RunMetrics, hang: RunMetrics) -> None:
    """Every figure of the three runs against what their own logs say happened."""

    # the control: both groups logged every step once, committed together, nothing skipped, nobody restarted
    assert ctl.outcome == "completed" and ctl.clean and ctl.false_detections == 0, ctl.verdict
    assert _steps(ctl, 0) == _steps(ctl, 1) == list(range(1, STEPS + 1)) and ctl.final_step == STEPS
    assert not _skipped(ctl) and ctl.restart_count == 0
    control_weights = _final_weights(ctl)

    # the first reaction to each fault, by the frameworks' own lines: group 1's torchrun saw its worker die (kill);
    # the Lighthouse stopped hearing group 1's heartbeats (hang)
    reacted = {
        "kill": _agent_s(kill, 1, "failed (exitcode: -9)")[0],  # (group 0's saw nothing die: below)
        "hang": next(t for t, beating in _beating(hang) if t > _fault_s(hang) and beating < 2),
    }
    for m in (kill, hang):
        fault = _fault_s(m)
        skipped = _skipped(m)
        # recovered: both groups' scripts logged the last step (group 1's replacement too, after a kill)
        assert m.outcome == "recovered", (m.verdict, m.missing)
        assert _steps(m, 0)[-1] == _steps(m, 1)[-1] == STEPS == m.final_step
        # nothing rolls back under TorchFT: the Manager's count never went back; the lost work is the steps
        # computed and not committed, as torchft's lines say (none when the hung group froze before its share of
        # the allreduce and thawed within the gloo timeout: group 0 just waited in it)
        assert _steps(m, 0) == sorted(_steps(m, 0)) and m.rollback is False
        assert m.skipped_steps == len(skipped) and m.lost_steps == len(skipped)
        if skipped:
            assert (
                m.lost_work_s is None and f"step {min(skipped)} was not committed" in m.missing["lost_work_s"]
            )
        else:
            assert m.lost_work_s == 0.0
        # the job went on: the first step both groups logged beyond the fault after the first reaction (its
        # stamp: when the later group wrote the line; the script's stamp is taken just before, in ms)
        assert m.time_to_resume_s is not None
        step, done = _job_step_after(m, fault, reacted[str(m.fault)])
        assert 0 <= fault + m.time_to_resume_s - done < 0.02, (step, done - fault, m.time_to_resume_s)
        # fidelity: the weights group 0 saved, byte for byte against the control's
        assert m.fidelity == ("exact" if _final_weights(m) == control_weights else "diverged"), m.verdict

    # kill: group 1's torchrun saw its worker die and restarted it once (its own lines); the Lighthouse noticed
    # only at its heartbeat timeout, later
    fault = _fault_s(kill)
    died = _agent_s(kill, 1, "failed (exitcode: -9)")
    assert len(died) == 1 and len(_agent_s(kill, 1, "will restart worker group")) == 1
    assert not _agent_s(kill, 0, "will restart worker group")
    assert kill.detected and kill.detected_via == "process exit" and kill.time_to_detect_s is not None
    # the agent's stamp is taken (ms resolution) just before its line is written; chaosbench's is the write's:
    # the same instant up to the line's formatting and the millisecond cut (20 ms on a loaded 2-core machine)
    assert 0 <= fault + kill.time_to_detect_s - died[0] < 0.02, (kill.time_to_detect_s, died[0] - fault)
    assert not _agent_s(kill, 0, "failed (exitcode")
    assert kill.blame == "correct" and kill.blamed == "rank 1", (
        kill.verdict
    )  # group 1's torchrun saw the death
    # group 0 cannot commit alone (min_replica_size 2): at least the step of the quorum in which the replacement
    # heals (only group 0 is at the highest step, so it alone takes part) is thrown away
    assert _skipped(kill), "expected group 0 to skip while group 1 was gone"
    # the Lighthouse, if it noticed at all, did at its heartbeat timeout: a replacement that starts heartbeating
    # before the dead Manager's heartbeats time out keeps the count at 2 (seen on a lightly loaded machine)
    lighthouse_saw = next((t for t, beating in _beating(kill) if t > fault and beating < 2), None)
    assert lighthouse_saw is None or kill.time_to_detect_s < lighthouse_saw - fault
    assert kill.restart_count == 1 and kill.restarts_claimed == 1
    # the replacement healed from group 0 (torchft's line) and rejoined in the quorum of both
    healed = HEAL_RE.findall(_log(kill, "torchrun.g1.out"))
    new_id = next(r for r in _quorums(kill)[-1][2] if r.startswith("train_ft_1:"))
    # to where group 0 stood: the step before the one it could not commit alone
    assert [int(step) for rid, step in healed if rid == new_id] == [min(_skipped(kill)) - 1]
    assert kill.time_to_rejoin_s == kill.time_to_resume_s and kill.stage_reshard_or_replace_s is not None
    assert "reshard_or_replace" not in kill.notes, kill.notes

    # hang: nothing died; the Lighthouse stopped hearing group 1 (its own line, ms stamp) and that was the first
    # reaction; no restart
    fault = _fault_s(hang)
    lighthouse_saw = next(t for t, beating in _beating(hang) if t > fault and beating < 2)
    assert hang.detected and hang.detected_via == "framework heartbeat" and hang.time_to_detect_s is not None
    assert 0 <= fault + hang.time_to_detect_s - lighthouse_saw < 0.02, (
        hang.time_to_detect_s,
        lighthouse_saw - fault,
    )
    assert not _agent_s(hang, 0, "will restart worker group") and not _agent_s(
        hang, 1, "will restart worker group"
    )
    # blame: the Lighthouse's heartbeat line names no group; a quorum it shrank after the fault names the one left
    # out (one formed just after the fault may still hold it: asked for before). A group 0 that waited in its
    # allreduce asked for no quorum: nothing named the culprit.
    quorums = _quorums(hang)
    shrunk = next(
        (
            i
            for i, (t, _, members) in enumerate(quorums)
            if t > fault and len(members) < len(quorums[i - 1][2])
        ),
        None,
    )
    if shrunk is None:
        assert hang.blamed is None, hang.verdict
    else:
        assert {r.split(":")[0] for r in set(quorums[shrunk - 1][2]) - set(quorums[shrunk][2])} == {
            "train_ft_1"
        }
        assert hang.blame == "correct" and hang.blamed == "rank 1", hang.verdict
    assert hang.restart_count == 0 and hang.time_to_rejoin_s is None
