"""Datasets of the C-OOD severity benchmark: the ID test set and the OOD pool's estimation and test images.

A :class:`SeverityDataModule` provides three splits, each yielding :class:`datamodules.batch.Sample`:

    "id"              in-distribution test images; target = the model's class index
    "ood_estimation"  OOD pool images used to estimate each class's severity; target = pool class index
    "ood_test"        OOD pool images of the benchmark; target = pool class index

``group_size`` is ``|Y_ID|`` (1000 for ImageNet, ``K`` for a protocol model). ``fingerprint(split)``
identifies a split's exact content (file list, file sizes and modification times, labels, transform), so
cached model outputs are never reused for other data. OOD images are always images the model never saw
in training; ``ood_class_role(c)`` says whether pool class ``c`` was seen in training as a negative.

- :class:`ImageNetSeverityDataModule`: ImageNet-1k val + the ImageNet-21k pool file of
  :mod:`datamodules.imagenet21k` (for any ImageNet-1k classifier).
- :class:`ProtocolSeverityDataModule`: a model trained on protocol P1-P3 (DESIGN.md §5.2): ID = the
  protocol's known classes (their ``val/`` images); pool = the protocol's unknown classes, estimation
  images from their ILSVRC2012 ``train/`` folders (never used by the protocol) and test images from their
  ``val/`` folders; optionally plus an ImageNet-21k pool file.
- :class:`FashionSeverityDataModule`: the embedded default. ID = the Fashion-MNIST demo's known classes
  (official test images); pool = every other Fashion-MNIST class (official test images: the demo trains
  only on training images) plus scikit-learn's real 8x8 digits (upsampled to 28x28).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from common import digest, files_fingerprint
from datamodules.batch import collate_samples
from datamodules.imagenet21k import class_names, class_rng, read_pool_file
from datamodules.images import (
    BadImagePolicy,
    ImageFileDataset,
    TensorImageDataset,
    check_choice,
    dataset_labels,
)
from datamodules.protocols import check_class_folders, image_files, imagenet1k_wnids, imagenet_protocol
from datamodules.sources import (
    CLASS_NAMES,
    DEBIAN_FASHION_MNIST_DIR,
    DEMO_KNOWN,
    DEMO_NEGATIVE,
    load_digits_images,
    load_fashion_mnist,
)

SEVERITY_SPLITS = ("id", "ood_estimation", "ood_test")
UNSEEN = "no"
TRAINING_NEGATIVE = "as a negative"


class SeverityDataModule(pl.LightningDataModule):
    """Base class: subclasses build ``self.datasets`` in ``setup`` and set the class lists."""

    def __init__(self, *, batch_size: int, num_workers: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.datasets: dict[str, Dataset] = {}
        self.ood_classes: list[str] = []  # pool class ids (wnids or names), index = OOD target
        self.ood_roles: dict[int, str] = {}  # pool classes the model saw in training (as negatives)
        self.id_classes: list[str] = []
        self._fingerprints: dict[str, str] = {}

    @property
    def group_size(self) -> int:
        """``|Y_ID|``: the number of OOD classes per severity level."""
        return len(self.id_classes)

    def ood_class_name(self, index: int) -> str:
        return self.ood_classes[index]

    def ood_class_role(self, index: int) -> str:
        """``"no"`` for a class the model never saw in training, ``"as a negative"`` for a training negative."""
        return self.ood_roles.get(index, UNSEEN)

    def _content(self, split: str) -> object:
        raise NotImplementedError

    def fingerprint(self, split: str) -> str:
        """A digest of everything that determines the split's images and labels (computed once per split)."""
        check_choice("split", split, SEVERITY_SPLITS)
        if split not in self._fingerprints:
            self._fingerprints[split] = digest({"class": type(self).__name__, "split": split,
                                                "content": self._content(split)})
        return self._fingerprints[split]

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
        return dataset_labels(self.dataset(split))


class _FileSeverityDataModule(SeverityDataModule):
    """Severity data read from image files: ``rows(split)`` gives ``(path, label)``, absolute or under ``root(split)``."""

    def __init__(self, *, transform: Callable | None, batch_size: int, num_workers: int,
                 on_bad_image: BadImagePolicy) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        self.transform = transform
        self.on_bad_image = on_bad_image
        self._rows: dict[str, list[tuple[str, int]]] | None = None

    def _load_rows(self) -> dict[str, list[tuple[str, int]]]:
        raise NotImplementedError

    def root(self, split: str) -> str:
        raise NotImplementedError

    def rows(self, split: str) -> list[tuple[str, int]]:
        if self._rows is None:
            self._rows = self._load_rows()
        return self._rows[split]

    def _content(self, split: str) -> object:
        rows = self.rows(split)
        return {"rows": digest(rows), "files": files_fingerprint(self.root(split), [path for path, _ in rows]),
                "transform": repr(self.transform)}

    def setup(self, stage: str | None = None) -> None:
        for split in SEVERITY_SPLITS:
            if split not in self.datasets:
                self.datasets[split] = ImageFileDataset(self.root(split), self.rows(split), transform=self.transform,
                                                        on_bad_image=self.on_bad_image)


