"""The data of EvG (Yoon et al.; DESIGN.md §5.4): a small constructor of the evaluation data, the chains as
batches, and the OOD set as training data of the GAN-latent variation model.

:class:`EvGData` holds three evaluation sets (raw images; every detector scores them through its own input):

- ``id_val`` (role ``id_val``): standardises each detector's energy (nothing else uses it);
- ``id_test`` (``id_test``): the positives of the clean and worst-case AUROC and of MinRank;
- ``ood`` (``ood``): the unmodified OOD images (the clean AUROC) and the seeds of the chains, chain ``i``
  varying seed ``i mod N_seeds`` (affine, colour, l∞): a seeded, class-balanced choice of them (``balanced``,
  this project's default: a class-sorted folder's first rows would be a few classes), or the first ``N`` of
  the set (``first``, the authors' scripts: ``attack.py --n_sample 1000`` takes the first 1,000 images of the
  unsorted SVHN / CelebA test split, 400 of their 224 px sets) (:meth:`EvGData.seed_indices`). The seeds are
  the OOD images at their own size (:meth:`EvGData.seed_images`), or through a pipeline (the detectors'
  common input, ``vary_at: input``); with an ``image_size`` every OOD image, clean ones too, is first
  brought to it (:meth:`EvGData.through`, :class:`datamodules.evaluation.TransformedSet`), so that the clean images are the
  chains' unvaried images.

:class:`ChainBatches` yields the chain indices of one batch per item: batch ``k`` holds chains
``[k·S, (k+1)·S)``, a fixed split of the chains, so a finished batch's result file can be found again and
is not rerun when an interrupted run is resumed (skip it with ``done``).

:class:`OODImagesDataModule` serves a real OOD set as training data: the authors train the generator of the
GAN-latent variation model on the OOD set itself, so that ``G(z)`` stays on that set's manifold while the
sampler searches its latent space (scikit-learn's digits have no separate training split: the demo's GAN
is trained on the 1,797 images the chains then start from).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import pytorch_lightning as pl
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from datamodules.batch import collate_samples
from datamodules.catalog import real_ood_set
from datamodules.evaluation import EvaluationData, EvaluationSet, TransformedSet
from datamodules.images import BALANCED_RULE, balanced_choice, dataset_labels
from datamodules.sources import DEBIAN_FASHION_MNIST_DIR
from datamodules.transforms import ModelInput, TensorPipeline, to_float_tensor

SeedChoice = Literal["balanced", "first"]
SEED_CHOICES: tuple[str, ...] = get_args(SeedChoice)
SEED_RULES = {"balanced": BALANCED_RULE,
              "first": "the first images of the OOD set in its order (the authors' attack.py --n_sample)"}


def image_tensor(image: Any) -> torch.Tensor:
    """A raw image -> float tensor ``(C, H, W)`` in ``[0, 1]`` at its own size: PIL images of a mode other than
    ``L`` and ``RGB`` (palette, alpha, CMYK, 16 bit) converted to ``RGB`` first, as the models' pipelines do."""
    if isinstance(image, Image.Image) and image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    return to_float_tensor(image)


def image_size(image: Any) -> tuple[int, int]:
    """``(H, W)`` of a raw image (a PIL image or a tensor ``(C, H, W)``)."""
    if isinstance(image, Image.Image):
        return image.height, image.width
    return int(image.shape[-2]), int(image.shape[-1])


