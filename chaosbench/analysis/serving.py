"""Serving metrics of one run (a serving workload, ``serve`` or ``serve-command``: replicas behind a balancer,
driven by a load process), computed only from its timeline and its control run's, and the latency histogram both
sides share.

A run is a serving run when its timeline has a ``load_start`` event. The load process writes one
``load_window`` event per window (``t_ns`` = the window's start; a request counts in the window in which it
completed), each with ``requests``, ``failures`` and ``latency_hist``: counts of the successful requests'
latencies over :data:`chaosbench.analysis.latency.LATENCY_EDGES_MS` (the one definition of the edges, which the
load process imports too; bucket 0 is ``[0, edges[0])``, bucket i ``[edges[i-1], edges[i])``, the last
``[edges[-1], inf)``). Nothing heavy is imported here (no pandas, numpy, locust).

Definitions (normative; seconds on the timeline's one clock; ``fault`` = when the first ``fault_inject`` took
effect, :func:`chaosbench.analysis.timing.fault_effect_ns`; the SLO is ``load_start``'s ``slo``: availability,
window_days, error_rate, recovery_window_s; a window is *healthy* when failures / requests <= slo.error_rate, an
empty window counting as healthy):

- ``requests`` / ``failed_requests``: sums over the load windows; ``error_rate`` = failed / requests.
- ``retried_requests``: the balancer's ``retries`` plus ``redispatches`` (its last ``balancer_stats``; haproxy's
  wretr and wredis): connection attempts it retried on the same replica or on another one, the requests it
  saved from failing or tried to.
- ``budget_request_rate_per_s``: the request rate the error budget is computed from: the control run's (its
  requests over its load's duration, ``load_start`` to ``load_end``) when there is one, else this run's before
  the fault (requests over the duration of the windows that ended before it; a control run or a run whose fault
  did not fire: over its whole load).
- ``error_budget_burn``: failed / ((1 - availability) x rate x window_days x 86400): the share of the
  SLO window's error budget this run's failures used (1.0: all of it).
- ``time_to_detect_s``: the first of (a) the balancer marking a faulted replica down (``balancer_down`` of a
  replica the fault hit, :func:`replicas_hit`; any replica when it names none) and (b) the end of the first load window, ending
  after the fault, with a failed request (by then the load had seen it), minus the fault.
  ``detected_via``: ``balancer health check`` or ``failed request``.
- ``time_to_recover_s``: from the fault to the start of the first span of ``recovery_window_s`` whose windows are
  all healthy and served at least one request, and so are those of the load's ``request_timeout_s`` after it
  (a request counts where it ended: one begun in the span that then timed out ends up to that much later).
  Spans start at window starts at or after the fault, and not before the end of the first window after the
  fault with a failed request (the service cannot be back before it failed); the windows must cover the span
  and the timeout after it (a span cut short by the load's end does not count). No such span: not recovered.
- ``latency_p50_ms`` / ``latency_p99_ms``: quantiles of the successful requests' latencies over the whole load
  (the windows' histograms merged, :func:`quantile_ms`); ``_before_``: windows that ended by the fault;
  ``_during_``: windows overlapping the fault up to the later of the recovery and the fault's revert (a
  slow-down that fails nothing recovers at once but lasts its duration; to the load's end when not recovered);
  ``_after_``: windows from then on.
- ``throughput_during_share``: requests completed per second in the ``during`` windows over those in the
  ``before`` windows (1.0: the load kept its pace; a hung replica left in rotation holds every user it gets
  until the request timeout, and the pace collapses while few requests fail).
- ``capacity_lost_replica_s``: replica-seconds in which a replica could not serve, during the load: per replica,
  from a crash, hang or node fault hitting it or its process's exit (``proc_exit``; a user's server under the
  command shim: its ``rank_exit``), or from the balancer marking it down,
  until it serves again: the balancer marks it up (``balancer_up``) once it is back (a fault reverted, or the
  ``replica_ready`` of a restarted incarnation, which without health checks is enough); the load's end if
  never (:func:`out_of_service_s`); clipped to the load (``load_start`` to ``load_end``, else the last window's
  end). ``capacity_lost_share``: that over replicas x the load's duration.
- ``replicas``: the replicas the run started (``rank_start`` world size).
- ``crash_loop``: two or more incarnations of one replica each replaced before they were ready (a model file that
  fails every load); ``failure_class`` ``deterministic`` then, ``transient`` when recovered.
- outcome: a control run ``completed`` when its load ended (``load_end``), else ``failed``; a fault run
  ``recovered`` or ``not_recovered`` (time_to_recover_s); ``fault_not_fired`` without ``fault_inject``.

Nothing the balancer or the load reported at or after ``teardown_begin`` counts (the harness stopping the
replicas is no incident); the balancer's final ``balancer_stats`` is read wherever it lies. A value that cannot be
measured is None with the reason in ``missing``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

from chaosbench.analysis.attribution import fault_targets
from chaosbench.analysis.fleet import fault_class
from chaosbench.analysis.latency import LATENCY_BUCKETS, merge_hists, quantile_ms
from chaosbench.analysis.timeline_index import TimelineIndex, ns_to_s
from chaosbench.timeline import Event

#: The SLO when ``load_start`` names none (availability 99.9 % over 30 days, 1 % errors per window counted as
#: healthy, recovered after 5 s of healthy windows).
DEFAULT_SLO = {"availability": 0.999, "window_days": 30.0, "error_rate": 0.01, "recovery_window_s": 5.0}

#: Serving metrics that only exist for a run with a fault.
SERVING_FAULT_METRICS = (
    "time_to_detect_s",
    "time_to_recover_s",
    "latency_p50_before_ms",
    "latency_p99_before_ms",
    "latency_p50_during_ms",
    "latency_p99_during_ms",
    "latency_p50_after_ms",
    "latency_p99_after_ms",
    "throughput_during_share",
)


# ----------------------------------------------------------------------------------------------- the windows
@dataclass(frozen=True)
class Window:
    """One ``load_window``: ``[t_ns, end_ns)``; ``hist`` None when it had none of the expected size."""

    t_ns: int
    end_ns: int
    requests: int
    failures: int
    hist: tuple[int, ...] | None
    max_ms: float | None

    def healthy(self, error_rate: float) -> bool:
        return self.requests <= 0 or self.failures <= error_rate * self.requests


def window_of(ev: Event) -> Window:
    hist = ev.get("latency_hist")
    ok = isinstance(hist, (list, tuple)) and len(hist) == LATENCY_BUCKETS
    mx = ev.get("max_ms")
    return Window(
        ev.t_ns,
        ev.t_ns + int(round(float(ev.get("window_s") or 0.0) * 1e9)),
        int(ev.get("requests") or 0),
        int(ev.get("failures") or 0),
        tuple(int(c) for c in hist) if ok else None,
        float(mx) if mx is not None else None,
    )


@dataclass(frozen=True)
class Load:
    """What the load process recorded: its start and end events, its windows in time order (none at or after
    ``cut_ns``, the teardown) and the SLO it carried."""

    start: Event
    end: Event | None
    windows: list[Window]
    slo: dict[str, float]
    bad_hists: int

    @property
    def t0_ns(self) -> int:
        return self.start.t_ns

    @property
    def end_ns(self) -> int:
        """The load's end: ``load_end``, else the end of its last window, else its start."""
        if self.end is not None:
            return self.end.t_ns
        return max((w.end_ns for w in self.windows), default=self.start.t_ns)

    @property
    def duration_s(self) -> float:
        return ns_to_s(self.end_ns - self.t0_ns)


