"""Closed-form confidence intervals: DeLong's AUROC variance and the intervals built on it, Wilson's.

**DeLong** (DeLong, DeLong, Clarke-Pearson, *Biometrics* 1988; Sun & Xu's O(N log N) form, *IEEE SPL*
2014). With the pairwise kernel ψ(s, t) = 1(s > t) + ½ 1(s = t) (ties ½, as :func:`metrics.auroc`)::

    V10_i = (1/N_ood) Σ_j ψ(s_i, t_j)      (ID sample i: OOD below it, ties ½)
    V01_j = (1/N_id)  Σ_i ψ(s_i, t_j)      (OOD sample j: ID above it, ties ½)
    AUROC = mean_i V10_i = mean_j V01_j
    Var   = S10 / N_id + S01 / N_ood,   S10, S01 the sample variances (N - 1) of V10 and V01

computed from one ``torch.unique`` of the pooled scores, bincounts and cumulative sums. A side with a
single sample has no sample variance: its term is taken as 0 (documented, not refused), so the
interval then reflects the other side's uncertainty only. The Wald interval is AUROC ± z·√Var with
``z = Φ⁻¹((1 + level)/2)``, clipped to ``[0, 1]``.

The interval methods built on it: :func:`auroc_interval` (``auto``, ``logit``, ``newcombe``, ``delong``,
``bootstrap``), :func:`newcombe_interval` (Newcombe 2006) and :func:`wilson_interval` (Wilson 1927, the
interval of a proportion: EvG's MinRank, conditional on the search, and the accuracies). The default ``auto``:
the logit-transformed DeLong interval where enough samples overlap, Newcombe's score interval elsewhere; the
coverage of every interval is measured in ``benchmarks/interval_coverage.py`` (RESULTS.md). The percentile
bootstrap intervals are in :mod:`metrics.bootstrap_intervals`.

Every function works on the full (gathered) tensors it is given, so results are identical on one process
and under DDP.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
from torch import Tensor

from metrics._validation import check_level, check_score_pair
from metrics.auroc import bootstrap_auroc
from metrics.bootstrap_intervals import percentile_interval
from metrics.resampling import _cluster_inverse

METHODS = ("auto", "logit", "newcombe", "delong", "bootstrap")
# "auto": the logit DeLong interval needs this many samples of each side in a discordant or tied pair
AUTO_INVOLVED = 40


@dataclass(frozen=True)
class DeLongParts:
    """DeLong's estimate of one AUROC and what the interval methods need of it.

    Attributes:
        area: the AUROC (ties ½, ID positive).
        variance: DeLong's variance ``S10/N_id + S01/N_ood``, or with OOD clusters the ID term plus
            Obuchowski's (1997) clustered OOD term.
        num_id, num_ood: the sample sizes the score interval takes (``num_ood``: the number of OOD clusters
            when the OOD samples are clustered).
        involved_id, involved_ood: the ID samples with some OOD score at or above them (``V10 < 1``) and the
            OOD samples (clusters) with some ID score at or below them (``V01 < 1``): the samples that take
            part in a discordant or tied pair, on which the variance estimate rests.
    """

    area: float
    variance: float
    num_id: int
    num_ood: int
    involved_id: int
    involved_ood: int


def delong_parts(id_scores: Tensor, ood_scores: Tensor, *, ood_clusters: Tensor | None = None) -> DeLongParts:
    """DeLong's AUROC and variance from the structural components (ties ½), in O(N log N) (module docstring).

    With ``ood_clusters`` (the identity of the unit each OOD sample belongs to, e.g. the seed image of an EvG
    chain) the OOD term is Obuchowski's clustered variance (*Biometrics* 1997): with cluster totals
    ``T_c = Σ_{j ∈ c} V01_j`` of ``n_c`` samples, ``I`` clusters and ``N`` OOD samples,
    ``I / ((I - 1) N²) Σ_c (T_c - n_c·AUROC)²`` (``S01/N`` when every cluster holds one sample).

    Args:
        id_scores: ``(N_id,)``; ood_scores: ``(N_ood,)``; ood_clusters: ``(N_ood,)`` integer ids or None.
    """
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "DeLong")
    num_id, num_ood = id_scores.numel(), ood_scores.numel()
    _, inverse = torch.unique(torch.cat([id_scores, ood_scores]), sorted=True, return_inverse=True)
    num_values = int(inverse.max()) + 1
    id_count = torch.bincount(inverse[:num_id], minlength=num_values)
    ood_count = torch.bincount(inverse[num_id:], minlength=num_values)
    ood_below = torch.cumsum(ood_count, dim=0) - ood_count
    id_above = num_id - torch.cumsum(id_count, dim=0)
    # structural components per distinct value, from exact integer counts
    v10 = (2 * ood_below + ood_count).double() / (2.0 * num_ood)
    v01 = (2 * id_above + id_count).double() / (2.0 * num_id)
    twice_u = int((id_count * (2 * ood_below + ood_count)).sum())
    area = twice_u / (2.0 * num_id * num_ood)
    s10 = float((id_count * (v10 - area) ** 2).sum()) / (num_id - 1) if num_id > 1 else 0.0
    involved_id = int(id_count[(2 * ood_below + ood_count) < 2 * num_ood].sum())
    ood_v01 = v01[inverse[num_id:]]  # each OOD sample's component
    if ood_clusters is None:
        s01 = float((ood_count * (v01 - area) ** 2).sum()) / (num_ood - 1) if num_ood > 1 else 0.0
        return DeLongParts(area, s10 / num_id + s01 / num_ood, num_id, num_ood, involved_id,
                           int((ood_v01 < 1).sum()))
    ids, num_clusters = _cluster_inverse(ood_clusters, num_ood)
    ids = ids.to(ood_v01.device)
    totals = torch.zeros(num_clusters, dtype=torch.float64, device=ood_v01.device).index_add_(0, ids, ood_v01)
    sizes = torch.bincount(ids, minlength=num_clusters).double()
    ood_term = (num_clusters / ((num_clusters - 1) * num_ood ** 2) * float(((totals - sizes * area) ** 2).sum())
                if num_clusters > 1 else 0.0)
    involved_clusters = int((torch.zeros(num_clusters, dtype=torch.int64, device=ids.device)
                             .index_add_(0, ids, (ood_v01 < 1).long()) > 0).sum())
    return DeLongParts(area, s10 / num_id + ood_term, num_id, num_clusters, involved_id, involved_clusters)


def delong(id_scores: Tensor, ood_scores: Tensor) -> tuple[float, float]:
    """AUROC and its DeLong variance from the structural components (ties ½), in O(N log N).

    Args:
        id_scores: ``(N_id,)`` confidence of ID samples (higher = more in-distribution, ID positive).
        ood_scores: ``(N_ood,)`` confidence of OOD samples.

    Returns:
        ``(auroc, variance)`` with ``variance = S10/N_id + S01/N_ood`` (module docstring); the term of a
        side with one sample is 0. Computed on the full tensors given (identical under DDP once gathered).
    """
    parts = delong_parts(id_scores, ood_scores)
    return parts.area, parts.variance


def _z(level: float) -> float:
    return statistics.NormalDist().inv_cdf((1.0 + level) / 2.0)


def newcombe_variance(theta: float, num_id: int, num_ood: int) -> float:
    """Hanley & McNeil's (1982) AUROC variance with both sample sizes minus one replaced by ``N* - 1``,
    ``N* = (N_id + N_ood)/2`` (Newcombe 2006, Part 2)::

        Var(θ) = θ(1 - θ) [(2N* - 1) - (3N* - 3) / ((2 - θ)(1 + θ))] / (N_id N_ood)
    """
    half = (num_id + num_ood) / 2.0
    return theta * (1.0 - theta) * ((2 * half - 1) - (3 * half - 3) / ((2 - theta) * (1 + theta))) / (num_id * num_ood)


def newcombe_interval(area: float, num_id: int, num_ood: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's (*Stat. Med.* 2006, Part 2, Method 5) score interval of an AUROC: the θ with
    ``(AUROC - θ)² <= z² Var(θ)`` for :func:`newcombe_variance` (the variance at the hypothesised θ, not at
    the estimate, as Wilson's interval of a proportion), found by bisection to 1e-12 on each side. It never
    has zero width from a finite sample: a perfectly separated sample (AUROC 1) gets ``[low, 1]`` with
    ``low < 1``."""
    level = check_level(level)
    z2 = _z(level) ** 2

    def outside(theta: float) -> bool:
        return (area - theta) ** 2 > z2 * newcombe_variance(theta, num_id, num_ood)

    bounds = []
    for start, end in ((0.0, area), (1.0, area)):  # from the outside end towards the estimate
        if not outside(start):
            bounds.append(start)
            continue
        out, inside = start, end
        while abs(inside - out) > 1e-12:
            middle = (out + inside) / 2
            if outside(middle):
                out = middle
            else:
                inside = middle
        bounds.append(inside)
    return bounds[0], bounds[1]


