"""A shard set: image files packed into Lightning's ``litdata`` chunks, read anywhere a folder is read.

A shard set is a read-only snapshot of image files under one root, addressed by the files' relative paths
(``n01440764/n01440764_10026.JPEG``), so every data set of the project that lists ``(relative path, label)``
rows under a root reads a shard set given as that root, in the same sample order, with the same labels and
the same fingerprint (:func:`openset_common.files_fingerprint` of the source files: their relative paths,
sizes and modification times are in the manifest, :meth:`ShardSet.stat`), so caches carry over.
The JPEG bytes are kept as written (no re-encoding); decoding stays the model transform's job.

Layout (``python -m datamodules.shards write`` makes it; :mod:`datamodules.shards`)::

    <shards>/shards.json             what the set is: its source, counts, parts, digests (written last)
    <shards>/manifest.csv            index,path,class,size,mtime_ns,sha256 of every image, in set order
    <shards>/index.npz               the reader's index: path keys (sorted), positions, sizes, mtimes
    <shards>/parts/00000/            one litdata data set per part (index.json + chunk-*.bin) ...
    <shards>/parts/00000/manifest.csv  ... with its rows of the manifest

Opening a set reads ``shards.json``; nothing walks a folder tree. ``shards.json`` records the runs of the
listing (:meth:`ShardSet.runs`: the whole listing and its sections, such as a pool's estimation and test
images) with their paths' digest and fingerprint, so rows that are one of them need nothing more; other rows
are looked up in ``index.npz``, about 28 bytes per image in memory (a 64-bit key, a 32-bit position, a
64-bit size and modification time), so 3.7M images (the ImageNet-21k pool) take about 100 MB. Listing folders of a set
(:meth:`ShardSet.listing`) reads the manifest once, on demand.

litdata is imported with its start-up version check off (it would ask PyPI for a newer release): no network.
Remote shard sets (``s3://...``) are read through litdata where its optional cloud dependencies are installed;
the project's tests and demo use local folders.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would ask PyPI for a newer version

SHARDS_FILE = "shards.json"
INDEX_FILE = "index.npz"
MANIFEST_FILE = "manifest.csv"
PARTS_DIR = "parts"
FORMAT = "openset-shards/1"
MANIFEST_COLUMNS = ("index", "path", "class", "size", "mtime_ns", "sha256")
CHUNK = 1 << 16  # rows per step of a lookup or a fingerprint: its temporaries stay a few MB at any size


class ShardError(RuntimeError):
    """A shard set that cannot be read as it says: missing, truncated, corrupt, or not matching its manifest."""


def path_keys(paths: list[str] | tuple[str, ...]) -> np.ndarray:
    """The 64-bit key of each relative path (blake2b, little-endian), as ``uint64``: the shard index is sorted
    by it."""
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(p.encode("utf-8"), digest_size=8).digest() for p in paths])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def paths_digest(paths: list[str] | tuple[str, ...]) -> str:
    """sha256 of the relative paths joined by NUL, in the order given (a path holds no NUL): one pass of C-level
    joins over chunks, so a data set of 3.7M rows knows in a fraction of a second whether its rows are a shard
    set's whole listing or one of its recorded runs, in set order (:meth:`ShardSet.run_of`)."""
    hasher = hashlib.sha256()
    for start in range(0, len(paths), CHUNK):
        if start:
            hasher.update(b"\0")
        hasher.update("\0".join(paths[start:start + CHUNK]).encode("utf-8"))
    return hasher.hexdigest()


def fingerprint_rows(hasher: Any, paths: list[str] | tuple[str, ...], sizes: np.ndarray, mtimes: np.ndarray) -> None:
    """Feed ``hasher`` the :func:`openset_common.files_fingerprint` lines of files whose sizes and modification
    times (ns) are known (a manifest's), without a ``stat`` per file; in chunks, so that only one chunk's
    Python integers and text exist at a time."""
    for start in range(0, len(paths), CHUNK):
        stop = start + CHUNK
        hasher.update("".join(f"{relative}\0{size}\0{mtime}\n" for relative, size, mtime in zip(
            paths[start:stop], sizes[start:stop].tolist(), mtimes[start:stop].tolist(), strict=True)).encode("utf-8"))


