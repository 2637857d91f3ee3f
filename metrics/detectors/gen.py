"""GEN: the generalised entropy of the largest softmax probabilities.

Liu, Lochman, Zach, *GEN: Pushing the Limits of Softmax-Based Out-of-Distribution Detection*, CVPR 2023.
With ``p = softmax(z)`` and ``p_(1) >= p_(2) >= ...`` its sorted values,

    score(z) = -(1/M) Σ_{j<=M} p_(j)^γ (1 - p_(j))^γ

(higher = more in-distribution, the paper's generalised entropy negated; the mean where the paper and OpenOOD
sum, a constant factor that changes no ranking, as pytorch-ood does). The probabilities are used as they are, as
in the paper's equation and the authors' and OpenOOD's code (``GENPostprocessor``); ``clamp=True`` first clamps
them to ``[10⁻⁷, 1 - 10⁻⁷]`` as pytorch-ood's ``GEN`` does (whose scores that form matches). The clamp moves
every probability below 10⁻⁷ up to it, and with 1,000 classes most of them are below it: measured on random
ImageNet-sized logits, the scores of the two forms differ by up to 24%. Unclamped, ``0^γ = 0`` keeps every score
finite. Defaults: ``γ = 0.1`` (the paper's), ``M = None``, all classes (the paper and OpenOOD v1.5 use M = 100 for
ImageNet: pass ``M=100``). No fit.

Background-class models: the softmax over the K known logits. Float64. Memory ``O(chunk·C)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import Detector, check_non_negative, check_positive_int, row_chunks
from metrics.detectors.registry import register_detector

CLAMP = 1e-7
"""pytorch-ood's clamp of the probabilities (keeps p^γ and (1 - p)^γ finite at 0 and 1)."""


@register_detector
class GEN(Detector):
    """GEN score (see the module docstring).

    Hyperparameters:
        gamma: the exponent ``γ > 0`` (default 0.1).
        M: how many of the largest probabilities count (default ``None``: all).
        clamp: clamp the probabilities to ``[1e-7, 1 - 1e-7]`` first, as pytorch-ood does (default ``False``:
            the paper's and OpenOOD's form).
    """

    name = "gen"
    paper = "Liu et al., CVPR 2023"
    inputs = frozenset({"logits"})
    fit_data = False
    refuse_non_finite = True

    def __init__(self, *, gamma: float = 0.1, M: int | None = None, clamp: bool = False,
                 background: bool = False) -> None:
        super().__init__(background=background)
        if not isinstance(clamp, bool):
            raise ValueError(f"detector {self.name!r}: clamp must be true or false, got {clamp!r}")
        self.clamp = clamp
        self.gamma = check_non_negative("gamma", gamma, detector=self.name, positive=True)
        self.M = check_positive_int("M", M, detector=self.name, allow_none=True)


    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        logits = outputs["logits"]
        if logits.ndim != 2:
            raise ValueError(f"detector {self.name!r}: logits must be (N, C), got {tuple(logits.shape)}")
        scores = []
        for (chunk,) in row_chunks(logits):
            p = torch.softmax(self.known_logits(chunk), dim=1)
            if self.clamp:
                p = p.clamp(CLAMP, 1 - CLAMP)
            if self.M is not None:
                p = p.sort(dim=1, descending=True).values[:, :self.M]
            scores.append(-(p.pow(self.gamma) * (1 - p).pow(self.gamma)).mean(dim=1))
        return torch.cat(scores) if scores else logits.new_zeros(0, dtype=torch.float64)
