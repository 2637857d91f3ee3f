"""VRA (:mod:`metrics.detectors.vra`) against OpenOOD's ``vra_postprocessor.py`` (its logic written here in numpy)
and pytorch-ood's ``VRA`` where the two coincide (one feature dimension: pytorch-ood's thresholds are per
dimension); a hand-computed case, the background rule, bad hyperparameters."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import (
    K,
    assert_matches,
    fit_data,
    fitted,
    generator,
    make_features,
    make_head,
    outputs,
)


def openood_vra(val: np.ndarray, test: np.ndarray, weight: np.ndarray, bias: np.ndarray, high: float,
                low: float) -> np.ndarray:
    """``VRAPostprocessor``: ``np.percentile`` of the flattened ID val activations at ``percentile_high`` and
    ``percentile_low`` (0-100), ``feature.clip(min=low, max=high)``, ``logsumexp`` of the head's logits."""
    upper, lower = np.percentile(val.flatten(), high), np.percentile(val.flatten(), low)
    logits = np.clip(test, lower, upper) @ weight.T + bias
    top = logits.max(axis=1)
    return top + np.log(np.exp(logits - top[:, None]).sum(axis=1))


@pytest.mark.parametrize(("high", "low"), [(90, 10), (85, 1), (99, 15)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vra_matches_openoods_postprocessor(setting, high, low, dtype) -> None:
    head, test = setting["head"], setting["test"]
    val, targets = make_features(150, seed=8, grid=0.5)  # ties, many at 0
    val = val.to(dtype)
    ours = fitted("vra", {"features": val, "targets": targets}, head, upper_percentile=high / 100,
                  lower_percentile=low / 100)
    assert float(ours.upper_threshold) == np.percentile(val.numpy().flatten(), high)  # in the features' dtype, exact
    assert float(ours.lower_threshold) == np.percentile(val.numpy().flatten(), low)
    reference = openood_vra(val.double().numpy(), test.numpy(), head[0].numpy(), head[1].numpy(), high, low)
    np.testing.assert_allclose(ours.score(outputs(test, head)).numpy(), reference, rtol=1e-13, atol=0)
    # the largest difference measured: 4.1e-16 relative (float64 rounding of the logits and the log-sum-exp)


@pytest.mark.parametrize(("lower", "upper"), [(0.01, 0.99), (0.1, 0.9), (0.3, 0.6)])
def test_vra_is_pytorch_oods_for_one_dimensional_features(lower, upper) -> None:
    """pytorch-ood clips each feature-map element at its own quantiles (``np.quantile(z, q, axis=0)``, cast to
    float32); for one feature dimension those are the global percentiles of this detector. float32 features (ties),
    whose percentiles both compute exactly in float32."""
    g = generator(21)
    fit = torch.round(torch.relu(torch.randn(200, 1, generator=g)) * 4) / 4
    test = torch.round(torch.randn(60, 1, generator=g) * 8) / 4
    targets = torch.arange(200) % K
    head = (torch.randn(K, 1, generator=g, dtype=torch.float64), torch.randn(K, generator=g, dtype=torch.float64))
    ours = build_detector("vra", lower_percentile=lower, upper_percentile=upper)
    ours.fit({"features": fit, "targets": targets}, head=head)
    theirs = pood.VRA(None, lambda maps: maps.double().flatten(1) @ head[0].T + head[1], lower_percentile=lower,
                      upper_percentile=upper).fit_feature_maps(fit[:, :, None, None], targets)
    assert float(ours.lower_threshold) == float(theirs._lower_threshold) and \
        float(ours.upper_threshold) == float(theirs._upper_threshold)
    assert_matches(ours.score({"features": test}), theirs.predict_feature_maps(test[:, :, None, None]))
    # the same float32 thresholds; the logits of float32 features are a float32 product here (the product
    # precision), pytorch-ood's float64: the largest difference measured 3.5e-8 relative, float32's rounding


def test_vra_by_hand() -> None:
    head = (torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    fit = torch.arange(6, dtype=torch.float64).reshape(3, 2)  # activations 0..5
    detector = build_detector("vra", lower_percentile=0.2, upper_percentile=0.8)
    detector.fit({"features": fit, "targets": torch.tensor([0, 1, 0])}, head=head)
    assert (float(detector.lower_threshold), float(detector.upper_threshold)) == (1.0, 4.0)  # np.percentile 20, 80
    test = torch.tensor([[-1.0, 10.0], [2.0, 3.0]], dtype=torch.float64)
    expected = torch.stack([torch.logsumexp(torch.tensor([1.0, 4.0], dtype=torch.float64), 0),
                            torch.logsumexp(torch.tensor([2.0, 3.0], dtype=torch.float64), 0)])
    torch.testing.assert_close(detector.score({"features": test}), expected, rtol=1e-15, atol=0)


def test_vra_background_model_takes_the_energy_of_the_known_logits(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    background = (torch.cat([head[0], torch.ones(1, head[0].shape[1], dtype=torch.float64) * 5]),
                  torch.cat([head[1], torch.tensor([30.0], dtype=torch.float64)]))
    ours = build_detector("vra", background=True).fit(fit_data(features, targets, background), head=background)
    plain = fitted("vra", fit_data(features, targets, head), head)
    torch.testing.assert_close(ours.score(outputs(test, background)), plain.score(outputs(test, head)), rtol=0, atol=0)


def test_vra_fits_on_the_id_validation_split_and_refuses_bad_percentiles() -> None:
    assert build_detector("vra").fit_split == "val"
    for name in ("lower_percentile", "upper_percentile"):
        for value in (0.0, 1.0, 90, -0.1, "0.5", True):
            with pytest.raises(ValueError, match=rf"detector 'vra': {name} must be a fraction in \(0, 1\)"):
                build_detector("vra", **{name: value})
    for lower, upper in ((0.9, 0.1), (0.5, 0.5)):
        with pytest.raises(ValueError, match=rf"'vra': lower_percentile {lower} must be below upper_percentile {upper}"):
            build_detector("vra", lower_percentile=lower, upper_percentile=upper)
    head = make_head()
    features, targets = make_features(30)
    with pytest.raises(ValueError, match=r"'vra': the fit features must be \(N, 32\)"):
        build_detector("vra").fit({"features": features[:, :3], "targets": targets}, head=head)