def listing_fingerprint(paths: list[str] | tuple[str, ...], sizes: np.ndarray, mtimes: np.ndarray) -> str:
    """:func:`openset_common.files_fingerprint` of files whose sizes and modification times are known."""
    hasher = hashlib.sha256()
    fingerprint_rows(hasher, paths, sizes, mtimes)
    return hasher.hexdigest()


def is_shard_set(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the root of a finished shard set (its ``shards.json`` exists)."""
    return os.path.isfile(os.path.join(path, SHARDS_FILE))


def shard_set_of(path: str | os.PathLike) -> tuple[ShardSet, str] | None:
    """The shard set that ``path`` lies in and the path's folder relative to the set's root (``""`` for the
    root itself), or ``None`` for a path of the file system."""
    path = os.path.abspath(path)
    if os.path.isdir(path) and not is_shard_set(path):
        return None  # a real folder (the folders inside a shard set exist only in its manifest)
    for depth, candidate in enumerate((path, *map(str, Path(path).parents))):
        if depth > 6:
            break
        if is_shard_set(candidate):
            relative = os.path.relpath(path, candidate)
            return ShardSet.open(candidate), "" if relative == "." else Path(relative).as_posix()
    return None


def _stamp(root: str) -> tuple[int, int]:
    info = os.stat(os.path.join(root, SHARDS_FILE))
    return info.st_size, info.st_mtime_ns


class ShardSet:
    """A finished shard set, opened for reading (see the module docstring). Open with :meth:`open`.

    Picklable for loader workers: the index arrays and litdata readers are rebuilt in each process on first
    use, so a worker receives only the root and the metadata.
    """

    def __init__(self, root: str, meta: dict[str, Any]) -> None:
        self.root = root
        self.meta = meta
        self.parts: list[dict[str, Any]] = meta["parts"]
        self.starts = np.cumsum([0] + [int(p["count"]) for p in self.parts])
        self._index: dict[str, np.ndarray] | None = None
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._listing: dict[str, list[str]] | None = None

    @staticmethod
    def open(root: str | os.PathLike) -> ShardSet:
        """The shard set at ``root`` (opened once per process while its ``shards.json`` is unchanged).

        Raises:
            ShardError: ``root`` holds no finished shard set, or its ``shards.json`` is not one.
        """
        root = os.path.abspath(root)
        if not is_shard_set(root):
            partial = os.path.isdir(os.path.join(root, PARTS_DIR))
            raise ShardError(f"shard set {root}: no {SHARDS_FILE} there"
                             + (" (a write that has not finished: run `python -m datamodules.shards write` again to "
                                "continue it)" if partial else
                                " (write one with `python -m datamodules.shards write --out " + root + "`)"))
        return _open(root, _stamp(root))

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["meta"])  # type: ignore[misc]

    def __len__(self) -> int:
        return int(self.meta["count"])

    def __repr__(self) -> str:
        return f"ShardSet({self.root!r}, {len(self)} images, {len(self.parts)} parts)"

    @property
    def source(self) -> dict[str, Any]:
        """What the set was written from (kind, root, the rows' digest, ...)."""
        return self.meta["source"]

    # -- the index --------------------------------------------------------------------------------

    @property
    def index(self) -> dict[str, np.ndarray]:
        if self._index is None:
            path = os.path.join(self.root, INDEX_FILE)
            try:
                with np.load(path) as stored:
                    index = {name: stored[name] for name in ("keys", "positions", "sizes", "mtimes")}
            except (OSError, ValueError, KeyError) as error:
                raise ShardError(f"shard set {self.root}: cannot read its index {path} ({error}); write the set again") from error
            if len(index["keys"]) != len(self):
                raise ShardError(f"shard set {self.root}: its index holds {len(index['keys'])} images, {SHARDS_FILE} "
                                 f"says {len(self)}; write the set again")
            self._index = index
        return self._index

    def runs(self) -> list[dict[str, Any]]:
        """The runs of the set's listing it recorded when written: the whole listing, then its sections (a
        pool's estimation and test images, a protocol's splits), each ``{"name", "start", "count",
        "paths_sha256", "files_fingerprint"}``. A set written before it recorded its listing has none."""
        listing = self.meta.get("listing")
        if listing is None:
            return []
        whole = {"name": "", "start": 0, "count": len(self), "paths_sha256": listing["paths_sha256"],
                 "files_fingerprint": listing["files_fingerprint"]}
        return [whole, *listing.get("sections", [])]

    def run_of(self, paths: list[str]) -> dict[str, Any] | None:
        """The recorded run (:meth:`runs`) that ``paths`` are, in its order, or ``None``: then path ``i`` is at
        position ``start + i`` and the paths' fingerprint is the run's, with no lookup and no stat. One digest
        of the paths, computed only when a run has their count."""
        candidates = [run for run in self.runs() if run["count"] == len(paths)]
        if not candidates:
            return None
        digest = paths_digest(paths)
        return next((run for run in candidates if run["paths_sha256"] == digest), None)

    def run_positions(self, run: dict[str, Any]) -> np.ndarray:
        """The set positions of a recorded run, ``start .. start + count - 1`` (uint32 below 2**32 images)."""
        return np.arange(run["start"], run["start"] + run["count"], dtype=np.uint32 if len(self) < 2**32 else np.int64)

    def positions(self, paths: list[str], *, what: str) -> np.ndarray:
        """The set position of each relative path, in the order given: ``start .. start + n - 1`` for a recorded
        run of the listing (:meth:`run_of`), else a lookup in the sorted keys, 65,536 paths at a time.

        Raises:
            ShardError: naming ``what``, the set, its source, how many paths it lacks and the first of them.
        """
        run = self.run_of(paths)
        if run is not None:
            return self.run_positions(run)
        index = self.index
        keys_of_set = index["keys"]
        # the set's own positions dtype (uint32 below 2**32 images): 4 bytes a row at 3.7M rows
        positions = np.empty(len(paths), dtype=index["positions"].dtype)
        missing: list[str] = []
        count = 0
        for start in range(0, len(paths), CHUNK):
            keys = path_keys(paths[start:start + CHUNK])
            found = np.searchsorted(keys_of_set, keys).clip(max=max(len(keys_of_set) - 1, 0))
            hit = keys_of_set[found] == keys if len(keys_of_set) else np.zeros(len(keys), dtype=bool)
            if not hit.all():
                count += int((~hit).sum())
                missing += [paths[start + i] for i in np.flatnonzero(~hit)[:5 - len(missing)]]
            if not count:
                positions[start:start + len(keys)] = index["positions"][found]
        if count:
            asked = hashlib.sha256("\n".join(paths).encode("utf-8")).hexdigest()
            raise ShardError(f"{what}: the shard set {self.root} ({self.describe_source()}) does not hold "
                             f"{count} of its {len(paths)} images (their paths' fingerprint {asked[:16]}; "
                             f"first missing: {missing}); shards are read "
                             "only for the rows they were written from: write the shards of this set with "
                             "`python -m datamodules.shards write`")
        return positions

    def describe_source(self) -> str:
        source = self.source
        detail = ", ".join(f"{k} {v}" for k, v in source.items() if k not in ("rows_digest",))
        return f"written from {detail}; rows fingerprint {source['rows_digest'][:16]}"

    def stat(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sizes, modification times in ns)`` of the source files of set positions, from the manifest."""
        return self.index["sizes"][positions], self.index["mtimes"][positions]

    # -- reading ----------------------------------------------------------------------------------

    def _reader(self, part: int) -> Any:
        reader = self._readers.get(part)
        if reader is None:
            with self._lock:
                reader = self._readers.get(part)
                if reader is None:
                    from litdata import StreamingDataset

                    folder = os.path.join(self.root, PARTS_DIR, self.parts[part]["name"])
                    if not os.path.isfile(os.path.join(folder, "index.json")):
                        raise ShardError(f"shard set {self.root}: part {folder} is missing (its index.json is not "
                                         "there); copy the whole set, or write it again")
                    reader = StreamingDataset(folder)
                    self._readers[part] = reader
        return reader

    def locate(self, position: int) -> tuple[int, int]:
        """``(part, index within the part)`` of a set position."""
        part = int(np.searchsorted(self.starts, position, side="right")) - 1
        return part, int(position - self.starts[part])

    def read(self, position: int, path: str) -> bytes:
        """The stored bytes of the image at ``position``, which must be ``path``.

        Raises:
            ShardError: the part cannot be read there (truncated or corrupt; the message names the part, the
                sample and its path), or the sample there is another image (the manifest does not match the
                shards).
        """
        part, local = self.locate(position)
        where = f"shard set {self.root}, part {self.parts[part]['name']}, sample {local} ({path})"
        try:
            item = self._reader(part)[local]
        except ShardError:
            raise
        except Exception as error:  # litdata raises many kinds for a truncated or corrupt chunk
            raise ShardError(f"cannot read {where}: {type(error).__name__}: {error}; the part is truncated or "
                             "corrupt: verify the set (`python -m datamodules.shards verify`) and write it again") from error
        if item.get("path") != path or int(item.get("index", -1)) != position:
            raise ShardError(f"{where}: the shards hold {item.get('path')!r} (image {item.get('index')}) there: the "
                             "manifest does not match its shards; write the set again")
        return bytes(item["image"])

    # -- listing ----------------------------------------------------------------------------------

    def manifest_rows(self) -> list[dict[str, str]]:
        """The rows of the manifest, in set order."""
        with open(os.path.join(self.root, MANIFEST_FILE), newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))

    def listing(self) -> dict[str, list[str]]:
        """Folder (relative, ``""`` for the root) -> the names of the files directly in it, sorted; every
        ancestor folder of a file is listed too (read from the manifest once)."""
        if self._listing is None:
            folders: dict[str, list[str]] = {}
            for row in self.manifest_rows():
                parent, _, name = row["path"].rpartition("/")
                folders.setdefault(parent, []).append(name)
                while parent:
                    parent = parent.rpartition("/")[0]
                    folders.setdefault(parent, [])
            self._listing = {folder: sorted(names) for folder, names in folders.items()}
        return self._listing

    def subfolders(self, folder: str) -> list[str]:
        """The names of the folders directly in ``folder`` (relative to the set's root), sorted."""
        prefix = f"{folder}/" if folder else ""
        return sorted({f[len(prefix):].split("/")[0] for f in self.listing() if f.startswith(prefix) and f != folder})

    def files(self, folder: str) -> list[str]:
        """The names of the files directly in ``folder`` (relative to the set's root), sorted."""
        return list(self.listing().get(folder, []))

    def is_folder(self, folder: str) -> bool:
        return folder in self.listing()


@lru_cache(maxsize=16)
def _open(root: str, stamp: tuple[int, int]) -> ShardSet:
    try:
        meta = json.loads(Path(root, SHARDS_FILE).read_text())
    except (OSError, ValueError) as error:
        raise ShardError(f"shard set {root}: cannot read {SHARDS_FILE} ({error})") from error
    if meta.get("format") != FORMAT:
        raise ShardError(f"shard set {root}: {SHARDS_FILE} is of format {meta.get('format')!r}, not {FORMAT!r}")
    return ShardSet(root, meta)
