"""NCI (:mod:`metrics.detectors.nci`) against pytorch-ood's ``NCI`` and OpenOOD's ``nci_postprocessor.py`` (the
authors' code; its logic written here in numpy), a hand-computed case, the background rule, bad hyperparameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from torch import nn

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import (
    D,
    K,
    assert_matches,
    fit_data,
    fitted,
    make_features,
    make_head,
    outputs,
    pood_in_float64,
)


def linear_module(head: tuple[torch.Tensor, torch.Tensor]) -> nn.Linear:
    layer = nn.Linear(D, K).double()
    with torch.no_grad():
        layer.weight.copy_(head[0])
        layer.bias.copy_(head[1])
    return layer


def openood_nci(train: np.ndarray, test: np.ndarray, weight: np.ndarray, bias: np.ndarray, alpha: float) -> np.ndarray:
    """``NCIPostprocessor``: ``train_mean = np.mean(activations)``, the predicted class ``output.max(1)``,
    ``w[pred]·(f - mean) / |f - mean| + alpha |f|₁``."""
    mean = train.mean(axis=0)
    predicted = (test @ weight.T + bias).argmax(axis=1)
    centred = test - mean
    return (weight[predicted] * centred).sum(axis=1) / np.linalg.norm(centred, axis=1) + alpha * np.abs(test).sum(axis=1)


@pytest.mark.parametrize("alpha", [0.0, 0.0001, 0.1])
@pytest.mark.parametrize("grid", [None, 0.5])
def test_nci_matches_pytorch_ood_and_openood(setting, alpha, grid) -> None:
    head, (features, targets) = setting["head"], make_features(grid=grid)
    test = setting["test"] if grid is None else torch.round(setting["test"] / grid) * grid  # ties
    ours = fitted("nci", fit_data(features, targets, head), head, alpha=alpha).score(outputs(test, head))
    with pood_in_float64():
        theirs = pood.NCI(None, linear_module(head), alpha=alpha).fit_features(features).predict_features(test)
    assert_matches(ours, theirs)
    reference = openood_nci(features.numpy(), test.numpy(), head[0].numpy(), head[1].numpy(), alpha)
    np.testing.assert_allclose(ours.numpy(), reference, rtol=1e-12, atol=1e-13)
    # the largest difference measured (both grids, the three α): 8.9e-16 absolute to pytorch-ood and to the numpy
    # reference (1.2e-13 relative, on a score near 0): float64 rounding


def test_nci_by_hand() -> None:
    # w_0 = (2, 0), w_1 = (0, 1); fit features (0, 0) and (2, 2): μ_G = (1, 1); α = 0.5
    head = (torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    fit = torch.tensor([[0.0, 0.0], [2.0, 2.0]], dtype=torch.float64)
    detector = build_detector("nci", alpha=0.5).fit({"features": fit, "targets": torch.tensor([0, 1])}, head=head)
    assert detector.mean.tolist() == [1.0, 1.0]
    test = torch.tensor([[3.0, 1.0], [1.0, 3.0], [1.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    # (3, 1): ŷ = 0 (logits 6, 1), centred (2, 0): 4 / 2 = 2, + 0.5·4 = 4
    # (1, 3): ŷ = 1 (logits 2, 3), centred (0, 2): 2 / 2 = 1, + 0.5·4 = 3
    # (1, 1): at μ_G, pScore 0 (0 / 0 in OpenOOD and pytorch-ood), + 0.5·2 = 1
    # (0, 3): ŷ = 1, centred (-1, 2): 2 / √5, + 0.5·3
    expected = [4.0, 3.0, 1.0, 2 / math.sqrt(5) + 1.5]
    torch.testing.assert_close(detector.score({"features": test}), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-15, atol=0)


def test_nci_background_model_predicts_among_the_known_classes(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    # a background row that would win every argmax: NCI's ŷ and w_ŷ come from the known rows
    background = (torch.cat([head[0], head[0].sum(dim=0, keepdim=True) * 10]), torch.cat([head[1], torch.ones(1) * 50]))
    ours = build_detector("nci", background=True).fit(fit_data(features, targets, background), head=background)
    plain = fitted("nci", fit_data(features, targets, head), head)
    torch.testing.assert_close(ours.score(outputs(test, background)), plain.score(outputs(test, head)), rtol=0, atol=0)


@pytest.mark.parametrize("alpha", [-0.1, float("nan"), float("inf"), "0.1", True, None])
def test_nci_refuses_bad_alpha_by_name(alpha) -> None:
    with pytest.raises(ValueError, match=r"detector 'nci': alpha must be a non-negative finite number"):
        build_detector("nci", alpha=alpha)


def test_nci_refuses_features_of_another_width(setting) -> None:
    head = make_head()
    features, targets = make_features()
    detector = fitted("nci", fit_data(features, targets, head), head)
    with pytest.raises(ValueError, match=r"'nci': the features must be \(N, 32\)"):
        detector.score({"features": features[:, :5]})
    with pytest.raises(ValueError, match=r"'nci': the fit features must be \(N, 32\)"):
        build_detector("nci").fit({"features": features[:, :5], "targets": targets}, head=head)