def teardown_ns(ix: TimelineIndex) -> int | None:
    td = ix.first("teardown_begin")
    return td.t_ns if td is not None else None


def load_of(ix: TimelineIndex) -> Load | None:
    """The run's load, or None when it has no ``load_start`` (not a serving run)."""
    start = ix.first("load_start")
    if start is None:
        return None
    cut = teardown_ns(ix)
    evs = [e for e in ix.of("load_window") if cut is None or e.t_ns < cut]
    windows = sorted((window_of(e) for e in evs), key=lambda w: w.t_ns)
    slo = dict(DEFAULT_SLO)
    for k, v in (start.get("slo") or {}).items():
        if k in slo and v is not None:
            slo[k] = float(v)
    bad = sum(1 for w in windows if w.hist is None)
    return Load(start, ix.first("load_end"), windows, slo, bad)


def is_serving(events: Iterable[Event]) -> bool:
    """A run whose timeline has a ``load_start`` event."""
    return any(e.kind == "load_start" for e in events)


def latency(windows: Sequence[Window], q: float) -> float | None:
    """The ``q``-quantile of the successful requests' latencies over ``windows`` (histograms merged)."""
    hists = [w.hist for w in windows if w.hist is not None]
    merged = merge_hists(hists)
    return quantile_ms(merged, q, max((w.max_ms for w in windows if w.max_ms is not None), default=None))


