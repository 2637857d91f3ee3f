"""WeiPer and WeiPer+KLD (:mod:`metrics.detectors.weiper`) against a transcription of the authors' code
(github.com/mgranz/weiper, ``Weiper/OpenOOD/openood/postprocessors/weiper_kldiv/utils.py`` and
``weiper_kldiv_postprocessor.py``), unchunked and in float64 on the detector's own directions (the authors draw
theirs from the global generator); hand-computed cases; the seeded draw; bad hyperparameters refused by name."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import fit_data, fitted, make_features, outputs

# float64 on both sides; the reference multiplies by the r·K perturbed rows at once and smooths by a convolution:
# rounding of sums of ~D products and of s bins
RTOL = 1e-12


# ------------------------------------------------------------------------- the authors' code, transcribed
def perturbed_fc(head: tuple[Tensor, Tensor], directions: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """``calculate_weiper_space``: r perturbations ``δ · normalize(η_j) · ‖w_c‖`` added to the head, the r heads
    stacked into one ``(r·K, D)`` layer with the bias repeated."""
    weight, bias = head
    perturbations = [delta * F.normalize(eta.double(), dim=1) * weight.norm(dim=1)[:, None] for eta in directions]
    return torch.cat([weight + p for p in perturbations]), torch.cat([bias for _ in perturbations])


def weiper_msp(logits: Tensor, repeats: int) -> Tensor:
    """``calculate_weiper_pred``: the mean over the r blocks of K logits of their maximum softmax."""
    classes = logits.shape[-1] // repeats
    blocks = [logits[:, i * classes:(i + 1) * classes].softmax(dim=-1).max(dim=-1)[0][:, None] for i in range(repeats)]
    return torch.cat(blocks, dim=-1).mean(dim=-1)


def batch_histogram(samples: Tensor, low: Tensor, high: Tensor, n_bins: int) -> Tensor:
    """``batch_histogram(samples, n_bins, bins_min_max=(low, high), probability=True)``: per column of ``samples``
    ``(values, columns)`` the share of its values in each bin, ``(n_bins, columns)``; ``linspace`` edges from ``low``
    to ``high + 1e-8`` flanked by ±inf, the outer bins dropped after the shares are taken."""
    steps = torch.arange(n_bins + 1, dtype=torch.float64) / (n_bins + 1 - 1)
    bins = (low + steps * (high + 1e-8 - low))[:, None].repeat(1, samples.shape[1])
    bins = torch.cat([-torch.ones(1, bins.shape[-1], dtype=torch.float64) * math.inf, bins,
                      torch.ones(1, bins.shape[-1], dtype=torch.float64) * math.inf])
    density = torch.logical_and(samples[None] < bins[1:, None], samples[None] >= bins[:-1, None])
    density = density.to(torch.float64).mean(dim=1)
    return density[1:-1] / density.sum(dim=0)[None]


def uniform_kernel(densities: Tensor, size: int) -> Tensor:
    """``UniformKernel(dim, size)``: a per-column Conv1d of ``size`` weights ``1/size``, ``padding="same"``,
    replicate padding, along the bins of ``densities`` ``(n_bins, columns)``."""
    columns = densities.shape[1]
    kernel = torch.nn.Conv1d(columns, columns, size, padding="same", padding_mode="replicate", dtype=torch.float64)
    with torch.no_grad():
        kernel.weight.zero_()
        kernel.weight[range(columns), range(columns)] = torch.ones(1, columns, size, dtype=torch.float64) / size
        kernel.bias.zero_()
        return kernel(densities.T).T


def kldiv(p: Tensor, q: Tensor, eps: float, size: int) -> Tensor:
    """``kldiv(p, q, eps, kernel, symmetric=True)``: q smoothed, both offset and normalised, KL both ways."""
    q_ = uniform_kernel(q, size) + eps
    p_ = (p + eps).clone()
    p_ /= p_.sum(dim=0)
    q_ /= q_.sum(dim=0)
    q_p = q_.log()[:, None] - p_.log()[..., None]
    return (-(p_[..., None] * q_p).sum(dim=0) - (q_[:, None] * (-q_p)).sum(dim=0))[0]


def weiper_kld_reference(head, directions, fit, test, *, delta, n_bins, lambda_1, lambda_2, s_1, s_2, epsilon_1,
                         epsilon_2) -> Tensor:
    """``WeiPerKLDivPostprocessor.setup`` (``exact_minmax``, the fit set as one batch) then ``postprocess``:
    ``-(u + λ₁ u_W - λ₂ MSP_W)``."""
    weight, bias = perturbed_fc(head, directions, delta)
    fit_logits, test_logits = fit @ weight.T + bias, test @ weight.T + bias
    low, high = fit.min(), fit.max()
    low_w, high_w = fit_logits.min(), fit_logits.max()
    train = batch_histogram(fit.T, low, high, n_bins).mean(dim=-1)[:, None]
    train_w = batch_histogram(fit_logits.T, low_w, high_w, n_bins).mean(dim=-1)[:, None]
    uncertainty = kldiv(train, batch_histogram(test.T, low, high, n_bins), epsilon_1, s_1)
    uncertainty_w = kldiv(train_w, batch_histogram(test_logits.T, low_w, high_w, n_bins), epsilon_2, s_2)
    return -(uncertainty + lambda_1 * uncertainty_w - lambda_2 * weiper_msp(test_logits, len(directions)))


def tied(setting) -> tuple[Tensor, Tensor, Tensor]:
    """Fit features on a 0.5 grid (ties, many zeros) and test features on the same grid plus fit rows."""
    features, targets = make_features(grid=0.5)
    test = torch.cat([torch.round(setting["test"] / 0.5) * 0.5, features[:10]])
    return features, targets, test


# ------------------------------------------------------------------------- against the authors' code
@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("hyperparameters", [{}, {"r": 7, "delta": 1.8, "seed": 3}, {"r": 1, "delta": 0.0}])
def test_weiper_matches_the_authors_msp_of_the_perturbed_heads(setting, grid, hyperparameters) -> None:
    head = setting["head"]
    features, targets, test = tied(setting) if grid else (setting["features"], setting["targets"], setting["test"])
    detector = fitted("weiper", fit_data(features, targets, head), head, **hyperparameters)
    weight, bias = perturbed_fc(head, detector.directions, detector.delta)
    theirs = weiper_msp(test @ weight.T + bias, detector.r)
    torch.testing.assert_close(detector.score(outputs(test, head)), theirs, rtol=RTOL, atol=0)


KLD_SETTINGS = [
    {},  # the defaults: the authors' ImageNet ResNet-50 values
    {"r": 5, "delta": 1.8, "n_bins": 20, "lambda_1": 1.0, "lambda_2": 2.5, "s_1": 4, "s_2": 3, "seed": 11},
    {"r": 3, "delta": 0.5, "n_bins": 7, "lambda_1": 0.1, "lambda_2": 0.0, "s_1": 1, "s_2": 12, "epsilon_1": 1e-3,
     "epsilon_2": 0.2},
]


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("hyperparameters", KLD_SETTINGS)
def test_weiper_kld_matches_the_authors_score(setting, grid, hyperparameters) -> None:
    head = setting["head"]
    features, targets, test = tied(setting) if grid else (setting["features"], setting["targets"], setting["test"])
    detector = fitted("weiper_kld", fit_data(features, targets, head), head, **hyperparameters)
    arguments = {k: getattr(detector, k) for k in ("delta", "n_bins", "lambda_1", "lambda_2", "s_1", "s_2",
                                                   "epsilon_1", "epsilon_2")}
    theirs = weiper_kld_reference(head, detector.directions, features, test, **arguments)
    torch.testing.assert_close(detector.score(outputs(test, head)), theirs, rtol=RTOL, atol=1e-14)


# ------------------------------------------------------------------------- by hand
def test_weiper_by_hand() -> None:
    # W = I, b = 0; directions turn w_0 = (1, 0) to (1, ±1) and w_1 = (0, 1) to (±1, 1) at δ = 1: the first perturbed
    # head has equal rows (softmax 1/2 for any z), the second's logits are ±(z_0 - z_1)
    head = (torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    features = torch.tensor([[1.0, 0.0], [2.0, 3.0], [0.0, 0.0]], dtype=torch.float64)
    detector = fitted("weiper", fit_data(features, torch.tensor([0, 1, 0]), head), head, r=2, delta=1.0)
    detector.directions.copy_(torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[0.0, -2.0], [-3.0, 0.0]]]))  # any length
    sigmoid_2 = 1 / (1 + math.exp(-2))
    expected = torch.tensor([(0.5 + sigmoid_2) / 2, (0.5 + sigmoid_2) / 2, 0.5], dtype=torch.float64)
    torch.testing.assert_close(detector.score({"features": features}), expected, rtol=1e-15, atol=0)


def test_weiper_kld_by_hand() -> None:
    # W = I, b = 0 and δ = 0: the perturbed logits are the features. Fit (0, 1) and (1, 0): the edges are 0, 0.5 + 5e-9,
    # 1 + 1e-8 and each sample has one value per bin, p = (1/2, 1/2). With ε = 1/2 and no smoothing (s = 1):
    #   (1/4, 1/4): both values in bin 0, q̂ = (3/4, 1/4), SKL = (1/4) log(3/2) + (1/4) log 2 = log(3) / 4 twice
    #   (0, 1):     q = p, SKL = 0;   (2, 2): both values above the fit range, dropped (not renormalised): q̂ = p̂
    head = (torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    fit = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    detector = fitted("weiper_kld", fit_data(fit, torch.tensor([1, 0]), head), head, r=1, delta=0.0, n_bins=2,
                      lambda_1=1.0, lambda_2=1.0, s_1=1, s_2=1, epsilon_1=0.5, epsilon_2=0.5)
    torch.testing.assert_close(detector.feature_edges, torch.tensor([0.0, 0.5 + 5e-9, 1 + 1e-8], dtype=torch.float64))
    torch.testing.assert_close(detector.logit_density, torch.tensor([0.5, 0.5], dtype=torch.float64))
    test = torch.tensor([[0.25, 0.25], [0.0, 1.0], [2.0, 2.0]], dtype=torch.float64)
    expected = torch.tensor([0.5 - math.log(3) / 2, 1 / (1 + math.exp(-1)), 0.5], dtype=torch.float64)
    torch.testing.assert_close(detector.score({"features": test}), expected, rtol=1e-14, atol=1e-15)


def test_even_smoothing_windows_lean_right_like_a_same_padded_convolution() -> None:
    from metrics.detectors.weiper import smooth

    density = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    # s = 4: one bin on the left, two on the right, the edge bins repeated
    expected = torch.tensor([[0.25, 0.25, 0.25, 1.0, 1.5, 2.25]], dtype=torch.float64)
    torch.testing.assert_close(smooth(density, 4), expected, rtol=1e-15, atol=0)
    torch.testing.assert_close(smooth(density, 4), uniform_kernel(density.T, 4).T, rtol=1e-15, atol=1e-16)
    torch.testing.assert_close(smooth(density, 40), uniform_kernel(density.T, 40).T, rtol=1e-14, atol=1e-16)


# ------------------------------------------------------------------------- the seeded directions
def test_directions_are_the_seeded_draw_of_the_known_rows(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data = fit_data(features, targets, head)
    detector = fitted("weiper_kld", data, head, r=4, seed=5)
    draw = torch.randn((4, head[0].shape[0], head[0].shape[1]), generator=torch.Generator().manual_seed(5),
                       dtype=torch.float32)
    assert detector.directions.dtype == torch.float32 and torch.equal(detector.directions, draw)
    scores = detector.score(outputs(test, head))
    assert torch.equal(fitted("weiper_kld", data, head, r=4, seed=5).score(outputs(test, head)), scores)
    assert not torch.equal(fitted("weiper_kld", data, head, r=4, seed=6).score(outputs(test, head)), scores)
    assert fitted("weiper_kld", data, head, r=4, seed=6).state_fingerprint() != detector.state_fingerprint()


def test_weiper_kld_fits_on_300_images_per_class_by_default() -> None:
    assert build_detector("weiper_kld").default_fit == {"per_class": 300}  # the authors' 300,000 of ImageNet
    assert build_detector("weiper").default_fit == {} and not build_detector("weiper").fit_data


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("weiper", {"r": 0}, "'weiper': r must be an integer >= 1, got 0"),
    ("weiper", {"delta": -0.1}, "'weiper': delta must be a non-negative finite number, got -0.1"),
    ("weiper", {"seed": -1}, r"'weiper': seed must be an integer in \[0, 2\*\*63\), got -1"),
    ("weiper", {"seed": True}, "seed must be an integer.*got True"),
    ("weiper_kld", {"n_bins": 0}, "'weiper_kld': n_bins must be an integer >= 1, got 0"),
    ("weiper_kld", {"lambda_1": -1}, "lambda_1 must be a non-negative finite number, got -1"),
    ("weiper_kld", {"lambda_2": float("nan")}, "lambda_2 must be a non-negative finite number, got nan"),
    ("weiper_kld", {"s_1": 0}, "s_1 must be an integer >= 1, got 0"),
    ("weiper_kld", {"s_2": 2.5}, "s_2 must be an integer >= 1, got 2.5"),
    ("weiper_kld", {"epsilon_1": 0}, "epsilon_1 must be a positive finite number, got 0"),
    ("weiper_kld", {"epsilon_2": -0.5}, "epsilon_2 must be a positive finite number, got -0.5"),
])
def test_bad_hyperparameters_are_refused_by_name(name, arguments, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_detector(name, **arguments)
