"""The image data sets of the project: files listed with their labels, and in-memory tensors.

Every data set yields :class:`datamodules.batch.Sample` (image, project label, dataset index). An
evaluation data set yields raw images -- decoded files as PIL images, in-memory images as float tensors in
``[0, 1]`` -- and the model that scores them applies its own input transform
(:mod:`datamodules.transforms`); a training data set carries its datamodule's transform.
:func:`dataset_labels` reads the labels of any of them, through subsets and wrappers, without loading an image.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset, Subset

from datamodules.batch import Sample
from datamodules.shard_store import (
    CHUNK,
    ShardError,
    ShardSet,
    fingerprint_rows,
    listing_fingerprint,
    shard_set_of,
)
from openset_common.artefacts import files_fingerprint

BadImagePolicy = Literal["fail", "skip"]


class UnreadableImageError(RuntimeError):
    """An image file could not be decoded; the message names the file."""


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


# The one rule for what an image file is, everywhere in the project: the extensions PIL and torchvision read,
# case-insensitive (ImageNet's files are ``.JPEG``). Any other file in an image folder is left out, counted.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


class NonImageFilesWarning(UserWarning):
    """Files in an image folder that are not images by extension were left out; the message counts them."""


def is_image_file(name: str | os.PathLike) -> bool:
    """Whether a file name is an image's: not hidden, with one of :data:`IMAGE_EXTENSIONS` (any case)."""
    path = Path(name)
    return not path.name.startswith(".") and path.suffix.lower() in IMAGE_EXTENSIONS


def _file_names(folder: str | os.PathLike) -> list[str]:
    """The names of the files directly in a folder, of the file system or of a shard set."""
    inside = shard_set_of(folder)
    if inside is not None:
        shards, relative = inside
        return shards.files(relative)
    return [p.name for p in Path(folder).iterdir() if p.is_file()]


def is_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder of the file system or a folder inside a shard set
    (:mod:`datamodules.shard_store`), so every folder a data set reads may be a shard set's."""
    inside = shard_set_of(path)
    return os.path.isdir(path) if inside is None else inside[0].is_folder(inside[1])


def subfolders(folder: str | os.PathLike) -> list[str]:
    """The names of the folders in a folder (hidden ones left out), sorted: of the file system or of a shard
    set."""
    inside = shard_set_of(folder)
    if inside is not None:
        shards, relative = inside
        return [name for name in shards.subfolders(relative) if not name.startswith(".")]
    return sorted(p.name for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))


def non_image_files(folder: str | os.PathLike) -> list[str]:
    """The names of the files in a folder that are neither hidden nor images (:func:`is_image_file`), sorted."""
    return sorted(name for name in _file_names(folder) if not name.startswith(".") and not is_image_file(name))


def ignored_files_message(folder: str | os.PathLike, names: Sequence[str]) -> str:
    """``ignored N files in FOLDER that are not images (...)``: the first few named."""
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"ignored {len(names)} file{'s' if len(names) != 1 else ''} in {folder} that are not images "
            f"(by extension, any case: {' '.join(IMAGE_EXTENSIONS)}): {shown}")


def image_files(folder: str | os.PathLike, *, warn: bool = True) -> list[str]:
    """The image file names in a folder (:func:`is_image_file`), sorted.

    Args:
        folder: the folder (its sub-folders are not read).
        warn: warn (:class:`NonImageFilesWarning`) with the count and the first names of the other files,
            which are left out; hidden files are left out silently.
    """
    folder = Path(folder)
    files = _file_names(folder)
    if warn:
        others = sorted(name for name in files if not name.startswith(".") and not is_image_file(name))
        if others:
            warnings.warn(ignored_files_message(folder, others), NonImageFilesWarning, stacklevel=2)
    return sorted(name for name in files if is_image_file(name))


def image_files_under(folder: str | os.PathLike, *, warn: bool = True) -> list[str]:
    """Every image file under ``folder``, sub-folders included, as sorted paths relative to it.

    Hidden files and anything under a hidden folder are left out silently; other files that are not images
    (:func:`is_image_file`) are left out and, with ``warn``, counted in one :class:`NonImageFilesWarning`.
    """
    folder = Path(folder)
    inside = shard_set_of(folder)
    if inside is not None:
        shards, relative = inside
        prefix = f"{relative}/" if relative else ""
        listed = sorted((f"{sub}/{name}" if sub else name for sub, names in shards.listing().items()
                         if sub == relative or sub.startswith(prefix) for name in names),
                        key=lambda p: p.split("/"))  # the order of sorted(Path.rglob()): by parts
        listed = [path[len(prefix):] for path in listed]
        images = [p for p in listed if not any(part.startswith(".") for part in Path(p).parts) and is_image_file(p)]
        others = [p for p in listed if not any(part.startswith(".") for part in Path(p).parts) and not is_image_file(p)]
        if warn and others:
            warnings.warn(ignored_files_message(folder, others), NonImageFilesWarning, stacklevel=2)
        return images
    images, others = [], []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        (images if is_image_file(path.name) else others).append(str(relative))
    if warn and others:
        warnings.warn(ignored_files_message(folder, others), NonImageFilesWarning, stacklevel=2)
    return images


