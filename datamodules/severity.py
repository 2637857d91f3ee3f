"""The data of the C-OOD severity benchmark (Galil, Dabbah, El-Yaniv, ICLR 2023; DESIGN.md §5.2): small
constructors of the evaluation data (:class:`datamodules.evaluation.EvaluationData`).

A :class:`SeverityData` holds three evaluation sets, each yielding raw images with
:class:`datamodules.batch.Sample`:

    "id_test"         in-distribution test images; target = the model's class index       (role id_test)
    "ood_estimation"  OOD pool images that estimate each class's severity; target = pool class (estimation)
    "ood_test"        OOD pool images of the benchmark; target = pool class index            (role ood)

``group_size`` is ``|Y_ID|`` (1000 for ImageNet, ``K`` for a protocol model); ``classes`` the ID classes in
label order (a model of other classes is refused by name). OOD images are always images the model never
saw in training; ``ood_class_role(c)`` says whether pool class ``c`` was seen in training as a negative.

- :class:`ImageNetSeverityData`: ImageNet-1k val + the ImageNet-21k pool file of :mod:`datamodules.imagenet21k`
  (for any ImageNet-1k classifier).
- :class:`FolderSeverityData`: a model trained on class folders (``train/<class>/``, ``val/<class>/``) with
  known and unknown classes: ID = the known classes' ``val/`` images; pool = the unknown classes, estimation
  images from their ``train/`` folders (which training never used) and test images from their ``val/``
  folders; optionally plus an ImageNet-21k pool file. :class:`ProtocolSeverityData` is it for the classes of
  protocol P1, P2 or P3.
- :class:`FashionSeverityData`: the embedded default. ID = the Fashion-MNIST demo's known classes (official
  test images); pool = every other Fashion-MNIST class (official test images: the demo trains only on
  training images) plus scikit-learn's real 8x8 digits (upsampled to 28x28).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from datamodules.evaluation import EvaluationData, EvaluationSet
from datamodules.imagenet21k import class_names, class_rng, read_pool_file
from datamodules.images import (
    BadImagePolicy,
    ImageFileDataset,
    TensorImageDataset,
    image_files,
    non_image_files,
    without_unreadable,
)
from datamodules.protocols import check_class_folders, imagenet1k_wnids, imagenet_protocol
from datamodules.sources import (
    CLASS_NAMES,
    DEBIAN_FASHION_MNIST_DIR,
    DEMO_KNOWN,
    DEMO_NEGATIVE,
    load_digits_images,
    load_fashion_mnist,
)

SEVERITY_SETS = ("id_test", "ood_estimation", "ood_test")
ROLES = {"id_test": "id_test", "ood_estimation": "estimation", "ood_test": "ood"}
UNSEEN = "no"
TRAINING_NEGATIVE = "as a negative"


class SeverityData(EvaluationData):
    """The ID test set and the OOD pool's estimation and test images (see the module docstring).

    Subclasses set ``classes`` (the ID classes), ``ood_classes`` (pool class ids, index = OOD target) and
    ``ood_roles`` (pool classes the model saw in training as negatives), and add the three sets in
    :meth:`build`.
    """

    def __init__(self, *, batch_size: int, num_workers: int, classes: Sequence[str]) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, classes=classes)
        self.ood_classes: list[str] = []
        self.ood_roles: dict[int, str] = {}

    @property
    def group_size(self) -> int:
        """``|Y_ID|``: the number of OOD classes per severity level."""
        return len(self.classes or [])

    def ood_class_name(self, index: int) -> str:
        return self.ood_classes[index]

    def ood_class_role(self, index: int) -> str:
        """``"no"`` for a class the model never saw in training, ``"as a negative"`` for a training negative."""
        return self.ood_roles.get(index, UNSEEN)

    def _add_split(self, name: str, dataset: torch.utils.data.Dataset) -> None:
        self.add(EvaluationSet(name, ROLES[name], dataset))  # type: ignore[arg-type]


def check_populated(root: str | Path, folders: dict[str, dict[str, Sequence[str]]]) -> None:
    """Refuse class folders without an image: a known class without test images would be left out of the ID
    test set (a benchmark of other classes than the model's), an unknown class would be a pool class without
    test images.

    Args:
        root: the folder the class folders lie under.
        folders: ``{split folder ("." for root itself): {role: classes}}``.

    Raises:
        ValueError: naming every empty class folder, its role and the files in it that are not images.
    """
    empty = []
    for split, roles in folders.items():
        for role, classes in roles.items():
            for wnid in classes:
                folder = Path(root, split, wnid)
                if image_files(folder, warn=False):
                    continue
                others = non_image_files(folder)
                ignored = f"; {len(others)} other files ignored: {', '.join(others[:3])}" if others else ""
                empty.append(f"{Path(split, wnid).as_posix()} ({role} class{ignored})")
    if empty:
        raise ValueError(f"{len(empty)} class folders under {root} hold no image: {', '.join(empty)}")


class _FileSeverityData(SeverityData):
    """Severity data read from image files: :meth:`rows` gives ``(path, label)`` per set, absolute or under
    :meth:`root`; the files are listed (and every class folder checked) in :meth:`setup`."""

    def __init__(self, *, classes: Sequence[str], batch_size: int, num_workers: int,
                 on_bad_image: BadImagePolicy) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, classes=classes)
        self.on_bad_image = on_bad_image

    def rows(self) -> dict[str, list[tuple[str, int]]]:
        raise NotImplementedError

    def root(self, name: str) -> str:
        raise NotImplementedError

    def build(self) -> None:
        for name, rows in self.rows().items():
            dataset = ImageFileDataset(self.root(name), rows, on_bad_image=self.on_bad_image)
            if self.on_bad_image == "skip":  # a scoring pass covers every image it is given: decode each once here
                dataset = without_unreadable(dataset, what=f"severity set {name}")
            self._add_split(name, dataset)


class ImageNetSeverityData(_FileSeverityData):
    """ImageNet-1k validation images (ID) and the sampled ImageNet-21k pool (OOD).

    Args:
        id_root: ImageNet-1k validation folder with class sub-folders (``<id_root>/<wnid>/*.JPEG``).
        pool_root: ImageNet-21k folder (``<pool_root>/<wnid>/*``).
        pool_file: the pool file of ``python -m datamodules.imagenet21k sample``.
    """

    def __init__(self, id_root: str, pool_root: str, pool_file: str, batch_size: int = 64, num_workers: int = 8,
                 on_bad_image: BadImagePolicy = "fail") -> None:
        super().__init__(classes=imagenet1k_wnids(), batch_size=batch_size, num_workers=num_workers,
                         on_bad_image=on_bad_image)
        self.id_root, self.pool_root, self.pool_file = str(id_root), str(pool_root), str(pool_file)

    def root(self, name: str) -> str:
        return self.id_root if name == "id_test" else self.pool_root

    def ood_class_name(self, index: int) -> str:
        wnid = self.ood_classes[index]
        return f"{wnid} {class_names().get(wnid, '')}".strip()

    def rows(self) -> dict[str, list[tuple[str, int]]]:
        pool = read_pool_file(self.pool_file)
        self.ood_classes = sorted({wnid for _, wnid, _ in pool})
        index = {wnid: i for i, wnid in enumerate(self.ood_classes)}
        check_class_folders(self.id_root, {".": self.classes or []})
        check_class_folders(self.pool_root, {".": self.ood_classes})
        check_populated(self.id_root, {".": {"known": self.classes or []}})
        return {
            "id_test": [(f"{wnid}/{name}", label) for label, wnid in enumerate(self.classes or [])
                        for name in image_files(Path(self.id_root, wnid))],
            "ood_estimation": [(path, index[wnid]) for path, wnid, split in pool if split == "estimation"],
            "ood_test": [(path, index[wnid]) for path, wnid, split in pool if split == "test"],
        }


class FolderSeverityData(_FileSeverityData):
    """Severity data of a model trained on class folders (see the module docstring).

    Args:
        root: folder with ``train/<class>/`` and ``val/<class>/`` class folders (an ILSVRC2012 folder).
        known: the model's classes, in label order.
        unknown: the classes the model never saw: the OOD pool.
        negative: classes the model saw in training as negatives (marked in the level tables; they are not
            in the pool, whose estimation images come from ``train/``).
        estimation: estimation images per unknown class, sampled (seeded per class) from its ``train/``
            folder (150 in the paper).
        test: test images per unknown class from its ``val/`` folder (``None``: all, 50 in ILSVRC2012).
        pool_root, pool_file: optionally add an ImageNet-21k pool (``python -m datamodules.imagenet21k
            sample``; filtered against ImageNet-1k, so also against the known classes); its estimation and
            test images are used as sampled.
    """

    def __init__(self, root: str, known: Sequence[str], unknown: Sequence[str], negative: Sequence[str] = (),
                 estimation: int = 150, test: int | None = None, seed: int = 0, pool_root: str | None = None,
                 pool_file: str | None = None, batch_size: int = 64, num_workers: int = 8,
                 on_bad_image: BadImagePolicy = "fail") -> None:
        super().__init__(classes=list(known), batch_size=batch_size, num_workers=num_workers, on_bad_image=on_bad_image)
        if (pool_root is None) != (pool_file is None):
            raise ValueError("give both pool_root and pool_file for the ImageNet-21k pool, or neither")
        if estimation < 1 or (test is not None and test < 1):
            raise ValueError(f"estimation and test must be positive, got {estimation} and {test}")
        if not unknown and pool_file is None:
            raise ValueError("the OOD pool is empty: give unknown classes or an ImageNet-21k pool_file")
        self.root_dir = str(root)
        self.known, self.unknown, self.negative = list(known), list(unknown), list(negative)
        self.estimation, self.test, self.seed = estimation, test, seed
        self.pool_root, self.pool_file = pool_root, pool_file

    def root(self, name: str) -> str:
        return self.root_dir  # 21k pool rows carry absolute paths

    def ood_class_name(self, index: int) -> str:
        wnid = self.ood_classes[index]
        return f"{wnid} {class_names().get(wnid, '')}".strip()

    def _check_populated(self) -> None:
        check_populated(self.root_dir, {"val": {"known": self.known, "unknown": self.unknown}})

    def _sample(self, wnid: str, folder: str, count: int | None) -> list[str]:
        files = image_files(Path(self.root_dir, folder, wnid))
        if count is None:
            return files
        if len(files) < count:
            raise ValueError(f"unknown class {wnid} has {len(files)} images in {folder}/, fewer than the {count} "
                             f"{'estimation' if folder == 'train' else 'test'} images asked for")
        return [files[i] for i in sorted(class_rng(self.seed, wnid).choice(len(files), size=count, replace=False))]

    def rows(self) -> dict[str, list[tuple[str, int]]]:
        check_class_folders(self.root_dir, {"val": self.known + self.unknown, "train": self.unknown})
        self._check_populated()
        self.ood_classes = list(self.unknown)
        rows: dict[str, list[tuple[str, int]]] = {
            "id_test": [(f"val/{wnid}/{name}", label) for label, wnid in enumerate(self.known)
                        for name in image_files(Path(self.root_dir, "val", wnid))],
            "ood_estimation": [(f"train/{wnid}/{name}", index) for index, wnid in enumerate(self.unknown)
                               for name in self._sample(wnid, "train", self.estimation)],
            "ood_test": [(f"val/{wnid}/{name}", index) for index, wnid in enumerate(self.unknown)
                         for name in self._sample(wnid, "val", self.test)],
        }
        if self.pool_file is not None:
            seen = set(self.known) | set(self.negative) | set(self.unknown)
            pool = [row for row in read_pool_file(self.pool_file) if row[1] not in seen]
            extra = sorted({wnid for _, wnid, _ in pool})
            check_class_folders(self.pool_root, {".": extra})
            index = {wnid: len(self.ood_classes) + i for i, wnid in enumerate(extra)}
            self.ood_classes += extra
            for path, wnid, split in pool:
                rows[f"ood_{split}"].append((str(Path(self.pool_root, path).resolve()), index[wnid]))
        return rows


class ProtocolSeverityData(FolderSeverityData):
    """:class:`FolderSeverityData` of a model trained on ImageNet protocol P1, P2 or P3: ID = the protocol's
    known classes, pool = its unknown classes (DESIGN.md §5.2).

    Args:
        root: ILSVRC2012 folder with ``train/<wnid>/`` and ``val/<wnid>/`` class folders.
        protocol: 1, 2 or 3.
        estimation, test, seed, pool_root, pool_file: as :class:`FolderSeverityData`.
    """

    def __init__(self, root: str, protocol: int = 1, estimation: int = 150, test: int | None = None, seed: int = 0,
                 pool_root: str | None = None, pool_file: str | None = None, batch_size: int = 64,
                 num_workers: int = 8, on_bad_image: BadImagePolicy = "fail") -> None:
        classes = imagenet_protocol(protocol)
        super().__init__(root, classes.known, classes.unknown, classes.negative, estimation=estimation, test=test,
                         seed=seed, pool_root=pool_root, pool_file=pool_file, batch_size=batch_size,
                         num_workers=num_workers, on_bad_image=on_bad_image)
        self.protocol_number = protocol


class FashionSeverityData(SeverityData):
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
        known, negative = sorted(known), sorted(negative)
        super().__init__(batch_size=batch_size, num_workers=num_workers, classes=[CLASS_NAMES[c] for c in known])
        self.data_dir = data_dir
        self.known, self.negative = known, negative
        if set(self.known) & set(self.negative):
            raise ValueError(f"classes {sorted(set(self.known) & set(self.negative))} are both known and negative")
        if estimation < 1 or test < 1:
            raise ValueError(f"estimation and test must be positive, got {estimation} and {test}")
        self.include_negatives = include_negatives
        self.estimation, self.test, self.seed = estimation, test, seed
        self.fashion_pool = [c for c in range(10) if c not in self.known
                             and (include_negatives or c not in self.negative)]
        self.ood_classes = [f"fashion: {CLASS_NAMES[c]}" for c in self.fashion_pool] + [f"digit {d}" for d in range(10)]
        self.ood_roles = {i: TRAINING_NEGATIVE for i, c in enumerate(self.fashion_pool) if c in self.negative}

    def build(self) -> None:
        # Only official test images of Fashion-MNIST: the demo model trains on (part of) the training images,
        # negatives included, so none of those may serve as OOD data.
        images, classes = load_fashion_mnist(self.data_dir, "test")
        id_mask = np.isin(classes, self.known)
        id_labels = np.searchsorted(np.array(self.known), classes[id_mask])
        self._add_split("id_test", TensorImageDataset(torch.from_numpy(images[id_mask].copy()).unsqueeze(1),
                                                      torch.from_numpy(id_labels)))
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
            self._add_split(split, TensorImageDataset(torch.cat(parts[split]), torch.tensor(labels[split])))


# The names of before the evaluation engine, kept for one release.
ImageNetSeverityDataModule = ImageNetSeverityData
ProtocolSeverityDataModule = ProtocolSeverityData
FashionSeverityDataModule = FashionSeverityData
