"""One replica group's rank in a TorchFT training loop, wired to the timeline: what ``ft-mlp`` and ``pp-lm``'s
TorchFT mode share (each computes its own gradients in between).

:class:`FtLoop` builds the torchft ``Manager`` (its process group, the state it heals, its checkpoint transport
with ``heal_begin`` / ``heal_send`` / ``heal_end`` events), runs the synchronous quorum of each step (at the
job's start it waits for a quorum of every group; a quorum change is a ``quorum`` event, one that shrinks a
``detect``), and reports each step's commit (``step``) or skip (``step_skipped``, and the first skip of a streak a
``detect``). torch and torchft are imported when a loop is made: this module imports without them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chaosbench.probe import Probe
from chaosbench.signatures import rank_error

ENV_MIN_REPLICAS = "CHAOSBENCH_FT_MIN_REPLICAS"
ENV_HEARTBEAT_S = "CHAOSBENCH_FT_HEARTBEAT_INTERVAL_S"
ENV_HOSTNAME = "CHAOSBENCH_FT_HOSTNAME"
ENV_FRAMEWORK = "CHAOSBENCH_FRAMEWORK"
ENV_LOGLEVEL = "CHAOSBENCH_FT_LOGLEVEL"
ENV_START_GROUPS = "CHAOSBENCH_FT_START_GROUPS"
ENV_START_TIMEOUT_S = "CHAOSBENCH_FT_START_TIMEOUT_S"


def log_to_stderr() -> None:
    """torchft's own log lines on stderr, at ``CHAOSBENCH_FT_LOGLEVEL`` (default WARNING)."""
    level = os.environ.get(ENV_LOGLEVEL, "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


@dataclass
class Quorum:
    """A step's quorum: the step it trains, this group's participant rank (None: not participating), the number
    of participating groups and the quorum's id."""

    step: int
    participant: int | None
    participants: int
    quorum_id: int | None


class FtLoop:
    """The Manager of replica group ``group`` healing ``state`` (name -> an object with ``state_dict`` /
    ``load_state_dict``: the model, the optimizer, the scheduler), its process group timing out after
    ``pg_timeout_s``; ``healed`` names what a heal restored in the rank's ``healed ...to step N`` line (``""`` or
    ``"stage 1 "``); ``store``: the Manager's store (address, port), None: torchft's default."""

    def __init__(
        self,
        probe: Probe,
        group: int,
        state: Mapping[str, Any],
        pg_timeout_s: float,
        healed: str = "",
        store: tuple[str, int] | None = None,
    ) -> None:
        from torchft import Manager, ProcessGroupGloo
        from torchft.checkpointing import HTTPTransport

        self.probe = probe
        self.framework = os.environ.get(ENV_FRAMEWORK, "torchft")
        self._heal: dict[str, Any] = {}
        heal = self._heal

        def state_dict() -> dict[str, Any]:
            return {name: part.state_dict() for name, part in state.items()}

        def load_state_dict(sd: dict[str, Any]) -> None:
            for name, part in state.items():
                part.load_state_dict(sd[name])
            t0 = heal.pop("t0", None)
            probe.emit(
                "heal_end",
                step=heal.pop("step", None),
                duration_s=None if t0 is None else time.perf_counter() - t0,
            )
            print(f"healed {healed}to step {heal.get('last_step')}", flush=True)

        class ProbedTransport(HTTPTransport):
            """torchft's HTTP checkpoint transport, with heal events on the timeline."""

            def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
                heal.update(t0=time.perf_counter(), step=step, last_step=step)
                probe.emit("heal_begin", step=step, src_replica_rank=src_rank)
                return super().recv_checkpoint(src_rank, metadata, step, timeout)

            def send_checkpoint(
                self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
            ) -> None:
                probe.emit("heal_send", step=step, dst_replica_ranks=list(dst_ranks))
                super().send_checkpoint(dst_ranks, step, state_dict, timeout)

        manager_timeout = timedelta(seconds=float(os.environ.get("TORCHFT_TIMEOUT_SEC", "60")))
        where = {} if store is None else {"store_addr": store[0], "store_port": store[1]}
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=pg_timeout_s)),
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=int(os.environ.get(ENV_MIN_REPLICAS, "1")),
            use_async_quorum=False,
            replica_id=f"chaosbench_{group}",
            **where,
            hostname=os.environ.get(ENV_HOSTNAME) or __import__("socket").gethostname(),
            heartbeat_interval=timedelta(seconds=float(os.environ.get(ENV_HEARTBEAT_S, "0.1"))),
            checkpoint_transport=ProbedTransport(timeout=manager_timeout, num_chunks=0),
            init_sync=False,
        )
        self._quorum_id: int | None = None
        self._participants: int | None = None
        self._errored_streak = False
        # With min_replica_size below the groups the first group up would train alone until the others join (and
        # then heal them): at the job's start (not in a restarted group) wait for a quorum that holds every group.
        self._start_groups = int(os.environ.get(ENV_START_GROUPS, "1")) if probe.incarnation == 0 else 1
        self._start_deadline = time.monotonic() + float(os.environ.get(ENV_START_TIMEOUT_S, "60"))

    def current_step(self) -> int:
        return int(self.manager.current_step())

    def quorum(self) -> Quorum | None:
        """The next step's quorum (synchronous: a group that is behind heals here, before computing); None while
        the job's start waits for every group (call again)."""
        m = self.manager
        m.start_quorum()
        n = m.num_participants()
        if m.current_step() == 0 and n < self._start_groups and time.monotonic() < self._start_deadline:
            time.sleep(0.05)
            return None
        p = m.participating_rank()
        qid = getattr(m, "_quorum_id", None)  # torchft 0.2.0 keeps it private
        if qid != self._quorum_id:
            before = self._participants
            self.probe.emit(
                "quorum",
                quorum_id=qid,
                participants=n,
                previous_participants=before,
                replica_rank=p,
                step=m.current_step(),
            )
            if before is not None and n < before:
                self.probe.emit(
                    "detect",
                    framework=self.framework,
                    via="manager",
                    mechanism="quorum change",
                    reason=f"quorum {qid}: {n} of {before} replica groups",
                )
            self._quorum_id, self._participants = qid, n
        return Quorum(m.current_step() + 1, p, n, qid)

    def committed(self, q: Quorum, loss: float, t_step: float, global_batch: int) -> None:
        """The step was committed (the optimizer has stepped): its ``step`` event and line."""
        self._errored_streak = False
        step = self.current_step()
        self.probe.emit(
            "step",
            step=step,
            loss=loss,
            duration_s=time.perf_counter() - t_step,
            participants=q.participants,
            quorum_id=q.quorum_id,
            committed=True,
            global_batch=global_batch,
        )
        print(f"step {step} loss {loss:.6f} participants {q.participants}", flush=True)

    def skipped(self, q: Quorum, t_step: float, t_comm: float) -> None:
        """The step was not committed: ``step_skipped`` with why (the error the Manager kept, or too few groups),
        the compute thrown away (``duration_s``) and the time in the failed reduction and vote (``collective_s``);
        the first of a streak is a ``detect``."""
        err = self.manager.errored()
        n = q.participants
        reason = (
            f"{type(err.original_exception).__name__}: {str(err.original_exception).splitlines()[0][:300]}"
            if err is not None
            else f"not enough replica groups ({n} < min_replica_size)"
        )
        self.probe.emit(
            "step_skipped",
            step=q.step,
            reason=reason,
            duration_s=t_comm - t_step,
            collective_s=time.perf_counter() - t_comm,
            participants=n,
            quorum_id=q.quorum_id,
        )
        if not self._errored_streak:
            # its allreduce timed out, or failed otherwise (the harness then tells what it saw: a mismatch)
            timed_out = rank_error(reason) == "collective_timeout" or "timeout" in reason.lower()
            self.probe.emit(
                "detect",
                framework=self.framework,
                via="manager",
                reason=f"step {q.step} not committed: {reason}",
                **({"mechanism": "process-group timeout"} if timed_out else {}),
            )
            self._errored_streak = True
        print(f"step {q.step} skipped: {reason}", flush=True)

    def finish(self, loss: float | None, digest: str) -> None:
        """The job's end: ``train_end`` with the final digest, its line, the Manager shut down."""
        self.probe.train_end(self.current_step(), loss, digest)
        print(f"final digest {digest}", flush=True)
        self.manager.shutdown(wait=True)
