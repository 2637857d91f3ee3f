"""Area under the ROC curve for separating in-distribution from out-of-distribution scores.

In-distribution is the positive class and scores follow the project's κ convention (higher = more
in-distribution). The AUROC is computed in its Mann–Whitney form,

    AUROC = (1 / (N_id N_ood)) Σ_i Σ_j [ 1(s_i > t_j) + ½ 1(s_i = t_j) ],

with exact integer counts (one sort of all scores). torchmetrics' ``binary_auroc`` is not used here
because it treats scores outside ``[0, 1]`` as logits and applies a sigmoid, which saturates large
scores (max-logit, energy) to 1.0 in floating point and turns distinct scores into ties.

Weighted, for the bootstrap (:mod:`metrics.resampling`): :func:`weighted_auroc` computes the AUROC of every
row of weights ``(B, N)`` at once over one sort of the OOD scores,

    AUROC_b = Σ_i Σ_j w_bi v_bj ψ(s_i, t_j) / (Σ_i w_bi Σ_j v_bj),   ψ(s, t) = 1(s > t) + ½ 1(s = t),

exactly in integers for integer weights, so a row equals :func:`auroc` of the expanded resample; and
:func:`bootstrap_auroc` draws the stratified resamples itself, chunk by chunk.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from metrics._validation import check_score_pair
from metrics.collect import IndexedPredictions
from metrics.resampling import (
    BLOCK_ROWS,
    INT32_LIMIT,
    INT64_LIMIT,
    PARALLEL_SIZE,
    _check_resamples,
    _check_weight_pair,
    _chunk_rows,
    _cluster_inverse,
    _Side,
    run_blocks,
)


def auroc(id_scores: Tensor, ood_scores: Tensor) -> float:
    """AUROC with in-distribution as the positive class, ties counting one half.

    Args:
        id_scores: ``(N_id,)`` confidence of in-distribution samples.
        ood_scores: ``(N_ood,)`` confidence of out-of-distribution samples.

    Returns:
        The probability that a random ID sample scores higher than a random OOD sample.
    """
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "AUROC")
    num_id, num_ood = id_scores.numel(), ood_scores.numel()
    scores = torch.cat([id_scores, ood_scores])
    _, inverse = torch.unique(scores, sorted=True, return_inverse=True)
    num_values = int(inverse.max()) + 1
    id_count = torch.bincount(inverse[:num_id], minlength=num_values)
    ood_count = torch.bincount(inverse[num_id:], minlength=num_values)
    ood_below = torch.cumsum(ood_count, dim=0) - ood_count
    # Twice the Mann-Whitney U statistic, in exact integer arithmetic.
    twice_u = int((id_count * (2 * ood_below + ood_count)).sum())
    return twice_u / (2.0 * num_id * num_ood)


class OODAUROC(IndexedPredictions):
    """Stateful AUROC: update with ``(scores, is_id, index)``; ``compute()`` returns :func:`auroc`."""

    higher_is_better = True

    def compute(self) -> Tensor:  # type: ignore[override]
        scores, is_id = super().compute()
        return torch.tensor(auroc(scores[is_id.bool()], scores[~is_id.bool()]), dtype=torch.float64)


# --------------------------------------------------------------------------------------------------
# weighted, and the bootstrap


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
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "weighted AUROC")
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
    that side instead (:func:`metrics.resampling.cluster_weights`; e.g. the OOD classes of a severity level).
    The weights are generated chunk by chunk, never all ``B x N`` at once: on the CPU one row at a time at
    large N, counted into a reused uint8 buffer and turned into its AUROC right away, with the blocks of rows
    (:mod:`metrics.resampling`) spread over ``torch.get_num_threads()`` threads; the values do not depend on
    that.

    Returns:
        ``(resamples,)`` float64: row ``b`` equals ``weighted_auroc`` with row ``b`` of
        ``resample_weights(N_id, B, seed, stratum=0)`` / ``(N_ood, ..., stratum=1)`` (or the cluster weights).
    """
    _check_resamples(resamples, seed, 0)
    id_scores, ood_scores = check_score_pair(id_scores, ood_scores, "bootstrap AUROC")
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

    run_blocks(resamples, work, parallel=num_id + num_ood >= PARALLEL_SIZE)
    return areas
