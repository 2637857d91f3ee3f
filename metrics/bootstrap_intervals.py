"""Reading bootstrap replicates: the percentile interval, paired differences, the probability of being first.

The replicates come from the weighted forms of the metrics over the rows of :mod:`metrics.resampling`;
replicates of two detectors (or models) over the same resamples are *paired* (same seed, same units keyed
by identity), which :func:`paired_difference` and :func:`probability_first` need. The family-wise comparison
of a whole column is :func:`metrics.worse_than_best`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metrics._validation import check_level


def percentile_interval(replicates: Tensor, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval: the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles (linear
    interpolation) of the replicates. NaN replicates (e.g. the authors' "—") are dropped; all NaN gives
    ``(nan, nan)``."""
    level = check_level(level)
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


__all__ = ["paired_difference", "percentile_interval", "probability_first"]
