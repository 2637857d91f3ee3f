"""Open-set evaluation of a classifier during validation and at test: collect -> score -> metric -> log/plot.

At test (``evaluate.py oscr``, a report card): :meth:`OpenSetEvaluation.evaluate` scores the protocol's test set
through the engine's shared scoring pass (sharded, gathered exactly, cached) and reports from its logits. During
training (and at a user's ``trainer.test`` of a training model) the callback gathers the probabilities, labels and
dataset indices that ``validation_step`` / ``test_step`` return, from all processes and without the ``DistributedSampler`` padding (every rank joins
the gather, also one without a batch), one collection per dataloader (their indices may overlap), and
computes :func:`metrics.open_set_report`: CCR at FPR 1e-3/1e-2/1e-1/1 on negatives and on unknowns (the
exact convention, and the authors' table convention if asked), known-vs-group AUROC, closed-set accuracy
and γ.

During training (every ``every_n_epochs`` validation epochs) the scalars are logged as ``val/...``
(``val/negatives/ccr@fpr=0.1``, ``val/negatives/auroc``, ...) so that W&B draws them over epochs next to
``val/gamma``; every ``plot_every_n_epochs`` the OSCR curve image is logged and written to
``<checkpoint dir>/val-oscr/epoch_<n>.png``.

At test it logs ``test/...`` and writes everything next to the checkpoint:

    <checkpoint dir>/<checkpoint name>-oscr/
        metrics.json   every number, its interval, the sample counts, the checkpoint, the CCR convention(s),
                       skipped images
        metrics.csv    one ``metric,value,low,high`` row per scalar
        replicates.pt  the bootstrap replicates of every scalar (what the report card compares models with)
        oscr_<group>.csv         the OSCR curve: fpr, ccr, threshold
        oscr_curves.png          CCR against FPR on a log axis
        score_histograms.png     known true-class score vs. negative/unknown max score

Every file is written atomically by global rank zero.

Intervals at test (:class:`evaluation_engine.outputs.Intervals`): the AUROC of knowns vs each group gets DeLong's
interval (:meth:`evaluation_engine.outputs.Intervals.auroc`); closed-set accuracy Wilson's interval of the proportion;
CCR@FPR (each convention; NaN replicates of the authors' "—" are left out) and γ a percentile bootstrap in which
the resampling unit is the test image, stratified: knowns, negatives and unknowns are resampled separately
(each group's size is fixed by the protocol, not drawn). The bootstrap replicates of every scalar, accuracy
included, are kept for the report card's paired comparisons.
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
from pytorch_lightning.utilities import rank_zero_info
from torch import nn

from datamodules.evaluation import EvaluationSet
from datamodules.transforms import ModelInput
from evaluation_engine.intervals import Intervals
from evaluation_engine.outputs import (
    default_report_dir,
    log_images,
    training_report_dir,
    write_csv,
    write_json,
    write_replicates,
)
from evaluation_engine.plots import plot_oscr_curves, plot_score_histograms
from evaluation_engine.results import Estimate, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import ScoringPasses
from lightning_modules.scoring import checkpoint_display_name
from metrics import DEFAULT_FPR_TARGETS, GROUPS, IndexedPredictions, fpr_key, max_known_score, open_set_report
from metrics.open_set import bootstrap_open_set
from openset_common.artefacts import atomic_write_text, tensors_fingerprint


def report_dir(trainer: pl.Trainer, output_dir: str | None, suffix: str, checkpoint: str | None = None) -> Path:
    """``output_dir`` if given, else ``<checkpoint dir>/<checkpoint stem>-<suffix>``, else under the log dir."""
    return Path(output_dir) if output_dir is not None else default_report_dir(trainer, suffix, checkpoint)


def write_scalars(directory: Path, scalars: dict[str, float], extra: dict[str, Any],
                  intervals: dict[str, tuple[float | None, float | None]] | None = None) -> dict[str, Any]:
    """``metrics.json`` (scalars, their intervals, plus ``extra``) and ``metrics.csv``, both atomically; returns
    what ``metrics.json`` holds, as read back."""
    intervals = intervals or {}
    payload = {**extra, "scalars": scalars, "intervals": {k: list(v) for k, v in sorted(intervals.items())}}
    write_json(directory / "metrics.json", payload)
    write_csv(directory / "metrics.csv", [{"metric": k, "value": v, "low": intervals.get(k, (None, None))[0],
                                           "high": intervals.get(k, (None, None))[1]}
                                          for k, v in sorted(scalars.items())], ("metric", "value", "low", "high"))
    return json.loads(json.dumps(payload, default=float))  # its JSON values (lists, floats), as a reader gets them


def num_dataloaders(trainer: pl.Trainer, stage: str) -> int:
    """How many dataloaders the running evaluation loop has (every rank knows, also one without batches)."""
    if stage == "val":
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
    else:
        counts = trainer.num_test_batches
    return max(1, len(counts)) if isinstance(counts, list) else 1


# the leaderboard's columns: the maximum softmax probability against the protocol's unknown classes
HEADLINE_SCALARS = (("oscr_ccr", "unknowns/ccr@fpr=0.1"), ("oscr_auroc", "unknowns/auroc"))
FIGURES = (("oscr_curves.png", "OSCR curves", "CCR against FPR (log axis), negatives and unknowns"),
           ("score_histograms.png", "score histograms",
            "true-class score of the knowns vs maximum score of negatives and unknowns"))



class OpenSetEvaluation(pl.Callback):
    """Open-set report (Palechor et al., WACV 2023) during validation and at test; see the module docstring.

    Args:
        fpr_targets: FPR values at which CCR is reported.
        output_dir: where to write the test report (default: next to the tested checkpoint).
        plots: write and log the OSCR and histogram figures.
        histogram_bins: bins of the score histograms.
        every_n_epochs: evaluate on validation every n-th epoch (0: only at test).
        plot_every_n_epochs: log the validation OSCR curve image every n-th epoch (0: never).
        conventions: CCR@FPR conventions to report: ``"exact"`` (DESIGN.md §5.1) and/or ``"authors"`` (the
            procedure of the published tables, keys ``authors_ccr@fpr=...``, NaN where they print "—").
        intervals: level, bootstrap resamples and seed of the test report's intervals.
        checkpoint: the checkpoint the tested model was built from, where the test runs on a built model (no
            ``ckpt_path``): the report names it.
    """

    def __init__(
        self,
        fpr_targets: Sequence[float] = DEFAULT_FPR_TARGETS,
        output_dir: str | None = None,
        plots: bool = True,
        histogram_bins: int = 50,
        every_n_epochs: int = 1,
        plot_every_n_epochs: int = 10,
        conventions: Sequence[str] = ("exact",),
        intervals: Intervals | None = None,
        checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.intervals = Intervals.of(intervals)
        self.fpr_targets = tuple(float(t) for t in fpr_targets)
        for convention in conventions:
            fpr_key(1.0, convention)  # fail at construction on an unknown convention
        if every_n_epochs < 0 or plot_every_n_epochs < 0:
            raise ValueError(f"every_n_epochs and plot_every_n_epochs must be >= 0, got {every_n_epochs}, "
                             f"{plot_every_n_epochs}")
        self.conventions = tuple(conventions)
        self.output_dir = output_dir
        self.plots = plots
        self.histogram_bins = histogram_bins
        self.every_n_epochs = every_n_epochs
        self.plot_every_n_epochs = plot_every_n_epochs
        self.predictions: dict[int, IndexedPredictions] = {}
        self.skipped = IndexedPredictions()
        self.report: dict[str, Any] | None = None  # of dataloader 0 (test), or the last validation epoch
        self.reports: dict[int, dict[str, Any]] = {}
        self.report_path: Path | None = None
        self.history: list[dict[str, float]] = []  # validation scalars per evaluated epoch

    # -- collect -----------------------------------------------------------------------------------

    def _validation_due(self, trainer: pl.Trainer) -> bool:
        return (not trainer.sanity_checking and self.every_n_epochs > 0
                and (trainer.current_epoch + 1) % self.every_n_epochs == 0)

    def _reset(self, pl_module: pl.LightningModule) -> None:
        self.predictions = {}
        self.skipped = IndexedPredictions().to(pl_module.device)
        self.report, self.reports = None, {}

    def _store(self, dataloader_idx: int, device: torch.device) -> IndexedPredictions:
        if dataloader_idx not in self.predictions:
            self.predictions[dataloader_idx] = IndexedPredictions().to(device)
        return self.predictions[dataloader_idx]

    def _collect(self, pl_module: pl.LightningModule, outputs: Any, dataloader_idx: int) -> None:
        if outputs is None:  # a batch of skipped (unreadable) images only
            return
        if not isinstance(outputs, dict) or "probs" not in outputs or "targets" not in outputs:
            raise TypeError("OpenSetEvaluation needs the step to return a dict with 'probs' and 'targets'")
        self._store(dataloader_idx, pl_module.device).update(outputs["probs"], outputs["targets"],
                                                              outputs.get("indices"))
        skipped = outputs.get("skipped", torch.empty(0, dtype=torch.long, device=pl_module.device))
        self.skipped.update(skipped, torch.zeros_like(skipped), skipped)

    def _reports(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> dict[int, dict[str, Any]]:
        background = bool(getattr(pl_module, "background_class", False))
        num_classes = getattr(pl_module, "num_classes", None)
        reports = {}
        for dataloader_idx in range(num_dataloaders(trainer, stage)):
            # gathered on every rank (also one that saw no batch of this dataloader), padding removed
            probs, targets = self._store(dataloader_idx, pl_module.device).gather()
            reports[dataloader_idx] = open_set_report(probs, targets, fpr_targets=self.fpr_targets,
                                                      background=background, conventions=self.conventions,
                                                      num_classes=num_classes)
            if stage == "test":
                self._intervals(reports[dataloader_idx], probs, targets, background)
        return reports

    def _intervals(self, report: dict[str, Any], probs: torch.Tensor, targets: torch.Tensor, background: bool) -> None:
        """``report["intervals"]`` of every scalar and ``report["replicates"]`` (see the module docstring)."""
        options = self.intervals
        replicates = bootstrap_open_set(probs, targets, fpr_targets=self.fpr_targets, background=background,
                                        conventions=self.conventions, resamples=options.resamples, seed=options.seed)
        intervals = {name: options.bounds(values) for name, values in replicates.items()}
        known_count = int((targets >= 0).sum())
        if known_count and "closed_set_accuracy" in report["scalars"]:  # a proportion: Wilson's interval
            correct = round(report["scalars"]["closed_set_accuracy"] * known_count)
            intervals["closed_set_accuracy"] = options.proportion(correct, known_count)
        confidence = max_known_score(probs, background)  # in the dtype the report scored, as its AUROC
        known = targets >= 0
        for group, label in GROUPS.items():
            if f"{group}/auroc" in report["scalars"]:
                intervals[f"{group}/auroc"] = options.auroc(confidence[known], confidence[targets == label])
        report["intervals"], report["replicates"] = intervals, replicates
        # the units the replicates resample: the test samples by dataset index (their labels in that order)
        report["units"] = tensors_fingerprint({"targets": targets.cpu()})

    @staticmethod
    def _log(runner: Runner, pl_module: nn.Module, stage: str, reports: dict[int, dict[str, Any]]) -> None:
        scalars = {}
        for dataloader_idx, report in reports.items():
            suffix = "" if dataloader_idx == 0 else f"/dataloader_idx_{dataloader_idx}"
            scalars.update({f"{stage}/{name}{suffix}": value for name, value in report["scalars"].items()
                            if not (stage == "val" and name.startswith("gamma"))})  # val/gamma: the model's own
        runner.log_metrics(scalars, pl_module)  # equal on every rank (computed from the gathered predictions)

    # -- validation --------------------------------------------------------------------------------

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validation_due(trainer):
            self._reset(pl_module)

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._validation_due(trainer):
            self._collect(pl_module, outputs, dataloader_idx)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._validation_due(trainer):
            return
        self.reports = self._reports(trainer, pl_module, "val")
        self.report = self.reports[0]
        self._log(Runner.of(trainer), pl_module, "val", self.reports)
        if trainer.is_global_zero:
            self.history.append({"epoch": trainer.current_epoch, **self.report["scalars"]})
            epoch = trainer.current_epoch + 1
            if self.plots and self.plot_every_n_epochs and epoch % self.plot_every_n_epochs == 0:
                self._plot_validation(trainer, self.report)

    def _plot_validation(self, trainer: pl.Trainer, report: dict[str, Any]) -> None:
        folder = training_report_dir(trainer, "val-oscr")
        path = plot_oscr_curves(report["curves"], folder / f"epoch_{trainer.current_epoch:03d}.png",
                                fpr_targets=self.fpr_targets, title=f"OSCR on validation, epoch {trainer.current_epoch}")
        log_images(Runner.of(trainer), {"val/oscr_curves": path}, step=trainer.global_step)

    # -- test --------------------------------------------------------------------------------------

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset(pl_module)

    def on_test_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(pl_module, outputs, dataloader_idx)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        reports = self._reports(trainer, pl_module, "test")
        skipped_indices, _ = self.skipped.gather()  # unique dataset indices
        self._publish(Runner.of(trainer), reports, pl_module, skipped=int(skipped_indices.numel()),
                      tested=trainer.ckpt_path or self.checkpoint)

    def evaluate(self, runner: Runner, model: nn.Module, test_set: EvaluationSet, *, passes: ScoringPasses,
                 batch_size: int = 256, num_workers: int = 0, skipped: int = 0,
                 model_input: ModelInput | None = None) -> MethodResult:
        """The test report of a built classifier (a :class:`lightning_modules.ScoringModel` of a checkpoint of
        ``train.py``) on its protocol's test set, from the run's scoring pass of (model, set): the pass every
        method shares and caches, sharded and gathered exactly (2 processes give what 1 gives). ``skipped``:
        unreadable test images left out of ``test_set`` before the pass (counted in the report); ``model_input``:
        how the test images reach the model (default: the model's own; ``evaluate.py oscr``: its datamodule's, which
        ``--data-arg resize_size=...`` changes, as it changed the test loop's transform). Returns the report (what
        ``metrics.json`` holds) with its replicates, units, headline estimates and figures."""
        with runner.on_device(model), torch.no_grad():
            outputs = passes.outputs(runner, model, test_set, batch_size=batch_size, num_workers=num_workers,
                                     model_input=model_input)
        probs, targets = torch.softmax(outputs["logits"].float(), dim=1), outputs["targets"]
        background = bool(getattr(model, "background_class", False))
        classes = getattr(model, "classes", None)
        report = open_set_report(probs, targets, fpr_targets=self.fpr_targets, background=background,
                                 conventions=self.conventions, num_classes=len(classes) if classes else None)
        self._intervals(report, probs, targets, background)
        return self._publish(runner, {0: report}, model, skipped=skipped, tested=self.checkpoint)

    def _publish(self, runner: Runner, reports: dict[int, dict[str, Any]], model: nn.Module, *, skipped: int,
                 tested: str | None) -> MethodResult:
        """Log the test reports, write them on global rank zero, and return the first's result."""
        for report in reports.values():
            report["counts"]["skipped_images"] = skipped
        self.reports, self.report = reports, reports[0]
        self._log(runner, model, "test", reports)
        background = bool(getattr(model, "background_class", False))
        payloads = {}
        if runner.is_global_zero:
            for dataloader_idx, report in reports.items():
                suffix = "oscr" if dataloader_idx == 0 else f"oscr-dataloader_{dataloader_idx}"
                directory = report_dir(runner.trainer, self.output_dir, suffix, self.checkpoint)
                if self.output_dir is not None and dataloader_idx > 0:
                    directory = directory / f"dataloader_{dataloader_idx}"
                payloads[dataloader_idx] = self._write(runner, report, directory, background=background, tested=tested)
                if dataloader_idx == 0:
                    self.report_path = directory
        report = self.report
        result = MethodResult("open_set", payloads.get(0, {"scalars": report["scalars"], "counts": report["counts"]}),
                              folder=self.report_path if runner.is_global_zero else None,
                              replicates=report.get("replicates"),
                              units=report.get("units") or json.dumps(report["counts"], sort_keys=True))
        name = checkpoint_display_name(Path(tested)) if tested else "model"
        for key, scalar in HEADLINE_SCALARS:
            if scalar in report["scalars"]:
                low, high = report.get("intervals", {}).get(scalar, (None, None))
                result.estimates.append(Estimate(name, "softmax", key, report["scalars"][scalar], low, high,
                                                 result.replicates.get(scalar), result.units))
        if self.report_path is not None and runner.is_global_zero:
            for file, title, caption in FIGURES:
                result.figure(title, self.report_path / file, caption)
        return result

    def _write(self, runner: Runner, report: dict[str, Any], directory: Path, *, background: bool,
               tested: str | None) -> dict[str, Any]:
        files: dict[str, str] = {}
        for group, (fpr, ccr, thresholds) in report["curves"].items():
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            writer.writerow(["fpr", "ccr", "threshold"])
            writer.writerows(zip(fpr.tolist(), ccr.tolist(), thresholds.double().tolist(), strict=True))
            files[f"oscr_{group}"] = str(atomic_write_text(directory / f"oscr_{group}.csv", buffer.getvalue()))
        if self.plots:
            name = Path(tested).stem if tested else "model"
            files["oscr_curves"] = str(
                plot_oscr_curves(report["curves"], directory / "oscr_curves.png", fpr_targets=self.fpr_targets,
                                 title=f"OSCR ({name})")
            )
            files["score_histograms"] = str(
                plot_score_histograms(report["scores"], directory / "score_histograms.png", bins=self.histogram_bins)
            )
            log_images(runner, {"test/oscr_curves": files["oscr_curves"],
                                 "test/score_histograms": files["score_histograms"]})
        payload = write_scalars(
            directory,
            report["scalars"],
            {
                "checkpoint": str(tested) if tested else None,
                "background_class": background,
                "fpr_targets": list(self.fpr_targets),
                "ccr_conventions": list(self.conventions),
                "counts": report["counts"],
                "files": files,
                "interval_level": self.intervals.level,
                "bootstrap": {"resamples": self.intervals.resamples, "seed": self.intervals.seed},
            },
            report.get("intervals"),
        )
        if "replicates" in report:
            write_replicates(directory, report["replicates"], self.intervals, units={"*": report["units"]})
        rank_zero_info(f"Open-set evaluation report: {directory}")
        return payload


