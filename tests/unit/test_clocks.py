"""Clock offsets: the NTP-style estimate and the correction of other hosts' stamps (no cluster needed)."""

from __future__ import annotations

from chaosbench.timeline import Event, clocks


def test_estimate_keeps_the_fastest_exchange() -> None:
    # node clock = harness clock + 5 ms; exchanges with 4 ms and 0.2 ms round trips
    samples = [
        clocks.ClockSample(1_000_000, 1_000_000 + 5_000_000 + 3_000_000, 1_000_000 + 4_000_000),
        clocks.ClockSample(10_000_000, 10_000_000 + 5_000_000 + 100_000, 10_000_000 + 200_000),
    ]
    off = clocks.estimate("node1", "h2", samples)
    assert off.rtt_ns == 200_000 and off.bound_ns == 100_000
    assert abs(off.offset_ns - 5_000_000) <= off.bound_ns


def _ev(t: int, kind: str, host: str, **data: object) -> Event:
    return Event(t_ns=t, kind=kind, src="rank" if host != "h0" else "harness", host=host, data=dict(data))


def test_correct_moves_other_hosts_onto_the_harness_clock() -> None:
    events = [
        _ev(0, "run_start", "h0"),
        _ev(
            1,
            "clock_offset",
            "h0",
            node="node1",
            node_host="h1",
            offset_ns=2_000,
            bound_ns=50,
            rtt_ns=100,
            samples=8,
        ),
        _ev(
            2,
            "clock_offset",
            "h0",
            node="node0",
            node_host="h0",
            offset_ns=-7,
            bound_ns=40,
            rtt_ns=80,
            samples=8,
        ),
        _ev(2_500, "step", "h1", step=1),  # written on h1, whose clock runs 2 us ahead: really at 500
        _ev(1_000, "fault_inject", "h0"),
        _ev(1_200, "step", "h2", step=2),  # h2 was never measured
    ]
    out = clocks.correct(events)
    assert [(e.kind, e.t_ns) for e in out] == [
        ("run_start", 0),
        ("clock_offset", 1),
        ("clock_offset", 2),
        ("step", 500),
        ("fault_inject", 1_000),
        ("step", 1_200),
    ]
    assert set(clocks.host_offsets(events)) == {"h1"}  # the harness's own host is never corrected
    assert clocks.uncorrected_hosts(events) == ["h2"]
    assert clocks.offset_bound_s(events) == 50 / 1e9


def test_no_measurement_no_change() -> None:
    events = [_ev(0, "run_start", "h0"), _ev(5, "step", "h1", step=1)]
    assert clocks.correct(events) == events and clocks.offset_bound_s(events) is None
