"""NCI: the centred feature's alignment with the predicted class's weight vector, plus its L1 norm.

Liu, Qin, *Detecting Out-of-Distribution through the Lens of Neural Collapse*, CVPR 2025. With the head
``logits = x Wᵀ + b`` (``w_c`` its rows), ``ŷ = argmax_c logit_c(x)`` and ``μ_G`` the mean of the training features
(the global mean of Neural Collapse),

    pScore(x) = (x - μ_G) · w_ŷ / |x - μ_G|₂        the proximity of the centred feature to w_ŷ
    score(x)  = pScore(x) + α |x|₁                   the L1 norm filters out features near the origin

(higher = more in-distribution). The paper describes ``pScore`` as the angular proximity of ``x - μ_G`` to
``w_ŷ``; the authors' code divides by ``|x - μ_G|`` only, not by ``|w_ŷ|`` (which varies with ŷ, so this is not a
rescaled cosine), and that is what this computes. The authors' code is OpenOOD v1.5's ``nci_postprocessor.py``
(their repository, litianliu/NCI-OOD, runs NCI through OpenOOD); pytorch-ood's ``NCI`` computes the same, and this
matches its scores to float64 rounding (``-predict_features``; measured on the tests' float64 features with ties,
α in {0, 10⁻⁴, 0.1}: 8.9e-16 at most, as against the authors' logic written in numpy). A feature exactly at
``μ_G`` has ``pScore = 0`` here (the norm floored at 10⁻¹²), where both divide 0 by 0.

Default ``α = 0.0001``: the authors' ``configs/postprocessors/nci.yml`` (``alpha: 0.0001``; OpenOOD's search sweeps
``alpha_list`` [0.0001, 0.001, 0.01, 0.1] on the validation sets); pytorch-ood's default is 0 (``pScore`` alone).

``μ_G`` is the mean of the fit set's features (the training images; OpenOOD ``id_loader_dict['train']``).
Background-class models: ``ŷ`` among the known logits, ``w_ŷ`` a known row. Float64 but for the head's product that
picks ``ŷ``, in the features' precision (float32 for float32 features; :mod:`metrics.detectors.base`, *Precision*).

Memory: fit ``O(D)`` beyond numpy's cast buffers (the mean summed chunk by chunk in float64 without a float64 copy,
:func:`metrics.detectors.base.feature_mean`: measured 21 MiB above 1,280,000 × 2048 float32 fit features); score
``O(K·D + chunk·(D + K))``, the chunk's temporaries in reused buffers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_non_negative,
    check_width,
    chunk_rows,
    feature_mean,
    row_chunks,
)
from metrics.detectors.registry import register_detector

NORM_FLOOR = 1e-12
"""Floor of ``|x - μ_G|``: a feature at the mean has ``pScore = 0`` instead of 0 / 0."""


@register_detector
class NCI(Detector):
    """NCI score, ``pScore + α |x|₁`` (see the module docstring).

    Hyperparameters:
        alpha: ``α >= 0``, the weight of the L1 feature norm (default 0.0001).

    Buffers (float64): the head, ``mean`` ``μ_G`` ``(D,)``.
    """

    name = "nci"
    paper = "Liu & Qin, CVPR 2025"
    inputs = frozenset({"features", "head"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("mean",)

    def __init__(self, *, alpha: float = 0.0001, background: bool = False) -> None:
        super().__init__(background=background)
        self.alpha = check_non_negative("alpha", alpha, detector=self.name)

    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        check_width(features, self.head_weight.shape[1], what=f"detector {self.name!r}: the fit features",
                    of="the head's weight")
        self.register_buffer("mean", feature_mean(features))

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.mean.numel(), what=f"detector {self.name!r}: the features", of="its fit features")
        weight, head = self.head_weight, self.product_head(features)
        scores, buffers = [], Buffers(features.device)
        for (chunk,) in row_chunks(features, rows=chunk_rows(2 * features.shape[1] + weight.shape[0])):
            # ŷ among the known columns of a background-class model
            predicted = self.head_logits(chunk, head, buffers).argmax(dim=1)
            shape = tuple(chunk.shape)
            x = buffers.float64(chunk, "x")
            centred = torch.sub(x, self.mean, out=buffers.take("centred", shape, torch.float64))
            rows = torch.index_select(weight, 0, predicted, out=buffers.take("rows", shape, torch.float64))
            proximity = rows.mul_(centred).sum(dim=1) / centred.norm(dim=1).clamp(min=NORM_FLOOR)
            scores.append(proximity + self.alpha * torch.abs(x, out=rows).sum(dim=1))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
