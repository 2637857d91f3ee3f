"""GradNorm: the L1 norm of the gradient of the KL divergence to the uniform distribution w.r.t. the head's weight.

Huang, Geng, Li, *On the Importance of Gradients for Detecting Distributional Shifts in the Wild*, NeurIPS 2021.
With the logits ``z = W x + b`` of the penultimate features ``x`` ``(D,)``, ``C`` classes, ``p = softmax(z/T)`` and
``u = (1/C, ..., 1/C)``, the paper's loss is

    KL(u ‖ p) = Σ_c (1/C) log((1/C) / p_c) = -(1/C) Σ_c log p_c - log C

and its score the L1 norm of ``∂KL/∂W`` (the last layer's weight, ``C × D``). Closed form, without a backward
pass: ``-(1/C) Σ_c log p_c = -(1/C) Σ_c z_c/T + log Σ_k exp(z_k/T)``, so ``∂KL/∂z_c = (p_c - 1/C)/T``;
``∂z_c/∂W_cd = x_d``, so ``∂KL/∂W = ((p - u)/T) ⊗ x``, a rank-one matrix whose entry-wise L1 norm is the product
of its factors' L1 norms:

    score(x) = (1/T) · Σ_c |p_c - 1/C| · Σ_d |x_d|

(higher = more in-distribution: a confident softmax is far from uniform). Scale: this is the KL as the paper writes
it, and pytorch-ood's ``GradNorm`` (its cross-entropy to ``u`` is a mean over the classes), which this matches to
float64 rounding when pytorch-ood's backward runs on a linear head's weight (``param_filter``; measured: 2.2e-15
relative at most, T in {1, 2.5}, features with ties). The authors' code
(deeplearning-wisc/gradnorm_ood, ``test_ood.py`` ``iterate_data_gradnorm``) and OpenOOD v1.5's
``gradnorm_postprocessor.py`` sum the cross-entropy over the classes (targets all ones), so their score is ``C``
times this one: the same ranking for one model. The bias's gradient is not part of it (the paper's and the
authors' ``head.conv.weight``).

Default ``T = 1``: the authors' (``test_ood.py``: ``--temperature_gradnorm`` default 1) and pytorch-ood's; OpenOOD
has no temperature (T = 1).
No fit. Background-class models: ``C = K``, the known classes (the softmax over the known logits, ``u`` uniform over
them). Reads the features and the logits of the pass (``logits = head(features)``). Float64.

Memory: ``O(chunk·(D + C))``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Detector, check_non_negative, chunk_rows, row_chunks
from metrics.detectors.registry import register_detector


@register_detector
class GradNorm(Detector):
    """GradNorm score, ``(1/T) Σ_c |softmax(z/T)_c - 1/C| · |x|₁`` (see the module docstring).

    Hyperparameters:
        temperature: ``T > 0`` of the softmax (default 1).
    """

    name = "gradnorm"
    paper = "Huang et al., NeurIPS 2021"
    inputs = frozenset({"features", "logits"})
    fit_data = False
    refuse_non_finite = True

    def __init__(self, *, temperature: float = 1.0, background: bool = False) -> None:
        super().__init__(background=background)
        self.temperature = check_non_negative("temperature", temperature, detector=self.name, positive=True)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features, logits = outputs["features"], outputs["logits"]
        if features.ndim != 2 or logits.ndim != 2 or features.shape[0] != logits.shape[0]:
            raise ValueError(f"detector {self.name!r}: features (N, D) and logits (N, C) of the same samples, got "
                             f"{tuple(features.shape)} and {tuple(logits.shape)}")
        scores = []
        for x, z in row_chunks(features, logits, rows=chunk_rows(features.shape[1] + logits.shape[1])):
            p = torch.softmax(self.known_logits(z) / self.temperature, dim=1)
            deviation = (p - 1.0 / p.shape[1]).abs().sum(dim=1) / self.temperature
            scores.append(deviation * x.to(torch.float64).abs().sum(dim=1))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
