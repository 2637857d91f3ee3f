"""What every open-set datamodule shares: label handling per loss, class counts, data loaders.

Labels follow DESIGN.md §3 (known ``0..K-1``, negatives ``-1``, unknowns ``-2``). How the training set
treats negatives depends on the loss (Palechor et al. §4), set by ``train_negatives``:

    "include"     EOS: negatives stay in the training set with label -1
    "exclude"     SoftMax: negatives are removed from the training set (not from validation)
    "background"  BG: negatives stay and a target transform maps -1 to the background class K

``train.py`` links this to the model's loss, so a config names the loss once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from datamodules.batch import collate_samples
from datamodules.evaluation import EvaluationSet, Role, known_subset, raw
from datamodules.images import check_choice, dataset_labels
from datamodules.transforms import BackgroundClassTarget, ModelInput
from openset_common.labels import NEGATIVE_LABEL, UNKNOWN_LABEL

# torchdata 0.11's StatefulDataLoader calls a torch API that warns on every epoch; nothing a user can act on
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

TrainNegatives = Literal["include", "exclude", "background"]
NEXT_EPOCH = "next_epoch"  # a loader state that means: the next epoch from its start


class ResumableSampler(StatefulDistributedSampler):
    """The training sampler on any number of processes: ``DistributedSampler``'s shuffle (the permutation of
    epoch ``e`` drawn from ``seed + e``, each rank its shard; one process is rank 0 of 1), with torchdata's count
    of the indices taken and the epoch in its state. The epoch is restored with the state because on a resumed
    run Lightning starts the loader's iterator, which draws the first indices, before it calls ``set_epoch``."""

    def state_dict(self) -> dict:
        return {**super().state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.epoch = int(state_dict.get("epoch", self.epoch))


class ResumableLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` (its state: the sampler's place and each worker's, as of the last batch
    the loop took), and at an epoch's end the state of the next epoch's start: a checkpoint written after the
    last batch of epoch ``e`` resumes with all of epoch ``e + 1``, where the loader's own state would have the
    next iterator skip the whole epoch."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        snapshot = state.get("_snapshot")
        if snapshot is not None and snapshot["_snapshot_step"] >= len(self):
            return {NEXT_EPOCH: self.sampler.epoch + 1}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        if NEXT_EPOCH in state_dict:
            self.sampler.set_epoch(int(state_dict[NEXT_EPOCH]))
            state_dict = {}
        super().load_state_dict(state_dict)


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
        self._prepared = False  # prepare_evaluation has run (evaluation_set)

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

    def prepare_evaluation(self) -> None:
        """What an evaluation of this data needs written before its sets are set up, on every process that reads
        them (a datamodule of files: its missing protocol files); nothing here. Not ``prepare_data``, which a
        Trainer runs once per node and which may do more (decode every image, download)."""

    def evaluation_set(self, split: str, *, role: Role, name: str | None = None, known_only: bool = False
                       ) -> EvaluationSet:
        """The ``"train"``, ``"val"`` or ``"test"`` images of this datamodule as an evaluation set: raw images
        (no augmentation, no target transform: the scoring model applies its own transform) with their labels;
        ``known_only`` keeps the known classes (the fit set of fitted detectors: ``("train", role="fit",
        known_only=True)``).

        A split not set up yet is prepared (:meth:`prepare_evaluation`, then ``setup``): so an evaluation writes
        the files training would (the protocol files of class folders never trained on)."""
        split = check_choice("split", split, ("train", "val", "test"))
        dataset = getattr(self, f"{split}_set")
        if dataset is None:
            if not self._prepared:
                self.prepare_evaluation()
                self._prepared = True
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
        return DataLoader(dataset, shuffle=shuffle, **self._loader_options())

    def _loader_options(self) -> dict:
        return {"batch_size": self.batch_size, "num_workers": self.num_workers, "collate_fn": collate_samples,
                "pin_memory": self.pin_memory, "persistent_workers": self.num_workers > 0}

    def train_dataloader(self) -> DataLoader:
        """The training loader: :class:`ResumableLoader`, a torchdata ``StatefulDataLoader`` whose state (the
        sampler's place and epoch, how many batches the loop took, each worker's place) Lightning saves in every
        checkpoint, so ``fit --ckpt_path`` of a checkpoint written mid-epoch continues that epoch without repeating
        or skipping a sample.

        The sampler is :class:`ResumableSampler` on one process as on several (what Lightning puts in under DDP,
        ``DistributedSampler`` seeded with the run's seed, so epoch ``e``'s order is a function of the seed and
        ``e`` alone, plus its place in the epoch); left to Lightning, the loader's own stateful shuffle would be
        wrapped in a ``DistributedSamplerWrapper`` whose permutation a resumed run does not restore."""
        if self.train_set is None:
            raise RuntimeError("the training set is not set up; call setup() first")
        trainer = self.trainer
        distributed = trainer is not None and trainer.world_size > 1
        sampler = ResumableSampler(self.train_set, num_replicas=trainer.world_size if distributed else 1,
                                   rank=trainer.global_rank if distributed else 0, shuffle=True,
                                   seed=int(os.environ.get("PL_GLOBAL_SEED", 0)))
        return ResumableLoader(self.train_set, sampler=sampler, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False, stage="validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False, stage="test")