def _logit_interval(parts: DeLongParts, level: float) -> tuple[float, float]:
    """logit(AUROC) ± z·√Var / (AUROC (1 - AUROC)), back-transformed (Pepe 2003, §5.2.3)."""
    area = parts.area
    centre = math.log(area / (1.0 - area))
    half = _z(level) * math.sqrt(parts.variance) / (area * (1.0 - area))
    return 1.0 / (1.0 + math.exp(-(centre - half))), 1.0 / (1.0 + math.exp(-(centre + half)))


def _interval_of(parts: DeLongParts, level: float, method: str) -> tuple[float, float]:
    """The interval of one :class:`DeLongParts` by ``method`` (``auto``, ``logit``, ``newcombe``, ``delong``)."""
    area, variance = parts.area, max(parts.variance, 0.0)
    if method == "delong":
        half = _z(level) * math.sqrt(variance)
        return max(0.0, area - half), min(1.0, area + half)
    regular = 0.0 < area < 1.0 and variance > 0.0
    if method == "logit" and regular:
        return _logit_interval(parts, level)
    if method == "auto" and regular and min(parts.involved_id, parts.involved_ood) >= AUTO_INVOLVED:
        return _logit_interval(parts, level)
    return newcombe_interval(area, parts.num_id, parts.num_ood, level)


