"""The corrupt-checkpoint injector on real checkpoint files (no ranks), and the outcome classes from timelines."""

from __future__ import annotations

import random
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from chaosbench.analysis.checkpoint_outcome import classify_checkpoint_outcome  # noqa: E402
from chaosbench.errors import ChaosbenchError, SpecError, TargetNotFound  # noqa: E402
from chaosbench.injectors.base import FaultContext, ResolvedTarget, RunSetup  # noqa: E402
from chaosbench.injectors.corrupt_checkpoint import CorruptCheckpointInjector  # noqa: E402
from chaosbench.injectors.corrupt_checkpoint import formats as cf  # noqa: E402
from chaosbench.registry import INJECTORS  # noqa: E402
from chaosbench.timeline import Event  # noqa: E402
from tests.conftest import make_suite  # noqa: E402

if "corrupt-checkpoint" not in INJECTORS.names():
    INJECTORS.register("corrupt-checkpoint", CorruptCheckpointInjector)


class FakeRuntime:
    def __init__(self) -> None:
        self.signals: list[tuple[int, int, int | None]] = []

    def signal_pid(self, pid: int, sig: int, ticks: int | None = None, node: str | None = None) -> None:
        self.signals.append((pid, sig, ticks))


def injector(**params: Any) -> CorruptCheckpointInjector:
    return CorruptCheckpointInjector("f", CorruptCheckpointInjector.Params.model_validate(params))


def context(ckpt_dir: Path, ranks: list[int], events: list[Event] | None = None, pid: int | None = 4242):
    rt = FakeRuntime()
    setup = RunSetup(
        run_id="r",
        run_dir=ckpt_dir.parent,
        ckpt_dir=ckpt_dir,
        runtime=rt,  # type: ignore[arg-type]
        timeline=None,
        rng=random.Random(0),
        ranks=2,
        nodes=1,
    )  # type: ignore[arg-type]
    targets = [ResolvedTarget(r, None if pid is None else pid + r, 77, "node0", 0) for r in ranks]
    return FaultContext(rt, None, targets, random.Random(1), setup, events=events or []), rt  # type: ignore[arg-type]


def ev(t: int, kind: str, src: str = "rank", **data: Any) -> Event:
    return Event(t_ns=t, kind=kind, src=src, data=data)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory with complete DCP checkpoints of steps 10 and 20 (one rank: shard __0_0)."""
    root = tmp_path_factory.mktemp("tpl") / "ckpt"
    state = {"model": {"w": torch.randn(32, 16), "b": torch.randn(16)}, "progress": {"step": 10}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(root / "step_00000010"))
    shutil.copytree(root / "step_00000010", root / "step_00000020")
    for step in (10, 20):
        (root / f"step_{step:08d}" / "COMPLETE").write_text("{}")
    return root


@pytest.fixture
def ckpt(template: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(template, dst)
    return dst


# --------------------------------------------------------------------------- params


SUITE = """
name: t
defaults: {{workload: {{name: ddp-mlp, ranks: 2}}}}
faults:
  c: {{injector: corrupt-checkpoint, target: 1, trigger: {{at_step: 5}}, params: {params}}}
