"""The confidence functions κ of a model's logits (Galil, Dabbah, El-Yaniv, ICLR 2023; DESIGN.md §5.2).

    softmax     max_c softmax(z)_c                               (softmax response; Hendrycks & Gimpel, ICLR 2017)
    max_logit   max_c z_c                                        (Hendrycks et al., ICML 2022)
    entropy     Σ_c p_c log p_c, p = softmax(z)                   (negative entropy)
    energy      log Σ_c exp(z_c)                                  (negative energy, T = 1; Liu et al., NeurIPS 2020;
                                                                   pytorch-ood's EnergyBased negated)

Background-class models (``background=True``, DESIGN.md §3–§4): the last logit is the background class. The
softmax runs over all ``K+1`` logits and the background column is dropped afterwards, exactly as in OSCR and γ,
so the model's rejection signal is kept (two known classes at 0.05 and ``p_bg = 0.9`` give a softmax response of
0.05, not 0.5):

    softmax     max_{c<K} p_c,  p = softmax over K+1
    entropy     Σ_{c<K} p'_c log p'_c,  p'_c = p_c + p_bg / K: the background mass means "none of the known
                classes" and is spread uniformly over them (the EOS target for negatives), so p_bg = 1 gives
                the minimum -log K, as a uniform prediction does (the plain Σ_{c<K} p_c log p_c would instead
                tend to its maximum 0 as p_bg -> 1)
    max_logit, energy   computed on the K known logits (logit-space scores have no softmax to keep)

Every score has shape ``(N,)``, higher = more in-distribution.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.function import ScoreFunction
from metrics.detectors.registry import register_detector
from openset_common.labels import known_columns, spread_background_mass


def _as_float(logits: Tensor) -> Tensor:
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, C), got {tuple(logits.shape)}")
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _negative_entropy_of_known(probs: Tensor, background: bool) -> Tensor:
    """``Σ p log p`` over the known classes; with a background column its mass is spread over them."""
    if background:
        probs = spread_background_mass(probs)
    return torch.special.xlogy(probs, probs).sum(dim=1)


def softmax_response(logits: Tensor, background: bool = False) -> Tensor:
    """``max_c softmax(z)_c`` (over the known columns of a softmax over all logits with a background)."""
    return known_columns(torch.softmax(_as_float(logits), dim=1), background).max(dim=1).values


def max_logit(logits: Tensor, background: bool = False) -> Tensor:
    """``max_c z_c`` over the known classes."""
    return known_columns(_as_float(logits), background).max(dim=1).values


def negative_entropy(logits: Tensor, background: bool = False) -> Tensor:
    """``Σ_c p_c log p_c`` of ``p = softmax(z)`` (``0 log 0 = 0``); the negative of the entropy."""
    logits = _as_float(logits)
    if background:
        return _negative_entropy_of_known(torch.softmax(logits, dim=1), True)
    log_p = torch.log_softmax(logits, dim=1)
    return (log_p.exp() * log_p).sum(dim=1)


def energy(logits: Tensor, background: bool = False) -> Tensor:
    """``log Σ_c exp(z_c)`` over the known classes: the negative free energy at ``T = 1``."""
    return torch.logsumexp(known_columns(_as_float(logits), background), dim=1)


@register_detector
class Softmax(ScoreFunction):
    """The softmax response ``max_c softmax(z)_c``."""

    name, paper, kernel = "softmax", "Hendrycks & Gimpel, ICLR 2017", softmax_response


@register_detector
class MaxLogit(ScoreFunction):
    """The largest logit ``max_c z_c``."""

    name, paper, kernel = "max_logit", "Hendrycks et al., ICML 2022", max_logit


@register_detector
class Entropy(ScoreFunction):
    """The negative entropy ``Σ_c p_c log p_c`` of the softmax."""

    name, paper, kernel = "entropy", "Galil et al., ICLR 2023", negative_entropy


@register_detector
class Energy(ScoreFunction):
    """The negative energy ``log Σ_c exp(z_c)``."""

    name, paper, kernel = "energy", "Liu et al., NeurIPS 2020", energy
