"""The load of a ``serve`` run: locust users against one URL (the balancer), results per window on the timeline.

Run (the harness builds it with :meth:`chaosbench.workloads.serve.Serve.load_argv`)::

    python -m chaosbench.workloads.serve_load --target http://127.0.0.1:8100 --users 10 --duration-s 20 \\
        --mix predict=9,health=1

Contract (what the harness and the metrics rely on):

- locust is used as a library (``Environment``, a local runner, one ``HttpUser`` class whose tasks are the mix's
  endpoints with its weights, or with ``--requests`` the requests a suite declared: ``method path`` with a JSON
  ``body``, each with its weight; ``wait_time = constant(--wait-s)``), imported only in :func:`main`: importing it
  monkey-patches this process with gevent, so it lives in no other process.
- The target must be on loopback (127.0.0.0/8, ::1) or in a network named by ``--allow-cidr`` (the docker
  runtime's internal network); a host name is resolved and every address must qualify. Otherwise the program
  exits 2 with one line on stderr, before any request. Bad options exit 2 too.
- Events go to ``$CHAOSBENCH_EVENTS`` (``src: load``; none when unset), stamped on one clock: ``load_start``
  {target, users, spawn_rate, duration_s, window_s, mix (name -> weight), wait_s, request_timeout_s, max_requests,
  slo: {availability, window_days, error_rate, recovery_window_s}, requests (the declared ones, if any)}; then
  one ``load_window`` per window of ``--window-ms`` from ``load_start`` to ``load_end``, empty ones included,
  ``t_ns`` = the window's start: {window_s (its length; the last one may be shorter), requests, failures, errors
  {kind: count}, latency_hist, p50_ms, p99_ms, max_ms}; at the end ``load_end`` {requests, failures, duration_s,
  reason (duration | max_requests | signal), by_request {name: {requests, failures, unfinished}}}. A request
  counts in the window in which it completed. A request fails on a status >= 400 (a declared one: on any status
  but its ``expect_status``) or on an exception. ``errors`` keys: the HTTP status of a failed answer
  (``"502"``), else the exception's class name (``ConnectionRefusedError``, ``ReadTimeout``, ...).
  ``latency_hist[i]`` counts the *successful* requests with
  ``LATENCY_EDGES_MS[i-1] <= latency < LATENCY_EDGES_MS[i]`` (``i = 0``: below the first edge; the last:
  at or above the last edge), so it has ``len(LATENCY_EDGES_MS) + 1`` counts; p50/p99/max are of the
  successful requests too (nearest rank; None in a window without one).
- Bounds: the load stops at ``--duration-s`` after ``load_start`` or after ``--max-requests`` completed
  requests, whichever first; requests still in flight then are abandoned, not counted. Exit 0 when the load
  ran to that end, however many requests failed; SIGTERM/SIGINT end it early (``load_end`` reason ``signal``)
  with exit 1.
"""

from __future__ import annotations

import argparse
import bisect
import ipaddress
import json
import math
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from chaosbench.analysis.latency import LATENCY_EDGES_MS
from chaosbench.errors import TargetRefused
from chaosbench.probe import ENV_EVENTS
from chaosbench.timeline import TimelineWriter

PROGRAM = "chaosbench.workloads.serve_load"


#: Exit code for a refused target or bad options (argparse's too).
EXIT_USAGE = 2


# ------------------------------------------------------------------------------------------------ the target


