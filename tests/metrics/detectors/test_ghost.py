"""GHOST (:mod:`metrics.detectors.ghost`) against the authors' released code's logic (github.com/Vastlab/GHOST,
``GHOST.py`` and ``GHOST_Driver.py``), written here in torch and numpy; a hand-computed case; its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch import Tensor

from metrics.detectors import build_detector, resolve_detector
from tests.metrics.detectors.helpers import (
    D,
    fit_data,
    generator,
    logits_of,
    make_features,
    make_head,
    outputs,
)

# γ: the same float64 formula, summed in another order (class sums row by row here, torch.mean/std there)
GAMMA_RTOL = 1e-14
# the GPD: scipy's Nelder-Mead fit turns those last-bit differences of γ into differences of its parameters (measured
# here: up to 3.4e-8 relative, the scores up to 1.3e-8 apart; γ 4.3e-16 relative)
SCORE_ATOL = 1e-6


def reference_ghost(fit_logits: Tensor, fit_features: Tensor, fit_targets: Tensor, logits: Tensor,
                    features: Tensor) -> tuple[Tensor, Tensor, dict]:
    """The released code, unchunked, in float64: the driver keeps the training samples whose argmax is their label;
    ``Gaus_gen`` fits torch.mean / torch.std (N - 1) per predicted class, std 0 -> inf; ``norm`` puts
    ``logit_ĉ / Σ|z|`` in the predicted class's column of a zero matrix; ``gpd_mp_fit`` fits
    ``genpareto.fit`` per class to the column of each row's argmax; ``ReScore`` gives the predicted class's CDF.
    Returns (γ, scores, the GPD parameters by class)."""
    correct = fit_targets == fit_logits.argmax(dim=1)
    train_logits, train_features = fit_logits[correct], fit_features[correct]
    predicted = train_logits.max(dim=1).indices
    gaussians = {}
    for c in torch.unique(predicted).tolist():
        selected = train_features[predicted == c]
        mean, std = torch.mean(selected, dim=0), torch.std(selected, dim=0)
        std[std == 0] = torch.inf
        gaussians[c] = (mean, std)

    def norm(z: Tensor, phi: Tensor) -> Tensor:
        prediction = torch.max(z, dim=1).indices
        normalised = torch.zeros(z.shape, dtype=torch.float64)
        for c, (mean, std) in gaussians.items():
            mask = prediction == c
            normalised[mask, c] = z[mask, c] / torch.sum(torch.abs((phi[mask] - mean) / std), dim=1)
        return normalised

    train_normalised = norm(train_logits, train_features)
    _, column = torch.max(train_normalised, dim=1)
    parameters = {c: stats.genpareto.fit(train_normalised[column == c][:, c].numpy())
                  for c in np.unique(column.numpy()).tolist()}
    test_normalised = norm(logits, features)
    prediction = torch.max(logits, dim=1).indices
    gamma = torch.zeros(logits.shape[0], dtype=torch.float64)
    scores = torch.zeros(logits.shape[0], dtype=torch.float64)
    for c in range(logits.shape[1]):
        mask = prediction == c
        values = test_normalised[mask][:, c]
        shape, loc, scale = parameters[c]
        gamma[mask] = values
        scores[mask] = torch.from_numpy(stats.genpareto.cdf(values.numpy(), shape, loc=loc, scale=scale))
    return gamma, scores, parameters


def ghost_data(grid: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """Fit features of 4 classes (one dimension constant: σ = 0 -> ∞), test features near them and far."""
    features, targets = make_features(grid=grid)
    features[:, 5] = 1.5
    test, _ = make_features(80, seed=5, grid=grid)
    far = torch.relu(torch.randn(40, D, generator=generator(6), dtype=torch.float64) * 1.5)
    test = torch.cat([test, far if grid is None else torch.round(far / grid) * grid])
    return features, targets, test


@pytest.mark.parametrize("grid", [None, 0.5])
def test_ghost_matches_the_authors_code(grid) -> None:
    head = make_head()
    features, targets, test = ghost_data(grid)
    fit_logits = logits_of(features, head)
    # the code's GPD of a class reads the argmax column of its normalised rows: the class itself when γ > 0
    correct = fit_logits.argmax(dim=1) == targets
    assert (fit_logits[correct].max(dim=1).values > 0).all()
    gamma, theirs, parameters = reference_ghost(fit_logits, features, targets, logits_of(test, head), test)
    ghost = build_detector("ghost").fit(fit_data(features, targets, head))
    assert torch.isinf(ghost.stds[:, 5]).all()  # (and some ReLU dimensions that are 0 throughout a class)
    ours_gamma, predicted = ghost.normalised(outputs(test, head))
    assert torch.equal(predicted, logits_of(test, head).argmax(dim=1))
    torch.testing.assert_close(ours_gamma, gamma, rtol=GAMMA_RTOL, atol=0)
    torch.testing.assert_close(ghost.pareto, torch.tensor([parameters[c] for c in range(4)], dtype=torch.float64),
                               rtol=1e-5, atol=1e-9)
    ours = ghost.score(outputs(test, head))
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=0, atol=SCORE_ATOL)
    if grid is not None:
        assert len(theirs) - len(torch.unique(theirs)) > 0  # ties: the GPDs saturate at 1
    # without the GPD: γ itself
    plain = build_detector("ghost", gpd=False).fit(fit_data(features, targets, head))
    assert plain.pareto.shape == (0, 3)
    torch.testing.assert_close(plain.score(outputs(test, head)), gamma, rtol=GAMMA_RTOL, atol=0)


def test_ghost_by_hand() -> None:
    # class 0: φ (1, 2), (3, 2) -> μ (2, 2), σ (√2, 0 -> ∞); class 1: φ (0, 1), (0, 3), (0, 5) -> μ (0, 3),
    # σ (0 -> ∞, 2); a misclassified row (its logits say class 1) is left out of class 0's Gaussian
    features = torch.tensor([[1.0, 2.0], [3.0, 2.0], [0.0, 1.0], [0.0, 3.0], [0.0, 5.0], [100.0, 100.0]],
                            dtype=torch.float64)
    logits = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [0.0, 2.0], [0.0, 9.0]],
                          dtype=torch.float64)
    targets = torch.tensor([0, 0, 1, 1, 1, 0])
    ghost = build_detector("ghost", gpd=False).fit({"features": features, "logits": logits, "targets": targets})
    torch.testing.assert_close(ghost.means, torch.tensor([[2.0, 2.0], [0.0, 3.0]], dtype=torch.float64))
    torch.testing.assert_close(ghost.stds, torch.tensor([[2 ** 0.5, float("inf")], [float("inf"), 2.0]],
                                                        dtype=torch.float64))
    # (4, 7), logits (3, 1): class 0, Σ|z| = |4 - 2|/√2 + |7 - 2|/∞ = √2, γ = 3/√2
    # (1, 1), logits (-1, 2): class 1, Σ|z| = |1 - 0|/∞ + |1 - 3|/2 = 1, γ = 2
    # (0, 3), logits (0, 4): class 1 exactly at its mean: Σ|z| = 0, floored to 1e-12: γ = 4e12
    test = torch.tensor([[4.0, 7.0], [1.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    test_logits = torch.tensor([[3.0, 1.0], [-1.0, 2.0], [0.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(ghost.score({"features": test, "logits": test_logits}),
                               torch.tensor([3 / 2 ** 0.5, 2.0, 4e12], dtype=torch.float64), rtol=1e-15, atol=0)


def test_ghost_reads_the_known_logits_of_a_background_model() -> None:
    head = make_head()
    features, targets, test = ghost_data(None)
    plain = build_detector("ghost").fit(fit_data(features, targets, head))
    background_logit = lambda x: torch.full((x.shape[0], 1), 50.0, dtype=torch.float64)  # noqa: E731
    with_background = {"features": features, "targets": targets,
                       "logits": torch.cat([logits_of(features, head), background_logit(features)], dim=1)}
    ghost = build_detector("ghost", background=True).fit(with_background)
    scored = {"features": test, "logits": torch.cat([logits_of(test, head), background_logit(test)], dim=1)}
    assert torch.equal(ghost.score(scored), plain.score(outputs(test, head)))


def test_ghost_refuses_bad_hyperparameters_and_too_few_correct_samples() -> None:
    with pytest.raises(ValueError, match="'ghost': gpd must be true or false, got 'yes'"):
        resolve_detector("ghost").arguments(gpd="yes")
    with pytest.raises(ValueError, match=r"'ghost' has no hyperparameter 'k'; it takes \['gpd'\]"):
        resolve_detector("ghost").arguments(k=3)
    head = make_head()
    features, targets, test = ghost_data(None)
    data = fit_data(features, targets, head)
    wrong = data["logits"].clone()
    rows = ((targets == 2) & (wrong.argmax(dim=1) == 2)).nonzero().flatten()
    wrong[rows[1:], 2] = -100.0  # class 2 keeps one correctly predicted sample: no standard deviation
    with pytest.raises(ValueError, match="class 2 has 1 correctly predicted fit samples"):
        build_detector("ghost").fit({**data, "logits": wrong})
    ghost = build_detector("ghost").fit(data)
    with pytest.raises(ValueError, match="'ghost' was fitted on logits of 4 known classes; the logits to score have "
                                         "3 known columns"):
        ghost.score({"features": test, "logits": logits_of(test, head)[:, :3]})
    with pytest.raises(ValueError, match=r"'ghost': the features must be \(N, 32\)"):
        ghost.score({"features": test[:, :4], "logits": logits_of(test, head)})