class ImageNetSeverityDataModule(_FileSeverityDataModule):
    """ImageNet-1k validation images (ID) and the sampled ImageNet-21k pool (OOD).

    Args:
        id_root: ImageNet-1k validation folder with class sub-folders (``<id_root>/<wnid>/*.JPEG``).
        pool_root: ImageNet-21k folder (``<pool_root>/<wnid>/*``).
        pool_file: the pool file of ``python -m datamodules.imagenet21k sample``.
        transform: the model's evaluation transform (set by ``evaluate.py`` from the model).
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
        super().__init__(transform=transform, batch_size=batch_size, num_workers=num_workers, on_bad_image=on_bad_image)
        self.id_root, self.pool_root, self.pool_file = str(id_root), str(pool_root), str(pool_file)
        self.id_classes = imagenet1k_wnids()

    def root(self, split: str) -> str:
        return self.id_root if split == "id" else self.pool_root

    def ood_class_name(self, index: int) -> str:
        wnid = self.ood_classes[index]
        return f"{wnid} {class_names().get(wnid, '')}".strip()

    def _load_rows(self) -> dict[str, list[tuple[str, int]]]:
        pool = read_pool_file(self.pool_file)
        self.ood_classes = sorted({wnid for _, wnid, _ in pool})
        index = {wnid: i for i, wnid in enumerate(self.ood_classes)}
        check_class_folders(self.id_root, {".": self.id_classes})
        check_class_folders(self.pool_root, {".": self.ood_classes})
        return {
            "id": [(f"{wnid}/{name}", label) for label, wnid in enumerate(self.id_classes)
                   for name in image_files(Path(self.id_root, wnid))],
            "ood_estimation": [(path, index[wnid]) for path, wnid, split in pool if split == "estimation"],
            "ood_test": [(path, index[wnid]) for path, wnid, split in pool if split == "test"],
        }

    def setup(self, stage: str | None = None) -> None:
        self.rows("id")
        super().setup(stage)


class ProtocolSeverityDataModule(_FileSeverityDataModule):
    """Severity data for a model trained on ImageNet protocol P1, P2 or P3 (see the module docstring).

    Args:
        root: ILSVRC2012 folder with ``train/<wnid>/`` and ``val/<wnid>/`` class folders.
        protocol: 1, 2 or 3.
        estimation: estimation images per unknown class, sampled (seeded per class) from its ``train/``
            folder (150 in the paper).
        test: test images per unknown class from its ``val/`` folder (``None``: all, 50 in ILSVRC2012).
        pool_root, pool_file: optionally add an ImageNet-21k pool (``python -m datamodules.imagenet21k
            sample``; filtered against ImageNet-1k, so also against the protocol's classes); its estimation
            and test images are used as sampled.
        transform: the evaluation transform (the protocol datamodule passes its own).
    """

    def __init__(
        self,
        root: str,
        protocol: int = 1,
        estimation: int = 150,
        test: int | None = None,
        seed: int = 0,
        pool_root: str | None = None,
        pool_file: str | None = None,
        transform: Callable | None = None,
        batch_size: int = 64,
        num_workers: int = 8,
        on_bad_image: BadImagePolicy = "fail",
    ) -> None:
        super().__init__(transform=transform, batch_size=batch_size, num_workers=num_workers, on_bad_image=on_bad_image)
        if (pool_root is None) != (pool_file is None):
            raise ValueError("give both pool_root and pool_file for the ImageNet-21k pool, or neither")
        if estimation < 1 or (test is not None and test < 1):
            raise ValueError(f"estimation and test must be positive, got {estimation} and {test}")
        self.root_dir, self.protocol_number = str(root), protocol
        self.protocol = imagenet_protocol(protocol)
        self.estimation, self.test, self.seed = estimation, test, seed
        self.pool_root, self.pool_file = pool_root, pool_file
        self.id_classes = list(self.protocol.known)

    def root(self, split: str) -> str:
        return self.root_dir  # 21k pool rows carry absolute paths

    def ood_class_name(self, index: int) -> str:
        wnid = self.ood_classes[index]
        return f"{wnid} {class_names().get(wnid, '')}".strip()

    def _sample(self, wnid: str, folder: str, count: int | None) -> list[str]:
        files = image_files(Path(self.root_dir, folder, wnid))
        if count is None:
            return files
        if len(files) < count:
            raise ValueError(f"unknown class {wnid} has {len(files)} images in {folder}/, fewer than the {count} "
                             f"{'estimation' if folder == 'train' else 'test'} images asked for")
        return [files[i] for i in sorted(class_rng(self.seed, wnid).choice(len(files), size=count, replace=False))]

    def _load_rows(self) -> dict[str, list[tuple[str, int]]]:
        protocol = self.protocol
        check_class_folders(self.root_dir, {"val": protocol.known + protocol.unknown, "train": protocol.unknown})
        self.ood_classes = list(protocol.unknown)
        rows: dict[str, list[tuple[str, int]]] = {
            "id": [(f"val/{wnid}/{name}", label) for label, wnid in enumerate(protocol.known)
                   for name in image_files(Path(self.root_dir, "val", wnid))],
            "ood_estimation": [(f"train/{wnid}/{name}", index) for index, wnid in enumerate(protocol.unknown)
                               for name in self._sample(wnid, "train", self.estimation)],
            "ood_test": [(f"val/{wnid}/{name}", index) for index, wnid in enumerate(protocol.unknown)
                         for name in self._sample(wnid, "val", self.test)],
        }
        if self.pool_file is not None:
            seen = set(protocol.known) | set(protocol.negative) | set(protocol.unknown)
            pool = [row for row in read_pool_file(self.pool_file) if row[1] not in seen]
            extra = sorted({wnid for _, wnid, _ in pool})
            check_class_folders(self.pool_root, {".": extra})
            index = {wnid: len(self.ood_classes) + i for i, wnid in enumerate(extra)}
            self.ood_classes += extra
            for path, wnid, split in pool:
                rows[f"ood_{split}"].append((str(Path(self.pool_root, path).resolve()), index[wnid]))
        return rows

    def setup(self, stage: str | None = None) -> None:
        self.rows("id")
        super().setup(stage)


class FashionSeverityDataModule(SeverityDataModule):
    """The embedded default (see the module docstring).

    Args:
        known: Fashion-MNIST class ids the model was trained on (its classes ``0..K-1`` in this order).
        negative: class ids the model saw in training as negatives; they stay in the pool (their official
            test images, which the model never saw) and the level tables mark them.
        include_negatives: keep the negative classes in the pool.
        estimation, test: images per OOD class for severity estimation and for the benchmark.
    """

    def __init__(
        self,
        data_dir: str = DEBIAN_FASHION_MNIST_DIR,
        known: Sequence[int] = DEMO_KNOWN,
        negative: Sequence[int] = DEMO_NEGATIVE,
        include_negatives: bool = True,
        estimation: int = 100,
        test: int = 50,
        seed: int = 0,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        self.data_dir = data_dir
        self.known, self.negative = sorted(known), sorted(negative)
        if set(self.known) & set(self.negative):
            raise ValueError(f"classes {sorted(set(self.known) & set(self.negative))} are both known and negative")
        self.include_negatives = include_negatives
        self.estimation, self.test, self.seed = estimation, test, seed
        self.id_classes = [CLASS_NAMES[c] for c in self.known]
        self.fashion_pool = [c for c in range(10) if c not in self.known
                             and (include_negatives or c not in self.negative)]
        self.ood_classes = [f"fashion: {CLASS_NAMES[c]}" for c in self.fashion_pool] + [f"digit {d}" for d in range(10)]
        self.ood_roles = {i: TRAINING_NEGATIVE for i, c in enumerate(self.fashion_pool) if c in self.negative}

    def _content(self, split: str) -> object:
        return {"data": Path(self.data_dir).name, "known": self.known, "pool": self.fashion_pool,
                "estimation": self.estimation, "test": self.test, "seed": self.seed, "images": "test split"}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        # Only official test images of Fashion-MNIST: the demo model trains on (part of) the training images,
        # negatives included, so none of those may serve as OOD data.
        images, classes = load_fashion_mnist(self.data_dir, "test")
        id_mask = np.isin(classes, self.known)
        id_labels = np.searchsorted(np.array(self.known), classes[id_mask])
        self.datasets["id"] = TensorImageDataset(torch.from_numpy(images[id_mask].copy()).unsqueeze(1),
                                                 torch.from_numpy(id_labels))
        pool_images = [torch.from_numpy(images[classes == c].copy()).unsqueeze(1).float() / 255 for c in self.fashion_pool]
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
