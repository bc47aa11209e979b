"""The probe: the tiny API a training program calls to put its own events on the run's timeline.

Standard-library only, so any training script can import it cheaply. Outside a chaosbench run (no
``CHAOSBENCH_EVENTS`` in the environment) every call is a no-op, so a script keeps working unchanged.

Every event is checked before it is written against its kind's model (the standard-library table
:data:`chaosbench.timeline.kinds.FIELDS`, generated from :mod:`chaosbench.timeline.schema`; the docs' table of
events (docs/events.md) lists every kind and field): an unknown kind, an undeclared field, a required field missing or a value of
the wrong type raises :class:`~chaosbench.errors.InvalidEvent` in the caller and nothing is written.

Environment read (set by the harness or the framework adapter):

- ``CHAOSBENCH_EVENTS``: path of the run's ``events.jsonl``.
- ``CHAOSBENCH_NODE``: the node this process runs on (default ``node0``).
- ``CHAOSBENCH_INCARNATION``: job-level incarnation set by the harness (default 0); torchrun's
  ``TORCHELASTIC_RESTART_COUNT`` is added, so a worker group restart is a new incarnation too, unless it is
  the count the harness gave a rank it launched itself (``CHAOSBENCH_RESTART_COUNT_COUNTED``, the same value):
  that one is already in ``CHAOSBENCH_INCARNATION``.
- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``: the usual torch.distributed variables.

Usage in a training loop::

    probe = Probe.from_env()
    probe.rank_start()
    ...
    probe.step(step, loss)
    with probe.ckpt_save(step, path): save(...)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from chaosbench.procutil import start_ticks
from chaosbench.timeline import TimelineWriter

ENV_EVENTS = "CHAOSBENCH_EVENTS"
ENV_NODE = "CHAOSBENCH_NODE"
ENV_INCARNATION = "CHAOSBENCH_INCARNATION"
#: Set by the harness beside the ``TORCHELASTIC_RESTART_COUNT`` it gives a rank it launches itself (torchrun's
#: worker environment, :func:`chaosbench.frameworks.base.torchrun_worker_env`), to the same value: that count is
#: the harness's own restarts, already in ``CHAOSBENCH_INCARNATION``.
ENV_RESTART_COUNT_COUNTED = "CHAOSBENCH_RESTART_COUNT_COUNTED"


def incarnation_from_env(env: dict[str, str] | None = None) -> int:
    """Job incarnation: ``CHAOSBENCH_INCARNATION`` (the harness's restarts) plus torch elastic's worker-group
    restart count ``TORCHELASTIC_RESTART_COUNT`` when a torch elastic agent (torchrun, ft_launcher) set it. A count
    equal to ``CHAOSBENCH_RESTART_COUNT_COUNTED`` is the one the harness gave a rank it launched itself, already
    counted, and is not added; an agent started inside such a rank sets its own count, which is added (unless it
    happens to be that same number)."""
    env = dict(os.environ) if env is None else env
    incarnation = int(env.get(ENV_INCARNATION, "0") or 0)
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "")
    if restarts and restarts != env.get(ENV_RESTART_COUNT_COUNTED):
        incarnation += int(restarts)
    return incarnation


class Probe:
    """Writes rank events; every method is a no-op when the probe is disabled."""

    def __init__(
        self,
        path: str | None,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        node: str = "node0",
        incarnation: int = 0,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node = node
        self.incarnation = incarnation
        self._writer = TimelineWriter(path, src="rank") if path else None

    @classmethod
    def from_env(cls) -> Probe:
        """The probe of this process, from the environment the harness set (module docstring).

        Returns:
            A probe writing to ``CHAOSBENCH_EVENTS`` as rank ``RANK`` (default 0) of ``WORLD_SIZE`` (default 1);
            disabled (every call a no-op) when ``CHAOSBENCH_EVENTS`` is not set.

        Raises:
            ValueError: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``CHAOSBENCH_INCARNATION`` or
                ``TORCHELASTIC_RESTART_COUNT`` is set but not an integer (an empty ``CHAOSBENCH_INCARNATION`` or
                ``TORCHELASTIC_RESTART_COUNT`` counts as unset).
        """
        env = os.environ
        return cls(
            env.get(ENV_EVENTS),
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            node=env.get(ENV_NODE, "node0"),
            incarnation=incarnation_from_env(),
        )

    @property
    def enabled(self) -> bool:
        """Whether the probe writes events (it has a timeline to write to)."""
        return self._writer is not None

    def emit(self, kind: str, **data: Any) -> None:
        """One event of this rank, stamped now, or at ``t_ns=`` (wall-clock ns: when it happened, if earlier), with
        ``rank`` and ``incarnation`` added. Raises :class:`~chaosbench.errors.InvalidEvent` for an event its kind's
        model refuses (module docstring).

        Args:
            kind: The event's kind (``step``, ``rank_start``, ...).
            **data: The event's fields; ``t_ns`` (wall-clock ns), when given, is its time instead of now.
                ``rank`` and ``incarnation`` default to this probe's.

        Raises:
            InvalidEvent: ``kind`` is not a known kind, or a field is undeclared, missing or of the wrong type;
                nothing is written.
            ValueError: The probe was closed (:meth:`close`).
        """
        if self._writer is None:
            return
        t_ns = data.pop("t_ns", None)
        data.setdefault("rank", self.rank)
        data.setdefault("incarnation", self.incarnation)
        self._writer.emit(kind, t_ns=t_ns, **data)

    def rank_start(self, pid: int | None = None, **extra: Any) -> None:
        """Call first thing: gives the harness this rank's pid so injectors can target it. ``extra`` fields
        (e.g. ``global_batch``: samples per optimizer step over all ranks) go into the event as they are; each
        must be a field the ``rank_start`` model declares.

        Args:
            pid: The rank's pid; None: this process's.
            **extra: More fields of the ``rank_start`` event.

        Raises:
            InvalidEvent: A field of ``extra`` is not declared by the ``rank_start`` model or has the wrong type.
        """
        pid = os.getpid() if pid is None else pid
        self.emit(
            "rank_start",
            pid=pid,
            pid_ticks=start_ticks(pid),
            world_size=self.world_size,
            local_rank=self.local_rank,
            node=self.node,
            **extra,
        )

    def step(
        self,
        step: int,
        loss: float | None = None,
        duration_s: float | None = None,
        t_ns: int | None = None,
        every: int | None = None,
        **extra: Any,
    ) -> None:
        """Step ``step`` (1-based count of completed optimizer steps) has completed (now, or at ``t_ns``).

        ``duration_s``: the seconds this step's own compute took (forward, backward, optimizer), measured
        by the caller; metrics fall back to the interval between events when it is not given. ``every``: the
        step was counted from a line printed every ``every`` steps without its number.

        Args:
            step: The 1-based count of completed optimizer steps.
            loss: The step's loss; None when not known.
            duration_s: The seconds this step's own compute took; None: not measured.
            t_ns: When the step completed (wall-clock ns); None: now.
            every: The printing interval the step was counted from; None: the step printed its own number.
            **extra: More fields of the ``step`` event (``participants``, ``quorum_id``, ``committed``).

        Raises:
            InvalidEvent: A field of ``extra`` is not declared by the ``step`` model or has the wrong type.
        """
        data: dict[str, Any] = {"step": int(step), "loss": None if loss is None else float(loss)}
        if duration_s is not None:
            data["duration_s"] = float(duration_s)
        if every is not None:
            data["every"] = int(every)
        self.emit("step", t_ns=t_ns, **data, **extra)

    @contextlib.contextmanager
    def ckpt_save(self, step: int, path: str) -> Iterator[dict[str, Any]]:
        """Brackets a checkpoint save. Set ``info["complete"] = True`` once the checkpoint is marked complete.

        Writes ``ckpt_save_begin`` on entry and ``ckpt_save_end`` (with ``complete``) on a normal exit; an
        exception in the block propagates and writes no ``ckpt_save_end``.

        Args:
            step: The step the checkpoint holds.
            path: Where it is saved.

        Yields:
            ``info``: a dict whose ``complete`` the caller sets True once the checkpoint is complete.
        """
        info: dict[str, Any] = {"complete": False}
        self.emit("ckpt_save_begin", step=int(step), path=str(path))
        yield info
        self.emit("ckpt_save_end", step=int(step), path=str(path), complete=bool(info["complete"]))

    @contextlib.contextmanager
    def ckpt_load(self, step: int, path: str) -> Iterator[None]:
        """Brackets a checkpoint load: ``ckpt_load_begin`` on entry, ``ckpt_load_end`` on a normal exit (an
        exception in the block propagates and writes no ``ckpt_load_end``).

        Args:
            step: The step the checkpoint holds.
            path: Where it is loaded from.

        Yields:
            Nothing (None).
        """
        self.emit("ckpt_load_begin", step=int(step), path=str(path))
        yield
        self.emit("ckpt_load_end", step=int(step), path=str(path))

    def train_end(self, step: int, loss: float | None, digest: str) -> None:
        """Training finished: the final step, loss and a digest of the final parameters.

        Args:
            step: The last completed step.
            loss: The final loss; None when not known.
            digest: A digest of the final parameters (compared across runs for fidelity).
        """
        self.emit("train_end", step=int(step), loss=None if loss is None else float(loss), digest=digest)

    def close(self) -> None:
        """Close the probe's timeline file (nothing to do when disabled); an event emitted afterwards raises ValueError."""
        if self._writer is not None:
            self._writer.close()
