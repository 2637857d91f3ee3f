"""PostMax (:mod:`metrics.detectors.postmax`) against the paper's pipeline written here in numpy with the GPD
machinery of the same authors' released GHOST code (the PostMax repository holds no code); the GPD CDF and the
normalisation by hand; its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from metrics.detectors import build_detector, resolve_detector
from metrics.detectors.postmax import gpd_cdf
from tests.metrics.detectors.helpers import (
    D,
    fit_data,
    generator,
    logits_of,
    make_features,
    make_head,
    outputs,
)


def reference_postmax(fit_logits: np.ndarray, fit_features: np.ndarray, fit_targets: np.ndarray,
                      logits: np.ndarray, features: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Unchunked, float64: the maximum logits of the correctly classified fit samples divided by their feature
    norms, one ``genpareto.fit``, and the CDF of each test sample's normalised maximum logit."""
    correct = fit_logits.argmax(axis=1) == fit_targets
    train = fit_logits[correct].max(axis=1) / np.linalg.norm(fit_features[correct], axis=1)
    shape, loc, scale = stats.genpareto.fit(train)
    test = logits.max(axis=1) / np.linalg.norm(features, axis=1)
    return stats.genpareto.cdf(test, shape, loc=loc, scale=scale), (shape, loc, scale)


@pytest.mark.parametrize("grid", [None, 0.5])
def test_postmax_matches_the_papers_pipeline(grid) -> None:
    head = make_head()
    features, targets = make_features(grid=grid)
    test, _ = make_features(80, seed=5, grid=grid)
    far = torch.relu(torch.randn(40, D, generator=generator(6), dtype=torch.float64) * 1.5)
    # duplicated rows tie
    test = torch.cat([test, far if grid is None else torch.round(far / grid) * grid, features[:10], features[:10]])
    theirs, parameters = reference_postmax(logits_of(features, head).numpy(), features.numpy(), targets.numpy(),
                                           logits_of(test, head).numpy(), test.numpy())
    postmax = build_detector("postmax").fit(fit_data(features, targets, head))
    torch.testing.assert_close(postmax.pareto, torch.tensor(parameters, dtype=torch.float64), rtol=1e-12, atol=0)
    ours = postmax.score(outputs(test, head))
    assert ours.dtype == torch.float64
    # measured: 1.7e-16 (the same γ to the last bits or nearly, the same scipy fit)
    torch.testing.assert_close(ours, torch.from_numpy(theirs), rtol=0, atol=1e-12)
    assert ours[:80].mean() > ours[80:120].mean() and len(theirs) - len(np.unique(theirs)) >= 10


def test_gpd_cdf_and_the_normalisation_by_hand() -> None:
    # ξ = 0.5, μ = 0, σ = 1: Ψ(2) = 1 - (1 + 0.5·2)^(-2) = 0.75; below μ: 0
    # ξ = -0.5, μ = 1, σ = 1: support [1, 3]; Ψ(2) = 1 - (1 - 0.5)^2 = 0.75, Ψ(4) = 1
    # ξ = 0, μ = 0, σ = 2: Ψ(2) = 1 - e^(-1)
    values = torch.tensor([2.0, -1.0, 2.0, 4.0, 2.0], dtype=torch.float64)
    parameters = torch.tensor([[0.5, 0.0, 1.0], [0.5, 0.0, 1.0], [-0.5, 1.0, 1.0], [-0.5, 1.0, 1.0], [0.0, 0.0, 2.0]],
                              dtype=torch.float64)
    torch.testing.assert_close(gpd_cdf(values, parameters),
                               torch.tensor([0.75, 0.0, 0.75, 1.0, 1 - math.exp(-1)], dtype=torch.float64),
                               rtol=1e-15, atol=1e-16)
    # γ = max logit / |φ|: (3, 4) with logits (10, 2) -> 10/5 = 2; (0, 0) with logits (1, 3): the norm floored, 3e12
    g = generator(2)
    fit = torch.rand(50, 2, generator=g, dtype=torch.float64) + 0.5
    fit_targets = torch.arange(50) % 2
    fit_logits = torch.nn.functional.one_hot(fit_targets, 2).double() * 4 + fit
    postmax = build_detector("postmax").fit({"features": fit, "logits": fit_logits, "targets": fit_targets})
    test = {"features": torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64),
            "logits": torch.tensor([[10.0, 2.0], [1.0, 3.0]], dtype=torch.float64)}
    torch.testing.assert_close(postmax.normalised(test), torch.tensor([2.0, 3e12], dtype=torch.float64),
                               rtol=1e-15, atol=0)
    torch.testing.assert_close(postmax.score(test), gpd_cdf(torch.tensor([2.0, 3e12], dtype=torch.float64),
                                                            postmax.pareto))


def test_postmax_reads_the_known_logits_of_a_background_model() -> None:
    head = make_head()
    features, targets = make_features()
    test, _ = make_features(60, seed=5)
    plain = build_detector("postmax").fit(fit_data(features, targets, head))
    high = lambda x: torch.full((x.shape[0], 1), 50.0, dtype=torch.float64)  # noqa: E731
    with_background = torch.cat([logits_of(features, head), high(features)], 1)
    postmax = build_detector("postmax", background=True).fit(
        {"features": features, "targets": targets, "logits": with_background})
    scored = {"features": test, "logits": torch.cat([logits_of(test, head), high(test)], 1)}
    assert torch.equal(postmax.score(scored), plain.score(outputs(test, head)))


def test_postmax_refuses_hyperparameters_and_too_few_correct_samples() -> None:
    with pytest.raises(ValueError, match="'postmax' has no hyperparameter 'gpd'; it takes none"):
        resolve_detector("postmax").arguments(gpd=True)
    features = torch.rand(10, 3, dtype=torch.float64)
    logits = torch.zeros(10, 2, dtype=torch.float64)
    logits[:, 1] = 1.0  # predicts class 1 everywhere: one target of class 1 is right
    targets = torch.zeros(10, dtype=torch.long)
    targets[0] = 1
    with pytest.raises(ValueError, match="'postmax': 1 of 10 fit samples are classified correctly"):
        build_detector("postmax").fit({"features": features, "logits": logits, "targets": targets})
    head = make_head()
    features, targets = make_features()
    postmax = build_detector("postmax").fit(fit_data(features, targets, head))
    with pytest.raises(ValueError, match="'postmax' was fitted on logits of 4 known classes"):
        postmax.score({"features": features, "logits": logits_of(features, head)[:, :2]})
    with pytest.raises(ValueError, match="'postmax': 300 rows of logits, 299 of features"):
        postmax.score({"features": features[1:], "logits": logits_of(features, head)})