# ----------------------------------------------------------------------------------------------- the metrics
@dataclass
class ServingRecord:
    """A serving run's own metrics (definitions: the module docstring; None: not measured, the reason in the
    run's ``missing``). Declared here only: :class:`~chaosbench.analysis.metrics.RunMetrics` inherits them
    (its ``metrics.json`` keys and results-table columns) and :class:`Serving` carries them from
    :func:`serving_metrics`."""

    #: A serving run (its timeline has ``load_start``); its training metrics stay None.
    serving: bool = False
    replicas: int | None = None
    requests: int | None = None
    failed_requests: int | None = None
    retried_requests: int | None = None
    error_rate: float | None = None
    budget_request_rate_per_s: float | None = None
    error_budget_burn: float | None = None
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_p50_before_ms: float | None = None
    latency_p99_before_ms: float | None = None
    latency_p50_during_ms: float | None = None
    latency_p99_during_ms: float | None = None
    latency_p50_after_ms: float | None = None
    latency_p99_after_ms: float | None = None
    capacity_lost_replica_s: float | None = None
    capacity_lost_share: float | None = None
    throughput_during_share: float | None = None


#: The :class:`ServingRecord` fields this module measures (all but the ``serving`` flag), which
#: :func:`serving_metrics` fills (besides detection, recovery and outcome).
SERVING_FIELDS = tuple(f.name for f in fields(ServingRecord) if f.name != "serving")


@dataclass
class Serving(ServingRecord):
    """The serving metrics of one run (:class:`ServingRecord`, names as on RunMetrics), its detection and
    recovery, whether its load ended (``completed``), with ``missing`` and ``notes``."""

    time_to_detect_s: float | None = None
    detect_t_ns: int | None = None
    detected_via: str | None = None
    detected_by: str | None = None
    time_to_recover_s: float | None = None
    recovered: bool | None = None
    completed: bool = False
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def request_rate_per_s(load: Load, before_ns: int | None = None) -> tuple[float | None, str | None]:
    """(requests per second, why None): over the whole load (``load_start`` to its end), or with ``before_ns``
    over the windows that ended by then."""
    if before_ns is None:
        dur = load.duration_s
        n = sum(w.requests for w in load.windows)
        if dur <= 0 or n <= 0:
            return None, "the load served no request" if n <= 0 else "the load has no duration"
        return n / dur, None
    rate = windows_rate_per_s([w for w in load.windows if w.end_ns <= before_ns])
    if not rate:
        return None, "no request completed in a load window before the fault"
    return rate, None


def windows_rate_per_s(windows: Sequence[Window]) -> float | None:
    """Requests completed per second over ``windows`` (their summed widths); None without windows."""
    span_s = sum(ns_to_s(w.end_ns - w.t_ns) for w in windows)
    return sum(w.requests for w in windows) / span_s if span_s > 0 else None


def error_budget_burn(
    failed: int, availability: float, rate_per_s: float, window_days: float
) -> float | None:
    """failed / ((1 - availability) x rate x window_days x 86400): the share of the SLO window's error budget
    ``failed`` requests use; None when the SLO leaves no budget (availability 1, or no requests)."""
    budget = (1.0 - availability) * rate_per_s * window_days * 86400.0
    return failed / budget if budget > 0 else None


def replica_count(ix: TimelineIndex) -> int | None:
    """Replicas of the run: the largest ``world_size`` of a ``rank_start``, else the ranks that started."""
    starts = ix.of("rank_start")
    sizes = [int(e["world_size"]) for e in starts if e.get("world_size") is not None]
    if sizes:
        return max(sizes)
    ranks = {e.get("rank") for e in (*starts, *ix.of("replica_ready")) if e.get("rank") is not None}
    return len(ranks) or None


#: Fault classes (:func:`chaosbench.analysis.fleet.fault_class`) that take their target replicas out of service
#: from the moment they take effect (a straggler or a slow network only slows them).
OUT_OF_SERVICE_CLASSES = ("crash", "hang", "node")


def partition_groups(fault: Event) -> list[list[str]]:
    """The groups of nodes a fault cut apart (a ``partition``'s ``groups``, from its params or details), or []
    for a fault that cuts no groups apart."""
    return list((fault.get("params") or {}).get("groups") or (fault.get("details") or {}).get("groups") or [])


