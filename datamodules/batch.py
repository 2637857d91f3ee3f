"""The sample and batch structure every datamodule of the project yields.

A batch carries the dataset index of each sample, so evaluation metrics can drop the duplicates that
``DistributedSampler`` adds, and the dataset indices of the unreadable images that were skipped in it, so
a run that skips images reports exactly which and how many.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset


class Sample(NamedTuple):
    """One sample; ``image`` is ``None`` when the file could not be read and the dataset skips it."""

    image: Tensor | None
    target: int
    index: int


class Batch(NamedTuple):
    images: Tensor  # (B, C, H, W)
    targets: Tensor  # (B,) int64, project label convention
    indices: Tensor  # (B,) int64 dataset indices
    skipped: Tensor  # (S,) int64 dataset indices of unreadable images dropped from this batch


def collate_samples(samples: list[Sample]) -> Batch:
    """Stack readable samples; drop the unreadable ones and record their indices."""
    readable = [s for s in samples if s.image is not None]
    skipped = torch.tensor([s.index for s in samples if s.image is None], dtype=torch.long)
    if not readable:
        return Batch(torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), skipped)
    return Batch(
        images=torch.stack([s.image for s in readable]),  # type: ignore[misc]
        targets=torch.tensor([s.target for s in readable], dtype=torch.long),
        indices=torch.tensor([s.index for s in readable], dtype=torch.long),
        skipped=skipped,
    )


def unpack_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(images, targets, indices or None, skipped or None)`` from a :class:`datamodules.Batch` or a tuple."""
    if isinstance(batch, (tuple, list)) and 2 <= len(batch) <= 4:
        images, targets, *rest = batch
        indices = rest[0] if rest else None
        skipped = rest[1] if len(rest) > 1 else None
        return images, targets, indices, skipped
    raise TypeError(f"expected a batch (images, targets[, indices[, skipped]]), got {type(batch).__name__}")


class AtLeast(Dataset):
    """A data set with its items repeated until it holds at least ``count`` (e.g. one per process).

    Lightning's predict loop shards without padding and asserts that every process gets an item, so a set
    with fewer items than processes is padded here: the repeats are the same items (the same dataset indices),
    which the writers gather by index and keep once.
    """

    def __init__(self, dataset: Dataset, count: int) -> None:
        if len(dataset) == 0:  # type: ignore[arg-type]
            raise ValueError("cannot pad an empty data set")
        self.dataset, self.count = dataset, max(count, len(dataset))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % len(self.dataset)]  # type: ignore[arg-type]
