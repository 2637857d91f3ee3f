"""Mukhoti et al.'s generated benchmarks (DESIGN.md §5.3): writing generated sets, sample grids during
training, and detectors evaluated on the generated sets.

:class:`GeneratedSetWriter` gathers what a generator's ``predict_step`` returns on every process (each
image once, by dataset index, whatever the padding of the distributed sampler; integer fields exactly, from
the batch), and global rank zero writes the set (:mod:`datamodules.generated`) into a temporary folder that
is renamed into place when complete. :class:`GenerationModeSetter` runs the generator in the chosen
generation mode (``eval`` or ``pix2pix``, :mod:`lightning_modules.generated.modes`). :class:`SampleGrids`
logs image grids from the generator's fixed inputs every N steps.

:meth:`GeneratedBenchmark.evaluate` scores any models (:class:`ScoringModel` s: timm or torchvision classifiers,
checkpoints, ensembles) in the processes of an :class:`evaluation_engine.runner.Runner`: collect -> score ->
metric -> log/write.

- Detectors, per κ: near-OOD AUROC (ID test vs each generated near-OOD set) and the same for every real OOD
  set, side by side; on each shifted set and each real shifted set the accuracy against the (source) labels,
  the expected calibration error (torchmetrics, 15 bins, L1) and the AUROC of ID test vs shifted; on the ID
  test set the accuracy and ECE, the baseline a shift result is read against. With the label filter, each
  shifted set also on its label-keeping images only (``<set> (label kept)``).
- What the sets are (``describe_sets``, model-independent: once per run): the ensemble's mean MI on each
  set (generated, ID test, real OOD), the mean LPIPS to the nearest of ``reference`` ID test images (a
  seeded class-balanced choice; generated and real OOD), for a shifted set the fraction whose ensemble
  prediction keeps the source label and the fraction that meets Mukhoti et al.'s label condition (the
  ensemble's prediction on the shifted image equals that on its source), and the generation mode. Comparing
  a regularised set with the unregularised one (λ = 0, same budget) measures what each regulariser did.
- Rank agreement (Kendall's τ of the detectors' AUROC): each generated near-OOD set against each real OOD set,
  each generated shifted set against each real shifted set.
- Independence: a detector or describer that shares a member with the ensemble a set's generator was
  trained against is flagged in every table (``shares generator ensemble``, ``describer shares generator
  ensemble``, ``detectors sharing generator ensemble``): its numbers report the optimisation target back.
- Quality: an ensemble whose members are near chance says nothing with its MI or its predictions. The
  describing ensemble is held to its quality bar before anything runs (``train.py ensemble``'s record of its
  members' ID-test accuracy, else measured; :mod:`lightning_modules.ensemble_quality`), and so is the ensemble
  that describes the images ``generate`` writes; a weak one is refused unless ``allow_weak_ensemble``, and then
  every row it shapes says so in ``weak ensemble``, as does every row of a set whose generator was trained
  against a weak ensemble (``info.json``'s ``training_ensemble_quality``).

Intervals (:class:`evaluation_engine.outputs.Intervals`): the AUROC gets :meth:`Intervals.auroc`'s interval (the images
of the ID test set and of the set are independent draws: the resampling unit is the image, ID and OOD
separately), accuracy and ECE a percentile bootstrap over the set's images; columns ``<metric> low`` /
``<metric> high``. The ECE is torchmetrics' binned plug-in estimate (15 bins), the number the field reports;
it is biased upwards (a calibrated model's expected plug-in ECE is about 0.08 at 200 images and 0.04 at 1,000,
``benchmarks/interval_coverage.py``), and its interval is the percentile bootstrap *of that estimator*: it does
not cover the population ECE of a nearly calibrated model, and the tables say so (:data:`ECE_NOTE`). The
bootstrap replicates of every number (``replicates.pt``) use the same resamples for every detector on a set
(keyed by image index), so the report card's differences between detectors are paired.

Passes are sharded over the devices (every rank joins every gather). Global rank zero writes
``detectors.csv`` / ``.md``, ``sets.csv`` / ``.md``, ``agreement.csv`` / ``.md`` and a grid of each set; the
same go to W&B.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from PIL import Image
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import Subset
from torchmetrics.functional.classification import multiclass_calibration_error

from callbacks.severity import model_name
from datamodules.batch import Batch
from datamodules.evaluation import EvaluationSet
from datamodules.generated import (
    MANIFEST_COLUMNS,
    GeneratedBenchmarkData,
)
from datamodules.images import BALANCED_RULE, balanced_choice
from datamodules.transforms import ModelInput, to_float_tensor
from evaluation_engine.intervals import (
    DETECTION_NOTE,
    Intervals,
    detection_columns,
    interval_columns,
    with_bounds,
)
from evaluation_engine.options import DetectorOptions
from evaluation_engine.outputs import (
    log_images,
    log_table,
    metric_key,
    slug,
    training_report_dir,
    write_csv,
    write_markdown,
    write_replicates,
    write_tables,
)
from evaluation_engine.plots import save_image_grid
from evaluation_engine.results import MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    ScoringPasses,
    check_detectors,
    detector_pairs,
    overlap_columns,
    write_fitted,
)
from lightning_modules.checkpoint import (
    check_classes,
    class_indices,
)
from lightning_modules.ensemble_quality import EnsembleQuality
from lightning_modules.generated.modes import check_generation_mode, generation_mode
from lightning_modules.nets.ensemble import member_paths
from metrics import (
    Detector,
    IndexedPredictions,
    auroc,
    mutual_information_from_logits,
    rank_agreement,
)
from metrics.auroc import bootstrap_auroc
from metrics.calibration import bootstrap_accuracy_ece
from openset_common.artefacts import atomic_write_text, staging_folder, terminate_as_exit
from openset_common.labels import known_columns

ECE_NOTE = ("ECE: torchmetrics' binned plug-in estimate (15 bins), biased upwards at small n; its interval is the "
            "bootstrap interval of that estimator, not of the population ECE (it does not reach 0 for a calibrated "
            "model; the bias is measured in benchmarks/RESULTS.md).")
PER_IMAGE = ("images", "source_index", "source_label", "seed", "ensemble_prediction", "mi", "lpips")


def staging_prefix(output_dir: Path) -> str:
    """The name prefix of the staging folders of a set (``.<set name>.staging-``), next to the set."""
    return f".{output_dir.name}.staging-"


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
        values = {**outputs, **exact_integers(batch, outputs)}
        for key in PER_IMAGE:
            self.stores[key].update(values[key], outputs["targets"], outputs["indices"])

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        gathered = {key: self.stores[key].gather()[0].cpu() for key in PER_IMAGE}  # every rank joins
        self.count = gathered["images"].shape[0]
        if trainer.is_global_zero:
            self._write(gathered)

    def _write(self, gathered: dict[str, torch.Tensor]) -> None:
        with terminate_as_exit():  # `kill <pid>` while writing: the staging folder still goes
            self._write_staged(to_uint8(gathered["images"]), gathered)

    def _write_staged(self, images: torch.Tensor, gathered: dict[str, torch.Tensor]) -> None:
        # built in a staging folder of the set's name (staging_prefix) with the permissions of any new folder,
        # renamed into place when complete; removed on any failure or interrupt, and by a later run when the
        # process was killed outright
        staging = staging_folder(self.output_dir.parent, staging_prefix(self.output_dir))
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
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        rank_zero_info(f"Generated set of {len(rows)} images: {self.output_dir}")


INTEGER_OUTPUTS = ("seed", "source_index", "source_label", "ensemble_prediction")
FLOAT_EXACT = 2**24  # float32 holds every integer up to this, and not every one above


def exact_integers(batch: Any, outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """The integer manifest fields of a predicted batch as int64, exactly.

    The seeds of a near-OOD batch (``(seeds, indices)`` of :class:`datamodules.generated.LatentSeeds`) and the
    source indices and labels of a shift batch (a :class:`datamodules.batch.Batch`) are taken from the batch
    itself, never from a float copy in the outputs (float32 rounds seeds above 2**24: 17000051 ... 17000054 all
    read 17000052). Other integer fields come from the outputs: integer tensors as they are, float tensors only
    when every value is an integer float32 represents exactly.

    Raises:
        ValueError: an output field whose float values are not exact integers (named with the value).
    """
    columns: dict[str, Tensor] = {}
    if isinstance(batch, Batch):
        columns["source_index"], columns["source_label"] = batch.indices.long(), batch.targets.long()
    elif (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, Tensor) for t in batch)
          and not batch[0].is_floating_point()):
        columns["seed"] = batch[0].long()
    for key in INTEGER_OUTPUTS:
        if key in columns or key not in outputs:
            continue
        value = outputs[key]
        if value.is_floating_point():
            bad = (value != value.round()) | (value.abs() > FLOAT_EXACT)
            if bool(bad.any()):
                raise ValueError(f"the generator's {key} output {float(value[bad][0])!r} is not an exact integer "
                                 "(return integer tensors for integer fields)")
        columns[key] = value.long()
    return columns


def _number(value: torch.Tensor) -> str:
    return "" if not np.isfinite(float(value)) else f"{float(value):.6g}"


class GenerationModeSetter(pl.Callback):
    """Runs a generator's ``generator`` network in a generation mode (:mod:`lightning_modules.generated.modes`)
    during ``trainer.predict``, in every process.

    In ``"pix2pix"`` mode the random numbers of each batch (its dropout masks) come from ``(seed, first
    dataset index of the batch)``, so a set is reproducible for a given batch size and process count (batch
    statistics make an image depend on its batch in any case); the process's random state is restored after.
    """

    def __init__(self, mode: str, seed: int = 0) -> None:
        super().__init__()
        self.mode, self.seed = check_generation_mode(mode), seed
        self._stack: ExitStack | None = None

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stack = ExitStack()
        if self.mode == "pix2pix":
            self._stack.enter_context(torch.random.fork_rng(devices=_cuda_devices(pl_module)))
        self._stack.enter_context(generation_mode(pl_module.generator, self.mode))

    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        if self.mode == "pix2pix":
            indices = batch.indices if isinstance(batch, Batch) else batch[1]
            first = int(indices[0]) if len(indices) else 0
            torch.manual_seed(mode_seed(self.seed, first))

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.on_predict_end(trainer, pl_module)


def mode_seed(seed: int, first_index: int) -> int:
    """The seed of a ``pix2pix``-mode batch whose first image has dataset index ``first_index``."""
    return (int(seed) * 1_000_003 + int(first_index)) % 2**63


def _cuda_devices(module: pl.LightningModule) -> list[int]:
    return [module.device.index or 0] if module.device.type == "cuda" else []


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
        folder = Path(self.output_dir) / "samples" if self.output_dir else training_report_dir(trainer, "samples")
        path = save_image_grid(pl_module.fixed_samples().cpu(), folder / f"step_{step:06d}.png", columns=8)
        self.written.append(path)
        log_images(Runner.of(trainer), {"samples": path}, step=trainer.global_step)


DETECTOR_COLUMNS = ("model", "confidence function", "set", "kind", "auroc", "accuracy", "ece", "images", "weak ensemble",
                    "shares generator ensemble", *interval_columns("auroc", "accuracy", "ece"), *detection_columns())
SET_COLUMNS = ("set", "kind", "images", "mean MI", "mean LPIPS to nearest ID", "mean LPIPS to source",
               "keeps source label", "keeps ensemble label", "lambda_perceptual", "lambda_semantic", "mode",
               "generator", "describer shares generator ensemble", "weak ensemble")
AGREEMENT_COLUMNS = ("generated", "real", "detectors", "kendall tau", "p-value", "detectors sharing generator ensemble",
                     "weak ensemble")
LABEL_KEPT = " (label kept)"  # the suffix of a shifted set's rows restricted to the label-keeping images


class GeneratedBenchmark(pl.Callback):
    """See the module docstring.

    Args:
        data: the sets (:class:`datamodules.generated.GeneratedBenchmarkData`).
        kappas: κ names or objects; each is paired with the models it applies to (ensemble κ with ensembles,
            the others with single models, :func:`metrics.pairs_with`); a κ that pairs with no model, or a
            model with no κ, is refused.
        models: the detectors' models (default: those :meth:`evaluate` is given; a user's ``trainer.test``: its module).
        kappa_args: per κ name, its keyword arguments (e.g. ``{"odin": {"temperature": 1000}}``).
        describer: the model whose MI and predictions describe the sets (a deep ensemble); ``None`` skips them.
        describer_quality: the describer's members' accuracies and bar (checked by the caller); a weak one is
            named in the ``weak ensemble`` column of every row it shapes.
        perceptual: the LPIPS distance that describes the sets; ``None`` skips that column.
        reference: how many ID test images the nearest-image LPIPS searches.
        reference_seed: the seed of their class-balanced choice (:func:`datamodules.images.balanced_choice`).
        label_filter: also score every shifted set on its label-keeping images only (Mukhoti et al.'s
            condition: the describer's prediction on ``x̂`` equals its prediction on the source ``x``), rows
            ``<set> (label kept)``; needs the describer.
        output_dir: where files go.
        passes: the run's scoring passes (shared with every other evaluation of the run).
        intervals: level, bootstrap resamples and seed of the intervals.
        fit_set: the in-distribution training images fitted detectors fit on (``None``: no fitted κ).
        fit: per κ name, the cap of its fit set.
        allow_fit_overlap: run even when the fit set holds images of the benchmark's sets (ID test, generated,
            real): refused otherwise, before any pass; allowed, the rows of a fitted κ (and the rank agreement
            they enter) say so in their ``fit overlap`` column.

    Every table flags a detector or describer that shares a member with the ensemble a generated set's
    generator was trained against (``info.json``'s ``training_ensemble``, compared by resolved path and by
    sha256): its numbers on that set report the generator's optimisation target back, not independent evidence.
    """

    def __init__(
        self,
        data: GeneratedBenchmarkData,
        kappas: Sequence[str | type[Detector]],
        *,
        models: Sequence[pl.LightningModule] | None = None,
        kappa_args: dict[str, dict[str, Any]] | None = None,
        describer: pl.LightningModule | None = None,
        describer_quality: EnsembleQuality | None = None,
        perceptual: torch.nn.Module | None = None,
        reference: int = 128,
        reference_seed: int = 0,
        label_filter: bool = False,
        output_dir: str | Path = "runs/generated",
        plots: bool = True,
        passes: ScoringPasses | None = None,
        intervals: Intervals | None = None,
        fit_set: EvaluationSet | None = None,
        fit: dict[str, dict[str, Any]] | None = None,
        allow_fit_overlap: bool = False,
    ) -> None:
        super().__init__()
        self.data = data
        self.fit_set = fit_set
        self.allow_fit_overlap = allow_fit_overlap
        self._fitted: list[Any] = []  # the fitted detectors of the run (their state goes into the outputs)
        self.intervals = Intervals.of(intervals)
        self.replicates: dict[str, Tensor] = {}
        self.grids: dict[str, Path] = {}  # per set, the grid of its first images (plots on)
        # per (model, set): its predictions and their accuracy and ECE, computed once for every κ of the model
        self._probabilities: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
        self._calibrations: dict[tuple[Any, ...], tuple[dict[str, float | None], dict[str, Tensor]]] = {}
        # the κ, their arguments and fit caps, checked where every command checks them
        detectors = DetectorOptions(kappa=list(kappas), kappa_args=kappa_args, fit=fit)
        self.kappas, self.kappa_parameters, self.fit = detectors.detector_classes, detectors.kappa_parameters, detectors.fit
        self.models = list(models) if models is not None else None
        self.describer, self.perceptual = describer, perceptual
        self.describer_quality = describer_quality
        if reference < 1:
            raise ValueError(f"reference must be positive, got {reference}")
        if label_filter and describer is None:
            raise ValueError("label_filter needs the describing ensemble (ensemble: member checkpoints): the label "
                             "condition compares its prediction on each shifted image with that on its source")
        self.reference, self.reference_seed, self.label_filter = reference, reference_seed, label_filter
        self.output_dir, self.plots = Path(output_dir), plots
        self.passes = passes if passes is not None else ScoringPasses()
        self.detectors: list[dict[str, Any]] = []
        self.sets: list[dict[str, Any]] = []
        self.agreement: list[dict[str, Any]] = []
        self.kept: dict[str, Tensor] = {}
        if self.models is not None:
            self.pairs()

    def pairs(self, models: Sequence[pl.LightningModule] | None = None) -> list[tuple[pl.LightningModule, type[Detector]]]:
        """(model, κ) of every detector (:func:`evaluation_engine.scoring.detector_pairs`)."""
        return detector_pairs(list(models if models is not None else self.models or []), self.kappas)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.check(self.models if self.models is not None else [pl_module])

    def check(self, models: Sequence[pl.LightningModule]) -> None:
        """Refuse, before any pass, what the benchmark cannot score: a κ a model cannot serve, a fit set without
        the data a detector needs or holding the benchmark's images, a model without the ID classes."""
        for model, kappa in self.pairs(models):
            check_detectors([kappa], model, self.fit_set)
        if any(kappa.fit_data for _, kappa in self.pairs(models)):  # no detector is fitted on the data it is tested on
            self.passes.check_fit_overlap(self.fit_set, self.data, allow=self.allow_fit_overlap)
        for model in models:  # a model of more classes (ImageNet-1k on a protocol's known classes) is fine
            check_classes(getattr(model, "classes", None), self.data.classes, model=model_name(model),
                          data="the ID test set of the generated benchmark", subset=True)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.evaluate(Runner.of(trainer), [pl_module] if self.models is None else None)

    def evaluate(self, runner: Runner, models: Sequence[pl.LightningModule] | None = None) -> MethodResult:
        """Every detector on every set, the sets' description and the rank agreement, in ``runner``'s processes
        (``models``: default the benchmark's own); files and W&B on global rank zero."""
        models = list(models if models is not None else self.models or [])
        self.check(models)
        kinds = self.data.kinds
        self._probabilities, self._calibrations = {}, {}  # per (model, set): this evaluation's only
        helpers = [m for m in (self.describer, self.perceptual) if m is not None]
        with runner.on_device(*models, *helpers), torch.inference_mode(False), torch.no_grad():
            description = self._describe(runner, models)
            self.kept = self._label_kept(description)
            self.detectors = [row for model, kappa in self.pairs(models)
                              for row in self._detector_rows(runner, model, kappa)]
        self.sets = [self._set_row(name, description) for name in self.data.sets] if description else []
        shifted = [n for n, k in kinds.items() if k == "shift"]
        if self.label_filter:
            shifted += [f"{n}{LABEL_KEPT}" for n in list(shifted)]
        scored = [row for row in self.detectors if row["auroc"] is not None]  # a label filter may keep no image
        self.agreement = rank_agreement(scored, generated=[n for n, k in kinds.items() if k == "near_ood"],
                                        real=[n for n, k in kinds.items() if k == "real_ood"])
        self.agreement += rank_agreement(scored, generated=shifted,
                                         real=[n for n, k in kinds.items() if k == "real_shift"])
        sharing = {(row["model"], row["confidence function"]) for row in self.detectors
                   if row["shares generator ensemble"] != "no"}
        for row in self.agreement:
            detectors = {(r["model"], r["confidence function"]) for r in self.detectors if r["set"] == row["generated"]}
            row["detectors sharing generator ensemble"] = len(detectors & sharing)
            row["weak ensemble"] = self.weak_ensemble(row["generated"], described=row["generated"].endswith(LABEL_KEPT))
            notes = dict.fromkeys(r[FIT_OVERLAP] for r in self.detectors
                                  if r.get(FIT_OVERLAP) and r["set"] in (row["generated"], row["real"]))
            if notes:  # the ranking holds detectors fitted on an overlapping set
                row[FIT_OVERLAP] = "; ".join(notes)
        for row in self.detectors:  # a "(label kept)" row's images are the describer's choice
            row["weak ensemble"] = self.weak_ensemble(row["set"], described=row["set"].endswith(LABEL_KEPT))
        self._log(runner)
        if runner.is_global_zero:
            self._write(runner)
        return MethodResult("generated", {"detectors": self.detectors, "sets": self.sets, "agreement": self.agreement},
                            folder=self.output_dir, replicates=self.replicates)

    # -- independence of the evidence ------------------------------------------------------------------

    def shares_generator_ensemble(self, model: Any, set_name: str) -> bool:
        """Whether a model (a checkpoint or ``ensemble:`` :class:`ScoringModel`) has a member of the ensemble the
        generator of ``set_name`` was trained against (:meth:`GeneratedBenchmarkData.trained_against`)."""
        spec = str(getattr(model, "spec", ""))
        if spec.startswith("ensemble:"):
            own = member_paths(spec.removeprefix("ensemble:"))
        elif spec.endswith(".ckpt"):
            own = [spec]
        else:
            own = [str(p) for p in getattr(model, "paths", ())]  # a DeepEnsemble given from Python
        return self.data.trained_against(own, set_name)

    def weak_ensemble(self, set_name: str, *, described: bool) -> str:
        """What a row on ``set_name`` says about the weak ensembles it rests on (``"no"``: none): the generator's
        training ensemble of a generated set (``info.json``'s ``training_ensemble_quality``) and, when the row is
        ``described`` (its numbers or images come from the describer), the describing ensemble."""
        flags = []
        trained = self.data.info.get(set_name.removesuffix(LABEL_KEPT), {}).get("training_ensemble_quality")
        if trained:
            quality = EnsembleQuality.from_dict(trained)
            if quality.weak:
                flags.append(quality.flag("generator's ensemble"))
        if described and self.describer_quality is not None and self.describer_quality.weak:
            flags.append(self.describer_quality.flag("describer"))
        return "; ".join(flags) or "no"

    def _shared_sets(self, model: Any) -> str:
        generated = [n for n, k in self.data.kinds.items() if k in ("near_ood", "shift")]
        shared = [n for n in generated if self.shares_generator_ensemble(model, n)]
        return ", ".join(shared) if shared else "no"

    # -- detectors ---------------------------------------------------------------------------------

    def _classification(self, runner: Runner, model: pl.LightningModule, name: str, background: bool,
                        batch: dict[str, int]) -> tuple[Tensor, Tensor]:
        """``(probabilities over the data's known classes as the model's columns, targets)`` of a labelled set."""
        outputs = self.passes.outputs(runner, model, self.data[name], **batch)
        probs = torch.softmax(outputs["logits"].float(), dim=-1)
        probs = known_columns(probs.mean(dim=1) if probs.ndim == 3 else probs, background)
        targets = outputs["targets"]
        columns = class_indices(getattr(model, "classes", None), self.data.classes)
        if columns is not None:  # the data's labels as the model's classes
            targets = columns[targets]
        return probs, targets

    def _classified(self, runner: Runner, model: pl.LightningModule, name: str, background: bool,
                    batch: dict[str, int]) -> tuple[Tensor, Tensor]:
        """:meth:`_classification` once per (model, set): every κ of a model reads the same predictions (an
        ensemble's mean probabilities are computed once, not once per κ)."""
        memo = (id(model), name)  # the model object: two models may share a display name
        if memo not in self._probabilities:
            self._probabilities[memo] = self._classification(runner, model, name, background, batch)
        return self._probabilities[memo]

    def _accuracy_ece(self, probs: Tensor, targets: Tensor, key: str = "", *,
                      memo: tuple[Any, ...] | None = None) -> dict[str, float | None]:
        """Accuracy with Wilson's interval and ECE with its bootstrap interval (the set's images resampled);
        bootstrap replicates of both under ``<key>|accuracy`` and ``<key>|ece``. With ``memo`` (the model, the
        set), computed once and reused by every κ of that model."""
        if memo is not None and memo in self._calibrations:
            row, replicates = self._calibrations[memo]
        else:
            row, replicates = self._calibration(probs, targets)
            if memo is not None:
                self._calibrations[memo] = (row, replicates)
        for metric, values in replicates.items():
            if key:
                self.replicates[f"{key}|{metric}"] = values
        return dict(row)

    def _calibration(self, probs: Tensor, targets: Tensor) -> tuple[dict[str, float | None], dict[str, Tensor]]:
        if targets.numel() == 0:
            return {"accuracy": None, "ece": None}, {}
        # calibration of the known-class prediction; with a background column the row does not sum to 1, and
        # the ECE uses the confidence of the predicted known class as it is
        row: dict[str, float | None] = {
            "accuracy": float((probs.argmax(dim=1) == targets).double().mean()),
            "ece": float(multiclass_calibration_error(probs, targets, num_classes=probs.shape[1], n_bins=15,
                                                      norm="l1"))}
        replicates = bootstrap_accuracy_ece(probs, targets, bins=15, resamples=self.intervals.resamples,
                                            seed=self.intervals.seed)
        correct = int((probs.argmax(dim=1) == targets).sum())
        with_bounds(row, "accuracy", self.intervals.proportion(correct, targets.numel()))  # Wilson's
        with_bounds(row, "ece", self.intervals.bounds(replicates["ece"]))
        return row, {metric: replicates[metric] for metric in ("accuracy", "ece")}

    def _auroc(self, id_scores: Tensor, ood_scores: Tensor, key: str) -> dict[str, float | None]:
        """AUROC with its interval (:meth:`Intervals.auroc`); its bootstrap replicates under ``<key>|auroc``."""
        row: dict[str, float | None] = {"auroc": auroc(id_scores, ood_scores)}
        with_bounds(row, "auroc", self.intervals.auroc(id_scores, ood_scores))
        self.replicates[f"{key}|auroc"] = bootstrap_auroc(id_scores, ood_scores, self.intervals.resamples,
                                                         self.intervals.seed)
        detection, replicates = self.intervals.detection(id_scores, ood_scores)  # the same resamples as the AUROC's
        row.update(detection)
        self.replicates.update({f"{key}|{column}": values for column, values in replicates.items()})
        return row

    def _detector_rows(self, runner: Runner, model: pl.LightningModule,
                       kappa: type[Detector]) -> list[dict[str, Any]]:
        background = bool(getattr(model, "background_class", False))
        batch = {"batch_size": self.data.batch_size, "num_workers": self.data.num_workers}
        note = ""
        if kappa.needs_fit:  # fitted once per (model, κ) on the fit set; scores() then uses it
            self._fitted.append(self.passes.fitted_detector(runner, model, kappa, self.kappa_parameters[kappa.name],
                                                   self.fit_set, fit=self.fit.get(kappa.name), **batch))
            note = self.passes.fit_notes(self._fitted[-1], self.data)  # an allowed overlap of its fit set with these sets
        scores = {name: self.passes.scores(runner, model, s, kappa, self.kappa_parameters[kappa.name], **batch)
                  for name, s in self.data.sets.items()}
        common = {"model": model_name(model), "confidence function": kappa.name,
                  "shares generator ensemble": self._shared_sets(model), **({FIT_OVERLAP: note} if note else {})}
        rows = []
        for name, kind in self.data.kinds.items():
            key = f"{common['model']}|{kappa.name}|{name}"
            memo = (id(model), name)  # the model object (two models may share a display name), the set
            if kind == "id":  # the baseline every shift result is read against
                probs, targets = self._classified(runner, model, name, background, batch)
                rows.append({**common, "set": name, "kind": kind, "auroc": None,
                             **self._accuracy_ece(probs, targets, key, memo=memo), "images": int(targets.numel())})
                continue
            row = {**common, "set": name, "kind": kind, **self._auroc(scores["id_test"], scores[name], key),
                   "images": int(scores[name].numel())}
            rows.append(row)
            if kind not in ("shift", "real_shift"):
                continue
            probs, targets = self._classified(runner, model, name, background, batch)
            row.update(self._accuracy_ece(probs, targets, key, memo=memo))
            if self.label_filter and kind == "shift":
                kept = self.kept[name].to(probs.device)
                kept_key = f"{common['model']}|{kappa.name}|{name}{LABEL_KEPT}"
                rows.append({**common, "set": f"{name}{LABEL_KEPT}", "kind": kind,
                             **(self._auroc(scores["id_test"], scores[name][kept.to(scores[name].device)], kept_key)
                                if bool(kept.any()) else {"auroc": None}),
                             **self._accuracy_ece(probs[kept], targets[kept], kept_key, memo=(*memo, LABEL_KEPT)),
                             "images": int(kept.sum())})
        return rows

    # -- the label condition -----------------------------------------------------------------------

    def _label_kept(self, description: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
        """Per shifted set, ``(N,)`` booleans: the describer's prediction on each shifted image equals its
        prediction on the image's source in the ID test set (found by ``source_index``)."""
        if self.describer is None:
            return {}
        id_prediction = description["id_test"]["prediction"].cpu()
        id_indices = sample_indices(self.data["id_test"].dataset).sort().values
        if id_indices.numel() != id_prediction.numel():
            if not self.label_filter:
                return {}
            raise ValueError(f"the label filter needs every ID test image's prediction: {id_indices.numel()} images, "
                             f"{id_prediction.numel()} predictions (unreadable images skipped?)")
        kept = {}
        for name, kind in self.data.kinds.items():
            if kind != "shift":
                continue
            sources = torch.tensor([int(row["source_index"]) for row in self.data[name].dataset.rows])
            position = torch.searchsorted(id_indices, sources).clamp(max=max(id_indices.numel() - 1, 0))
            present = id_indices[position] == sources
            if not bool(present.all()):
                if not self.label_filter:
                    continue
                raise ValueError(f"{getattr(self.data[name].dataset, 'folder', name)}: the source images "
                                 f"{sources[~present][:5].tolist()} of the shifted set {name} are not in the ID test set "
                                 "(the set was generated from other data): the label filter cannot compare predictions")
            kept[name] = description[name]["prediction"].cpu().long() == id_prediction[position].long()
        return kept

    # -- what the sets are -------------------------------------------------------------------------

    def _describe(self, runner: Runner, models: Sequence[pl.LightningModule]) -> dict[str, dict[str, Tensor]]:
        describer, perceptual = self.describer, self.perceptual
        if describer is None and perceptual is None:
            return {}
        batch = {"batch_size": self.data.batch_size, "num_workers": self.data.num_workers}
        description: dict[str, dict[str, Tensor]] = {name: {} for name in self.data.sets}
        if describer is not None:
            background = bool(getattr(describer, "background_class", False))
            for name, evaluation_set in self.data.sets.items():
                outputs = self.passes.outputs(runner, describer, evaluation_set, **batch)
                logits = outputs["logits"].float().transpose(0, 1)  # (M, N, C)
                mean = known_columns(torch.softmax(logits, dim=-1).mean(dim=0), background)
                description[name].update(targets=outputs["targets"], prediction=mean.argmax(dim=1),
                                         mi=mutual_information_from_logits(logits, background=background).float())
        if perceptual is not None:
            model_input = (describer or models[0]).model_input
            id_set = self.data["id_test"].dataset
            count = min(self.reference, len(id_set))
            chosen = balanced_choice(self.data["id_test"].labels(), count, self.reference_seed).tolist()
            reference = torch.stack([model_input.pipeline(id_set[i].image) for i in chosen]).to(runner.device)
            for name, evaluation_set in self.data.sets.items():
                distances = self.passes.per_sample_pass(
                    runner, perceptual, evaluation_set, model_input=ModelInput(model_input.pipeline),
                    name=slug(f"lpips-{name}"),
                    part={"lpips": perceptual.description, "reference": count, "reference_seed": self.reference_seed},
                    step=lambda images: {"lpips": perceptual.nearest(images, reference)[1].float()}, keys=["lpips"],
                    **batch)
                description[name].update(targets=distances["targets"], lpips=distances["lpips"])
        return description

    def _set_row(self, name: str, description: dict[str, dict[str, Tensor]]) -> dict[str, Any]:
        kind = self.data.kinds[name]
        out = description[name]
        info = self.data.info.get(name, {})
        row: dict[str, Any] = {"set": name, "kind": kind, "images": int(out["targets"].numel()),
                               "lambda_perceptual": _float(info.get("lambda_perceptual")),
                               "lambda_semantic": _float(info.get("lambda_semantic")),
                               "mode": info.get("mode", "eval (not recorded)") if info else None,
                               "generator": generator_name(info["generator"]) if "generator" in info else ""}
        if kind in ("near_ood", "shift") and self.describer is not None:
            row["describer shares generator ensemble"] = "yes" if self.shares_generator_ensemble(
                self.describer, name) else "no"
        row["weak ensemble"] = self.weak_ensemble(name, described=self.describer is not None)
        if "mi" in out:
            row["mean MI"] = float(out["mi"].double().mean())
            if kind in ("shift", "real_shift", "id"):  # for the ID test set: the ensemble's accuracy, the scale
                row["keeps source label"] = float((out["prediction"].long() == out["targets"]).double().mean())
        if name in self.kept:  # Mukhoti et al.'s label condition: the fraction the label filter keeps
            row["keeps ensemble label"] = float(self.kept[name].double().mean())
        if kind == "shift":  # the regularised quantity itself, measured at generation (manifest, info["lpips"])
            values = [float(r["lpips"]) for r in self.data[name].dataset.rows if r["lpips"] != ""]
            row["mean LPIPS to source"] = sum(values) / len(values) if values else None
        if "lpips" in out and kind != "id":
            row["mean LPIPS to nearest ID"] = float(out["lpips"].double().mean())
        return row

    # -- files, W&B ----------------------------------------------------------------------------------

    def _log(self, runner: Runner) -> None:
        scalars = {metric_key("test", "generated", row["model"], row["confidence function"], row["set"], metric):
                   row[metric] for row in self.detectors for metric in ("auroc", "accuracy", "ece")
                   if row.get(metric) is not None}
        runner.log_metrics(scalars)
        log_table(runner, metric_key("test", "generated", "detectors"), self.detectors,
                  overlap_columns(DETECTOR_COLUMNS, self.detectors))
        if self.sets:
            log_table(runner, metric_key("test", "generated", "sets"), self.sets, SET_COLUMNS)
        if self.agreement:
            log_table(runner, metric_key("test", "generated", "agreement"), self.agreement,
                      overlap_columns(AGREEMENT_COLUMNS, self.agreement))

    def _write(self, runner: Runner) -> None:
        out = self.output_dir
        for model in dict.fromkeys(row["model"] for row in self.detectors):
            rows = [r for r in self.detectors if r["model"] == model]
            write_tables(out, f"detectors_{slug(model)}", rows, overlap_columns(DETECTOR_COLUMNS, rows))
        notes = dict.fromkeys(r[FIT_OVERLAP] for r in self.detectors if r.get(FIT_OVERLAP))
        write_tables(out, "detectors", self.detectors, overlap_columns(DETECTOR_COLUMNS, self.detectors), preamble=(
            f"{self.intervals.describe()}: AUROC over the images (ID and set separately), accuracy and ECE "
            f"percentile bootstrap (the set's images). {ECE_NOTE} {DETECTION_NOTE}"
            + "".join(f" Warning: {note}: its detectors scored images they were fitted on." for note in notes)))
        write_replicates(out, self.replicates, self.intervals)
        write_fitted(out, self.passes, self._fitted)
        if self.agreement:
            write_tables(out, "agreement", self.agreement, overlap_columns(AGREEMENT_COLUMNS, self.agreement))
        if self.sets:
            lpips = getattr(self.perceptual, "description", "no LPIPS")
            write_csv(out / "sets.csv", self.sets, SET_COLUMNS)
            describer = (f"; described by {self.describer_quality.name}, {self.describer_quality.summary()}"
                         if self.describer_quality is not None else "")
            write_markdown(out / "sets.md", self.sets, SET_COLUMNS,
                           preamble=f"LPIPS: {lpips}; reference: {self.reference} ID test images, chosen "
                                    f"{BALANCED_RULE} (seed {self.reference_seed}){describer}")
        if self.plots:
            grids = {}
            for name, evaluation_set in self.data.sets.items():
                pipeline = (self.describer or (self.models or [None])[0]).model_input.pipeline \
                    if (self.describer or self.models) else to_float_tensor
                images = torch.stack([pipeline(evaluation_set.dataset[i].image)
                                      for i in range(min(32, len(evaluation_set)))])
                grids[metric_key("test", "generated", "grid", slug(name))] = save_image_grid(
                    images, out / "grids" / f"{slug(name)}.png")
            self.grids = {name: Path(grids[metric_key("test", "generated", "grid", slug(name))])
                          for name in self.data.sets}
            log_images(runner, grids)
        rank_zero_info(f"Generated benchmark tables: {out}")


def sample_indices(dataset: Any) -> Tensor:
    """The dataset index each position of a data set yields as ``Sample.index`` (a ``Subset`` yields its
    parent's index): what a pass's outputs are ordered by."""
    if isinstance(dataset, Subset):
        return sample_indices(dataset.dataset)[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    return torch.arange(len(dataset))


def generator_name(path: str) -> str:
    """``runs/demo/generators/shift/last.ckpt`` -> ``shift/last.ckpt``; other checkpoints -> their file name."""
    checkpoint = Path(path)
    return f"{checkpoint.parent.name}/{checkpoint.name}" if checkpoint.stem in ("best", "last") else checkpoint.name


def _float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)
