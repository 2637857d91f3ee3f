"""Whether a fit set holds images of the data a run evaluates on (a detector fitted on its test images).

A fitted detector (KNN, Mahalanobis, ViM, ...) fitted on images it is then tested on scores them as
in-distribution by construction: KNN with ``k = 1`` finds every such image as its own nearest neighbour (a
score of ``-0``). Users do this by accident (a ``val/`` folder given for ``train/``, a folder of symlinks to
the test folders, PNG exports of an in-memory test set), so the engine compares the fit set with every evaluation
set of a run before its first pass (:meth:`evaluation_engine.scoring.ScoringPasses.check_fit_overlap`) with
:func:`find_overlap`.

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
- for two sets of images held as tensors (:class:`TensorImageDataset`, generated sets, the Fashion-MNIST demo),
  **the same pixels**: a digest of each image as the set yields it (a ``uint8`` image as its float ``[0, 1]``
  values, so one picture stored either way is one image) and its shape;
- for files against tensors, **the same pixels** too: each file whose size (its header, read without decoding)
  is a tensor image's ``W x H`` is decoded with PIL in the tensor's mode (1 channel ``"L"``, 3 ``"RGB"``), and its
  ``uint8`` values are compared with the tensor image's (a ``uint8`` image as stored, a float one rounded to
  ``round(255 x)``). A lossless export (PNG, BMP, TIFF) of a test image is caught; **a lossy re-encode (JPEG) is
  not**: its pixels are not the tensor's. Tensor images of another number of channels cannot be compared with
  files.

A file that cannot be read (or a shard row whose bytes fail their digest, :class:`ShardError`) matches nothing:
the pass names it (or skips and counts it under ``on_bad_image: skip``). ``Subset`` and ``ConcatDataset`` map
through to the images they hold, and so does a wrapper that keeps its samples (``.dataset`` of the same length,
e.g. EvG's resized OOD images). What could not be compared (a data set of another kind, tensor images of 2 or 4
channels against files) is said in :attr:`Overlap.not_compared`, which the run warns about, naming both sets:
never read as "disjoint".

A set's identities (file identities, head and whole digests, image sizes and decoded pixels, each computed only
where needed) can be kept on disk (:meth:`SetImages.save`, :meth:`SetImages.load`), keyed by the set's
fingerprint (the files' names, sizes and modification times) and its real roots: the engine keeps them in the
run's ``cache_dir``, so a second run against a 21k pool does not read its millions of heads again.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import ConcatDataset, Dataset, Subset

from datamodules.evaluation import EvaluationSet
from datamodules.images import ImageFileDataset, TensorImageDataset
from datamodules.shard_store import ShardError
from openset_common.artefacts import atomic_write_bytes, digest

HEAD_BYTES = 4096
"""The bytes of each same-size file read first; only files whose size and head both occur in both sets are
read whole."""
EXAMPLES = 5  # pairs named in an error or a note
DIGEST_SIZE = 16  # blake2b-128: a false match among 10^7 images has probability ~1e-25
READERS = 8  # threads that read files (I/O bound: the GIL is released while reading)
TENSOR_CHUNK = 4096  # tensor images converted to float per chunk (the Fashion-MNIST training split: 15 chunks)
MODES = {1: "L", 3: "RGB"}  # a tensor image's channels -> the PIL mode a file is decoded in to compare with it
IDENTITIES_FORMAT = "openset-fit-overlap/1"  # the layout of a saved set's identities (SetImages.save)
# what reading a row's bytes raises when it cannot (a missing or unreadable file, a shard row that fails its digest)
UNREADABLE_BYTES = (OSError, ShardError)
# what decoding a row raises when it cannot (as ImageFileDataset.guarded): the row matches nothing
UNREADABLE_IMAGE = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)
# the stages of a set's content identities, each computed row by row where needed: the first bytes, all of them, and
# the pixels of a file decoded in a tensor's mode (per number of channels)
STAGES = ("head", "whole", *(f"pixels{channels}" for channels in MODES))
NOT_YET, READ, UNREADABLE = 0, 1, -1  # the state of a row in a stage

How = Literal["same file", "same bytes", "same pixels"]
T = TypeVar("T")


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
        not_compared: what of the two sets could not be compared (``""``: everything was), e.g. the images of a
            data set of another kind; an overlap there is not found, so the run warns, naming both sets.
        allowed: whether a check of the run allowed it (``--allow-fit-overlap``): the tables of the detectors
            fitted on the fit set then say so (:meth:`ScoringPasses.fit_notes`).
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
    not_compared: str = ""
    allowed: bool = False

    @property
    def count(self) -> int:
        """The fit images that are images of the other set."""
        return int(self.fit_indices.size)

    @property
    def comparable(self) -> bool:
        """Whether every image of one set could be compared with the other's images (``False``: "not compared"
        in part, never "disjoint")."""
        return not self.not_compared

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

    def not_compared_warning(self, *, what: str = "fit set") -> str:
        """The warning of a pair not compared in full: ``fit set 'fit' and ood not compared: ...``."""
        return (f"{what} {self.fit!r} ({self.fit_root}) and {self.other} (role {self.other_role}, {self.other_root}) "
                f"not compared: {self.not_compared}; an image of one that is an image of the other there is not "
                "found (give both as image files, or as tensors of 1 or 3 channels)")


def overlap_message(overlaps: Sequence[Overlap], *, what: str = "fit set", option: str = "--allow-fit-overlap",
                    field_name: str = "allow_fit_overlap") -> str:
    """The error of a fit set that shares images with evaluation sets: the count, the first pairs, both sets,
    how to fix it and how to allow it."""
    first = overlaps[0]
    lines = [f"the {what} {first.fit!r} ({first.fit_root}, {first.fit_images} images) holds images the run evaluates "
             f"on, so a detector fitted on it would score them as in-distribution by construction:"]
    for overlap in overlaps:
        lines.append(f"- {overlap.summary()}; e.g. " + "; ".join(overlap.example_lines()))
    if any(o.other_role == "id_val" for o in overlaps):  # a whole train/ folder holds a checkpoint's val split
        lines.append("The ID validation images are carved from a training folder (a checkpoint of train.py splits "
                     "train/ 80/20): leave --fit-data out to fit on the checkpoint's own training split, without them.")
    lines.append(f"Give the in-distribution training images as the {what} (--fit-data ILSVRC2012/train, not val/ "
                 "or a copy, links or exports of the test images), or pass "
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
        files, of, position = leaves(dataset.dataset)
        chosen = np.asarray([int(i) for i in dataset.indices], dtype=np.int64)
        return files, of[chosen], position[chosen]
    if isinstance(dataset, ConcatDataset):
        files, ofs, positions = [], [], []
        for part in dataset.datasets:
            inner, of, position = leaves(part)
            ofs.append(of + len(files))
            positions.append(position)
            files += inner
        return files, np.concatenate(ofs or [np.zeros(0, np.int64)]), np.concatenate(positions or [np.zeros(0, np.int64)])
    size = len(dataset)  # type: ignore[arg-type]
    inner = getattr(dataset, "dataset", None)
    if not isinstance(dataset, (ImageFileDataset, TensorImageDataset)) and isinstance(inner, Dataset) \
            and len(inner) == size:  # type: ignore[arg-type]
        return leaves(inner)  # a wrapper of the same samples (a TransformedSet: a transformed view)
    return [dataset], np.zeros(size, dtype=np.int64), np.arange(size, dtype=np.int64)


def _blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def _pixel_digest(pixels: np.ndarray) -> bytes:
    """The digest of a ``uint8`` image ``(C, H, W)`` and its shape: a file decoded in a tensor's mode and a tensor
    image are the same image when these agree."""
    return _blake(repr(tuple(pixels.shape)).encode() + np.ascontiguousarray(pixels, dtype=np.uint8).tobytes())


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

    File rows get their ``os.stat`` identity (:meth:`stat`), then per stage of :data:`STAGES` a digest where a
    comparison needs it (:meth:`digests`: the head, the whole file; :meth:`decoded`: the pixels of a file whose
    size is a tensor image's), kept per row with its state (not yet read, read, unreadable). Tensor rows get
    digests of their pixels (:meth:`pixels`, :meth:`quantised`). :meth:`save` and :meth:`load` keep the file
    identities on disk.

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
        self.others = np.flatnonzero(kind == 0)
        self.root = evaluation_set.info.get("root") or self._roots()
        self._stat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._stages: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # stage -> (digests S16 (N,), states int8 (N,))
        self._dims: np.ndarray | None = None  # (N, 2) int32: a file row's (width, height); -2 not yet, -1 unreadable
        self._pixels: np.ndarray | None = None
        self._quantised: tuple[np.ndarray, np.ndarray] | None = None
        self.changed = False  # identities of files computed since the set was made or loaded (what save() adds)

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

    def kinds_of(self, rows: np.ndarray) -> str:
        """The data set classes that hold ``rows``: ``FooDataset`` (how a warning names what was not compared)."""
        return ", ".join(dict.fromkeys(type(self.leaves[int(leaf)]).__name__ for leaf in np.unique(self.leaf_of[rows])))

    def _in_threads(self, rows: np.ndarray, work: Callable[[int], T]) -> list[T]:
        """``work(row)`` of every row, in order, over :attr:`readers` threads, one contiguous share each (a task per
        file would cost more than its 4 KB read; threads overlap the reads' waits on a cold or network disk)."""
        shares = [share for share in np.array_split(rows, max(1, self.readers)) if share.size]
        if not shares:
            return []
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            parts = list(pool.map(lambda share: [work(int(r)) for r in share.tolist()], shares))
        return [value for part in parts for value in part]

    def _stage(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        if stage not in self._stages:
            self._stages[stage] = (np.zeros(self.size, dtype=f"S{DIGEST_SIZE}"), np.zeros(self.size, dtype=np.int8))
        return self._stages[stage]

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
            self.changed = True
        return self._stat

    def _read(self, row: int, head: bool) -> bytes | None:
        """The digest of a file row's first :data:`HEAD_BYTES` bytes (``head``) or of all of them; ``None`` when
        they cannot be read (the file is gone or unreadable, a shard row fails its digest): it matches nothing,
        and the pass names it (or skips and counts it under ``on_bad_image: skip``)."""
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
                hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
                while chunk := os.read(descriptor, 1 << 20):
                    hasher.update(chunk)
                return hasher.digest()
            finally:
                os.close(descriptor)
        except UNREADABLE_BYTES:
            return None

    def digests(self, rows: np.ndarray, *, head: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(len(rows),)`` digests (``S16``) of file rows (positions in the set), each read once, in threads, and
        whether each could be read (an unreadable row's digest is meaningless: it matches nothing)."""
        digests, states = self._stage("head" if head else "whole")
        missing = rows[states[rows] == NOT_YET]
        if missing.size:
            for row, value in zip(missing.tolist(), self._in_threads(missing, lambda r: self._read(r, head)),
                                  strict=True):
                if value is None:
                    states[row] = UNREADABLE
                else:
                    digests[row], states[row] = value, READ
            self.changed = True
        return digests[rows], states[rows] == READ

    def _open(self, row: int) -> Image.Image:
        dataset: ImageFileDataset = self.leaves[int(self.leaf_of[row])]  # type: ignore[assignment]
        position = int(self.position[row])
        if dataset.in_shards(position):
            return Image.open(io.BytesIO(dataset.encoded(position)))
        return Image.open(dataset.path(position))

    def _look(self, row: int, wanted: dict[tuple[int, int], list[int]]) -> tuple[int, int, dict[int, bytes]] | None:
        """A file row's ``(width, height)`` from its header, and where that is a wanted size, the digest of its
        pixels decoded in the mode of each wanted number of channels; ``None`` when it cannot be read or decoded."""
        try:
            with self._open(row) as image:
                width, height = image.size
                digests = {}
                for channels in wanted.get((width, height), []):
                    pixels = np.asarray(image.convert(MODES[channels]), dtype=np.uint8)
                    digests[channels] = _pixel_digest(pixels.reshape(height, width, channels).transpose(2, 0, 1))
                return width, height, digests
        except (*UNREADABLE_BYTES, *UNREADABLE_IMAGE):
            return None

    def decoded(self, shapes: Sequence[tuple[int, int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per shape ``(C, H, W)`` of tensor images: the file rows of that size (``W x H``, from their headers) that
        could be decoded, and the digests of their pixels in the shape's mode (:data:`MODES`). Each file's header is
        read once; a file is decoded only where its size is one of ``shapes``' (once per mode)."""
        if self._dims is None:
            self._dims = np.full((self.size, 2), -2, dtype=np.int32)
        dims, rows = self._dims, self.files
        wanted: dict[tuple[int, int], list[int]] = {}
        for channels, height, width in shapes:
            wanted.setdefault((width, height), []).append(channels)
        stages = {channels: self._stage(f"pixels{channels}") for channels, _, _ in shapes}
        need = dims[rows, 0] == -2
        for (width, height), channels_of in wanted.items():
            sized = (dims[rows, 0] == width) & (dims[rows, 1] == height)
            for channels in channels_of:
                need |= sized & (stages[channels][1][rows] == NOT_YET)
        todo = rows[need]
        if todo.size:
            for row, looked in zip(todo.tolist(), self._in_threads(todo, lambda r: self._look(r, wanted)), strict=True):
                if looked is None:
                    dims[row] = -1
                    continue
                dims[row] = looked[:2]
                for channels, value in looked[2].items():
                    stages[channels][0][row], stages[channels][1][row] = value, READ
            self.changed = True
        out = []
        for channels, height, width in shapes:
            sized = rows[(dims[rows, 0] == width) & (dims[rows, 1] == height)]
            readable = sized[stages[channels][1][sized] == READ]
            out.append((readable, stages[channels][0][readable]))
        return out

    # -- tensors ----------------------------------------------------------------------------------

    def _tensor_chunks(self) -> Iterable[tuple[np.ndarray, torch.Tensor]]:
        """The tensor rows (positions in :attr:`tensors`) and their images, :data:`TENSOR_CHUNK` at a time."""
        leaf_of, position = self.leaf_of[self.tensors], self.position[self.tensors]
        for leaf in np.unique(leaf_of).tolist():
            images = self.leaves[leaf].images  # type: ignore[attr-defined]
            mine = np.flatnonzero(leaf_of == leaf)
            for start in range(0, mine.size, TENSOR_CHUNK):
                chunk = mine[start:start + TENSOR_CHUNK]
                yield chunk, images[torch.as_tensor(position[chunk])]

    def pixels(self) -> np.ndarray:
        """Per tensor row, a digest (``S16``) of its shape and its pixels as the set yields them (float32 in
        ``[0, 1]``: a ``uint8`` image divided by 255, as :class:`TensorImageDataset` serves it)."""
        if self._pixels is None:
            digests = np.zeros(self.tensors.size, dtype=f"S{DIGEST_SIZE}")
            for chunk, batch in self._tensor_chunks():
                batch = batch.float().div(255) if batch.dtype == torch.uint8 else batch.float()
                shape = repr(tuple(batch.shape[1:])).encode()
                array = batch.contiguous().numpy()
                for k, row in enumerate(chunk.tolist()):
                    digests[row] = _blake(shape + array[k].tobytes())
            self._pixels = digests
        return self._pixels

    def quantised(self) -> tuple[np.ndarray, np.ndarray]:
        """Per tensor row, its shape ``(C, H, W)`` (``(N_t, 3)``; -1 where it cannot be a file's pixels: not
        ``(N, C, H, W)`` with ``C`` in :data:`MODES`) and the digest of its ``uint8`` values (:func:`_pixel_digest`:
        a ``uint8`` image as stored, a float one in ``[0, 1]`` as ``round(255 x)``, what a lossless export writes)."""
        if self._quantised is None:
            shapes = np.full((self.tensors.size, 3), -1, dtype=np.int64)
            digests = np.zeros(self.tensors.size, dtype=f"S{DIGEST_SIZE}")
            for chunk, batch in self._tensor_chunks():
                if batch.ndim != 4 or batch.shape[1] not in MODES:
                    continue
                values = batch if batch.dtype == torch.uint8 else batch.float().clamp(0, 1).mul(255).round().to(torch.uint8)
                array = values.contiguous().numpy()
                shapes[chunk] = batch.shape[1:]
                for k, row in enumerate(chunk.tolist()):
                    digests[row] = _pixel_digest(array[k])
            self._quantised = (shapes, digests)
        return self._quantised

    # -- kept on disk -----------------------------------------------------------------------------

    def cache_key(self, fingerprint: str) -> str:
        """The key of the set's saved identities: its fingerprint (:meth:`EvaluationSet.fingerprint`: names, sizes,
        modification times) and the real paths of its roots (a file's device and inode are those of a path)."""
        roots = sorted({os.path.realpath(d.root) for d in self.leaves if isinstance(d, ImageFileDataset)})
        return digest({"format": IDENTITIES_FORMAT, "set": fingerprint, "roots": roots})

    def save(self, path: str | os.PathLike, key: str) -> Path:
        """The file identities computed so far (``.npz``, written atomically): the stat, and per stage the rows
        read with their digests and states; the image sizes read. Tensor digests are not kept (in memory)."""
        arrays: dict[str, np.ndarray] = {"format": np.asarray(IDENTITIES_FORMAT), "key": np.asarray(key),
                                         "size": np.asarray(self.size, dtype=np.int64)}
        if self._stat is not None:
            arrays["stat"] = np.stack(self._stat)
        for stage, (digests, states) in self._stages.items():
            rows = np.flatnonzero(states != NOT_YET)
            arrays.update({f"{stage}_rows": rows, f"{stage}_digests": digests[rows], f"{stage}_states": states[rows]})
        if self._dims is not None:
            rows = np.flatnonzero(self._dims[:, 0] != -2)
            arrays.update({"dims_rows": rows, "dims": self._dims[rows]})
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        self.changed = False
        return atomic_write_bytes(path, buffer.getvalue())

    def load(self, path: str | os.PathLike, key: str) -> bool:
        """Take the identities :meth:`save` kept in ``path`` under ``key``; ``False`` (nothing taken) when there are
        none, and a warning besides when the file is not a saved set of this key and size (then recomputed)."""
        if not os.path.isfile(path):
            return False
        try:
            with np.load(path, allow_pickle=False) as saved:
                saved_arrays = {name: saved[name] for name in saved.files}
            if str(saved_arrays["format"]) != IDENTITIES_FORMAT or str(saved_arrays["key"]) != key \
                    or int(saved_arrays["size"]) != self.size:
                raise ValueError("another set, key or format")
            stat = saved_arrays.get("stat")
            if stat is not None and stat.shape != (3, self.files.size):
                raise ValueError(f"its stat has shape {stat.shape}, the set {self.files.size} files")
            stages = {}
            for stage in STAGES:
                if f"{stage}_rows" in saved_arrays:
                    rows = saved_arrays[f"{stage}_rows"]
                    digests, states = (np.zeros(self.size, dtype=f"S{DIGEST_SIZE}"),
                                       np.zeros(self.size, dtype=np.int8))
                    digests[rows], states[rows] = saved_arrays[f"{stage}_digests"], saved_arrays[f"{stage}_states"]
                    stages[stage] = (digests, states)
            dims = None
            if "dims_rows" in saved_arrays:
                dims = np.full((self.size, 2), -2, dtype=np.int32)
                dims[saved_arrays["dims_rows"]] = saved_arrays["dims"]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
            warnings.warn(f"rejecting the saved identities {path} of {self.name}: {type(error).__name__}: {error}; "
                          "recomputing", RuntimeWarning, stacklevel=2)
            return False
        if stat is not None:
            self._stat = (stat[0].copy(), stat[1].copy(), stat[2].copy())
        self._stages.update(stages)
        self._dims = dims if dims is not None else self._dims
        self.changed = False
        return True


_STORES: dict[str, int] = {}


def _store_number(root: str) -> int:
    """A negative number per shard set (by its real path): the 'device' of its rows' identities."""
    real = os.path.realpath(root)
    return _STORES.setdefault(real, -(len(_STORES) + 2))


# -- the comparison ---------------------------------------------------------------------------------------

Matches = list[tuple[np.ndarray, np.ndarray, str]]  # (fit rows, other rows, how): one other row per fit row


def _file_matches(fit: SetImages, other: SetImages) -> Matches:
    """``(fit rows, other rows, how)`` of the file images the two sets share: one pair per shared image (the
    first other row of each identity), by file identity, then by size, head and whole bytes. A file that cannot
    be stat'ed or read matches nothing."""
    if not fit.files.size or not other.files.size:
        return []
    (fit_device, fit_inode, fit_size), (other_device, other_inode, other_size) = fit.stat(), other.stat()
    matches: Matches = []
    fit_keys, other_keys = _keys(fit_device, fit_inode), _keys(other_device, other_inode)
    valid_fit, valid_other = fit_size >= 0, other_size >= 0
    same = np.isin(fit_keys, other_keys[valid_other]) & valid_fit
    if same.any():
        first = _first_of(other_keys[valid_other], other.files[valid_other])
        matches.append((fit.files[same], np.asarray([first[k] for k in fit_keys[same].tolist()], dtype=np.int64),
                      "same file"))
    # a copy: the same size, then the same head, then the same bytes (rows already matched as files are left out)
    left = valid_fit & ~same
    sizes = np.isin(fit_size, other_size[valid_other]) & left
    other_sized = np.isin(other_size, fit_size[left]) & valid_other
    if not sizes.any():
        return matches
    fit_rows, other_rows = fit.files[sizes], other.files[other_sized]
    fit_sizes, other_sizes = fit_size[sizes], other_size[other_sized]
    fit_digests, fit_read = fit.digests(fit_rows, head=True)
    other_digests, other_read = other.digests(other_rows, head=True)
    fit_heads, other_heads = _with_digests(fit_sizes, fit_digests), _with_digests(other_sizes, other_digests)
    alike = np.isin(fit_heads, other_heads[other_read]) & fit_read
    other_alike = np.isin(other_heads, fit_heads[alike]) & other_read
    if not alike.any():
        return matches
    fit_whole, fit_whole_read = _whole_keys(fit, fit_rows[alike], fit_sizes[alike], fit_heads[alike])
    other_whole, other_whole_read = _whole_keys(other, other_rows[other_alike], other_sizes[other_alike],
                                                other_heads[other_alike])
    copies = np.isin(fit_whole, other_whole[other_whole_read]) & fit_whole_read
    if copies.any():
        first = _first_of(other_whole[other_whole_read], other_rows[other_alike][other_whole_read])
        matches.append((fit_rows[alike][copies], np.asarray([first[k] for k in fit_whole[copies].tolist()],
                                                          dtype=np.int64), "same bytes"))
    return matches


def _whole_keys(images: SetImages, rows: np.ndarray, sizes: np.ndarray, heads: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Size-and-digest keys of the whole files, and whether each could be read: a file of at most
    :data:`HEAD_BYTES` bytes is its head (not read again); the longer ones are read whole."""
    keys, read = heads.copy(), np.ones(rows.size, dtype=bool)
    long = sizes > HEAD_BYTES
    if long.any():
        digests, read[long] = images.digests(rows[long], head=False)
        keys[long] = _with_digests(sizes[long], digests)
    return keys, read


def _first_of(keys: np.ndarray, rows: np.ndarray) -> dict[bytes, int]:
    """Key -> the first row that has it."""
    first: dict[bytes, int] = {}
    for key, row in zip(keys.tolist(), rows.tolist(), strict=True):
        first.setdefault(key, int(row))
    return first


def _tensor_matches(fit: SetImages, other: SetImages) -> Matches:
    if not fit.tensors.size or not other.tensors.size:
        return []
    fit_pixels, other_pixels = fit.pixels(), other.pixels()
    same = np.isin(fit_pixels, other_pixels)
    if not same.any():
        return []
    first = _first_of(other_pixels, other.tensors)
    return [(fit.tensors[same], np.asarray([first[k] for k in fit_pixels[same].tolist()], dtype=np.int64),
             "same pixels")]


def _decoded_matches(fit: SetImages, other: SetImages) -> Matches:
    """The files of one set decoded to the pixels of the other's tensor images (both directions): only files
    whose size is a tensor image's are decoded (:meth:`SetImages.decoded`)."""
    matches: Matches = []
    for files, tensors, fit_has_files in ((fit, other, True), (other, fit, False)):
        if not files.files.size or not tensors.tensors.size:
            continue
        shapes, pixels = tensors.quantised()
        usable = shapes[:, 0] > 0
        wanted = [tuple(int(v) for v in shape) for shape in np.unique(shapes[usable], axis=0)]
        if not wanted:
            continue
        for shape, (file_rows, file_pixels) in zip(wanted, files.decoded(wanted), strict=True):
            mine = usable & (shapes == np.asarray(shape)).all(axis=1)
            tensor_rows, tensor_pixels = tensors.tensors[mine], pixels[mine]
            if fit_has_files:
                same = np.isin(file_pixels, tensor_pixels)
                first = _first_of(tensor_pixels, tensor_rows)
                pairs = (file_rows[same], [first[k] for k in file_pixels[same].tolist()])
            else:
                same = np.isin(tensor_pixels, file_pixels)
                first = _first_of(file_pixels, file_rows)
                pairs = (tensor_rows[same], [first[k] for k in tensor_pixels[same].tolist()])
            if pairs[0].size:
                matches.append((pairs[0], np.asarray(pairs[1], dtype=np.int64), "same pixels"))
    return matches


def _not_compared(fit: SetImages, other: SetImages) -> str:
    """What of two sets could not be compared: images of a data set of another kind (against any image of the
    other set), tensor images that cannot be a file's pixels (against the other set's files); ``""``: none."""
    parts = []
    for one, two in ((fit, other), (other, fit)):
        if one.others.size and two.size:
            parts.append(f"{one.others.size} images of {one.name} are held by {one.kinds_of(one.others)}, a data set "
                         "the check cannot read (neither image files nor tensors)")
    for one, two in ((fit, other), (other, fit)):
        if one.tensors.size and two.files.size:
            odd = one.tensors[one.quantised()[0][:, 0] < 0]
            if odd.size:
                shape = tuple(one.leaves[int(one.leaf_of[odd[0]])].images.shape[1:])  # type: ignore[attr-defined]
                parts.append(f"{odd.size} tensor images of {one.name} (shape {shape}) against the files of {two.name}: "
                             f"only images of {' or '.join(map(str, MODES))} channels are compared with decoded files")
    return "; ".join(parts)


def find_overlap(fit: SetImages | EvaluationSet, other: SetImages | EvaluationSet) -> Overlap:
    """The images of ``other`` that ``fit`` holds (see the module docstring for what the same image is).

    Args:
        fit: the fit set (or its :class:`SetImages`, whose identities are then reused).
        other: an evaluation set of the run (or its :class:`SetImages`).

    Returns:
        The :class:`Overlap`: ``count`` fit images found in ``other``, their positions on both sides, the first
        pairs; ``not_compared`` says what could not be compared (a data set of another kind; tensor images of
        other than 1 or 3 channels against files), which the caller warns about.
    """
    fit = fit if isinstance(fit, SetImages) else SetImages(fit)
    other = other if isinstance(other, SetImages) else SetImages(other)
    matches = _file_matches(fit, other) + _tensor_matches(fit, other) + _decoded_matches(fit, other)
    overlap = Overlap(fit.name, other.name, other.role, str(fit.root), str(other.root), fit.size, other.size,
                      not_compared=_not_compared(fit, other))
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


__all__ = ["EXAMPLES", "HEAD_BYTES", "MODES", "FitOverlapError", "Overlap", "SetImages", "find_overlap",
           "find_overlaps", "leaves", "overlap_message", "overlap_note"]
