"""One forward pass, many confidence functions: gathered predictions and their on-disk cache.

:class:`PredictionCollector` gathers every tensor a ``predict_step`` returns from all processes, drops
the duplicates a distributed sampler may add and orders the samples by dataset index, so the result is
identical on 1 and N processes.

:class:`PredictionCache` keeps those results on disk per (model weights, transform and data, κ): the key
is a digest of all of them, the file is written atomically, and a file whose key, content or shape does
not match is rejected (with a warning) and recomputed, never used.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from datamodules.io import atomic_write_bytes
from metrics import IndexedPredictions

INDEX_KEYS = ("targets", "indices")


class PredictionCollector(pl.Callback):
    """Gathers ``predict_step`` dict outputs: ``result[key]`` for every tensor key plus ``result["targets"]``."""

    def __init__(self) -> None:
        super().__init__()
        self.stores: dict[str, IndexedPredictions] = {}
        self.result: dict[str, Tensor] | None = None

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stores, self.result = {}, None

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not isinstance(outputs, dict) or not set(INDEX_KEYS) <= set(outputs):
            raise TypeError("PredictionCollector needs predict_step to return a dict with 'targets' and 'indices'")
        for key, value in outputs.items():
            if key not in INDEX_KEYS:
                store = self.stores.setdefault(key, IndexedPredictions().to(pl_module.device))
                store.update(value, outputs["targets"], outputs["indices"])

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        result: dict[str, Tensor] = {}
        for key in sorted(self.stores):  # the same order on every rank: the gathers are collective
            values, targets = self.stores[key].compute()
            result[key] = values.cpu()
            result["targets"] = targets.cpu()
        self.result = result


def cache_key(**parts: Any) -> str:
    """sha256 of the JSON of everything that determines a cached result."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class PredictionCache:
    """Cached model outputs in ``directory``: ``<name>-<key prefix>.pt`` holding ``{"key", "meta", "tensors"}``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, name: str, key: str) -> Path:
        return self.directory / f"{name}-{key[:16]}.pt"

    def load(self, name: str, key: str, *, rows: int) -> dict[str, Tensor] | None:
        """The cached tensors, or ``None`` when absent or rejected (unreadable, other key, wrong shape)."""
        path = self.path(name, key)
        if not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated or foreign file
            return self._reject(path, f"unreadable ({type(error).__name__}: {error})")
        if not isinstance(payload, dict) or payload.get("key") != key:
            return self._reject(path, "its key does not match this model, data and confidence function")
        tensors = payload.get("tensors")
        if not isinstance(tensors, dict) or "targets" not in tensors:
            return self._reject(path, "it holds no tensors")
        wrong = {k: tuple(v.shape) for k, v in tensors.items() if not isinstance(v, Tensor) or v.shape[0] != rows}
        if wrong:
            return self._reject(path, f"expected {rows} rows, found shapes {wrong}")
        return tensors

    @staticmethod
    def _reject(path: Path, reason: str) -> None:
        warnings.warn(f"rejecting prediction cache {path}: {reason}; recomputing", RuntimeWarning, stacklevel=3)
        return None

    def save(self, name: str, key: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> Path:
        buffer = io.BytesIO()
        torch.save({"key": key, "meta": meta, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, buffer)
        return atomic_write_bytes(self.path(name, key), buffer.getvalue())
