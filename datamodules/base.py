"""What every open-set datamodule shares: label handling per loss, class counts, data loaders.

Labels follow DESIGN.md §3 (known ``0..K-1``, negatives ``-1``, unknowns ``-2``). How the training set
treats negatives depends on the loss (Palechor et al. §4), set by ``train_negatives``:

    "include"     EOS: negatives stay in the training set with label -1
    "exclude"     SoftMax: negatives are removed from the training set (not from validation)
    "background"  BG: negatives stay and a target transform maps -1 to the background class K

``train.py`` links this to the model's loss, so a config names the loss once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import pytorch_lightning as pl
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from common import NEGATIVE_LABEL, UNKNOWN_LABEL
from datamodules.batch import Sample, collate_samples
from datamodules.transforms import BackgroundClassTarget

TrainNegatives = Literal["include", "exclude", "background"]
BadImagePolicy = Literal["fail", "skip"]


class UnreadableImageError(RuntimeError):
    """An image file could not be decoded; the message names the file."""


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def read_rgb_image(path: str) -> Image.Image:
    """Open and fully decode an image as RGB (decoding errors surface here, not later)."""
    with Image.open(path) as image:
        return image.convert("RGB")


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

    def __len__(self) -> int:
        return len(self.rows)

    def path(self, index: int) -> str:
        """The file of a row: its path under ``root``, or the path itself when absolute."""
        return os.path.join(self.root, self.rows[index][0])

    def __getitem__(self, index: int) -> Sample:
        relative, label = self.rows[index]
        target = self.target_transform(label) if self.target_transform else label
        path = self.path(index)
        try:
            image = read_rgb_image(path)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as error:
            if self.on_bad_image == "fail":
                raise UnreadableImageError(
                    f"cannot read image {path} ({type(error).__name__}: {error}); fix or remove the file, "
                    "or set on_bad_image='skip' to skip and count unreadable images"
                ) from error
            warnings.warn(f"skipping unreadable image {path}: {error}", RuntimeWarning, stacklevel=2)
            return Sample(None, target, index)
        return Sample(self.transform(image) if self.transform else image, target, index)


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


def dataset_labels(dataset: Dataset) -> Tensor:
    """The labels of an :class:`ImageFileDataset` or :class:`TensorImageDataset`, in dataset order."""
    if isinstance(dataset, TensorImageDataset):
        return dataset.labels.clone()
    if isinstance(dataset, ImageFileDataset):
        return torch.tensor([label for _, label in dataset.rows], dtype=torch.long)
    raise TypeError(f"cannot read the labels of a {type(dataset).__name__}")


class OpenSetDataModule(pl.LightningDataModule):
    """Base class: subclasses set ``num_classes`` and build ``train_set``/``val_set``/``test_set`` in ``setup``."""

    train_set: Dataset | None
    val_set: Dataset | None
    test_set: Dataset | None

    def __init__(
        self,
        *,
        batch_size: int,
        num_workers: int,
        train_negatives: TrainNegatives,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_negatives = check_choice("train_negatives", train_negatives, ("include", "exclude", "background"))
        self.pin_memory = pin_memory
        self.train_set = self.val_set = self.test_set = None
        self._train_labels: list[int] | None = None

    @property
    def num_classes(self) -> int:
        """``K``, the number of known classes."""
        raise NotImplementedError

    @property
    def background_class(self) -> bool:
        return self.train_negatives == "background"

    def filter_train_labels(self, labels: Sequence[int]) -> list[int]:
        """Indices of the training rows kept for this loss (negatives dropped for ``"exclude"``)."""
        bad = [label for label in labels if label == UNKNOWN_LABEL]
        if bad:
            raise ValueError("the training split holds unknown samples (label -2); unknowns belong to the test set only")
        if self.train_negatives == "exclude":
            return [i for i, label in enumerate(labels) if label != NEGATIVE_LABEL]
        return list(range(len(labels)))

    def split_labels(self, split: str) -> Tensor | None:
        """Labels of the ``"train"``, ``"val"`` or ``"test"`` set as set up (``None`` before ``setup``)."""
        dataset = {"train": self.train_set, "val": self.val_set, "test": self.test_set}[check_choice(
            "split", split, ("train", "val", "test"))]
        return None if dataset is None else dataset_labels(dataset)

    def train_target_transform(self) -> Callable | None:
        return BackgroundClassTarget(self.num_classes) if self.background_class else None

    def set_train_labels(self, labels: Sequence[int]) -> None:
        """Record the labels of the training set as used (after filtering, before the target transform)."""
        self._train_labels = list(labels)

    def train_class_counts(self) -> Tensor:
        """Training samples per class: ``(K,)``, or ``(K+1,)`` with the background class last."""
        if self._train_labels is None:
            raise RuntimeError("train_class_counts() needs setup('fit') to have run")
        labels = torch.tensor(self._train_labels, dtype=torch.long)
        if self.background_class:
            labels = torch.where(labels == NEGATIVE_LABEL, self.num_classes, labels)
        labels = labels[labels >= 0]
        return torch.bincount(labels, minlength=self.num_classes + int(self.background_class))

    def _loader(self, dataset: Dataset | None, *, shuffle: bool, stage: str) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"the {stage} set is not set up; call setup() first")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=collate_samples,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True, stage="training")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False, stage="validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False, stage="test")
