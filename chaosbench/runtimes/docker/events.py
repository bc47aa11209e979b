"""The engine's container events of one run: on the timeline (``node_start``, ``node_exit``, ``node_pause``,
``node_unpause``, stamped with the engine's time: one host, one clock) and kept per (container name, action) for
the moment a node fault took effect."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from chaosbench.runtimes.docker.nodes import NODE_LABEL, RUN_LABEL
from chaosbench.timeline import TimelineWriter, now_ns

#: A container id -> (its logical node, whether it is a spare); (None, False) while it is being provisioned.
Logical = Callable[[str], tuple[str | None, bool]]


class EngineEvents:
    """Follows the engine's events of run ``run_id``'s containers from :meth:`start` to :meth:`close`.
    ``exit_reasons``: container id -> why the runtime is about to stop it (its ``node_exit``'s reason; else
    "cleanup" once ``closing`` is set, "died" before)."""

    def __init__(self, timeline: TimelineWriter, run_id: str, closing: threading.Event) -> None:
        self.timeline, self.run_id, self.closing = timeline, run_id, closing
        self.exit_reasons: dict[str, str] = {}
        # (container name, action) -> the engine's stamps of that event (die, pause, ...)
        self._times: dict[tuple[str, str], list[int]] = {}
        self._cv = threading.Condition()
        self._started: set[str] = set()  # containers seen starting
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    def start(self, stream_client: Any, logical: Logical) -> None:
        since = time.time() - 1
        self._stream = stream_client.events(
            since=since, decode=True, filters={"label": f"{RUN_LABEL}={self.run_id}", "type": "container"}
        )
        t = threading.Thread(target=self._follow, args=(logical,), daemon=True, name="docker-events")
        t.start()
        self._thread = t

    def _follow(self, logical: Logical) -> None:
        with contextlib.suppress(Exception):
            for ev in self._stream:
                action = ev.get("Action") or ev.get("status")
                actor = ev.get("Actor") or {}
                attrs = actor.get("Attributes") or {}
                cid = actor.get("ID") or ev.get("id") or ""
                t_ns = int(ev.get("timeNano") or now_ns())
                node, spare = logical(cid)
                if node is None:  # still being provisioned
                    node = attrs.get(NODE_LABEL)
                    spare = str(node).startswith("spare")
                base = {"node": node, "container": attrs.get("name"), "src": "runtime"}
                with self._cv:
                    self._times.setdefault((str(attrs.get("name")), str(action)), []).append(t_ns)
                    self._cv.notify_all()
                if action == "start":
                    reason = "reboot" if cid in self._started else "provision"
                    self._started.add(cid)
                    self.timeline.emit("node_start", t_ns=t_ns, spare=spare, reason=reason, **base)
                elif action == "die":
                    code = int(attrs.get("exitCode", -1))
                    reason = self.exit_reasons.pop(cid, "cleanup" if self.closing.is_set() else "died")
                    self.timeline.emit("node_exit", t_ns=t_ns, exit_code=code, reason=reason, **base)
                elif action in ("pause", "unpause"):
                    self.timeline.emit(f"node_{action}", t_ns=t_ns, **base)

    def event_ns(self, container: str, action: str, since_ns: int, timeout_s: float = 5.0) -> int | None:
        """When the engine reported ``action`` for ``container`` at or after ``since_ns``, waiting up to
        ``timeout_s`` for the event to arrive; None when it did not."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                seen = [t for t in self._times.get((container, action), []) if t >= since_ns]
                if seen:
                    return min(seen)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)

    def close(self) -> None:
        if self._stream is not None:
            time.sleep(0.3)  # let the engine deliver the last `die` events
            with contextlib.suppress(Exception):
                self._stream.close()
            if self._thread is not None:
                self._thread.join(timeout=5)
