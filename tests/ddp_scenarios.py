"""Validation under DDP with uneven and empty ranks, run as a script (Lightning launches the other ranks).

    python -m tests.ddp_scenarios --devices 2 --out result.json

Rank 0 gets every validation sample and rank 1 none (a sharded sampler without padding, as with
``use_distributed_sampler=False``); the severity ID split holds one image, fewer than the processes. Every
collective (the classifier's γ, the OSCR callback, the severity passes) must still be joined by every rank:
the run finishes, and rank 0 writes the logged metrics, which must equal those of one process.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from callbacks import OpenSetEvaluation, SeverityAUROC
from datamodules import FashionMNISTOpenSetDataModule
from datamodules.batch import collate_samples
from datamodules.evaluation import EvaluationSet
from datamodules.images import TensorImageDataset
from datamodules.severity import FashionSeverityData
from lightning_modules import OpenSetClassifier


class Shard(IterableDataset):
    """The samples of a data set at the given indices (an iterable of unknown length: Lightning accepts an
    empty one on some ranks, unlike an empty map-style loader)."""

    def __init__(self, dataset: Dataset, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __iter__(self) -> Iterator:
        return (self.dataset[i] for i in self.indices)


class RankZeroValidation(FashionMNISTOpenSetDataModule):
    """All validation samples on global rank 0, none on the others."""

    def val_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        indices = list(range(len(self.val_set))) if rank == 0 else []
        return DataLoader(Shard(self.val_set, indices), batch_size=16, collate_fn=collate_samples)


class OneIdImage(FashionSeverityData):
    """Severity data whose ID split holds a single image: fewer samples than processes."""

    def build(self) -> None:
        super().build()
        full = self._sets["id_test"].dataset
        self._sets["id_test"] = EvaluationSet("id_test", "id_test", TensorImageDataset(full.images[:1], full.labels[:1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    pl.seed_everything(0)
    data = RankZeroValidation(max_train_per_class=10, batch_size=16)
    model = OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1)
    # the severity passes are sharded (rank r takes images r, r + 2, ...): one image per batch gives every image
    # the same convolution arithmetic on 1 and on 2 processes, whose float32 outputs could otherwise differ in
    # the last bits with the batch on some CPUs; validation batches are the same on both (all on rank 0)
    severity = SeverityAUROC(data=OneIdImage(estimation=3, test=2, batch_size=1), kappas=["softmax", "entropy"])
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[OpenSetEvaluation(plot_every_n_epochs=0), severity])
    trainer.validate(model, datamodule=data)
    if trainer.is_global_zero:
        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        with open(args.out, "w") as handle:
            json.dump({"metrics": metrics, "passes": severity.model_passes}, handle, sort_keys=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
