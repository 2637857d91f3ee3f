"""metrics.calibration: the ECE replicates against torchmetrics' ECE on the expanded resamples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

import metrics.calibration as calibration
from metrics import (
    bootstrap_accuracy_ece,
    resample_weights,
    weighted_calibration_error,
)


def project_accuracy_ece(probs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """callbacks.generated's ``_accuracy_ece``."""
    return (float((probs.argmax(dim=1) == targets).double().mean()),
            float(multiclass_calibration_error(probs, targets, num_classes=probs.shape[1], n_bins=15, norm="l1")))


def test_accuracy_ece_replicates_equal_project_ece_on_expanded_resamples():
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(300, 5)) * 2
    probs = torch.tensor(np.round(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), 2), dtype=torch.float32)
    probs[0] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])  # confidence 1.0: torchmetrics' extra bin
    targets = torch.tensor(rng.integers(0, 5, 300))
    replicates = bootstrap_accuracy_ece(probs, targets, resamples=20, seed=2)
    weights = resample_weights(300, 20, 2)
    for b in range(20):
        rows = np.repeat(np.arange(300), weights[b])
        accuracy, ece = project_accuracy_ece(probs[rows], targets[rows])
        assert float(replicates["accuracy"][b]) == pytest.approx(accuracy, abs=1e-12)
        assert float(replicates["ece"][b]) == pytest.approx(ece, abs=1e-6)  # torchmetrics sums in float32
    # weights of all ones give the project's value

    confidence, prediction = probs.max(dim=1)
    confidence = confidence.float()
    bins = torch.bucketize(confidence, torch.linspace(0, 1, 16), right=True) - 1
    ones = torch.ones(1, 300, dtype=torch.int32)
    ece = calibration._ece_rows(ones, bins, confidence.double(), (prediction == targets).double(), 15)
    assert float(ece) == pytest.approx(project_accuracy_ece(probs, targets)[1], abs=1e-6)


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: bootstrap_accuracy_ece(torch.randn(4, 3) * 5, torch.tensor([0, 1, 2, 0])), "probabilities"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_weighted_calibration_error_equals_torchmetrics_on_the_expanded_rows():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(200, 4)) * 2
    probs = torch.tensor(np.round(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), 2), dtype=torch.float32)
    probs[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # confidence 1.0: torchmetrics' extra bin
    targets = torch.tensor(rng.integers(0, 4, 200))
    weights = resample_weights(200, 8, 1)
    weights[0] = 1
    weights[1] = 0
    ece = weighted_calibration_error(probs, targets, weights, bins=10)
    assert math.isnan(ece[1])
    for b in [0, *range(2, 8)]:
        rows = np.repeat(np.arange(200), weights[b].numpy())
        expected = multiclass_calibration_error(probs[rows], targets[rows], num_classes=4, n_bins=10,
                                                norm="l1")
        assert float(ece[b]) == pytest.approx(float(expected), abs=1e-6)  # torchmetrics sums in float32
    # the bootstrap's replicates are these rows
    replicates = bootstrap_accuracy_ece(probs, targets, bins=10, resamples=8, seed=1)["ece"]
    assert torch.equal(weighted_calibration_error(probs, targets, resample_weights(200, 8, 1), bins=10), replicates)
    with pytest.raises(ValueError, match=r"\(B, 200\)"):
        weighted_calibration_error(probs, targets, torch.ones(2, 3))
