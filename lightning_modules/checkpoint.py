"""Checkpoint I/O: reading a checkpoint of ``train.py`` safely, rebuilding its LightningModule and datamodule
from it alone, and recording in it what that needs.

Every checkpoint records (:func:`record_run`) the public class paths of its model and datamodule, the
datamodule's arguments (Lightning's ``datamodule_hyper_parameters``), the known classes in label order
(``classes``: wnids or names) and the logger version. :func:`read_checkpoint` checks the archive's CRCs
before anything is loaded, so damaged tensor bytes are an error, never a model that silently evaluates to
other numbers; :func:`load_run` refuses evaluation data whose classes are not the checkpoint's, naming both.
"""

from __future__ import annotations

import importlib
import io
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from openset_common.typed import import_object, parameter_names


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
    return import_object(f"{MOVED_MODULES.get(module, module)}.{name}")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dictionary (memory-mapped, on the CPU).

    Raises:
        FileNotFoundError: the file does not exist.
        CheckpointError: the file is truncated, is not a torch checkpoint, its bytes do not match the archive's
            CRCs (damaged on disk or in a copy), or it holds something other than a checkpoint dictionary;
            the message names the file.
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
    check_archive(path)
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


_VERIFIED: set[tuple[str, int, int]] = set()


WEIGHT_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks")
"""The keys of a Lightning checkpoint that hold tensors of the run (weights, optimiser and loop state)."""


def checkpoint_record(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint says of its run without its tensors (:data:`WEIGHT_KEYS` left out): its hyper-parameters,
    its datamodule's class and arguments, its classes. Kept by a built model, so that its training data are
    rebuilt without reading the file again (:func:`datamodule_from_checkpoint` reads only these keys)."""
    return {key: value for key, value in checkpoint.items() if key not in WEIGHT_KEYS}


def check_archive(path: str | Path) -> None:
    """Verify every member of a checkpoint archive against its CRC-32 (once per file version and process).

    torch memory-maps tensors without reading them, so a damaged byte inside a tensor would otherwise load
    as a slightly different model.
    """
    path = Path(path)
    info = path.stat()
    stamp = (str(path.resolve()), info.st_size, info.st_mtime_ns)
    if stamp in _VERIFIED:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(error).__name__}: {error})") from error
    if damaged is not None:
        raise CheckpointError(f"{path} is damaged: the bytes of {damaged} do not match the archive's CRC (a "
                              "broken copy or disk); copy the checkpoint again")
    _VERIFIED.add(stamp)


def checkpoint_module_class(path: str | Path, checkpoint: dict[str, Any], *, expected: type | None = None,
                            hint: str | None = None) -> type:
    """The LightningModule class a checkpoint records (``model_class``), refused when not ``expected``.

    Raises:
        CheckpointError: no ``model_class`` (not written by ``train.py``), or a class that is not ``expected``
            (or a subclass of it), naming both and ``hint``.
    """
    class_path = checkpoint.get("model_class")
    if class_path is None:
        raise CheckpointError(f"checkpoint {path} has no 'model_class': it was not written by train.py")
    module_class = import_class(class_path)
    if expected is not None and not issubclass(module_class, expected):
        raise CheckpointError(
            f"checkpoint {path} holds a {class_path}, but a {expected.__module__}.{expected.__qualname__} is "
            f"expected here{': ' + hint if hint else ''}"
        )
    return module_class


def load_module(
    path: str | Path, checkpoint: dict[str, Any] | None = None, *, expected: type | None = None,
    hint: str | None = None,
) -> pl.LightningModule:
    """The LightningModule recorded in a checkpoint (``model_class``), with its trained weights.

    Pretrained backbone weights are not looked up again (``pretrained=False``): the checkpoint holds them.

    Args:
        path: the checkpoint file.
        checkpoint: its contents, if already read.
        expected: refuse a checkpoint whose model is not this class (or a subclass), naming both.
        hint: what to say when the class is not ``expected`` (e.g. "a classifier is expected here").
    """
    checkpoint = checkpoint if checkpoint is not None else read_checkpoint(path)
    module_class = checkpoint_module_class(path, checkpoint, expected=expected, hint=hint)
    hyper_parameters = checkpoint.get("hyper_parameters", {})
    overrides: dict[str, Any] = {"pretrained": False} if "pretrained" in hyper_parameters else {}
    if "_class_path" in hyper_parameters:  # LightningCLI's record of the class, maybe under a module path of before
        overrides["_class_path"] = f"{module_class.__module__}.{module_class.__qualname__}"
    taken, more = parameter_names(module_class)
    stray = [] if more else [k for k in hyper_parameters if not k.startswith("_") and k not in taken]
    if not stray:
        return module_class.load_from_checkpoint(path, map_location="cpu", **overrides)
    # keys the class does not take, which LightningCLI recorded (train.py's link of the data's num_classes into a
    # generator, whose options now come as **options): the checkpoint is loaded without them
    cleaned = {**checkpoint, "hyper_parameters": {k: v for k, v in hyper_parameters.items() if k not in stray}}
    buffer = io.BytesIO()
    torch.save(cleaned, buffer)
    buffer.seek(0)
    return module_class.load_from_checkpoint(buffer, map_location="cpu", **overrides)


def datamodule_from_checkpoint(checkpoint: dict[str, Any], path: str | Path,
                               overrides: dict[str, Any] | None = None) -> pl.LightningDataModule:
    """The datamodule a checkpoint was trained with, rebuilt from its class and arguments (reads no data).

    Args:
        overrides: arguments to change (e.g. the ImageNet root on another machine); an unknown one is refused.
    """
    for key in ("datamodule_class", "datamodule_hyper_parameters"):
        if key not in checkpoint:
            raise CheckpointError(f"checkpoint {path} has no {key!r}: it was not written by train.py with a datamodule")
    # LightningCLI records bookkeeping keys such as "_class_path" next to the arguments
    saved = {k: v for k, v in checkpoint["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    datamodule_class = import_class(checkpoint["datamodule_class"])
    parameters, takes_any = parameter_names(datamodule_class)
    if "known" in parameters and saved.get("known", False) is None and checkpoint.get("classes"):
        # LightningCLI records the arguments as given: known classes found by listing the training folders
        # (class folders' default) are the checkpoint's recorded classes, so the datamodule is rebuilt without
        # listing them again (from another folder, on another machine, the training root need not be there)
        saved["known"] = list(checkpoint["classes"])
    unknown = sorted(set(overrides or {}) - set(parameters))
    if unknown and not takes_any:
        raise ValueError(f"{datamodule_class.__name__} (the datamodule of {path}) has no arguments {unknown}; it takes "
                         f"{sorted(parameters)}")
    return datamodule_class(**{**saved, **(overrides or {})})


def checkpoint_classes(checkpoint: dict[str, Any], path: str | Path) -> list[str] | None:
    """The known classes a checkpoint was trained on, in label order: recorded by :func:`record_run`, or (a
    checkpoint written before it recorded them) those of its datamodule rebuilt from its arguments."""
    if checkpoint.get("classes") is not None:
        return list(checkpoint["classes"])
    if "datamodule_class" not in checkpoint:
        return None
    names = getattr(datamodule_from_checkpoint(checkpoint, path), "class_names", None)
    return list(names) if names is not None else None


def check_classes(model_classes: Sequence[str] | None, data_classes: Sequence[str] | None, *, model: str,
                  data: str, subset: bool = False) -> None:
    """Refuse data whose known classes (in label order) are not the model's, naming both lists.

    Either list unknown (``None``): nothing to compare (the callers then compare the logit count).

    Args:
        subset: accept data whose classes are all among the model's (an ImageNet-1k model on protocol P1's
            known classes); :func:`class_indices` translates the labels.
    """
    if model_classes is None or data_classes is None or list(model_classes) == list(data_classes):
        return
    if subset and set(data_classes) <= set(model_classes):
        return
    only_model = [c for c in model_classes if c not in set(data_classes)]
    only_data = [c for c in data_classes if c not in set(model_classes)]
    detail = (f"{len(only_model)} classes only in the model ({', '.join(only_model[:5])}"
              f"{', ...' if len(only_model) > 5 else ''}), {len(only_data)} only in the data "
              f"({', '.join(only_data[:5])}{', ...' if len(only_data) > 5 else ''})"
              if only_model or only_data else "the same classes in another order, so label i means another class")
    raise ValueError(f"{model} was trained on other classes than {data} holds: {detail}. The model's classes: "
                     f"{list(model_classes)}; the data's: {list(data_classes)}")


def class_indices(model_classes: Sequence[str] | None, data_classes: Sequence[str] | None) -> Tensor | None:
    """The model's column of each data label (``data label i`` -> ``model class``), or ``None`` when the labels
    are already the model's (the same classes, or either list unknown)."""
    if model_classes is None or data_classes is None or list(model_classes) == list(data_classes):
        return None
    column = {name: i for i, name in enumerate(model_classes)}
    missing = [name for name in data_classes if name not in column]
    if missing:
        raise ValueError(f"the model has no class {missing[:5]} of the data")
    return torch.tensor([column[name] for name in data_classes], dtype=torch.long)


