"""The deep-ensemble κ (:mod:`metrics.detectors.ensemble`: ensemble_mi, ensemble_softmax, ensemble_entropy)
against numpy, with and without a background class (the functions they build on: tests/metrics/test_ensemble.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics import KAPPAS, resolve_detector
from tests.metrics.test_ensemble import ensemble_reference, softmax_reference

ENSEMBLE_REFERENCES = {
    "ensemble_mi": lambda logits, bg: -ensemble_reference(softmax_reference(logits, bg))[2],
    "ensemble_softmax": lambda logits, bg: softmax_reference(logits, False).mean(0)[:, : logits.shape[-1] - bg].max(1),
    "ensemble_entropy": lambda logits, bg: -ensemble_reference(softmax_reference(logits, bg))[0],
}


@pytest.mark.parametrize("background", [False, True])
def test_every_ensemble_kappa_against_numpy(background):
    names = sorted(name for name, kappa in KAPPAS.items() if kappa.kind == "ensemble")
    assert names == sorted(ENSEMBLE_REFERENCES)
    logits = np.random.default_rng(5).normal(size=(5, 30, 6)) * 3
    for name in names:
        scores = KAPPAS[name](torch.from_numpy(logits), background=background)
        assert scores.dtype == torch.float64 and scores.shape == (30,)
        np.testing.assert_allclose(scores.numpy(), ENSEMBLE_REFERENCES[name](logits, background),
                                   rtol=1e-10, atol=1e-13, err_msg=name)
        assert resolve_detector(name).arguments() == {} and resolve_detector(name).kind == "ensemble"
