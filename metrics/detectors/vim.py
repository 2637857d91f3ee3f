"""Virtual-logit matching: the features' residual off the principal subspace, against the energy.

Wang, Li, Feng, Zhang, *ViM: Out-Of-Distribution with Virtual-logit Matching*, CVPR 2022, as pytorch-ood's
``ViM`` computes it (whose scores this matches). With the head ``logits = x Wᵀ + b``:

    u     = -W⁺ b                                  the origin where every logit is 0 (W⁺ the pseudo-inverse)
    C     = (1/N) Σ_i (x_i - u)(x_i - u)ᵀ          over the fit features (streamed, float64)
    R     = the D - d eigenvectors of C with the smallest eigenvalues (the complement of the principal
            subspace of dimension d)
    α     = mean_i max_c logit_c(x_i) / mean_i |(x_i - u) R|     over the fit features (a second pass)
    score(x) = log Σ_c exp(logit_c(x)) - α |(x - u) R|              (the energy minus the virtual logit)

Hyperparameter ``d``: ``None`` (default) takes the authors' rule (haoqiwang/vim ``benchmark.py``: 1000 for
``D >= 2048``, else 512), with ``D // 2`` below ``D = 768`` where 512 would leave too little residual;
a ``d >= D`` is replaced by ``D // 2`` (pytorch-ood's rule for ``d > D``; at ``d = D`` pytorch-ood keeps it and
divides by an empty residual). pytorch-ood has no default ``d``.

A background-class model's head is cut to its K known rows for all of ViM (the origin u, the energy and
α's max logit). The fit is float64 throughout, whatever the features' dtype (pytorch-ood casts to float32); scoring
multiplies by ``[R | Wᵀ]`` (and adds its offset) in the features' precision, float32 for float32 features, and takes
the residual's norm and the energy in float64 (:mod:`metrics.detectors.base`, *Precision*).

The pseudo-inverse and ``eigh`` run on one thread (:func:`metrics.detectors.base.thread_independent`): the
fitted state does not depend on the process's number of threads, so 2 processes give what 1 gives.

Memory: ``O(D² + C·D + chunk·(D + C))``: the covariance is streamed like Mahalanobis's
(:func:`metrics.detectors.base.streamed_moments`, about ``u``), α's pass and scoring are one product
``x [R | Wᵀ]`` per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Buffers,
    Detector,
    check_positive_int,
    check_width,
    in_product_precision,
    logsumexp_,
    row_chunks,
    streamed_moments,
    thread_independent,
)
from metrics.detectors.registry import register_detector


def principal_dimension(d: int | None, dim: int) -> int:
    """The principal subspace's dimension for ``D = dim`` features (see the module docstring)."""
    if d is None:
        return 1000 if dim >= 2048 else 512 if dim >= 768 else dim // 2
    return dim // 2 if d >= dim else d


@register_detector
class ViM(Detector):
    """ViM score, ``energy - α |(x - u) R|`` (see the module docstring).

    Hyperparameters:
        d: the principal subspace's dimension; ``None`` = the authors' rule for the feature width.

    Buffers (float64): the head, ``origin`` ``u`` ``(D,)``, ``residual_basis`` ``R`` ``(D, D - d)``,
    ``alpha`` ``()``.
    """

    name = "vim"
    paper = "Wang et al., CVPR 2022"
    inputs = frozenset({"features", "head"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("origin", "residual_basis", "alpha")

    def __init__(self, *, d: int | None = None, background: bool = False) -> None:
        super().__init__(background=background)
        self.d = check_positive_int("d", d, detector=self.name, allow_none=True)


    def _known_head(self) -> tuple[Tensor, Tensor]:
        weight, bias = self.head_weight, self.head_bias
        return (weight[:-1], bias[:-1]) if self.background else (weight, bias)

    def _fit(self, data: dict[str, Tensor]) -> None:
        features = data["features"]
        weight, bias = self._known_head()
        check_width(features, weight.shape[1], what=f"detector {self.name!r}: the fit features", of="the head's weight")
        dim = features.shape[1]
        with thread_independent():  # MKL's SVD and eigh change in the last bits with its threads
            origin = -(torch.linalg.pinv(weight) @ bias)
        moments = streamed_moments(features, shift=origin)
        with thread_independent():
            _, vectors = torch.linalg.eigh(moments.gram / moments.total)  # ascending eigenvalues
        principal = principal_dimension(self.d, dim)
        self.register_buffer("origin", origin)
        self.register_buffer("residual_basis", vectors[:, :dim - principal].contiguous())
        max_logits = residual_norms = 0.0
        projection = self._projection()
        for (chunk,) in row_chunks(features):
            logits, residual = self._logits_and_residual(chunk, projection)
            max_logits += float(logits.max(dim=1).values.sum())
            residual_norms += float(residual.sum())
        self.register_buffer("alpha", torch.tensor(max_logits / residual_norms, dtype=torch.float64,
                                                   device=features.device))

    def _projection(self) -> tuple[Tensor, Tensor]:
        """``[R | Wᵀ]`` ``(D, D - d + K)`` and the offset ``[-u R | b]``: one product gives both parts."""
        weight, bias = self._known_head()
        basis = self.residual_basis
        return torch.cat([basis, weight.T], dim=1), torch.cat([-(self.origin @ basis), bias])

    def _logits_and_residual(self, features: Tensor, projection: tuple[Tensor, Tensor],
                             buffers: Buffers | None = None) -> tuple[Tensor, Tensor]:
        """The known logits ``(rows, K)`` and ``|(x - u) R|`` ``(rows,)`` float64, from one product ``x [R | Wᵀ]`` in
        the projection's dtype (the features' precision in scoring, float64 in the fit); with ``buffers``, the
        logits in their memory."""
        matrix, offset = projection
        x = features.to(matrix.dtype)
        if buffers is None:
            both = torch.addmm(offset, x, matrix)
        else:
            both = buffers.float64(torch.addmm(offset, x, matrix, out=buffers.take(
                "product", (x.shape[0], matrix.shape[1]), x.dtype)), "float64 product")
        width = self.residual_basis.shape[1]
        return both[:, width:], both[:, :width].norm(dim=1)

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        check_width(features, self.origin.numel(), what=f"detector {self.name!r}: the features", of="its fit features")
        scores, projection = [], in_product_precision(features, *self._projection())
        buffers = Buffers(features.device)
        for (chunk,) in row_chunks(features):
            logits, residual = self._logits_and_residual(chunk, projection, buffers)
            scores.append(logsumexp_(logits) - self.alpha * residual)
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
