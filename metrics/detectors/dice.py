"""DICE: the energy of a head sparsified to the weights that contribute most on in-distribution data.

Sun, Li, *DICE: Leveraging Sparsification for Out-of-Distribution Detection*, ECCV 2022, as pytorch-ood's
``DICE`` computes it (whose scores this matches). With the head ``logits = x Wᵀ + b`` (``W`` ``(K, D)``):

    x̄        = the mean of the fit features                          (D,)
    V_kj     = x̄_j · W_kj                                             the contribution of weight (k, j)
    t        = the p-quantile of the K·D contributions (linear interpolation, as ``torch.quantile``)
    M_kj     = W_kj if V_kj > t else 0
    score(x) = log Σ_k exp((x Mᵀ + b)_k)

Default ``p = 0.7``: the paper's ImageNet sparsity (its CIFAR value is 0.9, OpenOOD's default); pytorch-ood
has no default (``p`` is required). A background-class model's head is cut to its K known rows: the
quantile runs over their ``K·D`` contributions and the energy over the known logits. The fit is float64 (pytorch-ood
casts to float32); scoring multiplies by the masked head in the features' precision, float32 for float32 features, and
takes the energy in float64 (:mod:`metrics.detectors.base`, *Precision*).

Memory: the head and its mask ``O(K·D)``; the fit mean is summed chunk by chunk without a float64 copy
(:func:`metrics.detectors.base.feature_mean`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_fraction,
    check_width,
    feature_mean,
    in_product_precision,
    linear_quantile,
    logsumexp_,
    row_chunks,
)
from metrics.detectors.registry import register_detector


@register_detector
class DICE(Detector):
    """DICE score (see the module docstring).

    Hyperparameters:
        p: the fraction in (0, 1) of the weight contributions masked out, the smallest first (default 0.7).

    Buffers (float64): the head, ``mean_activation`` ``x̄`` ``(D,)``, ``threshold`` ``t`` ``()`` and
    ``masked_weight`` ``M`` ``(K, D)`` (the known rows, sparsified).
    """

    name = "dice"
    paper = "Sun & Li, ECCV 2022"
    inputs = frozenset({"features", "head"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("mean_activation", "threshold", "masked_weight")

    def __init__(self, *, p: float = 0.7, background: bool = False) -> None:
        super().__init__(background=background)
        self.p = check_fraction("p", p, detector=self.name)


    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        weight = self.head_weight[:-1] if self.background else self.head_weight
        check_width(features, weight.shape[1], what=f"detector {self.name!r}: the fit features", of="the head's weight")
        mean = feature_mean(features)
        contribution = mean[None, :] * weight
        threshold = linear_quantile(lambda: [contribution.reshape(-1)], contribution.numel(), self.p,
                                    dtype=torch.float64)
        self.register_buffer("mean_activation", mean)
        self.register_buffer("threshold", torch.tensor(threshold, dtype=torch.float64, device=features.device))
        self.register_buffer("masked_weight", torch.where(contribution > threshold, weight, torch.zeros_like(weight)))

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.masked_weight.shape[1], what=f"detector {self.name!r}: the features",
                    of="the head's weight")
        bias = self.head_bias[:-1] if self.background else self.head_bias
        weight, bias = in_product_precision(features, self.masked_weight, bias)
        buffers, scores = Buffers(features.device), []
        for (chunk,) in row_chunks(features):
            logits = torch.addmm(bias, chunk.to(weight.dtype), weight.T,
                                 out=buffers.take("logits", (chunk.shape[0], weight.shape[0]), weight.dtype))
            scores.append(logsumexp_(buffers.float64(logits, "float64 logits")))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
