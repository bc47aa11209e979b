"""Is the result right: where training ended, whether the final state equals the fault-free control's, whether
the replicas agree, and whether the run started from state it did not write (contamination). Definitions:
:mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

from dataclasses import dataclass

from chaosbench.analysis.timeline_index import JobSteps, TimelineIndex, incarnation
from chaosbench.timeline import Event


def final_step(final: Event, steps: JobSteps) -> int | None:
    """The step training ended at: the ``train_end``'s own, else the last step its incarnation completed."""
    if final.get("step") is not None:
        return int(final["step"])
    done = steps.indices_of(incarnation(final))
    return max(done) if done else None


@dataclass(frozen=True)
class Fidelity:
    """``exact`` or ``diverged`` against the control, the final loss minus the control's, or why there is no
    verdict (``missing``)."""

    fidelity: str | None = None
    loss_diff: float | None = None
    missing: str | None = None


def fidelity(final: Event | None, control: TimelineIndex | None) -> Fidelity:
    """The run's final ``train_end`` (``final``) against the control run's (``control``: its timeline)."""
    if control is None:
        return Fidelity(missing="no control run")
    c_final = control.final
    if c_final is None:
        return Fidelity(missing="the control run did not finish training")
    if final is None:
        return Fidelity(missing="this run did not finish training")
    if final.get("step") != c_final.get("step"):
        verdict = "diverged"
    else:
        verdict = "exact" if final.get("digest") == c_final.get("digest") else "diverged"
    loss_diff = None
    if final.get("loss") is not None and c_final.get("loss") is not None:
        loss_diff = float(final["loss"]) - float(c_final["loss"])
    return Fidelity(verdict, loss_diff)


def ranks_agree(ix: TimelineIndex) -> tuple[bool | None, str | None]:
    """(every rank's final digest, its newest ``train_end``'s, is the same; why that is unknown). TorchFT's
    replica groups end in different incarnations."""
    latest: dict[int, Event] = {}
    for e in ix.of("train_end"):
        if e.get("digest"):
            r = int(e.get("rank", 0))
            if r not in latest or incarnation(e) >= incarnation(latest[r]):
                latest[r] = e
    if len(latest) >= 2:
        return len({e.get("digest") for e in latest.values()}) == 1, None
    if latest:
        return None, "only one rank reported a final digest"
    return None, None


def contamination(ix: TimelineIndex) -> str | None:
    """Why this run started from state it did not write (a checkpoint of another run), or None."""
    incs = ix.incarnations()
    first_inc = incs[0] if incs else 0
    first_save = min((e.t_ns for e in ix.of("ckpt_save_end") if e.src == "rank"), default=None)
    load = next((e for e in ix.of("ckpt_load_begin", "ckpt_load_end") if e.src == "rank"), None)
    # A load by the first incarnation cannot be of this run's own checkpoint; a later one can, unless the run
    # reported saves and none came before it (a script whose saves no pattern reports: not judged).
    if load is not None and (incarnation(load) == first_inc or (first_save is not None and load.t_ns < first_save)):
        at = f" (step {load.get('step')})" if load.get("step") is not None else ""
        return (f"rank {load.get('rank', 0)} loaded a checkpoint{at} before this run had saved one: "
                "state from outside the run")  # fmt: skip
    if not incs:
        return None
    idx = sorted(ix.steps.indices_of(first_inc))
    if len(idx) >= 2:
        spacing = min(b - a for a, b in zip(idx, idx[1:], strict=False) if b > a) if idx[-1] > idx[0] else 1
        if idx[0] > max(1, spacing):
            return (f"its first incarnation's first step was {idx[0]} (steps every {spacing}): it resumed from "
                    "state this run did not write")  # fmt: skip
    elif not idx:
        end = next((e for e in ix.of("train_end") if incarnation(e) == first_inc), None)
        if end is not None and (end.get("step") or 0) > 0:
            return f"it finished at step {end.get('step')} without completing a single step: it resumed from elsewhere"
    return None
