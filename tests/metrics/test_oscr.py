import numpy as np
import pytest
import torch

from metrics import DEFAULT_FPR_TARGETS, OSCR, CCRAtFPR, ccr_at_fpr, closed_set_accuracy, oscr_curve
from tests.distributed import run_distributed
from tests.metrics.reference import ccr_at_fpr_reference, oscr_reference, random_open_set_data

# Hand-computed case (K = 2). Known: S_y = 0.9 (correct), 0.4 (wrong: argmax is 1), 0.7 (correct).
# Unknown max scores: 0.8, 0.5. Thresholds 0.9, 0.8, 0.7, 0.5, 0.4 with strict ">".
HAND_PROBS = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.8, 0.2], [0.5, 0.5]])
HAND_TARGET = torch.tensor([0, 0, 1, -2, -2])


def test_hand_computed_curve():
    fpr, ccr, thresholds = oscr_curve(HAND_PROBS, HAND_TARGET)
    torch.testing.assert_close(thresholds, torch.tensor([0.9, 0.8, 0.7, 0.5, 0.4]))
    torch.testing.assert_close(ccr, torch.tensor([0, 1 / 3, 1 / 3, 2 / 3, 2 / 3], dtype=torch.float64))
    torch.testing.assert_close(fpr, torch.tensor([0, 0, 0.5, 0.5, 1.0], dtype=torch.float64))


def test_hand_computed_ccr_at_fpr():
    ccr = ccr_at_fpr(HAND_PROBS, HAND_TARGET, [0.0, 0.49, 0.5, 1.0])
    torch.testing.assert_close(ccr, torch.tensor([1 / 3, 1 / 3, 2 / 3, 2 / 3], dtype=torch.float64))


def test_negatives_and_unknowns_are_separate():
    probs = torch.cat([HAND_PROBS, torch.tensor([[0.95, 0.05]])])
    target = torch.cat([HAND_TARGET, torch.tensor([-1])])
    # the negative (-1) must not change the curve on unknowns ...
    for a, b in zip(oscr_curve(probs, target, unknown_label=-2), oscr_curve(HAND_PROBS, HAND_TARGET), strict=True):
        torch.testing.assert_close(a, b)
    # ... and on negatives it is the only sample counted for the FPR
    fpr, ccr, thresholds = oscr_curve(probs, target, unknown_label=-1)
    torch.testing.assert_close(thresholds, torch.tensor([0.95, 0.9, 0.7, 0.4]))
    torch.testing.assert_close(fpr, torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("unknown_label", [-1, -2])
@pytest.mark.parametrize("seed", range(4))
def test_against_reference_with_ties(seed, unknown_label, background):
    rng = np.random.default_rng(seed)
    probs, target = random_open_set_data(rng, n=300, k=5, background=background, decimals=2)
    fpr, ccr, thresholds = oscr_curve(torch.from_numpy(probs), torch.from_numpy(target), unknown_label, background)
    ref_fpr, ref_ccr, ref_thresholds = oscr_reference(probs, target, unknown_label, background)
    assert len(np.unique(ref_thresholds)) < 300, "the data must contain ties"
    np.testing.assert_array_equal(thresholds.numpy(), ref_thresholds.astype(np.float32))
    np.testing.assert_array_equal(fpr.numpy(), ref_fpr)
    np.testing.assert_array_equal(ccr.numpy(), ref_ccr)
    targets = [0.0, 1e-3, 1e-2, 0.05, 1e-1, 0.5, 1.0]
    np.testing.assert_array_equal(
        ccr_at_fpr(torch.from_numpy(probs), torch.from_numpy(target), targets, unknown_label, background).numpy(),
        ccr_at_fpr_reference(probs, target, targets, unknown_label, background),
    )


def test_background_column_is_dropped_not_renormalised():
    # the background column holds the largest value; dropping it must not rescale the known scores
    probs = torch.tensor([[0.3, 0.1, 0.6], [0.2, 0.25, 0.55], [0.1, 0.05, 0.85]])
    target = torch.tensor([0, 1, -2])
    fpr, ccr, thresholds = oscr_curve(probs, target, background=True)
    torch.testing.assert_close(thresholds, torch.tensor([0.3, 0.25, 0.1]))
    torch.testing.assert_close(ccr, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(fpr, torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(closed_set_accuracy(probs, target, background=True), torch.tensor(1.0, dtype=torch.float64))


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        oscr_curve(torch.tensor([[float("nan"), 0.5], [0.5, 0.5]]), torch.tensor([0, -2]))
    with pytest.raises(ValueError, match="label 2"):
        oscr_curve(HAND_PROBS, torch.tensor([0, 0, 2, -2, -2]))
    with pytest.raises(ValueError, match="unknown_label=-1"):
        oscr_curve(HAND_PROBS, HAND_TARGET, unknown_label=-1)
    with pytest.raises(ValueError, match="known sample"):
        oscr_curve(HAND_PROBS[3:], HAND_TARGET[3:])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ccr_at_fpr(HAND_PROBS, HAND_TARGET, [1.5])
    with pytest.raises(TypeError, match="integer labels"):
        oscr_curve(HAND_PROBS, HAND_TARGET.float())


def test_stateful_metrics_match_functions_across_batches():
    rng = np.random.default_rng(7)
    probs, target = map(torch.from_numpy, random_open_set_data(rng, n=101, k=4))
    oscr, ccr = OSCR(unknown_label=-2), CCRAtFPR(unknown_label=-2)
    for start in range(0, 101, 16):
        index = torch.arange(start, min(start + 16, 101))
        oscr.update(probs[index], target[index], index)
        ccr.update(probs[index], target[index], index)
    for a, b in zip(oscr.compute(), oscr_curve(probs, target), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(ccr.compute(), ccr_at_fpr(probs, target, DEFAULT_FPR_TARGETS))


def _distributed_oscr(rank: int, world_size: int, probs: torch.Tensor, target: torch.Tensor):
    from torch.utils.data import DistributedSampler

    # DistributedSampler pads 101 samples to 102 by repeating one: the metric must drop it
    sampler = DistributedSampler(range(len(target)), num_replicas=world_size, rank=rank, shuffle=True, seed=3)
    index = torch.tensor(list(sampler))
    oscr = OSCR(unknown_label=-1)
    ccr = CCRAtFPR(unknown_label=-2)
    for chunk in index.split(8):
        oscr.update(probs[chunk], target[chunk], chunk)
        ccr.update(probs[chunk], target[chunk], chunk)
    return oscr.compute(), ccr.compute()


def test_ddp_two_processes_equal_one_process():
    rng = np.random.default_rng(11)
    probs, target = map(torch.from_numpy, random_open_set_data(rng, n=101, k=4))
    results = run_distributed(_distributed_oscr, probs, target)
    expected_curve = oscr_curve(probs, target, unknown_label=-1)
    expected_ccr = ccr_at_fpr(probs, target, DEFAULT_FPR_TARGETS, unknown_label=-2)
    for curve, ccr in results:
        for a, b in zip(curve, expected_curve, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(ccr, expected_ccr)
