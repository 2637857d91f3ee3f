"""Artefacts that can be trusted: digests and fingerprints (of JSON-able descriptions, files on disk, tensors) for
cache keys, atomic writes (an artefact appears complete under its final name, or not at all), staging folders,
a writable-folder check before heavy work, and SIGTERM turned into an exit that runs the clean-up."""

from __future__ import annotations

import contextlib
import hashlib
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
