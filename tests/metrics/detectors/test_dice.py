"""DICE (:mod:`metrics.detectors.dice`) against pytorch-ood, in one test with SHE and GEN (each of those two
has its own file too: test_she.py, test_gen.py)."""

from __future__ import annotations

import pytorch_ood.detector as pood

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import assert_matches, fit_data, fitted, linear, outputs, pood_in_float64


def test_she_gen_dice_match_pytorch_ood(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data, scored = fit_data(features, targets, head), outputs(test, head)
    theirs = pood.SHE(None, linear(head)).fit_features(features, targets).predict_features(test)
    assert_matches(fitted("she", data, head).score(scored), theirs)
    assert_matches(build_detector("gen").score(scored), pood.GEN(None).predict_logits(scored["logits"]))
    assert_matches(build_detector("gen", gamma=0.5, M=2).score(scored),
                   pood.GEN(None, gamma=0.5, M=2).predict_logits(scored["logits"]))
    for p in (0.7, 0.3):
        with pood_in_float64():
            theirs = pood.DICE(None, head[0], head[1], p=p).fit_features(features, targets).predict_features(test)
        assert_matches(fitted("dice", data, head, p=p).score(scored), theirs)
