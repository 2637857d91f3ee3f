"""Mahalanobis++: the Mahalanobis distance and its relative variant on ℓ2-normalised features.

Müller, Hein, *Mahalanobis++: Improving OOD Detection via Feature Normalization*, ICML 2025 (the authors' code:
github.com/mueller-mp/maha-norm, ``NINCO/detection_methods.py`` ``evaluate_Mahalanobis_norm`` and its OpenOOD
postprocessors ``mdsn_postprocessor.py``, ``rmdsn_postprocessor.py``). Every feature, of the fit set and of the
samples scored, is first mapped onto the unit sphere,

    z = x / max(|x|₂, 10⁻¹²)

and the class Gaussians of :mod:`metrics.detectors.mahalanobis` are fitted on and scored with ``z``:

**MahalanobisPP** (``mahalanobis_pp``): :class:`metrics.detectors.mahalanobis.Mahalanobis` on ``z``,

    μ_c = mean of the normalised fit features of class c,   S = Σ_c Σ_{i∈c} (z_i - μ_c)(z_i - μ_c)ᵀ + 10⁻⁶·I
    score(x) = max_c -½ (z - μ_c)ᵀ S⁻¹ (z - μ_c)

**RelativeMahalanobisPP** (``relative_mahalanobis_pp``): :class:`metrics.detectors.mahalanobis.RelativeMahalanobis`
on ``z`` (the paper's "rMaha++", the authors' ``rmdsn``): ``-min_c [d_c(z) - d_0(z)]`` with ``d_0`` the distance
under one Gaussian of all normalised fit features.

The authors score ``max_c -(z - μ_c)ᵀ Σ⁺ (z - μ_c)`` with ``Σ = S/N`` (sklearn's ``EmpiricalCovariance`` of the
class-centred normalised features, its pseudo-inverse ``precision_``), and their relative form with the same
``Σ``-scaled distances: ``2N`` resp. ``N`` times the scores here (up to the ridge ``10⁻⁶·I`` on ``S``, i.e.
``10⁻⁶/N`` on ``Σ``), the same ranking. They divide by ``|x|`` without a floor (a zero feature is NaN there, the
zero vector here). No hyperparameter of the paper's: ``shrinkage`` is the base detector's (0, refusing a
singular scatter).

Reference: a numpy transcription of the authors' logic in ``tests/metrics/detectors/test_mahalanobis_pp.py``
(normalise, class means, ``EmpiricalCovariance`` of the centred features, its pseudo-inverse), scaled by ``1/(2N)``
(``1/N`` for the relative form). Measured on the tests' data (300 × 32 features, ties included): with the
project's ridge added to its covariances, 5·10⁻¹⁵ relative (Maha++) and 9·10⁻¹² (rMaha++); without (the authors'
own), 1.5·10⁻⁶ relative and 1.6·10⁻⁵ absolute on rMaha++'s differences of distances of ~10-60, the ridge's size
(``10⁻⁶/N`` on a covariance of ``~10⁻²``). The detectors score bit for bit as ``mahalanobis`` /
``relative_mahalanobis`` fitted on and scoring features normalised beforehand.

The normalisation is applied chunk by chunk (:meth:`~metrics.detectors.mahalanobis.Mahalanobis.feature_map`, the
``transform`` of :func:`metrics.detectors.base.streamed_moments`): no normalised ``N × D`` copy is made. Memory:
fit ``O(D² + K·D + chunk·D)``; score ``O(D² + K·D + chunk·(D + K))``, as the base detectors': the ``D × D`` Gram
matrix and factors (32 MiB each at D = 2048), the class sums (16 MiB at K = 1000) and per chunk of 16,384 rows the
normalised float64 copy and the shifted buffer (256 MiB each). Measured (CPU, float32 features, D = 2048, K =
1000): the fit's peak is 571 MiB above the features, the same at any N (streamed), so 1,281,167 × 2048 features
(9.8 GiB) fit within 2 GiB above them; scoring peaks 832 MiB above the fitted state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics.detectors.knn import NORM_FLOOR
from metrics.detectors.mahalanobis import Mahalanobis, RelativeMahalanobis
from metrics.detectors.registry import register_detector


def normalise(features: Tensor) -> Tensor:
    """``x / max(|x|, 10⁻¹²)`` per row, float64 (:func:`metrics.detectors.knn.normalise`'s values), divided in place
    in one float64 copy: a chunk's one temporary."""
    unit = features.to(torch.float64, copy=True)
    return unit.div_(torch.linalg.vector_norm(unit, dim=1, keepdim=True).clamp_(min=NORM_FLOOR))


@register_detector
class MahalanobisPP(Mahalanobis):
    """Mahalanobis++, ``max_c -½ (z - μ_c)ᵀ S⁻¹ (z - μ_c)`` on unit-normalised features ``z`` (see the module
    docstring): :class:`~metrics.detectors.mahalanobis.Mahalanobis` on ``z``.

    Hyperparameters:
        shrinkage: as :class:`~metrics.detectors.mahalanobis.Mahalanobis` (default 0).

    Buffers (float64): those of :class:`~metrics.detectors.mahalanobis.Mahalanobis`, of the normalised features.
    """

    name = "mahalanobis_pp"
    paper = "Müller & Hein, ICML 2025"

    def feature_map(self, features: Tensor) -> Tensor:
        """``x / max(|x|, 10⁻¹²)`` per row, float64."""
        return normalise(features)


@register_detector
class RelativeMahalanobisPP(RelativeMahalanobis):
    """Relative Mahalanobis++, ``-min_c [d_c(z) - d_0(z)]`` on unit-normalised features ``z`` (see the module
    docstring): :class:`~metrics.detectors.mahalanobis.RelativeMahalanobis` on ``z``.

    Hyperparameters:
        shrinkage: as :class:`~metrics.detectors.mahalanobis.Mahalanobis` (default 0).

    Buffers (float64): those of :class:`~metrics.detectors.mahalanobis.RelativeMahalanobis`, of the normalised
    features.
    """

    name = "relative_mahalanobis_pp"
    paper = "Müller & Hein, ICML 2025"

    def feature_map(self, features: Tensor) -> Tensor:
        """``x / max(|x|, 10⁻¹²)`` per row, float64."""
        return normalise(features)
