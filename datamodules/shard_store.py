"""A shard set: image files packed into Lightning's ``litdata`` chunks, read anywhere a folder is read.

A shard set is a read-only snapshot of image files under one root, addressed by the files' relative paths
(``n01440764/n01440764_10026.JPEG``), so every data set of the project that lists ``(relative path, label)``
rows under a root reads a shard set given as that root, in the same sample order, with the same labels and
the same fingerprint (:func:`openset_common.files_fingerprint` of the source files: their relative paths,
sizes and modification times are in the manifest, :meth:`ShardSet.stat`), so caches carry over.
The JPEG bytes are kept as written (no re-encoding); decoding stays the model transform's job.

Layout (``python -m datamodules.shards write`` makes it; :mod:`datamodules.shards`)::

    <shards>/shards.json             what the set is: its source, counts, parts, runs, the digests of the files
                                     below and of its own content (written last)
    <shards>/manifest.csv            index,path,class,size,mtime_ns,sha256,xxh3_64 of every image, in set order
    <shards>/index.npz               the reader's index: path keys (sorted), positions, sizes, mtimes, and the
                                     xxh3_64 digest of every image's bytes (in set order); and the set's identity
    <shards>/parts/00000/            one litdata data set per part (index.json + chunk-*.bin) ...
    <shards>/parts/00000/manifest.csv  ... with its rows of the manifest

Opening a set reads ``shards.json``, checks it against its own digest (an edited listing, run or fingerprint
is refused there) and against the identity ``index.npz`` was written with (one small array of it: a
``shards.json`` copied whole from another set is refused there); nothing walks a folder tree. The identity is
the digest of what ``shards.json`` records of the set's other files (the manifest's digest, the index arrays'
digests, the parts), so the two files of one write agree, and those of two sets of other content do not.
``shards.json`` records the runs of the listing (:meth:`ShardSet.runs`: the whole listing and its sections,
such as a pool's estimation and test images) with their paths' digest and fingerprint, so rows that are one of
them need nothing more; other rows are looked up in ``index.npz``, about 28 bytes per image in memory (a
64-bit key, a 32-bit position, a 64-bit size and modification time), so 3.7M images (the ImageNet-21k pool)
take about 100 MB. Listing folders of a set (:meth:`ShardSet.listing`) reads the manifest once, on demand.

What is checked, and when (each file is trusted only once checked against the digest ``shards.json`` records):
``shards.json`` at open (a digest of a few KB, and the identity array of ``index.npz``); each array of
``index.npz`` when it is loaded (sha256 of its bytes); ``manifest.csv`` when it is read (sha256 while it is
parsed); every image's bytes when they are read (:meth:`ShardSet.read`: xxh3_64, about 2 µs for a 112 KB JPEG,
against the digest recorded at write time, before anything decodes them), so a set never serves bytes it was
not written with. The per-image digests take 8 bytes an image (28 MB at 3.7M), loaded by a process when it
reads its first image. The runs are checked against the manifest when written and by ``verify``.

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
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from openset_common.artefacts import digest

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would ask PyPI for a newer version

SHARDS_FILE = "shards.json"
INDEX_FILE = "index.npz"
MANIFEST_FILE = "manifest.csv"
PARTS_DIR = "parts"
FORMAT = "openset-shards/3"
OLDER_FORMATS = {  # what a set of an older format lacks, said when it is refused
    "openset-shards/1": "a set whose reads are not checked against a digest of every image",
    "openset-shards/2": f"a set whose {SHARDS_FILE} is not bound to its {INDEX_FILE}",
}
MANIFEST_COLUMNS = ("index", "path", "class", "size", "mtime_ns", "sha256", "xxh3_64")
LOOKUP_ARRAYS = ("keys", "positions", "sizes", "mtimes")  # what a lookup of rows and their fingerprint load
DIGESTS_ARRAY = "xxh3_64"  # what a read loads: the digest of every image's bytes, in set order
INDEX_ARRAYS = (*LOOKUP_ARRAYS, DIGESTS_ARRAY)
SELF_DIGEST = "shards_sha256"  # the field of shards.json that holds the digest of its other fields
IDENTITY = "identity"  # in shards.json and as an array of index.npz: which write the two files come from
CHUNK = 1 << 16  # rows per step of a lookup or a fingerprint: its temporaries stay a few MB at any size


class ShardError(RuntimeError):
    """A shard set that cannot be read as it says: missing, truncated, corrupt, or not matching its manifest."""


def sample_digest(data: bytes) -> int:
    """The digest recorded for every image's bytes and checked on every read: xxh3_64 as an integer.

    Chosen by measurement (``benchmarks/data_throughput.py``): 1.9 µs for a 112 KB JPEG, against 27 µs for
    ``zlib.crc32``, 63 µs for sha256 and 119 µs for blake2b on this machine, while decoding and transforming that
    JPEG takes about 3 ms; 64 bits, so a corrupt image passes by chance once in 2**64. The manifest keeps
    every image's sha256 as well, for ``verify --full`` and for comparing the source's bytes.
    """
    return xxhash.xxh3_64_intdigest(data)


def array_digest(array: np.ndarray) -> str:
    """sha256 of an index array's dtype, shape and bytes: what ``shards.json`` records of each array of
    ``index.npz``, checked when the array is loaded."""
    hasher = hashlib.sha256(f"{array.dtype.str}{tuple(array.shape)}".encode())
    hasher.update(np.ascontiguousarray(array).data)
    return hasher.hexdigest()


def signed(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the digest of its other fields (canonical JSON) as :data:`SELF_DIGEST`, checked at open:
    the runs, fingerprints and digests a set reports are the ones its write recorded."""
    unsigned = {key: value for key, value in meta.items() if key != SELF_DIGEST}
    return {**unsigned, SELF_DIGEST: digest(unsigned)}


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
        self._digests: np.ndarray | None = None
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._listing: dict[str, list[str]] | None = None

    @staticmethod
    def open(root: str | os.PathLike) -> ShardSet:
        """The shard set at ``root`` (opened once per process while its ``shards.json`` is unchanged).

        Raises:
            ShardError: ``root`` holds no finished shard set, or its ``shards.json`` is not one: unreadable, of
                another format (the message gives the command that rewrites it), or not matching its own digest.
        """
        root = os.path.abspath(root)
        if not is_shard_set(root):
            partial = os.path.isdir(os.path.join(root, PARTS_DIR))
            what = ("a write that has not finished: run the same `python -m datamodules.shards write` again to "
                    "continue it" if partial else
                    "not a shard set" + (", a folder of files" if os.path.isdir(root) else ", no such folder")
                    + ": to make one from a folder of images, `python -m datamodules.shards write --folder <the image "
                    "folder> --out <a new folder>`")
            raise ShardError(f"shard set {root}: no {SHARDS_FILE} there ({what})")
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

    def load_arrays(self, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Arrays of ``index.npz``, each checked against the digest ``shards.json`` records of it and against the
        set's image count (only the arrays named are read).

        Raises:
            ShardError: naming ``index.npz`` and the array: missing, unreadable, or not the array written.
        """
        arrays = read_index(self.root, names, advice=self.rewrite())
        recorded = self.meta["index_sha256"]
        for name, array in arrays.items():
            if array_digest(array) != recorded.get(name) or len(array) != len(self):
                raise ShardError(f"shard set {self.root}: its index {Path(self.root, INDEX_FILE)} is not the one "
                                 f"written (its array {name!r} does not match the digest {SHARDS_FILE} records); "
                                 f"{self.rewrite()}")
        return arrays

    @property
    def index(self) -> dict[str, np.ndarray]:
        """The lookup arrays (:data:`LOOKUP_ARRAYS`) of ``index.npz``, loaded and checked on first use."""
        if self._index is None:
            self._index = self.load_arrays(LOOKUP_ARRAYS)
        return self._index

    @property
    def digests(self) -> np.ndarray:
        """The xxh3_64 digest of every image's bytes, in set order (``uint64``, 8 bytes an image), loaded and
        checked on the first read of this process: what :meth:`read` compares each image's bytes with."""
        if self._digests is None:
            with self._lock:
                if self._digests is None:
                    self._digests = self.load_arrays((DIGESTS_ARRAY,))[DIGESTS_ARRAY]
        return self._digests

    def runs(self) -> list[dict[str, Any]]:
        """The runs of the set's listing it recorded when written: the whole listing, then its sections (a
        pool's estimation and test images, a protocol's splits), each ``{"name", "start", "count",
        "paths_sha256", "files_fingerprint"}``, checked against the manifest when written and by ``verify``;
        their digest and fingerprint are trusted once ``shards.json`` matched its own digest and the identity of
        the set's index at open."""
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
            slots = np.searchsorted(keys_of_set, keys).clip(max=max(len(keys_of_set) - 1, 0))
            hit = keys_of_set[slots] == keys if len(keys_of_set) else np.zeros(len(keys), dtype=bool)
            if not hit.all():
                count += int((~hit).sum())
                missing += [paths[start + i] for i in np.flatnonzero(~hit)[:5 - len(missing)]]
            if not count:
                positions[start:start + len(keys)] = index["positions"][slots]
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

    def rewrite(self, *, full: bool = False) -> str:
        """What to do about a set that does not read as written: the command that rewrites what is wrong."""
        return f"rewrite it with `{write_command(self.source, self.root, full=full)}`"

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
                                         f"there); copy the whole set, or {self.rewrite()}")
                    reader = StreamingDataset(folder)
                    self._readers[part] = reader
        return reader

    def locate(self, position: int) -> tuple[int, int]:
        """``(part, index within the part)`` of a set position."""
        part = int(np.searchsorted(self.starts, position, side="right")) - 1
        return part, int(position - self.starts[part])

    def stored_bytes(self, position: int, path: str, *, recorded: int | None = None) -> bytes:
        """The bytes stored at ``position``, which must be ``path``, as the part holds them; checked against the
        xxh3_64 ``recorded`` when it is given (:meth:`read`; only a benchmark of that check reads unchecked).

        Raises:
            ShardError: naming the set, the part, the sample and its path (:func:`read_sample`): the part cannot be
                read there (truncated or corrupt), the sample there is another image (the manifest does not match
                the shards), or its bytes are not ``recorded``.
        """
        part, local = self.locate(position)
        return read_sample(self._reader(part), local, position=position, path=path, recorded=recorded,
                           where=sample_name(self.root, self.parts[part]["name"], local, path),
                           advice=self.rewrite(full=True))

    def read(self, position: int, path: str) -> bytes:
        """The bytes of the image at ``position``, which must be ``path``, checked against the digest recorded
        when the set was written (:func:`sample_digest`) before anyone decodes them (:meth:`stored_bytes`)."""
        return self.stored_bytes(position, path, recorded=int(self.digests[position]))

    # -- listing ----------------------------------------------------------------------------------

    def manifest_rows(self) -> list[dict[str, str]]:
        """The rows of the manifest, in set order, once its bytes are checked against the sha256 ``shards.json``
        records (hashed as they are parsed: one read of the file).

        Raises:
            ShardError: naming ``manifest.csv``: missing, or not the manifest written (a row edited or deleted).
        """
        path = os.path.join(self.root, MANIFEST_FILE)
        hasher = hashlib.sha256()

        def lines(handle: Any) -> Any:
            for line in handle:
                hasher.update(line)
                yield line.decode("utf-8")

        try:
            with open(path, "rb") as handle:
                rows = list(csv.DictReader(lines(handle)))
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            raise ShardError(f"shard set {self.root}: cannot read its manifest {path} ({type(error).__name__}: "
                             f"{error}); {self.rewrite()}") from error
        if hasher.hexdigest() != self.meta["manifest_sha256"]:
            raise ShardError(f"shard set {self.root}: its manifest {path} is not the one written (its sha256 is not "
                             f"the one {SHARDS_FILE} records: a row edited or deleted?); {self.rewrite()}")
        return rows

    def listing(self) -> dict[str, list[str]]:
        """Folder (relative, ``""`` for the root) -> the names of the files directly in it, sorted; every
        ancestor folder of a file is listed too (read from the manifest once, checked: :meth:`manifest_rows`)."""
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


