"""Rebuilding a LightningModule from a checkpoint of ``train.py`` alone."""

from __future__ import annotations

import importlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch


class CheckpointError(ValueError):
    """A file that is not a readable checkpoint of the expected kind; the message names the file."""


def import_class(path: str) -> type:
    """``"package.module.Class"`` -> the class."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Class path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path!r}: {error}") from error


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dictionary (memory-mapped, on the CPU).

    Raises:
        FileNotFoundError: the file does not exist.
        CheckpointError: the file is truncated, is not a torch checkpoint, or holds something other than a
            checkpoint dictionary; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):
        # torch.save writes zip archives; anything else (a truncated copy, a text file, an old pickle) fails
        # inside torch with "mmap can only be used with files saved with ..."
        raise CheckpointError(
            f"{path} is not a readable checkpoint: it is not a torch.save archive (truncated or another kind "
            f"of file, {path.stat().st_size} bytes)"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, AttributeError,
            ModuleNotFoundError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(error).__name__}: {error})") from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path} is a torch file but not a Lightning checkpoint (found {type(checkpoint).__name__} "
            "without a 'state_dict')"
        )
    return checkpoint


def load_module(
    path: str | Path, checkpoint: dict[str, Any] | None = None, *, expected: type | None = None
) -> pl.LightningModule:
    """The LightningModule recorded in a checkpoint (``model_class``), with its trained weights.

    Pretrained backbone weights are not looked up again (``pretrained=False``): the checkpoint holds them.

    Args:
        path: the checkpoint file.
        checkpoint: its contents, if already read.
        expected: refuse a checkpoint whose model is not this class (or a subclass), naming both.
    """
    checkpoint = checkpoint if checkpoint is not None else read_checkpoint(path)
    class_path = checkpoint.get("model_class")
    if class_path is None:
        raise CheckpointError(f"checkpoint {path} has no 'model_class': it was not written by train.py")
    module_class = import_class(class_path)
    if expected is not None and not issubclass(module_class, expected):
        raise CheckpointError(
            f"checkpoint {path} holds a {class_path}, but a {expected.__module__}.{expected.__qualname__} is "
            "expected here"
        )
    overrides = {"pretrained": False} if "pretrained" in checkpoint.get("hyper_parameters", {}) else {}
    return module_class.load_from_checkpoint(path, map_location="cpu", **overrides)
