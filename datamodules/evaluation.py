"""The one kind of evaluation data every post-hoc evaluation reads (DESIGN.md §2, the evaluation engine).

An :class:`EvaluationData` is a set of named data sets, each with a **role** and served the same way whether
its images are files (protocol CSVs, class folders, the ImageNet-21k pool, generated sets on disk) or
tensors in memory:

    fit         in-distribution training images of the known classes (labels 0..K-1), which fitted detectors
                (Mahalanobis, KNN, ViM, ...) fit on; never an evaluation's test images
    id_test     in-distribution test images (the positives of every AUROC)
    id_val      in-distribution validation images (EvG's energy standardisation)
    ood         real OOD images (a severity level's test images, a real OOD set, EvG's OOD set)
    ood_val     real OOD images kept for choosing hyper-parameters, never a test set (OpenOOD's OOD validation
                lists, :mod:`datamodules.openood`)
    estimation  OOD images that estimate each class's severity (Galil et al.)
    near_ood    a generated near-OOD set (Mukhoti et al.)
    shift       a generated shifted set, labelled with its sources' classes
    real_shift  a real shifted set, labelled with the known classes
    seeds       the OOD images EvG's chains start from

Every data set yields raw images (decoded files as PIL images, in-memory images as float tensors in
``[0, 1]``) with the project's labels and dataset indices: the scoring model applies its own input transform
(:mod:`datamodules.transforms`), so one set serves a 28 px Fashion-MNIST CNN and a 224 px timm model alike.

One fingerprint rule identifies a set's exact content for every cache (:func:`dataset_fingerprint`): the file
list with every file's size and modification time for files, a digest of the bytes for tensors, the indices
of a subset -- never a folder name alone. Labels come from one helper, :func:`datamodules.images.dataset_labels`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from datamodules.batch import Sample, collate_samples
from datamodules.images import (
    ImageFileDataset,
    TensorImageDataset,
    dataset_labels,
    image_files,
    is_folder,
    subfolders,
)
from openset_common.artefacts import digest, tensors_fingerprint

# open_set_test: a protocol's test set of knowns, negatives (-1) and unknowns (-2), as OSCR scores it
Role = Literal["fit", "id_test", "id_val", "ood", "estimation", "near_ood", "shift", "real_shift", "seeds",
               "open_set_test", "ood_val"]
ROLES: tuple[str, ...] = get_args(Role)


class TransformedSet(Dataset):
    """The samples of a data set with each image through ``transform`` (unreadable images stay ``None``): a
    scoring pass's model inputs (the model's input transform), or raw images again (EvG's ``image_size``
    resize, float tensors in ``[0, 1]``) for the models' own transforms; labels, source classes and a
    fingerprint (the set's and the transform's ``repr``) of its own."""

    def __init__(self, dataset: Dataset, transform: Callable[[Any], Tensor]) -> None:
        self.dataset, self.transform = dataset, transform
        self.source_classes = getattr(dataset, "source_classes", None)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Sample:
        sample = self.dataset[index]
        if sample.image is None:
            return sample
        return Sample(self.transform(sample.image), sample.target, sample.index)

    def labels(self) -> Tensor:
        return dataset_labels(self.dataset)

    def fingerprint(self) -> str:
        return digest({"through": repr(self.transform), "of": dataset_fingerprint(self.dataset)})


def dataset_fingerprint(dataset: Dataset) -> str:
    """A digest of what a data set yields: file names, sizes and modification times (ns) for files, the bytes
    of tensors, the indices of a subset, the parts of a concatenation, and any transform's ``repr``.

    A data set of another kind contributes ``fingerprint()`` if it has one, else the digest of every sample it
    yields (one pass; deterministic, so every process agrees).
    """
    if isinstance(dataset, Subset):
        return digest({"subset": dataset_fingerprint(dataset.dataset), "indices": [int(i) for i in dataset.indices]})
    if isinstance(dataset, ConcatDataset):
        return digest({"concat": [dataset_fingerprint(d) for d in dataset.datasets]})
    if isinstance(dataset, TensorImageDataset):
        return digest({"tensors": tensors_fingerprint({"images": dataset.images, "labels": dataset.labels}),
                       "transform": repr(dataset.transform)})
    if isinstance(dataset, ImageFileDataset):
        return digest({"files": dataset.files_fingerprint(),
                       "rows": digest(dataset.rows), "transform": repr(dataset.transform)})
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    samples = (dataset[i] for i in range(len(dataset)))  # type: ignore[arg-type]
    return digest([tensors_fingerprint({"image": torch.as_tensor(s.image), "target": torch.as_tensor(s.target)})
                   for s in samples])


@dataclass
class EvaluationSet:
    """One named data set of an evaluation and its role (see the module docstring).

    Attributes:
        name: how tables and cache files call it, e.g. ``id_test``, ``near_ood:p1-near-ood``.
        role: one of :data:`ROLES`.
        dataset: yields :class:`datamodules.batch.Sample` with raw images.
        info: what else describes it (a generated set's ``info.json``, its source folder, ...).
    """

    name: str
    role: Role
    dataset: Dataset
    info: dict[str, Any] = field(default_factory=dict)
    _labels: Tensor | None = field(default=None, init=False, repr=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"evaluation set {self.name!r}: role must be one of {list(ROLES)}, got {self.role!r}")

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def labels(self) -> Tensor:
        """The labels of every sample in dataset order (read once)."""
        if self._labels is None:
            self._labels = dataset_labels(self.dataset)
        return self._labels

    def fingerprint(self) -> str:
        """:func:`dataset_fingerprint` of the set (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = digest({"name": self.name, "content": dataset_fingerprint(self.dataset)})
        return self._fingerprint


class EvaluationData:
    """Named evaluation sets with their roles, and the batch settings of the passes over them.

    Args:
        sets: the sets (names must be unique).
        batch_size, num_workers: of every pass over the sets.
        classes: the in-distribution class names or wnids, in label order (a model trained on other classes
            is refused, naming both lists); ``None`` when the data do not say.

    Subclasses that list files lazily (the ImageNet folders) build their sets in :meth:`build`, which
    :meth:`setup` calls once; constructing one reads nothing.
    """

    def __init__(self, sets: Iterable[EvaluationSet] = (), *, batch_size: int = 256, num_workers: int = 0,
                 classes: Sequence[str] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.batch_size, self.num_workers = batch_size, num_workers
        self.classes = list(classes) if classes is not None else None
        self._sets: dict[str, EvaluationSet] = {}
        self._built = False
        for evaluation_set in sets:
            self.add(evaluation_set)
        self._built = bool(self._sets)

    # -- building ---------------------------------------------------------------------------------

    def build(self) -> None:
        """Add the sets (subclasses that read files); the default has them from the constructor."""

    def setup(self, stage: str | None = None) -> None:
        """Build the sets once (file lists, class folders); every check of the data runs here."""
        if not self._built:
            self._built = True
            try:
                self.build()
            except BaseException:
                self._built = False
                self._sets = {}
                raise
            empty = [name for name, s in self._sets.items() if len(s) == 0]
            if empty:
                raise ValueError(f"{type(self).__name__}: the evaluation sets {empty} hold no images")

    def add(self, evaluation_set: EvaluationSet) -> EvaluationSet:
        if evaluation_set.name in self._sets:
            raise ValueError(f"two evaluation sets are called {evaluation_set.name!r}")
        self._sets[evaluation_set.name] = evaluation_set
        return evaluation_set

    # -- reading ----------------------------------------------------------------------------------

    @property
    def sets(self) -> dict[str, EvaluationSet]:
        self.setup()
        return self._sets

    def __getitem__(self, name: str) -> EvaluationSet:
        sets = self.sets
        if name not in sets:
            raise KeyError(f"no evaluation set {name!r}; the data have {list(sets)}")
        return sets[name]

    def __iter__(self) -> Iterator[EvaluationSet]:
        return iter(self.sets.values())

    def __contains__(self, name: object) -> bool:
        return name in self.sets

    def with_role(self, *roles: str) -> list[EvaluationSet]:
        """The sets of these roles, in the order they were added."""
        unknown = [r for r in roles if r not in ROLES]
        if unknown:
            raise ValueError(f"unknown roles {unknown}; choose from {list(ROLES)}")
        return [s for s in self.sets.values() if s.role in roles]

    def dataloader(self, name: str) -> DataLoader:
        """A plain (unsharded) loader of one set, with the batch settings."""
        return DataLoader(self[name].dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          collate_fn=collate_samples)

    def describe(self) -> list[dict[str, Any]]:
        """One row per set: name, role, images, fingerprint."""
        return [{"set": s.name, "role": s.role, "images": len(s), "fingerprint": s.fingerprint()[:16]}
                for s in self.sets.values()]


CLASS_FOLDER_STAND_IN = "_"
"""What stands for each character a folder name cannot hold (``/``, NUL) in a class's folder (:func:`class_folder`)."""


def class_folder(name: str) -> str:
    """The folder of class ``name`` wherever a model's classes are read as class folders (``--fit-data``, real
    shifted sets): the name with each character a file name cannot hold, ``/`` and NUL, replaced by ``_``
    (the demo's ``T-shirt/top`` is ``T-shirt_top``); a wnid or any other name is its own folder.

    Raises:
        ValueError: a name no folder can have (empty, ``.`` or ``..``).
    """
    folder = name.replace("/", CLASS_FOLDER_STAND_IN).replace("\0", CLASS_FOLDER_STAND_IN)
    if folder in ("", ".", ".."):
        raise ValueError(f"class {name!r} has no folder name: a class read from class folders needs a name other than "
                         "'', '.' and '..'")
    return folder


def class_folders(classes: Sequence[str], *, what: str) -> list[str]:
    """:func:`class_folder` of every class, in order; two classes with one folder (``a/b`` and ``a_b``) are refused,
    naming both and ``what`` reads them."""
    folders = [class_folder(name) for name in classes]
    seen: dict[str, str] = {}
    for name, folder in zip(classes, folders, strict=True):
        if folder in seen:
            raise ValueError(f"{what}: the classes {seen[folder]!r} and {name!r} would both be the folder {folder!r} "
                             f"(a class's folder is its name with '/' replaced by {CLASS_FOLDER_STAND_IN!r})")
        seen[folder] = name
    return folders


def fit_folder_set(root: str, classes: Sequence[str] | None, *, name: str = "fit",
                   on_bad_image: str = "fail") -> EvaluationSet:
    """A user's in-distribution training images as the fit set of fitted detectors: ``<root>/<folder>/*``, one
    folder per class of the model (an ImageNet ``train/`` folder for a timm model), labelled in the model's
    class order. A class's folder is :func:`class_folder` of its name: the name itself, with ``/`` replaced by
    ``_`` (the demo's ``T-shirt/top`` is ``<root>/T-shirt_top/``).

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: the model's classes are unknown, or the class folders are not exactly the model's (both
            lists named, with the rule), or a class folder holds no image.
    """
    folder = Path(root)
    if not is_folder(folder):
        raise FileNotFoundError(f"fit data {root}: not a folder (give the in-distribution training images as "
                                "<root>/<class>/*, e.g. ILSVRC2012/train)")
    if not classes:
        raise ValueError(f"fit data {root}: the model does not say which classes it predicts, so its class folders "
                         "cannot be matched")
    folders = class_folders(classes, what=f"fit data {root}")
    present = subfolders(folder)
    missing = [(c, f) for c, f in zip(classes, folders, strict=True) if f not in set(present)]
    other = [f for f in present if f not in set(folders)]
    if missing or other:
        more = " ..." if len(missing) > 10 else ""
        renamed = [c for c, f in missing[:10] if c != f]
        of = f"; the folders of {[c for c, _ in missing[:10]]}{more}" if renamed else ""
        raise ValueError(f"fit data {root}: its class folders are not the model's classes: "
                         + (f"missing {[f for _, f in missing[:10]]}{more} ({len(missing)}{of}); " if missing else "")
                         + (f"not among the model's {other[:10]}{' ...' if len(other) > 10 else ''} ({len(other)}); " if other else "")
                         + f"the model's classes: {list(classes)[:10]}{' ...' if len(classes) > 10 else ''}. A class's "
                         f"folder is its name with '/' replaced by {CLASS_FOLDER_STAND_IN!r} (class_folder), e.g. "
                         f"{folder / folders[0]}")
    rows: list[tuple[str, int]] = []
    for label, class_name in enumerate(folders):
        files = image_files(folder / class_name)
        if not files:
            raise ValueError(f"fit data {root}: class folder {class_name} holds no image")
        rows += [(str(Path(class_name, f)), label) for f in files]
    dataset = ImageFileDataset(str(folder), rows, on_bad_image=on_bad_image)  # type: ignore[arg-type]
    return EvaluationSet(name, "fit", dataset, info={"root": str(folder), "classes": list(classes)})


def known_subset(dataset: Dataset) -> Subset:
    """The samples of a data set whose label is a known class (``>= 0``), in dataset order."""
    labels = dataset_labels(dataset)
    return Subset(dataset, torch.nonzero(labels >= 0).flatten().tolist())


def raw(dataset: Dataset, *, what: str) -> Dataset:
    """The same samples yielding raw images (no transform): an evaluation set.

    Raises:
        TypeError: for a data set that cannot drop its transform (the message names ``what``).
    """
    if isinstance(dataset, Subset):
        return Subset(raw(dataset.dataset, what=what), dataset.indices)
    strip = getattr(dataset, "without_transform", None)
    if callable(strip):
        return strip()
    if getattr(dataset, "transform", None) is None and not hasattr(dataset, "dataset"):
        return dataset
    raise TypeError(f"{what} is a {type(dataset).__name__} with a transform and no without_transform(): "
                    "evaluation sets must yield raw images (the scoring model applies its own transform)")
