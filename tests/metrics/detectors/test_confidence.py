"""The confidence functions of the logits (:mod:`metrics.detectors.confidence`: softmax, max_logit, entropy,
energy) against numpy, with and without a background class."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics import KAPPAS


def test_logit_kappas_against_numpy():
    logits = np.random.default_rng(0).normal(size=(50, 7)) * 3
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    torch_logits = torch.from_numpy(logits)
    np.testing.assert_allclose(KAPPAS["softmax"](torch_logits).numpy(), p.max(1), rtol=1e-12)
    np.testing.assert_allclose(KAPPAS["max_logit"](torch_logits).numpy(), logits.max(1))
    np.testing.assert_allclose(KAPPAS["entropy"](torch_logits).numpy(), (p * np.log(p)).sum(1), rtol=1e-10)
    np.testing.assert_allclose(KAPPAS["energy"](torch_logits).numpy(), np.log(np.exp(logits).sum(1)), rtol=1e-10)


def test_background_keeps_the_rejection_signal():
    # two known classes at 0.05 each and p_bg = 0.9: the OSCR confidence is 0.05, so must the kappa be
    logits = torch.log(torch.tensor([[0.05, 0.05, 0.9]]))
    assert KAPPAS["softmax"](logits, background=True).item() == pytest.approx(0.05)
    assert KAPPAS["softmax"](logits[:, :2]).item() == pytest.approx(0.5)  # what dropping it first gave
    # entropy: the background mass spread over the known classes -> uniform -> the minimum -log K
    assert KAPPAS["entropy"](logits, background=True).item() == pytest.approx(-np.log(2))
    confident = torch.log(torch.tensor([[0.9, 0.05, 0.05]]))
    assert KAPPAS["entropy"](confident, background=True) > KAPPAS["entropy"](logits, background=True)


def test_background_kappas_against_numpy():
    logits = np.random.default_rng(1).normal(size=(40, 6)) * 3  # K = 5 known + background
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    spread = p[:, :5] + p[:, 5:] / 5
    torch_logits = torch.from_numpy(logits)
    np.testing.assert_allclose(KAPPAS["softmax"](torch_logits, background=True).numpy(), p[:, :5].max(1), rtol=1e-12)
    np.testing.assert_allclose(KAPPAS["entropy"](torch_logits, background=True).numpy(),
                               (spread * np.log(spread)).sum(1), rtol=1e-10)
    np.testing.assert_allclose(KAPPAS["max_logit"](torch_logits, background=True).numpy(), logits[:, :5].max(1))
    np.testing.assert_allclose(KAPPAS["energy"](torch_logits, background=True).numpy(),
                               np.log(np.exp(logits[:, :5]).sum(1)), rtol=1e-10)
