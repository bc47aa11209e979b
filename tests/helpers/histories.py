"""Run histories built from a known ground truth, for holding ``compute_metrics`` to the metrics' definitions.

A :class:`Plan` says what happens in a run: its ranks on hosts (with clock offsets), which ranks log their steps
and how often, the step time, checkpoints (some torn), the faults (each a kind at a step), the final digests, and
whether its control restarts for no fault.
:func:`simulate` plays it through step by step and writes, side by side, the events the harness, the framework
and the ranks would write (each on its host's clock) and what happened: every fault's moment, where the job
stood, what each restart restored and when each incarnation's ranks logged what. :func:`expected` then gives the
figures the definitions (chaosbench.analysis.metrics and .faults) name, from those records, written as plainly
as the definitions read, never from the events or the engine's code.

The one convention both share is how a job step shows in logs: it is the job's once every rank that logs steps
in its incarnation has logged it or a later one (a rank logging every 5th step makes the job's logged steps lag
the truth, as in a real run), stamped when the last of them did.

Kinds of fault, each landing 1 ms after the job's step ``at_step`` (every rank done with it):

- ``crash``: a rank dies: nothing more is logged by its incarnation; the framework detects it ``detect_us`` later,
  restarts every rank ``restart_us`` after that; they load the newest complete checkpoint (none: from scratch);
- ``fatal``: a rank dies, the framework detects it and gives up: the run ends failed;
- ``outlast``: a rank stops for ``hold_us``, then the job goes on in place; nothing reacts;
- ``false``: no fault at all: the framework detects a failure that is not there and restarts (a false detection);
- a ``crash`` with ``during_restore`` lands while the previous crash's restart is under way (1 ms after the new
  ranks started, before they load or step): that previous fault is interrupted.

Per-step commit (TorchFT) is a family of its own (:class:`FtPlan`, :func:`simulate_ft`, :func:`expected_ft`):
replica groups of ranks, each group numbering its own incarnations, commit every step in a quorum (every rank of
the quorum reports it); a killed group's survivors skip their in-flight step (``step_skipped``, tried again until
the new quorum), their manager and the group's launcher detect it, the quorum stalls until the lighthouse
notices; the launcher restarts the group (a ``rank_start`` of its next incarnation), whose replacement heals
from a peer and rejoins (participants back to full) at the lighthouse's quorum or a later step, or first commits
old steps alone from stale state, or never comes (the launcher gives up). A group may also restart at its start,
before any fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from chaosbench.timeline import Event

T0_NS = 1_800_000_000 * 1_000_000_000
HARNESS_HOST = "harness"


@dataclass(frozen=True)
class FaultPlan:
    kind: str  # crash | fatal | outlast | false
    at_step: int
    detect_us: int = 50_000
    restart_us: int = 500_000
    hold_us: int = 2_000_000
    during_restore: bool = False


@dataclass(frozen=True)
class Plan:
    ranks: int
    hosts: int
    offsets_us: tuple[int, ...]  # per host: its clock minus the harness's (host 0 is the harness's)
    every: tuple[int | None, ...]  # per rank: it logs every k-th step (None: none)
    steps: int
    step_us: int
    init_us: int
    ckpt_every: int  # 0: never
    torn: frozenset[int]  # checkpoint steps whose save is torn
    faults: tuple[FaultPlan, ...]
    digest: str | None  # the run's final digest (None: it prints none)
    control_digest: str | None
    cut: float | None = None  # the run's deadline, as a share of how long it would take: torn down then
    #: the control's own false detection and restart, at this step (0: before training; seen: a rank aborting
    #: at exit): None, a clean control
    control_false: int | None = None


@dataclass
class Fault:
    """One fault as it happened (not a false detection)."""

    name: str
    kind: str
    t_us: int
    inc: int  # the incarnation it hit
    detect_us: int | None  # when the framework detected it (absolute), None: never
    ended_us: int | None = None  # when a fault that ends by itself ended (outlast)
    interrupted: bool = False
    restart_inc: int | None = None  # the incarnation its restart started


@dataclass
class Record:
    """What the simulation did: the logs per incarnation, the loads, the saves, the faults, the detections."""

    plan: Plan
    control: bool
    logs: dict[int, dict[int, list[tuple[int, int]]]] = field(
        default_factory=dict
    )  # inc -> rank -> (t, step)
    loads: dict[int, tuple[int, int]] = field(default_factory=dict)  # inc -> (t of its load end, step)
    starts: dict[int, int] = field(default_factory=dict)  # inc -> its first rank_start
    saves: list[tuple[int, int]] = field(default_factory=list)  # (t of the save's end, step), complete ones
    faults: list[Fault] = field(default_factory=list)
    detections: list[tuple[int, str | None]] = field(default_factory=list)  # (t, fault name or None: false)
    restarts: list[int] = field(default_factory=list)  # times of the framework's restart events
    ended: str = "completed"
    incarnations: int = 1
    train_end_us: int | None = None  # when the ranks printed their closing line (with the digest)


class _Writer:
    """The events, each with the moment it really happened (us, the harness's clock)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.events: list[tuple[int, Event]] = []

    def harness(self, t_us: int, kind: str, src: str = "harness", **data: object) -> None:
        self.events.append((t_us, Event(T0_NS + t_us * 1000, kind, src, HARNESS_HOST, dict(data))))

    def rank(self, t_us: int, kind: str, rank: int, inc: int, **data: object) -> None:
        h = rank % self.plan.hosts
        host = HARNESS_HOST if h == 0 else f"h{h}"
        t_ns = T0_NS + (t_us + self.plan.offsets_us[h]) * 1000  # written on the rank's own clock
        self.events.append(
            (t_us, Event(t_ns, kind, "rank", host, {"rank": rank, "incarnation": inc, **data}))
        )


def simulate(plan: Plan, control: bool = False) -> tuple[list[Event], Record]:
    """The events of a run of ``plan`` (``control``: without its faults), unsorted, and its :class:`Record`."""
    w = _Writer(plan)
    rec = Record(plan, control)
    w.harness(
        0,
        "run_start",
        scenario="fw/x",
        framework="fw",
        fault=None if control else "f",
        repeat=0,
        control=control,
    )
    for h in range(1, plan.hosts):
        w.harness(
            1,
            "clock_offset",
            node=f"node{h}",
            node_host=f"h{h}",
            offset_ns=plan.offsets_us[h] * 1000,
            bound_ns=20_000,
            rtt_ns=40_000,
            samples=5,
        )
    pending = (
        list(plan.faults)
        if not control
        else []
        if plan.control_false is None
        else [FaultPlan("false", plan.control_false)]
    )
    inc = 0

    def start(t_us: int, load: bool = True) -> tuple[int, int]:
        """Incarnation ``inc`` starts at ``t_us``: (the time it is ready to step, the step it restored)."""
        rec.starts[inc] = t_us
        for r in range(plan.ranks):
            w.rank(t_us + r * 10, "rank_start", r, inc, pid=1000 + 10 * inc + r, world_size=plan.ranks)
        t_us += plan.init_us
        step = max((s for _, s in rec.saves), default=0) if load else 0
        if step:
            for r in range(plan.ranks):
                w.rank(t_us, "ckpt_load_begin", r, inc, step=step)
                w.rank(t_us + 100_000, "ckpt_load_end", r, inc, step=step)
            rec.loads[inc] = (t_us + 100_000, step)
            t_us += 100_000
        return t_us, step

    t, pos = start(10_000)
    while True:
        fault = pending[0] if pending else None
        if pos >= plan.steps:
            break
        if fault is not None and pos == fault.at_step:
            pending.pop(0)
            tf = t + 1_000
            name = f"f{len(rec.faults)}"
            if fault.kind == "false":
                td = tf + fault.detect_us
                w.harness(td, "detect", src="framework", framework="fw", reason="heartbeat", blame_rank=0)
                rec.detections.append((td, None))
                w.harness(td + 1_000, "restart", src="framework", framework="fw")
                rec.restarts.append(td + 1_000)
                inc += 1
                t, pos = start(td + fault.restart_us)
                continue
            w.harness(
                tf,
                "fault_inject",
                src="injector",
                fault=name,
                injector="hang" if fault.kind == "outlast" else "kill",
                target=[{"rank": plan.ranks - 1}],
                effect_t_ns=T0_NS + tf * 1000,
            )
            if fault.kind == "outlast":
                rec.faults.append(Fault(name, "outlast", tf, inc, None, ended_us=tf + fault.hold_us))
                w.harness(tf + fault.hold_us, "fault_revert", src="injector", fault=name)
                t = tf + fault.hold_us
                continue
            td = tf + fault.detect_us
            rec.faults.append(Fault(name, fault.kind, tf, inc, td))
            w.harness(
                td, "detect", src="framework", framework="fw", reason="exited", blame_rank=plan.ranks - 1
            )
            rec.detections.append((td, name))
            if fault.kind == "fatal":
                w.harness(td + 1_000, "give_up", src="framework", framework="fw")
                rec.ended = "failed"
                t = td + 2_000
                break
            w.harness(td + 1_000, "restart", src="framework", framework="fw")
            rec.restarts.append(td + 1_000)
            inc += 1
            rec.faults[-1].restart_inc = inc
            nxt = pending[0] if pending else None
            if nxt is not None and nxt.during_restore:  # hit again 1 ms after the new ranks started
                pending.pop(0)
                rec.faults[-1].interrupted = True
                t0 = td + fault.restart_us
                rec.starts[inc] = t0
                for r in range(plan.ranks):
                    w.rank(t0 + r * 10, "rank_start", r, inc, pid=1000 + 10 * inc + r, world_size=plan.ranks)
                t2 = t0 + 1_000
                name2 = f"f{len(rec.faults)}"
                w.harness(
                    t2,
                    "fault_inject",
                    src="injector",
                    fault=name2,
                    injector="kill",
                    target=[{"rank": 0}],
                    effect_t_ns=T0_NS + t2 * 1000,
                )
                td2 = t2 + nxt.detect_us
                rec.faults.append(Fault(name2, "crash", t2, inc, td2))
                w.harness(td2, "detect", src="framework", framework="fw", reason="exited", blame_rank=0)
                rec.detections.append((td2, name2))
                w.harness(td2 + 1_000, "restart", src="framework", framework="fw")
                rec.restarts.append(td2 + 1_000)
                inc += 1
                rec.faults[-1].restart_inc = inc
                t, pos = start(td2 + nxt.restart_us)
            else:
                t, pos = start(td + fault.restart_us)
            continue
        t += plan.step_us
        pos += 1
        for i, r in enumerate(range(plan.ranks)):
            k = plan.every[r]
            if k is not None and pos % k == 0:
                tr = t + i * 3
                w.rank(tr, "step", r, inc, step=pos, loss=1.0 / pos, duration_s=plan.step_us / 1e6)
                rec.logs.setdefault(inc, {}).setdefault(r, []).append((tr, pos))
        if plan.ckpt_every and pos % plan.ckpt_every == 0:
            complete = pos not in plan.torn
            for r in range(plan.ranks):
                w.rank(t + 50, "ckpt_save_begin", r, inc, step=pos)
                w.rank(t + 2_000 + r, "ckpt_save_end", r, inc, step=pos, complete=complete)
            if complete:  # complete once the last rank's save ended
                rec.saves.append((t + 2_000 + plan.ranks - 1, pos))
            t += 2_500
    rec.incarnations = inc + 1
    if rec.ended == "completed":
        digest = plan.control_digest if control else plan.digest
        if digest is not None:
            rec.train_end_us = t + 1_000
            for r in range(plan.ranks):
                w.rank(t + 1_000, "train_end", r, inc, step=plan.steps, loss=1.0 / plan.steps, digest=digest)
    end = t + 20_000
    if plan.cut is not None and not control:  # the deadline: torn down then, whatever was under way
        deadline = int(end * plan.cut)
        if deadline < end:
            _cut(w, rec, deadline)
            w.harness(deadline, "teardown_begin", reason="deadline")
            w.harness(deadline + 1_000, "run_end", outcome="deadline")
            return [e for _, e in w.events], rec
    w.harness(end - 1_000, "teardown_begin", reason="end")
    w.harness(end, "run_end", outcome=rec.ended)
    return [e for _, e in w.events], rec


def _cut(w: _Writer, rec: Record, deadline: int) -> None:
    """Everything after ``deadline`` did not happen: the run was torn down then."""
    w.events = [(t, e) for t, e in w.events if t < deadline]
    rec.ended = "deadline"
    rec.logs = {
        i: {r: [x for x in lines if x[0] < deadline] for r, lines in by_rank.items()}
        for i, by_rank in rec.logs.items()
    }
    rec.logs = {i: {r: lines for r, lines in by_rank.items() if lines} for i, by_rank in rec.logs.items()}
    rec.logs = {i: by_rank for i, by_rank in rec.logs.items() if by_rank}
    rec.loads = {i: x for i, x in rec.loads.items() if x[0] < deadline}
    rec.starts = {i: t for i, t in rec.starts.items() if t < deadline}
    rec.saves = [x for x in rec.saves if x[0] < deadline]
    rec.faults = [f for f in rec.faults if f.t_us < deadline]
    for f in rec.faults:
        if f.detect_us is not None and f.detect_us >= deadline:
            f.detect_us = None
    rec.detections = [x for x in rec.detections if x[0] < deadline]
    if rec.train_end_us is not None and rec.train_end_us >= deadline:
        rec.train_end_us = None
    rec.incarnations = max(rec.starts, default=0) + 1


# --------------------------------------------------------------------------------- the figures, by definition
def completion(logs: dict[int, list[tuple[int, int]]], step: int) -> int | None:
    """When the job had logged ``step`` in one incarnation (``logs``: rank -> its (t, step) lines): once every
    rank that logs in it had logged it or a later one (None: some never did)."""
    firsts = []
    for lines in logs.values():
        t = next((t for t, s in lines if s >= step), None)
        if t is None:
            return None
        firsts.append(t)
    return max(firsts) if firsts else None


def logged_steps(logs: dict[int, list[tuple[int, int]]]) -> list[int]:
    return sorted({s for lines in logs.values() for _, s in lines})


@dataclass
class Expected:
    outcome: str
    statuses: list[str]
    time_to_detect_us: list[int | None]
    time_to_resume_us: list[int | None]
    lost_steps: list[int | None]
    restarts: list[int]
    restart_count: int
    false_detections: int
    final_step: int | None
    fidelity: str | None
    checkpoint_age_us: int | None


def final_step(rec: Record) -> int | None:
    """Where training ended: the closing line's step when the script printed one (with its digest; whether the job
    then exited before the deadline or not), else, when the job exited 0 by itself, the last job step its newest
    logging incarnation logged (a script that logs every 5th step and prints nothing at the end shows no later
    one)."""
    if rec.train_end_us is not None:  # training finished, whether or not the job then exited in time
        return rec.plan.steps
    if rec.ended != "completed":
        return None
    logs = rec.logs[max(rec.logs)]
    done = [s for s in logged_steps(logs) if completion(logs, s) is not None]
    return max(done) if done else None


def run_outcome(fired: bool, finished: bool, statuses: list[str]) -> str:
    """The run's outcome from its faults' statuses (the definitions': the last fault decides whether the job
    recovered; a run whose every fault was outlasted or interrupted, one at least outlasted, was outlasted)."""
    if not fired:
        return "fault_not_fired"
    if not finished or statuses[-1] == "not_recovered":
        return "not_recovered"
    if set(statuses) <= {"outlasted", "interrupted"} and "outlasted" in statuses:
        return "outlasted"
    return "recovered"


def expected(rec: Record, control: Record) -> Expected:
    """The figures of a run (``rec``) against its control, as the definitions give them."""
    plan = rec.plan
    final = final_step(rec)
    finished = final is not None and final >= plan.steps
    n = len(rec.faults)
    statuses, detects, resumes, losts, restarts = [], [], [], [], []
    resumed_at: list[int | None] = []  # when each fault's job resumed within its window (whatever its status)
    for i, f in enumerate(rec.faults):
        until = rec.faults[i + 1].t_us if i + 1 < n else None
        # the framework's first reaction after it, in its window (whatever it meant: a false detection there is
        # a reaction all the same)
        det = min(
            (t for t, _ in rec.detections if t >= f.t_us and (until is None or t < until)), default=None
        )
        own = rec.logs.get(
            f.inc, {}
        )  # every rank that logs in the incarnation (a late first line holds it up)
        reached = [
            s for s in logged_steps(own) if completion(own, s) is not None and completion(own, s) <= f.t_us
        ]
        if reached:
            position = max(reached)
        else:  # nothing done by this incarnation yet: the step it restored
            position = rec.loads[f.inc][1] if f.inc in rec.loads and rec.loads[f.inc][0] <= f.t_us else 0
        # the first job step logged after recovery: when a newer incarnation started after the fault (before the
        # next one), the first step a newer incarnation logged; else (in place) the first beyond the position.
        # A fault that ended by itself after which its incarnation logged progress was outlasted in place,
        # whatever restarted the job afterwards.
        newer = sorted(
            k for k, t in rec.starts.items() if k > f.inc and t > f.t_us and (until is None or t < until)
        )
        in_place = [
            (t, s)
            for s in logged_steps(own)
            if s > position
            for t in [completion(own, s)]
            if t is not None and t > f.t_us
        ]
        if newer and f.ended_us is not None:
            if any(f.ended_us <= t < rec.starts[newer[0]] for t, _ in in_place):
                newer = []
        if newer:
            inc2 = newer[0]
            while inc2 not in rec.logs and inc2 + 1 < rec.incarnations:
                inc2 += 1  # restarted again before it logged a step: the next one
            logs = rec.logs.get(inc2, {})
            done = [(t, s) for s in logged_steps(logs) for t in [completion(logs, s)] if t is not None]
            resumed = min(done) if done else None
            restored = None
            if resumed is not None:
                restored = resumed[1] - 1
                if inc2 in rec.loads and rec.loads[inc2][0] >= f.t_us:
                    restored = min(restored, rec.loads[inc2][1])
        else:
            resumed = min(in_place) if in_place else None
            restored = resumed[1] - 1 if resumed else None
        in_window = resumed is not None and (until is None or resumed[0] < until)
        # a detection after the job resumed is no reaction to this fault (it is a false one, counted as such)
        if det is not None and in_window and det > resumed[0]:  # type: ignore[index]
            det = None
        detects.append(None if det is None else det - f.t_us)
        incs_after = [
            k
            for k, t in rec.starts.items()
            if k > f.inc and t >= f.t_us and (t <= (resumed[0] if in_window else until or 10**18))
        ]
        restarts.append(len(incs_after))
        resumed_at.append(resumed[0] if in_window else None)  # type: ignore[index]
        lost = None if resumed is None else max(0, position - restored)  # type: ignore[operator]
        if not in_window:
            statuses.append("interrupted" if until is not None else "not_recovered")
            resumes.append(None)
            # an interrupted restart's rollback is its loss all the same (to where the job finally restarted
            # from); one that rolled nothing back lost nothing (the next fault's loss is the next fault's)
            losts.append((lost if newer else 0) if until is not None else None)
            continue
        if until is None and not finished:
            statuses.append("not_recovered")
            resumes.append(None)
            losts.append(None)
            continue
        reacted = det is not None or bool(incs_after)
        statuses.append("recovered" if reacted else "outlasted")
        resumes.append(resumed[0] - f.t_us)  # type: ignore[index]
        losts.append(lost)
    outcome = run_outcome(bool(rec.faults), finished, statuses)
    # false detections: detections that no fault's recovery explains (before the first fault, or after a fault's
    # job resumed and before the next one); each detection here is an episode of its own (a restart follows it)
    windows = []
    for i, f in enumerate(rec.faults):
        end = resumed_at[i]
        if end is None and i + 1 < n:
            end = rec.faults[i + 1].t_us
        windows.append((f.t_us, end))
    false = sum(1 for t, _ in rec.detections if not any(a <= t and (b is None or t <= b) for a, b in windows))
    # the final state: both finished, both with a digest
    fidelity = None
    c_final = final_step(control)
    # a control that restarted once it had logged a step ended in a recovery's state: no reference
    c_logged = [t for by_rank in control.logs.values() for lines in by_rank.values() for t, _ in lines]
    c_resumed = bool(c_logged) and any(t > min(c_logged) for t in control.starts.values())
    if (
        finished
        and c_final is not None
        and c_final >= plan.steps
        and plan.digest
        and plan.control_digest
        and not c_resumed
    ):
        fidelity = "exact" if plan.digest == plan.control_digest else "diverged"
    age = None
    if rec.faults:
        done = [t for t, _ in rec.saves if t <= rec.faults[0].t_us]
        age = rec.faults[0].t_us - max(done) if done else None
    return Expected(
        outcome,
        statuses,
        detects,
        resumes,
        losts,
        restarts,
        rec.incarnations - 1,
        false,
        final,
        fidelity,
        age,
    )


# ----------------------------------------------------------------------------------------------- strategies
@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """A run: 1-6 ranks on 1-3 hosts with clock offsets, per-rank log cadence (every step, every 2nd or 5th, none;
    rank 0 always logs), 10-40 steps, checkpoints every 3/5/10 steps or none (some torn), 0-3 faults of every
    kind (a false detection, a crash with a restart, one during the previous one's restart, an outlasted hang, a
    fatal crash), digests equal, different or absent."""
    ranks = draw(st.integers(1, 6))
    hosts = draw(st.integers(1, min(3, ranks)))
    offsets = (0, *[draw(st.integers(-50_000, 50_000)) for _ in range(hosts - 1)])
    every: list[int | None] = [draw(st.sampled_from([1, 1, 2, 5]))]
    every += [draw(st.sampled_from([1, 1, 2, 5, None])) for _ in range(ranks - 1)]
    steps = draw(st.integers(10, 40))
    ckpt_every = draw(st.sampled_from([0, 3, 5, 10]))
    saves = range(ckpt_every, steps + 1, ckpt_every) if ckpt_every else range(0)
    torn = frozenset(s for s in saves if draw(st.integers(0, 4)) == 0)
    faults: list[FaultPlan] = []
    at = 0
    for kind in draw(st.lists(st.sampled_from(["crash", "crash", "fatal", "outlast", "false"]), max_size=3)):
        at = draw(st.integers(at + 1, at + max(2, steps // 3)))
        if at >= steps:
            break
        during = (
            kind == "crash"
            and bool(faults)
            and faults[-1].kind == "crash"
            and not faults[-1].during_restore
            and draw(st.booleans())
        )
        faults.append(
            FaultPlan(
                kind,
                at,
                draw(st.integers(1_000, 300_000)),
                draw(st.integers(100_000, 2_000_000)),
                draw(st.integers(10_000, 3_000_000)),
                during,
            )
        )
        if kind == "fatal":
            break
    cut = draw(st.one_of(st.none(), st.none(), st.floats(0.3, 0.99)))
    control_false = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, steps - 1)))
    return Plan(
        ranks,
        hosts,
        offsets,
        tuple(every),
        steps,
        draw(st.integers(2_000, 50_000)),
        draw(st.integers(50_000, 2_000_000)),
        ckpt_every,
        torn,
        tuple(faults),
        draw(st.sampled_from(["a", "b", None])),
        draw(st.sampled_from(["a", None])),
        cut,
        control_false,
    )


# ------------------------------------------------------------------------------ per-step commit (TorchFT)
@dataclass(frozen=True)
class FtFaultPlan:
    """A fault of a per-step-commit run, landing 1 ms after the job committed step ``at_step``: ``kill`` (a
    replica group dies; its launcher restarts it and the replacement heals from a peer and rejoins), ``stale``
    (the same, but the replacement comes back with stale state and commits ``stale_steps`` old steps alone
    before it joins), ``lost`` (the launcher gives up: the job goes on without that group), ``hang`` (a group
    stops for ``hold_us`` inside the step in flight, under every timeout: nothing reacts, the step commits late);
    ``flap`` is no fault: the lighthouse reports a failure that is not there (a false detection). ``group`` picks
    the
    victim among the quorum's groups (modulo their count); a fault that lands when fewer than two groups are in
    the quorum (nobody would survive it) does not happen."""

    kind: str  # kill | stale | lost | flap | hang
    at_step: int
    group: int = 0
    manager_us: int = (
        5_000  # kill -> the survivors' in-flight step fails (step_skipped) and their manager detects
    )
    retries: int = 0  # the survivors try the step again (skipped again) this often before the new quorum
    exit_us: int = (
        50_000  # kill -> the group's launcher sees its worker exit (detect) and restarts it 1 ms later
    )
    restart_us: int = 400_000  # the restart -> the replacement's rank_start
    heartbeat_us: int = 2_000_000  # kill -> the lighthouse notices (detect) and issues a new quorum
    stale_steps: int = 2
    hold_us: int = 100_000  # hang: how long the group stops


@dataclass(frozen=True)
class FtPlan:
    """A per-step-commit run: ``groups`` replica groups of ``per_group`` ranks each (rank ``g * per_group + i``,
    on host ``rank % hosts``), every rank reporting every committed step; no checkpoints (a replacement heals
    from a live peer in ``heal_us``)."""

    groups: int
    per_group: int
    hosts: int
    offsets_us: tuple[int, ...]
    steps: int
    step_us: int
    init_us: int
    heal_us: int
    faults: tuple[FtFaultPlan, ...]
    digest: str | None
    control_digest: str | None
    cut: float | None = None
    early: int | None = (
        None  # a group whose first worker exits at its start: its launcher restarts it at once
    )

    @property
    def ranks(self) -> int:
        return self.groups * self.per_group

    def ranks_of(self, g: int) -> list[int]:
        return [g * self.per_group + i for i in range(self.per_group)]


@dataclass
class FtRecord:
    """What a per-step-commit run did, each fact with its moment (us, the harness's clock)."""

    plan: FtPlan
    commits: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # the job's: (t complete, step, min duration us)
    committers: dict[int, tuple[tuple[int, int], ...]] = field(
        default_factory=dict
    )  # step -> (group, inc) in it
    stale: list[tuple[int, int]] = field(
        default_factory=list
    )  # a stale group's commits of old steps: (t, step)
    skips: list[tuple[int, int]] = field(default_factory=list)  # (t, step) of each step_skipped
    detections: list[int] = field(default_factory=list)  # every detect
    separators: list[int] = field(
        default_factory=list
    )  # every restart and give_up (a detection episode ends)
    quorums: list[int] = field(default_factory=list)  # every new quorum the lighthouse issued
    starts: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # (t, group, incarnation) of each group start
    faults: list[int] = field(default_factory=list)  # when each fault took effect
    victims: list[tuple[int, int | None]] = field(
        default_factory=list
    )  # each fault's group, its replacement's inc
    heals: dict[tuple[int, int], int] = field(default_factory=dict)  # (group, inc) -> when its ranks healed
    reports: dict[int, list[tuple[int, int, int]]] = field(
        default_factory=dict
    )  # step -> (t, group, inc) reports
    ended: str = "completed"
    train_end_us: int | None = None
    end_us: int = 0  # run_end
    cut_us: int | None = None


def _ft_writer(plan: FtPlan) -> _Writer:
    # the writer places rank r on host r % hosts, as the plan says
    return _Writer(
        Plan(
            plan.ranks,
            plan.hosts,
            plan.offsets_us,
            (1,) * plan.ranks,
            plan.steps,
            plan.step_us,
            plan.init_us,
            0,
            frozenset(),
            (),
            plan.digest,
            plan.control_digest,
        )
    )


def simulate_ft(plan: FtPlan, control: bool = False) -> tuple[list[Event], FtRecord]:
    """The events of a per-step-commit run of ``plan`` (``control``: without its faults), unsorted, and its
    :class:`FtRecord`. Each step the quorum's ranks compute and commit (each reports it, 3 us apart, its
    ``duration_s`` 10 us shorter per rank index); a quorum change is issued at a step boundary."""
    w = _ft_writer(plan)
    rec = FtRecord(plan)
    K, G = plan.per_group, plan.groups
    w.harness(
        0,
        "run_start",
        scenario="fw/x",
        framework="fw",
        fault=None if control else "f",
        repeat=0,
        control=control,
    )
    for h in range(1, plan.hosts):
        w.harness(
            1,
            "clock_offset",
            node=f"node{h}",
            node_host=f"h{h}",
            offset_ns=plan.offsets_us[h] * 1000,
            bound_ns=20_000,
            rtt_ns=40_000,
            samples=5,
        )
    inc = [0] * G

    def start_group(t_us: int, g: int) -> None:
        rec.starts.append((t_us, g, inc[g]))
        for i, r in enumerate(plan.ranks_of(g)):
            w.rank(
                t_us + i * 10,
                "rank_start",
                r,
                inc[g],
                pid=1000 + 100 * inc[g] + r,
                world_size=plan.ranks,
                replica_group=g,
                group_rank=i,
                group_world_size=K,
            )

    for g in range(G):
        start_group(10_000 + g * 1_000, g)
        if g == plan.early:  # a restart before any fault (and before training): a detection no fault explains
            rec.detections.append(15_000 + g * 1_000)
            w.harness(
                15_000 + g * 1_000,
                "detect",
                src="framework",
                framework="fw",
                via="exit",
                replica_group=g,
                exitcode=1,
            )
            w.harness(16_000 + g * 1_000, "restart", src="framework", framework="fw", replica_group=g)
            rec.separators.append(16_000 + g * 1_000)
            inc[g] += 1
            start_group(17_000 + g * 1_000, g)
    t = 10_000 + G * 1_000 + plan.init_us
    members = tuple(range(G))
    qid = 1
    w.harness(
        t,
        "quorum",
        src="framework",
        framework="fw",
        via="lighthouse",
        quorum_id=qid,
        participants=G,
        replica_groups=list(members),
    )
    pos = 0
    pending: list[tuple[int, int]] = []  # (ready to join, group) of replacements not in the quorum yet
    todo = [] if control else list(plan.faults)

    def requorum(tb: int, groups: tuple[int, ...], heal_from: tuple[int, ...]) -> int:
        """A new quorum of ``groups`` at ``tb``; the ones not in ``heal_from`` heal from it: the first step's
        start."""
        nonlocal qid, members
        qid += 1
        rec.quorums.append(tb)
        w.harness(
            tb,
            "quorum",
            src="framework",
            framework="fw",
            via="lighthouse",
            quorum_id=qid,
            participants=len(groups),
            previous_participants=len(members),
            replica_groups=list(groups),
        )
        if len(groups) < len(members):  # the manager of a group left in a smaller quorum says so
            survivor = plan.ranks_of(heal_from[0])[0]
            rec.detections.append(tb + 50)
            w.rank(
                tb + 50,
                "detect",
                survivor,
                inc[heal_from[0]],
                framework="fw",
                via="manager",
                mechanism="quorum change",
                reason=f"quorum {qid}: {len(groups)} of {len(members)} replica groups",
            )
        joiners = [g for g in groups if g not in heal_from]
        members = groups
        if not joiners:
            return tb
        w.rank(
            tb + 100,
            "heal_send",
            plan.ranks_of(heal_from[0])[0],
            inc[heal_from[0]],
            step=pos,
            dst_replica_ranks=[groups.index(g) for g in joiners],
        )
        for g in joiners:
            for r in plan.ranks_of(g):
                w.rank(
                    tb + 200, "heal_begin", r, inc[g], step=pos, src_replica_rank=groups.index(heal_from[0])
                )
                w.rank(
                    tb + plan.heal_us, "heal_end", r, inc[g], step=pos, duration_s=(plan.heal_us - 200) / 1e6
                )
            rec.heals[(g, inc[g])] = tb + plan.heal_us
        return tb + plan.heal_us

    while pos < plan.steps:
        fault = todo[0] if todo else None
        if fault is not None and pos >= fault.at_step:
            todo.pop(0)
            if (
                fault.kind == "flap"
            ):  # the lighthouse reports a failure that is not there; nothing else happens
                rec.detections.append(t + 1_000)
                w.harness(
                    t + 1_000,
                    "detect",
                    src="framework",
                    framework="fw",
                    via="lighthouse",
                    mechanism="framework heartbeat",
                    reason="lighthouse: a heartbeat late",
                )
                continue
            if len(members) < 2:
                continue  # nobody would survive it: it does not happen
            tf = t + 1_000
            rec.faults.append(tf)
            g = members[fault.group % len(members)]
            survivors = tuple(x for x in members if x != g)
            name = f"f{len(rec.faults) - 1}"
            w.harness(
                tf,
                "fault_inject",
                src="injector",
                fault=name,
                injector="hang" if fault.kind == "hang" else "kill",
                target=[{"rank": r} for r in plan.ranks_of(g)],
                effect_t_ns=T0_NS + tf * 1000,
            )
            if fault.kind == "hang":  # the step in flight waits for it: it commits hold_us late, in place
                rec.victims.append((g, None))
                w.harness(tf + fault.hold_us, "fault_revert", src="injector", fault=name, injector="hang")
                t += fault.hold_us
                continue
            t_q = tf + fault.heartbeat_us
            # the survivors' in-flight step fails (and is tried again, failing again, until the new quorum)
            gap = (fault.heartbeat_us - fault.manager_us) // (fault.retries + 1)
            for k in range(fault.retries + 1):
                ts = tf + fault.manager_us + k * gap
                for j, r in enumerate(r for s in survivors for r in plan.ranks_of(s)):
                    w.rank(
                        ts + 3 * j,
                        "step_skipped",
                        r,
                        inc[r // K],
                        step=pos + 1,
                        reason="peer lost",
                        duration_s=(plan.step_us - 10 * r) / 1e6,
                        collective_s=0.001,
                        participants=len(members),
                        quorum_id=qid,
                    )
                    rec.skips.append((ts + 3 * j, pos + 1))
                if k == 0:
                    first = plan.ranks_of(survivors[0])[0]
                    rec.detections.append(ts + 1)
                    w.rank(
                        ts + 1,
                        "detect",
                        first,
                        inc[survivors[0]],
                        framework="fw",
                        via="manager",
                        reason=f"step {pos + 1} not committed: peer lost",
                    )
            # the group's launcher sees its worker exit and restarts it (or gives up)
            td = tf + fault.exit_us
            rec.detections.append(td)
            w.harness(td, "detect", src="framework", framework="fw", via="exit", replica_group=g, exitcode=-9)
            if fault.kind == "lost":
                w.harness(td + 1_000, "give_up", src="framework", framework="fw", replica_group=g)
                rec.separators.append(td + 1_000)
                rec.victims.append((g, None))
            else:
                w.harness(td + 1_000, "restart", src="framework", framework="fw", replica_group=g)
                rec.separators.append(td + 1_000)
                inc[g] += 1
                rec.victims.append((g, inc[g]))
                t_rs = td + 1_000 + fault.restart_us
                start_group(t_rs, g)
                ready = t_rs + plan.init_us
                if fault.kind == "stale":  # it restored an old state and commits old steps alone, then joins
                    n = min(fault.stale_steps, pos)
                    for i in range(n):
                        tc = ready + (i + 1) * plan.step_us
                        for j, r in enumerate(plan.ranks_of(g)):
                            w.rank(
                                tc + 3 * j,
                                "step",
                                r,
                                inc[g],
                                step=pos - n + i + 1,
                                loss=0.5,
                                duration_s=(2 * plan.step_us - 10 * r) / 1e6,
                                participants=1,
                                quorum_id=1000 + len(rec.faults),
                                committed=True,
                            )
                        rec.stale.append((tc + 3 * (K - 1), pos - n + i + 1))
                    ready += n * plan.step_us + 1_000
                pending.append((ready, g))
            # the lighthouse notices and issues a quorum of the survivors and every replacement ready by then
            rec.detections.append(t_q)
            w.harness(
                t_q,
                "detect",
                src="framework",
                framework="fw",
                via="lighthouse",
                mechanism="framework heartbeat",
                blame_groups=[g],
                reason=f"lighthouse: {len(members)} -> {len(members) - 1} replica groups",
            )
            back = tuple(x for r_t, x in pending if r_t <= t_q)
            pending = [(r_t, x) for r_t, x in pending if r_t > t_q]
            t = requorum(t_q, tuple(sorted(survivors + back)), survivors)
            continue
        back = tuple(x for r_t, x in pending if r_t <= t)
        if back:  # replacements ready by this step's start join the quorum and heal
            pending = [(r_t, x) for r_t, x in pending if r_t > t]
            t = requorum(t, tuple(sorted(members + back)), members)
        pos += 1
        ranks = [r for g in members for r in plan.ranks_of(g)]
        for j, r in enumerate(ranks):
            w.rank(
                t + plan.step_us + 3 * j,
                "step",
                r,
                inc[r // K],
                step=pos,
                loss=1.0 / pos,
                duration_s=(plan.step_us - 10 * r) / 1e6,
                participants=len(members),
                quorum_id=qid,
                committed=True,
                global_batch=32,
            )
            rec.reports.setdefault(pos, []).append((t + plan.step_us + 3 * j, r // K, inc[r // K]))
        done = t + plan.step_us + 3 * (len(ranks) - 1)
        rec.commits.append((done, pos, plan.step_us - 10 * max(ranks)))
        rec.committers[pos] = tuple((g, inc[g]) for g in members)
        t = done
    digest = plan.control_digest if control else plan.digest
    rec.train_end_us = t + 1_000
    for g in members:
        for r in plan.ranks_of(g):
            w.rank(t + 1_000, "train_end", r, inc[g], step=plan.steps, loss=1.0 / plan.steps, digest=digest)
    end = t + 20_000
    deadline = int(end * plan.cut) if plan.cut is not None and not control else end
    if deadline < end:  # the deadline: torn down then, whatever was under way
        _cut_ft(w, rec, deadline)
        w.harness(deadline, "teardown_begin", reason="deadline")
        w.harness(deadline + 1_000, "run_end", outcome="deadline")
        rec.end_us = deadline + 1_000
    else:  # torn down at the end: a replacement still on its way (or a stale group) is stopped there
        _cut_ft(w, rec, end - 1_000)
        rec.ended = "completed"
        w.harness(end - 1_000, "teardown_begin", reason="end")
        w.harness(end, "run_end", outcome="completed")
        rec.end_us = end
    return [e for _, e in w.events], rec


def _cut_ft(w: _Writer, rec: FtRecord, at_us: int) -> None:
    """Everything from ``at_us`` on did not happen: the run was torn down then."""
    w.events = [(x, e) for x, e in w.events if x < at_us]
    rec.cut_us = at_us
    rec.ended = "deadline"
    rec.commits = [c for c in rec.commits if c[0] < at_us]
    rec.stale = [c for c in rec.stale if c[0] < at_us]
    rec.skips = [c for c in rec.skips if c[0] < at_us]
    rec.detections = [x for x in rec.detections if x < at_us]
    rec.separators = [x for x in rec.separators if x < at_us]
    rec.quorums = [x for x in rec.quorums if x < at_us]
    rec.starts = [c for c in rec.starts if c[0] < at_us]
    rec.victims = [v for x, v in zip(rec.faults, rec.victims, strict=True) if x < at_us]
    rec.faults = [x for x in rec.faults if x < at_us]
    rec.heals = {k: x for k, x in rec.heals.items() if x < at_us}
    rec.reports = {s: [x for x in xs if x[0] < at_us] for s, xs in rec.reports.items()}
    if rec.train_end_us is not None and rec.train_end_us >= at_us:
        rec.train_end_us = None


@dataclass
class FtExpected(Expected):
    skipped_steps: int | None = None  # the first fault's, when the run recovered
    rejoin_us: int | None = (
        None  # the first fault's: the first commit with a group incarnation begun after it
    )
    stages_us: tuple[int | None, ...] | None = (
        None  # the first fault's detect, reschedule, reshard_or_replace, resume
    )
    recover_us: int | None = None  # their total: the fault to the end of the last one
    fault_step: int | None = None  # the highest job step committed when the first fault took effect
    restart_init_us: int | None = None  # the first fault's detection to the start of its resumed step
    burned_us: int | None = None  # the run's end minus the first fault, when training did not finish
    productive_us: int | None = None
    wall_us: int = 0


def expected_ft(rec: FtRecord, control: FtRecord) -> FtExpected:
    """The figures of a per-step-commit run against its control, as the definitions give them: nothing rolls
    back; a fault's resume is the job's first commit of a step beyond the ones committed before it, after the
    framework's first reaction in its window; its lost steps are the distinct steps skipped in its window; its
    restarts the replica groups' new incarnations begun from it to its resume; the run's restarts every group's
    incarnations beyond its first; productive time every step's one commit by the job (a stale group's second
    commit of an old step is not the job's)."""
    plan = rec.plan
    final = plan.steps if rec.train_end_us is not None else None
    finished = final is not None
    n = len(rec.faults)
    statuses, detects, resumes, losts, restarts, skipped = [], [], [], [], [], []
    resumed_at: list[int | None] = []
    for i, tf in enumerate(rec.faults):
        until = rec.faults[i + 1] if i + 1 < n else None
        det = min((t for t in rec.detections if t >= tf and (until is None or t < until)), default=None)
        position = max((s for t, s, _ in rec.commits if t <= tf), default=0)
        after = tf if det is None else max(tf, det)
        resumed = min(((t, s) for t, s, _ in rec.commits if t > after and s > position), default=None)
        in_window = resumed is not None and (until is None or resumed[0] < until)
        detects.append(None if det is None else det - tf)
        upto = resumed[0] if in_window else (until if until is not None else 10**18)  # type: ignore[index]
        restarts.append(sum(1 for t, _, _ in rec.starts if tf <= t <= upto))
        resumed_at.append(resumed[0] if in_window else None)  # type: ignore[index]
        skips = {s for t, s in rec.skips if t >= tf and (until is None or t < until)}
        if not in_window:
            statuses.append("interrupted" if until is not None else "not_recovered")
            resumes.append(None)
            losts.append(None)
            skipped.append(None)
            continue
        if until is None and not finished:
            statuses.append("not_recovered")
            resumes.append(None)
            losts.append(None)
            skipped.append(None)
            continue
        # a reaction: a detection, a new incarnation, or a new quorum, from the fault to the resume
        quorum = any(tf <= t <= resumed[0] for t in rec.quorums)  # type: ignore[index]
        statuses.append("recovered" if det is not None or restarts[-1] or quorum else "outlasted")
        resumes.append(resumed[0] - tf)  # type: ignore[index]
        losts.append(max(0, position - (resumed[1] - 1)) + len(skips))  # type: ignore[index]
        skipped.append(len(skips))
    outcome = run_outcome(bool(rec.faults), finished, statuses)
    windows = [
        (tf, resumed_at[i] if resumed_at[i] is not None else (rec.faults[i + 1] if i + 1 < n else None))
        for i, tf in enumerate(rec.faults)
    ]
    # false detections: detection episodes (detections not separated by a restart or a give-up) no fault explains:
    # begun outside every fault's window (from it to its job's resume, or to the next fault)
    episodes, current = [], False
    for t, is_detect in sorted([(t, True) for t in rec.detections] + [(t, False) for t in rec.separators]):
        if not is_detect:
            current = False
        elif not current:
            current = True
            episodes.append(t)
    false = sum(1 for t in episodes if not any(a <= t and (b is None or t <= b) for a, b in windows))
    fidelity = None
    if finished and control.train_end_us is not None and plan.digest and plan.control_digest:
        fidelity = "exact" if plan.digest == plan.control_digest else "diverged"
    by_group: dict[int, int] = {}
    for _, g, _ in rec.starts:
        by_group[g] = by_group.get(g, 0) + 1
    productive = sum(d for _, _, d in rec.commits) if rec.commits else None
    # the run's recovery figures are its first fault's, where the run recovered and that fault was not interrupted
    first_recovered = outcome == "recovered" and bool(statuses) and statuses[0] in ("recovered", "outlasted")
    rejoin = None
    if first_recovered:
        tf = rec.faults[0]
        new = {(g, i) for t, g, i in rec.starts if t >= tf}
        rejoin = min(
            (t - tf for t, s, _ in rec.commits if t > tf and new & set(rec.committers[s])), default=None
        )
    stages, recover = _ft_stages(rec, first_recovered and statuses[0] == "recovered")
    fault_step = restart_init = burned = None
    if rec.faults:
        tf = rec.faults[0]
        fault_step = max((s for t, s, _ in rec.commits if t <= tf), default=0)
        if first_recovered:  # the wait for a new quorum: from the detection to when the resumed step began
            resumed_t = tf + resumes[0]  # type: ignore[operator]
            compute = next(d for t, _, d in rec.commits if t == resumed_t)
            reacted = tf if detects[0] is None else tf + detects[0]  # undetected: from the fault
            restart_init = max(0, resumed_t - compute - reacted)
        if not finished:
            burned = rec.end_us - tf
    return FtExpected(
        outcome,
        statuses,
        detects,
        resumes,
        losts,
        restarts,
        sum(c - 1 for c in by_group.values()),
        false,
        final,
        fidelity,
        None,
        skipped_steps=skipped[0] if first_recovered else None,
        rejoin_us=rejoin,
        productive_us=productive,
        wall_us=rec.end_us,
        stages_us=stages,
        recover_us=recover,
        fault_step=fault_step,
        restart_init_us=restart_init,
        burned_us=burned,
    )


def _ft_stages(rec: FtRecord, recovered: bool) -> tuple[tuple[int | None, ...] | None, int | None]:
    """The first fault's four stages (us) and their total, by the definitions: the detection; the last
    ``rank_start`` of the lost group's replacement; the end of its heal; its first report of a committed step
    beyond the ones committed before the fault, after its heal. Without a replacement started before the next
    fault (the launcher gave up, it never started, or the fault lost no group) nothing was rescheduled or
    restored (0) and the resume is the job's first such step after the detection. A stage whose end never came is missing (None), the next measured from the end before it."""
    if not recovered:
        return None, None
    tf = rec.faults[0]
    det = min(
        (t for t in rec.detections if t >= tf and (len(rec.faults) < 2 or t < rec.faults[1])), default=None
    )
    position = max((s for t, s, _ in rec.commits if t <= tf), default=0)
    group, new_inc = rec.victims[
        0
    ]  # its replacement: started before the next fault (a later one is its restart)
    until = rec.faults[1] if len(rec.faults) > 1 else None
    started = [t for t, g, i in rec.starts if (g, i) == (group, new_inc) and (until is None or t < until)]
    ends: list[int | None]
    if not started:  # continued without it
        resume = min(t for t, s, _ in rec.commits if t > (det or tf) and s > position)
        ends = [det, det or tf, det or tf, resume]
    else:
        healed = rec.heals.get((group, new_inc))  # type: ignore[arg-type]
        mine = sorted(
            t
            for s, xs in rec.reports.items()
            if s > position
            for t, g, i in xs
            if (g, i) == (group, new_inc) and healed is not None and t >= healed
        )
        ends = [det, started[0] + (rec.plan.per_group - 1) * 10, healed, mine[0] if mine else None]
    seconds: list[int | None] = []
    prev = tf
    for end in ends:
        if end is None:
            seconds.append(None)
            continue
        seconds.append(max(0, end - prev))
        prev = max(prev, end)
    return tuple(seconds), (prev - tf if ends[-1] is not None else None)


@st.composite
def ft_plans(draw: st.DrawFn) -> FtPlan:
    """A per-step-commit run: 2-3 replica groups of 1-2 ranks on 1-3 hosts with clock offsets (one group maybe
    restarted at its start, before any fault), 6-30 steps, 0-3 faults (a killed group whose replacement heals and
    rejoins, before or after the lighthouse notices; one that returns with stale state and commits old steps
    alone first; one whose launcher gives up; a hang nothing reacts to; a false detection by the lighthouse), the
    survivors' in-flight step skipped (and tried again) until the new quorum, a deadline mid-run, digests equal,
    different or absent."""
    groups = draw(st.integers(2, 3))
    per_group = draw(st.integers(1, 2))
    hosts = draw(st.integers(1, min(3, groups * per_group)))
    offsets = (0, *[draw(st.integers(-50_000, 50_000)) for _ in range(hosts - 1)])
    steps = draw(st.integers(6, 30))
    step_us = draw(st.integers(2_000, 50_000))
    faults: list[FtFaultPlan] = []
    at = 0
    kinds = draw(
        st.lists(st.sampled_from(["kill", "kill", "stale", "lost", "flap", "hang"]), min_size=1, max_size=3)
    )
    for kind in kinds if draw(st.integers(0, 9)) != 5 else []:  # a run without a fault now and then
        at = draw(st.integers(at + 1, at + max(2, steps // 3)))
        if at >= steps:
            break
        heartbeat = draw(st.integers(20_000, 3_000_000))
        faults.append(
            FtFaultPlan(
                kind,
                at,
                draw(st.integers(0, 2)),
                draw(st.integers(1_000, heartbeat - 10_000)),
                draw(st.integers(0, 2)),
                draw(st.integers(1_000, heartbeat - 2_000)),
                draw(st.integers(10_000, 2_000_000)),
                heartbeat,
                draw(st.integers(1, 3)),
                draw(st.integers(10_000, 3_000_000)),
            )
        )
    cut = draw(st.one_of(st.none(), st.none(), st.floats(0.3, 0.99)))
    return FtPlan(
        groups,
        per_group,
        hosts,
        offsets,
        steps,
        step_us,
        draw(st.integers(10_000, 500_000)),
        draw(st.integers(1_000, 100_000)),
        tuple(faults),
        draw(st.sampled_from(["a", "b", None])),
        draw(st.sampled_from(["a", None])),
        cut,
        draw(st.sampled_from([None, None, 0, 1])),
    )
