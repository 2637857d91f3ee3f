"""Mahalanobis distance to class-conditional Gaussians with a tied covariance, and its relative variant.

**Mahalanobis** (Lee, Lee, Lee, Shin, *A Simple Unified Framework for Detecting Out-of-Distribution Samples
and Adversarial Attacks*, NeurIPS 2018), on the penultimate features ``x`` ``(N, D)``, with pytorch-ood's
normalisation (``pytorch_ood.detector.Mahalanobis``, whose scores this matches to float64 rounding):

    μ_c = mean of the fit features of class c                                  (c = 0..K-1)
    S   = Σ_c Σ_{i∈c} (x_i - μ_c)(x_i - μ_c)ᵀ + 10⁻⁶·I   (the within-class scatter: not divided by N)
    score(x) = max_c -½ (x - μ_c)ᵀ S⁻¹ (x - μ_c)

The paper's confidence ``max_c -(x - μ_c)ᵀ Σ⁻¹ (x - μ_c)`` with ``Σ = S / N`` is ``2N`` times this score
(the same ranking; pytorch-ood keeps the -½ of the Gaussian log-density and the undivided scatter, whose
ridge 10⁻⁶ is thus ``10⁻⁶/N`` on Σ). Lee et al.'s input pre-processing (the ε step on the image) and their
layer ensemble are not part of it.

**RelativeMahalanobis** (Ren, Fort, Liu, Roy, Padhy, Lakshminarayanan, *A Simple Fix to Mahalanobis
Distance for Improving Near-OOD Detection*, 2021; pytorch-ood's ``RMD``): the class distance minus the
distance under one Gaussian fitted to all fit features (mean ``m``, scatter ``S₀ = Σ_i (x_i - m)(x_i - m)ᵀ +
10⁻⁶·I``), without the ½:

    score(x) = -min_c [(x - μ_c)ᵀ S⁻¹ (x - μ_c) - (x - m)ᵀ S₀⁻¹ (x - m)]

Both scatters come from one streamed pass (:func:`metrics.detectors.base.streamed_moments`: float64 chunks
about a provisional centre, ``dsyrk`` on the CPU), never an ``N × D`` copy. Too few samples: the scatter has
rank at most ``N - K`` (``N - 1`` for ``S₀``), singular when below ``D``; that is refused unless
``shrinkage > 0`` adds ``shrinkage · tr(S)/D · I`` (a ridge on the scale of the average variance, Ledoit-Wolf
style, on top of the 10⁻⁶). A background-class model's features are those of its known classes: the
statistics use the K known classes of the fit targets.

Scoring whitens with the Cholesky factor ``L`` of ``S`` (``S = L Lᵀ``): ``z = L⁻¹(x - m)``, ``w_c = L⁻¹(μ_c -
m)``, ``min_c d_c = |z|² + min_c (|w_c|² - 2 z·w_c)``: ``L⁻¹`` once per fitted state (a triangular solve
against the identity, ``D³/3`` flops on one thread), then per chunk the products ``(x - m) L⁻ᵀ`` and ``(N × D)(D × K)``, in
float64, centred at the overall mean ``m`` so the terms stay small. The factorisations run on one thread and
everything ``N``-sized is a matrix product, so the fitted state and the scores do not depend on the process's
number of threads (:func:`metrics.detectors.base.thread_independent`): 2 processes give what 1 gives.

Memory: fit ``O(D² + K·D + chunk·D)``; score ``O(D² + K·D + chunk·(D + K))`` (chunk =
:data:`metrics.detectors.base.CHUNK_ROWS` rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.base import (
    Detector,
    Moments,
    check_non_negative,
    check_width,
    class_counts,
    row_chunks,
    streamed_moments,
    thread_independent,
)
from metrics.detectors.registry import register_detector

RIDGE = 1e-6
"""pytorch-ood's ridge on the (undivided) scatter matrices."""


