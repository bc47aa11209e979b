"""restart's step watchdog on scripts that print nothing at the end: a rank past the workload's last step is done,
its slow exit (a final save, a process-group teardown) is no hang."""

from __future__ import annotations

from chaosbench.frameworks.restart import StepWatchdog
from chaosbench.timeline import Event

S = 1_000_000_000


def step(rank: int, n: int, t_s: float) -> Event:
    return Event(t_ns=int(t_s * S), kind="step", src="rank", data={"rank": rank, "step": n, "incarnation": 0})


def test_a_rank_past_the_last_step_is_not_hung() -> None:
    dog = StepWatchdog(heartbeat_timeout_s=1.0, startup_timeout_s=60.0, total_steps=30)
    dog.reset(0)
    dog(step(0, 29, 1.0))
    dog(step(1, 30, 1.0))
    # 5 s later: rank 0 stopped one step short (hung), rank 1 finished its last step and is exiting
    assert dog.stale(2, 1.0, int(6.0 * S)) == (0, 5.0)
    dog(step(0, 30, 6.0))
    assert dog.stale(2, 1.0, int(20.0 * S)) is None


def test_without_a_total_every_silent_rank_is_stale() -> None:
    dog = StepWatchdog(heartbeat_timeout_s=1.0, startup_timeout_s=60.0)
    dog.reset(0)
    dog(step(0, 30, 1.0))
    assert dog.stale(1, 1.0, int(3.0 * S)) == (0, 2.0)