matrix: {{frameworks: [restart], faults: [c]}}
"""


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{mode: truncate, bits: 3}", "bits applies to mode bitflip only"),
        ("{mode: torn-write, checkpoint: 20}", "checkpoint does not apply to mode torn-write"),
        ("{mode: garble-metadata, file_glob: '*.pt'}", "torch.save files have no .metadata"),
        ("{mode: bitflip, bits: 0}", "bits"),
        ("{mode: truncate, truncate_fraction: 1.0}", "truncate_fraction"),
        ("{mode: chew}", "mode"),
        ("{checkpoint: -3}", "checkpoint"),
    ],
)
def test_params_are_validated_with_the_yaml_line(params: str, message: str) -> None:
    with pytest.raises(SpecError, match=r"test\.yaml:5: fault 'c': .*" + message.split()[0]) as err:
        make_suite(SUITE.format(params=params))
    assert message in str(err.value)


def test_params_defaults_and_step_strings() -> None:
    p = make_suite(SUITE.format(params="{checkpoint: '20'}")).faults["c"].params
    parsed = CorruptCheckpointInjector.Params.model_validate(p)
    assert parsed.checkpoint == 20 and parsed.mode == "bitflip" and parsed.bits == 8  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- damage modes


def test_bitflip_hits_tensor_bytes_of_the_newest_complete(ckpt: Path) -> None:
    shard = ckpt / "step_00000020" / "__0_0.distcp"
    ranges = cf.tensor_payload_ranges(shard)
    before = shard.read_bytes()
    ctx, _ = context(ckpt, [0])
    d = injector(mode="bitflip", bits=5, tensors="model.w").inject(ctx)
    assert d["mode"] == "bitflip" and d["step"] == 20 and d["checkpoint"] == str(ckpt / "step_00000020")
    (rec,) = d["files"]
    assert rec["file"] == str(shard) and rec["rank"] == 0 and len(rec["offsets"]) == 5
    w = next(r for r in ranges if r.name == "model.w")
    assert all(w.offset <= o < w.offset + w.length for o in rec["offsets"])
    after = shard.read_bytes()
    assert sum(a != b for a, b in zip(before, after, strict=True)) == len(set(rec["offsets"]))
    assert (ckpt / "step_00000010" / "__0_0.distcp").read_bytes() == before  # the older one is untouched


@pytest.mark.parametrize("mode", ["truncate", "delete-shard", "delete-metadata", "garble-metadata"])
def test_damage_modes(ckpt: Path, mode: str) -> None:
    d20 = ckpt / "step_00000020"
    size = (d20 / "__0_0.distcp").stat().st_size
    md = (d20 / ".metadata").read_bytes()
    ctx, rt = context(ckpt, [0])
    d = injector(mode=mode, checkpoint=20).inject(ctx)
    assert d["mode"] == mode and d["step"] == 20 and rt.signals == []
    if mode == "truncate":
        assert (d20 / "__0_0.distcp").stat().st_size == size // 2 == d["files"][0]["size_after"]
    elif mode == "delete-shard":
        assert not (d20 / "__0_0.distcp").exists()
    elif mode == "delete-metadata":
        assert not (d20 / ".metadata").exists() and (d20 / "__0_0.distcp").stat().st_size == size
    else:
        new = (d20 / ".metadata").read_bytes()
        assert len(new) == len(md) and new != md
        with pytest.raises(cf.CheckpointFormatError):
            cf.read_dcp_metadata(d20)


def test_kill_after_stops_the_targets_during_the_damage_then_sends_sigkill(ckpt: Path) -> None:
    ctx, rt = context(ckpt, [0])
    d = injector(mode="truncate", kill_after=True).inject(ctx)
    assert rt.signals == [(4242, signal.SIGSTOP, 77), (4242, signal.SIGKILL, 77)]
    assert d["stopped"] == d["killed"] == [{"rank": 0, "pid": 4242}]


def test_kill_after_lets_the_targets_go_on_when_there_is_nothing_to_damage(ckpt: Path) -> None:
    ctx, rt = context(ckpt, [0])
    with pytest.raises(TargetNotFound, match="no checkpoint matches 30"):
        injector(checkpoint=30, kill_after=True).inject(ctx)
    assert rt.signals == [(4242, signal.SIGSTOP, 77), (4242, signal.SIGCONT, 77)]


def test_nothing_to_corrupt_is_a_target_not_found(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(TargetNotFound) as err:
        injector(checkpoint=30).inject(context(ckpt, [0])[0])
    assert err.value.target == str(ckpt)
    assert err.value.reason.startswith(
        "no checkpoint matches 30 among the DCP checkpoints (found: step_00000010"
    )
    assert str(err.value).startswith(f"no checkpoint matches 30 among the DCP checkpoints in {ckpt} (found:")
    with pytest.raises(TargetNotFound) as err:
        injector().inject(context(ckpt, [1])[0])
    assert err.value.target == str(ckpt / "step_00000020")
    assert err.value.reason.startswith("no shard file of rank 1 (shards: ")
    with pytest.raises(TargetNotFound) as err:
        injector().inject(context(tmp_path / "empty", [0])[0])
    assert (err.value.target, err.value.reason) == (
        str(tmp_path / "empty"),
        "no checkpoint matches 'newest-complete' among the DCP checkpoints (found: none)",
    )
    (ckpt / "step_00000020" / "COMPLETE").unlink()
    (ckpt / "step_00000010" / "COMPLETE").unlink()
    (ckpt / "step_00000010" / ".metadata").unlink()
    # markers gone everywhere: .metadata decides; step 10 has none, so step 20 is the newest complete
    assert injector(mode="delete-shard").inject(context(ckpt, [0])[0])["step"] == 20


def test_torch_save_files_per_rank(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for rank in (0, 1):
        (root / f"rank{rank}").mkdir(parents=True)
        for step in (5, 10):
            torch.save({"w": torch.ones(64) * step}, root / f"rank{rank}" / f"model_{step}.pt")
    ctx, _ = context(root, [1])
    d = injector(mode="bitflip", bits=3, file_glob="rank{rank}/*.pt").inject(ctx)
    assert d["format"] == "torch-save" and d["step"] == 10
    assert d["checkpoint"] == str(root / "rank1" / "model_10.pt")
    w = torch.load(root / "rank1" / "model_10.pt", weights_only=True)["w"]
    assert 1 <= int((w != 10).sum()) <= 3
    assert torch.equal(
        torch.load(root / "rank0" / "model_10.pt", weights_only=True)["w"], torch.ones(64) * 10
    )


# --------------------------------------------------------------------------- torn write


def test_torn_write_kills_the_rank_that_is_saving(ckpt: Path) -> None:
    path = str(ckpt / "step_00000020")
    old = str(ckpt / "step_00000010")
    # the trigger is rank 0's begin of step 20, seen before rank 1's own: rank 1's last save it saw ended
    events = [
        ev(1, "ckpt_save_begin", rank=1, step=10, path=old, incarnation=0),
        ev(2, "ckpt_save_end", rank=1, step=10, path=old, incarnation=0, complete=True),
        ev(3, "ckpt_save_begin", rank=0, step=20, path=path, incarnation=0),
    ]
    ctx, rt = context(ckpt, [1], events)
    d = injector(mode="torn-write").inject(ctx)
    assert rt.signals == [(4243, signal.SIGKILL, 77)]
    assert d["step"] == 20 and d["checkpoint"] == path and d["killed"] == [{"rank": 1, "pid": 4243}]
    assert d["marker_at_kill"] is True and "__0_0.distcp" in d["files_at_kill"] and d["dir_at_kill"] is True
    # its .metadata was written after the save began (stamped at 3 ns here): the kill came too late to tear it
    assert d["damaged"] is False and d["undamaged"].startswith(
        "the torn write missed: the save of step 20 was"
    )


def test_a_torn_write_with_only_an_earlier_saves_metadata_damaged_it(ckpt: Path) -> None:
    """A save into a directory an earlier save had filled: its ``.metadata`` is the earlier save's, older than
    the begin by more than the file clock's lag, so it proves nothing (nor does a workload's own marker)."""
    path = str(ckpt / "step_00000020")
    md = Path(path) / ".metadata"
    begun = md.stat().st_mtime_ns + 50_000_000  # this save began 50 ms after that file was written
    events = [ev(begun, "ckpt_save_begin", rank=1, step=20, path=path, incarnation=0)]
    ctx, rt = context(ckpt, [1], events)
    d = injector(mode="torn-write").inject(ctx)
    assert rt.signals == [(4243, signal.SIGKILL, 77)]
    assert d["marker_at_kill"] is True and "damaged" not in d and "undamaged" not in d
    # written 5 ms before the begin's stamp: within the file clock's lag, counted as this save's
    events = [
        ev(md.stat().st_mtime_ns + 5_000_000, "ckpt_save_begin", rank=1, step=20, path=path, incarnation=0)
    ]
    d = injector(mode="torn-write").inject(context(ckpt, [1], events)[0])
    assert d["damaged"] is False


def test_a_torn_write_before_the_saves_directory_exists_says_so(ckpt: Path) -> None:
    """Seen in CI under load: the kill landed after the begin, before rank 0 had made the directory."""
    path = str(ckpt / "step_00000030")
    events = [ev(1, "ckpt_save_begin", rank=0, step=30, path=path, incarnation=0)]
    ctx, rt = context(ckpt, [1], events)
    d = injector(mode="torn-write").inject(ctx)
    assert rt.signals == [(4243, signal.SIGKILL, 77)]
    assert (d["dir_at_kill"], d["files_at_kill"], d["marker_at_kill"]) == (False, {}, False)


def test_torn_write_needs_a_save_in_progress(ckpt: Path) -> None:
    with pytest.raises(TargetNotFound) as err:
        injector(mode="torn-write").inject(context(ckpt, [1])[0])
    assert (err.value.target, err.value.reason) == (
        "rank 1",
        "no checkpoint save in progress (incarnation 0)",
    )
    done = [
        ev(1, "ckpt_save_begin", rank=1, step=20, path="p", incarnation=0),
        ev(2, "ckpt_save_end", rank=1, step=20, path="p", incarnation=0, complete=True),
    ]
    with pytest.raises(TargetNotFound, match="already ended"):
        injector(mode="torn-write").inject(context(ckpt, [1], done)[0])
    with pytest.raises(ProcessLookupError):
        injector(mode="torn-write").inject(context(ckpt, [1], done[:1], pid=None)[0])


def test_revert_does_nothing(ckpt: Path) -> None:
    inj = injector(mode="delete-shard")
    ctx, _ = context(ckpt, [0])
    inj.inject(ctx)
    assert inj.revert(ctx) is False and not (ckpt / "step_00000020" / "__0_0.distcp").exists()


# --------------------------------------------------------------------------- outcome classes


def timeline(
    *incarnations: list[tuple[str, int | None]], step: int = 20, injector_name: str = "corrupt-checkpoint"
):
    """A run: incarnation 0 trains, the fault fires, then each later incarnation does the listed
    (kind, step) rank events on both ranks."""
    out = [ev(0, "run_start", src="harness")]
    for r in (0, 1):
        out += [ev(1, "rank_start", rank=r, incarnation=0), ev(2, "step", rank=r, step=25, incarnation=0)]
    out.append(ev(10, "fault_inject", src="injector", injector=injector_name, details={"step": step}))
    t = 20
    for inc, actions in enumerate(incarnations, 1):
        for r in (0, 1):
            out.append(ev(t, "rank_start", rank=r, incarnation=inc))
            for kind, s in actions:
                t += 1
                out.append(ev(t, kind, rank=r, step=s, incarnation=inc, path=f"/c/step_{s}"))
        t += 10
    return out


LOAD_OK_20 = [("ckpt_load_begin", 20), ("ckpt_load_end", 20), ("step", 21)]


@pytest.mark.parametrize(
    ("incarnations", "expected"),
    [
        ([LOAD_OK_20], "loaded_silently"),
        ([[("ckpt_load_begin", 10), ("ckpt_load_end", 10), ("step", 11)]], "fell_back"),
        ([[("ckpt_load_begin", 20), ("ckpt_load_begin", 10), ("ckpt_load_end", 10)]], "fell_back"),
        ([[("ckpt_load_begin", 20)], [("step", 1)]], "fell_back"),  # a failed load, then from scratch
        ([[("ckpt_load_begin", 20)]], "crashed"),
        ([[("ckpt_load_begin", 20)], [("ckpt_load_begin", 20)], [("ckpt_load_begin", 20)]], "crash_looped"),
        ([], "not_loaded"),  # nothing restarted
        ([[("ckpt_load_begin", 30), ("ckpt_load_end", 30)]], "not_loaded"),  # a newer one superseded it
        ([[("step", 1)]], "not_loaded"),
    ],
)
def test_classify_checkpoint_outcome(incarnations: list, expected: str) -> None:
    assert classify_checkpoint_outcome(timeline(*incarnations)) == expected


def test_a_torn_write_that_missed_has_no_checkpoint_outcome_and_says_why() -> None:
    """The injector found the save whole at the kill (``damaged: false``): loading step 20 again is no silent
    load of a damaged checkpoint; the outcome is missing, with the injector's reason."""
    from chaosbench.analysis.checkpoint_outcome import undamaged_reason
    from chaosbench.analysis.metrics import compute_metrics

    events = timeline(LOAD_OK_20)
    assert classify_checkpoint_outcome(events) == "loaded_silently"
    assert undamaged_reason(events) is None
    why = "the torn write missed: the save of step 20 was whole when the kill landed"
    fault = next(e for e in events if e.kind == "fault_inject")
    fault.data["details"] = {"step": 20, "damaged": False, "undamaged": why}
    assert classify_checkpoint_outcome(events) is None and undamaged_reason(events) == why
    m = compute_metrics(events)
    assert m.checkpoint_outcome is None and m.missing["checkpoint_outcome"] == why