def _cholesky(scatter: Tensor, *, samples: int, rank_loss: int, classes: int, shrinkage: float,
              detector: str, what: str) -> Tensor:
    """The lower Cholesky factor of ``scatter + 10⁻⁶·I (+ shrinkage · tr/D · I)``, refusing a singular one."""
    dim = scatter.shape[0]
    if samples - rank_loss < dim and shrinkage == 0:
        raise ValueError(
            f"detector {detector!r}: {samples} fit samples of {classes} classes in {dim} feature dimensions: the "
            f"{what} has rank at most N - {'K' if rank_loss == classes else rank_loss} = {samples - rank_loss} < "
            f"D = {dim} and is singular; fit on more samples (N >= D + {rank_loss}) or set shrinkage > 0 "
            "(adds shrinkage * tr(S)/D * I)")
    eye = torch.eye(dim, dtype=torch.float64, device=scatter.device)
    matrix = scatter + RIDGE * eye
    if shrinkage:
        matrix = matrix + (shrinkage * float(torch.diagonal(scatter).sum()) / dim) * eye
    with thread_independent():  # MKL's factor changes in the last bits with its threads
        factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info):
        raise ValueError(f"detector {detector!r}: the {what} is not positive definite in float64 (a degenerate fit "
                         "set, e.g. duplicated feature dimensions); set shrinkage > 0")
    return factor


def _inverse_factor(factor: Tensor) -> Tensor:
    """``L⁻¹`` ``(D, D)`` float64, lower triangular: one triangular solve against the identity, on one thread
    (:func:`metrics.detectors.base.thread_independent`), ``D³/3`` flops."""
    eye = torch.eye(factor.shape[0], dtype=torch.float64, device=factor.device)
    with thread_independent():
        return torch.linalg.solve_triangular(factor, eye, upper=False)


def _whiten(features: Tensor, center: Tensor, inverse: Tensor) -> Tensor:
    """``L⁻¹(x - m)`` for every row as the product ``(x - m) L⁻ᵀ``: ``(rows, D)`` float64. A matrix product on
    every thread, whose result does not depend on their number (MKL's triangular solve's does)."""
    centred = features.to(torch.float64) - center
    return centred @ inverse.T


