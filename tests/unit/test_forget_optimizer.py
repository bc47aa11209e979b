"""The planted ``forget-optimizer`` bug of ``ddp-mlp``: a resumed run's model is restored, its optimizer is not
(zero momentum, the optimizer's initial learning rate); without the bug both are. The load is done as
:meth:`Checkpoints.resume` does it, with ``dcp.load``'s in-place copy into the state it is given."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from chaosbench.workloads.ddp_mlp import BUGS, DdpMlpOptions  # noqa: E402
from chaosbench.workloads.skeleton import Checkpoints  # noqa: E402

LR = 0.1


def _training(restore_optimizer: bool = True) -> tuple[Any, Any, Any, Checkpoints]:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    dist = SimpleNamespace(rank=0, device=torch.device("cpu"))
    ckpts = Checkpoints.for_training(
        "unused",
        SimpleNamespace(),
        dist,
        model,
        opt,
        sched,  # type: ignore[arg-type]
        restore_optimizer=restore_optimizer,
    )
    return model, opt, sched, ckpts


def _load_in_place(into: Any, saved: Any) -> Any:
    """What ``dcp.load`` does with the state it is given: tensors copied in place, other values replaced."""
    if isinstance(into, dict):
        for k in into:
            into[k] = _load_in_place(into[k], saved[k])
        return into
    if isinstance(into, list):
        return [_load_in_place(a, b) for a, b in zip(into, saved, strict=True)]
    if isinstance(into, torch.Tensor):
        into.copy_(saved)
        return into
    return saved


@pytest.mark.parametrize("restore", [True, False])
def test_forget_optimizer_restores_the_model_but_not_the_optimizer(restore: bool) -> None:
    torch.manual_seed(0)
    model, opt, sched, ckpts = _training()
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        sched.step()
    saved = ckpts.state(3)
    fresh_model, fresh_opt, fresh_sched, fresh = _training(restore_optimizer=restore)
    state = fresh.state(3)
    for key in fresh.skip_on_load:
        del state[key]
    fresh.apply(_load_in_place(state, saved))
    assert torch.equal(fresh_model.weight, model.weight) and torch.equal(fresh_model.bias, model.bias)
    assert fresh_sched.last_epoch == sched.last_epoch == 3
    for p, q in zip(fresh_model.parameters(), model.parameters(), strict=True):
        buf = fresh_opt.state[p].get("momentum_buffer")
        want = opt.state[q]["momentum_buffer"]
        assert bool(torch.any(want != 0))
        if restore:
            assert buf is not None and torch.equal(buf, want)
        else:
            assert buf is None or not bool(torch.any(buf != 0))
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(LR * 0.5**3 if restore else LR)


def test_forget_optimizer_is_a_declared_bug() -> None:
    assert "forget-optimizer" in BUGS
    assert DdpMlpOptions(bug="forget-optimizer").bug == "forget-optimizer"
