"""Metrics of the adversarial evaluation of OOD detectors (EvG; Yoon et al., DESIGN.md §5.4).

Scores follow the project's κ convention (higher = more in-distribution).

    MinRank   = min_j |{i : κ_id_i > κ_ood_j}|
                the rank, among the ID test samples, of the outlier the detector trusts most: 0 when some
                outlier scores at least as high as every ID sample, N_id when every outlier scores below
                every ID sample. Only the most trusted outlier counts, so it equals the count of ID scores
                strictly above ``max_j κ_ood_j``.
    energy    = (-κ - μ) / (σ + 1e-3)
                the detector's outlier score ``-κ`` standardised with the mean μ and the sample standard
                deviation σ (N - 1 in the denominator, ``torch.std``'s default, as the authors' detector
                wrapper) of the outlier scores of **in-distribution validation** images. Lower energy =
                more in-distribution-looking: the samplers minimise it.

The worst-case AUROC is :func:`metrics.auroc` of the ID test scores against each chain's lowest-energy
outlier.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metrics._validation import check_scores

STD_EPSILON = 1e-3


def min_rank(id_scores: Tensor, ood_scores: Tensor) -> int:
    """MinRank: the number of ID samples that score strictly above the most trusted outlier.

    Args:
        id_scores: ``(N_id,)`` κ of the in-distribution test samples.
        ood_scores: ``(N_ood,)`` κ of the outliers (e.g. each chain's worst case).
    """
    id_scores = check_scores(id_scores, name="id_scores")
    ood_scores = check_scores(ood_scores, name="ood_scores").to(id_scores.device)
    if id_scores.numel() == 0 or ood_scores.numel() == 0:
        raise ValueError(f"MinRank needs ID and OOD scores, got {id_scores.numel()} ID and {ood_scores.numel()} OOD")
    dtype = torch.promote_types(id_scores.dtype, ood_scores.dtype)
    return int((id_scores.to(dtype) > ood_scores.to(dtype).max()).sum())


def energy_standardisation(id_validation_kappa: Tensor) -> tuple[float, float]:
    """``(μ, σ + 1e-3)`` of the outlier scores ``-κ`` of in-distribution validation images (float64)."""
    scores = -check_scores(id_validation_kappa, name="id_validation_kappa").double()
    if scores.numel() < 2:
        raise ValueError(f"energy standardisation needs at least 2 ID validation scores, got {scores.numel()}")
    return float(scores.mean()), float(scores.std()) + STD_EPSILON


def standardised_energy(kappa: Tensor, mean: float, scale: float) -> Tensor:
    """``(-κ - μ) / scale`` with ``(μ, scale)`` from :func:`energy_standardisation`.

    A NaN κ gives a NaN energy, which the samplers count and reject as a proposal (the authors' acceptance
    rule ``exp(-(E' - E)/T) >= U`` is false for NaN); an infinite κ is refused at once (the first batch of a
    search), since no standardisation holds it and it would win every comparison.
    """
    infinite = torch.isinf(kappa)
    if infinite.any():
        bad = torch.nonzero(infinite).flatten()[:5].tolist()
        raise ValueError(f"the detector returned infinite scores (samples {bad} of {kappa.numel()}): "
                         "an energy cannot be standardised from them")
    return (-kappa - mean) / scale