def sample_name(root: str | os.PathLike, part: str, local: int, path: str) -> str:
    """``shard set ROOT, part NNNNN, sample K (PATH)``: how errors name an image of a set."""
    return f"shard set {root}, part {part}, sample {local} ({path})"


def read_sample(reader: Any, local: int, *, position: int, path: str, recorded: int | None, where: str,
                advice: str = "") -> bytes:
    """The bytes of sample ``local`` of a part (``reader``: its litdata ``StreamingDataset``), which must be
    image ``position`` of the set at ``path`` with the xxh3_64 ``recorded`` (``None``: not checked): the one
    check of a sample, for a read (:meth:`ShardSet.read`) and for ``verify --full``.

    Raises:
        ShardError: ``where`` (:func:`sample_name`), what is wrong and ``advice``: the part cannot be read there
            (truncated or corrupt), the sample there is another image, or its bytes are not the ones written.
    """
    then = f"; {advice}" if advice else ""
    try:
        item = reader[local]
    except Exception as error:  # litdata raises many kinds for a truncated or corrupt chunk
        raise ShardError(f"cannot read {where}: {type(error).__name__}: {error}; the part is truncated or "
                         f"corrupt{then}") from error
    if item.get("path") != path or int(item.get("index", -1)) != position:
        raise ShardError(f"{where}: the shards hold {item.get('path')!r} (image {item.get('index')}) there: the "
                         f"manifest does not match its shards{then}")
    data = bytes(item["image"])
    if recorded is not None and (actual := sample_digest(data)) != recorded:
        raise ShardError(f"{where}: its bytes are not the ones written (xxh3_64 {actual:016x}, recorded "
                         f"{recorded:016x}): the part is corrupt{then}")
    return data


