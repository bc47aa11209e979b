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
    """``exact`` or ``diverged`` against the control, the final loss minus the control's, why a divergence was
    expected (``reason``: the run trained on another world and batch than the control), or why there is no
    verdict (``missing``)."""

    fidelity: str | None = None
    loss_diff: float | None = None
    missing: str | None = None
    reason: str | None = None


def trained_worlds(ix: TimelineIndex) -> list[tuple[int | None, int | None]]:
    """(world size, global batch) of every incarnation that completed a step, in incarnation order, and of every
    step that reported another global batch than its incarnation (per-step commit: fewer replica groups in the
    quorum), without repeats in a row."""
    out: list[tuple[int | None, int | None]] = []
    done = {inc for inc, _ in ix.steps.t}
    step_batches: dict[int, list[int]] = {}
    for e in ix.of("step"):
        if e.get("global_batch") is not None:
            step_batches.setdefault(incarnation(e), []).append(int(e["global_batch"]))
    for inc in ix.incarnations():
        if inc not in done:
            continue
        ws, gb = ix.world(inc)
        for w in [(ws, gb)] + [(ws, b) for b in step_batches.get(inc, [])]:
            if not out or out[-1] != w:
                out.append(w)
    return out


def world_change(run: TimelineIndex, control: TimelineIndex) -> str | None:
    """Why the run cannot end in the control's state: it trained on a global batch the control never did (or on
    another world size, where the workload reports no global batch). None when the worlds match, or are not
    reported."""
    ref = trained_worlds(control)
    if not ref:
        return None
    c_ws, c_gb = ref[0]
    for ws, gb in trained_worlds(run):
        batch_changed = gb is not None and c_gb is not None and gb != c_gb
        world_changed = ws is not None and c_ws is not None and ws != c_ws
        if batch_changed:
            world = f"world size {c_ws} -> {ws}: " if world_changed else ""
            return (f"{world}global batch {c_gb} -> {gb}, the run trained on another batch, data split and "
                    "schedule than the control and is expected to diverge")  # fmt: skip
        if world_changed and (gb is None or c_gb is None):
            return (f"world size {c_ws} -> {ws} (global batch not reported): the data split and schedule changed, "
                    "the run is expected to diverge")  # fmt: skip
    return None


def fidelity(final: Event | None, control: TimelineIndex | None, run: TimelineIndex | None = None) -> Fidelity:
    """The run's final ``train_end`` (``final``) against the control run's (``control``: its timeline); with the
    run's timeline (``run``), a divergence after a change of world or batch says so in ``reason``."""
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
    reason = world_change(run, control) if verdict == "diverged" and run is not None else None
    return Fidelity(verdict, loss_diff, reason=reason)


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
