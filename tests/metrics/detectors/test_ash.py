"""ASH-S, ASH-P and ASH-B (:mod:`metrics.detectors.ash`) against pytorch-ood."""

from __future__ import annotations

import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import as_maps, assert_matches, identity, linear, outputs


@pytest.mark.parametrize("grid", [None, 0.5])
@pytest.mark.parametrize(("name", "variant", "percentile"), [("ash_s", "ash-s", 0.9), ("ash_p", "ash-p", 0.9),
                                                            ("ash_b", "ash-b", 0.65), ("ash_s", "ash-s", 0.7)])
def test_ash_matches_pytorch_ood(setting, name, variant, percentile, grid) -> None:
    head, test = setting["head"], setting["test"]
    if grid is not None:  # ties at the pruning boundary: the same topk on float64 keeps the same indices
        test = torch.round(test / grid) * grid
    theirs = pood.ASH(identity, linear(head), variant=variant, percentile=percentile).predict_feature_maps(as_maps(test))
    ours = build_detector(name, percentile=percentile).fit({}, head=head).score(outputs(test, head))
    assert_matches(ours, theirs)
