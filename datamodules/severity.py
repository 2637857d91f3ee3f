"""Datasets of the C-OOD severity benchmark: the ID test set and the OOD pool's estimation and test images.

A :class:`SeverityDataModule` provides three splits, each yielding :class:`datamodules.batch.Sample`:

    "id"              in-distribution test images; target = the model's class index
    "ood_estimation"  OOD pool images used to estimate each class's severity; target = pool class index
    "ood_test"        OOD pool images of the benchmark; target = pool class index

``group_size`` is ``|Y_ID|`` (1000 for ImageNet). ``fingerprint(split)`` identifies a split's exact
content (files, labels, transform), so cached model outputs are never reused for other data.

- :class:`ImageNetSeverityDataModule`: ImageNet-1k val + the ImageNet-21k pool file of
  :mod:`datamodules.imagenet21k`.
- :class:`FashionSeverityDataModule`: the embedded default. ID = the Fashion-MNIST demo's known classes
  (test images); OOD pool = every other Fashion-MNIST class plus scikit-learn's real 8x8 digits
  (upsampled to 28x28): 16 classes, 4 per level, 13 distinct windows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.base import BadImagePolicy, ImageFileDataset, TensorImageDataset, check_choice
from datamodules.batch import collate_samples
from datamodules.fashion_mnist import CLASS_NAMES, DEBIAN_FASHION_MNIST_DIR, DEMO_KNOWN, load_fashion_mnist
from datamodules.imagenet21k import class_names, class_rng, read_pool_file
from datamodules.protocols import check_class_folders, imagenet1k_wnids

SEVERITY_SPLITS = ("id", "ood_estimation", "ood_test")


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class SeverityDataModule(pl.LightningDataModule):
    """Base class: subclasses build ``self.datasets`` in ``setup`` and set the class lists."""

    def __init__(self, *, batch_size: int, num_workers: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.datasets: dict[str, Dataset] = {}
        self.ood_classes: list[str] = []  # pool class ids (wnids or names), index = OOD target
        self.id_classes: list[str] = []

    @property
    def group_size(self) -> int:
        """``|Y_ID|``: the number of OOD classes per severity level."""
        return len(self.id_classes)

    def ood_class_name(self, index: int) -> str:
        return self.ood_classes[index]

    def _content(self, split: str) -> object:
        raise NotImplementedError

    def fingerprint(self, split: str) -> str:
        """A digest of everything that determines the split's images and labels."""
        check_choice("split", split, SEVERITY_SPLITS)
        return _digest({"class": type(self).__name__, "split": split, "content": self._content(split)})

    def dataset(self, split: str) -> Dataset:
        check_choice("split", split, SEVERITY_SPLITS)
        if split not in self.datasets:
            self.setup()
        return self.datasets[split]

    def dataloader(self, split: str) -> DataLoader:
        return DataLoader(self.dataset(split), batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          collate_fn=collate_samples, persistent_workers=False)

    def targets(self, split: str) -> torch.Tensor:
        """Targets of every sample of a split, in dataset order."""
        dataset = self.dataset(split)
        if isinstance(dataset, TensorImageDataset):
            return dataset.labels.clone()
        return torch.tensor([label for _, label in dataset.rows], dtype=torch.long)  # type: ignore[attr-defined]