def check_target(
    url: str, allow_cidrs: Sequence[str] = (), resolve: Callable[[str], list[str]] | None = None
) -> list[str]:
    """The addresses ``url``'s host stands for, each checked: loopback (127.0.0.0/8, ::1) or inside one of
    ``allow_cidrs``. Raises :class:`TargetRefused` (one line) otherwise, or when the URL is not ``http://host:port``.
    ``resolve``: host name -> addresses (default: ``getaddrinfo``)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise TargetRefused(url, "expected http://host:port")
    try:
        nets = [ipaddress.ip_network(c, strict=False) for c in allow_cidrs]
    except ValueError as exc:
        raise TargetRefused(None, f"--allow-cidr: {exc}") from None
    host = parts.hostname
    try:
        addrs = [str(ipaddress.ip_address(host))]
    except ValueError:
        addrs = (resolve or _resolve)(host)
        if not addrs:
            raise TargetRefused(url, f"host {host!r} does not resolve") from None
    for a in addrs:
        ip = ipaddress.ip_address(a)
        if not ip.is_loopback and not any(ip.version == n.version and ip in n for n in nets):
            allowed = "loopback" + "".join(f", {n}" for n in nets)
            raise TargetRefused(
                url,
                f"{a} is not in an allowed network ({allowed}); the load only goes to the run's "
                "own loopback addresses or its --allow-cidr network",
            )
    return addrs


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


# ------------------------------------------------------------------------------------------------ the windows


def error_kind(status: int | None, exception: BaseException | None, expect: int | None = None) -> str | None:
    """What a finished request counts as: None (a success), its HTTP status or its exception's class. Without
    ``expect`` a status >= 400 fails; with it (a declared request's expected status) any other status does, and
    the answer's status, whatever locust made of it, decides (a declared 404 is a success)."""
    if expect is not None and status:
        return None if status == expect else str(status)
    if status is not None and status >= 400:
        return str(status)
    if exception is not None:
        return type(exception).__name__
    return None


def nearest_rank(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of sorted values by nearest rank; None when there are none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass
class _Window:
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)


class WindowAggregator:
    """Requests grouped into consecutive windows of ``window_ns`` from ``start_ns`` (pure: no clock, no I/O).

    :meth:`add` files a completed request under the window its completion time falls in (one already closed:
    the oldest open one instead, so nothing is lost to a late stamp); :meth:`close_until` returns every window
    that ended by a time, :meth:`finish` the rest up to the end of the load (the last one cut short there). Each
    returned window is the ``load_window`` event's fields plus ``t_ns`` (its start)."""

    def __init__(self, start_ns: int, window_ns: int, edges_ms: Sequence[float] = LATENCY_EDGES_MS) -> None:
        if window_ns <= 0:
            raise ValueError("window_ns must be > 0")
        self.start_ns = start_ns
        self.window_ns = window_ns
        self.edges_ms = list(edges_ms)
        self._open: dict[int, _Window] = {}
        self._next = 0  # index of the oldest window not yet returned
        self.requests = 0
        self.failures = 0

    def index(self, t_ns: int) -> int:
        return max(self._next, (t_ns - self.start_ns) // self.window_ns)

    def add(self, t_ns: int, latency_ms: float, error: str | None) -> None:
        w = self._open.setdefault(self.index(t_ns), _Window())
        w.requests += 1
        self.requests += 1
        if error is None:
            w.latencies_ms.append(float(latency_ms))
        else:
            w.errors[error] += 1
            self.failures += 1

    def close_until(self, now_ns: int) -> list[dict[str, Any]]:
        """Every window not yet returned that ended at or before ``now_ns``, oldest first."""
        out = []
        while self.start_ns + (self._next + 1) * self.window_ns <= now_ns:
            out.append(self._emit(self._next, self.window_ns))
        return out

    def finish(self, end_ns: int) -> list[dict[str, Any]]:
        """The remaining windows up to ``end_ns``, the last one cut short there (its ``window_s`` is its length;
        none of length 0 unless requests were filed at or after ``end_ns``: they all count in that last one)."""
        out = self.close_until(end_ns)
        last = _Window()
        for i in sorted(self._open):  # all at or after the window holding end_ns
            w = self._open.pop(i)
            last.requests += w.requests
            last.errors.update(w.errors)
            last.latencies_ms += w.latencies_ms
        self._open[self._next] = last
        length_ns = end_ns - (self.start_ns + self._next * self.window_ns)
        if length_ns > 0 or last.requests:
            out.append(self._emit(self._next, max(0, length_ns)))
        else:
            del self._open[self._next]
        return out

    def _emit(self, i: int, length_ns: int) -> dict[str, Any]:
        w = self._open.pop(i, None) or _Window()
        self._next = i + 1
        lat = sorted(w.latencies_ms)
        hist = [0] * (len(self.edges_ms) + 1)
        for v in lat:
            hist[bisect.bisect_right(self.edges_ms, v)] += 1
        return {
            "t_ns": self.start_ns + i * self.window_ns,
            "window_s": length_ns / 1e9,
            "requests": w.requests,
            "failures": sum(w.errors.values()),
            "errors": dict(w.errors),
            "latency_hist": hist,
            "p50_ms": nearest_rank(lat, 0.5),
            "p99_ms": nearest_rank(lat, 0.99),
            "max_ms": lat[-1] if lat else None,
        }


# ------------------------------------------------------------------------------------------------ the program


def parse_mix(text: str) -> dict[str, int]:
    """``predict=9,health=1`` -> ``{"predict": 9, "health": 1}``."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, weight = part.strip().partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"mix entry {part!r}: expected endpoint=weight")
        try:
            out[name.strip()] = int(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"mix entry {part!r}: the weight is not an integer") from None
    return out


def parse_requests(text: str) -> list[Any]:
    """``--requests``: a JSON list (validated against the workload's model in :func:`parse_args`)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError("expected a JSON list of requests")
    return value


def parser() -> argparse.ArgumentParser:
    from chaosbench.workloads.serve import LoadOptions, LoadShape, SloOptions

    lo, slo = LoadShape.model_fields, SloOptions.model_fields
    p = argparse.ArgumentParser(
        prog=f"python -m {PROGRAM}",
        description="locust load against one serving URL, "
        "aggregated per window onto the run's timeline ($CHAOSBENCH_EVENTS).",
    )
    p.add_argument(
        "--target", required=True, help="http://host:port (loopback, or in an --allow-cidr network)"
    )
    p.add_argument(
        "--allow-cidr",
        action="append",
        default=[],
        metavar="CIDR",
        help="a network besides loopback the target may be in (repeatable)",
    )

    def opt(flag: str, fields: dict[str, Any], name: str, kind: Any) -> None:
        f = fields[name]
        default = f.get_default(call_default_factory=True)
        p.add_argument(
            flag,
            dest=flag[2:].replace("-", "_"),
            type=kind,
            default=default,
            help=f"{f.description} (default: {default})",
        )

    opt("--users", lo, "users", int)
    opt("--spawn-rate", lo, "spawn_rate", float)
    opt("--duration-s", lo, "duration_s", float)
    mix = LoadOptions.model_fields["mix"].get_default(call_default_factory=True)
    p.add_argument(
        "--mix", type=parse_mix, default=mix, help="endpoint=weight,... (default: predict=9,health=1)"
    )
    p.add_argument(
        "--requests",
        type=parse_requests,
        default=None,
        metavar="JSON",
        help="the declared requests instead of the mix: a JSON list of {name, method, path, body, "
        "expect_status, weight}",
    )
    opt("--wait-s", lo, "wait_s", float)
    opt("--request-timeout-s", lo, "request_timeout_s", float)
    opt("--window-ms", lo, "window_ms", int)
    opt("--max-requests", lo, "max_requests", int)
    opt("--slo-availability", slo, "availability", float)
    opt("--slo-window-days", slo, "window_days", float)
    opt("--slo-error-rate", slo, "error_rate", float)
    opt("--slo-recovery-window-s", slo, "recovery_window_s", float)
    return p


@dataclass
class LoadArgs:
    target: str
    allow_cidrs: list[str]
    load: Any  # serve.LoadOptions or serve.RequestLoadOptions
    slo: Any  # serve.SloOptions


def parse_args(argv: Sequence[str] | None = None) -> LoadArgs:
    """Parse and validate against the workload's option models; a bad option exits 2 with its message."""
    from pydantic import ValidationError

    from chaosbench.workloads.serve import LoadOptions, LoadShape, RequestLoadOptions, SloOptions

    p = parser()
    a = p.parse_args(argv)
    shape = {k: getattr(a, k) for k in LoadShape.model_fields}
    try:
        if a.requests is not None:
            load: Any = RequestLoadOptions.model_validate({**shape, "requests": a.requests})
        else:
            load = LoadOptions.model_validate({**shape, "mix": a.mix})
        slo = SloOptions.model_validate({k: getattr(a, f"slo_{k}") for k in SloOptions.model_fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        p.error(f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
    return LoadArgs(a.target, list(a.allow_cidr), load, slo)


class _Clock:
    """Wall-clock stamps that never go backwards: the start's wall time plus monotonic time since."""

    def __init__(self) -> None:
        self.wall0 = time.time_ns()
        self.mono0 = time.monotonic_ns()

    def now_ns(self) -> int:
        return self.wall0 + (time.monotonic_ns() - self.mono0)


def _predict_body(i: int) -> dict[str, Any]:
    """A deterministic request input (varies with ``i``)."""
    from chaosbench.workloads.serve_replica import IN_FEATURES

    return {"x": [math.sin(0.37 * i + k) for k in range(IN_FEATURES)]}


def mix_of(load: Any) -> dict[str, int]:
    """The load's request names and weights: the mix's endpoints, or the declared requests' names."""
    from chaosbench.workloads.serve import RequestLoadOptions

    if isinstance(load, RequestLoadOptions):
        return {r.label: r.weight for r in load.requests}
    return dict(load.mix)


def user_tasks(
    load: Any, started: Counter[str]
) -> tuple[dict[Callable[[Any], None], int], dict[str, int | None]]:
    """The locust user's tasks with their weights, and each request name's expected status (None: any status
    below 400 succeeds): the mix's built-in endpoints, or the declared requests (``load.requests``). Each task
    counts the requests it begins in ``started`` (by name)."""
    from chaosbench.workloads.serve import RequestLoadOptions

    timeout = load.request_timeout_s
    tasks: dict[Callable[[Any], None], int] = {}
    if isinstance(load, RequestLoadOptions):
        for r in load.requests:
            kwargs: dict[str, Any] = {"name": r.label, "timeout": timeout}
            if r.body is not None:
                kwargs["json"] = r.body

            def declared(user: Any, r: Any = r, kwargs: dict[str, Any] = kwargs) -> None:
                started[r.label] += 1
                user.client.request(r.method, r.path, **kwargs)

            tasks[declared] = r.weight
        return tasks, {r.label: r.expect_status for r in load.requests}
    bodies = [_predict_body(i) for i in range(64)]
    counter = [0]

    def predict(user: Any) -> None:
        counter[0] += 1
        started["predict"] += 1
        user.client.post("/predict", json=bodies[counter[0] % len(bodies)], name="predict", timeout=timeout)

    def health(user: Any) -> None:
        started["health"] += 1
        user.client.get("/health", name="health", timeout=timeout)

    def info(user: Any) -> None:
        started["info"] += 1
        user.client.get("/info", name="info", timeout=timeout)

    endpoints = {"predict": predict, "health": health, "info": info}
    return {endpoints[name]: weight for name, weight in load.mix.items()}, dict.fromkeys(load.mix)


class _Counting:
    """locust's request listener: each completed request filed in its window (``agg``) with its error kind (the
    request's own ``expect``-ed statuses are no error), and counted per request name; once ``max_requests`` are
    counted, ``full`` is called and later completions are abandoned, not counted."""

    def __init__(
        self,
        max_requests: int,
        expect: dict[str, Any],
        agg: WindowAggregator,
        clock: _Clock,
        full: Callable[[], None],
    ) -> None:
        self.max_requests, self.expect, self.agg, self.clock, self.full = (
            max_requests,
            expect,
            agg,
            clock,
            full,
        )
        self.counted: dict[str, list[int]] = {name: [0, 0] for name in expect}  # name -> [requests, failures]

    def __call__(
        self,
        response_time: float,
        response: Any = None,
        exception: BaseException | None = None,
        name: str | None = None,
        **_: Any,
    ) -> None:
        agg = self.agg
        if agg.requests >= self.max_requests:
            return  # completed after the bound was reached: abandoned, not counted
        status = getattr(response, "status_code", None)
        kind = error_kind(status or None, exception, self.expect.get(name or ""))
        agg.add(self.clock.now_ns(), response_time, kind)
        if name in self.counted:
            self.counted[name][0] += 1
            self.counted[name][1] += kind is not None
        if agg.requests >= self.max_requests:
            self.full()

    def by_request(self, started: Counter[str]) -> dict[str, dict[str, int]]:
        """Per request name: requests counted, failures, and started but never completed."""
        return {
            name: {"requests": n, "failures": f, "unfinished": started[name] - n}
            for name, (n, f) in self.counted.items()
        }


def _announce(emit: Callable[..., None], args: LoadArgs, start_ns: int) -> None:
    """The ``load_start`` event (the load's settings, its request mix, the SLO) and its line."""
    from chaosbench.workloads.serve import RequestLoadOptions

    lo, slo = args.load, args.slo
    mix = mix_of(lo)
    declared = (
        {"requests": [r.model_dump() for r in lo.requests]} if isinstance(lo, RequestLoadOptions) else {}
    )
    emit(
        "load_start",
        t_ns=start_ns,
        target=args.target,
        users=lo.users,
        spawn_rate=lo.spawn_rate,
        duration_s=lo.duration_s,
        window_s=lo.window_ms / 1000,
        mix=mix,
        wait_s=lo.wait_s,
        request_timeout_s=lo.request_timeout_s,
        max_requests=lo.max_requests,
        slo=slo.model_dump(),
        **declared,
    )
    print(f"load start: {lo.users} users on {args.target} for {lo.duration_s} s, mix {mix}", flush=True)


class _Events:
    """The load's events: to ``writer`` (nowhere when it is None), stamped ``t_ns`` or else now on ``clock``."""

    def __init__(self, writer: TimelineWriter | None, clock: _Clock) -> None:
        self.writer, self.clock = writer, clock

    def emit(self, kind: str, t_ns: int | None = None, **data: Any) -> None:
        if self.writer is not None:
            self.writer.emit(kind, t_ns=self.clock.now_ns() if t_ns is None else t_ns, **data)

    def windows(self, windows: list[dict[str, Any]]) -> None:
        """One ``load_window`` event per closed window."""
        for w in windows:
            self.emit("load_window", **w)


class _Stop:
    """Why the load ends (``reason``: None while it runs, then ``max_requests``, ``signal`` or ``duration``; the
    first one given stays) and ``done`` (a gevent Event), set when it ends."""

    def __init__(self, done: Any) -> None:
        self.reason: str | None = None
        self.done = done

    def full(self) -> None:
        """The ``max_requests``-th request was counted (:class:`_Counting`'s ``full``)."""
        if self.reason is None:
            self.reason = "max_requests"
            self.done.set()

    def on_signal(self) -> None:
        """SIGTERM or SIGINT: the load ends now."""
        if self.reason is None:
            self.reason = "signal"
        self.done.set()


def _user_class(args: LoadArgs, started: Counter[str]) -> tuple[type, dict[str, int | None]]:
    """The locust ``HttpUser`` class against ``args.target`` (its tasks: :func:`user_tasks`, counting the requests
    they begin in ``started``; ``wait_time`` constant ``wait_s``) and each request name's expected status."""
    from locust import HttpUser, constant

    lo = args.load
    tasks, expect = user_tasks(lo, started)
    user_class = type(
        "ServeUser",
        (HttpUser,),
        {
            "host": args.target.rstrip("/"),
            "wait_time": constant(lo.wait_s),
            "tasks": tasks,
        },
    )
    return user_class, expect


def _tick_windows(
    events: _Events, agg: WindowAggregator, clock: _Clock, done: Any, start_ns: int, window_ns: int
) -> None:
    """A greenlet until ``done`` is set: emits each window of ``window_ns`` (counted from ``start_ns``) as it
    ends, waking at the next window's end (a request completing later is filed in a later window)."""
    import gevent

    while not done.is_set():
        now = clock.now_ns()
        events.windows(agg.close_until(now))
        nxt = start_ns + (now - start_ns) // window_ns * window_ns + window_ns
        gevent.sleep(max(0.0, (nxt - clock.now_ns()) / 1e9))


def _report_end(
    events: _Events,
    agg: WindowAggregator,
    by_request: dict[str, dict[str, int]],
    reason: str | None,
    start_ns: int,
    end_ns: int,
) -> None:
    """The ``load_end`` event (stamped ``end_ns``: the counts, the duration, why it ended, ``by_request``) and its
    line."""
    duration_s = (end_ns - start_ns) / 1e9
    events.emit(
        "load_end",
        t_ns=end_ns,
        requests=agg.requests,
        failures=agg.failures,
        duration_s=duration_s,
        reason=reason,
        by_request=by_request,
    )
    print(
        f"load end ({reason}): {agg.requests} requests, {agg.failures} failed, in {duration_s:.2f} s",
        flush=True,
    )


def run_load(args: LoadArgs, writer: TimelineWriter | None) -> int:
    """Drive the load (see the module docstring); returns the exit code."""
    # importing locust monkey-patches this process with gevent (gevent's own import does not)
    import gevent
    import gevent.event
    from locust.env import Environment

    lo = args.load
    started: Counter[str] = Counter()
    user_class, expect = _user_class(args, started)
    env = Environment(user_classes=[user_class])
    clock = _Clock()
    window_ns = lo.window_ms * 1_000_000
    events = _Events(writer, clock)
    start_ns = clock.now_ns()
    agg = WindowAggregator(start_ns, window_ns)
    stop = _Stop(gevent.event.Event())
    on_request = _Counting(lo.max_requests, expect, agg, clock, stop.full)
    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    _announce(events.emit, args, start_ns)
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, stop.on_signal)
    tick = gevent.spawn(_tick_windows, events, agg, clock, stop.done, start_ns, window_ns)
    runner.start(lo.users, spawn_rate=lo.spawn_rate)
    if not stop.done.wait(timeout=max(0.0, lo.duration_s - (clock.now_ns() - start_ns) / 1e9)):
        stop.reason = "duration"
    stop.done.set()
    end_ns = clock.now_ns()
    # stop the users first: a request completing from here on is abandoned, not counted
    env.events.request.remove_listener(on_request)
    runner.quit()
    tick.kill()
    events.windows(agg.finish(end_ns))
    _report_end(events, agg, on_request.by_request(started), stop.reason, start_ns, end_ns)
    return 1 if stop.reason == "signal" else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_target(args.target, args.allow_cidrs)
    except TargetRefused as exc:
        print(f"serve_load: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    path = os.environ.get(ENV_EVENTS)
    writer = TimelineWriter(path, src="load") if path else None
    try:
        return run_load(args, writer)
    finally:
        if writer is not None:
            writer.close()


if __name__ == "__main__":
    sys.exit(main())
