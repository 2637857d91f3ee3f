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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", ["bracket", "whole sample", "radix", "missed", "wide bracket"])
def test_percentile_by_bracket_and_by_radix_is_numpys(monkeypatch, dtype, path) -> None:
    """The bracketed selection (the path taken; with every element in its sample), and the radix selection it falls
    back on, alone, where the bounds miss the ranks (here: bounds on the wrong side) or too many elements lie between
    them: numpy's percentiles, on 120,000 activations with ties (±0, a grid) in chunks of 30 rows."""
    monkeypatch.setattr(react_module, "SELECTION_ELEMENTS", 30 * 40)
    values = torch.relu(torch.randn(3000, 40, generator=generator(4), dtype=torch.float64) + 0.3)
    values[::7] = torch.round(values[::7] * 8) / 8
    values[1::9, ::2] = -0.0
    values = values.to(dtype)
    calls = []
    bracketed = detector_base._bracketed_order_statistics

    def spy(*args):
        calls.append(bracketed(*args))
        return calls[-1]

    monkeypatch.setattr(detector_base, "_bracketed_order_statistics", spy)
    if path == "radix":
        monkeypatch.setattr(detector_base, "_bracketed_order_statistics", lambda *args: None)
    elif path == "whole sample":
        monkeypatch.setattr(detector_base, "SAMPLE_EVERY", 1)
    elif path == "missed":
        monkeypatch.setattr(detector_base, "BRACKET_MARGIN", -4.0)
    elif path == "wide bracket":
        monkeypatch.setattr(detector_base, "BRACKET_ELEMENTS", 10)
    for percentile in (0.9, 0.5, 0.01, 0.999, 0.3, 0.1):
        assert activation_percentile(values, percentile) == float(np.percentile(values.numpy(), percentile * 100))
    if path in ("bracket", "whole sample"):
        assert calls and all(found is not None for found in calls)  # the bracket held every rank
    elif path != "radix":  # where the bounds coincide on a tie (±0) that holds the rank, they still hold it
        assert any(found is None for found in calls)
