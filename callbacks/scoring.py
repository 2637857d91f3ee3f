"""Sharded model passes over a data set, gathered exactly, and their on-disk cache.

:func:`sharded_outputs` runs a step function over a data set inside a running Trainer: rank ``r`` of ``W``
takes the samples ``r, r+W, r+2W, ...`` (no padding, so shards are uneven and a rank may have none), and
every output is gathered from all ranks through :class:`metrics.IndexedPredictions`, which drops nothing
and orders the samples by dataset index. Every rank joins every gather, also a rank without a batch, so
the result is identical on 1 and N processes and no rank waits for another that skipped a collective.

:class:`PredictionCache` keeps those results on disk per key (model weights, data files, transform,
precision, κ and its parameters; built by the caller with :func:`common.digest`). Global rank zero decides
hit or miss and broadcasts the payload, so every rank takes the same decision (a rank that cannot read
the file, or reads it a moment later, cannot diverge into a different collective). Files are written
atomically; a file whose key, type, content or shape does not match is rejected with a warning and
recomputed, never used.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from common import atomic_write_bytes
from datamodules.batch import collate_samples, unpack_batch
from metrics import IndexedPredictions


def shard_indices(num_samples: int, rank: int, world_size: int) -> list[int]:
    """The dataset indices of one rank: ``rank, rank + W, ...`` (no padding; possibly none)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return list(range(rank, num_samples, world_size))


def sharded_outputs(
    trainer: pl.Trainer,
    dataset: Dataset,
    step: Callable[[Tensor], dict[str, Tensor]],
    *,
    keys: Sequence[str],
    batch_size: int,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, Tensor]:
    """``{key: gathered values, "targets": labels}`` of ``step(images)`` over a data set, on every rank.

    Args:
        trainer: the running Trainer (its rank, world size and precision).
        dataset: yields :class:`datamodules.batch.Sample`.
        step: images ``(B, ...)`` on ``device`` -> ``{key: (B, ...) tensor}`` for every key of ``keys``.
        keys: the step's output keys, the same on every rank (a rank without data never calls ``step``).
        batch_size, num_workers: of this rank's data loader.

    Raises:
        RuntimeError: when the gathered samples are not exactly the data set (images skipped as unreadable).
    """
    shard = shard_indices(len(dataset), trainer.global_rank, trainer.world_size)
    loader = DataLoader(Subset(dataset, shard), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=collate_samples)
    stores = {key: IndexedPredictions().to(device) for key in keys}
    for batch in loader:
        images, targets, indices, _ = unpack_batch(batch)  # indices: of the full data set (Subset keeps them)
        if images.numel() == 0:
            continue
        with trainer.precision_plugin.forward_context():
            outputs = step(images.to(device))
        for key in keys:
            stores[key].update(outputs[key].float(), targets.to(device), indices.to(device))
    result: dict[str, Tensor] = {}
    for key in keys:  # the same order on every rank: each compute() is a collective
        values, targets = stores[key].gather()
        result[key] = values.cpu()
        result["targets"] = targets.cpu()
    if result["targets"].shape[0] != len(dataset):
        raise RuntimeError(
            f"predictions cover {result['targets'].shape[0]} of {len(dataset)} samples (unreadable images skipped?)"
        )
    return result


class PredictionCache:
    """Cached model outputs in ``directory``: ``<name>-<key prefix>.pt`` holding ``{"key", "meta", "tensors"}``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, name: str, key: str) -> Path:
        return self.directory / f"{name}-{key[:16]}.pt"

    def load(self, name: str, key: str, *, rows: int) -> dict[str, Tensor] | None:
        """The cached tensors, or ``None`` when absent or rejected (unreadable, other key, wrong type or shape)."""
        path = self.path(name, key)
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated or foreign file
            return self._reject(path, f"unreadable ({type(error).__name__}: {error})")
        if not isinstance(payload, dict):
            return self._reject(path, f"it holds a {type(payload).__name__}, not a cache entry")
        if payload.get("key") != key:
            return self._reject(path, "its key does not match this model, data and confidence function")
        tensors = payload.get("tensors")
        if not isinstance(tensors, dict) or not tensors:
            return self._reject(path, f"its 'tensors' is a {type(tensors).__name__}, not a dict of tensors")
        wrong_type = sorted(k for k, v in tensors.items() if not isinstance(v, Tensor) or v.ndim == 0)
        if wrong_type or "targets" not in tensors:
            return self._reject(path, f"entries {wrong_type or ['targets (missing)']} are not per-sample tensors")
        wrong = {k: tuple(v.shape) for k, v in tensors.items() if v.shape[0] != rows}
        if wrong:
            return self._reject(path, f"expected {rows} rows, found shapes {wrong}")
        return tensors

    def load_on_rank_zero(self, trainer: pl.Trainer, name: str, key: str, *, rows: int) -> dict[str, Tensor] | None:
        """:meth:`load` on global rank zero, broadcast to every rank: one decision for all."""
        payload = self.load(name, key, rows=rows) if trainer.is_global_zero else None
        return trainer.strategy.broadcast(payload, src=0)

    @staticmethod
    def _reject(path: Path, reason: str) -> None:
        warnings.warn(f"rejecting prediction cache {path}: {reason}; recomputing", RuntimeWarning, stacklevel=3)
        return None

    def save(self, name: str, key: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Path:
        buffer = io.BytesIO()
        torch.save({"key": key, "meta": meta, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, buffer)
        return atomic_write_bytes(self.path(name, key), buffer.getvalue())
