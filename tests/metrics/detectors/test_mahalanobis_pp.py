"""Mahalanobis++ (:mod:`metrics.detectors.mahalanobis_pp`) against the authors' code (maha-norm's
``evaluate_Mahalanobis_norm`` and ``rmdsn_postprocessor.py``) written here in numpy, against the base detectors on
features normalised beforehand, and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.covariance import EmpiricalCovariance

from metrics.detectors import base as detector_base
from metrics.detectors import build_detector
from metrics.detectors.knn import normalise
from metrics.detectors.mahalanobis import RIDGE
from tests.metrics.detectors.helpers import make_features


def authors_scores(train: np.ndarray, labels: np.ndarray, test: np.ndarray, *, ridge: float) -> tuple[np.ndarray,
                                                                                                         np.ndarray]:
    """Maha++ and rMaha++ as the authors compute them: features divided by their norm; class means; sklearn's
    ``EmpiricalCovariance`` of the class-centred features (``assume_centered=True``, i.e. S/N) and its precision
    (``pinvh``); ``-min_c (z - μ_c)ᵀ P (z - μ_c)``; rMaha++: the same minus the distance under the covariance of all
    normalised features about their mean (``assume_centered=False``). ``ridge`` is added to both covariances
    (``ridge = 1e-6 / N`` is the project's ``10⁻⁶·I`` on the undivided scatter; 0 is the authors')."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    train, test = unit(train), unit(test)
    classes = np.unique(labels)
    means = np.stack([train[labels == c].mean(axis=0) for c in classes])
    centred = np.concatenate([train[labels == c] - means[i] for i, c in enumerate(classes)])
    eye = np.eye(train.shape[1])
    covariance = EmpiricalCovariance(assume_centered=True).fit(centred).covariance_
    precision = np.linalg.pinv(covariance + ridge * eye, hermitian=True)
    whole = EmpiricalCovariance(assume_centered=False).fit(train)
    whole_precision = np.linalg.pinv(whole.covariance_ + ridge * eye, hermitian=True)
    distances = np.stack([(((test - m) @ precision) * (test - m)).sum(axis=1) for m in means], axis=1)
    background = (((test - whole.location_) @ whole_precision) * (test - whole.location_)).sum(axis=1)
    return -distances.min(axis=1), (-(distances - background[:, None])).max(axis=1)


@pytest.mark.parametrize("grid", [None, 0.5])
def test_mahalanobis_pp_matches_the_authors_code(setting, grid) -> None:
    """With the project's ridge, the authors' scores are 2N (Maha++) and N (rMaha++) times the project's to 1e-9
    relative (see the module docstring for the measured values); without it (the authors' own), to the ridge's
    size: 10⁻⁶/N on a covariance of ~10⁻², ~10⁻⁶ of each distance."""
    features, targets = make_features(grid=grid)
    test = setting["test"] if grid is None else torch.cat([torch.round(setting["test"] / grid) * grid, features[:10]])
    data = {"features": features, "targets": targets}
    ours = build_detector("mahalanobis_pp").fit(data).score({"features": test}).numpy()
    ours_relative = build_detector("relative_mahalanobis_pp").fit(data).score({"features": test}).numpy()
    n = features.shape[0]
    arrays = features.numpy(), targets.numpy(), test.numpy()
    theirs, theirs_relative = authors_scores(*arrays, ridge=RIDGE / n)
    np.testing.assert_allclose(2 * n * ours, theirs, rtol=1e-9)
    np.testing.assert_allclose(n * ours_relative, theirs_relative, rtol=1e-9)
    exact, exact_relative = authors_scores(*arrays, ridge=0.0)
    np.testing.assert_allclose(2 * n * ours, exact, rtol=1e-5)
    # the relative score is a difference of distances of ~10-60: the ridge's 1e-6 of each, not of the difference
    np.testing.assert_allclose(n * ours_relative, exact_relative, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["mahalanobis", "relative_mahalanobis"])
