"""Generated image sets on disk (written by ``evaluate.py generate``) as data sets.

A generated set is a folder::

    <set>/
        images/000000.png ...   one PNG per image (for eyes and other tools)
        images.pt               all images, (N, C, H, W) uint8, in manifest order
        manifest.csv            one row per image: file, seed, source index and label (shift), the
                                ensemble's prediction, MI and LPIPS, the generator checkpoint's sha256
        info.json               what made it: kind, generator, seed, regularisers, LPIPS backbone

It is written into a temporary folder next to ``<set>`` and renamed into place when complete, so a folder
under the final name is always whole; ``manifest.csv`` is checked against ``images.pt`` when read.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from datamodules.evaluation import EvaluationData, EvaluationSet
from datamodules.images import TensorImageDataset

MANIFEST_COLUMNS = ("file", "index", "seed", "source_index", "source_label", "ensemble_prediction", "mi", "lpips",
                    "generator_sha256")


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


class GeneratedDataset(TensorImageDataset):
    """The images of a generated set with their labels: the source label for a shifted set, ``-2`` (unknown)
    for a near-OOD set. ``rows`` holds the manifest, ``info`` the description."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        rows = read_manifest(folder)
        info = read_info(folder)
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
        self.count, self.seed = count, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.seed * 1_000_003 + index, index


# --------------------------------------------------------------------------------------------------
# The data of a generated benchmark: an ID test set, generated sets, real OOD sets

KIND_OF_ROLE = {"id_test": "id", "near_ood": "near_ood", "shift": "shift", "ood": "real_ood", "real_shift": "real_shift"}


def generated_set(folder: str | Path, kind: str) -> EvaluationSet:
    """A generated set on disk as an evaluation set (``near_ood:<folder name>`` or ``shift:<folder name>``),
    refused when it is not of the kind it is given as."""
    dataset = GeneratedDataset(folder)
    if dataset.info.get("kind") != kind:
        raise ValueError(f"{folder} is a {dataset.info.get('kind')} set, given as {kind}")
    return EvaluationSet(f"{kind}:{Path(folder).name}", kind, dataset, info=dataset.info)  # type: ignore[arg-type]


class GeneratedBenchmarkData(EvaluationData):
    """The sets of a generated benchmark (DESIGN.md §5.3): the ID test set, generated near-OOD and shifted sets,
    real OOD sets. Every model scores them through its own input transform.

    Args:
        id_test: the in-distribution test set (raw images with known labels), or an evaluation set.
        near_ood, shift: folders of generated sets (:class:`GeneratedDataset`).
        real_ood: name -> data set of real OOD images (:func:`datamodules.sources.real_ood_set`).
        classes: the ID classes in label order.
    """

    def __init__(
        self,
        id_test: torch.utils.data.Dataset | EvaluationSet,
        *,
        near_ood: Sequence[str | Path] = (),
        shift: Sequence[str | Path] = (),
        real_ood: dict[str, torch.utils.data.Dataset] | None = None,
        classes: Sequence[str] | None = None,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        if not isinstance(id_test, EvaluationSet):
            id_test = EvaluationSet("id_test", "id_test", id_test)
        sets = [EvaluationSet("id_test", "id_test", id_test.dataset, info=id_test.info)]
        sets += [generated_set(folder, kind) for kind, folders in (("near_ood", near_ood), ("shift", shift))
                 for folder in folders]
        sets += [EvaluationSet(f"real:{name}", "ood", dataset) for name, dataset in (real_ood or {}).items()]
        super().__init__(sets, batch_size=batch_size, num_workers=num_workers, classes=classes)

    @property
    def kinds(self) -> dict[str, str]:
        """Set name -> its kind in the tables (``id``, ``near_ood``, ``shift``, ``real_ood``)."""
        return {name: KIND_OF_ROLE[s.role] for name, s in self.sets.items()}

    @property
    def info(self) -> dict[str, dict[str, Any]]:
        """Set name -> ``info.json`` of each generated set."""
        return {name: s.info for name, s in self.sets.items() if s.role in ("near_ood", "shift")}
