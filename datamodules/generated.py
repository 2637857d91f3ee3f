"""Generated image sets on disk (written by ``evaluate.py generate``) as data sets.

A generated set is a folder::

    <set>/
        images/000000.png ...   one PNG per image (for eyes and other tools)
        images.pt               all images, (N, C, H, W) uint8, in manifest order
        manifest.csv            one row per image: file, seed, source index and label (shift), the
                                ensemble's prediction, MI and LPIPS, the generator checkpoint's sha256
        info.json               what made it: kind, generator and its training hyper-parameters (classes,
                                image size, every λ, discriminator, pairing, regularise_every, training steps),
                                the generation mode, the seeded choice of sources / reference images, the
                                ensemble and LPIPS that described it

It is written into a temporary folder next to ``<set>`` and renamed into place when complete, so a folder
under the final name is always whole. When read, ``manifest.csv`` is checked against ``images.pt`` and
``info.json`` (:func:`check_manifest`): every integer column is an exact integer, the rows are in order, each
row names the generator of ``info.json``, and the labels are of the set's kind (a shifted set's are known
classes, a near-OOD set has no source images), so a manifest copied from another set is refused.

Real shifted sets (:func:`real_shift_set`) are class folders, ``<root>/<class name or wnid>/*``, as ImageNet-R
or an ImageNet-C / CIFAR-10-C severity folder are laid out, labelled with the known classes.
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from datamodules.evaluation import EvaluationData, EvaluationSet, class_folder
from datamodules.images import (
    IMAGE_EXTENSIONS,
    BadImagePolicy,
    ImageFileDataset,
    TensorImageDataset,
    check_choice,
    image_files,
    image_files_under,
    is_folder,
    subfolders,
    without_unreadable,
)
from openset_common.artefacts import file_sha256

MANIFEST_COLUMNS = ("file", "index", "seed", "source_index", "source_label", "ensemble_prediction", "mi", "lpips",
                    "generator_sha256")
# written and read as exact integers (never through a float: a 64-bit seed does not survive float32)
INTEGER_COLUMNS = ("index", "seed", "source_index", "source_label", "ensemble_prediction")


class IncompleteGeneratedSet(FileNotFoundError):
    """A folder that is not a complete generated set; the message names the folder and what is missing."""


def read_manifest(folder: str | Path) -> list[dict[str, str]]:
    folder = Path(folder)
    path = folder / "manifest.csv"
    if not path.is_file():
        raise IncompleteGeneratedSet(f"{folder} is not a complete generated set: manifest.csv is missing "
                                     "(generate it with `python evaluate.py generate ...`)")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != MANIFEST_COLUMNS:
            raise ValueError(f"{path}: expected the columns {list(MANIFEST_COLUMNS)}, got {reader.fieldnames}")
        return list(reader)


def read_info(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "info.json"
    if not path.is_file():
        raise IncompleteGeneratedSet(f"{folder} is not a complete generated set: info.json is missing")
    return json.loads(path.read_text())


def check_manifest(folder: str | Path, rows: list[dict[str, str]], info: dict[str, Any]) -> None:
    """Refuse a manifest that does not belong to the set of ``info.json``, naming the file, the row and the value.

    Checks: every integer column holds an exact integer; ``index`` is the row number; ``info["count"]`` (when
    recorded) is the number of rows; every ``generator_sha256`` is ``info["generator_sha256"]`` (when
    recorded); a shifted set's rows have a source image (``source_index >= 0``) and a known-class source label
    (``0 <= source_label < len(info["classes"])`` when the classes are recorded); a near-OOD set's rows have no
    source image (``source_index == -1``).

    Raises:
        ValueError: the first offending row, with what was expected.
    """
    path = Path(folder) / "manifest.csv"
    kind = info.get("kind")
    if kind not in ("shift", "near_ood"):
        raise ValueError(f"{Path(folder) / 'info.json'}: kind must be 'shift' or 'near_ood', got {kind!r}")
    if "count" in info and int(info["count"]) != len(rows):
        raise ValueError(f"{path} holds {len(rows)} rows but info.json counts {info['count']} images: the manifest "
                         "belongs to another set")
    sha256 = info.get("generator_sha256")
    classes = info.get("classes")
    for position, row in enumerate(rows):
        values = {}
        for name in INTEGER_COLUMNS:
            text = row[name]
            if not re.fullmatch(r"-?\d+", text or ""):
                raise ValueError(f"{path}, row {position}: {name} must be an integer, got {text!r}")
            values[name] = int(text)
        if values["index"] != position:
            raise ValueError(f"{path}, row {position}: index is {values['index']}, expected {position}")
        if sha256 and row["generator_sha256"] != sha256:
            raise ValueError(f"{path}, row {position}: generated by {row['generator_sha256'][:12] or 'nothing'}..., but "
                             f"info.json names the generator {sha256[:12]}...: the manifest belongs to another set")
        if kind == "shift":
            if values["source_index"] < 0 or values["source_label"] < 0:
                raise ValueError(f"{path}, row {position}: a shifted image needs its source image and known-class "
                                 f"label, got source_index {values['source_index']} and source_label "
                                 f"{values['source_label']} (labels of a near-OOD manifest?)")
            if classes is not None and values["source_label"] >= len(classes):
                raise ValueError(f"{path}, row {position}: source_label {values['source_label']} is not one of the "
                                 f"set's {len(classes)} classes")
        elif values["source_index"] != -1:
            raise ValueError(f"{path}, row {position}: a near-OOD image has no source image, got source_index "
                             f"{values['source_index']} (labels of a shifted set's manifest?)")


class GeneratedDataset(TensorImageDataset):
    """The images of a generated set with their labels: the source label for a shifted set, ``-2`` (unknown)
    for a near-OOD set. ``rows`` holds the manifest (checked by :func:`check_manifest`), ``info`` the
    description."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        rows = read_manifest(folder)
        info = read_info(folder)
        check_manifest(folder, rows, info)
        path = folder / "images.pt"
        if not path.is_file():
            raise IncompleteGeneratedSet(f"{folder} is not a complete generated set: images.pt is missing")
        images = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"{path} must hold a (N, C, H, W) uint8 tensor, found {type(images).__name__} "
                             f"{getattr(images, 'dtype', '')} {tuple(getattr(images, 'shape', ()))}")
        if images.shape[0] != len(rows):
            raise ValueError(f"{folder}: images.pt holds {images.shape[0]} images but manifest.csv {len(rows)} rows")
        labels = torch.tensor([int(r["source_label"]) if info.get("kind") == "shift" else -2 for r in rows])
        super().__init__(images, labels)
        self.folder, self.rows, self.info = folder, rows, info


