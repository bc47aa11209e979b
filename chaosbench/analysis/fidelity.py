"""Is the result right: where training ended, whether the final state equals the fault-free control's, whether
the replicas agree, and whether the run started from state it did not write (contamination). Definitions:
:mod:`chaosbench.analysis.metrics`."""

from __future__ import annotations

from dataclasses import dataclass

from chaosbench.analysis.timeline_index import TimelineIndex, incarnation
from chaosbench.timeline import Event


@dataclass(frozen=True)
class FinalState:
    """Where training ended and the state it ended in.

    ``step``: the ``train_end``'s own step, else the last step its incarnation completed; without a ``train_end``
    (a script that prints nothing at the end), the last step the newest stepping incarnation completed, when the
    job ended by itself with every rank exiting 0 (``run_end`` ``completed``). ``ended``: how the end is known
    (``train_end``, ``exit``; None: training did not end). ``digest``: the final artifact's (``artifact_digest``,
    the suite's ``fidelity_from``) when the run has one, else the ``train_end``'s; ``digest_from`` says which and
    ``no_digest`` why there is none. ``loss``: the ``train_end``'s, else the last loss a step of the final
    incarnation reported."""

    step: int | None = None
    ended: str | None = None
    incarnation: int | None = None
    loss: float | None = None
    digest: str | None = None
    digest_from: str | None = None
    no_digest: str | None = None

    def finished(self, total_steps: int | None) -> bool:
        """Training ended, at the configured total when there is one."""
        return (
            self.ended is not None
            and self.step is not None
            and (total_steps is None or self.step >= total_steps)
        )

    def short_of(self, total_steps: int | None) -> int | None:
        """How many steps short of ``total_steps`` a job that ended by itself stopped (None: it did not, or
        reached it)."""
        if self.ended is None or self.step is None or total_steps is None or self.step >= total_steps:
            return None
        return total_steps - self.step


def final_state(ix: TimelineIndex, run_end: Event | None) -> FinalState:
    """The run's :class:`FinalState` from its timeline (``run_end``: its ``run_end`` event, or None)."""
    steps = ix.steps
    final = ix.final
    inc: int | None
    if final is not None:
        inc = incarnation(final)
        done = steps.indices_of(inc)
        step = int(final["step"]) if final.get("step") is not None else (max(done) if done else None)
        ended: str | None = "train_end"
        loss = final.get("loss")
    else:
        inc = max((i for i, _ in steps.t), default=None)
        done = steps.indices_of(inc) if inc is not None else []
        exited = run_end is not None and run_end.get("outcome") == "completed"
        step = max(done) if done and exited else None
        ended = "exit" if step is not None else None
        loss = None
    if inc is not None and loss is None:
        losses = [e for e in ix.of("step") if incarnation(e) == inc and e.get("loss") is not None]
        loss = losses[-1].get("loss") if losses else None
    artifact = ix.last("artifact_digest")
    if artifact is not None:
        digest = artifact.get("digest") or None
        why = None if digest else f"its final artifact could not be digested: {artifact.get('error')}"
        return FinalState(step, ended, inc, loss, digest, "artifact" if digest else None, why)
    digest = (final.get("digest") or None) if final is not None else None
    if digest is not None:
        return FinalState(step, ended, inc, loss, digest, "train_end")
    why = ("its train_end carried no digest" if final is not None else "it printed no final line") + (
        " and the suite names no final artifact (fidelity_from)"
    )
    return FinalState(step, ended, inc, loss, no_digest=why)


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
            return (
                f"{world}global batch {c_gb} -> {gb}, the run trained on another batch, data split and "
                "schedule than the control and is expected to diverge"
            )
        if world_changed and (gb is None or c_gb is None):
            return (
                f"world size {c_ws} -> {ws} (global batch not reported): the data split and schedule changed, "
                "the run is expected to diverge"
            )
    return None


