"""C-OOD severity AUROC as a Lightning callback (Galil, Dabbah, El-Yaniv, ICLR 2023; DESIGN.md §5.2).

:class:`SeverityAUROC` evaluates the model being trained (every ``every_n_epochs`` validation epochs) or
tested (``evaluate.py severity``: :meth:`SeverityAUROC.evaluate` in the processes ``Runner.launch`` starts; a
user's ``trainer.test`` of a training model too) on severity data (:mod:`datamodules.severity`):
the ID test images, and the OOD pool's estimation and test images.

1. collect: the engine's scoring passes (:class:`evaluation_engine.scoring.ScoringPasses`): one sharded pass over each
   set gives the logits, with the model's own input transform; a model-based κ (ODIN, MC dropout) gets its
   own pass. With ``cache_dir`` (fixed models) the passes are cached on disk; during training nothing is kept
   across epochs (the weights change).
2. score: every κ through the one κ dispatch (:func:`metrics.kappa_scores`; background-class models: softmax
   over ``K+1``, the background column dropped afterwards, as in OSCR).
3. metric: per κ, the per-class mean score on the estimation images, the severity groups
   (:func:`metrics.severity_levels`) and the per-level table (:func:`metrics.severity_table`).
4. log/plot: per κ the AUROC of each level, their mean (``<stage>/severity/<κ>/mean_auroc``) and the
   hardest level's (``<stage>/severity/<κ>/hardest_auroc``) as scalars that ``ModelCheckpoint`` can
   monitor; to W&B a line plot of AUROC against severity level with one line per evaluated epoch, and
   the table. Global rank zero writes the files: at validation ``history.csv`` and
   ``auroc_by_level_<κ>.png`` (one history across a resumed run: it is part of the checkpoint); at test the
   tables of the paper (``<model>_<κ>_n<levels>.csv``), ``levels_<model>_<κ>.csv`` (the classes of each
   level and whether the model saw them in training as negatives), ``severity.csv`` and
   ``severity_auroc.png``.
5. intervals (at test): every level's AUROC, the mean over the levels and the hardest level's AUROC get a
   percentile-bootstrap interval (:class:`evaluation_engine.outputs.Intervals`) whose resampling unit is the class:
   a level is a group of G classes, and a benchmark of other classes would be another draw of that group.
   Each resample draws the pool's classes with replacement, keyed by their index in the pool (every test image
   of a drawn class counts as often as its class is drawn; a class has one weight in every level and every
   (model, κ) row of the pool, so rows are compared on the same resamples), and the ID test images with
   replacement (one ID resample for all levels and κ, so the mean over levels is computed per resample).
   Images of one class are not independent draws, and an image-level interval would be too narrow. A level
   whose classes all draw 0 in a resample is counted (``empty resamples``) and left out there. Columns
   ``ood-auroc low``/``ood-auroc high`` after the paper's; ``summary.csv`` (mean and hardest level with
   intervals) and ``replicates.pt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor

from datamodules.catalog import severity_factory
from datamodules.evaluation import EvaluationSet
from datamodules.severity import SEVERITY_SETS, SeverityData
from evaluation_engine.intervals import Intervals, detection_columns, interval_columns, with_bounds
from evaluation_engine.options import DetectorOptions, check_fit_options
from evaluation_engine.outputs import (
    default_report_dir,
    log_images,
    log_table,
    metric_key,
    slug,
    training_report_dir,
    wandb_loggers,
    write_csv,
    write_replicates,
    write_tables,
)
from evaluation_engine.plots import plot_severity
from evaluation_engine.results import Estimate, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    ScoringPasses,
    check_detectors,
    command_fit_set,
    default_fit_set,
    model_input_of,
    overlap_columns,
    write_fitted,
)
from lightning_modules.checkpoint import check_classes
from metrics import (
    TABLE_COLUMNS,
    Detector,
    check_kappa,
    class_mean_scores,
    severity_levels,
    severity_table,
)
from metrics.auroc import weighted_auroc
from metrics.resampling import cluster_weights, resample_weights
from metrics.severity import PAPER_LEVELS, resolve_num_levels
from openset_common.artefacts import digest
from openset_common.labels import known_columns

LEVEL_COLUMNS = ("severity level", "level score", "class index", "class", "class score", "seen in training")
HISTORY_COLUMNS = ("epoch", "confidence function", "severity level", "ood-auroc")
# the paper's columns, then the interval of the level's AUROC (classes within the level + ID images resampled)
INTERVAL_TABLE_COLUMNS = (*TABLE_COLUMNS, *interval_columns("ood-auroc"), "empty resamples", *detection_columns())
SUMMARY_COLUMNS = ("model name", "confidence function", "mean auroc", *interval_columns("mean auroc"),
                   "hardest auroc", *interval_columns("hardest auroc"), "levels", "empty resamples")
CLASS_UNIT = "the pool's classes (keyed by pool index) + ID images"


def model_name(pl_module: pl.LightningModule) -> str:
    return getattr(pl_module, "display_name", type(pl_module).__name__)


def is_ensemble(pl_module: pl.LightningModule) -> bool:
    return bool(getattr(pl_module, "ensemble", False))


class SeverityAUROC(pl.Callback):
    """Severity AUROC during training and at test (see the module docstring).

    Args:
        data: the ID and OOD data; ``None`` asks the training datamodule (``severity_data(**data_args)``:
            for a protocol, its known classes as ID and its unknown classes as the pool).
        data_args: arguments of that ``severity_data`` call (e.g. ``{"estimation": 150}``, an ImageNet-21k
            ``pool_file``).
        kappas: κ names (:func:`metrics.resolve_detector`) or detector classes.
        kappa_args: per κ name, its keyword arguments (e.g. ``{"odin": {"temperature": 1000}}``).
        every_n_epochs: evaluate after every n-th validation epoch (0: never during training).
        on_test: evaluate at a user's ``trainer.test`` of the model.
        num_levels: severity levels (default: the paper's 11, fewer with a warning where the data have fewer
            windows ``M - G + 1``; more than that is refused).
        batch_size, num_workers: of the callback's own passes (default: the severity data's).
        cache_dir: cache the passes on disk (for fixed models; useless while weights change).
        output_dir: where files go (default: next to the checkpoint at test, the checkpoint folder's
            ``severity-val/`` during training).
        plots: write and log figures.
        passes: the run's scoring passes (shared with other evaluations of the run); default: its own.
        intervals: level, resamples and seed of the intervals at test (default :class:`Intervals`' defaults).
        fit_set: the in-distribution training images fitted detectors (Mahalanobis, KNN, ViM, ...) fit on;
            default: the training datamodule's training split (its known classes), else the data's own.
        fit: per κ name, the cap of its fit set (``{"fraction": 0.01}``, ``{"per_class": 100}``, ``seed``).
        train_fit: the cap during training (``every_n_epochs``): the detectors are refitted at every evaluation
            epoch on the weights of that epoch, one more pass over ``per_class`` images of each class (default
            100) -- the cost of a fitted κ during training.
        allow_fit_overlap: run even when the fit set holds images of the severity data (the ID test images, the
            pool's): refused otherwise, before any pass (:meth:`ScoringPasses.check_fit_overlap`); allowed, every
            table of a fitted κ says so in its ``fit overlap`` column.
    """

    def __init__(
        self,
        data: SeverityData | None = None,
        data_args: dict[str, Any] | None = None,
        kappas: Sequence[str | type[Detector]] = ("softmax",),
        kappa_args: dict[str, dict[str, Any]] | None = None,
        every_n_epochs: int = 1,
        on_test: bool = True,
        num_levels: int | None = None,
        batch_size: int | None = None,
        num_workers: int | None = None,
        cache_dir: str | None = None,
        output_dir: str | None = None,
        plots: bool = True,
        passes: ScoringPasses | None = None,
        intervals: Intervals | None = None,
        fit_set: EvaluationSet | None = None,
        fit: dict[str, dict[str, Any]] | None = None,
        train_fit: dict[str, Any] | None = None,
        allow_fit_overlap: bool = False,
    ) -> None:
        super().__init__()
        self.allow_fit_overlap = allow_fit_overlap
        self.intervals = Intervals.of(intervals)
        # the κ, their arguments (resolved parameters: validated now, part of the cache keys) and fit caps, checked
        # where every command checks them
        detectors = DetectorOptions(kappa=list(kappas), kappa_args=kappa_args, fit=fit)
        self.kappas, self.kappa_args, self.kappa_parameters = detectors.detector_classes, detectors.kappa_args, detectors.kappa_parameters
        self.fit_set, self.fit = fit_set, detectors.fit
        self.train_fit = check_fit_options("train_fit", dict(train_fit if train_fit is not None else {"per_class": 100}))
        self.detectors: dict[str, Any] = {}  # κ name -> the fitted detector of the last evaluation
        if every_n_epochs < 0:
            raise ValueError(f"every_n_epochs must be >= 0, got {every_n_epochs}")
        if num_levels is not None and num_levels < 2:
            raise ValueError(f"num_levels must be at least 2, got {num_levels}")
        if data is not None and data_args:
            raise ValueError("give either `data` or `data_args` (arguments of the training datamodule's severity_data)")
        self.data = data
        self.data_args = dict(data_args or {})
        self.every_n_epochs = every_n_epochs
        self.on_test = on_test
        self.num_levels = num_levels
        self.levels = num_levels or PAPER_LEVELS  # the data's number: set by check()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.passes = passes if passes is not None else ScoringPasses(cache_dir)
        self._pass_costs: dict[tuple[str, str], list[tuple[float | None, str | None]]] = {}  # (set, κ) -> passes
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.plots = plots
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.summary: list[dict[str, Any]] = []
        self.replicates: dict[str, Tensor] = {}
        self.units = ""  # the identity of the units the replicates resampled (the ID test images, the pool)
        self._weights: Tensor | None = None  # the bootstrap's ID resamples of the evaluation running
        self._class_weights: Tensor | None = None  # and its pool-class resamples
        self.history: list[dict[str, Any]] = []  # (epoch, κ, level, AUROC) of every validation evaluation
        self.report_path: Path | None = None
        self._prepared_for: int | None = None  # the model prepare() checked

    @property
    def model_passes(self) -> int:
        """Passes actually run (neither kept from earlier in the run nor in the cache)."""
        return self.passes.passes

    # -- hooks -------------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.prepare(pl_module, getattr(trainer, "datamodule", None))

    def prepare(self, pl_module: pl.LightningModule, datamodule: Any = None) -> None:
        """The data (``data``, else the training ``datamodule``'s severity data), listed, the fit set, and every
        check of :meth:`check`: before any pass."""
        if self.data is None:
            factory = severity_factory(datamodule) if datamodule is not None else None
            if factory is None:
                raise ValueError(
                    "SeverityAUROC needs `data` (a datamodules.severity.SeverityData), or a training "
                    "datamodule with severity data (an entry of datamodules.catalog, or a severity_data() "
                    f"method); got {type(datamodule).__name__}"
                )
            self.data = factory(**self.data_args)
        self.data.setup()
        if self.fit_set is None and any(k.fit_data for k in self.kappas):
            self.fit_set = default_fit_set(datamodule, self.data) or \
                command_fit_set(pl_module, None, self.kappas)  # a checkpoint brings its own training split
        self.check(pl_module)
        self._prepared_for = id(pl_module)

    def check(self, pl_module: pl.LightningModule) -> None:
        """Refuse, before any pass, a model this benchmark cannot score: a κ it cannot serve, other classes."""
        background = bool(getattr(pl_module, "background_class", False))
        for kappa in self.kappas:
            check_kappa(kappa, model=model_name(pl_module), ensemble=is_ensemble(pl_module), background=background)
        classes = getattr(pl_module, "classes", None)
        check_classes(classes, self.data.classes, model=model_name(pl_module),
                      data=f"the severity data's ID classes ({type(self.data).__name__})")
        self.levels = resolve_num_levels(self.num_levels, len(self.data.ood_classes), self.data.group_size,
                                         data=type(self.data).__name__)
        check_detectors(self.kappas, pl_module, self.fit_set)
        if any(k.fit_data for k in self.kappas):  # no detector is fitted on the data it is tested on
            self.passes.check_fit_overlap(self.fit_set, self.data, allow=self.allow_fit_overlap)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.every_n_epochs == 0 or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        self.evaluate(Runner.of(trainer), pl_module)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_test:
            self.evaluate(Runner.of(trainer), pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The validation history, saved in the training checkpoint: a resumed run continues it."""
        return {"history": list(self.history)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))

    # -- collect -----------------------------------------------------------------------------------

    def _check_width(self, runner: Runner, pl_module: pl.LightningModule, background: bool) -> None:
        """Refuse a model whose output width is not the number of ID classes (+1 background), from one image,
        before any pass."""
        image = model_input_of(runner, pl_module).transform()(self.data["id_test"].dataset[0].image)
        width = pl_module(image[None].to(pl_module.device)).shape[-1]
        expected = self.data.group_size + int(background)
        if width != expected:
            raise ValueError(
                f"the model outputs {width} logits but the severity data has {self.data.group_size} ID classes"
                + (" plus the background class" if background else "")
                + f" ({expected} expected): a model with another head (e.g. 21k or 1001 classes) cannot be scored "
                "on these ID classes"
            )

    def _outputs(self, runner: Runner, pl_module: pl.LightningModule) -> dict[str, dict[str, Tensor]]:
        """Per set, the pass (logits, targets[, features]) and the model-based κ scores."""
        features = any(k.reads_features for k in self.kappas)
        batch_size = self.batch_size or self.data.batch_size
        num_workers = self.num_workers if self.num_workers is not None else self.data.num_workers
        background = bool(getattr(pl_module, "background_class", False))
        outputs: dict[str, dict[str, Tensor]] = {}
        for name in SEVERITY_SETS:
            evaluation_set = self.data[name]
            set_outputs = dict(self.passes.outputs(runner, pl_module, evaluation_set, features=features,
                                             batch_size=batch_size, num_workers=num_workers))
            shared = self.passes.pass_cost()
            for kappa in self.kappas:  # what each κ's scores of the set cost: the shared pass (and its own)
                self._pass_costs[(name, kappa.name)] = [shared]
                if kappa.kind == "model":  # its own pass (ODIN's perturbation, AdaSCALE's perturbed features)
                    set_outputs.update(self.passes.image_outputs(
                        runner, pl_module, evaluation_set, kappa, self.kappa_parameters[kappa.name],
                        background=background, batch_size=batch_size, num_workers=num_workers))
                    self._pass_costs[(name, kappa.name)] = ([] if kappa.inputs == {"model"} else [shared]) + \
                        [self.passes.pass_cost()]
            outputs[name] = set_outputs
        return outputs

    def _fitted(self, runner: Runner, pl_module: pl.LightningModule, *, stage: str) -> dict[str, Any]:
        """The fitted detectors of the κ that need fitting, on the fit set (capped by ``train_fit`` during
        training)."""
        batch_size = self.batch_size or self.data.batch_size
        num_workers = self.num_workers if self.num_workers is not None else self.data.num_workers
        return {kappa.name: self.passes.fitted_detector(
            runner, pl_module, kappa, self.kappa_parameters[kappa.name], self.fit_set,
            fit=self.train_fit if stage == "val" else self.fit.get(kappa.name), batch_size=batch_size,
            num_workers=num_workers) for kappa in self.kappas if kappa.needs_fit}

    # -- score, metric -----------------------------------------------------------------------------

    def evaluate(self, runner: Runner, pl_module: pl.LightningModule) -> MethodResult:
        """Run the benchmark on the current weights, in ``runner``'s processes (launched, or the Trainer's during
        training: ``runner.stage``); log, and write files on global rank zero. Returns the tables (per κ), and at
        test their replicates, units, headline estimates and figure."""
        stage = runner.stage
        if self._prepared_for != id(pl_module):
            self.prepare(pl_module, runner.datamodule)
        data = self.data
        background = bool(getattr(pl_module, "background_class", False))
        name = model_name(pl_module)
        if stage == "val":
            self.passes.clear()  # the weights changed since the last evaluation
        # ODIN needs input gradients even inside Lightning's inference-mode evaluation loops
        with runner.on_device(pl_module), torch.inference_mode(False), torch.no_grad():
            self._check_width(runner, pl_module, background)
            outputs = self._outputs(runner, pl_module)
            if any(k.needs_head for k in self.kappas):
                self.passes.check_head(pl_module, outputs["id_test"])
            self.detectors = self._fitted(runner, pl_module, stage=stage)
        id_probs = torch.softmax(outputs["id_test"]["logits"].float(), dim=-1)
        if id_probs.ndim == 3:  # an ensemble predicts with the mean of its members' softmax
            id_probs = id_probs.mean(dim=1)
        id_correct = known_columns(id_probs, background).argmax(dim=1) == outputs["id_test"]["targets"]
        estimation_classes = outputs["ood_estimation"]["targets"]
        test_classes = outputs["ood_test"]["targets"]
        tables: dict[str, list[dict[str, Any]]] = {}
        levels: dict[str, list[dict[str, Any]]] = {}
        self._weights = None  # drawn once below, shared by every κ
        for kappa in self.kappas:
            scores = {split: self.passes.score_outputs(
                pl_module, kappa, self.kappa_parameters[kappa.name], outputs[split],
                passes=self._pass_costs.get((split, kappa.name), []), background=background,
                detector=self.detectors.get(kappa.name), data=split) for split in SEVERITY_SETS}
            class_scores = class_mean_scores(scores["ood_estimation"], estimation_classes, len(data.ood_classes))
            groups, level_scores = severity_levels(class_scores, data.group_size, self.levels)
            tables[kappa.name] = severity_table(
                id_scores=scores["id_test"], id_correct=id_correct, ood_scores=scores["ood_test"],
                ood_classes=test_classes, groups=groups, model_name=name, kappa_name=kappa.name,
            )
            note = self.passes.fit_notes(self.detectors.get(kappa.name), data)  # an allowed overlap of its fit set
            if note:
                for row in tables[kappa.name]:
                    row[FIT_OVERLAP] = note
            if stage == "test":
                self._intervals(kappa.name, tables[kappa.name], scores, test_classes, groups)
            levels[kappa.name] = [
                {"severity level": level, "level score": float(level_scores[level]), "class index": int(c),
                 "class": data.ood_class_name(int(c)), "class score": float(class_scores[c]),
                 "seen in training": data.ood_class_role(int(c)),
                 **({FIT_OVERLAP: tables[kappa.name][0][FIT_OVERLAP]} if FIT_OVERLAP in tables[kappa.name][0] else {})}
                for level, group in enumerate(groups) for c in group
            ]
        self.tables = tables
        self._log(runner, pl_module, tables, stage=stage)
        if runner.is_global_zero:
            if stage == "test":
                self.report_path = self._write_report(runner, tables, levels, name)
            else:
                self._write_history(runner, tables)
        result = MethodResult("severity", tables, folder=self.report_path if stage == "test" else None,
                              replicates=self.replicates if stage == "test" else None, units=self.units)
        if stage == "test":
            result.estimates = severity_estimates(name, result, self.intervals)
            if self.report_path is not None:
                result.figure(f"C-OOD severity: {name}", self.report_path / "severity_auroc.png")
        return result

    def _intervals(self, kappa_name: str, rows: list[dict[str, Any]], scores: dict[str, Tensor],
                   test_classes: Tensor, groups: Tensor) -> None:
        """Per level the class-resampled bootstrap interval of its AUROC; the mean and hardest level's.

        One resample draws the ID test images (keyed by their index in the ID test set) and the pool's classes
        (keyed by their index in the pool: ``cluster_weights(..., num_units=M)``, one draw of the whole pool),
        once for every level, κ and model: class ``c`` has the same weight in every level that holds it and in
        every row that is measured on this pool, so levels built of other classes by two (model, κ) rows are
        compared on the same resamples. The levels keep their classes (they are not rebuilt per resample). A
        level whose classes all draw 0 in a resample has no AUROC there (NaN); such resamples are counted
        (``empty resamples``) and left out of that level's interval and of the mean's (the mean is taken in the
        resamples in which every level has a value)."""
        options = self.intervals
        id_scores = scores["id_test"]
        if self._weights is None:  # once per evaluation, for every κ
            self._weights = resample_weights(id_scores.numel(), options.resamples, options.seed, stratum=0)
            self._class_weights = cluster_weights(test_classes, options.resamples, options.seed, stratum=1,
                                                  num_units=len(self.data.ood_classes))
        id_weights, class_weights = self._weights, self._class_weights
        per_level = []
        for level, (row, group) in enumerate(zip(rows, groups, strict=True)):
            members = torch.isin(test_classes, group.to(test_classes.device))
            replicates = weighted_auroc(id_scores, scores["ood_test"][members], id_weights,
                                        class_weights[:, members.cpu()])
            with_bounds(row, "ood-auroc", options.bounds(replicates))
            # the field's detector metrics beside the paper's columns, on the same resamples (classes + ID images)
            detection, detection_replicates = options.detection(
                id_scores, scores["ood_test"][members], id_weights=id_weights, ood_weights=class_weights[:, members.cpu()])
            row.update(detection)
            self.replicates.update({f"{kappa_name}/level_{level:02d}/{column}": values
                                    for column, values in detection_replicates.items()})
            row["empty resamples"] = int(torch.isnan(replicates).sum())
            self.replicates[f"{kappa_name}/level_{level:02d}"] = replicates
            per_level.append(replicates)
        mean = torch.stack(per_level).mean(dim=0)  # NaN where a level is empty: left out of the interval
        self.replicates[f"{kappa_name}/mean"], self.replicates[f"{kappa_name}/hardest"] = mean, per_level[-1]
        aurocs = [row["ood-auroc"] for row in rows]
        summary = {"model name": rows[0]["model name"], "confidence function": kappa_name,
                   "mean auroc": sum(aurocs) / len(aurocs), "hardest auroc": aurocs[-1], "levels": len(rows),
                   "empty resamples": int(torch.isnan(mean).sum()),
                   **({FIT_OVERLAP: rows[0][FIT_OVERLAP]} if FIT_OVERLAP in rows[0] else {})}
        with_bounds(summary, "mean auroc", options.bounds(mean))
        with_bounds(summary, "hardest auroc", options.bounds(per_level[-1]))
        self.summary = [r for r in self.summary if r["confidence function"] != kappa_name] + [summary]

    # -- log, plot ---------------------------------------------------------------------------------

    def _log(self, runner: Runner, pl_module: pl.LightningModule, tables: dict[str, list[dict]], *, stage: str) -> None:
        scalars: dict[str, float] = {}
        for name, rows in tables.items():
            aurocs = [row["ood-auroc"] for row in rows]
            scalars.update({metric_key(stage, "severity", name, f"auroc_level_{row['severity level']:02d}"):
                            row["ood-auroc"] for row in rows})
            scalars[metric_key(stage, "severity", name, "mean_auroc")] = sum(aurocs) / len(aurocs)
            scalars[metric_key(stage, "severity", name, "hardest_auroc")] = aurocs[-1]
        runner.log_metrics(scalars, pl_module)  # equal on every rank (computed from gathered data)
        if stage == "val" and runner.is_global_zero:
            self.history += [{"epoch": runner.epoch, "confidence function": name,
                              "severity level": row["severity level"], "ood-auroc": row["ood-auroc"],
                              **({FIT_OVERLAP: row[FIT_OVERLAP]} if FIT_OVERLAP in row else {})}
                             for name, rows in tables.items() for row in rows]
        all_rows = [row for rows in tables.values() for row in rows]
        log_table(runner, metric_key(stage, "severity", "table"), all_rows, overlap_columns(TABLE_COLUMNS, all_rows))
        if stage != "val":
            return
        for logger in wandb_loggers(runner):
            import wandb

            for name in tables:
                runs = self._runs(name)
                chart = wandb.plot.line_series(xs=list(range(self.levels)),
                                               ys=[[r["ood-auroc"] for r in rows] for rows in runs.values()],
                                               keys=list(runs), title=f"OOD AUROC by severity level ({name})",
                                               xname="severity level")
                logger.experiment.log({metric_key("val", "severity", name, "auroc_by_level"): chart})

    def _runs(self, kappa_name: str) -> dict[str, list[dict[str, Any]]]:
        """``"epoch <e>"`` -> the levels of that epoch, for one κ, from the history."""
        epochs = sorted({h["epoch"] for h in self.history if h["confidence function"] == kappa_name})
        return {f"epoch {e}": [h for h in self.history if h["confidence function"] == kappa_name and h["epoch"] == e]
                for e in epochs}

    def _write_history(self, runner: Runner, tables: dict[str, list[dict]]) -> None:
        out = self.output_dir / "val" if self.output_dir is not None else training_report_dir(runner.trainer, "severity-val")
        write_csv(out / "history.csv", self.history, overlap_columns(HISTORY_COLUMNS, self.history))
        if self.plots:
            for name in tables:
                plot_severity(self._runs(name), out / f"auroc_by_level_{slug(name)}.png",
                              title=f"C-OOD severity by epoch ({name})")

    def _write_report(
        self, runner: Runner, tables: dict[str, list[dict]], levels: dict[str, list[dict]], name: str
    ) -> Path:
        out = self.output_dir if self.output_dir is not None else default_report_dir(runner.trainer, "severity")
        for kappa_name, rows in tables.items():
            stem = slug(f"{name}_{kappa_name}")
            write_csv(out / f"{stem}_n{self.levels}.csv", rows, overlap_columns(INTERVAL_TABLE_COLUMNS, rows))
            write_csv(out / f"levels_{stem}.csv", levels[kappa_name], overlap_columns(LEVEL_COLUMNS, levels[kappa_name]))
        all_rows = [row for rows in tables.values() for row in rows]
        write_csv(out / "severity.csv", all_rows, overlap_columns(INTERVAL_TABLE_COLUMNS, all_rows))
        notes = list(dict.fromkeys(row[FIT_OVERLAP] for row in self.summary if row.get(FIT_OVERLAP)))
        write_tables(out, "summary", self.summary, overlap_columns(SUMMARY_COLUMNS, self.summary), preamble=(
            f"Mean OOD AUROC over the {self.levels} severity levels and the hardest level's, with "
            f"{self.intervals.describe()}; resampling unit: {CLASS_UNIT}."
            + "".join(f" Warning: {note}: its detectors scored images they were fitted on." for note in notes)))
        # the units the replicates resample: the ID test images and the pool's classes (their identity, for the card)
        self.units = digest({"id_test": self.data["id_test"].fingerprint(),
                             "ood_test": self.data["ood_test"].fingerprint()})
        write_replicates(out, self.replicates, self.intervals, units={"*": self.units})
        write_fitted(out, self.passes, [d for d in self.detectors.values()])
        if self.plots:
            figure = plot_severity({f"{name} / {kappa_name}": rows for kappa_name, rows in tables.items()},
                                   out / "severity_auroc.png", title=f"C-OOD severity: {name}")
            log_images(runner, {metric_key("test", "severity", "auroc"): figure})
        rank_zero_info(f"Severity tables and figure: {out}")
        return out


def severity_estimates(model: str, result: MethodResult, intervals: Intervals) -> list[Estimate]:
    """The leaderboard's numbers of one model's severity tables: per κ the mean AUROC over the levels (its
    interval from the replicates of the mean) and the hardest level's AUROC."""
    estimates = []
    for kappa, rows in result.items():
        aurocs = [r["ood-auroc"] for r in rows]
        mean, hardest = result.replicates.get(f"{kappa}/mean"), result.replicates.get(f"{kappa}/hardest")
        bounds = intervals.bounds(mean) if mean is not None else (None, None)
        note = rows[0].get(FIT_OVERLAP, "")  # every level of a (model, κ) carries its detector's note
        estimates += [Estimate(model, kappa, "severity_mean", sum(aurocs) / len(aurocs), *bounds, mean, result.units,
                               fit_overlap=note),
                      Estimate(model, kappa, "severity_hardest", aurocs[-1], rows[-1].get("ood-auroc low"),
                               rows[-1].get("ood-auroc high"), hardest, result.units, fit_overlap=note)]
    return estimates
