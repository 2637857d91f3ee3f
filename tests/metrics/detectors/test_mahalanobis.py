"""Mahalanobis and the relative Mahalanobis distance (:mod:`metrics.detectors.mahalanobis`) against pytorch-ood
and by hand; the factor inverted once per fitted state."""

from __future__ import annotations

import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import (
    ATOL,
    assert_matches,
    fit_data,
    fitted,
    make_features,
    outputs,
    pood_in_float64,
)


@pytest.mark.parametrize("grid", [None, 0.5])
def test_mahalanobis_and_rmd_match_pytorch_ood(setting, grid) -> None:
    features, targets = make_features(grid=grid)
    test = setting["test"]
    with pood_in_float64():
        theirs = pood.Mahalanobis(None).fit_features(features, targets).predict_features(test)
        theirs_rmd = pood.RMD(None).fit_features(features, targets).predict_features(test)
    data = {"features": features, "targets": targets}
    assert_matches(build_detector("mahalanobis").fit(data).score({"features": test}), theirs)
    assert_matches(build_detector("relative_mahalanobis").fit(data).score({"features": test}), theirs_rmd)


def test_mahalanobis_two_classes_in_two_dimensions_by_hand() -> None:
    # class 0 around (0, 0), class 1 around (10, 0), each the four points at distance 1 on the axes: each class
    # adds diag(2, 2) to the scatter, S = diag(4, 4) + 1e-6 I
    square = torch.tensor([[-1.0, 0], [1, 0], [0, -1], [0, 1]], dtype=torch.float64)
    features = torch.cat([square, square + torch.tensor([10.0, 0])])
    targets = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    detector = build_detector("mahalanobis").fit({"features": features, "targets": targets})
    test = torch.tensor([[1.0, 1.0], [9.0, 0.0], [5.0, 0.0]], dtype=torch.float64)
    s = 4 + 1e-6
    expected = torch.tensor([-0.5 * 2 / s, -0.5 * 1 / s, -0.5 * 25 / s], dtype=torch.float64)
    torch.testing.assert_close(detector.score({"features": test}), expected, rtol=1e-13, atol=0)
    # RMD: the Gaussian of all 8 points has mean (5, 0) and scatter diag(4 + 200, 4) + 1e-6 I
    rmd = build_detector("relative_mahalanobis").fit({"features": features, "targets": targets})
    background = torch.tensor([16 / (204 + 1e-6) + 1 / s, 16 / (204 + 1e-6), 0.0], dtype=torch.float64)
    torch.testing.assert_close(rmd.score({"features": test}), -(-2 * expected) + background, rtol=1e-13, atol=1e-15)


def test_mahalanobis_inverts_its_factor_once_per_fitted_state(setting, monkeypatch) -> None:
    """L⁻¹ (D³/3 flops) once per fitted state, not per score call (EvG's search scores a few images thousands of
    times); a loaded or refitted state is inverted again, and scores as a fresh detector of that state."""
    from metrics.detectors import mahalanobis as module

    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    calls = []
    original = module._inverse_factor
    monkeypatch.setattr(module, "_inverse_factor", lambda factor: calls.append(1) or original(factor))
    detector = fitted("relative_mahalanobis", fit_data(features, targets, head), head)
    first = [detector.score(outputs(test[i:i + 3], head)) for i in range(0, 30, 3)]
    assert len(calls) == 2  # the class factor and the background one, once each for the 10 calls
    # (to rounding: a product's last bits may change with its number of rows, as the chunk-size test allows)
    torch.testing.assert_close(torch.cat(first), detector.score(outputs(test[:30], head)), rtol=1e-12, atol=ATOL)
    other = fitted("relative_mahalanobis", fit_data(features[:200], targets[:200], head), head)
    detector.load_state_dict(other.state_dict())  # copied into the same buffers, in place
    assert torch.equal(detector.score(outputs(test, head)), other.score(outputs(test, head)))
    assert len(calls) == 6  # other's two, and detector's two again after the load
