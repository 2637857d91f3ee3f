"""SCALE: the energy of the head's logits of each sample's features scaled by its activation-shaping factor.

Xu, Chen, Franchi, Yao, *Scaling for Training Time and Post-hoc Out-of-distribution Detection Enhancement*,
ICLR 2024. Per sample, with ``s₁`` the sum of its ``D`` activations and ``s₂`` the sum of its ``k = D - round(p·D)``
largest (ASH's rule, :func:`metrics.detectors.shaping.kept_count`),

    score(x) = log Σ_k exp(logit_k(x · exp(s₁ / s₂)))

i.e. ASH-S's scaling without its pruning: every activation is kept. Applied to the pooled penultimate
features, as in the paper ("after the last average pooling layer") and pytorch-ood's ``SCALE`` on
``B × D × 1 × 1`` maps (matched to float64 rounding).

Default ``p = 0.85``: the paper's ImageNet setting (the authors' ``configs/postprocessors/scale.yml``:
``percentile: 85``, kai422/SCALE); pytorch-ood's default is 0.65. The activations are assumed non-negative
(post-ReLU); a row with ``s₂ = 0`` (all zero) is scored unscaled where pytorch-ood divides 0 by 0.

Background-class models: the energy over the known logits. Precision: the scaling and the head's product in the
features' precision (float32 for float32 features), ``s₁``, ``s₂`` and the energy in float64
(:mod:`metrics.detectors.shaping`). Memory: the head and ``O(chunk·D)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Buffers
from metrics.detectors.registry import register_detector
from metrics.detectors.shaping import ActivationShaping, shaping_factor


@register_detector
class SCALE(ActivationShaping):
    """SCALE score (see the module docstring).

    Hyperparameters:
        percentile: ``p`` in (0, 1); the largest ``1 - p`` of a sample's activations give ``s₂`` (default 0.85).

    Buffers (float64): the head.
    """

    name = "scale"
    paper = "Xu et al., ICLR 2024"

    def __init__(self, *, percentile: float = 0.85, background: bool = False) -> None:
        super().__init__(percentile=percentile, background=background)

    def shape(self, features: Tensor, buffers: Buffers) -> Tensor:
        """``x · exp(s₁ / s₂)`` ``(rows, D)`` of one chunk, in its product precision: every activation kept, scaled."""
        features, values, _, _ = self.kept(features)
        return torch.mul(features, shaping_factor(features, values).to(features.dtype)[:, None],
                         out=buffers.take("shaped", tuple(features.shape), features.dtype))