class ImageNetSeverityDataModule(SeverityDataModule):
    """ImageNet-1k validation images (ID) and the sampled ImageNet-21k pool (OOD).

    Args:
        id_root: ImageNet-1k validation folder with class sub-folders (``<id_root>/<wnid>/*.JPEG``).
        pool_root: ImageNet-21k folder (``<pool_root>/<wnid>/*``).
        pool_file: the pool file of ``python -m datamodules.imagenet21k sample``.
        transform: the model's evaluation transform (set by the benchmark from the model).
    """

    def __init__(
        self,
        id_root: str,
        pool_root: str,
        pool_file: str,
        transform: Callable | None = None,
        batch_size: int = 64,
        num_workers: int = 8,
        on_bad_image: BadImagePolicy = "fail",
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        self.id_root, self.pool_root, self.pool_file = str(id_root), str(pool_root), str(pool_file)
        self.transform = transform
        self.on_bad_image = on_bad_image
        self.id_classes = imagenet1k_wnids()
        self._rows: dict[str, list[tuple[str, int]]] | None = None

    def ood_class_name(self, index: int) -> str:
        wnid = self.ood_classes[index]
        return f"{wnid} {class_names().get(wnid, '')}".strip()

    def _load_rows(self) -> dict[str, list[tuple[str, int]]]:
        if self._rows is None:
            pool = read_pool_file(self.pool_file)
            self.ood_classes = sorted({wnid for _, wnid, _ in pool})
            index = {wnid: i for i, wnid in enumerate(self.ood_classes)}
            check_class_folders(self.id_root, {".": self.id_classes})
            check_class_folders(self.pool_root, {".": self.ood_classes})
            id_rows = [(f"{wnid}/{p.name}", label) for label, wnid in enumerate(self.id_classes)
                       for p in sorted(Path(self.id_root, wnid).iterdir()) if p.is_file()]
            self._rows = {
                "id": id_rows,
                "ood_estimation": [(path, index[wnid]) for path, wnid, split in pool if split == "estimation"],
                "ood_test": [(path, index[wnid]) for path, wnid, split in pool if split == "test"],
            }
        return self._rows

    def _content(self, split: str) -> object:
        return {"rows": _digest(self._load_rows()[split]), "transform": repr(self.transform),
                "root": Path(self.id_root if split == "id" else self.pool_root).name}

    def setup(self, stage: str | None = None) -> None:
        rows = self._load_rows()
        for split in SEVERITY_SPLITS:
            root = self.id_root if split == "id" else self.pool_root
            self.datasets[split] = ImageFileDataset(root, rows[split], transform=self.transform, on_bad_image=self.on_bad_image)


def load_digits_images(size: int = 28) -> tuple[torch.Tensor, np.ndarray]:
    """scikit-learn's real 8x8 digits (1,797 images, 0-16 grey levels) as ``(N, 1, size, size)`` in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images.clamp(0, 1), digits.target.astype(np.int64)


class FashionSeverityDataModule(SeverityDataModule):
    """The embedded default (see the module docstring).

    Args:
        known: Fashion-MNIST class ids the model was trained on (its classes ``0..K-1`` in this order).
        estimation, test: images per OOD class for severity estimation and for the benchmark.
    """

    def __init__(
        self,
        data_dir: str = DEBIAN_FASHION_MNIST_DIR,
        known: Sequence[int] = DEMO_KNOWN,
        estimation: int = 100,
        test: int = 50,
        seed: int = 0,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        self.data_dir = data_dir
        self.known = sorted(known)
        self.estimation, self.test, self.seed = estimation, test, seed
        self.id_classes = [CLASS_NAMES[c] for c in self.known]
        others = [CLASS_NAMES[c] for c in range(10) if c not in self.known]
        self.ood_classes = [f"fashion: {name}" for name in others] + [f"digit {d}" for d in range(10)]

    def _content(self, split: str) -> object:
        return {"data": Path(self.data_dir).name, "known": self.known, "estimation": self.estimation,
                "test": self.test, "seed": self.seed}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        images, classes = load_fashion_mnist(self.data_dir, "test")
        id_mask = np.isin(classes, self.known)
        id_labels = np.searchsorted(np.array(self.known), classes[id_mask])
        self.datasets["id"] = TensorImageDataset(torch.from_numpy(images[id_mask].copy()).unsqueeze(1),
                                                 torch.from_numpy(id_labels))
        # OOD pool: the other Fashion-MNIST classes (training images) and the digits
        train_images, train_classes = load_fashion_mnist(self.data_dir, "train")
        pool_images = [torch.from_numpy(train_images[train_classes == c].copy()).unsqueeze(1).float() / 255
                       for c in range(10) if c not in self.known]
        digit_images, digit_classes = load_digits_images()
        pool_images += [digit_images[digit_classes == d] for d in range(10)]
        per_class = self.estimation + self.test
        parts: dict[str, list[torch.Tensor]] = {"ood_estimation": [], "ood_test": []}
        labels: dict[str, list[int]] = {"ood_estimation": [], "ood_test": []}
        for index, class_images in enumerate(pool_images):
            if class_images.shape[0] < per_class:
                raise ValueError(f"OOD class {self.ood_classes[index]!r} has {class_images.shape[0]} images, "
                                 f"fewer than estimation + test = {per_class}")
            rng = class_rng(self.seed, f"n{index:08d}")
            chosen = torch.from_numpy(rng.choice(class_images.shape[0], size=per_class, replace=False))
            for split, take in (("ood_estimation", chosen[: self.estimation]), ("ood_test", chosen[self.estimation:])):
                parts[split].append(class_images[take])
                labels[split] += [index] * len(take)
        for split in parts:
            self.datasets[split] = TensorImageDataset(torch.cat(parts[split]), torch.tensor(labels[split]))