def read_rgb_image(path: str) -> Image.Image:
    """Open and fully decode an image as RGB (decoding errors surface here, not later)."""
    with Image.open(path) as image:
        return image.convert("RGB")


def _any_absolute(paths: list[str]) -> bool:
    """``any(os.path.isabs(p) for p in paths)`` for POSIX paths, in C-level passes over chunks of them."""
    return any("\0/" in "\0" + "\0".join(paths[start:start + CHUNK]) for start in range(0, len(paths), CHUNK))


class ImageFileDataset(Dataset):
    """Images listed as ``(relative path, label)`` rows under ``root``.

    Args:
        on_bad_image: ``"fail"`` raises :class:`UnreadableImageError` naming the file; ``"skip"`` warns with
            the path and yields a sample without image, which :func:`collate_samples` drops and counts.
    """

    def __init__(
        self,
        root: str,
        rows: Sequence[tuple[str, int]],
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        on_bad_image: BadImagePolicy = "fail",
    ) -> None:
        self.root = root
        self.rows = list(rows)
        self.transform = transform
        self.target_transform = target_transform
        self.on_bad_image = check_choice("on_bad_image", on_bad_image, ("fail", "skip"))
        self._resolve_shards()

    def _resolve_shards(self) -> None:
        """Which rows lie in a shard set (rows under ``root`` when it is one or lies in one; absolute rows whose
        folder does), with their position there: ``self.stores`` (the sets), ``self.store_of`` (per row, -1 for
        a file) and ``self.positions``."""
        inside = shard_set_of(self.root)
        self.stores: list[ShardSet] = []
        self.store_of: np.ndarray | None = None
        self.positions: np.ndarray | None = None
        self._inner: list[str | None] = []
        self._run: dict | None = None  # the recorded run of the root set's listing the rows are (no lookup, no stat)
        relatives = [relative for relative, _ in self.rows]
        try:
            absolute = _any_absolute(relatives)
        except TypeError:  # rows given as path objects: as strings from here on
            relatives = [os.fspath(relative) for relative in relatives]
            self.rows = [(relative, label) for relative, (_, label) in zip(relatives, self.rows, strict=True)]
            absolute = _any_absolute(relatives)
        self._relatives = relatives
        if inside is not None and not absolute:
            # every row under the root's set (the common case): a chunked lookup, or none for a recorded run
            self.stores = [inside[0]]
            prefix = f"{inside[1]}/" if inside[1] else ""
            self._inner = [prefix + relative for relative in relatives] if prefix else relatives  # type: ignore[assignment]
            self.store_of = np.broadcast_to(np.int16(0), (len(self.rows),))  # every row in set 0, in no memory
            self._run = None if prefix else inside[0].run_of(self._inner)  # type: ignore[arg-type]
            self.positions = (inside[0].run_positions(self._run) if self._run is not None else  # a lookup, or a run
                              inside[0].positions(self._inner, what=f"the images under {self.root}"))  # type: ignore[arg-type]
            return
        if inside is None and not absolute:
            return  # files only
        folders: dict[str, tuple[ShardSet, str] | None] = {}
        inner: list[str | None] = []
        store_of = np.full(len(self.rows), -1, dtype=np.int16)
        for row, (relative, _) in enumerate(self.rows):
            if os.path.isabs(relative):
                folder, name = os.path.split(relative)
                if folder not in folders:
                    folders[folder] = shard_set_of(folder)
                store_and_name, relative = folders[folder], name
            else:
                store_and_name = inside
            if store_and_name is None:
                inner.append(None)
                continue
            inner.append(f"{store_and_name[1]}/{relative}" if store_and_name[1] else relative)
            number = next((k for k, store in enumerate(self.stores) if store is store_and_name[0]), None)
            if number is None:
                number = len(self.stores)
                self.stores.append(store_and_name[0])
            store_of[row] = number
        if not self.stores:
            return
        positions = np.full(len(self.rows), -1, dtype=np.int64)
        for number, store in enumerate(self.stores):
            mine = np.flatnonzero(store_of == number)
            positions[mine] = store.positions([inner[i] for i in mine], what=f"the images under {self.root}")  # type: ignore[misc]
        self.store_of, self.positions, self._inner = store_of, positions, inner
    def __len__(self) -> int:
        return len(self.rows)

    def path(self, index: int) -> str:
        """The file of a row: its path under ``root``, or the path itself when absolute."""
        return os.path.join(self.root, self.rows[index][0])

    def __getitem__(self, index: int) -> Sample:
        label = self.rows[index][1]
        target = self.target_transform(label) if self.target_transform else label
        image = self.guarded(index, self.decode)
        if image is None:
            return Sample(None, target, index)
        return Sample(self.transform(image) if self.transform else image, target, index)

    def guarded(self, index: int, read: Callable[[int], Any]) -> Any:
        """``read(index)``, its failure to read the row's image handled by ``on_bad_image``: ``"fail"`` raises
        :class:`UnreadableImageError` naming the file (and its shard set), ``"skip"`` warns and gives ``None``."""
        try:
            return read(index)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError, RuntimeError, ShardError) as error:
            if isinstance(error, UnreadableImageError):
                raise
            path = self.path(index)
            where = (f"{path} (in the shard set {self.stores[int(self.store_of[index])].root})"  # type: ignore[index]
                     if self.in_shards(index) else path)
            if self.on_bad_image == "fail":
                # a shard set's error says how to repair the set (its source file is fine); a file's is the user's
                fix = "" if isinstance(error, ShardError) else "fix or remove the file, "
                raise UnreadableImageError(
                    f"cannot read image {where} ({type(error).__name__}: {error}); {fix}"
                    "or set on_bad_image='skip' to skip and count unreadable images"
                ) from error
            warnings.warn(f"skipping unreadable image {where}: {error}", RuntimeWarning, stacklevel=3)
            return None

    def in_shards(self, index: int) -> bool:
        return self.store_of is not None and int(self.store_of[index]) >= 0

    def encoded(self, index: int) -> bytes:
        """The bytes of a row's file as stored: the file's, or its copy in its shard set, checked against the
        digest recorded when the set was written (:meth:`ShardSet.read`; a mismatch is a :class:`ShardError`
        naming the set, the part, the sample and its path, handled by :meth:`guarded` like any unreadable image).
        """
        if not self.in_shards(index):
            with open(self.path(index), "rb") as handle:
                return handle.read()
        store = self.stores[int(self.store_of[index])]  # type: ignore[index]
        return store.read(int(self.positions[index]), self._inner[index])  # type: ignore[index, arg-type]

    def decode(self, index: int) -> Image.Image:
        """The image of a row, decoded as RGB: from its file, or from its bytes in its shard set."""
        if not self.in_shards(index):
            return read_rgb_image(self.path(index))
        with Image.open(io.BytesIO(self.encoded(index))) as image:
            return image.convert("RGB")

    def files_fingerprint(self) -> str:
        """:func:`openset_common.files_fingerprint` of the rows' files: the same digest from a shard set
        (whose manifest keeps the source files' sizes and modification times) as from the files."""
        if self._run is not None:
            return self._run["files_fingerprint"]
        paths = self._relatives
        if self.store_of is None:
            return files_fingerprint(self.root, paths)
        if len(self.stores) == 1 and self.store_of.min(initial=0) >= 0:  # every row in one set: chunk by chunk
            hasher = hashlib.sha256()
            for start in range(0, len(paths), CHUNK):
                sizes, mtimes = self.stores[0].stat(self.positions[start:start + CHUNK])  # type: ignore[index]
                fingerprint_rows(hasher, paths[start:start + CHUNK], sizes, mtimes)
            return hasher.hexdigest()
        sizes = np.zeros(len(paths), dtype=np.int64)
        mtimes = np.zeros(len(paths), dtype=np.int64)
        for number, store in enumerate(self.stores):
            mine = np.flatnonzero(self.store_of == number)
            sizes[mine], mtimes[mine] = store.stat(self.positions[mine])  # type: ignore[index]
        for index in np.flatnonzero(self.store_of < 0).tolist():
            info = os.stat(self.path(index))
            sizes[index], mtimes[index] = info.st_size, info.st_mtime_ns
        return listing_fingerprint(paths, sizes, mtimes)

    def labels(self) -> Tensor:
        return torch.tensor([label for _, label in self.rows], dtype=torch.long)

    def without_transform(self) -> ImageFileDataset:
        """The same files and labels yielding raw (decoded PIL) images: an evaluation set, which the scoring
        model transforms itself."""
        return ImageFileDataset(self.root, self.rows, on_bad_image=self.on_bad_image)


