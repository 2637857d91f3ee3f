"""The bootstrap's resampling weights: integer multinomial counts, keyed by the resampled unit's identity.

A resample is a row of integer weights, ``w_b[i]`` = how often sample ``i`` was drawn
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
simply cut). Blocks are independent, so the CPU bootstraps spread them over threads (:func:`run_blocks`). Two
detectors scored on the same images with the same seed get the *same* resamples, which is what
:func:`metrics.paired_difference` and :func:`metrics.worse_than_best` need. Strata default to ID = 0, OOD = 1 (knowns 0,
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
  interval is conditional on the search (:func:`metrics.wilson_interval` of the count of ID images above the fixed
  worst case).

Every metric's weighted form lives beside the metric (:func:`metrics.auroc.weighted_auroc`,
:func:`metrics.evg.weighted_min_rank`, :func:`metrics.detection.weighted_fpr_at_tpr`, the CCR kernels of
:mod:`metrics.oscr`, :func:`metrics.gamma.weighted_gamma`, :func:`metrics.calibration.weighted_calibration_error`)
and takes these rows; every function works on the full (gathered) tensors it is given, with deterministic
weights, so results are identical on one process and under DDP (gather the scores first, e.g.
``IndexedPredictions``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

# Elements per (chunk, n) work array: chunks of rows keep memory at a few hundred MB at N = 1e6.
CHUNK_ELEMENTS = 1 << 23
# Resamples per generator: row b of a stratum is drawn by the generator seeded (seed, stratum, b // BLOCK_ROWS).
BLOCK_ROWS = 16
# Draws counted in one batch (rows of small n together; at large n one row at a time keeps it in cache).
BATCH_DRAWS = 1 << 16
# Scores (N_id + N_ood) from which the CPU bootstraps of the AUROC and the open-set metrics spread their
# blocks of rows over threads.
PARALLEL_SIZE = 1 << 17
INT32_LIMIT = (1 << 31) - 1
INT64_LIMIT = (1 << 63) - 1


# --------------------------------------------------------------------------------------------------
# checks


def _check_resamples(resamples: int, seed: int, stratum: int) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    for name, value in (("seed", seed), ("stratum", stratum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


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
# the rows of a stratum


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
# blocks of rows over threads


def run_blocks(resamples: int, work: Callable[[list[int]], None], *, parallel: bool) -> None:
    """Call ``work`` on the blocks of rows ``0 .. ceil(resamples / BLOCK_ROWS) - 1``: all in this thread, or,
    when ``parallel``, spread round-robin over ``torch.get_num_threads()`` threads (numpy and torch release
    the GIL). A block has its own generators, so the values ``work`` writes do not depend on the split."""
    blocks = list(range(-(-resamples // BLOCK_ROWS)))
    workers = max(1, min(torch.get_num_threads(), len(blocks))) if parallel else 1
    if workers == 1:
        work(blocks)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, [blocks[k::workers] for k in range(workers)]))


__all__ = ["cluster_weights", "resample_weights"]
