"""The one polling loop."""

from __future__ import annotations

import time

import pytest

from chaosbench.waiting import wait_until


def test_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", "ready", "later"])
    assert wait_until(lambda: next(calls), 5.0, interval_s=0.001) == "ready"


def test_none_after_the_timeout_with_a_last_look_at_the_deadline() -> None:
    seen: list[float] = []
    t0 = time.monotonic()
    assert wait_until(lambda: seen.append(time.monotonic()), 0.2, interval_s=0.05) is None
    assert 0.2 <= time.monotonic() - t0 < 1.0
    assert seen[-1] - t0 >= 0.2  # checked once more at the deadline
    assert 3 <= len(seen) <= 10


def test_a_check_that_raises_ends_the_wait() -> None:
    def dead() -> bool:
        raise RuntimeError("the child died")

    with pytest.raises(RuntimeError, match="the child died"):
        wait_until(dead, 5.0)


def test_the_given_sleep_is_used_and_never_oversleeps_the_deadline() -> None:
    naps: list[float] = []
    wait_until(lambda: False, 0.05, interval_s=10.0, sleep=lambda s: (naps.append(s), time.sleep(s)))
    assert naps and all(0 < s <= 0.05 for s in naps)
