"""Simultaneous comparisons of rows measured on the same resamples: which rows are worse than the best.

A leaderboard column holds ``R`` estimates (detectors, models) and, for each, ``B`` bootstrap replicates over
the *same* resamples (paired: the weights are keyed by the identity of the resampled unit, so row ``r``'s
replicate ``b`` and row ``s``'s replicate ``b`` come from one resample of the test data). A mark "worse than
the best" on a row is a claim ``θ_r < max_s θ_s``. Marking every row whose paired difference to the observed
best excludes 0 at 95% makes ``R - 1`` such claims, each at 5%, against a best chosen from the same data: with
10 rows of equal truth, at least one false mark in most repetitions.

:func:`worse_than_best` makes the marks a **family-wise** statement per column: the studentised bootstrap
max-T over all ``R(R-1)/2`` pairs, stepped down (Romano & Wolf, *JASA* 2005, "Exact and approximate
stepdown methods for multiple hypothesis testing", the resampling form of Holm's procedure; single-step
max-T: Westfall & Young 1993). For a pair ``(r, s)`` with estimates ``θ̂`` and replicates ``θ*``::

    d̂_rs = θ̂_s - θ̂_r,   se_rs = sd_b(θ*_s,b - θ*_r,b),   t_rs = |d̂_rs| / se_rs
    T*_b(A) = max_{(r,s) ∈ A} |(θ*_s,b - θ*_r,b) - d̂_rs| / se_rs     (the centred, studentised maximum)

Starting with ``A`` = every pair, the pairs with ``t_rs > c(A)``, ``c(A)`` the ``level`` quantile of
``T*(A)`` (the ``⌈level·B⌉``-th order statistic), are declared different; they leave ``A`` and the step is
repeated until none is. Row ``r`` is marked when some pair ``(r, s)`` with ``θ̂_s > θ̂_r`` was declared:
then ``θ_r < θ_s <= max θ``. With probability at least ``level`` (asymptotically) no true difference of 0
is declared, so the chance of **any** false mark in the column is at most ``1 - level`` whatever the
number of rows, including ties among the best (every pair of tied rows is in the family, which a
one-sided comparison with the best would not protect). What it does not control: marks across columns (each
column is its own family), and the choice of columns.

A pair whose replicate difference has no spread (``se = 0``) differs by the same amount in every resample:
it is declared when that amount is not 0 and never when it is (two rows perfectly separated in every
resample). Rows with a NaN estimate are never marked, resamples in
which a compared row is NaN are left out (an empty severity level in that resample).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metrics.bootstrap_intervals import probability_first


def _paired(estimates: Tensor, replicates: Tensor) -> tuple[Tensor, Tensor]:
    estimates = torch.as_tensor(estimates).double().flatten()
    replicates = torch.as_tensor(replicates).double()
    if replicates.ndim != 2 or replicates.shape[0] != estimates.numel():
        raise ValueError(f"replicates must have shape (R, B) = ({estimates.numel()}, B), one row per estimate, "
                         f"got {tuple(replicates.shape)}")
    return estimates, replicates


def worse_than_best(estimates: Tensor, replicates: Tensor, level: float = 0.95,
                    higher_is_better: bool = True) -> Tensor:
    """Which rows are worse than the best, simultaneously at ``level`` (family-wise per column; module
    docstring: the studentised bootstrap max-T over all pairs, stepped down, Romano & Wolf 2005).

    Args:
        estimates: ``(R,)`` the rows' estimates.
        replicates: ``(R, B)`` their bootstrap replicates over the same ``B`` resamples (paired).
        level: the family-wise confidence: the chance of any false mark is at most ``1 - level``.
        higher_is_better: whether a higher value is better (False: e.g. an error rate).

    Returns:
        ``(R,)`` bool: True where the row is declared worse than the best. The observed best, rows tied with
        it, rows with a NaN estimate and every row of a column with fewer than two finite rows are False.

    Raises:
        ValueError: shapes that do not match, ``level`` outside (0, 1), fewer than two resamples.
    """
    estimates, replicates = _paired(estimates, replicates)
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    marked = torch.zeros(estimates.numel(), dtype=torch.bool)
    rows = torch.isfinite(estimates).nonzero().flatten()
    if rows.numel() < 2:
        return marked
    sign = 1.0 if higher_is_better else -1.0
    theta, draws = sign * estimates[rows], sign * replicates[rows]
    draws = draws[:, torch.isfinite(draws).all(dim=0)]  # the resamples in which every compared row has a value
    if draws.shape[1] < 2:
        return marked
    first, second = torch.triu_indices(rows.numel(), rows.numel(), offset=1)
    observed = theta[second] - theta[first]  # (P,)
    differences = draws[second] - draws[first]  # (P, B)
    spread = differences.std(dim=1)
    varied = spread > 0
    safe = torch.where(varied, spread, torch.ones_like(spread))
    # a pair without spread differs by the same amount in every resample: beyond doubt if that is not 0
    statistics = torch.where(varied, observed.abs() / safe,
                             torch.where(observed != 0, torch.full_like(observed, math.inf), torch.zeros_like(observed)))
    centred = torch.where(varied[:, None], (differences - observed[:, None]).abs() / safe[:, None],
                          torch.zeros_like(differences))  # (P, B)
    rank = max(1, min(draws.shape[1], math.ceil(level * draws.shape[1] - 1e-9)))  # ⌈level·B⌉
    active = torch.ones(observed.numel(), dtype=torch.bool)
    declared = torch.zeros_like(active)
    while bool(active.any()):
        maxima = centred[active].max(dim=0).values
        critical = torch.sort(maxima).values[rank - 1]
        new = active & (statistics > critical)
        if not bool(new.any()):
            break
        declared |= new
        active &= ~new
    for pair in declared.nonzero().flatten().tolist():
        lower = first[pair] if observed[pair] > 0 else second[pair]  # the row of the two with the lower estimate
        marked[rows[lower]] = True
    return marked


def share_first(replicates: Tensor, higher_is_better: bool = True) -> Tensor:
    """The share of resamples in which each row ranks first (ties split evenly, NaN never first).

    Not a probability that the row is the best: the resamples scatter around the observed estimates, so the
    observed leader ranks first in most of them even when the rows' true values are equal (10 equal rows:
    the observed leader's share is typically far above 1/10). Read it as how stable the observed order is.

    Args:
        replicates: ``(R, B)``: row r = one row's metric over the same ``B`` resamples.

    Returns:
        ``(R,)`` float64 summing to 1.
    """
    return probability_first(replicates, higher_is_better=higher_is_better)


__all__ = ["share_first", "worse_than_best"]
