"""fDBD (:mod:`metrics.detectors.fdbd`) against pytorch-ood's ``fDBD`` and the authors' / OpenOOD's code (its logic
written here in numpy), a hand-computed case, the background rule, bad hyperparameters and heads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from metrics.detectors.fdbd import boundary_norms
from tests.metrics.detectors.helpers import (
    K,
    assert_matches,
    fit_data,
    fitted,
    generator,
    make_features,
    outputs,
    pood_in_float64,
)
from tests.metrics.detectors.test_nci import linear_module


def openood_fdbd(train: np.ndarray, test: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                 distance_as_normalizer: bool) -> np.ndarray:
    """``fDBDPostprocessor`` (and the authors' ``run_imagenet.py``): the denominator matrix row by row with its
    diagonal 1, ``Σ_c |z_ŷ - z_c| / |w_ŷ - w_c|`` over every class, divided by ``|f - mean|`` or ``|f|``."""
    mean = train.mean(axis=0)
    classes = weight.shape[0]
    denominator = np.zeros((classes, classes))
    for p in range(classes):
        row = np.linalg.norm(weight - weight[p, :], axis=1)
        row[p] = 1
        denominator[p, :] = row
    logits = test @ weight.T + bias
    values, predicted = logits.max(axis=1), logits.argmax(axis=1)
    summed = (np.abs(logits - values[:, None]) / denominator[predicted]).sum(axis=1)
    return summed / np.linalg.norm(test - mean if distance_as_normalizer else test, axis=1)


@pytest.mark.parametrize("grid", [None, 0.5])
def test_fdbd_matches_pytorch_ood_and_the_authors_sum(setting, grid) -> None:
    head, (features, targets) = setting["head"], make_features(grid=grid)
    test = setting["test"] if grid is None else torch.round(setting["test"] / grid) * grid  # ties
    for distance_to_mean in (True, False):
        ours = fitted("fdbd", fit_data(features, targets, head), head, distance_to_mean=distance_to_mean)
        scores = ours.score(outputs(test, head))
        reference = openood_fdbd(features.numpy(), test.numpy(), head[0].numpy(), head[1].numpy(), distance_to_mean)
        # the authors and OpenOOD sum over the classes: (C - 1) times the mean over the others
        np.testing.assert_allclose(scores.numpy() * (K - 1), reference, rtol=1e-12, atol=0)
    with pood_in_float64():
        theirs = pood.fDBD(None, linear_module(head)).fit_features(features).predict_features(test)
    assert_matches(fitted("fdbd", fit_data(features, targets, head), head).score(outputs(test, head)), theirs)
    # the largest difference measured: 2.8e-16 relative to pytorch-ood, 7.2e-16 relative to the numpy reference


def test_fdbd_by_hand() -> None:
    # w = (1, 0), (0, 1), (-1, 0): |w0 - w1| = √2, |w0 - w2| = 2, |w1 - w2| = √2; fit features (0, 0), (2, 0): μ = (1, 0)
    head = (torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    fit = {"features": torch.tensor([[0.0, 0.0], [2.0, 0.0]], dtype=torch.float64), "targets": torch.tensor([0, 1])}
    detector = build_detector("fdbd").fit(fit, head=head)
    root2 = math.sqrt(2)
    torch.testing.assert_close(detector.boundary_norms, torch.tensor(
        [[1, root2, 2], [root2, 1, root2], [2, root2, 1]], dtype=torch.float64), rtol=1e-15, atol=0)
    # x = (3, 4): logits (3, 4, -3), ŷ = 1; to the 1|0 boundary (the line y = x) |4 - 3|/√2, to 1|2 |4 + 3|/√2:
    # mean 4/√2 = 2√2, over |x - μ| = |(2, 4)| = 2√5
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    assert detector.score({"features": x}).item() == pytest.approx(2 * root2 / (2 * math.sqrt(5)), rel=1e-15)
    by_norm = build_detector("fdbd", distance_to_mean=False).fit(fit, head=head)
    assert by_norm.score({"features": x}).item() == pytest.approx(2 * root2 / 5, rel=1e-15)  # over |x| = 5
    # a feature at the mean: the distance floored at 1e-8 (pytorch-ood's)
    at_mean = detector.score({"features": torch.tensor([[1.0, 0.0]], dtype=torch.float64)}).item()
    assert at_mean == pytest.approx((1 / root2 + 2 / 2) / 2 / 1e-8, rel=1e-15)  # logits (1, 0, -1), ŷ = 0


def test_fdbd_boundary_norms_are_the_norms_of_the_differences() -> None:
    weight = torch.randn(7, 5, generator=generator(3), dtype=torch.float64)
    weight[4] = weight[2] + 1e-9  # nearly identical rows: a Gram-matrix expansion would lose their distance
    direct = torch.stack([(weight[p] - weight).norm(dim=1) for p in range(7)]).fill_diagonal_(1.0)
    torch.testing.assert_close(boundary_norms(weight), direct, rtol=1e-14, atol=0)


def test_fdbd_background_model_uses_the_known_classes(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    background = (torch.cat([head[0], head[0].sum(dim=0, keepdim=True) * 10]), torch.cat([head[1], torch.ones(1) * 50]))
    ours = build_detector("fdbd", background=True).fit(fit_data(features, targets, background), head=background)
    assert ours.boundary_norms.shape == (K, K)
    plain = fitted("fdbd", fit_data(features, targets, head), head)
    torch.testing.assert_close(ours.score(outputs(test, background)), plain.score(outputs(test, head)), rtol=0, atol=0)


def test_fdbd_refuses_bad_hyperparameters_and_heads(setting) -> None:
    for value in ("yes", 1, None):
        with pytest.raises(ValueError, match=r"detector 'fdbd': distance_to_mean must be true or false"):
            build_detector("fdbd", distance_to_mean=value)
    features, targets = setting["features"], setting["targets"]
    head = setting["head"]
    twin = (torch.cat([head[0], head[0][1:2]]), torch.cat([head[1], torch.zeros(1, dtype=torch.float64)]))
    with pytest.raises(ValueError, match=r"'fdbd': the head's rows 1 and 4 are identical \(1 pair of identical rows\)"):
        build_detector("fdbd").fit({"features": features, "targets": targets}, head=twin)
    one = (head[0][:1], head[1][:1])
    with pytest.raises(ValueError, match="'fdbd' needs at least 2 known classes"):
        build_detector("fdbd").fit({"features": features, "targets": targets * 0}, head=one)
