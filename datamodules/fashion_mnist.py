"""The embedded default: an open-set protocol on the real Fashion-MNIST data set.

Fashion-MNIST (Xiao, Rasul, Vollgraf, 2017) has ten classes of 28x28 grey-scale clothing images. The
demo protocol mirrors the ImageNet protocols on a small scale:

    known     T-shirt/top, Trouser, Sneaker, Bag     -> labels 0..3 (in class-index order)
    negative  Pullover, Dress, Sandal                -> -1 (seen in training as "other")
    unknown   Coat, Shirt, Ankle boot                -> -2 (never seen)

The unknowns are near the knowns and negatives (a coat looks like a pullover, a shirt like a T-shirt, an
ankle boot like a sneaker and a sandal), so rejecting them is not trivial.

Train/val: the official training images of the known and negative classes, split with the ImageNet
protocols' rule (``train_test_split(train_size=0.8, stratify=class, random_state=42)``). Test: the
official test images of all ten classes.

The IDX files come from Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``);
where it is missing, ``prepare_data`` falls back to torchvision's download into ``download_dir``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torchvision import transforms as T

from datamodules.images import TensorImageDataset
from datamodules.open_set import OpenSetDataModule, TrainNegatives
from datamodules.severity import FashionSeverityData
from datamodules.sources import (
    CLASS_NAMES,
    DEBIAN_FASHION_MNIST_DIR,
    DEMO_KNOWN,
    DEMO_NEGATIVE,
    DEMO_UNKNOWN,
    find_fashion_mnist,
    load_fashion_mnist,
    require_fashion_mnist,
)
from datamodules.transforms import ModelInput, TensorPipeline


def open_set_labels(classes: np.ndarray, known: Sequence[int], negative: Sequence[int], unknown: Sequence[int]) -> np.ndarray:
    """Map original class ids to project labels; classes in no role get ``-3`` (to be dropped)."""
    mapping = np.full(max(max(known), max(negative, default=0), max(unknown, default=0)) + 1, -3, dtype=np.int64)
    mapping[list(known)] = np.arange(len(known))
    mapping[list(negative)] = -1
    mapping[list(unknown)] = -2
    out = np.full(classes.shape, -3, dtype=np.int64)
    inside = classes < len(mapping)
    out[inside] = mapping[classes[inside]]
    return out


class FashionMNISTOpenSetDataModule(OpenSetDataModule):
    """Fashion-MNIST open-set protocol (see the module docstring).

    Args:
        data_dir: folder with the IDX files (Debian's by default).
        download: download them with torchvision into ``download_dir`` when ``data_dir`` has none (off: a
            missing file is an error that says where the files must be; nothing is downloaded unasked).
        download_dir: where ``download`` puts them.
        known, negative, unknown: original class ids (0-9) of each role.
        train_negatives: ``"include"`` / ``"exclude"`` / ``"background"``, linked to the loss.
        max_train_per_class: keep at most this many training images per class (a faster demo).
        image_size: side of the images served (28, the original; e.g. 32 for the generators, bilinear with
            antialiasing).
    """

    def __init__(
        self,
        data_dir: str = DEBIAN_FASHION_MNIST_DIR,
        download_dir: str = "data/fashion-mnist",
        known: Sequence[int] = DEMO_KNOWN,
        negative: Sequence[int] = DEMO_NEGATIVE,
        unknown: Sequence[int] = DEMO_UNKNOWN,
        train_negatives: TrainNegatives = "include",
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_per_class: int | None = None,
        seed: int = 42,
        image_size: int = 28,
        download: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, train_negatives=train_negatives)
        self.save_hyperparameters()
        roles = [*known, *negative, *unknown]
        if len(set(roles)) != len(roles) or not set(roles) <= set(range(10)) or not known:
            raise ValueError(f"known/negative/unknown must be disjoint class ids in 0..9, got {known}/{negative}/{unknown}")
        self.known, self.negative, self.unknown = sorted(known), sorted(negative), sorted(unknown)
        self.data_dir, self.download_dir, self.download = data_dir, download_dir, download
        self.max_train_per_class = max_train_per_class
        self.seed = seed
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8, got {image_size}")
        self.image_size = image_size
        self.transform = None if image_size == 28 else T.Resize((image_size, image_size), antialias=True)

    @property
    def num_classes(self) -> int:
        return len(self.known)

    @property
    def class_names(self) -> list[str]:
        return [CLASS_NAMES[c] for c in self.known]

    def model_input(self) -> ModelInput:
        """Grey-scale tensors at ``image_size`` (bilinear, antialiased), no normalisation: what the models
        trained here take; other sets are converted to one channel and resized by this rule."""
        return ModelInput(TensorPipeline(self.image_size, 1), size=(self.image_size, self.image_size), channels=1)

    def _folder(self) -> str:
        """The folder of the IDX files: ``data_dir``, or ``download_dir`` after a download; else the error
        :class:`datamodules.sources.FashionMNISTMissing` saying where the files must be."""
        if find_fashion_mnist(self.data_dir) is None and (self.download or find_fashion_mnist(self.download_dir)):
            return self.download_dir
        require_fashion_mnist(self.data_dir)
        return self.data_dir

    def prepare_data(self) -> None:
        if find_fashion_mnist(self.data_dir) is not None or find_fashion_mnist(self.download_dir) is not None:
            return
        if not self.download:
            require_fashion_mnist(self.data_dir)  # the error says where the files must be
        from torchvision.datasets import FashionMNIST

        for train in (True, False):
            FashionMNIST(self.download_dir, train=train, download=True)

    def _labels(self, classes: np.ndarray) -> np.ndarray:
        return open_set_labels(classes, self.known, self.negative, self.unknown)

    def split_train_val(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of the official training images in the train and val sets, and their class ids."""
        _, classes = load_fashion_mnist(self._folder(), "train")
        pool = np.flatnonzero(np.isin(classes, self.known + self.negative))
        if self.max_train_per_class is not None:
            rng = np.random.default_rng(self.seed)
            pool = np.sort(np.concatenate([
                rng.choice(np.flatnonzero(classes == c), size=min(self.max_train_per_class, int((classes == c).sum())),
                           replace=False)
                for c in self.known + self.negative
            ]))
        train_idx, val_idx = train_test_split(pool, train_size=0.8, stratify=classes[pool], random_state=42)
        return np.asarray(train_idx), np.asarray(val_idx), classes

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit", "validate"):
            images, _ = load_fashion_mnist(self._folder(), "train")
            train_idx, val_idx, classes = self.split_train_val()
            images_t = torch.from_numpy(images.copy()).unsqueeze(1)
            labels = self._labels(classes)
            kept = train_idx[self.filter_train_labels(labels[train_idx].tolist())]
            self.set_train_labels(labels[kept].tolist())
            self.train_set = TensorImageDataset(
                images_t[kept], torch.from_numpy(labels[kept]), transform=self.transform,
                target_transform=self.train_target_transform()
            )
            self.val_set = TensorImageDataset(images_t[val_idx], torch.from_numpy(labels[val_idx]),
                                              transform=self.transform)
        if stage in (None, "test", "predict"):
            images, classes = load_fashion_mnist(self._folder(), "test")
            labels = self._labels(classes)
            keep = labels != -3
            self.test_set = TensorImageDataset(
                torch.from_numpy(images[keep].copy()).unsqueeze(1), torch.from_numpy(labels[keep]),
                transform=self.transform,
            )

    def severity_data(self, **kwargs: Any) -> FashionSeverityData:
        """The C-OOD severity data of a model trained here: ID = the known classes (test images), pool = the
        other Fashion-MNIST classes (test images; negatives marked) and scikit-learn's digits."""
        return FashionSeverityData(**{"data_dir": self._folder(), "known": self.known, "negative": self.negative,
                                      **kwargs})

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        return self.test_dataloader()