def auroc_interval(
    id_scores: Tensor,
    ood_scores: Tensor,
    level: float = 0.95,
    method: str = "auto",
    *,
    resamples: int = 1000,
    seed: int = 0,
    ood_clusters: Tensor | None = None,
) -> tuple[float, float]:
    """Confidence interval of the AUROC (DESIGN.md §4), ID positive, ties ½.

    Methods (their coverage is measured in ``benchmarks/interval_coverage.py``, RESULTS.md):

    - ``"auto"`` (the default): the logit-transformed DeLong interval where DeLong's variance rests on at
      least ``AUTO_INVOLVED`` (40) samples of each side that take part in a discordant or tied pair
      (:attr:`DeLongParts.involved_id` / ``involved_ood``), else Newcombe's score interval. The logit
      interval holds its coverage wherever the variance estimate is sound (it adapts to the score
      distributions), but a variance estimated from a few overlapping samples is too small exactly when
      the AUROC is overestimated, and it is 0 at perfect separation; there the score interval, whose
      variance is taken at the hypothesised value (Hanley–McNeil's model), keeps the coverage and never has
      zero width. Perme & Manevski (*SMMR* 2018) reach the same pairing: DeLong's variance on the logit
      scale, with a correction where the samples separate.
    - ``"logit"``: the logit-transformed DeLong interval alone (Pepe 2003); Newcombe's where the AUROC is 0
      or 1 or the variance 0.
    - ``"newcombe"``: Newcombe's (2006) score interval alone (:func:`newcombe_interval`).
    - ``"delong"``: the Wald interval AUROC ± z·√Var(DeLong), z = Φ⁻¹((1 + level)/2), clipped to [0, 1]
      (under-covers at small n and near 1; ``[1, 1]`` at perfect separation).
    - ``"bootstrap"``: the percentile interval of :func:`metrics.auroc.bootstrap_auroc` (``resamples`` rows, ``seed``);
      resampling units: ID and OOD samples, stratified (resampled separately).

    Args:
        ood_clusters: ``(N_ood,)`` integer id of the unit each OOD sample belongs to (e.g. the seed image of
            an EvG chain): DeLong's OOD term becomes Obuchowski's clustered one and the score interval counts
            clusters (:func:`delong_parts`); ``"bootstrap"`` resamples the clusters.

    Raises:
        ValueError: ``level`` outside (0, 1), an unknown ``method``, an empty side or non-finite scores.
    """
    level = check_level(level)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "bootstrap":
        return percentile_interval(bootstrap_auroc(id_scores, ood_scores, resamples, seed, ood_clusters=ood_clusters),
                                   level)
    return _interval_of(delong_parts(id_scores, ood_scores, ood_clusters=ood_clusters), level, method)


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's (1927) score interval of a binomial proportion ``successes / trials``::

        (p̂ + z²/2n ± z √(p̂(1 - p̂)/n + z²/4n²)) / (1 + z²/n)

    Never of zero width: 0 of n gives ``[0, z²/(n + z²)]``."""
    level = check_level(level)
    if isinstance(trials, bool) or int(trials) != trials or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if int(successes) != successes or not 0 <= successes <= trials:
        raise ValueError(f"successes must be an integer in [0, {trials}], got {successes!r}")
    z, n = _z(level), float(trials)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


__all__ = [
    "DeLongParts",
    "auroc_interval",
    "delong",
    "delong_parts",
    "newcombe_interval",
    "newcombe_variance",
    "wilson_interval",
]
