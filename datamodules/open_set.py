"""What every open-set datamodule shares: label handling per loss, class counts, data loaders.

Labels follow DESIGN.md §3 (known ``0..K-1``, negatives ``-1``, unknowns ``-2``). How the training set
treats negatives depends on the loss (Palechor et al. §4), set by ``train_negatives``:

    "include"     EOS: negatives stay in the training set with label -1
    "exclude"     SoftMax: negatives are removed from the training set (not from validation)
    "background"  BG: negatives stay and a target transform maps -1 to the background class K

``train.py`` links this to the model's loss, so a config names the loss once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.batch import collate_samples
from datamodules.evaluation import EvaluationSet, Role, known_subset, raw
from datamodules.images import check_choice, dataset_labels
from datamodules.transforms import BackgroundClassTarget, ModelInput
from openset_common import NEGATIVE_LABEL, UNKNOWN_LABEL

TrainNegatives = Literal["include", "exclude", "background"]


class OpenSetDataModule(pl.LightningDataModule):
    """Base class: subclasses set ``num_classes`` and build ``train_set``/``val_set``/``test_set`` in ``setup``."""

    train_set: Dataset | None
    val_set: Dataset | None
    test_set: Dataset | None

    def __init__(
        self,
        *,
        batch_size: int,
        num_workers: int,
        train_negatives: TrainNegatives,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_negatives = check_choice("train_negatives", train_negatives, ("include", "exclude", "background"))
        self.pin_memory = pin_memory
        self.train_set = self.val_set = self.test_set = None
        self._train_labels: list[int] | None = None

    @property
    def num_classes(self) -> int:
        """``K``, the number of known classes."""
        raise NotImplementedError

    @property
    def background_class(self) -> bool:
        return self.train_negatives == "background"

    @property
    def class_names(self) -> list[str]:
        """The known classes (names or wnids) in label order: what a checkpoint records and evaluation data of
        other classes are refused by."""
        raise NotImplementedError

    def model_input(self) -> ModelInput:
        """How a model trained here takes images: the evaluation transform from a raw image (a decoded file, a
        float tensor in ``[0, 1]``) to its input. Every evaluation of a checkpoint of this datamodule uses it."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its models take images (model_input)")

    def evaluation_set(self, split: str, *, role: Role, name: str | None = None, known_only: bool = False
                       ) -> EvaluationSet:
        """The ``"train"``, ``"val"`` or ``"test"`` images of this datamodule as an evaluation set: raw images
        (no augmentation, no target transform: the scoring model applies its own transform) with their labels;
        ``known_only`` keeps the known classes (the fit set of fitted detectors: ``("train", role="fit",
        known_only=True)``)."""
        split = check_choice("split", split, ("train", "val", "test"))
        dataset = getattr(self, f"{split}_set")
        if dataset is None:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
            dataset = getattr(self, f"{split}_set")
        dataset = raw(dataset, what=f"the {split} set of {type(self).__name__}")
        if known_only:
            dataset = known_subset(dataset)
        return EvaluationSet(name or f"{role}", role, dataset, info={"datamodule": type(self).__name__,
                                                                       "split": split, "classes": self.class_names})

    def filter_train_labels(self, labels: Sequence[int]) -> list[int]:
        """Indices of the training rows kept for this loss (negatives dropped for ``"exclude"``)."""
        bad = [label for label in labels if label == UNKNOWN_LABEL]
        if bad:
            raise ValueError("the training split holds unknown samples (label -2); unknowns belong to the test set only")
        if self.train_negatives == "exclude":
            return [i for i, label in enumerate(labels) if label != NEGATIVE_LABEL]
        return list(range(len(labels)))

    def split_labels(self, split: str) -> Tensor | None:
        """Labels of the ``"train"``, ``"val"`` or ``"test"`` set as set up (``None`` before ``setup``)."""
        dataset = {"train": self.train_set, "val": self.val_set, "test": self.test_set}[check_choice(
            "split", split, ("train", "val", "test"))]
        return None if dataset is None else dataset_labels(dataset)

    def train_target_transform(self) -> Callable | None:
        return BackgroundClassTarget(self.num_classes) if self.background_class else None

    def set_train_labels(self, labels: Sequence[int]) -> None:
        """Record the labels of the training set as used (after filtering, before the target transform)."""
        self._train_labels = list(labels)

    def train_class_counts(self) -> Tensor:
        """Training samples per class: ``(K,)``, or ``(K+1,)`` with the background class last."""
        if self._train_labels is None:
            raise RuntimeError("train_class_counts() needs setup('fit') to have run")
        labels = torch.tensor(self._train_labels, dtype=torch.long)
        if self.background_class:
            labels = torch.where(labels == NEGATIVE_LABEL, self.num_classes, labels)
        labels = labels[labels >= 0]
        return torch.bincount(labels, minlength=self.num_classes + int(self.background_class))

    def _loader(self, dataset: Dataset | None, *, shuffle: bool, stage: str) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"the {stage} set is not set up; call setup() first")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=collate_samples,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True, stage="training")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False, stage="validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False, stage="test")
