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

import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import secrets
import signal
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
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
    """Write ``data`` to a temporary file next to ``path``, flush it to disk, then rename it into place.

    The file gets the permissions of any new file (0666 less the umask, e.g. 0644), not ``mkstemp``'s 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"cannot create a temporary file next to {path}")
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


def staging_folder(parent: str | os.PathLike, prefix: str) -> Path:
    """A new, empty folder ``<parent>/<prefix><host>.<pid>.<random>`` to build an artefact in before it is
    renamed into place.

    Unlike ``tempfile.mkdtemp`` (mode 0700) it gets the permissions of any new folder (0777 less the umask,
    e.g. 0755), so the renamed artefact is readable as the user's other files are. The name records the
    machine and the process that made it, which :func:`stale_staging_folders` reads back.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = parent / f"{prefix}{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            path.mkdir()  # mode 0o777, less the umask
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"cannot create a staging folder {prefix}* in {parent}")


def stale_staging_folders(parent: str | os.PathLike, prefix: str) -> list[Path]:
    """The staging folders of :func:`staging_folder` in ``parent`` made on this machine by a process that no
    longer runs (a run killed before it could clean up), sorted. Those of a running process, or of another
    machine (a shared disk), are not stale."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    stale = []
    for path in sorted(parent.glob(f"{prefix}*")):
        host_and_pid = path.name[len(prefix):].rpartition(".")[0]  # <host>.<pid>.<random>
        host, _, pid = host_and_pid.rpartition(".")
        if path.is_dir() and host == socket.gethostname() and pid.isdigit() and not _process_running(int(pid)):
            stale.append(path)
    return stale


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM (``kill <pid>``, a scheduler's time limit) raises ``SystemExit(143)`` instead
    of ending the process on the spot, so that ``finally`` clauses (removing a staging folder) run. Outside the
    main thread, where no handler can be set, the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _process_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_writable_folder(path: str | os.PathLike, *, what: str) -> Path:
    """Refuse a folder that could not be created or written, before anything is written: a file in the way
    (the folder itself or a parent), or a nearest existing folder without write permission. Creates nothing.

    Raises:
        NotADirectoryError: ``{what} goes to {path}, but {parent} is a file``.
        PermissionError: ``{what} goes to {path}, but {folder} cannot be written``.
    """
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(f"{what} goes to {path}, but {parent} is a file")
        if parent.exists():
            break
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} goes to {path}, but {existing} cannot be written")
    return path


def plugins(group: str, what: str) -> Iterator[tuple[str, str, Any]]:
    """``(name, origin, object)`` of each entry point of ``group`` (installed packages' plug-ins: methods,
    detectors): its name, how an error names it (``origin``: ``the <what> '<name>' of entry point '<value>' (<group>, package <dist> <version>)``) and what it loads.

    Raises:
        ImportError: a plug-in that does not import, named (not a traceback of the import machinery).
    """
    import importlib.metadata

    for entry in importlib.metadata.entry_points(group=group):
        dist = getattr(entry, "dist", None)
        package = f", package {dist.name} {dist.version}" if dist is not None else ""
        origin = f"the {what} {entry.name!r} of entry point {entry.value!r} ({group}{package})"
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 - any error of a plug-in's import is named with it
            raise ImportError(f"{origin} does not import: {error}") from error
        yield entry.name, origin, loaded


def import_object(path: str) -> Any:
    """``"package.module.Name"`` -> the object (a class, a function)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a module.Name path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path!r}: {error}") from error


def dataclass_of(cls: type, value: Any, *, what: str) -> Any:
    """An options dataclass ``cls`` from ``None`` (its defaults), a mapping of its field names (from Python or
    YAML: an unknown name is an error naming it and the options), or an instance of it."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"{what}: {unknown} are not options of {cls.__name__} (its options: {sorted(fields)})")
        return cls(**value)
    raise TypeError(f"{what} must be a {cls.__name__} or a mapping of its options, got {value!r}")


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
