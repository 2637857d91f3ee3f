"""SHE (:mod:`metrics.detectors.she`): it refuses logits whose width is not its fit's, naming both (against
pytorch-ood: test_dice.py)."""

from __future__ import annotations

import pytest
import torch

from metrics.detectors import Detector, build_detector


def she_fitted(classes: int = 4, dim: int = 6) -> tuple[Detector, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(classes, dim, generator=g, dtype=torch.float64)
    features = torch.randn(200, dim, generator=g, dtype=torch.float64)
    logits = features @ weight.T
    targets = logits.argmax(dim=1)
    she = build_detector("she").fit({"features": features, "logits": logits, "targets": targets})
    return she, weight


def test_she_refuses_logits_of_another_width_naming_both() -> None:
    """SHE's prediction indexes its patterns: K−1 columns used to pick wrong patterns silently, K+1 an IndexError."""
    she, weight = she_fitted()
    features = torch.randn(5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    logits = features @ weight.T
    expected = (features * she.patterns[logits.argmax(dim=1)]).sum(dim=1)
    torch.testing.assert_close(she.score({"features": features, "logits": logits}), expected)
    for width in (3, 5):
        wrong = torch.randn(5, width, dtype=torch.float64)
        with pytest.raises(ValueError, match=f"'she' was fitted on logits of 4 known classes; the logits to score "
                                             f"have {width} known columns"):
            she.score({"features": features, "logits": wrong})