def read_index(root: str, names: tuple[str, ...], *, advice: str) -> dict[str, np.ndarray]:
    """The arrays ``names`` of a set's ``index.npz``, as stored (only those are read; not checked).

    Raises:
        ShardError: naming ``index.npz``: missing, unreadable, or without one of the arrays; then ``advice``.
    """
    path = os.path.join(root, INDEX_FILE)
    try:
        with np.load(path) as stored:
            return {name: stored[name] for name in names}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ShardError(f"shard set {root}: cannot read its index {path} ({type(error).__name__}: {error}); "
                         f"{advice}") from error


def write_command(source: dict[str, Any], root: str, *, full: bool = False) -> str:
    """The command that writes a set from ``source`` into ``root`` again, with ``--update`` (what the user must
    fill in, such as a pool file's path, in angle brackets): it rewrites the parts that changed or do not verify
    (with ``full``: checking every byte) and the set's own files."""
    kind, where = source.get("kind"), source.get("root", "<source folder>")
    given = {"folder": f"--folder {where}", "pool": f"--pool-file <its pool file> --pool-root {where}",
             "protocol": f"--protocol {source.get('protocol')} --imagenet-root {where} --protocol-dir <its protocol "
                         "folder>"}.get(str(kind), "<its source>")
    return f"python -m datamodules.shards write {given} --out {root} --update" + (" --full" if full else "")