def test_classify_a_replicas_model_loads() -> None:
    """A serving replica's model file (no step): its restarted incarnations' model_load_begin/end are the loads."""
    from chaosbench.analysis.checkpoint_outcome import MODEL_LOADS

    def run(*incs: list[str]) -> list[Event]:
        out = [ev(0, "run_start", src="harness"), ev(1, "rank_start", rank=1, incarnation=0)]
        out.append(
            ev(
                10,
                "fault_inject",
                src="injector",
                injector="corrupt-checkpoint",
                details={"step": None, "checkpoint": "/c/model.pt"},
            )
        )
        for inc, kinds in enumerate(incs, 1):
            out += [
                ev(20 * inc + i, k, rank=1, incarnation=inc, path="/c/model.pt") for i, k in enumerate(kinds)
            ]
        return out

    assert (
        classify_checkpoint_outcome(run(["model_load_begin"], ["model_load_begin"]), load_kinds=MODEL_LOADS)
        == "crash_looped"
    )
    assert (
        classify_checkpoint_outcome(run(["model_load_begin", "model_load_end"]), load_kinds=MODEL_LOADS)
        == "loaded_silently"
    )


def test_classify_needs_a_corruption() -> None:
    assert classify_checkpoint_outcome(timeline(LOAD_OK_20, injector_name="kill")) is None
    assert classify_checkpoint_outcome([ev(0, "run_start", src="harness")]) is None


