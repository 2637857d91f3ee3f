"""KNN (:mod:`metrics.detectors.knn`) against pytorch-ood and the brute-force nearest neighbour."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import KNN_ATOL, assert_matches, make_features, pood_in_float64


@pytest.mark.parametrize(("grid", "k"), [(None, 50), (None, 1), (0.5, 5), (1.0, 20)])
def test_knn_matches_pytorch_ood(setting, grid, k) -> None:
    features, targets = make_features(grid=grid)
    test = setting["test"] if grid is None else torch.cat([torch.round(setting["test"] / grid) * grid, features[:10]])
    with pood_in_float64():
        theirs = pood.KNN(None, k=k).fit_features(features, targets).predict_features(test)
    ours = build_detector("knn", k=k).fit({"features": features, "targets": targets}).score({"features": test})
    assert_matches(ours, theirs, atol=KNN_ATOL)


def test_knn_with_k_1_is_the_brute_force_nearest_neighbour_distance() -> None:
    features, targets = make_features(200, seed=3)
    test, _ = make_features(50, seed=4)
    unit = lambda x: x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)  # noqa: E731
    brute = np.sqrt(((unit(test)[:, None, :] - unit(features)[None, :, :]) ** 2).sum(-1)).min(axis=1)
    ours = build_detector("knn", k=1).fit({"features": features, "targets": targets}).score({"features": test})
    torch.testing.assert_close(ours, -torch.from_numpy(brute), rtol=1e-12, atol=KNN_ATOL)
