"""The generation modes (``lightning_modules.generated.modes``): ``pix2pix`` is the training-mode forward with
the same random numbers, leaves the running statistics alone and restores every layer; ``eval`` is ``.eval()``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lightning_modules.generated import GENERATION_MODES, generation_mode
from lightning_modules.nets.gans import UNetGenerator


def network() -> nn.Module:
    torch.manual_seed(0)
    model = UNetGenerator(1, 1, 32, base_width=4, dropout=0.5)
    model.train()
    with torch.no_grad():  # running statistics away from their initial values, so a change would show
        for _ in range(2):
            model(torch.rand(4, 1, 32, 32))
    return model


def states(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("inner_eval", [False, True])
def test_pix2pix_mode_is_the_training_forward_without_touching_running_statistics(inner_eval: bool) -> None:
    model = network()
    model.eval()
    images = torch.rand(5, 1, 32, 32)
    reference = copy.deepcopy(model).train()  # the training forward, by hand (it updates its own copy)
    torch.manual_seed(11)
    with torch.no_grad():
        expected = reference(images)
    before = states(model)
    flags = {name: sub.training for name, sub in model.named_modules()}
    with generation_mode(model, "pix2pix"), torch.no_grad():
        if inner_eval:
            model.eval()  # a predict_step that calls .eval() itself still gets the pix2pix layers
        torch.manual_seed(11)
        found = model(images)
        torch.manual_seed(12)
        other = model(images)
    assert torch.equal(found, expected)
    assert not torch.equal(found, other)  # dropout masks from the random numbers
    after = states(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # running mean/var and num_batches_tracked
    assert {name: sub.training for name, sub in model.named_modules()} == flags
    assert all(not sub._forward_hooks and not sub._forward_pre_hooks for sub in model.modules())
    batch_norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert batch_norms and all(m.track_running_stats for m in batch_norms)
    # the training copy did update its statistics: the comparison above is not vacuous
    assert any(not torch.equal(before[k], v) for k, v in reference.state_dict().items() if "running_mean" in k)


def test_eval_mode_is_eval_and_restores_training() -> None:
    model = network()  # in train mode
    images = torch.rand(3, 1, 32, 32)
    expected = copy.deepcopy(model).eval()(images)
    with generation_mode(model, "eval"), torch.no_grad():
        first, second = model(images), model(images)
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    assert torch.equal(first, second) and model.training
    assert all(sub.training for sub in model.modules())


def test_an_unknown_mode_is_refused() -> None:
    assert GENERATION_MODES == ("eval", "pix2pix")
    with pytest.raises(ValueError, match=r"one of \['eval', 'pix2pix'\], got 'train'"):
        with generation_mode(nn.Linear(2, 2), "train"):
            pass
