"""Polling until something holds: the one deadline loop.

``wait_until(check, timeout_s)`` calls ``check`` until it returns something truthy (returned) or ``timeout_s``
has passed (None); ``check`` is called at least once, and once more at the deadline, so a condition that holds
just in time is not missed. To stop early with an error (a child that died while we waited for it), ``check``
raises. ``sleep`` replaces ``time.sleep`` where the caller must stay interruptible (the runner's
``RunControl.sleep``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """The first truthy value of ``check()`` within ``timeout_s`` seconds, polled every ``interval_s``; None when
    none came."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sleep(min(interval_s, left))
