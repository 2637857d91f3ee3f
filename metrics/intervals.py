"""Confidence intervals for every scalar the framework reports: DeLong and the vectorised bootstrap.

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
``bootstrap``), :func:`newcombe_interval` (Newcombe 2006) and :func:`wilson_interval` (Wilson 1927).

**Bootstrap.** A resample is a row of integer weights, ``w_b[i]`` = how often sample ``i`` was drawn
(multinomial counts: ``n`` draws with replacement from ``n`` units, each row sums to ``n``). Every metric is
then computed for all rows over *one* sort of the scores: weighted cumulative sums instead of ``B`` copies
of the data. The weights are multinomial, not Poisson(1): drawing ``n`` uniform integers with numpy's PCG64
(Lemire's unbiased bounded integers) and counting them is cheaper than one Poisson(1) draw per sample
(``benchmarks/intervals_benchmark.py``), the rows have the exact bootstrap's fixed size, and the result
equals the textbook bootstrap on the expanded resample exactly.

The rows of a stratum come in blocks of ``BLOCK_ROWS`` (16): block ``k`` has its own generator, seeded
with ``SeedSequence((seed, stratum, k))``, and row ``b`` is the ``(b mod 16)``-th run of ``n`` draws of the
generator of block ``b // 16``. The weights therefore depend only on ``(seed, stratum, n, b)``: not on the
chunking (how many rows are drawn or counted at a time: numpy's bounded integers read the generator's
stream in order, so one call for ``k`` rows equals ``k`` calls of one row), the device, the number of
threads, nor on ``B`` (the first 100 rows of ``B = 1000`` are the rows of ``B = 100``; the last block is
simply cut). Blocks are independent, so the CPU bootstrap of the AUROC spreads them over threads. Two
detectors scored on the same images with the same seed get the *same* resamples, which is what
:func:`paired_difference` and :func:`probability_first` need. Strata default to ID = 0, OOD = 1 (knowns 0,
negatives 1, unknowns 2 for the open-set metrics), so the two sides are resampled independently (stratified
bootstrap: the numbers of ID and OOD samples are fixed by the test design, not random).

Resampling units (what one draw picks), each keyed by its identity so that a unit has one weight in every row
and level of a resample (the condition of a paired comparison, :func:`metrics.worse_than_best`):

- AUROC, CCR@FPR, γ, ECE / accuracy: the test samples (by their index in the set), stratified by ID / OOD
  (knowns / negatives / unknowns), because the samples are drawn independently within each group.
- AUROC per severity level (Galil et al.): the pool's OOD *classes* (by their index in the pool:
  :func:`cluster_weights` with ``num_units``, one draw for every level) and the ID images, because a level is a
  draw of classes and images of one class are not independent.
- Worst-case AUROC of EvG (Yoon et al.): the seed images (chains that share one are one unit) and the ID
  images. MinRank is a maximum over the chains, whose bootstrap is invalid (Bickel & Freedman 1981): its
  interval is conditional on the search (:func:`wilson_interval` of the count of ID images above the fixed
  worst case).

The AUROC's own interval (:func:`auroc_interval`, default ``auto``): the logit-transformed DeLong interval where
enough samples overlap, Newcombe's score interval elsewhere; its coverage, and that of every other interval, is
measured in ``benchmarks/interval_coverage.py``.

Every function works on the full (gathered) tensors it is given, with deterministic weights, so results
are identical on one process and under DDP (gather the scores first, e.g. ``IndexedPredictions``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from metrics._validation import check_probs_and_target, check_scores
from metrics.open_set import GROUPS, fpr_key
from metrics.oscr import AUTHORS_RELATIVE_TOLERANCE, DEFAULT_FPR_TARGETS

METHODS = ("auto", "logit", "newcombe", "delong", "bootstrap")
# "auto": the logit DeLong interval needs this many samples of each side in a discordant or tied pair
AUTO_INVOLVED = 40
# Elements per (chunk, n) work array: chunks of rows keep memory at a few hundred MB at N = 1e6.
CHUNK_ELEMENTS = 1 << 23
# Resamples per generator: row b of a stratum is drawn by the generator seeded (seed, stratum, b // BLOCK_ROWS).
BLOCK_ROWS = 16
# Draws counted in one batch (rows of small n together; at large n one row at a time keeps it in cache).
BATCH_DRAWS = 1 << 16
# Scores (N_id + N_ood) from which the CPU bootstrap of the AUROC spreads its blocks over threads.
PARALLEL_SIZE = 1 << 17
INT32_LIMIT = (1 << 31) - 1
# Samples of the lowest scores searched first for a resample's lowest present score (open-set bootstrap).
HEAD_SAMPLES = 64
INT64_LIMIT = (1 << 63) - 1


# --------------------------------------------------------------------------------------------------
# checks


def _check_level(level: float) -> float:
    level = float(level)
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    return level


def _check_resamples(resamples: int, seed: int, stratum: int) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    for name, value in (("seed", seed), ("stratum", stratum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _pair(id_scores: Tensor, ood_scores: Tensor, what: str) -> tuple[Tensor, Tensor]:
    id_scores = check_scores(id_scores, name="id_scores")
    ood_scores = check_scores(ood_scores, name="ood_scores").to(id_scores.device)
    if id_scores.numel() == 0 or ood_scores.numel() == 0:
        raise ValueError(f"{what} needs both ID and OOD scores, got {id_scores.numel()} ID and "
                         f"{ood_scores.numel()} OOD")
    dtype = torch.promote_types(id_scores.dtype, ood_scores.dtype)
    return id_scores.to(dtype), ood_scores.to(dtype)


def _check_weights(weights: Tensor, n: int, *, name: str, device: torch.device) -> Tensor:
    weights = torch.as_tensor(weights, device=device)
    if weights.ndim != 2 or weights.shape[1] != n:
        raise ValueError(f"{name} must have shape (B, {n}), got {tuple(weights.shape)}")
    if weights.is_floating_point():
        if not bool(torch.isfinite(weights).all()):
            raise ValueError(f"{name} holds NaN or infinite weights")
    if weights.numel() and float(weights.min()) < 0:
        raise ValueError(f"{name} holds negative weights (min {float(weights.min())})")
    return weights


def _check_weight_pair(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor,
                       ood_weights: Tensor) -> tuple[Tensor, Tensor]:
    """Both sides' weights checked (one column per score, non-negative) and with one row per resample each."""
    id_weights = _check_weights(id_weights, id_scores.numel(), name="id_weights", device=id_scores.device)
    ood_weights = _check_weights(ood_weights, ood_scores.numel(), name="ood_weights", device=id_scores.device)
    if id_weights.shape[0] != ood_weights.shape[0]:
        raise ValueError(f"id_weights and ood_weights must have the same number of rows, got "
                         f"{id_weights.shape[0]} and {ood_weights.shape[0]}")
    return id_weights, ood_weights


def _chunk_rows(n: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(n, 1))


# --------------------------------------------------------------------------------------------------
# DeLong and the AUROC intervals


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
    id_scores, ood_scores = _pair(id_scores, ood_scores, "DeLong")
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
    level = _check_level(level)
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
    - ``"bootstrap"``: the percentile interval of :func:`bootstrap_auroc` (``resamples`` rows, ``seed``);
      resampling units: ID and OOD samples, stratified (resampled separately).

    Args:
        ood_clusters: ``(N_ood,)`` integer id of the unit each OOD sample belongs to (e.g. the seed image of
            an EvG chain): DeLong's OOD term becomes Obuchowski's clustered one and the score interval counts
            clusters (:func:`delong_parts`); ``"bootstrap"`` resamples the clusters.

    Raises:
        ValueError: ``level`` outside (0, 1), an unknown ``method``, an empty side or non-finite scores.
    """
    level = _check_level(level)
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
    level = _check_level(level)
    if isinstance(trials, bool) or int(trials) != trials or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if int(successes) != successes or not 0 <= successes <= trials:
        raise ValueError(f"successes must be an integer in [0, {trials}], got {successes!r}")
    z, n = _z(level), float(trials)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------------------------------
# resampling weights


def _block_generator(seed: int, stratum: int, block: int) -> np.random.Generator:
    """The generator of rows ``block * BLOCK_ROWS ... (block + 1) * BLOCK_ROWS - 1`` of a stratum."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence((seed, stratum, block))))


