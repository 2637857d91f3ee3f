"""Activation shaping: the energy of the head's logits of each sample's reshaped pooled features.

The shared base of ASH (:mod:`metrics.detectors.ash`) and SCALE (:mod:`metrics.detectors.scale`). Both take a
percentile ``p`` of each sample's ``D`` activations, keep its ``k = D - round(p·D)`` largest (:func:`kept_count`,
``round`` numpy's, half to even) to shape the features (:meth:`ActivationShaping.shape`), and score

    score(x) = log Σ_k exp(logit_k(shape(x)))          logit = the head's, over the known classes

They need the head, no fit data. Background-class models: the energy over the known logits. Precision
(:mod:`metrics.detectors.base`): the shaping and the head's product run in the features' precision, float32 for
float32 features (the top-k is exact there; the per-row sums behind a scale are float64, the scale rounded once to
the features' dtype), the energy in float64. Memory: the head and ``O(chunk·D)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_fraction,
    check_width,
    float64_sums,
    logsumexp_,
    product_dtype,
    row_chunks,
)


def kept_count(dim: int, percentile: float) -> int:
    """``D - round(p·D)``: how many activations a sample keeps (ASH's and SCALE's rule, numpy's rounding)."""
    return dim - int(np.round(dim * percentile))


class ActivationShaping(Detector):
    """Base of the percentile-shaping detectors (see the module docstring): a subclass defines :meth:`shape`
    and the default of ``percentile``.

    Hyperparameters:
        percentile: ``p`` in (0, 1), the fraction of each sample's activations that are not among its kept ones.

    Buffers (float64): the head.
    """

    inputs = frozenset({"features", "head"})
    fit_data = False
    refuse_non_finite = True

    def __init__(self, *, percentile: float, background: bool = False) -> None:
        super().__init__(background=background)
        self.percentile = check_fraction("percentile", percentile, detector=self.name)

    def _store_head(self, weight: Tensor, bias: Tensor | None) -> None:
        super()._store_head(weight, bias)
        if kept_count(weight.shape[1], self.percentile) < 1:
            raise ValueError(f"detector {self.name!r}: percentile {self.percentile} of D = {weight.shape[1]} "
                             "activations keeps none of them; lower the percentile")

    def shape(self, features: Tensor, buffers: Buffers) -> Tensor:
        """The shaped features ``(rows, D)`` of one chunk ``(rows, D)``, in :func:`~metrics.detectors.base.product_dtype`
        of the chunk (in ``buffers``' memory)."""
        raise NotImplementedError

    def kept(self, features: Tensor, *, ordered: bool = True) -> tuple[Tensor, Tensor, Tensor, int]:
        """The features of a chunk in their product precision (float32 or float64), the values and indices of each
        row's kept activations (an exact top-k in either), and ``k``. ``ordered=False``: the same activations, not
        sorted (a quarter faster; the CPU's top-k selects the same ones, ties included, and sorts them after; the
        order matters only to a sum of the values)."""
        features = features.to(product_dtype(features))
        k = kept_count(features.shape[1], self.percentile)
        values, index = torch.topk(features, k, dim=1, sorted=ordered)
        return features, values, index, k

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the features",
                    of="the head's weight")
        head, buffers = self.product_head(features), Buffers(features.device)
        scores = [logsumexp_(self.head_logits(self.shape(chunk, buffers), head, buffers))
                  for (chunk,) in row_chunks(features)]
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)


def shaping_factor(features: Tensor, values: Tensor) -> Tensor:
    """``exp(s₁ / s₂)`` ``(rows,)`` float64 (1 where ``s₂ = 0``): ``s₁`` the sum of each row's activations, ``s₂`` that of
    its kept ``values``, both summed in float64 (ASH-S's and SCALE's scale)."""
    total, kept = float64_sums(features, 1), float64_sums(values, 1)
    return torch.where(kept == 0, torch.ones_like(kept), torch.exp(total / kept))
