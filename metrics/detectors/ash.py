"""ASH: activation shaping, the energy of the head's logits of each sample's pruned and reshaped features.

Djurisic, Bozanic, Ashok, Liu, *Extremely Simple Activation Shaping for Out-of-Distribution Detection*,
ICLR 2023. Per sample, keep the ``k = D - round(p·D)`` largest of its ``D`` activations (``torch.topk``; ``round``
is numpy's, half to even), zero the others, then

    ASH-P   keep the kept values as they are
    ASH-B   set every kept value to s₁ / k                   (s₁ = the sum of all D activations)
    ASH-S   multiply the kept values by exp(s₁ / s₂)         (s₂ = the sum of the kept ones)

and score the energy ``log Σ_k exp(logit_k)`` of the head's logits of the shaped features.

Where it applies: the authors shape the ResNet-50's *pooled* penultimate features (their
``resnet_imagenet.py``: ``x = self.avgpool(x); x = apply_ash(x); x = self.fc(torch.flatten(x, 1))``, i.e. a
``B × 2048 × 1 × 1`` tensor), and OpenOOD does the same (its ``ASHNet.forward_threshold``:
``ash_b(feature.view(B, -1, 1, 1), percentile)`` on the pooled feature); so shaping the pooled features ``(N, D)`` here, viewed
as ``B × D × 1 × 1``, is the paper's method, not an approximation (the topk over ``C·H·W`` of a spatial map
would be a different, later-layer variant). pytorch-ood's ``ASH`` on ``B × D × 1 × 1`` maps with an identity
backbone and the linear head scores the same (matched to float64 rounding, ties included: the same
``torch.topk`` on float64 picks the same tied indices).

Defaults: ``p = 0.90`` for ASH-S (the paper's ImageNet ResNet-50 ASH-S@90, the authors'
``config/imagenet_config.yml``: ``ash_s@90``), ``0.60`` for ASH-P (the paper's ImageNet ASH-P@60), ``0.65`` for ASH-B (the paper's ImageNet
ASH-B@65, also the default of the authors' ``ash_b``); pytorch-ood's default is 0.65 for every variant. The activations are assumed non-negative (post-ReLU), as in the paper; a row whose kept
sum ``s₂`` is 0 (an all-zero row) keeps its features in ASH-S (factor 1) where pytorch-ood divides 0 by 0.

Background-class models: the energy over the known logits. Precision: the shaping and the head's product in the
features' precision (float32 for float32 features: pytorch-ood's, whose top-k then picks the same tied indices), the
sums behind ``s₁ / k`` and ``exp(s₁ / s₂)`` in float64, the energy in float64 (:mod:`metrics.detectors.shaping`).
Memory: the head and ``O(chunk·D)``.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from metrics.detectors.base import Buffers, float64_sums
from metrics.detectors.registry import register_detector
from metrics.detectors.shaping import ActivationShaping, kept_count, shaping_factor


class ASH(ActivationShaping):
    """Base of the three ASH variants (see the module docstring); ``variant`` names the shaping.

    Hyperparameters:
        percentile: ``p`` in (0, 1), the fraction of each sample's activations set to zero.

    Buffers (float64): the head.
    """

    variant: ClassVar[str] = ""
    paper = "Djurisic et al., ICLR 2023"

    def shape(self, features: Tensor, buffers: Buffers) -> Tensor:
        """The shaped features ``(rows, D)`` of one chunk, in its product precision (float32 or float64)."""
        features, values, index, k = self.kept(features, ordered=self.variant == "s")  # ASH-S sums its kept values
        if self.variant == "b":
            values = (float64_sums(features, 1) / k).to(features.dtype)[:, None].expand(values.shape)
        elif self.variant == "s":
            values = values * shaping_factor(features, values).to(features.dtype)[:, None]
        shaped = buffers.take("shaped", tuple(features.shape), features.dtype)
        return shaped.zero_().scatter_(1, index, values)


@register_detector
class ASHS(ASH):
    """ASH-S: the kept activations scaled by ``exp(s₁ / s₂)``; ``p = 0.90`` (the paper's ImageNet ASH-S@90)."""

    name = "ash_s"
    variant = "s"

    def __init__(self, *, percentile: float = 0.9, background: bool = False) -> None:
        super().__init__(percentile=percentile, background=background)


@register_detector
class ASHP(ASH):
    """ASH-P: the kept activations as they are; ``p = 0.60`` (the paper's ImageNet ASH-P@60)."""

    name = "ash_p"
    variant = "p"

    def __init__(self, *, percentile: float = 0.6, background: bool = False) -> None:
        super().__init__(percentile=percentile, background=background)


@register_detector
class ASHB(ASH):
    """ASH-B: every kept activation set to ``s₁ / k``; ``p = 0.65`` (the paper's ImageNet ASH-B@65)."""

    name = "ash_b"
    variant = "b"

    def __init__(self, *, percentile: float = 0.65, background: bool = False) -> None:
        super().__init__(percentile=percentile, background=background)


__all__ = ["ASH", "ASHB", "ASHP", "ASHS", "kept_count"]
