import numpy as np
import pytest
import torch

from lightning_modules.losses import (
    BackgroundClassLoss,
    EntropicOpenSetLoss,
    SoftMaxLoss,
    background_class_weights,
)


def log_softmax_np(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def eos_reference(logits: np.ndarray, target: np.ndarray) -> float:
    """Per sample: known -log S_y, negative -(1/K) sum_c log S_c; mean over the batch."""
    log_s = log_softmax_np(logits.astype(np.float64))
    num_classes = logits.shape[1]
    losses = []
    for row, label in zip(log_s, target, strict=True):
        losses.append(-row.sum() / num_classes if label == -1 else -row[label])
    return float(np.mean(losses))


@pytest.mark.parametrize("seed", range(3))
def test_eos_against_reference(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(40, 6)) * 3
    target = rng.integers(-1, 6, size=40)
    loss = EntropicOpenSetLoss()(torch.from_numpy(logits), torch.from_numpy(target))
    assert loss.item() == pytest.approx(eos_reference(logits, target), rel=1e-12)


def test_eos_known_only_batch_is_cross_entropy():
    rng = np.random.default_rng(1)
    logits, target = torch.from_numpy(rng.normal(size=(16, 5))), torch.from_numpy(rng.integers(0, 5, size=16))
    torch.testing.assert_close(EntropicOpenSetLoss()(logits, target), torch.nn.functional.cross_entropy(logits, target))


def test_eos_negative_only_batch():
    # uniform logits: every log S_c = -log K, so the loss is log K; any other logits give more
    uniform = torch.zeros(3, 4)
    negatives = torch.full((3,), -1)
    assert EntropicOpenSetLoss()(uniform, negatives).item() == pytest.approx(np.log(4))
    peaked = torch.tensor([[2.0, 0.0, 0.0, 0.0]]).repeat(3, 1)
    log_s = log_softmax_np(peaked.numpy().astype(np.float64))[0]
    assert EntropicOpenSetLoss()(peaked, negatives).item() == pytest.approx(-log_s.sum() / 4)
    assert EntropicOpenSetLoss()(peaked, negatives).item() > np.log(4)


def test_eos_negative_weight_scales_negative_term_only():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.2, 0.1, 3.0]])
    target = torch.tensor([1, -1])
    log_s = log_softmax_np(logits.numpy().astype(np.float64))
    expected = (-log_s[0, 1] + 0.5 * -log_s[1].sum() / 3) / 2
    assert EntropicOpenSetLoss(negative_weight=0.5)(logits, target).item() == pytest.approx(expected)


def test_eos_rejects_unknown_labels():
    with pytest.raises(ValueError, match="label -2"):
        EntropicOpenSetLoss()(torch.zeros(2, 3), torch.tensor([0, -2]))
    with pytest.raises(ValueError, match="label 3"):
        EntropicOpenSetLoss()(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_background_weights_formula():
    # N = 100, K + 1 = 4: w_c = 100 / (N_c * 4)
    weights = background_class_weights(torch.tensor([10, 20, 30, 40]))
    torch.testing.assert_close(weights, torch.tensor([2.5, 1.25, 100 / 120, 0.625]))
    torch.testing.assert_close(background_class_weights(torch.tensor([7, 7, 7])), torch.ones(3))
    with pytest.raises(ValueError, match=r"classes \[1\]"):
        background_class_weights(torch.tensor([5, 0, 3]))


def test_background_loss_is_weighted_cross_entropy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(30, 4))
    target = rng.integers(0, 4, size=30)
    counts = np.array([5, 10, 20, 40])
    weights = counts.sum() / (counts * 4)
    per_sample = -log_softmax_np(logits)[np.arange(30), target]
    expected = (weights[target] * per_sample).sum() / weights[target].sum()
    loss = BackgroundClassLoss(num_classes=3)
    loss.set_class_counts(torch.from_numpy(counts))
    assert loss(torch.from_numpy(logits), torch.from_numpy(target)).item() == pytest.approx(expected, rel=1e-6)
    assert "weight" in loss.state_dict()  # rides in checkpoints
    with pytest.raises(ValueError, match="background class"):
        loss(torch.from_numpy(logits), torch.full((30,), -1))


def test_softmax_loss_refuses_negatives():
    with pytest.raises(ValueError, match="train_negatives='exclude'"):
        SoftMaxLoss()(torch.zeros(2, 3), torch.tensor([0, -1]))