class _RowStream:
    """The bootstrap draws of one stratum, row after row (module docstring).

    Row ``b`` is the ``(b % BLOCK_ROWS)``-th run of ``n`` draws ``integers(0, n)`` of the block generator
    ``b // BLOCK_ROWS``. numpy's bounded integers consume the generator's stream in order, so one call for
    ``k`` rows gives the same rows as ``k`` calls of one row: rows are drawn in batches of at most
    ``BATCH_DRAWS`` draws (small ``n``) or one by one (large ``n``, where a row's counts stay in cache),
    with the same values, and a row does not depend on how many rows are asked for at a time, nor on ``B``.
    """

    def __init__(self, n: int, seed: int, stratum: int, start: int = 0) -> None:
        self.n, self.seed, self.stratum = n, seed, stratum
        self.row = start - start % BLOCK_ROWS
        self.generator: np.random.Generator | None = None
        self.dtype = np.int32 if n * BLOCK_ROWS <= INT32_LIMIT else np.int64
        if start > self.row:  # a start inside a block: its first rows are drawn and dropped
            self.draws(start - self.row)

    def draws(self, rows: int) -> np.ndarray:
        """``(rows, n)`` draws of the next ``rows`` rows: int32 (the same values, half the memory) while
        ``n * BLOCK_ROWS`` fits, else int64."""
        parts = []
        while rows > 0:
            position = self.row % BLOCK_ROWS
            if position == 0:
                self.generator = _block_generator(self.seed, self.stratum, self.row // BLOCK_ROWS)
            take = min(rows, BLOCK_ROWS - position)
            parts.append(self.generator.integers(0, self.n, (take, self.n), dtype=self.dtype))
            self.row += take
            rows -= take
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def batch(self) -> int:
        """Rows whose draws are counted together: one when a row alone is large."""
        return max(1, min(BLOCK_ROWS, BATCH_DRAWS // self.n))

    def counts(self, rows: int, out: np.ndarray | None = None) -> np.ndarray:
        """``(rows, n)`` multinomial counts of the next ``rows`` rows (each row sums to ``n``): int32, or into
        ``out`` when given (a C-contiguous int32 or uint8 buffer of at least ``rows`` rows, reused across
        chunks). uint8 counts are checked (a row sums to ``n`` exactly when no count wrapped past 255);
        should one wrap, the rows are returned in a fresh int32 array instead, counted again from the draws."""
        n = self.n
        out = np.empty((rows, n), dtype=np.int32) if out is None else out[:rows]
        out.fill(0)
        step = self.batch()
        for start in range(0, rows, step):
            take = min(step, rows - start)
            draws = self.draws(take)
            if take > 1:
                draws += np.arange(0, take * n, n, dtype=draws.dtype)[:, None]  # row r of the batch -> r * n + unit
            batch = out[start:start + take]
            ones = torch.ones(1, dtype=torch.uint8 if batch.dtype == np.uint8 else torch.int32).expand(take * n)
            torch.from_numpy(batch).view(-1).index_add_(0, torch.from_numpy(draws).view(-1), ones)
            if out.dtype == np.uint8 and n > 255 and bool((batch.sum(axis=1, dtype=np.int64) != n).any()):
                out = out.astype(np.int32)  # the rows so far are exact; this batch is counted again
                out[start:start + take] = np.bincount(draws.ravel(), minlength=take * n).reshape(take, n)
        return out

def _weight_rows(n: int, rows: int, seed: int, stratum: int) -> Tensor:
    """Multinomial counts of rows ``0 .. rows - 1`` of a stratum: ``(rows, n)`` int32."""
    return torch.from_numpy(_RowStream(n, seed, stratum).counts(rows))


def resample_weights(n: int, resamples: int, seed: int, *, stratum: int = 0) -> Tensor:
    """Bootstrap resamples of ``n`` units as integer multinomial counts.

    Row ``b`` holds how often each of the ``n`` units was drawn in ``n`` draws with replacement (each row
    sums to ``n``). Row ``b`` depends only on ``(seed, stratum, n, b)`` (module docstring: it is drawn by
    the generator of block ``b // BLOCK_ROWS``), so detectors scored on the same samples with the same
    seed get the same resamples (paired comparisons), and the first rows of a larger ``B`` are the rows
    of a smaller one.

    Returns:
        ``(resamples, n)`` int32 on the CPU.
    """
    _check_resamples(resamples, seed, stratum)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return _weight_rows(n, resamples, seed, stratum)


def _cluster_inverse(clusters: Tensor | object, n: int | None = None,
                     num_units: int | None = None) -> tuple[Tensor, int]:
    """Each sample's unit and the number of units: by the sorted distinct ids (``num_units`` None), or the ids
    themselves, integers in ``[0, num_units)``, when the universe of units is given (keyed by identity)."""
    clusters = torch.as_tensor(clusters)
    if clusters.ndim != 1 or clusters.numel() == 0:
        raise ValueError(f"clusters must be a non-empty (N,) tensor of cluster ids, got shape {tuple(clusters.shape)}")
    if n is not None and clusters.numel() != n:
        raise ValueError(f"clusters must have one id per sample ({n}), got {clusters.numel()}")
    if clusters.is_floating_point() and not bool(torch.isfinite(clusters).all()):
        raise ValueError("clusters holds NaN or infinite ids")
    if num_units is None:
        _, inverse = torch.unique(clusters.cpu(), sorted=True, return_inverse=True)
        return inverse, int(inverse.max()) + 1
    if isinstance(num_units, bool) or not isinstance(num_units, int) or num_units < 1:
        raise ValueError(f"num_units must be a positive integer, got {num_units!r}")
    if clusters.is_floating_point() or clusters.dtype == torch.bool:
        raise ValueError(f"keyed units must be integer ids, got {clusters.dtype}")
    low, high = int(clusters.min()), int(clusters.max())
    if low < 0 or high >= num_units:
        raise ValueError(f"unit ids must lie in [0, {num_units}) (num_units), got ids from {low} to {high}")
    return clusters.cpu().long(), num_units


def cluster_weights(clusters: Tensor, resamples: int, seed: int, *, stratum: int = 0,
                    num_units: int | None = None) -> Tensor:
    """Cluster bootstrap: units (clusters) are resampled with replacement; each sample gets its unit's count
    (e.g. OOD classes, whose images are not independent draws; EvG chains that share a seed image).

    Args:
        clusters: ``(N,)`` unit id of every sample.
        num_units: the universe of units, ``0 .. num_units - 1``: the weights are **keyed by identity**, row
            ``b`` being ``resample_weights(num_units, ...)[b]`` read at each sample's id, so unit ``u`` gets the
            same weight in every call with the same ``(num_units, seed, stratum)``, whichever of the units a
            call holds (two severity levels sharing a class, two detectors' levels built of other classes of
            one pool). A call's units may then all draw 0 in a row (its statistic is then undefined there:
            NaN for the AUROC). ``None``: the units are the sorted distinct ids of this call (``C`` draws from
            its ``C`` units; positions, not identities, so two calls pair only when they hold the same ids).

    Returns:
        ``(resamples, N)`` int32 counts.
    """
    inverse, num_clusters = _cluster_inverse(clusters, num_units=num_units)
    return resample_weights(num_clusters, resamples, seed, stratum=stratum)[:, inverse]


class _Side:
    """The resampling weights of one side (stratum), chunk after chunk: units, or clusters of samples."""

    def __init__(self, n: int, seed: int, stratum: int, clusters: tuple[Tensor, int] | None = None,
                 start: int = 0) -> None:
        self.n = n
        self.inverse = None if clusters is None else clusters[0].numpy()
        self.stream = _RowStream(n if clusters is None else clusters[1], seed, stratum, start)

    def counts(self, rows: int, out: np.ndarray | None = None) -> np.ndarray:
        """``(rows, N)`` int32 counts of the next ``rows`` resamples (a cluster's count on each of its
        samples), into ``out`` (a ``(≥ rows, N)`` int32 buffer) when given."""
        if self.inverse is None:
            return self.stream.counts(rows, out)
        counts = self.stream.counts(rows)
        if out is None or out.dtype != counts.dtype:
            return counts[:, self.inverse]
        return np.take(counts, self.inverse, axis=1, out=out[:rows])

    def weights(self, rows: int, device: torch.device) -> Tensor:
        return torch.from_numpy(self.counts(rows)).to(device)


# --------------------------------------------------------------------------------------------------
# weighted AUROC


class _AUROCPlan:
    """What every resample shares: the OOD sort and each ID sample's place in it.

    Integer weights on the CPU (the bootstrap counts) are processed row by row in numpy, in int64: the
    row's OOD counts in sorted order, their cumulative sum ``C`` (a few MB, in cache), then
    ``2 Σ_i w_i C(< s_i)`` over the ID samples in the order of ``C(< s_i)`` (a sequential read of ``C``),
    plus the ties. Single-threaded numpy keeps clear of the thread contention that torch's parallel
    kernels meet on a shared CPU. Real weights, and tensors on an accelerator, take the batched torch path.
    """

    def __init__(self, id_scores: Tensor, ood_scores: Tensor) -> None:
        ood_sorted, self.ood_order = torch.sort(ood_scores)
        id_sorted, id_order = torch.sort(id_scores)  # sorted queries: cache-friendly searches, lo ascending
        lo_sorted = torch.searchsorted(ood_sorted, id_sorted, right=False)  # OOD strictly below s_i
        hi_sorted = torch.searchsorted(ood_sorted, id_sorted, right=True)  # OOD at or below s_i
        self.lo = torch.empty_like(lo_sorted).scatter_(0, id_order, lo_sorted)  # in the ID samples' order
        hi = torch.empty_like(hi_sorted).scatter_(0, id_order, hi_sorted)
        self.tied = (hi != self.lo).nonzero().squeeze(1)  # ID samples that tie with some OOD score
        self.tied_lo, self.tied_hi = self.lo[self.tied], hi[self.tied]
        self.num_id, self.num_ood = id_scores.numel(), ood_scores.numel()
        self.cpu = id_scores.device.type == "cpu"
        if self.cpu:
            # int32 indices where they fit: half the memory traffic of index_select
            index = torch.int32 if max(self.num_id, self.num_ood) < INT32_LIMIT else torch.int64
            self.t_ood_order, self.t_lo_sorted, self.t_id_order = (
                self.ood_order.to(index), lo_sorted.to(index), id_order.to(index))
            self.np_tied, self.np_tied_lo, self.np_tied_hi = (
                self.tied.numpy(), self.tied_lo.numpy(), self.tied_hi.numpy())

    def workspace(self, id_dtype: np.dtype, ood_dtype: np.dtype, narrow: bool = False) -> tuple:
        """Row buffers of :meth:`twice_u_counts` (one per thread; reused across rows). ``narrow``: the
        cumulative OOD counts and the products ``w_i C`` in int32 (less memory traffic; the caller checks
        that they fit)."""
        wide = np.int32 if narrow else np.int64
        return ((np.dtype(id_dtype), np.dtype(ood_dtype), narrow), np.empty(self.num_ood, dtype=ood_dtype),
                np.zeros(self.num_ood + 1, dtype=wide), np.empty(self.num_id, dtype=wide),
                np.empty(self.num_id, dtype=id_dtype), np.empty(self.num_id, dtype=wide))

    def twice_u_counts(self, id_counts: np.ndarray, ood_counts: np.ndarray, workspace: tuple | None = None,
                       ood_totals: np.ndarray | None = None) -> np.ndarray:
        """``twice_u`` of integer ``(rows, N_id)`` / ``(rows, N_ood)`` numpy counts, exact in int64 (the
        caller checks ``2 Σw Σv < 2**63``): int32 cumulative sums and products where they fit (uint8 ID
        counts and at most ``(2**31 - 1) / 255`` OOD draws), accumulated in int64."""
        if ood_totals is None:
            ood_totals = ood_counts.sum(axis=1, dtype=np.int64)
        narrow = (id_counts.dtype == np.uint8 and ood_counts.shape[0] > 0
                  and int(ood_totals.max()) * 255 <= INT32_LIMIT)
        if workspace is None or workspace[0] != (id_counts.dtype, ood_counts.dtype, narrow):
            workspace = self.workspace(id_counts.dtype, ood_counts.dtype, narrow)
        _, ordered, cumulative, below, weight, product = workspace
        # torch views of the numpy buffers: torch's index_select with int32 indices is the fastest gather
        t_ordered, t_cumulative, t_below, t_weight = (torch.from_numpy(a) for a in (ordered, cumulative, below, weight))
        out = np.empty(id_counts.shape[0], dtype=np.int64)
        for row in range(id_counts.shape[0]):
            torch.index_select(torch.from_numpy(ood_counts[row]), 0, self.t_ood_order, out=t_ordered)
            np.cumsum(ordered, dtype=cumulative.dtype, out=cumulative[1:])  # C(< position), cumulative[0] = 0
            torch.index_select(t_cumulative, 0, self.t_lo_sorted, out=t_below)  # C(< s_i), ID in the order of lo
            torch.index_select(torch.from_numpy(id_counts[row]), 0, self.t_id_order, out=t_weight)
            twice = 2 * int(np.multiply(below, weight, out=product).sum(dtype=np.int64))
            if self.np_tied.size:
                equal = cumulative.take(self.np_tied_hi).astype(np.int64) - cumulative.take(self.np_tied_lo)
                twice += int(np.dot(equal, id_counts[row].take(self.np_tied).astype(np.int64)))
            out[row] = twice
        return out

    def twice_u(self, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
        """Twice the weighted Mann–Whitney U of each row: Σ_i w_i (C(< s_i) + C(≤ s_i)), C = OOD weight."""
        rows = id_weights.shape[0]
        integer = not (id_weights.is_floating_point() or ood_weights.is_floating_point())
        if integer:
            total = int(ood_weights.sum(dim=1).max()) if rows else 0
            dtype = torch.int32 if total <= INT32_LIMIT else torch.int64
            # the products w_i * C stay exact in int32 when they cannot reach 2**31
            product_dtype = dtype if int(id_weights.max()) * max(total, 1) * 2 <= INT32_LIMIT else torch.int64
            accumulate = torch.int64
        else:
            dtype = product_dtype = accumulate = torch.float64
        ordered = ood_weights.to(dtype).index_select(1, self.ood_order)
        cumulative = torch.empty(rows, self.num_ood + 1, dtype=dtype, device=ordered.device)
        cumulative[:, 0] = 0
        torch.cumsum(ordered, dim=1, dtype=dtype, out=cumulative[:, 1:])
        below = cumulative.index_select(1, self.lo)
        w = id_weights.to(product_dtype)
        twice = 2 * (below.to(product_dtype) * w).sum(dim=1, dtype=accumulate)
        if self.tied.numel():
            equal = cumulative.index_select(1, self.tied_hi) - cumulative.index_select(1, self.tied_lo)
            twice += (equal.to(product_dtype) * w.index_select(1, self.tied)).sum(dim=1, dtype=accumulate)
        return twice

    def area_counts(self, id_counts: np.ndarray, ood_counts: np.ndarray, workspace: tuple | None = None,
                    totals: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """AUROC (float64) of integer numpy count rows; NaN for a row without weight on a side. ``totals``:
        the rows' sums ``(Σw, Σv)`` when the caller knows them."""
        if totals is None:
            totals = (id_counts.sum(axis=1, dtype=np.int64), ood_counts.sum(axis=1, dtype=np.int64))
        total_id, total_ood = totals
        twice = self.twice_u_counts(id_counts, ood_counts, workspace, total_ood).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return twice / (2.0 * total_id.astype(np.float64) * total_ood.astype(np.float64))

    def area(self, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
        integer = not (id_weights.is_floating_point() or ood_weights.is_floating_point()
                       or id_weights.dtype == torch.bool or ood_weights.dtype == torch.bool)
        if integer and self.cpu and id_weights.device.type == "cpu" and id_weights.shape[0] and (
                2 * int(id_weights.sum(dim=1, dtype=torch.int64).max())
                * int(ood_weights.sum(dim=1, dtype=torch.int64).max()) <= INT64_LIMIT):
            return torch.from_numpy(self.area_counts(id_weights.numpy(), ood_weights.numpy()))
        twice = self.twice_u(id_weights, ood_weights)
        total_id = id_weights.sum(dim=1, dtype=torch.float64 if id_weights.is_floating_point() else torch.int64)
        total_ood = ood_weights.sum(dim=1, dtype=torch.float64 if ood_weights.is_floating_point() else torch.int64)
        # NaN for a row without weight on a side (no AUROC defined)
        return twice.double() / (2.0 * total_id.double() * total_ood.double())


def weighted_auroc(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
    """AUROC of every weighted resample at once (ties ½, ID positive), over one sort of the OOD scores::

        AUROC_b = Σ_i Σ_j w_bi v_bj ψ(s_i, t_j) / (Σ_i w_bi Σ_j v_bj)

    With integer weights twice the numerator is computed exactly in integers (int64 rows in numpy on the
    CPU; on an accelerator int32 where it cannot overflow, accumulated in int64), so a row equals
    :func:`metrics.auroc` of the expanded resample. Rows are processed in chunks, so memory stays bounded
    whatever ``B``.

    Args:
        id_scores: ``(N_id,)``; ood_scores: ``(N_ood,)``.
        id_weights: ``(B, N_id)``; ood_weights: ``(B, N_ood)`` non-negative (counts, or any real weights).

    Returns:
        ``(B,)`` float64; NaN for a row whose ID or OOD weights are all zero.
    """
    id_scores, ood_scores = _pair(id_scores, ood_scores, "weighted AUROC")
    id_weights, ood_weights = _check_weight_pair(id_scores, ood_scores, id_weights, ood_weights)
    plan = _AUROCPlan(id_scores, ood_scores)
    step = _chunk_rows(id_scores.numel() + ood_scores.numel())
    parts = [plan.area(id_weights[start:start + step], ood_weights[start:start + step])
             for start in range(0, id_weights.shape[0], step)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64, device=id_scores.device)


def bootstrap_auroc(
    id_scores: Tensor,
    ood_scores: Tensor,
    resamples: int = 1000,
    seed: int = 0,
    *,
    ood_clusters: Tensor | None = None,
    id_clusters: Tensor | None = None,
) -> Tensor:
    """AUROC of ``resamples`` stratified bootstrap resamples (ID stratum 0, OOD stratum 1).

    Resampling units: the samples of each side; with ``ood_clusters`` (``id_clusters``) the clusters of
    that side instead (:func:`cluster_weights`; e.g. the OOD classes of a severity level). The weights are
    generated chunk by chunk, never all ``B x N`` at once: on the CPU one row at a time at large N, counted
    into a reused uint8 buffer and turned into its AUROC right away, with the blocks of rows
    (module docstring) spread over ``torch.get_num_threads()`` threads; the values do not depend on that.

    Returns:
        ``(resamples,)`` float64: row ``b`` equals ``weighted_auroc`` with row ``b`` of
        ``resample_weights(N_id, B, seed, stratum=0)`` / ``(N_ood, ..., stratum=1)`` (or the cluster weights).
    """
    _check_resamples(resamples, seed, 0)
    id_scores, ood_scores = _pair(id_scores, ood_scores, "bootstrap AUROC")
    id_units = None if id_clusters is None else _cluster_inverse(id_clusters, id_scores.numel())
    ood_units = None if ood_clusters is None else _cluster_inverse(ood_clusters, ood_scores.numel())
    plan = _AUROCPlan(id_scores, ood_scores)
    num_id, num_ood = id_scores.numel(), ood_scores.numel()
    # 2 Σw Σv bounds twice U; Σw = N without clusters, at most (clusters) x (largest cluster) with them
    bound = 2
    for units, size in ((id_units, num_id), (ood_units, num_ood)):
        bound *= size if units is None else units[1] * int(torch.bincount(units[0]).max())
    if plan.cpu and bound <= INT64_LIMIT:
        return torch.from_numpy(_bootstrap_auroc_cpu(plan, id_units, ood_units, resamples, seed))
    id_side, ood_side = _Side(num_id, seed, 0, id_units), _Side(num_ood, seed, 1, ood_units)
    step = _chunk_rows(num_id + num_ood)
    parts = []
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        parts.append(plan.area(id_side.weights(rows, id_scores.device), ood_side.weights(rows, id_scores.device)))
    return torch.cat(parts)


def _bootstrap_auroc_cpu(plan: _AUROCPlan, id_units: tuple[Tensor, int] | None,
                         ood_units: tuple[Tensor, int] | None, resamples: int, seed: int) -> np.ndarray:
    """The CPU bootstrap of the AUROC: blocks of rows (independent generators) spread over
    ``torch.get_num_threads()`` threads (numpy and torch release the GIL); each thread counts a few rows at
    a time (one at large N) into its own uint8 buffers and computes their AUROC in numpy. The values do not
    depend on the number of threads."""
    num_id, num_ood = plan.num_id, plan.num_ood
    areas = np.empty(resamples, dtype=np.float64)
    blocks = list(range(-(-resamples // BLOCK_ROWS)))
    large = num_id + num_ood >= PARALLEL_SIZE
    workers = max(1, min(torch.get_num_threads(), len(blocks))) if large else 1

    def work(mine: list[int]) -> None:
        step = min(_Side(num_id, seed, 0, id_units).stream.batch(), _Side(num_ood, seed, 1, ood_units).stream.batch())
        # uint8 counts (checked; int32 should one exceed 255): a row's counts stay in cache
        id_buffer = np.empty((step, num_id), dtype=np.uint8)
        ood_buffer = np.empty((step, num_ood), dtype=np.uint8)
        workspace = plan.workspace(np.uint8, np.uint8, narrow=num_ood * 255 <= INT32_LIMIT)
        # without clusters every row sums to N (the counts are checked); with clusters the sums vary
        full = (np.full(step, num_id, dtype=np.int64), np.full(step, num_ood, dtype=np.int64))
        for block in mine:
            first, last = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, resamples)
            id_side, ood_side = _Side(num_id, seed, 0, id_units, first), _Side(num_ood, seed, 1, ood_units, first)
            for start in range(first, last, step):
                rows = min(step, last - start)
                id_counts, ood_counts = id_side.counts(rows, id_buffer), ood_side.counts(rows, ood_buffer)
                totals = None if id_units is not None or ood_units is not None else (full[0][:rows], full[1][:rows])
                areas[start:start + rows] = plan.area_counts(id_counts, ood_counts, workspace, totals)

    if workers == 1:
        work(blocks)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, [blocks[k::workers] for k in range(workers)]))
    return areas


# --------------------------------------------------------------------------------------------------
# MinRank (EvG)


def weighted_min_rank(id_scores: Tensor, ood_scores: Tensor, id_weights: Tensor, ood_weights: Tensor) -> Tensor:
    """MinRank of every weighted resample: ``Σ_i w_bi 1(s_i > max{t_j : v_bj > 0})`` (cf. :func:`metrics.min_rank`).

    Returns:
        ``(B,)`` with the dtype of ``id_weights`` summed (int64 for integer weights); a row without OOD
        weight counts every ID sample with weight (no outlier to beat).
    """
    id_scores, ood_scores = _pair(id_scores, ood_scores, "weighted MinRank")
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
    :func:`bootstrap_auroc` of the same inputs. Not an interval for MinRank: MinRank is a maximum over the
    chains, and the bootstrap of a maximum is inconsistent (Bickel & Freedman 1981; its percentile interval
    covers E[MinRank] in about 60% of repetitions, ``benchmarks/interval_coverage.py``). The EvG report's
    interval is conditional on the search instead (:func:`wilson_interval`); this function stays for that
    comparison.

    Returns:
        ``(resamples,)`` int64.
    """
    _check_resamples(resamples, seed, 0)
    id_scores, chain_scores = _pair(id_scores, chain_scores, "bootstrap MinRank")
    step = _chunk_rows(id_scores.numel() + chain_scores.numel())
    id_side, chain_side = _Side(id_scores.numel(), seed, 0), _Side(chain_scores.numel(), seed, 1)
    parts = []
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        w_id, w_ood = id_side.weights(rows, id_scores.device), chain_side.weights(rows, id_scores.device)
        parts.append(_min_rank_rows(id_scores, chain_scores, w_id, w_ood))
    return torch.cat(parts)


# --------------------------------------------------------------------------------------------------
# open-set metrics (Palechor et al.)


class _OpenSetPlan:
    """The knowns' target scores and correctness, sorted once, shared by every group and resample."""

    def __init__(self, target_score: Tensor, correct: Tensor) -> None:
        self.target_score, self.correct = target_score, correct
        self.correct_index = correct.nonzero().squeeze(1)
        correct_sorted, order = torch.sort(target_score[correct])
        self.correct_sorted = correct_sorted
        self.correct_order = self.correct_index[order]  # ascending S_y of the correct knowns
        self._values: tuple[Tensor, Tensor] | None = None

    @property
    def values(self) -> Tensor:
        """The distinct target scores of the knowns, ascending (the authors' thresholds)."""
        return self._unique()[0]

    @property
    def value_of(self) -> Tensor:
        """Each known's index in :attr:`values`."""
        return self._unique()[1]

    def _unique(self) -> tuple[Tensor, Tensor]:
        if self._values is None:  # only the authors' convention needs them
            self._values = torch.unique(self.target_score, sorted=True, return_inverse=True)
        return self._values

    def correct_above(self, known_weights: Tensor, thresholds: Tensor) -> Tensor:
        """``(B', M)`` weight of correct knowns with ``S_y > θ`` for per-row thresholds ``(B', M)``."""
        ordered = known_weights.index_select(1, self.correct_order).long()
        cumulative = torch.nn.functional.pad(torch.cumsum(ordered, dim=1), (1, 0))
        at_or_below = torch.searchsorted(self.correct_sorted, thresholds.contiguous(), right=True)
        return cumulative[:, -1:] - cumulative.gather(1, at_or_below)


def _fitting_counts(total: int, targets: Sequence[float]) -> np.ndarray:
    """Per target ``t``: the largest count ``c`` with ``c / total <= t`` in float64 (the curve's FPR, a
    correctly rounded division, so monotone in ``c``: the counts that fit are ``0 .. c``)."""
    out = []
    for t in targets:
        c = min(total, max(0, math.floor(t * total)))
        while c < total and (c + 1) / total <= t:
            c += 1
        while c > 0 and c / total > t:
            c -= 1
        out.append(c)
    return np.asarray(out, dtype=np.int64)


class _ExactCCRPlan:
    """What every resample shares for the exact CCR@FPR of one group: the group's scores sorted once
    (descending), and for each place ``p`` of that order the number of correct knowns with ``S_y`` at or
    below the score there.

    For a resample, the exact CCR@FPR=t is the CCR at the lowest *present* threshold θ whose count of
    unknowns above it fits (``c / N_U <= t``). With ``C_p`` the unknowns' cumulative weight in descending
    order and ``p`` the first place where ``C_p`` no longer fits, θ is the score at ``p`` (it carries weight,
    so it is present; every lower threshold has the unknown at ``p`` above it); when every unknown fits, θ
    is the lowest present score of the knowns and the group (an absent score adds no curve point)."""

    def __init__(self, plan: _OpenSetPlan, scores: Tensor) -> None:
        self.num, self.scores = scores.numel(), scores
        self._authors: tuple[Tensor, Tensor] | None = None
        self.descending, self.order = torch.sort(scores, descending=True)
        self.at_or_below = torch.searchsorted(plan.correct_sorted, self.descending.to(plan.correct_sorted.dtype),
                                              right=True)

    def authors_search(self, plan: _OpenSetPlan) -> tuple[Tensor, Tensor]:
        """:func:`_authors_search` of the group, once (shared by every resample)."""
        if self._authors is None:
            self._authors = _authors_search(plan, self.scores)
        return self._authors

    def ccr(self, plan: _OpenSetPlan, w_known: Tensor, w_unknown: Tensor, targets: Tensor) -> Tensor:
        """``(B', M)`` exact CCR@FPR of weight rows, batched in torch (any device, any weights)."""
        rows = w_known.shape[0]
        cumulative = torch.cumsum(w_unknown.index_select(1, self.order).long(), dim=1)
        total_unknown = cumulative[:, -1:].double()
        fpr = cumulative.double() / total_unknown  # FPR once the first p+1 unknowns are above θ, as oscr_curve
        passing = torch.searchsorted(fpr, targets.expand(rows, -1).contiguous(), right=True)
        infinity = torch.tensor(math.inf, dtype=self.descending.dtype, device=self.descending.device)
        lowest = torch.minimum(torch.where(w_known > 0, plan.target_score[None, :], infinity).min(dim=1).values,
                               torch.where(w_unknown > 0, self.scores[None, :], infinity).min(dim=1).values)
        theta = torch.where(passing < self.num, self.descending[passing.clamp(max=self.num - 1)], lowest[:, None])
        total_known = w_known.sum(dim=1, dtype=torch.int64).double()[:, None]
        return plan.correct_above(w_known, theta).double() / total_known


def _authors_search(plan: _OpenSetPlan, unknown_score: Tensor) -> tuple[Tensor, Tensor]:
    """The group's ascending order and, per distinct known score, how many of its samples lie at or below."""
    unknown_sorted, order = torch.sort(unknown_score)
    return order, torch.searchsorted(unknown_sorted, plan.values.to(unknown_sorted.dtype), right=True)


def _authors_ccr(plan: _OpenSetPlan, unknown_score: Tensor, w_known: Tensor, w_unknown: Tensor,
                 targets: Tensor, exact: _ExactCCRPlan | None = None) -> Tensor:
    """CCR@FPR by the authors' table rule for every row, thresholds = present distinct known scores but the
    largest; the nearest FPR point (lowest threshold among ties), NaN ("—") when |FPR - t|/t >= 0.1."""
    rows, num_values = w_known.shape[0], plan.values.numel()
    present = torch.zeros(rows, num_values, dtype=torch.int64, device=w_known.device)
    present.index_add_(1, plan.value_of, w_known.long())
    present = present > 0
    # the largest present value is not a threshold
    last = num_values - 1 - present.flip(1).int().argmax(dim=1)
    present[torch.arange(rows, device=present.device), last] = False
    order, at_or_below = exact.authors_search(plan) if exact is not None else _authors_search(plan, unknown_score)
    cumulative = torch.nn.functional.pad(torch.cumsum(w_unknown.index_select(1, order).long(), dim=1), (1, 0))
    fpr = (cumulative[:, -1:] - cumulative.index_select(1, at_or_below)).double() / cumulative[:, -1:].double()
    distance = (fpr[:, None, :] - targets[None, :, None]).abs()  # (B', M, V)
    distance = torch.where(present[:, None, :], distance, math.inf)
    best = distance.argmin(dim=2)  # first minimum: the lowest threshold among equally near points
    nearest = distance.gather(2, best[:, :, None]).squeeze(2)
    ccr = plan.correct_above(w_known, plan.values[best]).double() / w_known.sum(dim=1, dtype=torch.int64).double()[:, None]
    return torch.where(nearest / targets[None, :] >= AUTHORS_RELATIVE_TOLERANCE, math.nan, ccr)


def _first_present(counts: np.ndarray, head: np.ndarray, scores: np.ndarray) -> np.generic:
    """The lowest score with weight in a count row. ``head``: the samples of the lowest scores, ascending;
    a sample is absent with probability about 1/e, so the first few of them almost always hold it (else
    a full masked minimum)."""
    present = np.flatnonzero(counts[head])
    if present.size:
        return scores[head[present[0]]]
    return scores[counts > 0].min()


def _gather_into(row: np.ndarray, index: Tensor, buffer: np.ndarray) -> np.ndarray:
    """``row[index]``: into ``buffer`` (torch's index_select, int32 indices) when the dtypes agree."""
    if row.dtype != buffer.dtype:
        return row[index.numpy()]
    torch.index_select(torch.from_numpy(row), 0, index, out=torch.from_numpy(buffer))
    return buffer


class _OpenSetCPU:
    """The CPU bootstrap of :func:`bootstrap_open_set` with integer counts: blocks of rows (the generators
    of :func:`bootstrap_auroc`, strata 0 / 1 / 2) spread over threads, each row counted into reused uint8
    buffers and turned into all its scalars in numpy, exact integer counts throughout:

    - closed-set accuracy and the correct knowns' cumulative weight ``K`` in ascending ``S_y`` (shared by
      the groups);
    - per group, exact convention: the unknowns' counts in descending score order, their cumulative sum,
      ``np.searchsorted`` of the largest fitting count of each target (:func:`_fitting_counts`; every row of
      a stratum sums to its size), and ``K_total - K[at_or_below]`` at that place (:class:`_ExactCCRPlan`);
      when every unknown fits, the lowest present score of the knowns and the group;
    - per group, the AUROC of :class:`_AUROCPlan` (the numpy row path of :func:`bootstrap_auroc`);
    - per group, authors' convention: the knowns' counts grouped by distinct target score (present
      thresholds by ``np.maximum.reduceat``), the FPR at each from the same cumulative unknown counts, and
      the first nearest present point per target, with the float64 operations of :func:`_authors_ccr`;
    - γ from float64 dot products.
    """

    def __init__(self, plan: _OpenSetPlan, exact: dict[str, _ExactCCRPlan], aurocs: dict[str, _AUROCPlan],
                 groups: dict[str, tuple[Tensor, int]], targets: Tensor, conventions: Sequence[str],
                 gamma_minus_values: Tensor | None, results: dict[str, np.ndarray]) -> None:
        self.plan, self.exact, self.aurocs, self.groups = plan, exact, aurocs, groups
        self.targets, self.conventions, self.results = targets, tuple(conventions), results
        self.num_known = plan.target_score.numel()
        self.fitting = {group: _fitting_counts(e.num, targets.tolist()) for group, e in exact.items()}
        index = torch.int32 if max([self.num_known] + [e.num for e in exact.values()]) < INT32_LIMIT else torch.int64
        self.correct_order = plan.correct_order.to(index)
        self.orders = {group: e.order.to(index) for group, e in exact.items()}
        self.at_or_below = {group: e.at_or_below.numpy() for group, e in exact.items()}
        # float64 copies for the numpy comparisons: exact and order-preserving for every float dtype
        self.correct_sorted = plan.correct_sorted.double().numpy()
        self.target_np = plan.target_score.double().numpy()
        # the knowns and each group's samples of the lowest scores, ascending (for the lowest present score)
        lowest = torch.topk(plan.target_score, min(HEAD_SAMPLES, self.num_known), largest=False, sorted=True)
        self.known_head = lowest.indices.numpy()
        self.heads = {group: e.order[-HEAD_SAMPLES:].flip(0).numpy() for group, e in exact.items()}
        self.group_scores = {group: scores.double().numpy() for group, (scores, _) in groups.items()}
        self.gamma_minus = None if gamma_minus_values is None else gamma_minus_values.numpy()
        self.wide = np.int32 if max([self.num_known] + [e.num for e in exact.values()]) <= INT32_LIMIT else np.int64
        self.targets_list = targets.tolist()
        self.exact_keys = {group: [f"{group}/{fpr_key(t, 'exact')}" for t in self.targets_list] for group in exact}
        self.authors = "authors" in self.conventions
        if self.authors:  # the knowns grouped by distinct target score, and each score's place in every group
            values, value_of = plan._unique()
            self.values = values.double().numpy()
            self.by_value = torch.argsort(value_of, stable=True).to(index)
            sizes = np.bincount(value_of.numpy(), minlength=values.numel())
            self.value_starts = np.r_[0, np.cumsum(sizes)[:-1]]
            # unknowns of the group above each value: its cumulative weight in descending order, at this place
            self.above_place = {group: e.num - e.authors_search(plan)[1].numpy() for group, e in exact.items()}
            self.authors_keys = {group: [f"{group}/{fpr_key(t, 'authors')}" for t in self.targets_list]
                                 for group in exact}

    def work(self, blocks: list[int], resamples: int, seed: int) -> None:
        plan, results, n_k = self.plan, self.results, self.num_known
        sizes = {group: e.num for group, e in self.exact.items()}
        step = min([_RowStream(n_k, seed, 0).batch()] + [_RowStream(m, seed, 0).batch() for m in sizes.values()])
        known_buffer = np.empty((step, n_k), dtype=np.uint8)
        group_buffers = {group: np.empty((step, m), dtype=np.uint8) for group, m in sizes.items()}
        ordered_correct = np.empty(plan.correct_order.numel(), dtype=np.uint8)
        cumulative_correct = np.zeros(plan.correct_order.numel() + 1, dtype=self.wide)
        ordered = {group: np.empty(m, dtype=np.uint8) for group, m in sizes.items()}
        cumulative = {group: np.zeros(m + 1, dtype=self.wide) for group, m in sizes.items()}  # [0] = 0
        by_value = np.empty(n_k if self.authors else 0, dtype=np.uint8)
        workspaces = {group: a.workspace(np.uint8, np.uint8, narrow=a.num_ood * 255 <= INT32_LIMIT)
                      for group, a in self.aurocs.items()}
        full_known = np.full(step, n_k, dtype=np.int64)
        full = {group: np.full(step, m, dtype=np.int64) for group, m in sizes.items()}
        for block in blocks:
            first, last = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, resamples)
            known_side = _Side(n_k, seed, 0, None, first)
            sides = {group: _Side(sizes[group], seed, stratum, None, first)
                     for group, (_, stratum) in self.groups.items()}
            for start in range(first, last, step):
                rows = min(step, last - start)
                known = known_side.counts(rows, known_buffer)
                counts = {group: side.counts(rows, group_buffers[group]) for group, side in sides.items()}
                self.rows(start, known, counts, ordered_correct, cumulative_correct, ordered, cumulative, by_value)
                for group, area in self.aurocs.items():
                    results[f"{group}/auroc"][start:start + rows] = area.area_counts(
                        known, counts[group], workspaces[group], (full_known[:rows], full[group][:rows]))
                if self.gamma_minus is not None:
                    negatives = counts["negatives"]
                    gamma_plus = known.astype(np.float64) @ self.target_np / n_k
                    gamma_minus = negatives.astype(np.float64) @ self.gamma_minus / negatives.shape[1]
                    results["gamma"][start:start + rows] = (gamma_plus + gamma_minus) / 2
                    results["gamma_plus"][start:start + rows] = gamma_plus
                    results["gamma_minus"][start:start + rows] = gamma_minus

    def rows(self, start: int, known: np.ndarray, counts: dict[str, np.ndarray], ordered_correct: np.ndarray,
             cumulative_correct: np.ndarray, ordered: dict[str, np.ndarray], cumulative: dict[str, np.ndarray],
             by_value: np.ndarray) -> None:
        """Closed-set accuracy and the CCR@FPR of every group and convention, row by row."""
        results, n_k = self.results, self.num_known
        exact = "exact" in self.conventions
        for r in range(known.shape[0]):
            row = known[r]
            np.cumsum(_gather_into(row, self.correct_order, ordered_correct), dtype=self.wide,
                      out=cumulative_correct[1:])  # cumulative_correct[0] = 0
            correct_total = int(cumulative_correct[-1])
            results["closed_set_accuracy"][start + r] = correct_total / n_k
            lowest_known = present = None
            for group, sorted_group in self.exact.items():
                unknown = counts[group][r]
                fits = np.cumsum(_gather_into(unknown, self.orders[group], ordered[group]), dtype=self.wide,
                                 out=cumulative[group][1:])
                if self.authors:
                    if present is None:
                        present = self.authors_present(row, by_value)
                    values = self.authors_ccr(present, cumulative[group], self.above_place[group], sorted_group.num,
                                              cumulative_correct, correct_total)
                    for key, value in zip(self.authors_keys[group], values.tolist(), strict=True):
                        results[key][start + r] = value
                if not exact:
                    continue
                passing = np.searchsorted(fits, self.fitting[group], side="right")
                inside = passing < sorted_group.num
                read = self.at_or_below[group][np.minimum(passing, sorted_group.num - 1)]
                if not inside.all():  # every unknown fits: θ = the lowest present score
                    if lowest_known is None:
                        lowest_known = _first_present(row, self.known_head, self.target_np)
                    lowest = min(lowest_known, _first_present(unknown, self.heads[group], self.group_scores[group]))
                    read = np.where(inside, read, np.searchsorted(self.correct_sorted, lowest, side="right"))
                values = (correct_total - cumulative_correct[read]).astype(np.float64) / n_k
                for key, value in zip(self.exact_keys[group], values.tolist(), strict=True):
                    results[key][start + r] = value

    def authors_present(self, row: np.ndarray, by_value: np.ndarray) -> np.ndarray:
        """The authors' thresholds of a row: the distinct known scores present, all but the largest."""
        grouped = _gather_into(row, self.by_value, by_value)
        present = np.maximum.reduceat(grouped, self.value_starts) > 0
        present[present.size - 1 - int(np.argmax(present[::-1]))] = False
        return present

    def authors_ccr(self, present: np.ndarray, cumulative: np.ndarray, above_place: np.ndarray, total: int,
                    cumulative_correct: np.ndarray, correct_total: int) -> np.ndarray:
        """:func:`_authors_ccr` of one row in numpy, with the same float64 operations: the FPR at every
        distinct known score, per target the first nearest present threshold, NaN when ``|FPR - t|/t >= 0.1``."""
        fpr = cumulative[above_place].astype(np.float64) / float(total)
        absent = ~present
        best = np.empty(len(self.targets_list), dtype=np.int64)
        nearest = np.empty(len(self.targets_list), dtype=np.float64)
        distance = np.empty_like(fpr)
        for column, t in enumerate(self.targets_list):
            np.abs(np.subtract(fpr, t, out=distance), out=distance)
            distance[absent] = math.inf
            best[column] = int(np.argmin(distance))  # first minimum: the lowest threshold among equally near
            nearest[column] = distance[best[column]]
        read = np.searchsorted(self.correct_sorted, self.values[best], side="right")
        ccr = (correct_total - cumulative_correct[read]).astype(np.float64) / self.num_known
        with np.errstate(invalid="ignore"):
            return np.where(nearest / np.asarray(self.targets_list) >= AUTHORS_RELATIVE_TOLERANCE, math.nan, ccr)


def bootstrap_open_set(
    probs: Tensor,
    target: Tensor,
    *,
    fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
    background: bool = False,
    conventions: Sequence[str] = ("exact",),
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Every scalar of :func:`metrics.open_set_report` for ``resamples`` stratified bootstrap resamples.

    Resampling units: the test samples, stratified: knowns (stratum 0), negatives -1 (stratum 1) and
    unknowns -2 (stratum 2) are resampled separately. Per resample the OSCR curve is the one of the
    expanded resample (CCR(θ) = correct knowns with S_y > θ / N_K, FPR(θ) = unknowns with max S > θ / N_U,
    θ over the scores present in the resample), computed from weighted cumulative sums over one sort per
    group shared by every resample; samples absent from a resample add no threshold. On the CPU each row is
    counted into reused uint8 buffers and turned into all its scalars in numpy (:class:`_OpenSetCPU`, the
    blocks of rows spread over threads as in :func:`bootstrap_auroc`; the exact convention costs about
    what the AUROC does); elsewhere batched torch. The values are the same either way.

    Returns:
        ``{key: (resamples,) float64}`` with the keys of ``open_set_report(...)["scalars"]``
        (``"closed_set_accuracy"``, ``"<group>/ccr@fpr=…"``, ``"<group>/authors_ccr@fpr=…"`` (NaN for "—"),
        ``"<group>/auroc"``, and ``"gamma"``, ``"gamma_plus"``, ``"gamma_minus"`` when negatives are present).
    """
    for convention in conventions:
        fpr_key(1.0, convention)
    _check_resamples(resamples, seed, 0)
    probs_k, target, num_known = check_probs_and_target(probs, target, background=background)
    probs_k = probs_k.detach()
    known = target >= 0
    if not bool(known.any()):
        raise ValueError("the open-set bootstrap needs at least one known sample (label >= 0)")
    targets = torch.as_tensor(list(fpr_targets), dtype=torch.float64, device=probs_k.device).flatten()
    if ((targets < 0) | (targets > 1) | ~torch.isfinite(targets)).any():
        raise ValueError(f"FPR targets must lie in [0, 1], got {targets.tolist()}")
    if "authors" in conventions and bool((targets == 0).any()):
        raise ValueError(f"FPR targets must lie in (0, 1] for convention='authors', got {targets.tolist()}")
    confidence, prediction = probs_k.max(dim=1)
    labels = target[known]
    target_score = probs_k[known].gather(1, labels[:, None]).squeeze(1)
    correct = prediction[known] == labels
    plan = _OpenSetPlan(target_score, correct)
    known_confidence = confidence[known]
    groups = {group: (confidence[target == label], stratum)
              for stratum, (group, label) in enumerate(GROUPS.items(), start=1) if bool((target == label).any())}
    auroc_plans = {group: _AUROCPlan(known_confidence, scores) for group, (scores, _) in groups.items()}
    exact_plans = {group: _ExactCCRPlan(plan, scores) for group, (scores, _) in groups.items()}
    negatives = probs_k[target == -1].double()
    offset = 1.0 if background else 1.0 + 1.0 / num_known
    gamma_minus_values = offset - negatives.max(dim=1).values if negatives.numel() else None

    if "authors" in conventions:  # the shared searches, once, before any thread
        plan._unique()
        for exact in exact_plans.values():
            exact.authors_search(plan)

    keys = ["closed_set_accuracy"]
    for group in groups:
        keys += [f"{group}/{fpr_key(t, c)}" for c in conventions for t in fpr_targets] + [f"{group}/auroc"]
    if gamma_minus_values is not None:
        keys += ["gamma", "gamma_plus", "gamma_minus"]

    num_known_samples = labels.numel()
    largest_group = max([scores.numel() for scores, _ in groups.values()], default=1)
    if probs_k.device.type == "cpu" and 2 * num_known_samples * largest_group <= INT64_LIMIT:
        arrays = {key: np.empty(resamples, dtype=np.float64) for key in keys}
        runner = _OpenSetCPU(plan, exact_plans, auroc_plans, groups, targets, conventions, gamma_minus_values, arrays)
        blocks = list(range(-(-resamples // BLOCK_ROWS)))
        large = target.numel() >= PARALLEL_SIZE
        workers = max(1, min(torch.get_num_threads(), len(blocks))) if large else 1
        if workers == 1:
            runner.work(blocks, resamples, seed)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda mine: runner.work(mine, resamples, seed),
                              [blocks[k::workers] for k in range(workers)]))
        return {key: torch.from_numpy(arrays[key]) for key in keys}
    return _bootstrap_open_set_torch(plan, exact_plans, auroc_plans, groups, targets, fpr_targets, conventions,
                                     gamma_minus_values, resamples, seed, keys)


def _bootstrap_open_set_torch(plan: _OpenSetPlan, exact_plans: dict[str, _ExactCCRPlan],
                              auroc_plans: dict[str, _AUROCPlan], groups: dict[str, tuple[Tensor, int]],
                              targets: Tensor, fpr_targets: Sequence[float], conventions: Sequence[str],
                              gamma_minus_values: Tensor | None, resamples: int, seed: int,
                              keys: list[str]) -> dict[str, Tensor]:
    """:func:`bootstrap_open_set` batched in torch, chunk of rows after chunk (accelerators)."""
    device = plan.target_score.device
    results: dict[str, list[Tensor]] = {key: [] for key in keys}
    num_samples = plan.target_score.numel() + sum(scores.numel() for scores, _ in groups.values())
    step = _chunk_rows(num_samples * max(1, len(targets)))
    known_side = _Side(plan.target_score.numel(), seed, 0)
    group_sides = {group: _Side(scores.numel(), seed, stratum) for group, (scores, stratum) in groups.items()}
    target_score_64 = plan.target_score.double()
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        w_known = known_side.weights(rows, device)
        total_known = w_known.sum(dim=1, dtype=torch.int64).double()
        results["closed_set_accuracy"].append((w_known * plan.correct).sum(dim=1, dtype=torch.int64).double() / total_known)
        weights = {}
        for group, (scores, _) in groups.items():
            w_group = weights[group] = group_sides[group].weights(rows, device)
            for convention in conventions:
                if convention == "exact":
                    values = exact_plans[group].ccr(plan, w_known, w_group, targets)
                else:
                    values = _authors_ccr(plan, scores, w_known, w_group, targets, exact_plans[group])
                for column, fpr_target in enumerate(fpr_targets):
                    results[f"{group}/{fpr_key(fpr_target, convention)}"].append(values[:, column])
            results[f"{group}/auroc"].append(auroc_plans[group].area(w_known, w_group))
        if gamma_minus_values is not None:
            w_negative = weights["negatives"].double()
            gamma_plus = (w_known.double() @ target_score_64) / total_known
            gamma_minus = (w_negative @ gamma_minus_values) / w_negative.sum(dim=1)
            results["gamma"].append((gamma_plus + gamma_minus) / 2)
            results["gamma_plus"].append(gamma_plus)
            results["gamma_minus"].append(gamma_minus)
    return {key: torch.cat(parts) for key, parts in results.items()}


# --------------------------------------------------------------------------------------------------
# accuracy and calibration (generated / shifted sets)


def _ece_rows(weights: Tensor, bins: Tensor, confidence: Tensor, accurate: Tensor, num_bins: int) -> Tensor:
    """Weighted torchmetrics ECE (L1): Σ_bins |acc_b - conf_b| · prop_b, with weighted bin sums."""
    columns = num_bins + 1  # torchmetrics' bucketize(right=True) - 1 puts confidence 1.0 in an extra bin
    one_hot = torch.zeros(bins.numel(), 3 * columns, dtype=torch.float64, device=weights.device)
    index = torch.arange(bins.numel(), device=weights.device)
    one_hot[index, bins] = 1.0
    one_hot[index, columns + bins] = confidence
    one_hot[index, 2 * columns + bins] = accurate
    sums = weights.double() @ one_hot
    count, conf_sum, acc_sum = sums[:, :columns], sums[:, columns:2 * columns], sums[:, 2 * columns:]
    conf_bin = torch.nan_to_num(conf_sum / count)
    acc_bin = torch.nan_to_num(acc_sum / count)
    return ((acc_bin - conf_bin).abs() * (count / count.sum(dim=1, keepdim=True))).sum(dim=1)


def bootstrap_accuracy_ece(
    probs: Tensor, targets: Tensor, *, bins: int = 15, resamples: int = 1000, seed: int = 0
) -> dict[str, Tensor]:
    """Top-1 accuracy and ECE of ``resamples`` bootstrap resamples of the samples (one stratum, 0).

    The ECE is the project's (``callbacks.generated``: torchmetrics' ``multiclass_calibration_error``, L1,
    ``bins`` equal-width bins over [0, 1], confidence = max probability in float32, bins by
    ``bucketize(right=True) - 1``) with every bin sum weighted by the resample counts; the bin sums are
    taken in float64, so a row equals torchmetrics on the expanded resample to float32 rounding (~1e-7).
    Resampling unit: the images, independent draws of the generated or shifted set.

    Args:
        probs: ``(N, C)`` probabilities (in [0, 1]); targets: ``(N,)`` labels ``0..C-1``.

    Returns:
        ``{"accuracy": (B,), "ece": (B,)}`` float64.
    """
    _check_resamples(resamples, seed, 0)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    probs = torch.as_tensor(probs)
    targets = torch.as_tensor(targets)
    if probs.ndim != 2 or not probs.is_floating_point() or probs.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty floating (N, C) tensor, got {tuple(probs.shape)} {probs.dtype}")
    if targets.shape != (probs.shape[0],) or targets.is_floating_point():
        raise ValueError(f"targets must be (N,) = ({probs.shape[0]},) integer labels, got {tuple(targets.shape)} "
                         f"{targets.dtype}")
    if not bool(torch.isfinite(probs).all()) or float(probs.min()) < 0 or float(probs.max()) > 1:
        raise ValueError("probs must be finite probabilities in [0, 1] (apply a softmax to logits first)")
    confidence, prediction = probs.max(dim=1)
    confidence = confidence.float()
    accurate = (prediction == targets).double()
    boundaries = torch.linspace(0, 1, bins + 1, dtype=confidence.dtype, device=confidence.device)
    bin_index = torch.bucketize(confidence, boundaries, right=True) - 1
    accuracy, ece = [], []
    step = _chunk_rows(probs.shape[0] * 4)
    side = _Side(probs.shape[0], seed, 0)
    for start in range(0, resamples, step):
        weights = side.weights(min(step, resamples - start), probs.device)
        accuracy.append((weights.double() @ accurate) / weights.sum(dim=1, dtype=torch.int64).double())
        ece.append(_ece_rows(weights, bin_index, confidence.double(), accurate, bins))
    return {"accuracy": torch.cat(accuracy), "ece": torch.cat(ece)}


# --------------------------------------------------------------------------------------------------
# reading replicates


def percentile_interval(replicates: Tensor, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval: the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles (linear
    interpolation) of the replicates. NaN replicates (e.g. the authors' "—") are dropped; all NaN gives
    ``(nan, nan)``."""
    level = _check_level(level)
    values = torch.as_tensor(replicates).double().flatten()
    values = values[~torch.isnan(values)]
    if values.numel() == 0:
        return math.nan, math.nan
    low, high = torch.quantile(values.cpu(), torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(low), float(high)


def paired_difference(a: Tensor, b: Tensor, level: float = 0.95) -> tuple[float, float, bool]:
    """Percentile interval of ``a - b`` over the *same* resamples (same seed, same samples), and whether it
    excludes 0 (the difference is significant at ``level``).

    Returns:
        ``(low, high, excludes_zero)``; resamples where either side is NaN are dropped.
    """
    a, b = torch.as_tensor(a).double().flatten(), torch.as_tensor(b).double().flatten()
    if a.shape != b.shape:
        raise ValueError(f"paired replicates must have the same number of resamples, got {a.numel()} and {b.numel()}")
    low, high = percentile_interval(a - b, level)
    return low, high, bool(low > 0 or high < 0)


def probability_first(replicates: Tensor, higher_is_better: bool = True) -> Tensor:
    """Fraction of resamples in which each row (detector) is best; ties split evenly, NaN never wins.

    Args:
        replicates: ``(R, B)``: row r = one detector's metric over the same ``B`` resamples.

    Returns:
        ``(R,)`` float64 summing to 1 (a column where every value is NaN is split evenly among all rows).
    """
    values = torch.as_tensor(replicates).double()
    if values.ndim != 2 or values.shape[0] == 0 or values.shape[1] == 0:
        raise ValueError(f"replicates must have shape (R, B) with R, B >= 1, got {tuple(values.shape)}")
    if not higher_is_better:
        values = -values
    values = torch.nan_to_num(values, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    best = values == values.max(dim=0, keepdim=True).values
    share = best.double() / best.sum(dim=0, keepdim=True)
    return share.mean(dim=1)


__all__ = [
    "auroc_interval",
    "bootstrap_accuracy_ece",
    "bootstrap_auroc",
    "bootstrap_min_rank",
    "bootstrap_open_set",
    "cluster_weights",
    "delong",
    "paired_difference",
    "percentile_interval",
    "probability_first",
    "resample_weights",
    "weighted_auroc",
    "weighted_min_rank",
    "DeLongParts",
    "delong_parts",
    "newcombe_interval",
    "newcombe_variance",
    "wilson_interval",
]