# --------------------------------------------------------------------------- damaged training state


def _training_state(step: int) -> dict[str, Any]:
    """A checkpoint as the built-in programs write one: model, optimizer with momentum, progress, RNG per rank."""
    gen = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(8, 4, generator=gen)},
        "optim": {
            "state": {
                "w": {"momentum_buffer": torch.randn(8, 4, generator=gen), "step": torch.tensor(float(step))}
            },
            "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": ["w"]}],
        },
        "progress": {"step": step, "data_position": step},
        "rng.rank0": {"cpu": torch.manual_seed(100 + step).get_state()},
        "rng.rank1": {"cpu": torch.manual_seed(200 + step).get_state()},
    }


@pytest.fixture
def training_ckpt(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in (10, 20):
            dcp.save(_training_state(step), checkpoint_id=str(root / f"step_{step:08d}"))
            (root / f"step_{step:08d}" / "COMPLETE").write_text("{}")
    return root


def _load(path: Path) -> dict[str, Any]:
    """What a resuming rank gets back: dcp.load into the state it would save (no process group)."""
    state = _training_state(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path))
    return state


@pytest.mark.parametrize("mode", ["zero-optimizer", "rewind-rng", "reset-data-position"])
def test_damaged_state_loads_without_error(training_ckpt: Path, mode: str) -> None:
    ctx, _ = context(training_ckpt, [1])
    d = injector(mode=mode).inject(ctx)
    assert d["format"] == "dcp" and d["step"] == 20 and d["mode"] == mode
    got, want = _load(training_ckpt / "step_00000020"), _training_state(20)
    assert torch.equal(got["model"]["w"], want["model"]["w"])  # the rest is untouched
    momentum = got["optim"]["state"]["w"]["momentum_buffer"]
    if mode == "zero-optimizer":
        assert not momentum.any() and float(got["optim"]["state"]["w"]["step"]) == 20.0
        assert d["changes"][0]["keys"] == ["optim"]
    else:
        assert torch.equal(momentum, want["optim"]["state"]["w"]["momentum_buffer"])
    if mode == "rewind-rng":  # rank 1's RNG state is step 10's, rank 0's untouched
        assert torch.equal(got["rng.rank1"]["cpu"], _training_state(10)["rng.rank1"]["cpu"])
        assert torch.equal(got["rng.rank0"]["cpu"], want["rng.rank0"]["cpu"])
        assert d["changes"][0]["older_step"] == 10 and d["changes"][0]["keys"] == ["rng.rank1"]
    if mode == "reset-data-position":
        assert got["progress"] == {"step": 20, "data_position": 0}
        assert d["changes"][0]["keys"] == ["progress.data_position"]


