"""Confidence functions as detectors (:mod:`metrics.detectors.function`): a :class:`ScoreFunction` scores its
kernel of the pass's outputs with its hyperparameters, an ensemble κ reads the pass's member logits ``(N, M, C)``
(metrics.ensemble's ``(M, N, C)`` taken as a view), a model κ scores images through the model, and each refuses
the outputs of the other kind."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from metrics import KAPPAS, build_detector
from metrics.detectors import ScoreFunction


def test_an_ensemble_kappa_of_the_passes_layout_is_its_kernel_of_the_members() -> None:
    members = torch.randn(4, 9, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (M, N, C)
    per_sample = members.transpose(0, 1).contiguous()  # the pass's (N, M, C)
    scores = build_detector("ensemble_softmax").score({"logits": per_sample})
    p = np.exp(members.numpy()) / np.exp(members.numpy()).sum(axis=2, keepdims=True)
    np.testing.assert_allclose(scores.numpy(), p.mean(axis=0).max(axis=1), rtol=1e-12)
    torch.testing.assert_close(scores, KAPPAS["ensemble_softmax"](members))
    with pytest.raises(ValueError, match="'ensemble_softmax' needs an ensemble"):
        build_detector("ensemble_softmax").score({"logits": per_sample[:, 0]})
    with pytest.raises(ValueError, match="'softmax' scores one model"):
        build_detector("softmax").score({"logits": per_sample})


def test_a_model_kappa_scores_images_with_its_hyperparameters() -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 3).eval()
    images = torch.randn(6, 5)
    odin = build_detector("odin", temperature=1000.0, epsilon=0.0)
    with torch.no_grad():
        expected = torch.softmax(model(images) / 1000.0, dim=1).max(dim=1).values
    torch.testing.assert_close(odin.score_images(model, images), expected)
    assert odin.score({"scores/odin": expected}) is expected  # its own pass's scores, as the engine keeps them
    with pytest.raises(TypeError, match="'softmax' scores a pass's outputs, not images through the model"):
        build_detector("softmax").score_images(model, images)


def test_every_function_kappa_is_a_score_function_with_an_empty_fit() -> None:
    functions = sorted(name for name in KAPPAS if issubclass(KAPPAS[name].detector, ScoreFunction))
    assert functions == ["energy", "ensemble_entropy", "ensemble_mi", "ensemble_softmax", "entropy", "max_logit",
                         "mc_dropout", "odin", "softmax"]
    assert all(build_detector(name).fitted and not KAPPAS[name].detector.needs_fit for name in functions)