def cut_off_nodes(ix: TimelineIndex, fault: Event) -> set[str]:
    """The nodes a ``partition`` cut off from the balancer's node: those of every group but the balancer's (all
    the groups' nodes when the balancer's node is in none: it reaches them all, nothing is cut)."""
    groups = partition_groups(fault)
    lb = next((e.get("node") for e in ix.of("proc_start") if e.get("role") == "balancer"), None)
    mine = next((set(g) for g in groups if lb in g), None)
    if mine is None:
        return set()
    return {n for g in groups for n in g if n not in mine}


def replicas_hit(ix: TimelineIndex, fault: Event) -> set[int]:
    """The replicas a ``fault_inject`` hit: its target ranks, and the replicas on its target nodes (a fault that
    cuts groups of nodes apart, a partition: on the nodes it cut off from the balancer; its ``target`` is only
    the rank it resolved by default)."""
    targets = fault.get("target") or []
    if partition_groups(fault):
        ranks: set[int] = set()
        nodes = cut_off_nodes(ix, fault)
    else:
        ranks = set(fault_targets(fault))
        nodes = {
            t["node"]
            for t in (targets if isinstance(targets, list) else [targets])
            if isinstance(t, dict) and t.get("node") and t.get("rank") is None
        }
    if nodes:
        ranks |= {
            int(e["rank"])
            for e in ix.of("rank_start")
            if e.get("node") in nodes and e.get("rank") is not None
        }
    return ranks


def out_of_service_s(ix: TimelineIndex, lo_ns: int, hi_ns: int) -> tuple[float, int]:
    """(replica-seconds within ``[lo_ns, hi_ns)`` in which a replica could not serve, number of replicas that
    were out at some point). A replica is out while its process is gone or frozen (from a crash, hang or node
    fault hitting it, or its process's exit, to its revert or the ``replica_ready`` of its next incarnation) or
    while the balancer holds it down (``balancer_down`` to ``balancer_up``), whichever is longer: a restarted
    replica serves only once the balancer puts it back; without health checks, from its ``replica_ready``."""
    rank_of_pid = {
        int(e["pid"]): int(e["rank"])
        for e in ix.of("rank_start")
        if e.get("pid") is not None and e.get("rank") is not None
    }
    changes: list[tuple[int, int, str, bool]] = []  # (t_ns, rank, "dead"|"held", out?)
    reverts = {e.get("fault"): e.t_ns for e in ix.of("fault_revert") if e.get("undone")}
    for f in ix.of("fault_inject"):
        if fault_class(f) not in OUT_OF_SERVICE_CLASSES:
            continue
        t = int(f.get("effect_t_ns") or f.t_ns)
        for rank in replicas_hit(ix, f):
            changes.append((t, rank, "dead", True))
            if f.get("fault") in reverts:
                changes.append((reverts[f.get("fault")], rank, "dead", False))
    for e in ix.of("proc_exit"):
        exited = rank_of_pid.get(int(e.get("pid") or -1))
        if exited is not None:
            changes.append((e.t_ns, exited, "dead", True))
    for e in ix.of("rank_exit"):  # a user's server under the command shim (serve-command): its own exit
        if e.get("rank") is not None:
            changes.append((e.t_ns, int(e["rank"]), "dead", True))
    for e in ix.of("replica_ready"):
        if int(e.get("incarnation") or 0) > 0 and e.get("rank") is not None:
            changes.append((e.t_ns, int(e["rank"]), "dead", False))
    for e in ix.of("balancer_down", "balancer_up"):
        if e.get("rank") is not None:
            changes.append((e.t_ns, int(e["rank"]), "held", e.kind == "balancer_down"))
    state: dict[int, dict[str, bool]] = {}
    out_since: dict[int, int] = {}
    total_ns = 0
    hit: set[int] = set()
    for t, rank, what, out in sorted(
        changes, key=lambda c: (c[0], c[3])
    ):  # a "back" before an "out" at one instant
        st = state.setdefault(rank, {"dead": False, "held": False})
        was_out = st["dead"] or st["held"]
        st[what] = out
        now_out = st["dead"] or st["held"]
        if now_out and not was_out:
            out_since[rank] = t
            hit.add(rank)
        elif was_out and not now_out:
            start = out_since.pop(rank)
            total_ns += max(0, min(t, hi_ns) - max(start, lo_ns))
    for start in out_since.values():
        total_ns += max(0, hi_ns - max(start, lo_ns))
    return ns_to_s(total_ns), len(hit)


