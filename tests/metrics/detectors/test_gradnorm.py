"""GradNorm (:mod:`metrics.detectors.gradnorm`), a closed form, against pytorch-ood's ``GradNorm`` run with its
backward on a linear head's weight, and against the authors' / OpenOOD's per-sample backward (written here): the
same scores up to their sum over the classes; a hand-computed case, the background rule, bad hyperparameters."""

from __future__ import annotations

import math

import pytest
import pytorch_ood.detector as pood
import torch
from torch import nn

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import D, K, assert_matches, generator, make_features, outputs


def head_model(head: tuple[torch.Tensor, torch.Tensor]) -> nn.Sequential:
    """The features -> logits network: an identity backbone and the linear head (parameter ``1.weight``)."""
    model = nn.Sequential(nn.Identity(), nn.Linear(D, K)).double()
    with torch.no_grad():
        model[1].weight.copy_(head[0])
        model[1].bias.copy_(head[1])
    return model


def authors_gradnorm(features: torch.Tensor, head: tuple[torch.Tensor, torch.Tensor], temperature: float) -> torch.Tensor:
    """The authors' ``iterate_data_gradnorm`` (OpenOOD's ``GradNormPostprocessor.gradnorm``, T = 1): one sample at a
    time, ``loss = mean_batch Σ_c -1 · log_softmax(z / T)_c``, backward, the L1 norm of the head weight's gradient."""
    model = head_model(head)
    scores = []
    for x in features:
        model.zero_grad()
        logits = model(x[None]) / temperature
        targets = torch.ones(1, K, dtype=torch.float64)
        loss = torch.mean(torch.sum(-targets * torch.log_softmax(logits, dim=-1), dim=-1))
        loss.backward()
        scores.append(model[1].weight.grad.abs().sum())
    return torch.stack(scores).detach()


@pytest.mark.parametrize("temperature", [1.0, 2.5])
@pytest.mark.parametrize("grid", [None, 0.5])
def test_gradnorm_is_pytorch_oods_backward_and_the_authors_over_the_class_count(setting, temperature, grid) -> None:
    head, test = setting["head"], setting["test"]
    features = test if grid is None else torch.round(test / grid) * grid  # ties
    ours = build_detector("gradnorm", temperature=temperature).score(outputs(features, head))
    theirs = pood.GradNorm(head_model(head), param_filter=lambda name: name == "1.weight",
                           temperature=temperature).predict(features)
    assert_matches(ours, theirs)  # pytorch-ood's cross-entropy to uniform is a mean over the classes: the KL's scale
    torch.testing.assert_close(ours * K, authors_gradnorm(features, head, temperature), rtol=1e-12, atol=0)
    # the largest difference measured: 2.2e-15 relative to pytorch-ood's backward, 1.4e-15 to the authors'


def test_gradnorm_by_hand() -> None:
    features = torch.tensor([[1.0, -2.0], [0.5, 0.5], [3.0, 0.0]], dtype=torch.float64)
    logits = torch.tensor([[math.log(3.0), 0.0], [1.0, 1.0], [0.0, math.log(3.0)]], dtype=torch.float64)
    # p = (3/4, 1/4): Σ|p - 1/2| = 1/2, |x|₁ = 3 -> 1.5; a uniform softmax -> 0; p = (1/4, 3/4), |x|₁ = 3 -> 1.5
    scores = build_detector("gradnorm").score({"features": features, "logits": logits})
    torch.testing.assert_close(scores, torch.tensor([1.5, 0.0, 1.5], dtype=torch.float64), rtol=1e-15, atol=1e-16)
    # T = 2: p = (√3, 1) / (√3 + 1), Σ|p - 1/2| = (√3 - 1)/(√3 + 1), over T, times 3
    root3 = math.sqrt(3.0)
    warm = build_detector("gradnorm", temperature=2.0).score({"features": features[:1], "logits": logits[:1]})
    assert warm.item() == pytest.approx((root3 - 1) / (root3 + 1) / 2 * 3, rel=1e-14)


def test_gradnorm_background_model_takes_the_known_classes() -> None:
    features, _ = make_features(20, seed=2)
    logits = torch.randn(20, K, generator=generator(4), dtype=torch.float64) * 3
    with_background = torch.cat([logits, torch.full((20, 1), 100.0, dtype=torch.float64)], dim=1)
    ours = build_detector("gradnorm", background=True).score({"features": features, "logits": with_background})
    # C = K: the softmax over the K known logits, the uniform distribution over them
    p = torch.softmax(logits, dim=1)
    expected = (p - 1 / K).abs().sum(dim=1) * features.abs().sum(dim=1)
    torch.testing.assert_close(ours, expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("temperature", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_gradnorm_refuses_bad_temperature_by_name(temperature) -> None:
    with pytest.raises(ValueError, match=r"detector 'gradnorm': temperature must be a positive finite number"):
        build_detector("gradnorm", temperature=temperature)


def test_gradnorm_refuses_features_and_logits_of_other_samples() -> None:
    features, _ = make_features(10)
    with pytest.raises(ValueError, match=r"'gradnorm': features \(N, D\) and logits \(N, C\) of the same samples, "
                                         r"got \(10, 32\) and \(9, 4\)"):
        build_detector("gradnorm").score({"features": features, "logits": torch.zeros(9, K, dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"'gradnorm' reads \['features'\], which the outputs lack"):
        build_detector("gradnorm").score({"logits": torch.zeros(9, K, dtype=torch.float64)})
