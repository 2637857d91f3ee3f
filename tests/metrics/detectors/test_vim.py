"""ViM (:mod:`metrics.detectors.vim`) against pytorch-ood."""

from __future__ import annotations

import pytest
import pytorch_ood.detector as pood

from tests.metrics.detectors.helpers import assert_matches, fit_data, fitted, outputs, pood_in_float64


@pytest.mark.parametrize("d", [8, 16, None])
def test_vim_matches_pytorch_ood(setting, d) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    with pood_in_float64():  # pytorch-ood's ViM needs d; ours defaults to D // 2 = 16 below D = 768
        theirs = pood.ViM(None, d=d or 16, w=head[0], b=head[1]).fit_features(features, targets).predict_features(test)
    ours = fitted("vim", fit_data(features, targets, head), head, d=d).score(outputs(test, head))
    assert_matches(ours, theirs)
