"""What a framework (and its workload) did with a damaged checkpoint, read from the run's timeline alone.

Classes (:data:`CHECKPOINT_OUTCOMES`), for a run with a ``corrupt-checkpoint`` firing whose details name the
damaged (or torn) checkpoint's step ``S``, or an ``sdc`` that poisoned checkpoint ``S`` (``where: save``). A *restore* is an incarnation started after the fault that loads a
checkpoint; it *failed* when some rank began a load (``ckpt_load_begin``) and did not finish it
(``ckpt_load_end``), *succeeded* when every rank that began one finished it. The first successful restore
after the fault decides; failed restores before it are counted:

- ``loaded_silently``: it loaded step ``S``, the damaged checkpoint (the fidelity check then says whether
  that mattered: a bit flip in a weight is ``diverged``).
- ``fell_back``: it loaded a step older than ``S``, or trained from scratch after a failed restore: the
  damage was detected (by a failed load, a missing marker or a verification) and avoided.
- ``not_loaded``: no restore happened after the fault (nothing restarted), or the restore used a newer
  checkpoint than ``S``, or it trained from scratch without any failed load: the damaged checkpoint was
  never read.
- ``crashed``: no successful restore, and exactly one incarnation failed while loading.
- ``crash_looped``: no successful restore, and two or more incarnations failed while loading.

None when the injector found that it damaged nothing (``damaged: false`` in its details: a torn write whose
kill landed after the save had finished); the metrics then say why (:func:`undamaged_reason`).

A serving run's replicas load their model file between ``model_load_begin`` and ``model_load_end``
(``load_kinds``): there a restarted replica's load of the damaged file is the restore.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from chaosbench.injectors.legacy import declared
from chaosbench.timeline import Event

CHECKPOINT_OUTCOMES = ("fell_back", "crashed", "crash_looped", "loaded_silently", "not_loaded")


def corruption_fault(events: list[Event]) -> Event | None:
    """The first ``fault_inject`` event of a fault that damaged a checkpoint (its ``damages_checkpoint``, as its
    injector declares it: a ``corrupt-checkpoint``, an ``sdc`` with ``where: save``), or None."""
    return next((e for e in events if e.kind == "fault_inject" and declared(e, "damages_checkpoint")), None)


def _incarnation(ev: Event) -> int:
    return int(ev.get("incarnation", 0) or 0)


def undamaged_reason(events: list[Event]) -> str | None:
    """Why the run's checkpoint-damaging fault damaged nothing, as its injector found (``damaged: false`` in its
    details, with ``undamaged``: a torn write whose kill landed after the save had finished); else None."""
    fault = corruption_fault(events)
    details = (fault.get("details") or {}) if fault is not None else {}
    if details.get("damaged") is False:
        return str(details.get("undamaged") or "the injector found nothing damaged")
    return None


#: The events that bracket a checkpoint load: a training rank's, and a serving replica's model load.
TRAINING_LOADS = ("ckpt_load_begin", "ckpt_load_end")
MODEL_LOADS = ("model_load_begin", "model_load_end")


def classify_checkpoint_outcome(
    events: list[Event], control: bool = False, load_kinds: tuple[str, str] = TRAINING_LOADS
) -> str | None:
    """One of :data:`CHECKPOINT_OUTCOMES` for a run with a ``corrupt-checkpoint`` firing; None for runs
    without one (controls, other faults, a skipped corruption). ``events`` sorted by time, as
    :func:`chaosbench.timeline.read_events` returns them; ``load_kinds``: the (begin, end) event kinds of a
    load."""
    if control:
        return None
    fault = corruption_fault(events)
    if fault is None:
        return None
    if undamaged_reason(events) is not None:  # the injector found nothing damaged
        return None
    details: dict[str, Any] = fault.get("details") or {"step": fault.get("checkpoint_step")}
    damaged = details.get("step")
    damaged_step = int(damaged) if isinstance(damaged, int | float) else None
    tf = fault.t_ns
    fault_inc = max((_incarnation(e) for e in events if e.kind == "rank_start" and e.t_ns <= tf), default=0)

    ckpt = details.get("checkpoint")
    damaged_paths = {os.path.normpath(str(c)) for c in (ckpt if isinstance(ckpt, list) else [ckpt]) if c}

    begun: dict[int, dict[int, int]] = defaultdict(dict)  # incarnation -> rank -> step whose load began
    ended: dict[int, dict[int, int]] = defaultdict(dict)
    ended_paths: dict[int, set[str]] = defaultdict(set)
    stepped: set[int] = set()
    incarnations: set[int] = set()
    for e in events:
        if e.t_ns < tf or e.src != "rank":
            continue
        inc = _incarnation(e)
        if inc <= fault_inc:  # restores happen in incarnations started after the fault
            continue
        incarnations.add(inc)
        rank = int(e.get("rank", 0) or 0)
        if e.kind == load_kinds[0]:
            begun[inc].setdefault(rank, int(e.get("step", -1)))
        elif e.kind == load_kinds[1]:
            ended[inc].setdefault(rank, int(e.get("step", -1)))
            if e.get("path"):
                ended_paths[inc].add(os.path.normpath(str(e.get("path"))))
        elif e.kind == "step":
            stepped.add(inc)

    failed = 0
    for inc in sorted(incarnations):
        if any(rank not in ended[inc] for rank in begun[inc]):
            failed += 1
            continue
        if ended[inc]:
            step = min(ended[inc].values())
            if damaged_step is None:  # unnumbered checkpoints: compare paths
                if ended_paths[inc] & damaged_paths:
                    return "loaded_silently"
                return "fell_back" if failed else "not_loaded"
            if step == damaged_step:
                return "loaded_silently"
            if step < damaged_step:
                return "fell_back"
            return "not_loaded"  # a newer checkpoint superseded the damaged one
        if inc in stepped:  # trained from scratch
            return "fell_back" if failed else "not_loaded"
    if failed >= 2:
        return "crash_looped"
    if failed == 1:
        return "crashed"
    return "not_loaded"