def read_meta(root: str) -> dict[str, Any]:
    """The content of a set's ``shards.json``, checked: its format, its own digest (:func:`signed`) and its
    identity against the one ``index.npz`` was written with (that one array of it is read: 0.1 ms).

    Raises:
        ShardError: naming ``shards.json``: unreadable, of another format (saying how to rewrite the set), not
            what its write recorded (edited or corrupt), or not written with the set's ``index.npz`` (another
            set's, copied whole); or naming ``index.npz``: missing or unreadable.
    """
    path = Path(root, SHARDS_FILE)
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        raise ShardError(f"shard set {root}: cannot read {path} ({error}); rewrite the set with "
                         f"`{write_command({}, root)}`") from error
    if meta.get("format") != FORMAT:
        source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
        lacks = OLDER_FORMATS.get(meta.get("format"), "not a format this version reads")  # type: ignore[arg-type]
        raise ShardError(f"shard set {root}: {path} is of format {meta.get('format')!r}, not {FORMAT!r} ({lacks}): "
                         f"rewrite it with `{write_command(source, root)}`")
    if signed(meta)[SELF_DIGEST] != meta.get(SELF_DIGEST):
        raise ShardError(f"shard set {root}: {path} is not the one its write recorded (its content does not match "
                         f"its own digest {SELF_DIGEST}: edited or corrupt); rewrite the set with "
                         f"`{write_command(meta.get('source') or {}, root)}`")
    advice = f"rewrite the set with `{write_command(meta.get('source') or {}, root)}`"
    actual, recorded = str(read_index(root, (IDENTITY,), advice=advice)[IDENTITY]), str(meta.get(IDENTITY))
    if actual != recorded:
        # one of the two files is another set's: its recorded source may not be this set's, so none is named
        raise ShardError(f"shard set {root}: {path} is not this set's: it was written with another {INDEX_FILE} "
                         f"(another set's {SHARDS_FILE}, copied?; it records the identity {recorded[:16]}, "
                         f"{INDEX_FILE} {actual[:16]}); write the set again from its own files with "
                         f"`{write_command({}, root)}`")
    return meta


@lru_cache(maxsize=16)
def _open(root: str, stamp: tuple[int, int]) -> ShardSet:
    return ShardSet(root, read_meta(root))
