"""Users' real trainers, unmodified, through the `command` workload (docs/workloads.md): a Lightning script, a Hugging Face
Trainer script and a PyTorch-tutorial epoch script (tests/fixtures/foreign/: none imports chaosbench; their own
checkpoints, log lines and default timeouts), under restart and torchrun with a killed rank, the Lightning one
also with a hung rank, and the tutorial under `none` (a kill it does not recover from).

Every expected figure is read from the script's own output in the run's logs (and, for the Hugging Face Trainer,
its checkpoint directories), not from chaosbench's events: where the counter of rank 0 (and of every rank that
logs) stood when the kill hit, where the resumed incarnation started again, the final digests the scripts print
or the final model they save. Nothing of chaosbench tells a script's counting, checkpoints or end: 0-based
counters (Lightning's global_step, the tutorial's epochs), a progress bar on the main process only with a loss
line every 10 steps (HF), checkpoints only as files, and no closing line (HF, the tutorial).

Measured here (2 cores): the three suites take about 5 minutes together (Lightning 2m10s, HF 1m40s, tutorial 1m).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from chaosbench.analysis.metrics import RECOVERY_METRICS, RunMetrics
from tests.conftest import ROOT
from tests.helpers import require, story
from tests.helpers.truth import assert_torchrun_blamed_by_the_logs

pytestmark = pytest.mark.integration

FOREIGN = ROOT / "tests" / "fixtures" / "foreign"


def _trainers_problem() -> str | None:
    missing = [m for m in ("lightning", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed (pip install -e '.[trainers]')" if missing else None


require("trainers", _trainers_problem())


def rank_output(m: RunMetrics) -> str:
    """Everything the script printed, in incarnation order: the shim's logs (one file per rank and incarnation
    under restart and none; torchrun's own log holds its workers' output)."""
    logs = Path(str(m.run_dir)) / "logs"
    files = sorted(
        logs.glob("rank*.out"), key=lambda p: (int(re.search(r"\.i(\d+)", p.name).group(1)), p.name)
    )  # type: ignore[union-attr]
    files += [logs / "torchrun.out"] if (logs / "torchrun.out").exists() else []
    return "".join(p.read_text(errors="replace") for p in files)


def back_at(values: list[int]) -> list[list[int]]:
    """A counter's values split where it goes back: a restarted job resumes behind where it stood."""
    out: list[list[int]] = [[]]
    for v in values:
        if out[-1] and v < out[-1][-1]:
            out.append([])
        out[-1].append(v)
    return out


def _lightning(text: str) -> dict[int, list[list[int]]]:
    """Rank 0 alone prints ``global_step=N`` inside training_step, N from 0: step N + 1."""
    return {0: back_at([int(n) + 1 for n in re.findall(r"global_step=(\d+) train_loss", text)])}


def _tutorial(text: str) -> dict[int, list[list[int]]]:
    """Every rank prints ``[GPU<r>] Epoch N`` as epoch N (from 0) begins: step N + 1."""
    return {r: back_at([int(n) + 1 for n in re.findall(rf"\[GPU{r}\] Epoch (\d+) \|", text)]) for r in (0, 1)}


def _hf(text: str) -> dict[int, list[list[int]]]:
    """Rank 0's tqdm bar, ``| N/150 [``: N steps done; a redraw repeats a count, a resumed job's bar draws 0 first."""
    out: list[list[int]] = [[]]
    for n in (int(n) for n in re.findall(r"\|\s*(\d+)/150 \[", text)):
        if n == 0 and out[-1]:
            out.append([])
        elif n and (not out[-1] or n > out[-1][-1]):
            out[-1].append(n)
    return {0: out}


#: A process that aborted in C++ (``std::terminate``), printed as it dies: at exit, a gloo process group never
#: destroyed (pytorch/pytorch#190489).
EXIT_ABORT = re.compile(
    r"terminate called (?:without an active exception|after throwing an instance of '[^']*')"
)


@dataclass
class Trainer:
    name: str
    suite: str  # the ready suite in suites/ (the one docs/recipes/ shows)
    steps: int
    #: the run's output -> for each rank that logs steps, the 1-based steps its lines show, per incarnation
    counters: Callable[[str], dict[int, list[list[int]]]]


TRAINERS = [
    Trainer("lightning", "trainer-lightning.yaml", 60, _lightning),
    Trainer("hf", "trainer-hf.yaml", 150, _hf),
    Trainer("tutorial", "trainer-tutorial.yaml", 40, _tutorial),
]


def _suite(t: Trainer) -> str:
    """The shipped suite, with every checkpoint kept (the HF truth is in its checkpoint directories and final
    model) and its script found from this checkout."""
    data = yaml.safe_load((ROOT / "suites" / t.suite).read_text())
    data["keep_checkpoints"] = "all"
    wl = data["defaults"]["workload"]
    wl["command"] = [a.replace("{suite_dir}/..", str(ROOT)) for a in wl["command"]]
    return yaml.safe_dump(data, sort_keys=False)


