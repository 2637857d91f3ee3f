"""ReAct (:mod:`metrics.detectors.react`) against pytorch-ood; its activation percentile against numpy's on
chunk boundaries and ties."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch

from metrics.detectors import base as detector_base
from metrics.detectors import react as react_module
from metrics.detectors.react import activation_percentile
from tests.metrics.detectors.helpers import (
    as_maps,
    assert_matches,
    fit_data,
    fitted,
    generator,
    identity,
    linear,
    make_features,
    outputs,
)


@pytest.mark.parametrize("grid", [None, 0.25])
def test_react_matches_pytorch_ood(setting, grid) -> None:
    head, (features, targets) = setting["head"], make_features(grid=grid)
    test = setting["test"]
    theirs = pood.ReAct(identity, linear(head), percentile=0.9).fit_feature_maps(as_maps(features), targets)
    ours = fitted("react", fit_data(features, targets, head), head)
    assert float(ours.threshold) == theirs.threshold  # np.percentile, bit for bit
    assert_matches(ours.score(outputs(test, head)), theirs.predict_feature_maps(as_maps(test)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("rows", "dim", "grid"), [(1, 1, None), (37, 5, None), (64, 8, 0.5), (100, 3, 1.0),
                                                  (29, 13, 0.125)])
def test_react_percentile_is_numpys_on_chunk_boundaries_and_ties(monkeypatch, dtype, rows, dim, grid) -> None:
    monkeypatch.setattr(detector_base, "CHUNK_ROWS", 4)
    monkeypatch.setattr(react_module, "SELECTION_ELEMENTS", 7)  # chunks of 1 row for dim >= 7
    values = torch.randn(rows, dim, generator=generator(rows), dtype=torch.float64).abs()
    if grid is not None:
        values = torch.round(values / grid) * grid
        values[::3] = 0.0  # many ties at 0 (ReLU)
        values[1::5] = -0.0
    values = values.to(dtype)
    for percentile in (0.9, 0.5, 0.01, 0.999, 0.3):
        assert activation_percentile(values, percentile) == float(np.percentile(values.numpy(), percentile * 100))
