"""Mukhoti et al.'s generated benchmarks (DESIGN.md §5.3): writing generated sets, sample grids during
training, and detectors evaluated on the generated sets.

:class:`GeneratedSetWriter` gathers what a generator's ``predict_step`` returns on every process (each
image once, by dataset index, whatever the padding of the distributed sampler), and global rank zero
writes the set (:mod:`datamodules.generated`) into a temporary folder that is renamed into place when
complete. :class:`SampleGrids` logs image grids from the generator's fixed inputs every N steps.

:class:`GeneratedBenchmark` runs on ``trainer.test`` of any model (a :class:`ScoringModel`: a timm or
torchvision classifier, a checkpoint, or an ensemble): collect -> score -> metric -> log/write.

- Detectors, per κ: near-OOD AUROC (ID test vs each generated near-OOD set) and the same for every real OOD
  set, side by side; on each shifted set the accuracy against the source labels, the expected calibration
  error (torchmetrics, 15 bins, L1) and the AUROC of ID test vs shifted.
- What the sets are (``describe_sets``, model-independent: once per run): the ensemble's mean MI on each
  set (generated, ID test, real OOD), the mean LPIPS to the nearest of ``reference`` ID test images
  (generated and real OOD), and for a shifted set the fraction whose ensemble prediction keeps the source
  label. Comparing a regularised set with the unregularised one (λ = 0, same budget) measures what each
  regulariser did.

Passes are sharded over the devices (every rank joins every gather). Global rank zero writes
``detectors.csv`` / ``.md``, ``sets.csv`` / ``.md`` and a grid of each set; the same go to W&B.
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
from torch import Tensor
from torchmetrics.functional.classification import multiclass_calibration_error

from callbacks.plots import save_image_grid
from callbacks.scoring import sharded_outputs
from callbacks.severity import kappa_scores, model_logits, rows_to_csv, slug
from common import atomic_write_text, known_columns
from datamodules.generated import MANIFEST_COLUMNS, GeneratedBenchmarkData
from metrics import IndexedPredictions, Kappa, auroc, get_kappa

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


DETECTOR_COLUMNS = ("model", "confidence function", "set", "kind", "auroc", "accuracy", "ece", "images")
SET_COLUMNS = ("set", "kind", "images", "mean MI", "mean LPIPS to nearest ID", "mean LPIPS to source",
               "keeps source label", "lambda_perceptual", "lambda_semantic", "generator")


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return ""
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


class GeneratedBenchmark(pl.Callback):
    """See the module docstring.

    Args:
        data: the sets (:class:`datamodules.generated.GeneratedBenchmarkData`).
        kappas: κ names or objects; ensemble κ need an ensemble model.
        ensemble: the deep ensemble that describes the sets (MI, predictions); ``None`` skips those columns.
        perceptual: the LPIPS distance that describes the sets; ``None`` skips that column.
        reference: how many ID test images the nearest-image LPIPS searches.
        describe_sets: compute the description (once per run: it does not depend on the model).
        output_dir: where files go.
    """

    def __init__(
        self,
        data: GeneratedBenchmarkData,
        kappas: list[str | Kappa],
        *,
        ensemble: torch.nn.Module | None = None,
        perceptual: torch.nn.Module | None = None,
        reference: int = 128,
        describe_sets: bool = True,
        output_dir: str | Path = "runs/generated",
        plots: bool = True,
    ) -> None:
        super().__init__()
        self.data = data
        self.kappas = [k if isinstance(k, Kappa) else get_kappa(k) for k in kappas]
        model_based = [k.name for k in self.kappas if k.kind == "model"]
        if model_based:
            raise ValueError(f"model-based κ {model_based} are not supported here yet; use logit or ensemble κ")
        self.ensemble, self.perceptual = ensemble, perceptual
        self.reference, self.describe_sets = reference, describe_sets
        self.output_dir, self.plots = Path(output_dir), plots
        self.detectors: list[dict[str, Any]] = []
        self.sets: list[dict[str, Any]] = []

    def _outputs(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: Any, keys: list[str]
                 ) -> dict[str, dict[str, Tensor]]:
        return {name: sharded_outputs(trainer, dataset, step, keys=keys, batch_size=self.data.batch_size,
                                      num_workers=self.data.num_workers, device=pl_module.device)
                for name, dataset in self.data.sets.items()}

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        background = bool(getattr(pl_module, "background_class", False))
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad():
                outputs = self._outputs(trainer, pl_module, lambda x: {"logits": model_logits(pl_module, x)},
                                        ["logits"])
                description = self._describe(trainer, pl_module) if self.describe_sets else {}
        finally:
            pl_module.train(was_training)
        self.detectors = self._detectors(outputs, background=background, model_name=model_name)
        self.sets = [self._set_row(name, description) for name in self.data.sets] if description else []
        if trainer.is_global_zero:
            self._write(trainer)

    # -- detectors ---------------------------------------------------------------------------------

    def _detectors(self, outputs: dict[str, dict[str, Tensor]], *, background: bool, model_name: str
                   ) -> list[dict[str, Any]]:
        rows = []
        for kappa in self.kappas:
            scores = {name: kappa_scores(kappa, out, background=background, parameters={})
                      for name, out in outputs.items()}
            for name, kind in self.data.kinds.items():
                if kind == "id":
                    continue
                row = {"model": model_name, "confidence function": kappa.name, "set": name, "kind": kind,
                       "auroc": auroc(scores["id_test"], scores[name]), "images": int(scores[name].numel())}
                if kind == "shift":
                    probs = torch.softmax(outputs[name]["logits"].float(), dim=-1)
                    probs = known_columns(probs.mean(dim=1) if probs.ndim == 3 else probs, background)
                    targets = outputs[name]["targets"]
                    row["accuracy"] = float((probs.argmax(dim=1) == targets).double().mean())
                    # calibration of the known-class prediction; with a background column the row does not sum
                    # to 1, and the ECE uses the confidence of the predicted known class as it is
                    row["ece"] = float(multiclass_calibration_error(probs, targets, num_classes=probs.shape[1],
                                                                    n_bins=15, norm="l1"))
                rows.append(row)
        return rows

    # -- what the sets are -------------------------------------------------------------------------

    def _describe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, dict[str, Tensor]]:
        keys: list[str] = []
        ensemble, perceptual = self.ensemble, self.perceptual
        if ensemble is not None:
            ensemble.to(pl_module.device)
            keys += ["mi", "prediction"]
        reference = None
        if perceptual is not None:
            perceptual.to(pl_module.device)
            id_set = self.data.sets["id_test"]
            count = min(self.reference, len(id_set))
            reference = torch.stack([id_set[i].image for i in range(count)]).to(pl_module.device)
            keys.append("lpips")
        if not keys:
            return {}

        def step(images: Tensor) -> dict[str, Tensor]:
            out: dict[str, Tensor] = {}
            if ensemble is not None:
                from metrics.ensemble import mutual_information_from_logits

                logits = ensemble(images).float()
                out["mi"] = mutual_information_from_logits(logits, background=ensemble.background).float()
                mean = known_columns(torch.softmax(logits, dim=-1).mean(dim=0), ensemble.background)
                out["prediction"] = mean.argmax(dim=1).float()
            if perceptual is not None:
                out["lpips"] = perceptual.nearest(images, reference)[1].float()
            return out

        return self._outputs(trainer, pl_module, step, keys)

    def _set_row(self, name: str, description: dict[str, dict[str, Tensor]]) -> dict[str, Any]:
        kind = self.data.kinds[name]
        out = description[name]
        info = self.data.info.get(name, {})
        row: dict[str, Any] = {"set": name, "kind": kind, "images": int(out["targets"].numel()),
                               "lambda_perceptual": _float(info.get("lambda_perceptual")),
                               "lambda_semantic": _float(info.get("lambda_semantic")),
                               "generator": generator_name(info["generator"]) if "generator" in info else ""}
        if "mi" in out:
            row["mean MI"] = float(out["mi"].double().mean())
            if kind in ("shift", "id"):  # for the ID test set: the ensemble's accuracy, the scale to read it against
                row["keeps source label"] = float((out["prediction"].long() == out["targets"]).double().mean())
        if kind == "shift":  # the regularised quantity itself, measured at generation (manifest, info["lpips"])
            values = [float(r["lpips"]) for r in self.data.sets[name].dataset.rows if r["lpips"] != ""]
            row["mean LPIPS to source"] = sum(values) / len(values) if values else None
        if "lpips" in out and kind != "id":
            row["mean LPIPS to nearest ID"] = float(out["lpips"].double().mean())
        return row

    # -- files, W&B ----------------------------------------------------------------------------------

    def _write(self, trainer: pl.Trainer) -> None:
        out = self.output_dir
        model = slug(self.detectors[0]["model"]) if self.detectors else "model"
        atomic_write_text(out / f"detectors_{model}.csv", rows_to_csv(self.detectors, DETECTOR_COLUMNS))
        atomic_write_text(out / f"detectors_{model}.md", markdown_table(self.detectors, DETECTOR_COLUMNS))
        if self.sets:
            lpips = getattr(self.perceptual, "description", "no LPIPS")
            atomic_write_text(out / "sets.csv", rows_to_csv(self.sets, SET_COLUMNS))
            atomic_write_text(out / "sets.md", f"LPIPS: {lpips}; reference: {self.reference} ID test images\n\n"
                              + markdown_table(self.sets, SET_COLUMNS))
        grids = {}
        if self.plots:
            for name, dataset in self.data.sets.items():
                images = torch.stack([dataset[i].image for i in range(min(32, len(dataset)))])
                grids[name] = save_image_grid(images, out / "grids" / f"{slug(name)}.png")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(key="generated/detectors", columns=list(DETECTOR_COLUMNS),
                                 data=[[_cell(row.get(c)) for c in DETECTOR_COLUMNS] for row in self.detectors])
                if self.sets:
                    logger.log_table(key="generated/sets", columns=list(SET_COLUMNS),
                                     data=[[_cell(row.get(c)) for c in SET_COLUMNS] for row in self.sets])
                for name, path in grids.items():
                    logger.log_image(key=f"generated/grid/{slug(name)}", images=[str(path)])
        rank_zero_info(f"Generated benchmark tables: {out}")


def generator_name(path: str) -> str:
    """``runs/demo/generators/shift/last.ckpt`` -> ``shift/last.ckpt``; other checkpoints -> their file name."""
    checkpoint = Path(path)
    return f"{checkpoint.parent.name}/{checkpoint.name}" if checkpoint.stem in ("best", "last") else checkpoint.name


def _float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def _cell(value: Any) -> Any:
    """A W&B table cell: numbers as floats, missing values as None (a column must keep one type)."""
    if value is None or value == "":
        return None
    return float(value) if isinstance(value, (int, float)) else str(value)
