"""GEN: the generalised entropy of the largest softmax probabilities.

Liu, Lochman, Zach, *GEN: Pushing the Limits of Softmax-Based Out-of-Distribution Detection*, CVPR 2023, as
pytorch-ood's ``GEN`` computes it (whose scores this matches). With ``p = softmax(z)`` clamped to
``[10⁻⁷, 1 - 10⁻⁷]`` and ``p_(1) >= p_(2) >= ...`` its sorted values,

    score(z) = -(1/M) Σ_{j<=M} p_(j)^γ (1 - p_(j))^γ

(pytorch-ood averages where the paper sums, a constant factor; higher = more in-distribution, the paper's
generalised entropy negated). Defaults pytorch-ood's: ``γ = 0.1`` (the paper's), ``M = None``, all classes
(the paper uses M = 100 for ImageNet: pass ``M=100``). No fit.

Background-class models: the softmax over the K known logits. Float64. Memory ``O(chunk·C)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from metrics.detectors.base import Detector, check_non_negative, check_positive_int, row_chunks

CLAMP = 1e-7
"""pytorch-ood's clamp of the probabilities (keeps p^γ and (1 - p)^γ finite at 0 and 1)."""


class GEN(Detector):
    """GEN score (see the module docstring).

    Hyperparameters:
        gamma: the exponent ``γ > 0`` (default 0.1).
        M: how many of the largest probabilities count (default ``None``: all).
    """

    name = "gen"
    inputs = frozenset({"logits"})
    fit_data = False
    refuse_non_finite = True

    def __init__(self, *, gamma: float = 0.1, M: int | None = None, background: bool = False) -> None:
        super().__init__(background=background)
        self.gamma = check_non_negative("gamma", gamma, detector=self.name, positive=True)
        self.M = check_positive_int("M", M, detector=self.name, allow_none=True)

    def hyperparameters(self) -> dict[str, Any]:
        return {"gamma": self.gamma, "M": self.M}

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        logits = outputs["logits"]
        if logits.ndim != 2:
            raise ValueError(f"detector {self.name!r}: logits must be (N, C), got {tuple(logits.shape)}")
        scores = []
        for (chunk,) in row_chunks(logits):
            p = torch.softmax(self.known_logits(chunk), dim=1).clamp(CLAMP, 1 - CLAMP)
            if self.M is not None:
                p = p.sort(dim=1, descending=True).values[:, :self.M]
            scores.append(-(p.pow(self.gamma) * (1 - p).pow(self.gamma)).mean(dim=1))
        return torch.cat(scores) if scores else logits.new_zeros(0, dtype=torch.float64)
