"""GEN (:mod:`metrics.detectors.gen`): the paper's unclamped form and pytorch-ood's clamped one, each against
its reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics.detectors import build_detector


def gen_reference(logits: np.ndarray, gamma: float, m: int | None, clamp: bool) -> np.ndarray:
    """The GEN score from the paper's equation (numpy, float64): minus the mean over the M largest probabilities of
    ``p^γ (1 - p)^γ``, the probabilities clamped to [1e-7, 1 - 1e-7] first where ``clamp``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    if clamp:
        p = np.clip(p, 1e-7, 1 - 1e-7)
    p = -np.sort(-p, axis=1)[:, :m] if m is not None else p
    return -(p ** gamma * (1 - p) ** gamma).mean(axis=1)


def test_gen_is_the_papers_form_unclamped_and_pytorch_oods_with_clamp() -> None:
    from pytorch_ood.detector import GEN as PoodGEN

    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 4
    logits[0, :] = 0.0  # a uniform row, and ties
    logits[1, :3] = logits[1].max() + 1.0
    plain = build_detector("gen").score({"logits": logits})
    clamped = build_detector("gen", clamp=True).score({"logits": logits})
    np.testing.assert_allclose(plain.numpy(), gen_reference(logits.numpy(), 0.1, None, clamp=False), rtol=1e-12)
    np.testing.assert_allclose(clamped.numpy(), gen_reference(logits.numpy(), 0.1, None, clamp=True), rtol=1e-12)
    theirs = -PoodGEN(model=None, gamma=0.1, M=1000).predict_logits(logits).numpy()
    np.testing.assert_allclose(clamped.numpy(), theirs, rtol=1e-10)
    top = build_detector("gen", M=100).score({"logits": logits})
    np.testing.assert_allclose(top.numpy(), gen_reference(logits.numpy(), 0.1, 100, clamp=False), rtol=1e-12)
    # the two forms are not a rescaling of each other: on 1,000 classes the clamp moves the scores by up to ~24%
    relative = ((clamped - plain).abs() / plain.abs()).max().item()
    assert 0.05 < relative < 0.5
    with pytest.raises(ValueError, match="clamp must be true or false, got 'yes'"):
        build_detector("gen", clamp="yes")