def test_mahalanobis_pp_is_the_base_detector_on_normalised_features(setting, monkeypatch, name) -> None:
    """Normalised chunk by chunk (no N × D copy; chunks of 7 rows here): the base detector fitted on and scoring
    features normalised beforehand, to 1e-12; float32 features are normalised in float64."""
    features, targets = make_features(grid=0.5)
    test = setting["test"]
    reference = build_detector(name).fit({"features": normalise(features), "targets": targets}).score(
        {"features": normalise(test)})
    monkeypatch.setattr(detector_base, "CHUNK_ROWS", 7)
    detector = build_detector(f"{name}_pp").fit({"features": features, "targets": targets})
    torch.testing.assert_close(detector.score({"features": test}), reference, rtol=1e-12, atol=1e-12)
    # a feature and its multiples score alike (only the direction counts)
    torch.testing.assert_close(detector.score({"features": test * 7.5}), reference, rtol=1e-12, atol=1e-12)
    single = build_detector(f"{name}_pp").fit({"features": features.float(), "targets": targets})
    np.testing.assert_allclose(single.score({"features": test.float()}).numpy(), reference.numpy(), rtol=1e-5)


def test_mahalanobis_pp_by_hand() -> None:
    """Class 0 along (0.6, 0.8) and (0.8, 0.6), class 1 along (-0.6, 0.8) and (-0.8, 0.6), at radii 2, 5, 3, 0.5:
    normalised, μ_0 = (0.7, 0.7), μ_1 = (-0.7, 0.7), each class's deviations ±(0.1, ∓0.1) resp. ±(0.1, 0.1), so
    S = 0.04·I (+10⁻⁶·I). The test feature 4·(0.7, 0.7) -> (1/√2, 1/√2): d_0 = 2 (1/√2 - 0.7)² / s. For rMaha++:
    the mean of all is (0, 0.7) and S₀ = diag(0.04 + 1.96, 0.04) (+10⁻⁶·I)."""
    directions = torch.tensor([[0.6, 0.8], [0.8, 0.6], [-0.6, 0.8], [-0.8, 0.6]], dtype=torch.float64)
    features = directions * torch.tensor([[2.0], [5.0], [3.0], [0.5]], dtype=torch.float64)
    data = {"features": features, "targets": torch.tensor([0, 0, 1, 1])}
    test = torch.tensor([[2.8, 2.8], [-0.07, 0.07]], dtype=torch.float64)
    a = 1 / math.sqrt(2) - 0.7
    s = 0.04 + 1e-6
    detector = build_detector("mahalanobis_pp").fit(data)
    expected = -0.5 * 2 * a ** 2 / s
    torch.testing.assert_close(detector.score({"features": test}), torch.full((2,), expected, dtype=torch.float64),
                               rtol=1e-9, atol=0)
    plain = build_detector("mahalanobis", shrinkage=0.1).fit(data)  # on the raw features: another score
    assert not torch.allclose(plain.score({"features": test}), detector.score({"features": test}))
    relative = build_detector("relative_mahalanobis_pp").fit(data)
    background = 0.5 / (2.0 + 1e-6) + a ** 2 / s
    torch.testing.assert_close(relative.score({"features": test}),
                               torch.full((2,), -(2 * a ** 2 / s - background), dtype=torch.float64),
                               rtol=1e-9, atol=0)


def test_mahalanobis_pp_refuses_like_the_base_detectors() -> None:
    features, targets = make_features(20)
    with pytest.raises(ValueError, match="'mahalanobis_pp': 20 fit samples of 4 classes.*N - K = 16 < D = 32"):
        build_detector("mahalanobis_pp").fit({"features": features, "targets": targets})
    with pytest.raises(ValueError, match="'relative_mahalanobis_pp': shrinkage must be a non-negative finite number"):
        build_detector("relative_mahalanobis_pp", shrinkage=-1)