def fidelity(
    final: FinalState,
    control: FinalState | None,
    total_steps: int | None,
    run: TimelineIndex | None = None,
    control_ix: TimelineIndex | None = None,
) -> Fidelity:
    """The run's final state (``final``) against the control run's (``control``): ``exact`` when their digests
    are equal, ``diverged`` when they differ or training ended at another step; missing when either did not
    finish training or either has no digest (a missing digest equals nothing). With both timelines, a divergence
    after a change of world or batch says so in ``reason``."""
    if control is None:
        return Fidelity(missing="no control run")
    if not control.finished(total_steps):
        return Fidelity(missing="the control run did not finish training")
    if not final.finished(total_steps):
        return Fidelity(missing="this run did not finish training")
    loss_diff = None
    if final.loss is not None and control.loss is not None:
        loss_diff = float(final.loss) - float(control.loss)
    if final.step != control.step:
        verdict = "diverged"
    elif final.digest is None or control.digest is None:
        whose = [f"this run: {final.no_digest}"] if final.digest is None else []
        whose += [f"its control: {control.no_digest}"] if control.digest is None else []
        return Fidelity(loss_diff=loss_diff, missing="no final digest to compare (" + "; ".join(whose) + ")")
    elif final.digest_from != control.digest_from:
        return Fidelity(
            loss_diff=loss_diff,
            missing=f"the digests are of different things (this run's from its "
            f"{final.digest_from}, the control's from its {control.digest_from})",
        )
    else:
        verdict = "exact" if final.digest == control.digest else "diverged"
    reason = (
        world_change(run, control_ix)
        if verdict == "diverged" and run is not None and control_ix is not None
        else None
    )
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


def resumed_incarnations(ix: TimelineIndex) -> int:
    """The incarnations of a job that began after it had completed a step: each resumed training (from a
    checkpoint, or from scratch), so its final state is a recovery's. None under per-step commit (TorchFT: a
    restarted replica group heals from a live peer, the committed state goes on) and none for a restart before
    training began."""
    if ix.per_step_commit or not ix.steps.t:
        return 0
    first_step = min(ix.steps.t.values())
    return sum(1 for inc in ix.incarnations()[1:] if min(e.t_ns for e in ix.rank_starts_of(inc)) > first_step)


def contamination(ix: TimelineIndex) -> str | None:
    """Why this run started from state it did not write (a checkpoint of another run), or None."""
    incs = ix.incarnations()
    first_inc = incs[0] if incs else 0
    # A save this run began counts from its begin: a rank stopped between marking its checkpoint complete and
    # reporting the end (seen: ddp-mlp's rank 0 wrote COMPLETE, then its closing barrier failed on the peer the
    # fault had just killed, so no ckpt_save_end) left a checkpoint of this run that the next incarnation loads.
    first_save = min(
        (e.t_ns for e in ix.of("ckpt_save_begin", "ckpt_save_end") if e.src == "rank"), default=None
    )
    load = next((e for e in ix.of("ckpt_load_begin", "ckpt_load_end") if e.src == "rank"), None)
    # A load by the first incarnation cannot be of this run's own checkpoint; a later one can, unless the run
    # reported saves and none had begun before it (a script whose saves no pattern reports: not judged).
    if load is not None and (
        incarnation(load) == first_inc or (first_save is not None and load.t_ns < first_save)
    ):
        at = f" (step {load.get('step')})" if load.get("step") is not None else ""
        return (
            f"rank {load.get('rank', 0)} loaded a checkpoint{at} before this run had saved one: "
            "state from outside the run"
        )
    if not incs:
        return None
    if (
        ix.per_step_commit
    ):  # each replica group numbers its incarnations: a step is keyed by its quorum's newest
        idx = sorted({i for _, i in ix.steps.t})  # so the job's first steps are every step it committed
    else:
        idx = sorted(ix.steps.indices_of(first_inc))
    if len(idx) >= 2:
        # the widest gap between the steps it reported: a progress bar redraws every ~0.1 s, so its first count
        # may be a few steps in, as far as its later counts are apart; a resume from elsewhere starts far beyond
        spacing = max(b - a for a, b in zip(idx, idx[1:], strict=False)) if idx[-1] > idx[0] else 1
        # a line counted every K steps (step_every) stands for K steps: its first may be step K
        spacing = max(
            [spacing] + [int(e.get("every") or 0) for e in ix.of("step") if incarnation(e) == first_inc]
        )
        if idx[0] > max(1, spacing):
            return (
                f"its first incarnation's first step was {idx[0]} (steps at most {spacing} apart): it resumed "
                "from state this run did not write"
            )
    elif not idx:
        end = next((e for e in ix.of("train_end") if incarnation(e) == first_inc), None)
        if end is not None and (end.get("step") or 0) > 0:
            return f"it finished at step {end.get('step')} without completing a single step: it resumed from elsewhere"
    return None
