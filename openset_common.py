"""Project-wide conventions and small helpers that every package may import (DESIGN.md §2–§3).

One home for what would otherwise be defined in several places:

- the label convention: known classes ``0..K-1``, negatives ``-1``, unknowns ``-2``;
- the background-class column: the last column of a ``(N, K+1)`` tensor, dropped without renormalising (and,
  where a distribution over the known classes is needed, its mass spread uniformly over them);
- digests and fingerprints (of JSON-able descriptions, files on disk, tensors) for cache keys;
- atomic writes: an artefact appears complete under its final name, or not at all;
- importing a class by its path, and checking arguments of a class by the types of its signature (the
  ``--data-arg`` of every command, before anything is built).

This module imports nothing from the rest of the project.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

KNOWN_MIN_LABEL = 0
NEGATIVE_LABEL = -1
UNKNOWN_LABEL = -2
LOWEST_LABEL = UNKNOWN_LABEL


def known_columns(values: Tensor, background: bool) -> Tensor:
    """The columns of the known classes: ``(N, K+1) -> (N, K)`` with ``background=True``, else unchanged.

    The background column is the last one; it is dropped *after* any softmax over all ``K+1`` columns,
    never renormalised away (DESIGN.md §3).
    """
    if not background:
        return values
    if values.ndim < 2 or values.shape[-1] < 2:
        raise ValueError(
            f"background=True needs at least 2 columns (K known + 1 background), got shape {tuple(values.shape)}"
        )
    return values[..., :-1]


def spread_background_mass(probs: Tensor) -> Tensor:
    """``(..., K+1) -> (..., K)``: ``p'_c = p_c + p_bg / K``, the background probability spread uniformly over
    the K known classes (it means "none of them"), so each row still sums to 1 and ``p_bg = 1`` is uniform."""
    known = known_columns(probs, True)
    return known + probs[..., -1:] / known.shape[-1]


def digest(payload: object) -> str:
    """sha256 of the canonical JSON of ``payload`` (keys sorted; non-JSON values by ``str``)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def files_fingerprint(root: str | os.PathLike, relative_paths: Iterable[str]) -> str:
    """A digest of the size and modification time (ns) of every listed file under ``root``.

    Re-encoding, replacing or touching an image changes it, so cached model outputs are never reused for
    other bytes. A missing file raises ``FileNotFoundError`` naming it.
    """
    hasher = hashlib.sha256()
    for relative in relative_paths:
        path = os.path.join(root, relative)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"image file {path} does not exist") from None
        hasher.update(f"{relative}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return hasher.hexdigest()


def tensors_fingerprint(tensors: Mapping[str, Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes of tensors (e.g. a ``state_dict``), in name order."""
    hasher = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        if not isinstance(tensor, Tensor):
            continue
        hasher.update(name.encode())
        hasher.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        hasher.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes (names a checkpoint in the outputs made from it)."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file next to ``path``, flush it to disk, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def import_object(path: str) -> Any:
    """``"package.module.Name"`` -> the object (a class, a function)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Name path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path!r}: {error}") from error


def typed_arguments(target: Any, arguments: dict[str, Any], *, what: str) -> dict[str, Any]:
    """Check ``arguments`` of a class (or function) by the types of its signature, before it is built:
    an unknown name, a float where an int is expected, a scalar where a list is expected are errors that
    name ``what``, the argument and the expected type. Returns the arguments as parsed."""
    from jsonargparse import ArgumentParser

    parameters = inspect.signature(target).parameters
    unknown = sorted(set(arguments) - set(parameters))
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        raise ValueError(f"{what} ({getattr(target, '__name__', target)}) has no arguments {unknown}; it takes "
                         f"{[n for n in parameters if n != 'self']}")
    parser = ArgumentParser(exit_on_error=False)
    typed = {name: value for name, value in arguments.items() if name in parameters}
    if inspect.isclass(target):
        parser.add_class_arguments(target, None, skip={n for n in parameters if n not in typed}, fail_untyped=False)
    else:
        parser.add_function_arguments(target, None, skip={n for n in parameters if n not in typed}, fail_untyped=False)
    try:
        parsed = parser.parse_object(typed)
    except Exception as error:  # jsonargparse's ArgumentError names the key and the expected type
        raise ValueError(f"{what}: {error}".replace("\n", " ")) from None
    return {name: parsed[name] for name in typed}
