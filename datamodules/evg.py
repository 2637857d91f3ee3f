"""The data of the adversarial evaluation (EvG; DESIGN.md §5.4): in-distribution validation and test images,
the OOD seed images, and the chains as batches.

- ``id_validation``: standardises each detector's energy (nothing else uses it);
- ``id_test``: the positives of the clean and worst-case AUROC and of MinRank;
- ``ood``: the unmodified OOD test images (the clean AUROC) and the seeds of the chains: chain ``i`` varies
  image ``i mod N_ood`` (affine, colour, l∞).

:class:`OODImagesDataModule` serves a real OOD set as training data: the authors train the generator of the
GAN-latent variation model on the OOD set itself, so that ``G(z)`` stays on that set's manifold while the
sampler searches its latent space (scikit-learn's digits have no separate training split: the demo's GAN
is trained on the 1,797 images the chains then start from).

Every image is resized/converted to the detectors' input (:class:`ResizedImages`).

:class:`ChainBatches` yields the chain indices of one batch per item: batch ``k`` holds chains
``[k·S, (k+1)·S)``, a fixed split of the chains, so a finished batch's result file can be found again and
is not rerun when an interrupted run is resumed (skip it with ``done``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from common import digest, files_fingerprint, tensors_fingerprint
from datamodules.batch import collate_samples
from datamodules.generated import ResizedImages
from datamodules.images import ImageFileDataset, TensorImageDataset
from datamodules.sources import DEBIAN_FASHION_MNIST_DIR, real_ood_set


def dataset_fingerprint(dataset: Dataset) -> str | None:
    """A digest of what a data set yields (image bytes or file sizes and times, resizing, subsets), or ``None``
    for a data set of another kind (whose scores are then not cached)."""
    if isinstance(dataset, ResizedImages):
        inner = dataset_fingerprint(dataset.dataset)
        return None if inner is None else digest({"resized": inner, "size": dataset.size, "channels": dataset.channels})
    if isinstance(dataset, Subset):
        inner = dataset_fingerprint(dataset.dataset)
        return None if inner is None else digest({"subset": inner, "indices": list(map(int, dataset.indices))})
    if isinstance(dataset, TensorImageDataset):
        return digest({"tensors": tensors_fingerprint({"images": dataset.images, "labels": dataset.labels}),
                       "transform": repr(dataset.transform)})
    if isinstance(dataset, ImageFileDataset):
        return digest({"files": files_fingerprint(dataset.root, [path for path, _ in dataset.rows]),
                       "rows": dataset.rows, "transform": repr(dataset.transform)})
    return None


class AdversarialData:
    """The sets of an adversarial evaluation, every image at the detectors' input size.

    Args:
        id_validation, id_test, ood: data sets of :class:`~datamodules.batch.Sample`.
        image_size, channels: the detectors' input (``None``: keep).
        batch_size, num_workers: of the passes over the sets.
    """

    def __init__(self, *, id_validation: Dataset, id_test: Dataset, ood: Dataset, image_size: int | None = None,
                 channels: int | None = None, batch_size: int = 256, num_workers: int = 0) -> None:
        self.sets = {name: ResizedImages(dataset, image_size, channels) for name, dataset in
                     (("id_validation", id_validation), ("id_test", id_test), ("ood", ood))}
        for name, dataset in self.sets.items():
            if len(dataset) == 0:
                raise ValueError(f"the adversarial evaluation's {name} set is empty")
        self.batch_size, self.num_workers = batch_size, num_workers
        self._fingerprints: dict[str, str] = {}

    def fingerprint(self, name: str) -> str:
        """A digest of a set's images: from its files or tensors (:func:`dataset_fingerprint`), or, for a data
        set of another kind, from every image it yields (one pass; deterministic, so every process agrees)."""
        if name not in self._fingerprints:
            fingerprint = dataset_fingerprint(self.sets[name])
            if fingerprint is None:
                dataset = self.sets[name]
                fingerprint = digest([tensors_fingerprint({"image": dataset[i].image, "target": torch.as_tensor(
                    dataset[i].target)}) for i in range(len(dataset))])
            self._fingerprints[name] = fingerprint
        return self._fingerprints[name]

    def seed_images(self, count: int) -> torch.Tensor:
        """The first ``min(count, N_ood)`` OOD images ``(n, C, H, W)``: the seeds of the chains."""
        dataset = self.sets["ood"]
        return torch.stack([dataset[i].image.float() for i in range(min(count, len(dataset)))])


class ChainBatches(Dataset):
    """Item ``k``: the chain indices ``[k·S, min((k+1)·S, chains))`` (see the module docstring).

    Args:
        chains: number of chains.
        per_batch: S, chains per batch (keep it to resume a run).
        done: ``first chain, last chain + 1 -> bool``: batches already finished are left out.
    """

    def __init__(self, chains: int, per_batch: int, done: Callable[[int, int], bool] | None = None) -> None:
        if chains < 1 or per_batch < 1:
            raise ValueError(f"need chains >= 1 and per_batch >= 1, got {chains} and {per_batch}")
        bounds = [(start, min(start + per_batch, chains)) for start in range(0, chains, per_batch)]
        self.all_bounds = bounds
        self.bounds = [b for b in bounds if done is None or not done(*b)]

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> torch.Tensor:
        start, stop = self.bounds[index]
        return torch.arange(start, stop)

    def loader(self) -> DataLoader:
        """One batch of chains per step, in order (Lightning shards it over devices without padding)."""
        return DataLoader(self, batch_size=None, shuffle=False)


def chain_ranges(bounds: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{a}-{b - 1}" for a, b in bounds)


class OODImagesDataModule(pl.LightningDataModule):
    """Args:
        ood: the set: ``digits``, ``fashion:<id>,<id>`` or an image folder.
        image_size, channels: what the generator makes.
        batch_size, num_workers: of the training loader.
        data_dir: Fashion-MNIST's folder (for ``fashion:`` sets).
    """

    def __init__(self, ood: str = "digits", image_size: int = 32, channels: int | None = 1, batch_size: int = 64,
                 num_workers: int = 0, data_dir: str = DEBIAN_FASHION_MNIST_DIR) -> None:
        super().__init__()
        self.save_hyperparameters()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.ood, self.image_size, self.channels = ood, image_size, channels
        self.batch_size, self.num_workers, self.data_dir = batch_size, num_workers, data_dir
        self.train_set: ResizedImages | None = None

    @property
    def num_classes(self) -> int:
        """No known classes: the generator trained here is unconditional."""
        return 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = ResizedImages(real_ood_set(self.ood, data_dir=self.data_dir, known=()), self.image_size,
                                           self.channels)

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            raise RuntimeError("the OOD training set is not set up; call setup() first")
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          collate_fn=collate_samples, drop_last=len(self.train_set) > self.batch_size,
                          persistent_workers=self.num_workers > 0)
