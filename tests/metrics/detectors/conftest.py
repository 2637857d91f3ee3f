"""The fixture of the detector tests: a head, its fit features and test features (pytorch-ood's setting)."""

from __future__ import annotations

import pytest
import torch

from tests.metrics.detectors.helpers import D, generator, make_features, make_head


@pytest.fixture(scope="module")
def setting() -> dict:
    head = make_head()
    features, targets = make_features()
    test, _ = make_features(80, seed=5)
    test = torch.cat([test, torch.relu(torch.randn(40, D, generator=generator(6), dtype=torch.float64) * 1.5)])
    return {"head": head, "features": features, "targets": targets, "test": test}
