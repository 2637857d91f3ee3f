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
outlier. :func:`weighted_min_rank` is MinRank of every row of resampling weights (:mod:`metrics.resampling`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metrics._validation import check_score_pair, check_scores
from metrics.resampling import _check_resamples, _check_weight_pair, _chunk_rows, _Side

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


# --------------------------------------------------------------------------------------------------
# weighted, and the bootstrap


def weighted_min_rank(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
    """MinRank of every weighted resample: ``Σ_i w_bi 1(s_i > max{t_j : v_bj > 0})`` (cf. :func:`metrics.min_rank`).

    Returns:
        ``(B,)`` with the dtype of ``id_weights`` summed (int64 for integer weights); a row without OOD
        weight counts every ID sample with weight (no outlier to beat).
    """
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "weighted MinRank")
    id_weights, ood_weights = _check_weight_pair(id_scores, ood_scores, id_weights, ood_weights)
    return _min_rank_rows(id_scores, ood_scores, id_weights, ood_weights)


def _min_rank_rows(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
    low = torch.tensor(-math.inf, dtype=ood_scores.dtype, device=ood_scores.device)
    worst = torch.where(ood_weights > 0, ood_scores[None, :], low).max(dim=1).values
    above = id_scores[None, :] > worst[:, None]
    accumulate = torch.float64 if id_weights.is_floating_point() else torch.int64
    return (id_weights * above).sum(dim=1, dtype=accumulate)


def bootstrap_min_rank(id_scores: Tensor, chain_scores: Tensor, resamples: int = 1000, seed: int = 0) -> Tensor:
    """MinRank of ``resamples`` bootstrap resamples of the ID images (stratum 0) and the EvG chains (stratum 1).

    Resampling units: the ID images, and the chains (one worst-case outlier per chain). The same weights as
    :func:`metrics.bootstrap_auroc` of the same inputs. Not an interval for MinRank: MinRank is a maximum over the
    chains, and the bootstrap of a maximum is inconsistent (Bickel & Freedman 1981; its percentile interval
    covers E[MinRank] in about 60% of repetitions, ``benchmarks/interval_coverage.py``). The EvG report's
    interval is conditional on the search instead (:func:`metrics.wilson_interval`); this function stays for that
    comparison.

    Returns:
        ``(resamples,)`` int64.
    """
    _check_resamples(resamples, seed, 0)
    id_scores, chain_scores = check_score_pair(id_scores, chain_scores, "bootstrap MinRank")
    step = _chunk_rows(id_scores.numel() + chain_scores.numel())
    id_side, chain_side = _Side(id_scores.numel(), seed, 0), _Side(chain_scores.numel(), seed, 1)
    parts = []
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        w_id, w_ood = id_side.weights(rows, id_scores.device), chain_side.weights(rows, id_scores.device)
        parts.append(_min_rank_rows(id_scores, chain_scores, w_id, w_ood))
    return torch.cat(parts)
