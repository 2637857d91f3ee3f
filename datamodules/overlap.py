"""Whether a fit set holds images of the data a run evaluates on (a detector fitted on its test images).

A fitted detector (KNN, Mahalanobis, ViM, ...) fitted on images it is then tested on scores them as
in-distribution by construction: KNN with ``k = 1`` finds every such image as its own nearest neighbour (a
score of ``-0``). Users do this by accident (a ``val/`` folder given for ``train/``, a folder of symlinks to
the test folders), so the engine compares the fit set with every evaluation set of a run before its first pass
(:meth:`evaluation_engine.scoring.ScoringPasses.check_fit_overlap`) with :func:`find_overlap`.

Two images are the same image when they are

- **the same file**: for files, the same ``(st_dev, st_ino)`` of ``os.stat`` (which follows symlinks, so a
  symlink, a hard link and the path itself are one file); for rows of a shard set
  (:mod:`datamodules.shard_store`), the same set and position;
- **the same bytes**: a copy. Sizes are compared first (``os.stat``, or :meth:`ShardSet.stat` for shard
  rows), and only images whose size occurs in both sets are read: first their first :data:`HEAD_BYTES` bytes,
  then, where size and head both occur in both sets, the whole file (a shard row's stored bytes,
  :meth:`ImageFileDataset.encoded`, are its source file's). At ImageNet scale most sizes of the 50k test images
  also occur among the 1.28M training images, and the heads (which hold image data after the JPEG header)
  rule those out at a 4 KB read each; only true copies are read whole;
- for images held as tensors (:class:`TensorImageDataset`, generated sets, the Fashion-MNIST demo), **the same
  pixels**: a digest of each image as the set yields it (a ``uint8`` image as its float ``[0, 1]`` values, so
  one picture stored either way is one image) and its shape.

Files and tensors are not compared with each other (a decoded JPEG is not its tensor's bytes): such a pair of
sets is reported as not comparable, never as disjoint. ``Subset`` and ``ConcatDataset`` map through to the
images they hold, and so does a wrapper that keeps its samples (``.dataset`` of the same length, e.g. EvG's
resized OOD images); a data set of any other kind is not compared.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset

from datamodules.evaluation import EvaluationSet
from datamodules.images import ImageFileDataset, TensorImageDataset

HEAD_BYTES = 4096
"""The bytes of each same-size file read first; only files whose size and head both occur in both sets are
read whole."""
EXAMPLES = 5  # pairs named in an error or a note
DIGEST_SIZE = 16  # blake2b-128: a false match among 10^7 images has probability ~1e-25
READERS = 8  # threads that read files (I/O bound: the GIL is released while reading)
TENSOR_CHUNK = 4096  # tensor images converted to float per chunk (the Fashion-MNIST training split: 15 chunks)

How = Literal["same file", "same bytes", "same pixels"]


class FitOverlapError(ValueError):
    """A fit set holds images of an evaluation set of the run; the message names the count, the first pairs
    (both paths), both sets and how to fix or allow it."""


@dataclass
class Overlap:
    """The images a fit set shares with one evaluation set (:func:`find_overlap`).

    Attributes:
        fit, other: the sets' names; ``other_role`` the evaluation set's role.
        fit_root, other_root: where their images are (folders, shard sets, or ``in memory``).
        fit_images, other_images: the sets' sizes.
        fit_indices: the positions in the fit set of the images found in the other set, sorted.
        other_indices: the positions in the other set of the images found in the fit set, sorted.
        examples: the first :data:`EXAMPLES` pairs ``(fit image, other image, how)`` in fit order.
        hows: per kind of match (``same file``, ``same bytes``, ``same pixels``), the fit images it found.
        comparable: whether any image of one set could be compared with the other's (files against tensors
            cannot); ``False`` means "not compared", not "disjoint".
    """

    fit: str
    other: str
    other_role: str
    fit_root: str
    other_root: str
    fit_images: int
    other_images: int
    fit_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    other_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    hows: dict[str, int] = field(default_factory=dict)
    comparable: bool = True

    @property
    def count(self) -> int:
        """The fit images that are images of the other set."""
        return int(self.fit_indices.size)

    def within(self, indices: Sequence[int] | None) -> int:
        """How many of the fit images at ``indices`` (a capped fit set's, :func:`fit_subset`) are shared; all of
        them for ``None`` (the whole fit set)."""
        if indices is None:
            return self.count
        return int(np.isin(np.asarray(list(indices), dtype=np.int64), self.fit_indices).sum())

    def summary(self) -> str:
        """``40 of its 40 images are images of id_test (role id_test, /data/val: 40 of its 40 images; same file:
        40)``."""
        hows = ", ".join(f"{how}: {count}" for how, count in self.hows.items() if count)
        return (f"{self.count} of its {self.fit_images} images are images of {self.other} (role {self.other_role}, "
                f"{self.other_root}: {self.other_indices.size} of its {self.other_images} images"
                + (f"; {hows}" if hows else "") + ")")

    def example_lines(self) -> list[str]:
        return [f"{fit} = {other} ({how})" for fit, other, how in self.examples]


def overlap_message(overlaps: Sequence[Overlap], *, what: str = "fit set", option: str = "--allow-fit-overlap",
                    field_name: str = "allow_fit_overlap") -> str:
    """The error of a fit set that shares images with evaluation sets: the count, the first pairs, both sets,
    how to fix it and how to allow it."""
    first = overlaps[0]
    lines = [f"the {what} {first.fit!r} ({first.fit_root}, {first.fit_images} images) holds images the run evaluates "
             f"on, so a detector fitted on it would score them as in-distribution by construction:"]
    for overlap in overlaps:
        lines.append(f"- {overlap.summary()}; e.g. " + "; ".join(overlap.example_lines()))
    lines.append(f"Give the in-distribution training images as the {what} (--fit-data ILSVRC2012/train, not val/ "
                 "or a copy or links of the test images), or pass "
                 f"{option} ({field_name}: true) to run anyway: every table it shapes then says so.")
    return "\n".join(lines)


def overlap_note(overlap: Overlap, *, what: str = "fit set", count: int | None = None, of: int | None = None,
                 fit: str | None = None, option: str = "--allow-fit-overlap") -> str:
    """One line for a table or a report: ``fit set 'fit' overlaps id_test: 40 of its 40 images are id_test
    images (allowed by --allow-fit-overlap)``; ``count`` of ``of`` for a capped fit set called ``fit``."""
    count = overlap.count if count is None else count
    of = overlap.fit_images if of is None else of
    return (f"{what} {fit or overlap.fit!r} overlaps {overlap.other}: {count} of its {of} images are {overlap.other} "
            f"images (allowed by {option})")


# -- the images of a set ---------------------------------------------------------------------------------


def leaves(dataset: Dataset) -> tuple[list[Dataset], np.ndarray, np.ndarray]:
    """The data sets that hold a set's images, and for each position of the set which one (``(N,)``) and the
    position there (``(N,)``): through ``Subset``, ``ConcatDataset`` and wrappers that keep their samples."""
    if isinstance(dataset, Subset):
        found, of, position = leaves(dataset.dataset)
        chosen = np.asarray([int(i) for i in dataset.indices], dtype=np.int64)
        return found, of[chosen], position[chosen]
    if isinstance(dataset, ConcatDataset):
        found, ofs, positions = [], [], []
        for part in dataset.datasets:
            inner, of, position = leaves(part)
            ofs.append(of + len(found))
            positions.append(position)
            found += inner
        return found, np.concatenate(ofs or [np.zeros(0, np.int64)]), np.concatenate(positions or [np.zeros(0, np.int64)])
    size = len(dataset)  # type: ignore[arg-type]
    inner = getattr(dataset, "dataset", None)
    if not isinstance(dataset, (ImageFileDataset, TensorImageDataset)) and isinstance(inner, Dataset) \
            and len(inner) == size:  # type: ignore[arg-type]
        return leaves(inner)  # a wrapper of the same samples (EvG's ThroughPipeline, a transformed view)
    return [dataset], np.zeros(size, dtype=np.int64), np.arange(size, dtype=np.int64)


def _blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def _keys(*columns: np.ndarray) -> np.ndarray:
    """One fixed-size bytes key per row of several int64 columns (``np.isin`` compares them whole)."""
    stacked = np.ascontiguousarray(np.stack([c.astype(np.int64) for c in columns], axis=1))
    return stacked.view(f"S{8 * len(columns)}").ravel()


def _with_digests(prefix: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """Keys of an int64 column and a digest column (``S16``), as one bytes key per row."""
    joined = np.empty((prefix.size, 8 + DIGEST_SIZE), dtype=np.uint8)
    joined[:, :8] = np.ascontiguousarray(prefix.astype("<i8")).view(np.uint8).reshape(-1, 8)
    joined[:, 8:] = np.ascontiguousarray(digests.astype(f"S{DIGEST_SIZE}")).view(np.uint8).reshape(-1, DIGEST_SIZE)
    return joined.view(f"S{8 + DIGEST_SIZE}").ravel()


class SetImages:
    """The images of an evaluation set as comparable identities, each computed once and only where needed.

    Args:
        evaluation_set: the set.
        readers: threads that read files for the content stages.
    """

    def __init__(self, evaluation_set: EvaluationSet, *, readers: int = READERS) -> None:
        self.name, self.role = evaluation_set.name, evaluation_set.role
        self.size = len(evaluation_set)
        self.readers = readers
        self.leaves, self.leaf_of, self.position = leaves(evaluation_set.dataset)
        # per leaf: 1 files, 2 tensors, 0 another kind (not compared)
        kinds = np.asarray([1 if isinstance(d, ImageFileDataset) else 2 if isinstance(d, TensorImageDataset) else 0
                            for d in self.leaves], dtype=np.int8)
        kind = kinds[self.leaf_of] if self.size else np.zeros(0, dtype=np.int8)
        self.files, self.tensors = np.flatnonzero(kind == 1), np.flatnonzero(kind == 2)
        self.root = evaluation_set.info.get("root") or self._roots()
        self._stat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pixels: np.ndarray | None = None
        self._heads: dict[int, bytes] = {}
        self._whole: dict[int, bytes] = {}

    def _roots(self) -> str:
        roots = [str(d.root) if isinstance(d, ImageFileDataset) else f"in memory ({type(d).__name__})"
                 for d in self.leaves]
        unique = list(dict.fromkeys(roots))
        return ", ".join(unique[:3]) + (f", ... ({len(unique)} sources)" if len(unique) > 3 else "") or "empty"

    def describe(self, row: int) -> str:
        """How an error names an image: its file, or ``<set>[<position>]`` for an image in memory."""
        dataset, position = self.leaves[int(self.leaf_of[row])], int(self.position[row])
        if isinstance(dataset, ImageFileDataset):
            return dataset.path(position)
        return f"{self.name}[{row}]"

    # -- files ------------------------------------------------------------------------------------

    def stat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per file row ``(device, inode, size)``: ``os.stat`` of the file (symlinks followed); for a row of a
        shard set the set (a negative number per set) and its position, and the size from the manifest. A file
        that cannot be stat'ed gets size -1 (never matched; the pass names it)."""
        if self._stat is None:
            device = np.full(self.files.size, -1, dtype=np.int64)
            inode = np.full(self.files.size, -1, dtype=np.int64)
            size = np.full(self.files.size, -1, dtype=np.int64)
            leaf_of, position = self.leaf_of[self.files], self.position[self.files]
            for leaf in np.unique(leaf_of).tolist():
                dataset: ImageFileDataset = self.leaves[leaf]  # type: ignore[assignment]
                mine = np.flatnonzero(leaf_of == leaf)
                rows = position[mine]
                sharded = (np.asarray(dataset.store_of)[rows] >= 0) if dataset.store_of is not None \
                    else np.zeros(rows.size, dtype=bool)
                for store_number, store in enumerate(dataset.stores):
                    inside = sharded & (np.asarray(dataset.store_of)[rows] == store_number)
                    if inside.any():
                        where = np.asarray(dataset.positions)[rows[inside]].astype(np.int64)
                        device[mine[inside]] = _store_number(store.root)
                        inode[mine[inside]] = where
                        size[mine[inside]] = np.asarray(store.stat(where)[0], dtype=np.int64)
                for k in np.flatnonzero(~sharded).tolist():
                    try:
                        info = os.stat(dataset.path(int(rows[k])))
                    except OSError:
                        continue
                    # inode numbers are unsigned 64-bit: kept bit for bit in an int64
                    device[mine[k]] = info.st_dev
                    inode[mine[k]] = info.st_ino - (1 << 64) if info.st_ino >= 1 << 63 else info.st_ino
                    size[mine[k]] = info.st_size
            self._stat = (device, inode, size)
        return self._stat

    def _read(self, row: int, head: bool) -> bytes:
        """The digest of a file row's first :data:`HEAD_BYTES` bytes (``head``) or of all of them."""
        dataset: ImageFileDataset = self.leaves[int(self.leaf_of[row])]  # type: ignore[assignment]
        position = int(self.position[row])
        try:
            if dataset.in_shards(position):
                data = dataset.encoded(position)
                return _blake(data[:HEAD_BYTES] if head else data)
            descriptor = os.open(dataset.path(position), os.O_RDONLY)  # no buffered file object: ~5 µs less a file
            try:
                if head:
                    return _blake(os.read(descriptor, HEAD_BYTES))
                digest = hashlib.blake2b(digest_size=DIGEST_SIZE)
                while chunk := os.read(descriptor, 1 << 20):
                    digest.update(chunk)
                return digest.digest()
            finally:
                os.close(descriptor)
        except OSError:
            return b"unreadable:" + str(row).encode()  # matches nothing (the pass names the file)

    def digests(self, rows: np.ndarray, *, head: bool) -> np.ndarray:
        """``(len(rows),)`` digests (``S16``) of file rows (positions in the set), read once each, in threads."""
        memo = self._heads if head else self._whole
        missing = [int(r) for r in rows.tolist() if int(r) not in memo]
        if missing:
            # one contiguous share of the rows per thread (a task per file would cost more than its 4 KB read);
            # threads overlap the reads' waits on a cold disk or a network file system
            shares = [share for share in np.array_split(np.asarray(missing), max(1, self.readers)) if share.size]
            with ThreadPoolExecutor(max_workers=len(shares)) as pool:
                for share, values in zip(shares, pool.map(lambda rows: [self._read(int(r), head) for r in rows], shares),
                                         strict=True):
                    memo.update(zip(share.tolist(), values, strict=True))
        return np.asarray([memo[int(r)] for r in rows.tolist()], dtype=f"S{DIGEST_SIZE}") if rows.size else \
            np.zeros(0, dtype=f"S{DIGEST_SIZE}")

    # -- tensors ----------------------------------------------------------------------------------

    def pixels(self) -> np.ndarray:
        """Per tensor row, a digest (``S16``) of its shape and its pixels as the set yields them (float32 in
        ``[0, 1]``: a ``uint8`` image divided by 255, as :class:`TensorImageDataset` serves it)."""
        if self._pixels is None:
            found = np.zeros(self.tensors.size, dtype=f"S{DIGEST_SIZE}")
            leaf_of, position = self.leaf_of[self.tensors], self.position[self.tensors]
            for leaf in np.unique(leaf_of).tolist():
                images = self.leaves[leaf].images  # type: ignore[attr-defined]
                mine = np.flatnonzero(leaf_of == leaf)
                for start in range(0, mine.size, TENSOR_CHUNK):
                    chunk = mine[start:start + TENSOR_CHUNK]
                    batch = images[torch.as_tensor(position[chunk])]
                    batch = batch.float().div(255) if batch.dtype == torch.uint8 else batch.float()
                    shape = repr(tuple(batch.shape[1:])).encode()
                    array = batch.contiguous().numpy()
                    for k, row in enumerate(chunk.tolist()):
                        found[row] = _blake(shape + array[k].tobytes())
            self._pixels = found
        return self._pixels


_STORES: dict[str, int] = {}


def _store_number(root: str) -> int:
    """A negative number per shard set (by its real path): the 'device' of its rows' identities."""
    real = os.path.realpath(root)
    return _STORES.setdefault(real, -(len(_STORES) + 2))


# -- the comparison ---------------------------------------------------------------------------------------


def _file_matches(fit: SetImages, other: SetImages) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """``(fit rows, other rows, how)`` of the file images the two sets share: one pair per shared image (the
    first other row of each identity), by file identity, then by size, head and whole bytes."""
    if not fit.files.size or not other.files.size:
        return []
    (fit_device, fit_inode, fit_size), (other_device, other_inode, other_size) = fit.stat(), other.stat()
    found: list[tuple[np.ndarray, np.ndarray, str]] = []
    fit_keys, other_keys = _keys(fit_device, fit_inode), _keys(other_device, other_inode)
    valid_fit, valid_other = fit_size >= 0, other_size >= 0
    same = np.isin(fit_keys, other_keys[valid_other]) & valid_fit
    if same.any():
        first = _first_of(other_keys[valid_other], other.files[valid_other])
        found.append((fit.files[same], np.asarray([first[k] for k in fit_keys[same].tolist()], dtype=np.int64),
                      "same file"))
    # a copy: the same size, then the same head, then the same bytes (rows already matched as files are left out)
    left = valid_fit & ~same
    sizes = np.isin(fit_size, other_size[valid_other]) & left
    other_sized = np.isin(other_size, fit_size[left]) & valid_other
    if not sizes.any():
        return found
    fit_rows, other_rows = fit.files[sizes], other.files[other_sized]
    fit_sizes, other_sizes = fit_size[sizes], other_size[other_sized]
    fit_heads = _with_digests(fit_sizes, fit.digests(fit_rows, head=True))
    other_heads = _with_digests(other_sizes, other.digests(other_rows, head=True))
    alike = np.isin(fit_heads, other_heads)
    other_alike = np.isin(other_heads, fit_heads[alike])
    if not alike.any():
        return found
    fit_whole = _whole_keys(fit, fit_rows[alike], fit_sizes[alike], fit_heads[alike])
    other_whole = _whole_keys(other, other_rows[other_alike], other_sizes[other_alike], other_heads[other_alike])
    copies = np.isin(fit_whole, other_whole)
    if copies.any():
        first = _first_of(other_whole, other_rows[other_alike])
        found.append((fit_rows[alike][copies], np.asarray([first[k] for k in fit_whole[copies].tolist()],
                                                          dtype=np.int64), "same bytes"))
    return found


def _whole_keys(images: SetImages, rows: np.ndarray, sizes: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Size-and-digest keys of the whole files: a file of at most :data:`HEAD_BYTES` bytes is its head (not
    read again); the longer ones are read whole."""
    keys = heads.copy()
    long = sizes > HEAD_BYTES
    if long.any():
        keys[long] = _with_digests(sizes[long], images.digests(rows[long], head=False))
    return keys


def _first_of(keys: np.ndarray, rows: np.ndarray) -> dict[bytes, int]:
    """Key -> the first row that has it."""
    first: dict[bytes, int] = {}
    for key, row in zip(keys.tolist(), rows.tolist(), strict=True):
        first.setdefault(key, int(row))
    return first


def _tensor_matches(fit: SetImages, other: SetImages) -> list[tuple[np.ndarray, np.ndarray, str]]:
    if not fit.tensors.size or not other.tensors.size:
        return []
    fit_pixels, other_pixels = fit.pixels(), other.pixels()
    same = np.isin(fit_pixels, other_pixels)
    if not same.any():
        return []
    first = _first_of(other_pixels, other.tensors)
    return [(fit.tensors[same], np.asarray([first[k] for k in fit_pixels[same].tolist()], dtype=np.int64),
             "same pixels")]


def find_overlap(fit: SetImages | EvaluationSet, other: SetImages | EvaluationSet) -> Overlap:
    """The images of ``other`` that ``fit`` holds (see the module docstring for what the same image is).

    Args:
        fit: the fit set (or its :class:`SetImages`, whose identities are then reused).
        other: an evaluation set of the run (or its :class:`SetImages`).

    Returns:
        The :class:`Overlap`: ``count`` fit images found in ``other``, their positions on both sides, the first
        pairs; ``comparable`` is ``False`` when no image of one could be compared with the other's (files
        against tensors).
    """
    fit = fit if isinstance(fit, SetImages) else SetImages(fit)
    other = other if isinstance(other, SetImages) else SetImages(other)
    matches = _file_matches(fit, other) + _tensor_matches(fit, other)
    comparable = bool((fit.files.size and other.files.size) or (fit.tensors.size and other.tensors.size))
    overlap = Overlap(fit.name, other.name, other.role, str(fit.root), str(other.root), fit.size, other.size,
                      comparable=comparable)
    if not matches:
        return overlap
    fit_rows = np.concatenate([m[0] for m in matches])
    other_rows = np.concatenate([m[1] for m in matches])
    hows = np.concatenate([np.full(m[0].size, m[2], dtype=object) for m in matches])
    order = np.argsort(fit_rows, kind="stable")
    fit_rows, other_rows, hows = fit_rows[order], other_rows[order], hows[order]
    overlap.fit_indices = np.unique(fit_rows)
    overlap.other_indices = np.unique(other_rows)
    overlap.hows = {how: int((hows == how).sum()) for how in ("same file", "same bytes", "same pixels")}
    overlap.examples = [(fit.describe(int(a)), other.describe(int(b)), str(how))
                        for a, b, how in zip(fit_rows[:EXAMPLES], other_rows[:EXAMPLES], hows[:EXAMPLES], strict=True)]
    return overlap


def find_overlaps(fit: EvaluationSet, others: Iterable[EvaluationSet]) -> list[Overlap]:
    """:func:`find_overlap` of a fit set with each of ``others`` (its identities computed once)."""
    images = SetImages(fit)
    return [find_overlap(images, other) for other in others]


__all__ = ["EXAMPLES", "HEAD_BYTES", "FitOverlapError", "Overlap", "SetImages", "find_overlap", "find_overlaps",
           "leaves", "overlap_message", "overlap_note"]
