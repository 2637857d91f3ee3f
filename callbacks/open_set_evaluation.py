"""Test-set evaluation of an open-set classifier: collect -> score -> metric -> log/plot.

On ``trainer.test`` this callback gathers the probabilities, labels and dataset indices of every test
sample from all processes (without the ``DistributedSampler`` padding), computes the report of
:func:`metrics.open_set_report` (CCR at FPR 1e-3/1e-2/1e-1/1 on negatives and on unknowns, known-vs-group
AUROC, closed-set accuracy, γ), logs the scalars to the trainer's loggers and the figures to W&B, and
writes everything next to the checkpoint:

    <checkpoint dir>/<checkpoint name>-oscr/
        metrics.json   every number, the sample counts, the checkpoint and the skipped images
        metrics.csv    one ``name,value`` row per scalar
        oscr_<group>.csv         the OSCR curve: fpr, ccr, threshold
        oscr_curves.png          CCR against FPR on a log axis
        score_histograms.png     known true-class score vs. negative/unknown max score

Every file is written atomically by global rank zero.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_info

from callbacks.plots import plot_oscr_curves, plot_score_histograms
from datamodules.io import atomic_write_text
from metrics import DEFAULT_FPR_TARGETS, IndexedPredictions, open_set_report


def report_dir(trainer: pl.Trainer, output_dir: str | None, suffix: str) -> Path:
    """``output_dir`` if given, else ``<checkpoint dir>/<checkpoint stem>-<suffix>``, else under the log dir."""
    if output_dir is not None:
        return Path(output_dir)
    if trainer.ckpt_path:
        checkpoint = Path(trainer.ckpt_path)
        return checkpoint.parent / f"{checkpoint.stem}-{suffix}"
    return Path(trainer.log_dir or trainer.default_root_dir) / suffix


def write_scalars(directory: Path, scalars: dict[str, float], extra: dict[str, Any]) -> None:
    """``metrics.json`` (scalars plus ``extra``) and ``metrics.csv``, both atomically."""
    atomic_write_text(directory / "metrics.json", json.dumps({**extra, "scalars": scalars}, indent=2) + "\n")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["metric", "value"])
    writer.writerows(sorted(scalars.items()))
    atomic_write_text(directory / "metrics.csv", buffer.getvalue())


class OpenSetEvaluation(pl.Callback):
    """Open-set test report (Palechor et al., WACV 2023); see the module docstring.

    Args:
        fpr_targets: FPR values at which CCR is reported.
        output_dir: where to write the report (default: next to the tested checkpoint).
        plots: write and log the OSCR and histogram figures.
        histogram_bins: bins of the score histograms.
    """

    def __init__(
        self,
        fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
        output_dir: str | None = None,
        plots: bool = True,
        histogram_bins: int = 50,
    ) -> None:
        super().__init__()
        self.fpr_targets = tuple(float(t) for t in fpr_targets)
        self.output_dir = output_dir
        self.plots = plots
        self.histogram_bins = histogram_bins
        self.predictions = IndexedPredictions()
        self.skipped = IndexedPredictions()
        self.report: dict[str, Any] | None = None
        self.report_path: Path | None = None

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.predictions = IndexedPredictions().to(pl_module.device)
        self.skipped = IndexedPredictions().to(pl_module.device)
        self.report = None

    def on_test_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not isinstance(outputs, dict) or "probs" not in outputs or "targets" not in outputs:
            raise TypeError("OpenSetEvaluation needs test_step to return a dict with 'probs' and 'targets'")
        self.predictions.update(outputs["probs"], outputs["targets"], outputs.get("indices"))
        skipped = outputs.get("skipped", torch.empty(0, dtype=torch.long, device=pl_module.device))
        self.skipped.update(skipped, torch.zeros_like(skipped), skipped)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        probs, targets = self.predictions.compute()  # gathered on every rank, padding removed
        skipped_indices, _ = self.skipped.compute()  # unique dataset indices
        background = bool(getattr(pl_module, "background_class", False))
        report = open_set_report(probs, targets, fpr_targets=self.fpr_targets, background=background)
        report["counts"]["skipped_images"] = int(skipped_indices.numel())
        self.report = report
        # equal on every rank (computed from the gathered predictions); max keeps them exact
        pl_module.log_dict({f"test/{name}": value for name, value in report["scalars"].items()}, sync_dist=True,
                           reduce_fx="max")
        if trainer.is_global_zero:
            self.report_path = self._write(trainer, report, background=background)

    def _write(self, trainer: pl.Trainer, report: dict[str, Any], *, background: bool) -> Path:
        directory = report_dir(trainer, self.output_dir, "oscr")
        files: dict[str, str] = {}
        for group, (fpr, ccr, thresholds) in report["curves"].items():
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            writer.writerow(["fpr", "ccr", "threshold"])
            writer.writerows(zip(fpr.tolist(), ccr.tolist(), thresholds.double().tolist(), strict=True))
            files[f"oscr_{group}"] = str(atomic_write_text(directory / f"oscr_{group}.csv", buffer.getvalue()))
        if self.plots:
            name = Path(trainer.ckpt_path).stem if trainer.ckpt_path else "model"
            files["oscr_curves"] = str(
                plot_oscr_curves(report["curves"], directory / "oscr_curves.png", fpr_targets=self.fpr_targets,
                                 title=f"OSCR ({name})")
            )
            files["score_histograms"] = str(
                plot_score_histograms(report["scores"], directory / "score_histograms.png", bins=self.histogram_bins)
            )
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_image(key="test/oscr_curves", images=[files["oscr_curves"]])
                    logger.log_image(key="test/score_histograms", images=[files["score_histograms"]])
        write_scalars(
            directory,
            report["scalars"],
            {
                "checkpoint": str(trainer.ckpt_path) if trainer.ckpt_path else None,
                "background_class": background,
                "fpr_targets": list(self.fpr_targets),
                "counts": report["counts"],
                "files": files,
            },
        )
        rank_zero_info(f"Open-set evaluation report: {directory}")
        return directory