def first_failure_end_ns(windows: Sequence[Window], after_ns: int) -> int | None:
    """End of the first window ending after ``after_ns`` with a failed request."""
    return next((w.end_ns for w in windows if w.end_ns > after_ns and w.failures > 0), None)


def recovery_ns(
    windows: Sequence[Window], tf: int, floor_ns: int, span_ns: int, error_rate: float, settle_ns: int = 0
) -> int | None:
    """Start of the first span of ``span_ns`` starting at a window start >= ``floor_ns`` (and >= ``tf``) whose
    windows, and those of the ``settle_ns`` after it, are all healthy, served a request and cover it. A request
    counts in the window in which it ended: one begun in the span that times out ends up to the request timeout
    (``settle_ns``) later, so a span is only known healthy once that has passed too (seen: with a hung replica
    left in rotation the load's 3 s timeouts came in bursts, and a 2 s span between two bursts passed for a
    recovery)."""
    for i, w in enumerate(windows):
        if w.t_ns < tf or w.t_ns < floor_ns:
            continue
        stop = w.t_ns + span_ns + settle_ns
        covered = 0
        served = 0
        healthy = True
        for x in windows[i:]:
            if x.t_ns >= stop:
                break
            if not x.healthy(error_rate):
                healthy = False
                break
            covered += min(x.end_ns, stop) - x.t_ns
            served += x.requests
        if (
            healthy and served > 0 and covered >= span_ns + settle_ns - 1000
        ):  # 1 µs: window stamps are rounded
            return w.t_ns
    return None


def serving_metrics(
    ix: TimelineIndex, control: TimelineIndex | None, fault: Event | None, tf: int | None
) -> Serving:
    """The serving metrics of the run indexed by ``ix`` (its control's index ``control``; its first
    ``fault_inject`` ``fault`` taking effect at ``tf``, both None for a control or a fault that did not fire).
    Raises ValueError when ``ix`` is not a serving run."""
    load = load_of(ix)
    if load is None:
        raise ValueError("not a serving run: no load_start event")
    s = Serving(serving=True)
    s.completed = load.end is not None
    s.replicas = replica_count(ix)
    if s.replicas is None:
        s.missing["replicas"] = "no rank_start of a replica on the timeline"
    if load.bad_hists:
        s.notes["latency_p99_ms"] = (
            f"{load.bad_hists} window(s) without a latency histogram of "
            f"{LATENCY_BUCKETS} buckets were left out"
        )
    _requests(s, ix, load)
    _error_budget(s, load, control, tf)
    # Latency over the whole load.
    s.latency_p50_ms, s.latency_p99_ms = latency(load.windows, 0.5), latency(load.windows, 0.99)
    if s.latency_p50_ms is None:
        s.missing["latency_p50_ms"] = s.missing["latency_p99_ms"] = "no successful request with its latency"
    _capacity_lost(s, ix, load)
    if fault is None or tf is None:
        return s
    _fault_window(s, ix, load, fault, tf)
    return s


def _requests(s: Serving, ix: TimelineIndex, load: Load) -> None:
    """Requests, failed requests and the error rate over the load's windows, and the requests the balancer
    retried, in ``s``."""
    miss = s.missing
    wins = load.windows
    if wins:
        s.requests = sum(w.requests for w in wins)
        s.failed_requests = sum(w.failures for w in wins)
        if (
            load.end is not None
            and load.end.get("requests") is not None
            and int(load.end["requests"]) != s.requests
        ):
            s.notes["requests"] = (
                f"load_end counted {load.end['requests']} requests, the windows {s.requests}"
            )
    else:
        why = "no load_window events (the load recorded no window)"
        for k in ("requests", "failed_requests", "error_rate", "error_budget_burn"):
            miss[k] = why
    if s.requests:
        assert s.failed_requests is not None
        s.error_rate = s.failed_requests / s.requests
    elif s.requests == 0:
        miss["error_rate"] = "no request completed"
    stats = ix.last("balancer_stats")
    if stats is not None and stats.get("retries") is not None:
        # haproxy counts a retry on the same replica in wretr, one sent to another (option redispatch) in wredis
        s.retried_requests = int(stats["retries"]) + int(stats.get("redispatches") or 0)
    elif stats is not None:
        miss["retried_requests"] = (
            f"the balancer's stats name no retries ({stats.get('missing') or 'no such field'})"
        )
    else:
        miss["retried_requests"] = "the balancer reported no retries (no balancer_stats event)"