@register_detector
class Mahalanobis(Detector):
    """Mahalanobis score, ``max_c -½ (x - μ_c)ᵀ S⁻¹ (x - μ_c)`` (see the module docstring).

    Hyperparameters:
        shrinkage: ``λ >= 0``; ``S + λ · tr(S)/D · I``. 0 (default, pytorch-ood's) refuses ``N - K < D``.

    Buffers (float64): ``center`` ``(D,)`` the overall fit mean, ``class_means`` ``(K, D)``, ``cholesky``
    ``(D, D)`` the lower factor of ``S``.
    """

    name = "mahalanobis"
    paper = "Lee et al., NeurIPS 2018"
    inputs = frozenset({"features"})
    fit_data = True
    refuse_non_finite = True
    fitted_buffers = ("center", "class_means", "cholesky")

    def __init__(self, *, shrinkage: float = 0.0, background: bool = False) -> None:
        super().__init__(background=background)
        self.shrinkage = check_non_negative("shrinkage", shrinkage, detector=self.name)
        # per factor buffer: (the factor, its version, L⁻¹): EvG's search scores a few images thousands of times,
        # which must not pay D³/3 each time; the factor itself is kept so that a new one is never taken for it
        self._inverses: dict[str, tuple[Tensor, int, Tensor]] = {}


    def _moments(self, data: dict[str, Tensor]) -> Moments:
        features, targets = data["features"], data["targets"]
        if features.ndim != 2:
            raise ValueError(f"detector {self.name!r}: fit features must be (N, D), got {tuple(features.shape)}")
        counts = class_counts(targets, detector=self.name)
        return streamed_moments(features, targets, classes=counts.numel(), transform=self.feature_map)

    def feature_map(self, features: Tensor) -> Tensor:
        """The features the Gaussians are fitted on and scored with, from a chunk of the pass's (a row-wise map,
        applied chunk by chunk): the features themselves here; Mahalanobis++ normalises them
        (:mod:`metrics.detectors.mahalanobis_pp`)."""
        return features

    def _fit(self, data: dict[str, Tensor]) -> None:
        moments = self._moments(data)
        self._store_class_gaussians(moments)

    def _store_class_gaussians(self, moments: Moments) -> None:
        classes = moments.counts.numel()
        self.register_buffer("center", moments.mean())
        self.register_buffer("class_means", moments.class_means())
        self.register_buffer("cholesky", _cholesky(
            moments.within_scatter(), samples=moments.total, rank_loss=classes, classes=classes,
            shrinkage=self.shrinkage, detector=self.name, what="tied (within-class) covariance"))

    def inverse_factor(self, name: str = "cholesky") -> Tensor:
        """``L⁻¹`` of the factor buffer ``name`` (:func:`_inverse_factor`), computed once per fitted state: again
        only when the buffer is replaced (a fit, a load, a move) or changed in place."""
        factor = getattr(self, name)
        cached = self._inverses.get(name)
        if cached is None or cached[0] is not factor or cached[1] != factor._version:
            cached = (factor, factor._version, _inverse_factor(factor))
            self._inverses[name] = cached
        return cached[2]

    def whitened_means(self, inverse: Tensor) -> Tensor:
        """``w_c = L⁻¹(μ_c - m)``: ``(K, D)`` float64, with ``inverse`` = ``L⁻¹`` (:func:`_inverse_factor`)."""
        return _whiten(self.class_means, self.center, inverse)

    def nearest_class_distance(self, features: Tensor, whitened_means: Tensor, inverse: Tensor) -> Tensor:
        """``min_c (x - μ_c)ᵀ S⁻¹ (x - μ_c)`` for every row: ``(rows,)`` float64, as
        ``|z|² + min_c (|w_c|² - 2 z·w_c)`` (one product with the K whitened means)."""
        z = _whiten(features, self.center, inverse)
        class_terms = torch.addmm(whitened_means.square().sum(dim=1), z, whitened_means.T, alpha=-2)
        return class_terms.min(dim=1).values + torch.linalg.vector_norm(z, dim=1).square()

    def _check(self, features: Tensor) -> None:
        check_width(features, self.center.numel(), what=f"detector {self.name!r}: the features",
                    of="its fit features")

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        self._check(features)
        inverse = self.inverse_factor()
        means = self.whitened_means(inverse)
        scores = [-0.5 * self.nearest_class_distance(self.feature_map(chunk), means, inverse)
                  for (chunk,) in row_chunks(features)]
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)


@register_detector
class RelativeMahalanobis(Mahalanobis):
    """Relative Mahalanobis distance, ``-min_c [d_c(x) - d_0(x)]`` (see the module docstring; pytorch-ood's
    ``RMD``).

    Hyperparameters:
        shrinkage: as :class:`Mahalanobis`, on both scatters.

    Buffers (float64): those of :class:`Mahalanobis` and ``background_cholesky`` ``(D, D)``, the lower factor
    of ``S₀`` (the Gaussian of all fit features, mean ``center``).
    """

    name = "relative_mahalanobis"
    paper = "Ren et al., 2021"
    fitted_buffers = ("center", "class_means", "cholesky", "background_cholesky")

    def _fit(self, data: dict[str, Tensor]) -> None:
        moments = self._moments(data)
        self._store_class_gaussians(moments)
        self.register_buffer("background_cholesky", _cholesky(
            moments.total_scatter(), samples=moments.total, rank_loss=1, classes=moments.counts.numel(),
            shrinkage=self.shrinkage, detector=self.name, what="covariance of all fit features"))

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        features = outputs["features"]
        self._check(features)
        inverse, background_inverse = self.inverse_factor(), self.inverse_factor("background_cholesky")
        means, scores = self.whitened_means(inverse), []
        for (chunk,) in row_chunks(features):
            chunk = self.feature_map(chunk)
            z0 = _whiten(chunk, self.center, background_inverse)
            scores.append(torch.linalg.vector_norm(z0, dim=1).square()
                          - self.nearest_class_distance(chunk, means, inverse))
        return torch.cat(scores) if scores else features.new_zeros(0, dtype=torch.float64)
