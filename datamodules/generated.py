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

from datamodules.batch import Sample
from datamodules.images import TensorImageDataset, dataset_labels

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


class ResizedImages(torch.utils.data.Dataset):
    """A data set of :class:`~datamodules.batch.Sample` with every image resized to ``size`` (bilinear,
    antialiased) and, when ``channels`` is given, converted to that many channels."""

    def __init__(self, dataset: torch.utils.data.Dataset, size: int | None, channels: int | None = None) -> None:
        self.dataset, self.size, self.channels = dataset, size, channels

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Sample:
        sample = self.dataset[index]
        image = sample.image
        if image is None:
            return sample
        if self.channels is not None and image.shape[0] != self.channels:
            image = image.mean(dim=0, keepdim=True) if self.channels == 1 else image.expand(self.channels, -1, -1)
        if self.size is not None and tuple(image.shape[-2:]) != (self.size, self.size):
            image = torch.nn.functional.interpolate(image[None].float(), size=(self.size, self.size), mode="bilinear",
                                                    align_corners=False, antialias=True)[0]
        return Sample(image, sample.target, sample.index)


class GeneratedBenchmarkData:
    """The sets of a generated benchmark (DESIGN.md §5.3), every image at the detectors' input size.

    Args:
        id_test: the in-distribution test set (``Sample``\\ s with known labels).
        near_ood, shift: folders of generated sets (:func:`GeneratedDataset`).
        real_ood: name -> data set of real OOD images (:func:`real_ood_set`).
        image_size, channels: what the detectors take (every set is resized/converted to it).
    """

    def __init__(
        self,
        id_test: torch.utils.data.Dataset,
        *,
        near_ood: Sequence[str | Path] = (),
        shift: Sequence[str | Path] = (),
        real_ood: dict[str, torch.utils.data.Dataset] | None = None,
        image_size: int | None = None,
        channels: int | None = None,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        self.batch_size, self.num_workers = batch_size, num_workers
        self.sets: dict[str, torch.utils.data.Dataset] = {"id_test": ResizedImages(id_test, image_size, channels)}
        self.kinds: dict[str, str] = {"id_test": "id"}
        self.info: dict[str, dict[str, Any]] = {}
        for kind, folders in (("near_ood", near_ood), ("shift", shift)):
            for folder in folders:
                dataset = GeneratedDataset(folder)
                if dataset.info.get("kind") != kind:
                    raise ValueError(f"{folder} is a {dataset.info.get('kind')} set, given as {kind}")
                name = f"{kind}:{Path(folder).name}"
                self.sets[name] = ResizedImages(dataset, image_size, channels)
                self.kinds[name], self.info[name] = kind, dataset.info
        for name, dataset in (real_ood or {}).items():
            self.sets[f"real:{name}"] = ResizedImages(dataset, image_size, channels)
            self.kinds[f"real:{name}"] = "real_ood"

    def targets(self, name: str) -> torch.Tensor:
        dataset = self.sets[name].dataset
        return dataset_labels(dataset)
