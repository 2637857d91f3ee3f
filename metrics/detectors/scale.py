"""SCALE: the energy of the head's logits of each sample's features scaled by its activation-shaping factor.

Xu, Chen, Franchi, Yao, *Scaling for Training Time and Post-hoc Out-of-distribution Detection Enhancement*,
ICLR 2024. Per sample, with ``s₁`` the sum of its ``D`` activations and ``s₂`` the sum of its ``k = D - round(p·D)``
largest (ASH's rule, :func:`metrics.detectors.ash.kept_count`),

    score(x) = log Σ_k exp(logit_k(x · exp(s₁ / s₂)))

i.e. ASH-S's scaling without its pruning: every activation is kept. Applied to the pooled penultimate
features, as in the paper ("after the last average pooling layer") and pytorch-ood's ``SCALE`` on
``B × D × 1 × 1`` maps (matched to float64 rounding).

Default ``p = 0.85``: the paper's ImageNet setting (the authors' ``configs/postprocessors/scale.yml``:
``percentile: 85``, kai422/SCALE); pytorch-ood's default is 0.65. The activations are assumed non-negative
(post-ReLU); a row with ``s₂ = 0`` (all zero) is scored unscaled where pytorch-ood divides 0 by 0.

Background-class models: the energy over the known logits. Float64. Memory: the head and ``O(chunk·D)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from metrics.detectors.ash import kept_count
from metrics.detectors.base import Detector, check_fraction, check_width, row_chunks


class SCALE(Detector):
    """SCALE score (see the module docstring).

    Hyperparameters:
        percentile: ``p`` in (0, 1); the largest ``1 - p`` of a sample's activations give ``s₂`` (default 0.85).

    Buffers (float64): the head.
    """

    name = "scale"
    inputs = frozenset({"features", "head"})
    fit_data = False
    refuse_non_finite = True

    def __init__(self, *, percentile: float = 0.85, background: bool = False) -> None:
        super().__init__(background=background)
        self.percentile = check_fraction("percentile", percentile, detector=self.name)

    def hyperparameters(self) -> dict[str, Any]:
        return {"percentile": self.percentile}

    def _store_head(self, weight: Tensor, bias: Tensor | None) -> None:
        super()._store_head(weight, bias)
        if kept_count(weight.shape[1], self.percentile) < 1:
            raise ValueError(f"detector {self.name!r}: percentile {self.percentile} of D = {weight.shape[1]} "
                             "activations leaves none for s2; lower the percentile")

    def scaled(self, features: Tensor) -> Tensor:
        """``x · exp(s₁ / s₂)`` ``(rows, D)`` float64 of one chunk."""
        features = features.to(torch.float64)
        k = kept_count(features.shape[1], self.percentile)
        total, kept = features.sum(dim=1), torch.topk(features, k, dim=1).values.sum(dim=1)
        factor = torch.where(kept == 0, torch.ones_like(kept), torch.exp(total / kept))
        return features * factor[:, None]

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the features",
                    of="the head's weight")
        scores = [torch.logsumexp(self.head_logits(self.scaled(chunk)), dim=1) for (chunk,) in row_chunks(features)]
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