class EvGData(EvaluationData):
    """The sets of an EvG run (see the module docstring).

    Args:
        id_val, id_test, ood: data sets of raw images (or evaluation sets).
        classes: the ID classes in label order.
        batch_size, num_workers: of the passes over the sets.
    """

    def __init__(self, *, id_val: Dataset | EvaluationSet, id_test: Dataset | EvaluationSet,
                 ood: Dataset | EvaluationSet, classes: Sequence[str] | None = None, batch_size: int = 256,
                 num_workers: int = 0) -> None:
        sets = []
        for name, given in (("id_val", id_val), ("id_test", id_test), ("ood", ood)):
            dataset = given.dataset if isinstance(given, EvaluationSet) else given
            if len(dataset) == 0:  # type: ignore[arg-type]
                raise ValueError(f"EvG's {name} set is empty")
            sets.append(EvaluationSet(name, name, dataset,  # type: ignore[arg-type]
                                      info=given.info if isinstance(given, EvaluationSet) else {}))
        super().__init__(sets, batch_size=batch_size, num_workers=num_workers, classes=classes)

    def seed_indices(self, count: int, seed: int, *, choice: SeedChoice = "balanced") -> torch.Tensor:
        """The OOD images the chains start from, ``min(count, N_ood)`` indices.

        ``balanced``: chosen seeded and balanced over the OOD set's own classes
        (:func:`datamodules.images.balanced_choice`; a digit, a Fashion-MNIST class, an image folder's
        sub-folder), never the first rows of a class-sorted folder. ``first``: ``0 .. min(count, N_ood) - 1``,
        the authors' choice (the first ``--n_sample`` images of an unsorted test split; ``seed`` unused).

        Raises:
            ValueError: an unknown ``choice``.
        """
        if choice not in SEED_CHOICES:
            raise ValueError(f"seed choice must be one of {list(SEED_CHOICES)}, got {choice!r}")
        dataset = self["ood"].dataset
        if choice == "first":
            return torch.arange(min(count, len(dataset)))
        groups = getattr(dataset, "source_classes", None)
        if groups is None:
            groups = dataset_labels(dataset)
        return balanced_choice(groups, min(count, len(dataset)), seed)

    def seed_sizes(self, indices: torch.Tensor) -> list[tuple[int, int]]:
        """The distinct ``(H, W)`` of the OOD images ``indices``, in order of first appearance."""
        dataset = self["ood"].dataset
        return list(dict.fromkeys(image_size(dataset[int(i)].image) for i in indices))

    def seed_images(self, indices: torch.Tensor, pipeline: Callable | None = None) -> torch.Tensor:
        """The OOD images ``indices`` as float tensors in ``[0, 1]``, ``(n, C, H, W)``: the seeds of the chains
        (chain ``i`` varies seed ``i mod n``).

        Args:
            indices: ``(n,)`` indices into the OOD set.
            pipeline: a raw image -> a float tensor at the search's size (e.g. the detectors' common input);
                ``None``: each image at its own size (:func:`image_tensor`), the authors' (their loaders give
                the variations the data's 32 px images, whatever the detector's input).

        Raises:
            ValueError: without a pipeline, images of several sizes or channel counts (named).
        """
        dataset = self["ood"].dataset
        images = [(pipeline or image_tensor)(dataset[int(i)].image).float() for i in indices]
        if {image.shape[0] for image in images} == {1, 3}:  # grey and colour files: grey repeated, as RGB models do
            images = [image.expand(3, -1, -1) for image in images]
        shapes = list(dict.fromkeys(tuple(image.shape) for image in images))
        if len(shapes) > 1:
            raise ValueError(f"the seed images have several shapes {shapes[:4]}: give a pipeline (or image_size) that "
                             "brings them to one")
        return torch.stack(images)

    def through(self, pipeline: Callable[[Any], torch.Tensor]) -> EvGData:
        """The same sets, every OOD image through ``pipeline`` first (:class:`datamodules.evaluation.TransformedSet`)."""
        ood = self["ood"]
        return EvGData(id_val=self["id_val"], id_test=self["id_test"],
                       ood=EvaluationSet("ood", "ood", TransformedSet(ood.dataset, pipeline), info=ood.info),
                       classes=self.classes, batch_size=self.batch_size, num_workers=self.num_workers)


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

    def loader(self, processes: int = 1) -> DataLoader:
        """One batch of chains per step, in order (Lightning shards them over the processes without padding).

        Every process gets a batch: with fewer batches left than processes (a resumed run, a small one)
        finished batches are run again; a chain gives the same result in any batch and process, so their
        files are written with the same bytes. (With none left, ``evaluate.py evg`` runs no search at all and
        only writes the report again.)
        """
        bounds = self.bounds or self.all_bounds[-1:]
        padded = [bounds[i % len(bounds)] for i in range(max(processes, len(bounds)))]
        return DataLoader(_Bounds(padded), batch_size=None, shuffle=False)


class _Bounds(Dataset):
    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        self.bounds = bounds

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> torch.Tensor:
        start, stop = self.bounds[index]
        return torch.arange(start, stop)


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
        self.train_set: Dataset | None = None

    @property
    def num_classes(self) -> int:
        """No known classes: the generator trained here is unconditional."""
        return 0

    @property
    def class_names(self) -> list[str]:
        return []

    def model_input(self) -> ModelInput:
        """Tensors of ``channels`` at ``image_size`` (what the generator makes and its discriminator takes)."""
        return ModelInput(TensorPipeline(self.image_size, self.channels), size=(self.image_size, self.image_size),
                          channels=self.channels)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = real_ood_set(self.ood, data_dir=self.data_dir,
                                          transform=TensorPipeline(self.image_size, self.channels))

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            raise RuntimeError("the OOD training set is not set up; call setup() first")
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          collate_fn=collate_samples, drop_last=len(self.train_set) > self.batch_size,
                          persistent_workers=self.num_workers > 0)
