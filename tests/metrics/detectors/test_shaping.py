"""The percentile shaping that ASH and SCALE share (:mod:`metrics.detectors.shaping`): how many activations a
sample keeps (numpy's rounding, half to even), which ones, and the energy of the head's logits of the shaped
features, against numpy from the formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics.detectors import ASHP, SCALE, ActivationShaping, build_detector
from metrics.detectors.shaping import kept_count


@pytest.mark.parametrize(("dim", "percentile", "kept"), [
    (10, 0.25, 8),    # 2.5 rounds half to even: 2 zeroed
    (10, 0.35, 6),    # 3.5 -> 4 zeroed
    (2048, 0.9, 205),  # round(1843.2) = 1843
    (2048, 0.65, 717),  # round(1331.2) = 1331
    (7, 0.5, 3),      # 3.5 -> 4
])
def test_kept_count_is_d_minus_numpys_round(dim, percentile, kept) -> None:
    assert kept_count(dim, percentile) == kept == dim - int(np.round(dim * percentile))


def reference_energy(features: np.ndarray, weight: np.ndarray, bias: np.ndarray, shaped: np.ndarray) -> np.ndarray:
    logits = shaped @ weight.T + bias
    top = logits.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]


def test_ash_p_and_scale_score_the_energy_of_their_shaped_features() -> None:
    g = np.random.default_rng(3)
    features = np.maximum(g.normal(size=(40, 12)), 0)  # post-ReLU, with ties at 0
    weight, bias = g.normal(size=(5, 12)), g.normal(size=5)
    head = (torch.from_numpy(weight), torch.from_numpy(bias))
    k = kept_count(12, 0.6)
    order = np.argsort(-features, axis=1, kind="stable")[:, :k]
    kept = np.zeros_like(features)
    np.put_along_axis(kept, order, np.take_along_axis(features, order, axis=1), axis=1)
    ash = build_detector("ash_p").fit({}, head=head).score({"features": torch.from_numpy(features)})
    np.testing.assert_allclose(ash.numpy(), reference_energy(features, weight, bias, kept), rtol=1e-12)
    total, top = features.sum(axis=1), np.take_along_axis(features, order, axis=1).sum(axis=1)
    k_scale = kept_count(12, 0.85)
    top_scale = -np.sort(-features, axis=1)[:, :k_scale].sum(axis=1)
    factor = np.where(top_scale == 0, 1.0, np.exp(total / np.where(top_scale == 0, 1.0, top_scale)))
    scale = build_detector("scale").fit({}, head=head).score({"features": torch.from_numpy(features)})
    np.testing.assert_allclose(scale.numpy(), reference_energy(features, weight, bias, features * factor[:, None]),
                               rtol=1e-12)
    assert issubclass(ASHP, ActivationShaping) and issubclass(SCALE, ActivationShaping) and top.shape == (40,)


def test_a_percentile_that_keeps_nothing_is_refused_when_the_head_is_given() -> None:
    with pytest.raises(ValueError, match="'scale': percentile 0.96 of D = 12 activations keeps none of them"):
        build_detector("scale", percentile=0.96).fit({}, head=(torch.ones(3, 12), None))
