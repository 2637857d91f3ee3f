"""What the two training benchmarks share (``training_overhead`` on the CPU, ``gpu_throughput`` on a GPU):
synthetic batches, the plain PyTorch step they are compared with, and the cost of the evaluation callbacks
per validation epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import alternate, time_hooks
from callbacks import OpenSetEvaluation, SeverityAUROC
from datamodules import Batch
from datamodules.severity import SEVERITY_SETS
from lightning_modules import OpenSetClassifier

LR = 1e-3  # OpenSetClassifier's default optimizer: torch.optim.Adam, lr 1e-3; the plain loops use the same
SEED = 0
SEVERITY_KAPPAS = ["softmax", "max_logit", "entropy"]
# --------------------------------------------------------------------------------------------------
# synthetic data


class OnDevice:
    """Datamodule mixin: after the transfer to the device, uint8 images become float in [0, 1] and, with
    ``channels_last``, NHWC (Lightning calls a datamodule's ``on_after_batch_transfer`` for every batch; the
    plain loops call it themselves)."""

    channels_last = False

    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        images = batch.images
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return batch._replace(images=images)


class ReadyBatches(Dataset):
    """``length`` ready batches, cycled from a few (a loader with ``batch_size=None`` yields them as they are)."""

    def __init__(self, batches: list[Batch], length: int) -> None:
        self.batches, self.length = batches, length

    def __getitem__(self, index: int) -> Batch:
        return self.batches[index % len(self.batches)]

    def __len__(self) -> int:
        return self.length


class SyntheticData(OnDevice, pl.LightningDataModule):
    """``num_batches`` training batches of random uint8 images ``(3, size, size)``, labels uniform in ``-1..K-1``
    (EOS trains on the negatives), cycled from ``distinct`` pre-collated batches in a fixed order; the
    images become float on the device, so that a run measures the model, not the data loading.

    Args:
        num_classes: ``K``.
        batch_size, num_batches: the epoch.
        image_size: height and width.
        distinct: how many different batches (default: every batch its own).
        pin: pinned host memory (a GPU run).
        channels_last: NHWC images on the device.
    """

    train_negatives = "include"

    def __init__(self, *, num_classes: int, batch_size: int, image_size: int, num_batches: int,
                 distinct: int | None = None, pin: bool = False, channels_last: bool = False) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(SEED)
        self.batch_size, self.num_batches, self._num_classes = batch_size, num_batches, num_classes
        self.channels_last = channels_last
        batches = []
        for _ in range(min(distinct or num_batches, num_batches)):
            images = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8,
                                   generator=generator)
            batch = Batch(images, torch.randint(-1, num_classes, (batch_size,), generator=generator),
                          torch.arange(batch_size), torch.empty(0, dtype=torch.long))
            batches.append(Batch(*(t.pin_memory() for t in batch)) if pin else batch)
        self.train_set = ReadyBatches(batches, num_batches)

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def loader(self, dataset: Dataset | None = None) -> DataLoader:
        """The batches of ``dataset`` (default: the training set) in their fixed order."""
        return DataLoader(self.train_set if dataset is None else dataset, batch_size=None)

    def train_dataloader(self) -> DataLoader:
        return self.loader()


# --------------------------------------------------------------------------------------------------
# the plain step


def plain_step(model: OpenSetClassifier, optimizer: torch.optim.Optimizer, batch: Batch, *,
               bf16: bool = False) -> torch.Tensor:
    """One step as a plain PyTorch loop does it: zero_grad, forward through ``model.network`` (autocast bf16
    when asked), ``model.criterion`` on float logits, backward, Adam's step. Returns the detached loss."""
    optimizer.zero_grad()
    with torch.autocast(batch.images.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, _ = model.network(batch.images)
        loss = model.criterion(logits.float(), batch.targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


# --------------------------------------------------------------------------------------------------
# the evaluation callbacks' cost


@dataclass
class CallbackCost:
    """One variant of ``trainer.validate`` over rounds: the whole calls, the time inside its callbacks' hooks
    (``setup`` and ``teardown`` apart) and their ``setup``."""

    label: str
    walls: list[float] = field(default_factory=list)
    hooks: list[float] = field(default_factory=list)
    setups: list[float] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return min(self.walls)

    @property
    def hooks_s(self) -> float:
        return min(self.hooks)

    @property
    def setup_s(self) -> float:
        return min(self.setups)


def evaluated(callback: pl.Callback) -> bool:
    """Whether an evaluation callback did its work in the validate call (a benchmark times real work only)."""
    if isinstance(callback, OpenSetEvaluation):
        return callback.report is not None
    if isinstance(callback, SeverityAUROC):
        return callback.model_passes == len(SEVERITY_SETS) and bool(callback.tables)
    return True


def callback_costs(model: pl.LightningModule, data: pl.LightningDataModule,
                   variants: Mapping[str, Callable[[], list[pl.Callback]]], *, trainer_args: Callable[[int], dict],
                   repeat: int, warmup: int = 1, synchronize: Callable[[], None] | None = None) -> list[CallbackCost]:
    """``trainer.validate`` of ``model`` once per variant and round (rounds alternate the variants), each with
    a fresh Trainer (``trainer_args(variant_number)``) and fresh callbacks; the first ``warmup`` rounds are
    dropped.

    Raises:
        RuntimeError: a callback did not evaluate during its validate call.
    """
    costs = {label: CallbackCost(label) for label in variants}

    def case(number: int, label: str, make: Callable[[], list[pl.Callback]]) -> Callable[[], tuple]:
        def run() -> tuple[float, float, float]:
            callbacks = make()
            timers = [time_hooks(callback, synchronize=synchronize) for callback in callbacks]
            start = time.perf_counter()
            trainer = pl.Trainer(**trainer_args(number), callbacks=callbacks)
            trainer.validate(model, datamodule=data, verbose=False)
            if synchronize is not None:
                synchronize()
            wall = time.perf_counter() - start
            for callback in callbacks:
                if not evaluated(callback):
                    raise RuntimeError(f"{type(callback).__name__} ({label}) did not evaluate during validate")
            hooks = sum(s for timer in timers for hook, s in timer.items() if hook not in ("setup", "teardown"))
            return wall, hooks, sum(timer.get("setup", 0.0) for timer in timers)
        return run

    cases = {label: case(number, label, make) for number, (label, make) in enumerate(variants.items())}
    for label, results in alternate(cases, repeat=repeat, warmup=warmup).items():
        for wall, hooks, setup in results:
            costs[label].walls.append(wall)
            costs[label].hooks.append(hooks)
            costs[label].setups.append(setup)
    return list(costs.values())