class LatentSeeds(torch.utils.data.Dataset):
    """``(seed, index)`` pairs for near-OOD generation: image ``i`` comes from the seed ``base * 1_000_003 + i``,
    so it is the same whatever the batch size, the number of processes or which images are generated."""

    def __init__(self, count: int, seed: int) -> None:
        if count < 1:
            raise ValueError(f"the number of images must be positive, got {count}")
        if seed < 0 or seed * 1_000_003 + count - 1 >= 2**63:
            raise ValueError(f"seed {seed}: the per-image seeds seed * 1_000_003 + i must be non-negative 64-bit "
                             f"integers (0 <= seed <= {(2**63 - count) // 1_000_003})")
        self.count, self.seed = count, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.seed * 1_000_003 + index, index


# --------------------------------------------------------------------------------------------------
# The data of a generated benchmark: an ID test set, generated sets, real OOD sets

KIND_OF_ROLE = {"id_test": "id", "near_ood": "near_ood", "shift": "shift", "ood": "real_ood", "real_shift": "real_shift"}


def generated_set(folder: str | Path, kind: str, classes: Sequence[str] | None = None) -> EvaluationSet:
    """A generated set on disk as an evaluation set (``near_ood:<folder name>`` or ``shift:<folder name>``),
    refused when it is not of the kind it is given as, or when it was generated for other classes than
    ``classes`` (the ID data's, in label order; both lists named). A set that does not record its classes
    (made before they were recorded) is read with a warning."""
    dataset = GeneratedDataset(folder)
    if dataset.info.get("kind") != kind:
        raise ValueError(f"{folder} is a {dataset.info.get('kind')} set, given as {kind}")
    recorded = dataset.info.get("classes")
    if classes is not None and recorded is None:
        warnings.warn(f"{folder}/info.json does not record the classes the set was generated for; its labels are "
                      f"read as the ID data's classes {list(classes)}", UserWarning, stacklevel=2)
    elif classes is not None and list(recorded) != list(classes):
        raise ValueError(f"{folder} was generated for the classes {list(recorded)}, but the ID data have the classes "
                         f"{list(classes)}: generate the set from the same data, or evaluate it against its own")
    return EvaluationSet(f"{kind}:{Path(folder).name}", kind, dataset, info=dataset.info)  # type: ignore[arg-type]


