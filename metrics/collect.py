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

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        """Gather the states of all ranks, including ranks that saw no batch at all.

        torchmetrics stands in an empty float vector for the state of a rank without updates; with values
        of shape ``(N, C)`` or integer labels that would not match the other ranks' tensors and the gather
        would fail or hang. So every rank first shares the dtype and trailing shape of its states (one small
        object gather, joined by every rank), and a rank without data gathers empty tensors of the same kind.
        """
        import torch.distributed as dist

        group = process_group or self.process_group
        local = {name: _layout(getattr(self, name)) for name in self._reductions}
        layouts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(layouts, local, group=group)
        for name in self._reductions:
            state = getattr(self, name)
            if isinstance(state, list) and not state:
                layout = next((ranks[name] for ranks in layouts if ranks[name] is not None), None)
                if layout is not None:
                    dtype, trailing = layout
                    state.append(torch.empty((0, *trailing), dtype=getattr(torch, dtype), device=self.device))
        kwargs = {"process_group": process_group}
        if dist_sync_fn is not None:
            kwargs["dist_sync_fn"] = dist_sync_fn
        super()._sync_dist(**kwargs)
        for name in self._reductions:  # no rank had data: keep the state an empty list, as before the sync
            state = getattr(self, name)
            if isinstance(state, Tensor) and state.numel() == 0 and all(ranks[name] is None for ranks in layouts):
                setattr(self, name, [])

    def gather(self) -> tuple[Tensor, Tensor]:
        """``(values, target)`` of every distinct sample from all ranks, in dataset-index order.

        The same as ``compute()`` but without torchmetrics' squeezing of one-element results, so a set of
        one sample keeps its sample dimension. Every rank must call it (it is a collective).
        """
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync,
                               should_unsync=self._should_unsync):
            return self._gathered()

    def compute(self) -> tuple[Tensor, Tensor]:
        return self._gathered()

    def _gathered(self) -> tuple[Tensor, Tensor]:
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


def _layout(state: Any) -> tuple[str, tuple[int, ...]] | None:
    """``(dtype name, trailing shape)`` of a list state's tensors, or ``None`` for an empty state."""
    if isinstance(state, list):
        if not state:
            return None
        state = state[0]
    return str(state.dtype).removeprefix("torch."), tuple(state.shape[1:])
