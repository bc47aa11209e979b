"""What a ``fault_inject`` event written before injectors declared themselves says about its fault.

Each injector declares its fleet fault class, its failure mode and whether it damages a checkpoint
(:meth:`chaosbench.injectors.base.Injector.declared`) and writes them into every ``fault_inject`` event:
``fault_class``, ``failure_mode``, ``damages_checkpoint``. Analysis and reports read them from the event through
:func:`declared`, never from the injector's name.

Timelines written before that (the kept fixtures, the ``reports/`` of earlier runs, a user's script that plants
its faults from an older entry) lack those fields. For them, and only for them (an event that has the field,
even as null, is never second-guessed), :func:`declared` falls back on the table below: the rules analysis used
then, by injector name, kept exactly so that old runs' figures recompute as they were, drift included: a legacy
``kill`` with SIGTTIN or SIGTTOU (which stop a process) or with a harmless signal (SIGCONT) is a crash here,
while the ``kill`` injector now declares the first a hang and the second no fleet fault; and a legacy planted
``thread-exception`` (whose event never carried its ``params``) has no class here, while the injector now
declares ``mode: stall`` a hang.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

#: The fleet fault class of each injector name, as analysis read it before injectors declared it.
LEGACY_FAULT_CLASSES: dict[str, str] = {
    "kill": "crash",
    "crash-loop": "crash",
    "segfault": "crash",
    "abort": "crash",
    "oom": "crash",
    "sigterm": "crash",
    "local-node-kill": "node",
    "node-kill": "node",
    "slurm-node-down": "node",
    "partition": "node",
    "hang": "hang",
    "node-pause": "hang",
    "gil-hold": "hang",
    "sdc": "sdc",
}
#: The ``kill`` signals that legacy analysis took for a hang.
_LEGACY_STOP_SIGNALS = ("SIGSTOP", "STOP", "SIGTSTP")
#: The injector whose every firing damages a checkpoint.
_LEGACY_CHECKPOINT_INJECTOR = "corrupt-checkpoint"

#: The fields an injector declares in its ``fault_inject`` events.
DECLARED_FIELDS = ("fault_class", "failure_mode", "damages_checkpoint")


class _FaultEvent(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


def _has(fault: _FaultEvent | Mapping[str, Any], key: str) -> bool:
    data = getattr(fault, "data", fault)
    return isinstance(data, Mapping) and key in data


def legacy_fault_class(injector: str | None, params: Mapping[str, Any] | None = None) -> str | None:
    """The fleet fault class legacy analysis gave a fault of ``injector`` with ``params``."""
    if injector == "kill" and str((params or {}).get("signal", "")).upper() in _LEGACY_STOP_SIGNALS:
        return "hang"
    if injector == "thread-exception":
        return "hang" if (params or {}).get("mode") == "stall" else None
    return LEGACY_FAULT_CLASSES.get(injector or "")


def declared(fault: _FaultEvent | Mapping[str, Any], key: str) -> Any:
    """``fault``'s (a ``fault_inject`` event's, or a row of one) declared field ``key`` (one of
    :data:`DECLARED_FIELDS`): the event's own value when it has the field, else what legacy analysis made of
    its injector's name (``failure_mode``: None, no reader needed it then)."""
    if key not in DECLARED_FIELDS:
        raise KeyError(f"{key!r} is not a declared fault field ({', '.join(DECLARED_FIELDS)})")
    if _has(fault, key):
        return fault.get(key)
    injector = fault.get("injector")
    if key == "fault_class":
        return legacy_fault_class(injector, fault.get("params"))
    if key == "damages_checkpoint":
        return injector == _LEGACY_CHECKPOINT_INJECTOR or (
            injector == "sdc" and fault.get("checkpoint_step") is not None
        )
    return None
