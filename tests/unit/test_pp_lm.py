"""pp-lm without ranks: the layout (rank -> stage, replica, idle), the cut into stages, the options' checks and
the digest, which must not depend on how the model is cut."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chaosbench.workloads.pp_lm import (
    Placement,
    PpLmOptions,
    build_model,
    cut_stage,
    data_parallel,
    digest_of_stages,
    global_batch,
    named_param_bytes,
    parser,
    placement,
    stage_blocks,
)
from chaosbench.workloads.skeleton import mix_seed, params_digest, parse_args


def test_pipeline_is_the_outer_dimension() -> None:
    """rank = stage * dp + replica: with 2 nodes x 2 ranks (node-major) a replica's stages sit on both nodes."""
    got = [placement(r, 4, 2) for r in range(4)]
    assert [(p.stage, p.replica) for p in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(p.dp == 2 and p.stages == 2 and not p.idle for p in got)
    node_of = {r: r // 2 for r in range(4)}
    for replica in range(2):
        ranks = [r for r, p in enumerate(got) if p.replica == replica]
        assert {node_of[r] for r in ranks} == {0, 1}


def test_ranks_beyond_whole_pipelines_are_idle() -> None:
    assert [placement(r, 5, 2) for r in range(5)][-1] == Placement(None, None, 2, 2)
    assert [placement(r, 5, 2).idle for r in range(5)] == [False] * 4 + [True]
    assert [(placement(r, 7, 3).stage, placement(r, 7, 3).replica) for r in range(7)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
        (None, None),
    ]
    assert data_parallel(2, 2) == 1 and data_parallel(9, 4) == 2


def test_a_world_smaller_than_the_pipeline_fails_clearly() -> None:
    with pytest.raises(ValueError, match="world size 1 is below --stages 2"):
        placement(0, 1, 2)
    with pytest.raises(ValueError, match="outside world size 4"):
        placement(4, 4, 2)


def test_blocks_are_divided_evenly_earlier_stages_first() -> None:
    assert stage_blocks(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_blocks(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert stage_blocks(1, 2) == [range(0, 1), range(1, 1)]
    for layers, stages in [(7, 3), (2, 4), (12, 5)]:
        parts = stage_blocks(layers, stages)
        assert [i for part in parts for i in part] == list(range(layers))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_global_batch_follows_the_replicas() -> None:
    assert global_batch(dp=2, microbatches=4, microbatch_size=2) == 16
    assert global_batch(dp=1, microbatches=4, microbatch_size=2) == 8


def test_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    PpLmOptions(stages=4, microbatches=4)
    with pytest.raises(ValidationError, match="1f1b needs microbatches >= stages"):
        PpLmOptions(stages=4, microbatches=2)
    PpLmOptions(stages=4, microbatches=2, schedule="gpipe")
    with pytest.raises(ValidationError, match="not divisible by heads"):
        PpLmOptions(d_model=30, heads=4)
    with pytest.raises(ValidationError):
        PpLmOptions(stages=0)
    # the program's command line goes through the same model
    with pytest.raises(SystemExit):
        parse_args(parser(), PpLmOptions, ["--ckpt-dir", "x", "--stages", "3", "--microbatches", "2"])
    assert "schedule 1f1b needs microbatches >= stages (2 < 3)" in capsys.readouterr().err
    args = parse_args(parser(), PpLmOptions, ["--ckpt-dir", "x", "--schedule", "gpipe", "--stages", "3"])
    assert args.stages == 3 and args.schedule == "gpipe"


@pytest.mark.parametrize("layers,stages", [(2, 2), (3, 2), (4, 3), (2, 1)])
def test_stages_keep_the_whole_models_names_and_digest(layers: int, stages: int) -> None:
    """The stages' parameters, one after another, are the uncut model's: the digest assembled from them is
    params_digest of the whole model, for every cut."""
    import torch

    opts = PpLmOptions(layers=layers, stages=stages, d_model=16, heads=2, vocab=32, seq_len=8)

    def fresh() -> torch.nn.Module:
        torch.manual_seed(mix_seed(3, 0x6D6F64656C))
        return build_model(opts)

    whole = fresh()
    parts = [named_param_bytes(cut_stage(fresh(), k, stages)) for k in range(stages)]
    assert [n for part in parts for n, _ in part] == [n for n, _ in whole.named_parameters()]
    assert digest_of_stages(parts) == params_digest(whole)
    assert "tok_emb.weight" in dict(parts[0]) and "head.weight" in dict(parts[-1])
    # a changed parameter changes it
    with torch.no_grad():
        next(whole.parameters()).add_(1e-3)
    assert digest_of_stages(parts) != params_digest(whole)


def test_the_cut_stages_compose_to_the_whole_forward() -> None:
    """Stage outputs fed into the next stage give the uncut model's logits (eval mode: no dropout)."""
    import torch

    opts = PpLmOptions(layers=3, stages=3, d_model=16, heads=2, vocab=32, seq_len=8)
    torch.manual_seed(1)
    whole = build_model(opts).eval()
    stages = []
    for k in range(3):
        torch.manual_seed(1)
        stages.append(cut_stage(build_model(opts), k, 3).eval())
    tokens = torch.randint(32, (2, 8))
    x = tokens
    for stage in stages:
        x = stage(x)
    assert x.shape == (16, 32)
    assert torch.equal(x, whole(tokens))


def test_under_torchft_a_replica_group_is_one_pipeline() -> None:
    from chaosbench.specs import WorkloadSpec
    from chaosbench.workloads.pp_lm import PpLmWorkload

    def groups(ranks: int, stages: int) -> int:
        spec = WorkloadSpec.model_validate({"name": "pp-lm", "ranks": ranks})
        return PpLmWorkload(spec, PpLmOptions(stages=stages, microbatches=max(4, stages))).replica_groups()

    assert groups(4, 2) == 2 and groups(6, 3) == 2 and groups(2, 2) == 1
    with pytest.raises(ValueError, match="ranks \\(5\\) must be a multiple of stages \\(2\\)"):
        groups(5, 2)