def _error_budget(s: Serving, load: Load, control: TimelineIndex | None, tf: int | None) -> None:
    """The request rate the error budget is reckoned at (the control run's, else this run's before the fault
    ``tf``) and the share of the availability SLO's budget the failed requests burned, in ``s``."""
    miss = s.missing
    slo = load.slo
    rate, why_rate = None, None
    ctl_load = load_of(control) if control is not None else None
    if ctl_load is not None:
        rate, why_rate = request_rate_per_s(ctl_load)
        if rate is None:
            s.notes["budget_request_rate_per_s"] = f"control run unusable ({why_rate}): this run's own rate"
    if rate is None:
        rate, why_rate = request_rate_per_s(load, tf)
        if rate is not None and control is None and tf is not None:
            s.notes["budget_request_rate_per_s"] = "no control run: this run's rate before the fault"
    s.budget_request_rate_per_s = rate
    if rate is None:
        miss["budget_request_rate_per_s"] = why_rate or "no request rate"
        miss.setdefault("error_budget_burn", f"no request rate: {why_rate}")
    elif s.failed_requests is not None:
        s.error_budget_burn = error_budget_burn(
            s.failed_requests, slo["availability"], rate, slo["window_days"]
        )
        if s.error_budget_burn is None:
            miss["error_budget_burn"] = f"availability SLO {slo['availability']} leaves no error budget"


def _capacity_lost(s: Serving, ix: TimelineIndex, load: Load) -> None:
    """Replica-seconds out of rotation during the load (up to the harness's teardown) and their share of the
    capacity, in ``s``."""
    cut = teardown_ns(ix)
    hi = load.end_ns if cut is None else min(load.end_ns, cut)
    lost_s, _ = out_of_service_s(ix, load.t0_ns, hi)
    s.capacity_lost_replica_s = lost_s
    dur_s = ns_to_s(hi - load.t0_ns)
    if s.replicas and dur_s > 0:
        s.capacity_lost_share = lost_s / (s.replicas * dur_s)
    else:
        s.missing["capacity_lost_share"] = (
            "unknown replica count" if not s.replicas else "the load has no duration"
        )


def _fault_window(s: Serving, ix: TimelineIndex, load: Load, fault: Event, tf: int) -> None:
    """Detection, recovery and the latency before, during and after the fault, in ``s``."""
    failed_end = first_failure_end_ns(load.windows, tf)
    _detection(s, ix, fault, tf, failed_end)
    rec = _recovery(s, load, tf, failed_end)
    _phases(s, ix, load, fault, tf, rec)


def _detection(s: Serving, ix: TimelineIndex, fault: Event, tf: int, failed_end: int | None) -> None:
    """The fault's detection, in ``s``: the first of the balancer marking a replica it hit down (before the
    teardown) and ``failed_end``, the end of the first window after ``tf`` with a failed request."""
    cut = teardown_ns(ix)
    targets = replicas_hit(ix, fault)
    down = next(
        (
            e
            for e in ix.of("balancer_down")
            if e.t_ns >= tf
            and (cut is None or e.t_ns < cut)
            and (not targets or e.get("rank") is not None and int(e["rank"]) in targets)
        ),
        None,
    )
    candidates = [
        (t, via, by)
        for t, via, by in (
            (down.t_ns if down else None, "balancer health check", "balancer"),
            (failed_end, "failed request", "load"),
        )
        if t is not None
    ]
    if candidates:
        t, s.detected_via, s.detected_by = min(candidates, key=lambda c: c[0])
        s.detect_t_ns = t
        s.time_to_detect_s = ns_to_s(t - tf)
    else:
        s.missing["time_to_detect_s"] = (
            "the balancer marked no faulted replica down and no request failed after the fault"
        )


