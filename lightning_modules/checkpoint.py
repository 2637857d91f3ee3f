"""Rebuilding a LightningModule from a checkpoint of ``train.py`` alone."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch


def import_class(path: str) -> type:
    """``"package.module.Class"`` -> the class."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Class path")
    return getattr(importlib.import_module(module), name)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dictionary (memory-mapped, on the CPU); a clear error when the file is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)


def load_module(path: str | Path, checkpoint: dict[str, Any] | None = None) -> pl.LightningModule:
    """The LightningModule recorded in a checkpoint (``model_class``), with its trained weights.

    Pretrained backbone weights are not looked up again (``pretrained=False``): the checkpoint holds them.
    """
    checkpoint = checkpoint if checkpoint is not None else read_checkpoint(path)
    class_path = checkpoint.get("model_class")
    if class_path is None:
        raise ValueError(f"checkpoint {path} has no 'model_class': it was not written by train.py")
    overrides = {"pretrained": False} if "pretrained" in checkpoint.get("hyper_parameters", {}) else {}
    return import_class(class_path).load_from_checkpoint(path, map_location="cpu", **overrides)