def _folder_key(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def real_shift_set(folder: str | Path, classes: Sequence[str], *, on_bad_image: BadImagePolicy = "fail"
                   ) -> ImageFileDataset:
    """A real shifted set laid out as class folders, ``<folder>/<class>/...`` (ImageNet-R, one corruption and
    severity of ImageNet-C / CIFAR-10-C), labelled with the known classes.

    A class folder is the class whose name or wnid it is, compared exactly (as the name or as its
    :func:`datamodules.evaluation.class_folder`, ``/`` replaced by ``_``) or, failing that, ignoring case and every
    character but letters and digits (``T-shirt_top`` and ``tshirt-top`` are ``T-shirt/top``). Images may lie in sub-folders
    of a class folder; files of other suffixes and hidden files are left out.

    Args:
        folder: the set's root.
        classes: the ID classes (names or wnids) in label order.
        on_bad_image: ``"fail"``: an unreadable image stops the pass, naming the file; ``"skip"``: every file is
            decoded once here and the unreadable ones are left out, counted in a warning (:func:`without_unreadable`).

    Raises:
        FileNotFoundError: the folder does not exist or holds no image.
        ValueError: a class folder that is none of the known classes (named with the known classes), an image
            outside every class folder, or two folders of one class.
    """
    root = Path(folder)
    check_choice("on_bad_image", on_bad_image, ("fail", "skip"))
    if not is_folder(root):
        raise FileNotFoundError(f"real shifted set {root}: no such folder (expected {root}/<class name or wnid>/*)")
    exact = {name: i for i, name in enumerate(classes)}
    for i, name in enumerate(classes):
        exact.setdefault(class_folder(name), i)  # the folder rule of every model's class folders
    loose: dict[str, int] = {}
    for i, name in enumerate(classes):
        loose.setdefault(_folder_key(name), i)
    stray = image_files(root, warn=False)
    if stray:
        raise ValueError(f"real shifted set {root}: files {stray[:3]} lie outside the class folders "
                         f"(expected {root}/<class name or wnid>/*)")
    rows: list[tuple[str, int]] = []
    seen: dict[int, str] = {}
    for sub in (root / name for name in subfolders(root)):
        label = exact.get(sub.name, loose.get(_folder_key(sub.name)))
        if label is None:
            raise ValueError(f"real shifted set {root}: the class folder {sub.name!r} is none of the known classes "
                             f"{list(classes)}")
        if label in seen:
            raise ValueError(f"real shifted set {root}: the folders {seen[label]!r} and {sub.name!r} are both the class "
                             f"{classes[label]!r}")
        seen[label] = sub.name
        rows += [(f"{sub.name}/{relative}", label) for relative in image_files_under(sub)]
    if not rows:
        raise FileNotFoundError(f"real shifted set {root} holds no image files ({' '.join(IMAGE_EXTENSIONS)}, any case) "
                                "in class folders")
    dataset = ImageFileDataset(str(root), rows, on_bad_image=on_bad_image)
    return without_unreadable(dataset, what=f"real shifted set {root}") if on_bad_image == "skip" else dataset


class GeneratedBenchmarkData(EvaluationData):
    """The sets of a generated benchmark (DESIGN.md §5.3): the ID test set, generated near-OOD and shifted sets,
    real OOD sets and real shifted sets. Every model scores them through its own input transform.

    Args:
        id_test: the in-distribution test set (raw images with known labels), or an evaluation set.
        near_ood, shift: folders of generated sets (:class:`GeneratedDataset`), refused when generated for
            other classes than ``classes``.
        real_ood: name -> data set of real OOD images (:func:`datamodules.catalog.real_ood_set`).
        real_shift: name -> data set of real shifted images labelled with the known classes
            (:func:`real_shift_set`).
        classes: the ID classes in label order.
    """

    def __init__(
        self,
        id_test: torch.utils.data.Dataset | EvaluationSet,
        *,
        near_ood: Sequence[str | Path] = (),
        shift: Sequence[str | Path] = (),
        real_ood: dict[str, torch.utils.data.Dataset] | None = None,
        real_shift: dict[str, torch.utils.data.Dataset] | None = None,
        classes: Sequence[str] | None = None,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        if not isinstance(id_test, EvaluationSet):
            id_test = EvaluationSet("id_test", "id_test", id_test)
        sets = [EvaluationSet("id_test", "id_test", id_test.dataset, info=id_test.info)]
        sets += [generated_set(folder, kind, classes) for kind, folders in (("near_ood", near_ood), ("shift", shift))
                 for folder in folders]
        sets += [EvaluationSet(f"real:{name}", "ood", dataset) for name, dataset in (real_ood or {}).items()]
        sets += [EvaluationSet(f"real_shift:{name}", "real_shift", dataset)
                 for name, dataset in (real_shift or {}).items()]
        super().__init__(sets, batch_size=batch_size, num_workers=num_workers, classes=classes)
        self._digests: dict[str, str] = {}  # each model checkpoint's sha256, read once

    @property
    def kinds(self) -> dict[str, str]:
        """Set name -> its kind in the tables (``id``, ``near_ood``, ``shift``, ``real_ood``, ``real_shift``)."""
        return {name: KIND_OF_ROLE[s.role] for name, s in self.sets.items()}

    @property
    def info(self) -> dict[str, dict[str, Any]]:
        """Set name -> ``info.json`` of each generated set."""
        return {name: s.info for name, s in self.sets.items() if s.role in ("near_ood", "shift")}

    def trained_against(self, checkpoints: Sequence[str | Path], set_name: str) -> bool:
        """Whether any of ``checkpoints`` (a model's member checkpoints) is a member of the ensemble the generator
        of ``set_name`` was trained against (its ``info.json``'s ``training_ensemble``): the same resolved path
        or the same sha256 (a copy of the file elsewhere)."""
        trained = self.info.get(set_name, {}).get("training_ensemble") or []
        if not trained or not checkpoints:
            return False
        paths = {record.get("resolved") for record in trained}
        if any(str(Path(p).resolve()) in paths for p in checkpoints):
            return True
        digests = {record.get("sha256") for record in trained} - {None}
        return bool(digests) and any(self._sha256(str(Path(p).resolve())) in digests for p in checkpoints)

    def _sha256(self, path: str) -> str | None:
        if path not in self._digests:
            self._digests[path] = file_sha256(path) if Path(path).is_file() else ""
        return self._digests[path] or None
