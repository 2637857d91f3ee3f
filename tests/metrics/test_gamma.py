import math

import numpy as np
import pytest
import torch

from metrics import Gamma, gamma, resample_weights, weighted_gamma
from tests.distributed import run_distributed
from tests.metrics.reference import gamma_reference, random_open_set_data


def test_hand_computed_softmax():
    # K = 2; known S_y = 0.9, 0.4, 0.7; negatives max = 0.8, 0.5 -> 1 + 1/2 - max = 0.7, 1.0
    probs = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.8, 0.2], [0.5, 0.5], [0.99, 0.01]])
    target = torch.tensor([0, 0, 1, -1, -1, -2])  # the unknown (-2) is ignored
    plus, minus, both = gamma(probs, target)
    assert plus.item() == pytest.approx(2 / 3)
    assert minus.item() == pytest.approx(0.85)
    assert both.item() == pytest.approx((2 / 3 + 0.85) / 2)


def test_hand_computed_background():
    # K = 2 + background; known S_y = 0.6; negative: 1 - max(0.2, 0.3) = 0.7 (background 0.5 ignored)
    probs = torch.tensor([[0.6, 0.1, 0.3], [0.2, 0.3, 0.5]])
    plus, minus, both = gamma(probs, torch.tensor([0, -1]), background=True)
    assert (plus.item(), minus.item(), both.item()) == pytest.approx((0.6, 0.7, 0.65))


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_against_reference_with_ties(seed, background):
    probs, target = random_open_set_data(np.random.default_rng(seed), n=257, k=6, background=background)
    result = gamma(torch.from_numpy(probs), torch.from_numpy(target), background=background)
    np.testing.assert_allclose([r.item() for r in result], gamma_reference(probs, target, background=background), rtol=1e-12)


def test_missing_side_is_nan_with_warning():
    probs = torch.tensor([[0.9, 0.1]])
    with pytest.warns(RuntimeWarning, match="no negative samples"):
        plus, minus, both = gamma(probs, torch.tensor([0]))
    assert plus.item() == pytest.approx(0.9)
    assert torch.isnan(minus) and torch.isnan(both)


def test_nan_probabilities_rejected():
    with pytest.raises(ValueError, match="NaN"):
        gamma(torch.tensor([[0.5, float("nan")], [0.5, 0.5]]), torch.tensor([0, -1]))


def _distributed_gamma(rank: int, world_size: int, probs: torch.Tensor, target: torch.Tensor):
    from torch.utils.data import DistributedSampler

    index = torch.tensor(list(DistributedSampler(range(len(target)), num_replicas=world_size, rank=rank)))
    metric = Gamma(background=True)
    for chunk in index.split(5):
        metric.update(probs[chunk], target[chunk], chunk)
    return metric.compute()


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_ddp_two_processes_equal_one_process():
    probs, target = map(torch.from_numpy, random_open_set_data(np.random.default_rng(5), n=63, k=3, background=True))
    expected = gamma(probs, target, background=True)
    for result in run_distributed(_distributed_gamma, probs, target):
        for a, b in zip(result, expected, strict=True):
            assert torch.equal(a, b)


# -- weighted ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_weighted_gamma_equals_the_reference_on_the_expanded_rows(background):
    probs, target = random_open_set_data(np.random.default_rng(5), n=180, k=5, background=background)
    probs, target = torch.from_numpy(probs), torch.from_numpy(target)
    weights = resample_weights(180, 10, 2)
    weights[0] = 1
    plus, minus, both = weighted_gamma(probs, target, weights, background=background)
    for b in range(10):
        rows = np.repeat(np.arange(180), weights[b].numpy())
        expected = gamma_reference(probs[rows].numpy(), target[rows].numpy(), background=background)
        np.testing.assert_allclose([plus[b], minus[b], both[b]], expected, rtol=0, atol=1e-12)
    # a row of ones is gamma itself (to float64 rounding: the weighted sums run in another order)
    np.testing.assert_allclose([plus[0], minus[0], both[0]], gamma(probs, target, background=background),
                               rtol=0, atol=1e-15)


def test_weighted_gamma_side_without_weight_is_nan():
    probs = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.8, 0.2], [0.5, 0.5]])
    target = torch.tensor([0, 1, -1, -1])
    plus, minus, both = weighted_gamma(probs, target, torch.tensor([[1, 2, 0, 0], [0, 0, 1, 1]]))
    assert plus[0].item() == pytest.approx((0.9 + 2 * 0.6) / 3)
    assert math.isnan(minus[0]) and math.isnan(both[0])
    assert math.isnan(plus[1]) and minus[1].item() == pytest.approx(((1.5 - 0.8) + (1.5 - 0.5)) / 2)
    with pytest.raises(ValueError, match=r"\(B, 4\)"):
        weighted_gamma(probs, target, torch.ones(1, 3, dtype=torch.int64))