def test_dropped_optimizer_state_is_refused_by_a_loader_that_expects_it(training_ckpt: Path) -> None:
    ctx, _ = context(training_ckpt, [0])
    injector(mode="drop-optimizer").inject(ctx)
    with pytest.raises(
        BaseException, match="momentum_buffer"
    ):  # dcp's CheckpointException is a BaseException
        _load(training_ckpt / "step_00000020")


def test_mixed_step_swaps_a_ranks_files_for_an_older_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for rank in (0, 1):
        (root / f"rank{rank}").mkdir(parents=True)
        for step in (5, 10):
            torch.save(_training_state(step * 10 + rank), root / f"rank{rank}" / f"ckpt_{step}.pt")
    ctx, _ = context(root, [1])
    d = injector(mode="mixed-step", file_glob="rank{rank}/ckpt_*.pt").inject(ctx)
    assert d["format"] == "torch-save" and d["changes"][0]["older_step"] == 5
    got = torch.load(root / "rank1" / "ckpt_10.pt", weights_only=False)
    assert got["progress"]["step"] == 51  # rank 1's file of step 5
    assert torch.load(root / "rank0" / "ckpt_10.pt", weights_only=False)["progress"]["step"] == 100
    with pytest.raises(ChaosbenchError, match="needs one file per rank"):
        injector(mode="mixed-step", file_glob="rank1/ckpt_*.pt").inject(ctx)


def test_state_damage_without_such_state_is_refused(ckpt: Path) -> None:
    ctx, _ = context(ckpt, [1])
    with pytest.raises(ChaosbenchError, match="no optimizer state found to damage"):
        injector(mode="zero-optimizer").inject(ctx)
    with pytest.raises(ChaosbenchError, match="no data-position entry"):
        injector(mode="reset-data-position").inject(ctx)
