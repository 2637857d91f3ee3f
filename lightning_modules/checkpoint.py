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


# Modules that moved when the packages were arranged by paper; checkpoints written before record the old
# paths (the classes themselves did not change).
MOVED_MODULES = {
    "lightning_modules.generators": "lightning_modules.generated.generators",
    "lightning_modules.networks": "lightning_modules.nets.backbones",
    "lightning_modules.ensemble": "lightning_modules.nets.ensemble",
    "lightning_modules.perceptual": "lightning_modules.nets.lpips",
    "lightning_modules.generator_networks": "lightning_modules.nets.gans",
    "datamodules.ood_images": "datamodules.evg",
    "datamodules.base": "datamodules.open_set",
}


def import_class(path: str) -> type:
    """``"package.module.Class"`` -> the class (also under a module path of before the move, see
    :data:`MOVED_MODULES`)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Class path")
    module = MOVED_MODULES.get(module, module)
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


def record_run(module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Everything ``evaluate.py`` needs to rebuild a run from its checkpoint alone (model and datamodule
    classes), and what ``train.py fit --ckpt_path`` needs to resume logging into the same logger run."""
    checkpoint["model_class"] = class_path(module)
    datamodule = getattr(module.trainer, "datamodule", None) if module._trainer is not None else None
    if datamodule is not None:
        checkpoint["datamodule_class"] = class_path(datamodule)
    if module.logger is not None:
        checkpoint["logger_version"] = module.logger.version


def class_path(obj: object) -> str:
    """The public path of an object's class: ``package.Name`` when the top-level package exports it (the
    project's classes: ``lightning_modules.ShiftGenerator``), else ``module.QualifiedName``. Checkpoints
    record it, so they do not depend on the module a class lives in."""
    cls = type(obj)
    package = cls.__module__.partition(".")[0]
    try:
        if getattr(importlib.import_module(package), cls.__qualname__, None) is cls:
            return f"{package}.{cls.__qualname__}"
    except ImportError:
        pass
    return f"{cls.__module__}.{cls.__qualname__}"