def load_run(path: str | Path, overrides: dict[str, Any] | None = None, *, expected: type | None = None,
             hint: str | None = None) -> tuple[pl.LightningModule, pl.LightningDataModule, dict[str, Any]]:
    """``(model, datamodule, checkpoint)`` of a checkpoint of ``train.py``: the model with its weights, and its
    datamodule with ``overrides``; a datamodule of other known classes than the model's is refused, and with
    ``expected`` a model of another class (:func:`load_module`, ``hint`` saying what is needed instead)."""
    checkpoint = read_checkpoint(path)
    checkpoint_module_class(path, checkpoint, expected=expected, hint=hint)  # before the datamodule is built
    datamodule = datamodule_from_checkpoint(checkpoint, path, overrides)
    model = load_module(path, checkpoint, expected=expected, hint=hint)
    names = getattr(datamodule, "class_names", None)
    check_classes(checkpoint_classes(checkpoint, path), list(names) if names is not None else None,
                  model=f"checkpoint {path}", data=f"its datamodule with {overrides or {}}")
    return model, datamodule, checkpoint


def record_run(module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Everything ``evaluate.py`` needs to rebuild a run from its checkpoint alone (model and datamodule
    classes, the known classes), and what ``train.py fit --ckpt_path`` needs to resume logging into the same
    logger run."""
    checkpoint["model_class"] = class_path(module)
    datamodule = getattr(module.trainer, "datamodule", None) if module._trainer is not None else None
    if datamodule is not None:
        checkpoint["datamodule_class"] = class_path(datamodule)
        names = getattr(datamodule, "class_names", None)
        if names is not None:
            checkpoint["classes"] = list(names)
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