def _recovery(s: Serving, load: Load, tf: int, failed_end: int | None) -> int | None:
    """The recovery from the fault at ``tf`` (:func:`recovery_ns`, not before ``failed_end``), in ``s``; returns
    its time, None when not recovered."""
    slo = load.slo
    span_ns = int(round(slo["recovery_window_s"] * 1e9))
    settle_ns = int(round(float(load.start.get("request_timeout_s") or 0.0) * 1e9))
    rec = recovery_ns(
        load.windows, tf, failed_end if failed_end is not None else tf, span_ns, slo["error_rate"], settle_ns
    )
    s.recovered = rec is not None
    if rec is not None:
        s.time_to_recover_s = ns_to_s(rec - tf)
    else:
        s.missing["time_to_recover_s"] = (
            f"no {slo['recovery_window_s']:g} s span after the fault with every window's "
            f"error rate <= {slo['error_rate']:g}, also for the request timeout after it, "
            "before the load ended"
        )
    return rec


def _phases(s: Serving, ix: TimelineIndex, load: Load, fault: Event, tf: int, rec: int | None) -> None:
    """The latency quantiles before, during and after the fault at ``tf`` (recovered at ``rec``, None: not
    recovered) and the throughput during it relative to before, in ``s``."""
    miss = s.missing
    wins = load.windows
    cut = teardown_ns(ix)
    # the fault is over at the later of the recovery and its revert (a delay that fails nothing lasts its duration)
    revert = next(
        (
            e.t_ns
            for e in ix.of("fault_revert")
            if e.get("fault") == fault.get("fault")
            and e.get("undone")
            and e.t_ns >= tf
            and (cut is None or e.t_ns < cut)
        ),
        None,
    )
    over = None if rec is None else max(rec, revert or rec)
    before = [w for w in wins if w.end_ns <= tf]
    during = [w for w in wins if w.end_ns > tf and (over is None or w.t_ns < over)]
    after = [w for w in wins if over is not None and w.t_ns >= over]
    for name, part, empty in (
        ("before", before, "no load window ended before the fault"),
        ("during", during, "no load window between the fault and the recovery"),
        ("after", after, "not recovered" if rec is None else "no load window after the recovery"),
    ):
        p50, p99 = latency(part, 0.5), latency(part, 0.99)
        setattr(s, f"latency_p50_{name}_ms", p50)
        setattr(s, f"latency_p99_{name}_ms", p99)
        if p50 is None:
            why = (
                empty
                if not part
                else f"no successful request {name} the fault"
                if name != "during"
                else "no successful request between the fault and the recovery"
            )
            miss[f"latency_p50_{name}_ms"] = miss[f"latency_p99_{name}_ms"] = why
    rate_before, rate_during = windows_rate_per_s(before), windows_rate_per_s(during)
    if rate_before and rate_during is not None:
        s.throughput_during_share = rate_during / rate_before
    else:
        miss["throughput_during_share"] = (
            "no request before the fault"
            if not rate_before
            else "no load window between the fault and the recovery"
        )


# ------------------------------------------------------------------------------------- per second, for plots
@dataclass(frozen=True)
class PerSecond:
    """The load per whole second since ``load_start`` (second k: windows starting in ``[k, k+1)`` s):
    successful and failed requests and the p99 latency of the successes (None without any)."""

    t_s: list[float]
    ok: list[int]
    failed: list[int]
    p99_ms: list[float | None]


def per_second(events: Sequence[Event]) -> PerSecond | None:
    """The run's load per second, or None when it is not a serving run."""
    load = load_of(TimelineIndex(events))
    if load is None:
        return None
    bins: dict[int, list[Window]] = {}
    for w in load.windows:
        bins.setdefault((w.t_ns - load.t0_ns) // 1_000_000_000, []).append(w)
    keys = sorted(bins)
    return PerSecond(
        [float(k) for k in keys],
        [sum(w.requests - w.failures for w in bins[k]) for k in keys],
        [sum(w.failures for w in bins[k]) for k in keys],
        [latency(bins[k], 0.99) for k in keys],
    )


def crash_loop(ix: TimelineIndex) -> bool:
    """Two or more incarnations of one replica each replaced before it was ready (``replica_ready``): a
    deterministic failure, such as a model file that fails every load."""
    started: dict[int, set[int]] = {}
    ready: set[tuple[int, int]] = set()
    for e in ix.of("rank_start", "replica_ready"):
        if e.get("rank") is None:
            continue
        rank, inc = int(e["rank"]), int(e.get("incarnation", 0))
        if e.kind == "rank_start":
            started.setdefault(rank, set()).add(inc)
        else:
            ready.add((rank, inc))
    for rank, incs in started.items():
        newest = max(incs)
        if sum(1 for i in incs if i < newest and (rank, i) not in ready) >= 2:
            return True
    return False