def lost_by_the_logs(t: Trainer, m: RunMetrics) -> tuple[int, int]:
    """(steps done before the fault and done again, restarts) as the run's own output shows them: the job's
    step at the fault is the lowest of the logging ranks' last counts in the first incarnation (a step is the
    job's once every rank that logs got there), the resume point the lowest first count of the second, less one
    (for HF, whose output does not say where it resumed and whose bar may skip the first steps after it, the
    newest checkpoint-N directory at or below the step at the fault: the Trainer resumes from its newest)."""
    by_rank = t.counters(rank_output(m))
    at_fault = min(segs[0][-1] for segs in by_rank.values())
    restarts = max(len(segs) for segs in by_rank.values()) - 1
    if t.name == "hf":
        saved = [
            int(p.name.split("-")[1]) for p in (Path(str(m.run_dir)) / "checkpoints").glob("checkpoint-*")
        ]
        return at_fault - max(s for s in saved if s <= at_fault), restarts
    return at_fault - (min(segs[1][0] for segs in by_rank.values()) - 1), restarts


def final_state_by_the_logs(t: Trainer, m: RunMetrics) -> str | None:
    """What the script says its final state is: the digest Lightning prints, the tensors of the model HF saves
    (their bytes, in order), nothing for the tutorial (it prints nothing at the end and leaves only its last
    snapshot, of an earlier epoch)."""
    if t.name == "lightning":
        found = re.findall(r"final params sha256 ([0-9a-f]{64})", rank_output(m))
        return found[-1] if found else None
    if t.name == "hf":
        from safetensors.torch import load_file

        tensors = load_file(str(Path(str(m.run_dir)) / "checkpoints" / "final" / "model.safetensors"))
        return "".join(f"{k}:{tensors[k].numpy().tobytes().hex()}" for k in sorted(tensors))
    return None


@pytest.mark.parametrize("t", TRAINERS, ids=[t.name for t in TRAINERS])
def test_real_trainer_under_restart_and_torchrun(run_suite, t: Trainer) -> None:
    res = run_suite(_suite(t))
    for fw in ("restart", "torchrun"):
        ctl = res[f"{fw}/control#0"]
        # completed: the job exited 0 after its last step, whatever the script prints at the end; unless a rank
        # aborted at exit (C++ std::terminate: none of these scripts destroys its gloo process group,
        # pytorch/pytorch#190489; seen 1 in ~3 HF runs on a loaded machine), which the adapter restarts as a
        # scheduler would: then the control says so, and names the abort
        aborted = EXIT_ABORT.search(rank_output(ctl))
        if aborted is None:
            assert ctl.outcome == "completed" and ctl.clean, story(ctl)
        else:
            assert ctl.outcome == "completed" and ctl.clean is False and ctl.restart_count >= 1, story(ctl)
            assert f"after the job's last step ({t.steps})" in (ctl.verdict or "") and aborted.group(0) in (
                ctl.verdict or ""
            ), story(ctl)
        assert ctl.final_step == t.steps and not ctl.contaminated
        assert max(seg[-1] for segs in t.counters(rank_output(ctl)).values() for seg in segs) == t.steps

        kill = res[f"{fw}/kill-rank1#0"]
        lost, restarts = lost_by_the_logs(t, kill)
        assert kill.outcome == "recovered", (story(kill), kill.missing)
        assert kill.restart_count == restarts, (kill.verdict, restarts)
        assert kill.lost_steps == lost, (kill.lost_steps, lost, kill.verdict)
        if (
            fw == "torchrun"
        ):  # torch names the first failure it polled: the killed rank, or a peer that failed
            assert_torchrun_blamed_by_the_logs(kill, rank=1)
        else:
            assert kill.detected and kill.blame == "correct", story(kill)
        assert kill.checkpoint_age_s is not None and kill.checkpoint_age_s > 0, (
            kill.missing
        )  # saves seen as files

        truth, control_truth = final_state_by_the_logs(t, kill), final_state_by_the_logs(t, ctl)
        if ctl.restart_count:  # its final state is a recovery's (HF trains a step beyond max_steps on resume)
            assert kill.fidelity is None and kill.missing["fidelity"].startswith("the control run restarted")
        elif truth is None or control_truth is None:
            assert kill.fidelity is None and kill.missing["fidelity"].startswith("no final digest to compare")
        else:
            assert kill.fidelity == ("exact" if truth == control_truth else "diverged"), kill.verdict

    if (
        t.name == "lightning"
    ):  # only rank 0 logs: restart's step watchdog sees rank 0 stall first, and blames it
        hang = res["restart/hang-rank1#0"]
        lost, restarts = lost_by_the_logs(t, hang)
        assert hang.outcome == "recovered" and hang.detected_via == "step watchdog", hang.verdict
        assert hang.blamed == "rank 0" and hang.blame == "wrong", hang.verdict
        assert hang.lost_steps == lost and hang.restart_count == restarts
    if t.name == "tutorial":  # no recovery under none: no figure of one
        dead = res["none/kill-rank1#0"]
        assert dead.outcome == "not_recovered", dead.verdict
        for k in RECOVERY_METRICS:
            assert getattr(dead, k) is None and dead.missing[k].startswith("not recovered:"), k
