"""Exact accumulation of per-sample predictions across batches and processes.

Ranking metrics (OSCR, AUROC) and γ cannot be averaged over batches or ranks, so every stateful metric
in this package keeps the per-sample values in ``cat`` states and computes once on the gathered data.

Each sample also carries its dataset index. ``DistributedSampler`` pads the evaluation set by repeating
samples so that every rank gets the same number; the gathered data therefore holds duplicates. They are
dropped by index and the samples are put in index order, so the metric sees exactly the same sequence
of values on 1 process as on N processes: results are bit-for-bit equal, not merely close.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

NO_INDEX = -1


def deduplicate_by_index(index: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Keep the first occurrence of every index and order all tensors by index.

    Args:
        index: ``(N,)`` non-negative dataset indices, possibly repeated.
        tensors: tensors with first dimension ``N``.

    Returns:
        The tensors restricted to unique indices, in ascending index order.
    """
    sorted_index, order = torch.sort(index, stable=True)
    keep = torch.ones_like(sorted_index, dtype=torch.bool)
    keep[1:] = sorted_index[1:] != sorted_index[:-1]
    selected = order[keep]
    return tuple(t[selected] for t in tensors)


class IndexedPredictions(Metric):
    """Collects ``(values, target, index)`` over batches and DDP ranks without padding duplicates.

    ``values`` is any per-sample tensor (probabilities ``(N, C)``, scores ``(N,)``). ``compute()`` returns
    ``(values, target)`` for every distinct sample, in dataset-index order. Without indices (``index=None``
    on every update) the samples are kept as gathered and padding is not removed.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    values: list[Tensor]
    target: list[Tensor]
    index: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("values", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self.add_state("index", default=[], dist_reduce_fx="cat")

    def update(self, values: Tensor, target: Tensor, index: Tensor | None = None) -> None:
        """Add one batch: ``values`` ``(N, ...)``, ``target`` ``(N,)``, ``index`` ``(N,)`` or ``None``."""
        if values.shape[0] != target.shape[0]:
            raise ValueError(f"values has {values.shape[0]} rows but target has {target.shape[0]}")
        if index is None:
            index = torch.full((target.shape[0],), NO_INDEX, dtype=torch.long, device=target.device)
        elif index.shape != target.shape:
            raise ValueError(f"index must have shape {tuple(target.shape)}, got {tuple(index.shape)}")
        elif (index < 0).any():
            raise ValueError(f"dataset indices must be non-negative, got {int(index.min())}")
        self.values.append(values.detach())
        self.target.append(target.detach().long())
        self.index.append(index.detach().long())

    def compute(self) -> tuple[Tensor, Tensor]:
        if isinstance(self.values, list) and not self.values:
            raise ValueError(f"{type(self).__name__}.compute() called before any update: no predictions collected")
        values = dim_zero_cat(self.values)
        target = dim_zero_cat(self.target)
        index = dim_zero_cat(self.index)
        with_index = index != NO_INDEX
        if with_index.all():
            values, target = deduplicate_by_index(index, values, target)
        elif with_index.any():
            raise ValueError("some batches were updated with dataset indices and some without; pass index always")
        return values, target
