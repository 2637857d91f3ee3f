"""SCALE (:mod:`metrics.detectors.scale`) against pytorch-ood."""

from __future__ import annotations

import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import as_maps, assert_matches, identity, linear, outputs


@pytest.mark.parametrize("percentile", [0.85, 0.5])
def test_scale_matches_pytorch_ood(setting, percentile) -> None:
    head, test = setting["head"], torch.round(setting["test"] / 0.5) * 0.5  # ties: s2 does not depend on them
    theirs = pood.SCALE(identity, linear(head), percentile=percentile).predict_feature_maps(as_maps(test))
    assert_matches(build_detector("scale", percentile=percentile).fit({}, head=head).score(outputs(test, head)), theirs)
