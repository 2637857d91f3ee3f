"""NNGuide (:mod:`metrics.detectors.nnguide`) against pytorch-ood, against OpenOOD's postprocessor (the authors'
guidance) written here in numpy, by hand; its default bank cap and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from scipy.special import logsumexp

from metrics.detectors import DETECTORS, build_detector
from tests.metrics.detectors.helpers import (
    assert_matches,
    fit_data,
    linear,
    logits_of,
    make_features,
    outputs,
    pood_in_float64,
)


def openood_nnguide(bank_features: np.ndarray, bank_logits: np.ndarray, features: np.ndarray, logits: np.ndarray,
                    k: int) -> np.ndarray:
    """OpenOOD's ``NNGuidePostprocessor`` (as the authors' ``NNGuideOODDetector``): the bank ``normalizer(x) ·
    logsumexp(logits)``, the mean of the k largest inner products of ``normalizer(x)`` with it (faiss
    ``IndexFlatIP``: an exact search, here a sort), times the energy. OpenOOD's ``normalizer`` is ``x / |x| + 1e-10``
    (the offset on every element)."""
    def normalizer(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=-1, keepdims=True) + 1e-10

    bank = normalizer(bank_features) * logsumexp(bank_logits, axis=-1)[:, None]
    similarities = normalizer(features) @ bank.T
    guidance = np.sort(similarities, axis=1)[:, -k:].mean(axis=1)
    return guidance * logsumexp(logits, axis=-1)


@pytest.mark.parametrize(("grid", "k"), [(None, 10), (None, 1), (0.5, 5), (1.0, 50)])
def test_nnguide_matches_pytorch_ood_and_openood(setting, grid, k) -> None:
    """pytorch-ood to float64 rounding (measured: 5e-16 relative); OpenOOD's normaliser offset changes the scores by
    ~1e-8 relative (measured: 1.7e-9)."""
    head, (features, targets) = setting["head"], make_features(grid=grid)
    test = setting["test"] if grid is None else torch.cat([torch.round(setting["test"] / grid) * grid, features[:10]])
    with pood_in_float64():
        theirs = pood.NNGuide(None, linear(head), k=k).fit_features(features, targets).predict_features(test)
    detector = build_detector("nnguide", k=k).fit(fit_data(features, targets, head))
    ours = detector.score(outputs(test, head))
    assert_matches(ours, theirs)
    torch.testing.assert_close(ours, -theirs.double(), rtol=1e-14, atol=1e-14)
    openood = openood_nnguide(features.numpy(), logits_of(features, head).numpy(), test.numpy(),
                              logits_of(test, head).numpy(), k)
    np.testing.assert_allclose(ours.numpy(), openood, rtol=1e-8)


def test_nnguide_by_hand() -> None:
    """A bank of three 2-D features with logits of energies ln 2, ln 3 and ln 4 (two logits each); k = 2. The test
    feature (3, 4) -> (0.6, 0.8); its logits (0, 0): energy ln 2."""
    bank = torch.tensor([[2.0, 0.0], [0.0, 5.0], [1.0, 1.0]], dtype=torch.float64)
    bank_logits = torch.log(torch.tensor([[1.0, 1.0], [1.0, 2.0], [2.0, 2.0]], dtype=torch.float64))
    detector = build_detector("nnguide", k=2).fit({"features": bank, "logits": bank_logits,
                                                  "targets": torch.tensor([0, 1, 1])})
    energies = [math.log(2), math.log(3), math.log(4)]
    torch.testing.assert_close(detector.bank, torch.tensor(
        [[energies[0], 0.0], [0.0, energies[1]], [energies[2] / math.sqrt(2)] * 2], dtype=torch.float64),
        rtol=1e-15, atol=0)
    # ẑ · b_j: 0.6 ln 2 = 0.416, 0.8 ln 3 = 0.879, 1.4 ln 4 / √2 = 1.372: the two largest are b_3 and b_2
    expected = (0.8 * energies[1] + 1.4 * energies[2] / math.sqrt(2)) / 2 * math.log(2)
    score = detector.score({"features": torch.tensor([[3.0, 4.0]], dtype=torch.float64),
                            "logits": torch.zeros(1, 2, dtype=torch.float64)})
    assert score.item() == pytest.approx(expected, rel=1e-14)


def test_nnguide_bank_is_a_one_percent_cap_and_bad_input_is_refused(setting) -> None:
    assert DETECTORS["nnguide"].default_fit == {"fraction": 0.01}  # the authors' bankset_ratio, OpenOOD's alpha
    assert DETECTORS["nnguide"].hyperparameter_defaults() == {"k": 10}
    head, features, targets = setting["head"], setting["features"], setting["targets"]
    with pytest.raises(ValueError, match="'nnguide': k must be an integer >= 1, got 0"):
        build_detector("nnguide", k=0)
    with pytest.raises(ValueError, match="'nnguide': k = 301 neighbours, but the bank \\(the fit set\\) has only 300"):
        build_detector("nnguide", k=301).fit(fit_data(features, targets, head))
    with pytest.raises(ValueError, match="k = 11 neighbours, but the bank"):
        build_detector("nnguide", k=11).check_fit_size(10, 4)
    detector = build_detector("nnguide").fit(fit_data(features, targets, head))
    with pytest.raises(ValueError, match=r"'nnguide': the features must be \(N, 32\)"):
        detector.score({"features": features[:, :5], "logits": logits_of(features, head)})
    with pytest.raises(ValueError, match="'nnguide': 299 rows of logits, 300 of features"):
        detector.score({"features": features, "logits": logits_of(features, head)[1:]})
