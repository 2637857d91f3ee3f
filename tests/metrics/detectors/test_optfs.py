"""OptFS (:mod:`metrics.detectors.optfs`) against a numpy transcription of the authors' code
(github.com/Qinyu-Allen-Zhao/OptFSOOD, ``detector/ours.py``: ``Ours.setup``, ``get_lc_fv_list``, ``postprocess``),
unchunked and in float64; a hand-computed case; activations on overlapping or parted intervals; bad
hyperparameters refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from torch import Tensor

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import fit_data, fitted, make_features, outputs


def ours_reference(head: tuple[Tensor, Tensor], fit: Tensor, test: Tensor, *, ood_score: str = "energy",
                   bins: int = 100, quantile: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """θ and the scores of ``Ours``: its ``setup`` (``dynamic_weight`` off; ``bins`` and ``quantile`` are its
    100 and 1e-3) and its ``postprocess``, ``use_ood_score`` ``energy`` or ``vanilla``."""
    w, b = head[0].numpy(), head[1][None, :].numpy()
    feature = fit.numpy()
    pred = np.argmax(feature @ w.T + b, axis=1)  # get_feature_train: the softmax's argmax
    left_b = np.quantile(feature, quantile)
    right_b = np.quantile(feature, 1 - quantile)
    width = (right_b - left_b) / bins
    left_boundary = np.arange(left_b, right_b, width)
    lc = w[pred] * feature
    lc_fv_list = []
    for x in left_boundary:
        mask = (feature >= x) & (feature < x + width)
        lc_fv_list.append(np.mean(np.sum(mask * lc, axis=1)))
    lc_fv_list = np.array(lc_fv_list)
    theta = lc_fv_list / np.linalg.norm(lc_fv_list, 2) * 1000
    data = test.numpy()
    feat_p = np.zeros_like(data)
    for i, x in enumerate(left_boundary):
        mask = (data >= x) & (data < x + width)
        feat_p += mask * data * theta[i]
    if ood_score == "energy":
        return theta, logsumexp(feat_p @ w.T + b, axis=1)
    predicted = np.argmax(data @ w.T + b, axis=1)
    return theta, np.sum(w[predicted] * feat_p, axis=1)


@pytest.mark.parametrize("grid", [None, 0.5, 0.25])
@pytest.mark.parametrize("ood_score", ["energy", "vanilla"])
def test_optfs_matches_the_authors_shaping(setting, grid, ood_score) -> None:
    head = setting["head"]
    features, targets = make_features(grid=grid)
    test = setting["test"] if grid is None else torch.cat([torch.round(setting["test"] / grid) * grid, features[:10]])
    detector = fitted("optfs", fit_data(features, targets, head), head, ood_score=ood_score)
    theta, theirs = ours_reference(head, features, test, ood_score=ood_score)
    assert detector.theta.shape == theta.shape
    torch.testing.assert_close(detector.theta, torch.from_numpy(theta), rtol=1e-14, atol=1e-12)
    torch.testing.assert_close(detector.score(outputs(test, head)), torch.from_numpy(theirs), rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("ood_score", ["energy", "vanilla"])
def test_optfs_matches_the_authors_masks_where_activations_sit_on_rounded_interval_edges(setting, ood_score) -> None:
    # activations j · 0.07 (j = 0..100): the quantiles are 0 and 100 · 0.07, the interval width 0.07 / 1.00..., and
    # many activations sit on a lower edge b_m that rounds below the previous interval's upper edge b_{m-1} + w
    head = setting["head"]
    steps = torch.randint(0, 101, (300 + 120, head[0].shape[1]), generator=torch.Generator().manual_seed(3))
    features, test = (steps.to(torch.float64) * 0.07).split([300, 120])
    detector = fitted("optfs", fit_data(features, torch.arange(300) % 4, head), head, ood_score=ood_score)
    (_, in_previous), (_, in_last) = detector._intervals(features)
    assert int((in_previous & in_last).sum()) > 100  # counted in two intervals, as the authors' masks count them
    theta, theirs = ours_reference(head, features, test, ood_score=ood_score)
    torch.testing.assert_close(detector.theta, torch.from_numpy(theta), rtol=1e-14, atol=1e-12)
    torch.testing.assert_close(detector.score(outputs(test, head)), torch.from_numpy(theirs), rtol=1e-13, atol=1e-12)


def test_optfs_by_hand() -> None:
    # D = 1, W = (1, -1)ᵀ, b = 0: the prediction is class 0 for z > 0. Fit z = 1..4, q = 1/4, B = 2: the quartiles
    # are 1.75 and 3.25, the intervals [1.75, 2.5) and [2.5, 3.25); I = (2/4, 3/4), θ = 1000 I / ‖I‖
    head = (torch.tensor([[1.0], [-1.0]], dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    fit = torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
    detector = fitted("optfs", fit_data(fit, torch.zeros(4, dtype=torch.long), head), head, bins=2, quantile=0.25)
    torch.testing.assert_close(detector.lower, torch.tensor([1.75, 2.5], dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(detector.upper, torch.tensor([2.5, 3.25], dtype=torch.float64), rtol=0, atol=0)
    theta = torch.tensor([0.5, 0.75], dtype=torch.float64) / math.sqrt(0.8125) * 1000
    torch.testing.assert_close(detector.theta, theta, rtol=1e-15, atol=0)
    # z = 2 -> 2θ₀, z = 3 -> 3θ₁; outside the intervals (0.5, -1, 4) the shaped feature is 0: energy log 2, and the
    # predicted logit 0 (no bias)
    test = torch.tensor([[2.0], [3.0], [0.5], [-1.0], [4.0]], dtype=torch.float64)
    shaped = torch.tensor([2 * theta[0], 3 * theta[1], 0.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(detector.shaped(test)[:, 0], shaped, rtol=1e-15, atol=0)
    torch.testing.assert_close(detector.score({"features": test}), torch.logaddexp(shaped, -shaped), rtol=1e-15, atol=0)
    vanilla = fitted("optfs", fit_data(fit, torch.zeros(4, dtype=torch.long), head), head, bins=2, quantile=0.25,
                     ood_score="vanilla")
    torch.testing.assert_close(vanilla.score({"features": test}), shaped, rtol=1e-15, atol=0)


def test_an_activation_on_overlapping_intervals_counts_twice_and_in_a_gap_not_at_all() -> None:
    # the authors' masks [b_m, b_m + w), tested one interval at a time: where b_m + w rounds above b_{m+1} an
    # activation lies in both; where it rounds below, one lies in neither
    detector = build_detector("optfs")
    detector.register_buffer("theta", torch.tensor([10.0, 100.0, 1000.0], dtype=torch.float64))
    detector.register_buffer("lower", torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    detector.register_buffer("upper", torch.tensor([1.0 + 1e-9, 1.9, 3.0], dtype=torch.float64))
    values = torch.tensor([[0.0, 0.5, 1.0, 1.0 + 5e-10, 1.5, 1.95, 2.0, 2.999, 3.0, -0.1]], dtype=torch.float64)
    expected = values * torch.tensor([[10.0, 10.0, 110.0, 110.0, 100.0, 0.0, 1000.0, 1000.0, 0.0, 0.0]],
                                     dtype=torch.float64)
    torch.testing.assert_close(detector.shaped(values), expected, rtol=1e-15, atol=0)


def test_constant_fit_features_are_refused(setting) -> None:
    head = setting["head"]
    constant = torch.ones(20, head[0].shape[1], dtype=torch.float64)
    with pytest.raises(ValueError, match="'optfs': the fit activations' 0.001 and 0.999 quantiles are both 1.0"):
        fitted("optfs", fit_data(constant, torch.arange(20) % 4, head), head)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"bins": 0}, "'optfs': bins must be an integer >= 1, got 0"),
    ({"quantile": 0.5}, r"'optfs': quantile must be a fraction in \(0, 0.5\), got 0.5"),
    ({"quantile": 0}, r"quantile must be a fraction in \(0, 0.5\), got 0"),
    ({"ood_score": "msp"}, r"'optfs': ood_score must be one of \['energy', 'vanilla'\], got 'msp'"),
])
def test_bad_hyperparameters_are_refused_by_name(arguments, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_detector("optfs", **arguments)