def without_unreadable(dataset: ImageFileDataset, *, what: str) -> ImageFileDataset:
    """The same files without those that cannot be decoded (each file decoded once, here; an image of a shard
    set whose bytes are not the ones written counts as one), with one warning that counts them and names the
    first: ``on_bad_image="skip"`` for an evaluation set, whose scoring pass must cover every image it is given."""
    keep, bad = [], []
    for position, row in enumerate(dataset.rows):
        try:
            dataset.decode(position)
            keep.append(row)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError, ShardError):
            bad.append(dataset.path(position))
    if not bad:
        return dataset
    if not keep:
        raise UnreadableImageError(f"{what}: none of its {len(bad)} images can be read (first: {bad[0]})")
    warnings.warn(f"{what}: skipping {len(bad)} unreadable image(s) of {len(dataset.rows)}: {bad[:5]}", RuntimeWarning,
                  stacklevel=2)
    kept = ImageFileDataset(dataset.root, keep, transform=dataset.transform,
                            target_transform=dataset.target_transform, on_bad_image="skip")
    source_classes = getattr(dataset, "source_classes", None)
    if source_classes is not None:
        readable = torch.tensor([dataset.path(i) not in set(bad) for i in range(len(dataset.rows))])
        kept.source_classes = source_classes[readable]  # type: ignore[attr-defined]
    return kept


