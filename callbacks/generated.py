"""Writing generated sets and drawing sample grids: collect -> write / plot.

:class:`GeneratedSetWriter` gathers what a generator's ``predict_step`` returns on every process (each
image once, by dataset index, whatever the padding of the distributed sampler), and global rank zero
writes the set (:mod:`datamodules.generated`) into a temporary folder that is renamed into place when
complete. :class:`SampleGrids` logs image grids from the generator's fixed inputs every N steps.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from PIL import Image
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_info

from callbacks.plots import save_image_grid
from common import atomic_write_text
from datamodules.generated import MANIFEST_COLUMNS
from metrics import IndexedPredictions

PER_IMAGE = ("images", "source_index", "source_label", "seed", "ensemble_prediction", "mi", "lpips")


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[0, 1]`` floats -> uint8, rounded (the PNG files and ``images.pt`` hold the same bytes)."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


class GeneratedSetWriter(pl.Callback):
    """Writes the predictions of a generator as a generated set (see :mod:`datamodules.generated`).

    Args:
        output_dir: the set's folder; it must not exist yet unless ``overwrite``.
        info: the description written to ``info.json`` (kind, generator checkpoint and sha256, seed, ...).
        overwrite: replace an existing complete set.
    """

    def __init__(self, output_dir: str | Path, info: dict[str, Any], *, overwrite: bool = False) -> None:
        super().__init__()
        self.output_dir = Path(output_dir)
        self.info = dict(info)
        self.overwrite = overwrite
        self.stores: dict[str, IndexedPredictions] = {}
        self.count = 0

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.output_dir.exists() and not self.overwrite:
            raise FileExistsError(f"{self.output_dir} exists; choose another folder or pass overwrite")

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stores = {key: IndexedPredictions().to(pl_module.device) for key in PER_IMAGE}

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        for key in PER_IMAGE:
            self.stores[key].update(outputs[key], outputs["targets"], outputs["indices"])

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        gathered = {key: self.stores[key].gather()[0].cpu() for key in PER_IMAGE}  # every rank joins
        self.count = gathered["images"].shape[0]
        if trainer.is_global_zero:
            self._write(gathered)

    def _write(self, gathered: dict[str, torch.Tensor]) -> None:
        images = to_uint8(gathered["images"])
        self.output_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.output_dir.name}.", dir=self.output_dir.parent))
        try:
            (staging / "images").mkdir()
            rows = []
            for i, image in enumerate(images):
                name = f"images/{i:06d}.png"
                array = image.permute(1, 2, 0).numpy()
                Image.fromarray(array[..., 0] if array.shape[2] == 1 else array).save(staging / name)
                rows.append({
                    "file": name, "index": i,
                    "seed": int(gathered["seed"][i]),
                    "source_index": int(gathered["source_index"][i]),
                    "source_label": int(gathered["source_label"][i]),
                    "ensemble_prediction": int(gathered["ensemble_prediction"][i]),
                    "mi": _number(gathered["mi"][i]), "lpips": _number(gathered["lpips"][i]),
                    "generator_sha256": self.info.get("generator_sha256", ""),
                })
            torch.save(images.contiguous(), staging / "images.pt")
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=list(MANIFEST_COLUMNS), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            atomic_write_text(staging / "info.json", json.dumps({**self.info, "count": len(rows)}, indent=2) + "\n")
            atomic_write_text(staging / "manifest.csv", buffer.getvalue())
            save_image_grid(gathered["images"][:64], staging / "grid.png")
            if self.output_dir.exists():  # overwrite: the old set stays whole until the new one is complete
                shutil.rmtree(self.output_dir)
            staging.rename(self.output_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        rank_zero_info(f"Generated set of {len(rows)} images: {self.output_dir}")


def _number(value: torch.Tensor) -> str:
    return "" if not np.isfinite(float(value)) else f"{float(value):.6g}"


class SampleGrids(pl.Callback):
    """Every ``every_n_steps`` training steps, an image grid of ``pl_module.fixed_samples()`` to W&B and to
    ``<checkpoint dir>/samples/step_<n>.png`` (fixed noise, or fixed source images next to their shifts)."""

    def __init__(self, every_n_steps: int = 200, output_dir: str | None = None) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be positive, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.output_dir = output_dir
        self.written: list[Path] = []

    def _due(self, trainer: pl.Trainer) -> bool:
        return trainer.global_step > 0 and (trainer.global_step // 2) % self.every_n_steps == 0  # 2 optimisers

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._due(trainer):
            self._draw(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._draw(trainer, pl_module)

    def _draw(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        step = trainer.global_step // 2
        checkpointing = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = Path(self.output_dir or checkpointing or trainer.log_dir or trainer.default_root_dir) / "samples"
        path = save_image_grid(pl_module.fixed_samples().cpu(), folder / f"step_{step:06d}.png", columns=8)
        self.written.append(path)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="samples", images=[str(path)], step=trainer.global_step)