class TensorImageDataset(Dataset):
    """In-memory images ``(N, C, H, W)`` (uint8 or float) with labels ``(N,)``."""

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
    ) -> None:
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
        self.images = images
        self.labels = labels.long()
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> Sample:
        image = self.images[index]
        image = image.float().div(255) if image.dtype == torch.uint8 else image
        label = int(self.labels[index])
        target = self.target_transform(label) if self.target_transform else label
        return Sample(self.transform(image) if self.transform else image, target, index)

    def without_transform(self) -> TensorImageDataset:
        """The same images and labels as raw float tensors in ``[0, 1]`` (an evaluation set)."""
        return TensorImageDataset(self.images, self.labels)


def dataset_labels(dataset: Dataset) -> Tensor:
    """The labels ``(N,)`` of a data set, in dataset order, without loading an image.

    The one way labels are read: a data set of this project (:class:`ImageFileDataset`,
    :class:`TensorImageDataset`, or any with a ``labels()`` method or a ``labels`` tensor), a ``Subset`` or
    ``ConcatDataset`` of them, or a wrapper that keeps its samples' labels and holds the wrapped set as
    ``.dataset``.
    """
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    if isinstance(dataset, ConcatDataset):
        return torch.cat([dataset_labels(part) for part in dataset.datasets])
    labels = getattr(dataset, "labels", None)
    if callable(labels):
        labels = labels()
    if isinstance(labels, Tensor):
        return labels.long().clone()
    inner = getattr(dataset, "dataset", None)
    if isinstance(inner, Dataset):
        return dataset_labels(inner)
    raise TypeError(f"cannot read the labels of a {type(dataset).__name__}: give it a labels() method")




BALANCED_RULE = "class-balanced: classes in a seeded random order, a seeded permutation within each class, one image per class per round"


def balanced_choice(labels: Tensor | Sequence[int], count: int, seed: int) -> Tensor:
    """The indices of ``count`` images chosen seeded and class-balanced (:data:`BALANCED_RULE`).

    Round ``r`` takes the ``r``-th image of each class's seeded permutation, classes in a seeded order, so
    any prefix of the choice is as balanced as it can be (class sizes differ by at most one while every class
    has images left) and the first rows of a class-sorted list are never favoured. The same labels, count and
    seed give the same indices on every machine (``torch.Generator`` on the CPU).

    Raises:
        ValueError: ``count`` is not positive or exceeds the number of images.
    """
    labels = torch.as_tensor(labels, dtype=torch.long).flatten()
    if count < 1 or count > labels.numel():
        raise ValueError(f"cannot choose {count} of {labels.numel()} images: the count must be in 1..{labels.numel()}")
    generator = torch.Generator().manual_seed(int(seed))
    classes = labels.unique()
    classes = classes[torch.randperm(len(classes), generator=generator)]
    members = [torch.nonzero(labels == c).flatten() for c in classes.tolist()]
    members = [m[torch.randperm(len(m), generator=generator)] for m in members]
    longest = max(len(m) for m in members)
    table = torch.full((longest, len(members)), -1, dtype=torch.long)  # round x class
    for column, indices in enumerate(members):
        table[: len(indices), column] = indices
    order = table.flatten()
    return order[order >= 0][:count].clone()
