"""``evaluate.py generate`` and ``generated`` (Mukhoti et al.; DESIGN.md §5.3): :class:`GenerateSets` writes a
generator's sets (through :class:`callbacks.GeneratedSetWriter`), :class:`GeneratedEvaluation` scores detectors on
the generated and real sets (through :class:`callbacks.GeneratedBenchmark`); the ID datamodule of a command
(:func:`id_datamodule`)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import DataLoader, Subset

from callbacks.generated import (
    DETECTOR_COLUMNS,
    LABEL_KEPT,
    GeneratedBenchmark,
    GeneratedSetWriter,
    GenerationModeSetter,
    staging_prefix,
)
from datamodules.batch import AtLeast, collate_samples
from datamodules.catalog import build_datamodule, ood_context, real_ood_set
from datamodules.evaluation import EvaluationSet, TransformedSet, fit_folder_set
from datamodules.generated import (
    GeneratedBenchmarkData,
    LatentSeeds,
    real_shift_set,
    without_unreadable,
)
from datamodules.images import BALANCED_RULE, BadImagePolicy, ImageFileDataset, balanced_choice, check_choice
from evaluation_engine.command import DATA_OVERRIDES_RENAMED, Evaluation, make_trainer
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import (
    DataArgOptions,
    DataOptions,
    DetectorOptions,
    OutputOptions,
    WeightOptions,
)
from evaluation_engine.outputs import (
    check_output_dir,
    markdown_table,
)
from evaluation_engine.results import Estimate, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    default_fit_set,
    detector_pairs,
    overlap_columns,
)
from evaluation_methods.registry import (
    DETECTION_HEADERS,
    CardContext,
    Headline,
    Method,
    Section,
    Table,
    cell,
    column_cell,
    detection_cells,
    register,
)
from lightning_modules.checkpoint import (
    datamodule_from_checkpoint,
    load_module,
    read_checkpoint,
)
from lightning_modules.ensemble_quality import check_ensemble
from lightning_modules.generated import RegularisedGenerator, ShiftGenerator
from lightning_modules.generated.modes import GenerationMode, check_generation_mode
from lightning_modules.generated.provenance import member_records, training_record
from lightning_modules.nets import DeepEnsemble, PerceptualDistance
from lightning_modules.nets.ensemble import member_paths
from lightning_modules.scoring import ScoringModel
from metrics.bootstrap_intervals import paired_difference
from openset_common.artefacts import file_sha256, stale_staging_folders


@dataclass(kw_only=True, eq=False)
class GenerateSets(Evaluation, DataArgOptions):
    """``evaluate.py generate``: write ``num`` images of each generator checkpoint as a generated set
    (:mod:`datamodules.generated`), each with its own output folder; several share one process.

    A shift generator shifts ``num`` in-distribution test images of its own datamodule (through the
    generator's input transform), chosen seeded and class-balanced (:func:`datamodules.images.balanced_choice`;
    the protocol test lists are sorted by class); a near-OOD generator draws image ``i`` from its own seed, and
    the LPIPS reference images are chosen the same way. Every count and output folder is checked before
    anything is generated. ``info.json`` records the generator's classes and training hyper-parameters, the
    generation mode, the choice rule and its seed, and the members (paths and sha256) of the ensemble the
    generator was trained against.

    Attributes:
        model: ShiftGenerator or NearOODGenerator checkpoints of ``train.py``.
        output_dir: one folder per checkpoint (written whole or not at all).
        num: images per set.
        seed: near-OOD: image ``i`` comes from the seed ``seed * 1_000_003 + i``; the seed of the choice of shift
            sources and LPIPS reference images, and of the ``pix2pix`` mode's dropout masks.
        overwrite: replace existing sets (each stays whole until its new one is complete).
        reference: near-OOD: the LPIPS of each image is to the nearest of this many ID test images.
        ensemble: member checkpoints (or a members file) that describe the images (default: the generator's).
        lpips_net, lpips_random_backbone: the LPIPS that describes them (default: the generator's).
        mode: how the generator runs (:mod:`lightning_modules.generated.modes`): ``"eval"`` (dropout off,
            running statistics: each image a function of its input) or ``"pix2pix"`` (as in training and as
            Isola et al. test: dropout on, batch statistics).
        allow_weak_ensemble: describe the images with an ensemble below its quality bar anyway
            (:mod:`lightning_modules.ensemble_quality`; the generator's own ensemble is also let through when
            the generator was trained with ``allow_weak_ensemble``); ``info.json`` records the quality of the
            describing ensemble (``ensemble_quality``) and of the one the generator was trained against
            (``training_ensemble_quality``, as its checkpoint recorded it).
        data_args: arguments of the generator's datamodule to change (e.g. its root).
        batch_size: of the generation (in ``pix2pix`` mode the images depend on it: batch statistics).
    """

    command: ClassVar[str] = "generate"
    renamed_options: ClassVar[dict[str, tuple[str, str]]] = DATA_OVERRIDES_RENAMED  # --data KEY=VALUE, of before

    model: Sequence[str]
    output_dir: Sequence[str]
    num: int
    seed: int = 0
    overwrite: bool = False
    reference: int = 256
    ensemble: str | Sequence[str] | None = None
    lpips_net: str | None = None
    lpips_random_backbone: bool = False
    mode: GenerationMode = "eval"
    allow_weak_ensemble: bool = False
    batch_size: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.model, self.output_dir = [str(m) for m in self.model], [str(o) for o in self.output_dir]
        if not self.model:
            raise ValueError("give at least one generator checkpoint")
        if len(self.model) != len(self.output_dir):
            raise ValueError(f"give one output folder per generator: {len(self.model)} checkpoints, "
                             f"{len(self.output_dir)} folders")
        resolved = [Path(folder).resolve() for folder in self.output_dir]
        twice = sorted({str(folder) for folder in self.output_dir if resolved.count(Path(folder).resolve()) > 1})
        if twice:  # the second set would replace the first (--overwrite) or fail after the first was generated
            raise ValueError(f"each generator needs its own output folder: {twice} given more than once")
        if self.num < 1:
            raise ValueError(f"the number of images must be positive, got {self.num}")
        for name in ("reference", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        LatentSeeds(self.num, self.seed)  # a seed whose per-image seeds do not fit 64 bits is refused here
        self.ensemble = ([self.ensemble] if isinstance(self.ensemble, str) else list(self.ensemble)) \
            if self.ensemble else None
        self.mode = check_generation_mode(self.mode)

    def run(self) -> Path | list[Path]:
        for folder in self.output_dir:
            check_output_dir(folder, overwrite=self.overwrite, what="the generated set")
        for folder in self.output_dir:  # what a run killed outright (SIGKILL, a power cut) left behind
            for stale in stale_staging_folders(Path(folder).parent, staging_prefix(Path(folder))):
                shutil.rmtree(stale, ignore_errors=True)
                print(f"removed the staging folder {stale} of a generation that did not finish", file=sys.stderr)
        folders = [self._generate(ckpt, Path(folder)) for ckpt, folder in zip(self.model, self.output_dir, strict=True)]
        return folders[0] if len(folders) == 1 else folders

    def _generate(self, ckpt: str, folder: Path) -> Path:
        checkpoint = read_checkpoint(ckpt)
        module = load_module(ckpt, checkpoint, expected=RegularisedGenerator,
                             hint="generate writes the images of a ShiftGenerator or NearOODGenerator checkpoint")
        datamodule = datamodule_from_checkpoint(checkpoint, ckpt, self.data_args)
        id_test = datamodule.evaluation_set("test", role="id_test", known_only=True)
        pipeline = datamodule.model_input().pipeline  # the images the generator was trained on
        hparams = module.hparams
        members = self.ensemble or hparams.get("ensemble")
        # the describing ensemble held to its bar; the generator's own one also passes when the generator was
        # trained with allow_weak_ensemble (its checkpoint records what was checked)
        allow = self.allow_weak_ensemble or (not self.ensemble and bool(hparams.get("allow_weak_ensemble", False)))
        quality = check_ensemble(members, what=f"describing the images of {ckpt} (the manifest's MI and ensemble "
                                 "predictions)", allow_weak=allow) if members else None
        ensemble = DeepEnsemble.from_checkpoints(members) if members else None
        perceptual = PerceptualDistance(self.lpips_net or hparams.get("lpips_net", "vgg"),
                                        random_backbone=self.lpips_random_backbone
                                        or bool(hparams.get("lpips_random_backbone", False)))
        choice = {"rule": BALANCED_RULE, "seed": self.seed}
        if isinstance(module, ShiftGenerator):
            kind = "shift"
            if len(id_test) < self.num:
                raise ValueError(f"--num {self.num}: the data have only {len(id_test)} in-distribution test images "
                                 "to shift")
            chosen = balanced_choice(id_test.labels(), self.num, self.seed).tolist()
            items: Any = TransformedSet(Subset(id_test.dataset, chosen), pipeline)
            collate: Any = collate_samples
            module.attach_scorers(ensemble, perceptual)
        else:
            kind = "near_ood"
            items, collate = LatentSeeds(self.num, self.seed), None
            count = min(self.reference, len(id_test))
            chosen = balanced_choice(id_test.labels(), count, self.seed).tolist()
            reference = torch.stack([pipeline(id_test.dataset[i].image) for i in chosen])
            module.attach_scorers(ensemble, perceptual, reference=reference)
        info = {
            "kind": kind, "generator": str(ckpt), "generator_sha256": file_sha256(ckpt),
            "generator_class": type(module).__name__, "seed": self.seed,
            "classes": list(datamodule.class_names), "mode": self.mode,
            "lambda_perceptual": module.lambda_perceptual, "lambda_semantic": module.lambda_semantic,
            "training": training_record(checkpoint, module),
            "training_ensemble": member_records(hparams.get("ensemble")),
            "lpips": perceptual.description, "ensemble": ensemble.paths if ensemble is not None else [],
            "ensemble_quality": quality.as_dict() if quality is not None else None,
            "training_ensemble_quality": checkpoint.get("ensemble_quality"),
            "reference_images": self.reference if kind == "near_ood" else None,
            "reference_choice": choice if kind == "near_ood" else None,
            "source": "in-distribution test images of the generator's datamodule" if kind == "shift" else None,
            "source_choice": choice if kind == "shift" else None,
        }
        writer = GeneratedSetWriter(folder, info, overwrite=self.overwrite)
        trainer = make_trainer(self.options, logger=False, callbacks=[GenerationModeSetter(self.mode, self.seed), writer])
        # at least one image per process (fewer images than processes: the repeats are written once)
        loader = DataLoader(AtLeast(items, trainer.world_size), batch_size=self.batch_size, collate_fn=collate)
        trainer.predict(module, dataloaders=loader, return_predictions=False)
        if trainer.is_global_zero:
            print(f"{writer.count} {kind} images written to {folder} ({perceptual.description}, {self.mode} mode)")
        return folder


@dataclass(kw_only=True, eq=False)
class GeneratedEvaluation(Evaluation, WeightOptions, DataOptions, DetectorOptions, OutputOptions):
    """``evaluate.py generated``: detectors on generated near-OOD and shifted sets next to real OOD and real
    shifted sets, the sets' description, and the rank agreement of the detectors between generated and real
    benchmarks.

    Attributes:
        model: the detectors' models: ``timm:<name>``, ``torchvision:<name>``, checkpoints,
            ``ensemble:<members>``.
        near_ood, shift: folders of generated sets (``evaluate.py generate``); a set generated for other
            classes than the data's is refused.
        real_ood: real OOD sets, ``NAME=SPEC`` or ``SPEC``: ``digits``, ``fashion:unknown``, ``fashion:<ids>``,
            or an image folder.
        real_shift: real shifted sets, ``NAME=FOLDER`` or ``FOLDER``, laid out as ``<folder>/<class name or
            wnid>/*`` (ImageNet-R, one corruption and severity of ImageNet-C): accuracy, ECE and AUROC next to
            the generated shifted sets, and Kendall's τ between their detector rankings.
        ensemble: member checkpoints (or a members file) of the ensemble whose MI and predictions describe the
            sets; give one independent of the generators' training ensemble for independent evidence (a shared
            one is flagged in every table).
        lpips_net, lpips_random_backbone: the LPIPS that describes the sets.
        reference: ID test images the nearest-image LPIPS searches, chosen seeded and class-balanced.
        reference_seed: the seed of that choice.
        label_filter: also score each shifted set on the images that keep their label (the ensemble's
            prediction on the shifted image equals that on its source, Mukhoti et al.'s condition); needs
            ``ensemble``.
        on_bad_image: unreadable images of the image folders (real OOD, real shifted; the ID datamodule's when it
            has the option and ``data_args`` do not set it): ``"fail"`` names the file and stops; ``"skip"`` decodes
            every folder image once before the passes and leaves the unreadable ones out, counted in a warning.
        intervals: level, bootstrap resamples and seed of the intervals.
        allow_weak_ensemble: describe the sets with an ensemble below its quality bar anyway
            (:mod:`lightning_modules.ensemble_quality`: the bar stated at ``train.py ensemble``, else the sanity
            bar); every row it shapes then names it in ``weak ensemble``.
        data: the in-distribution data: ``fashion``, a checkpoint (its datamodule), or a datamodule class path;
            default: the first checkpoint model's datamodule (from Python also a :class:`GeneratedBenchmarkData`).
        batch_size: of the passes (default 256).
        num_workers: data-loading workers of the passes (default 0).
        fit_data: the in-distribution training images of fitted detectors, ``<folder>/<class>/*`` with the model's
            classes (default: the ID datamodule's training split).
        output_dir: the tables and grids (default ``runs/generated``).

    The other options are the groups' (:class:`WeightOptions`, :class:`DataOptions`, :class:`DetectorOptions`,
    :class:`OutputOptions`).
    """

    command: ClassVar[str] = "generated"
    decodes_on_device: ClassVar[bool] = True
    dropped_options: ClassVar[dict[str, str]] = {
        "image_size": "every model takes the sets through its own input transform"}

    model: Sequence[str]
    near_ood: Sequence[str] = ()
    shift: Sequence[str] = ()
    real_ood: Sequence[str] = ()
    real_shift: Sequence[str] = ()
    ensemble: str | Sequence[str] | None = None
    lpips_net: str | None = None
    lpips_random_backbone: bool = False
    reference: int = 128
    reference_seed: int = 0
    label_filter: bool = False
    on_bad_image: BadImagePolicy = "fail"
    intervals: Intervals | None = None
    allow_weak_ensemble: bool = False
    batch_size: int | None = 256
    num_workers: int | None = 0
    output_dir: str | None = "runs/generated"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._fit_set: EvaluationSet | None = None
        if not self.model:
            raise ValueError("give at least one model (--model, or model: in --config)")
        self.intervals = Intervals.of(self.intervals)
        self.model = list(self.model)
        self.near_ood, self.shift, self.real_ood = list(self.near_ood), list(self.shift), list(self.real_ood)
        self.real_shift = list(self.real_shift)
        self.ensemble = ([self.ensemble] if isinstance(self.ensemble, str) else list(self.ensemble)) \
            if self.ensemble else None
        if self.label_filter and not self.ensemble:
            raise ValueError("label_filter needs --ensemble (the ensemble whose predictions on each shifted image and "
                             "its source are compared)")
        self.on_bad_image = check_choice("on_bad_image", self.on_bad_image, ("fail", "skip"))

    def run(self) -> MethodResult:
        models = [self.scoring_model(m, pretrained=not self.random_weights) for m in self.model]
        detector_pairs(models, self.detector_classes)  # before any data are read
        data = self.data if isinstance(self.data, GeneratedBenchmarkData) else self._data(models)
        if self._fit_set is None and self.fit_data and isinstance(self.data, GeneratedBenchmarkData):
            self._fit_set = fit_folder_set(self.fit_data, data.classes)
        # before any pass: an ensemble below its quality bar describes nothing unless told
        quality = check_ensemble(self.ensemble if len(self.ensemble) > 1 else self.ensemble[0],
                                 what="describing the sets (--ensemble)",
                                 allow_weak=self.allow_weak_ensemble) if self.ensemble else None
        describer = ScoringModel(f"ensemble:{','.join(self.ensemble)}") if self.ensemble else None
        perceptual = (PerceptualDistance(self.lpips_net, random_backbone=self.lpips_random_backbone)
                      if self.lpips_net else None)
        check_output_dir(self.output_dir)
        benchmark = GeneratedBenchmark(data, self.kappa, models=models, kappa_args=self.kappa_args, describer=describer,
                                       describer_quality=quality,
                                       perceptual=perceptual, reference=self.reference,
                                       reference_seed=self.reference_seed, label_filter=self.label_filter,
                                       output_dir=self.output_dir, plots=self.plots,
                                       passes=self.scoring_passes(self.cache_dir),
                                       intervals=self.intervals, fit_set=self._fit_set, fit=self.fit,
                                       allow_fit_overlap=self.allow_fit_overlap)
        benchmark.check(models)  # before the processes start

        def evaluate(runner: Runner) -> MethodResult:
            result = benchmark.evaluate(runner, models)
            if runner.is_global_zero:
                print(f"\nGenerated benchmark written to {self.output_dir}")
                print(markdown_table(benchmark.detectors, overlap_columns(DETECTOR_COLUMNS, benchmark.detectors)))
                if benchmark.sets:
                    print((Path(self.output_dir) / "sets.md").read_text())
            return result

        result = Runner.launch(self.options, evaluate, name="generated-benchmark")
        result.estimates = generated_estimates(result)
        for path in sorted(benchmark.grids.values(), key=lambda path: path.name):
            result.figure(f"set {path.stem}", path, "the first images of the set")
        return result

    def _data(self, models: list[ScoringModel]) -> GeneratedBenchmarkData:
        datamodule = id_datamodule(self.data, self.data_args, models=models)
        if hasattr(datamodule, "on_bad_image") and "on_bad_image" not in self.data_args:
            datamodule.on_bad_image = self.on_bad_image
        real = {}
        for pair in self.real_ood:
            name, sep, spec = pair.partition("=")
            dataset = real_ood_set(spec if sep else pair, **ood_context(datamodule))
            if isinstance(dataset, ImageFileDataset) and self.on_bad_image == "skip":
                dataset = without_unreadable(dataset, what=f"real OOD set {spec if sep else pair}")
            real[name if sep else pair] = dataset
        classes = list(datamodule.class_names)
        shifted = {}
        for pair in self.real_shift:
            name, sep, folder = pair.partition("=")
            folder = folder if sep else pair
            shifted[name if sep else Path(folder).name] = real_shift_set(folder, classes, on_bad_image=self.on_bad_image)
        kappas = self.detector_classes
        self._fit_set = (fit_folder_set(self.fit_data, classes) if self.fit_data else default_fit_set(datamodule)) \
            if any(k.fit_data for k in kappas) else None
        return GeneratedBenchmarkData(datamodule.evaluation_set("test", role="id_test", known_only=True),
                                      near_ood=self.near_ood, shift=self.shift, real_ood=real, real_shift=shifted,
                                      classes=classes, batch_size=self.batch_size, num_workers=self.num_workers)


def id_datamodule(data: str | None, data_args: dict[str, Any], *, models: Sequence[ScoringModel]) -> Any:
    """The in-distribution datamodule of ``generated`` and ``evg``: ``data`` by name (``fashion``), a checkpoint
    (its own datamodule) or a class path, with ``data_args``; default: the first checkpoint model's datamodule."""
    if data is None:
        checkpoints = [m.spec.removeprefix("ensemble:").split(",")[0] for m in models
                       if m.spec.endswith(".ckpt") or m.spec.startswith("ensemble:")]
        if not checkpoints:
            raise ValueError("no checkpoint among the models gives the in-distribution data: give --data (fashion, a "
                             "checkpoint of train.py, or a datamodule class path)")
        data = checkpoints[0]
        if not data.endswith(".ckpt"):  # a members file: its first member
            data = str(member_paths(data)[0])
    if data.endswith(".ckpt"):
        return datamodule_from_checkpoint(read_checkpoint(data), data, data_args)
    return build_datamodule(data, data_args)


# the leaderboard's columns, each the AUROC of ID test vs the first set of its kind (a column's key is the kind)
HEADLINE_KINDS = ("near_ood", "shift", "real_ood")


def headline_sets(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per kind of set, the first set of the detectors table (not a label-filtered copy): the leaderboard's."""
    first: dict[str, str] = {}
    for row in rows:
        if not row["set"].endswith(LABEL_KEPT):
            first.setdefault(row["kind"], row["set"])
    return first


def generated_estimates(result: MethodResult) -> list[Estimate]:
    """The leaderboard's numbers of the detectors table: per detector the AUROC on the first set of each kind,
    measured on that set's images (a set and its size name the units)."""
    first = headline_sets(result["detectors"])
    estimates = []
    for row in result["detectors"]:
        key = f"{row['model']}|{row['confidence function']}|{row['set']}"
        for kind in HEADLINE_KINDS:
            if first.get(kind) == row["set"] and row["auroc"] is not None:
                estimates.append(Estimate(row["model"], row["confidence function"], kind, row["auroc"],
                                      row.get("auroc low"), row.get("auroc high"),
                                      result.replicates.get(f"{key}|auroc"), f"{row['set']}:{row['images']}",
                                      fit_overlap=row.get(FIT_OVERLAP, "")))
    return estimates


@register
class GeneratedMethod(Method):
    """Generated near-OOD and shifted sets (Mukhoti et al.): detectors on them next to real ones."""

    key, evaluation, commands = "generated", GeneratedEvaluation, (GenerateSets,)
    title = "Generated near-OOD and shifted sets (Mukhoti et al.)"
    name, group = "Generated shift and near-OOD sets", "Generated"
    unit = "images (ID test and the set resampled separately)"
    headlines = (
        Headline("near_ood", "near-OOD", "generated", True, "ID test vs the first generated near-OOD set"),
        Headline("shift", "shift", "generated", True, "ID test vs the first generated shifted set"),
        Headline("real_ood", "real OOD", "generated", True, "ID test vs the first real OOD set"),
    )

    def section(self, results: Any, context: CardContext) -> Section:
        (result,) = results.values()
        rows = result["detectors"]
        first = headline_sets(rows)
        table = [{"model": row["model"], "κ": row["confidence function"], "set": row["set"], "kind": row["kind"],
                  "images": row["images"], "AUROC": column_cell(row, "auroc"), "accuracy": column_cell(row, "accuracy"),
                  "ECE": column_cell(row, "ece"), **detection_cells(row),
                  "shares generator ensemble": row.get("shares generator ensemble", ""),
                  FIT_OVERLAP: row.get(FIT_OVERLAP, "")} for row in rows]
        sets = [{k: v for k, v in r.items() if k in ("set", "kind", "images", "mean MI", "mean LPIPS to nearest ID",
                                                       "keeps ensemble label", "mode")} for r in result.get("sets", [])]
        text = ("Detectors on the generated near-OOD and shifted sets next to the real ones: the AUROC of ID test "
                "vs each set, and on the shifted sets (and the ID test set, the baseline) the accuracy and ECE. "
                f"Headline columns: near-OOD = {first.get('near_ood', '—')}, shift = {first.get('shift', '—')}, "
                f"real OOD = {first.get('real_ood', '—')}. Intervals: AUROC DeLong, accuracy and ECE bootstrap; "
                f"resampling unit {self.unit}. A detector sharing the generators' training ensemble "
                "reports the generator's own objective back (flagged).")
        tables = [Table("detectors", ["model", "κ", "set", "kind", "images", "AUROC", *DETECTION_HEADERS,
                                      "accuracy", "ECE", "shares generator ensemble",
                                      *overlap_columns((), table)], table)]
        differences = set_differences(rows, result.replicates, context.intervals.level)
        if differences:
            tables.append(Table("differences between sets of one kind (paired; each pair's interval on its own, "
                                "not simultaneous)", list(differences[0]), differences))
        if sets:
            tables.append(Table("what the sets are", list(sets[0]), sets))
        return Section(self.key, self.title, text, tables, list(result.figures))


def set_differences(rows: Sequence[dict[str, Any]], replicates: dict[str, Any], level: float) -> list[dict[str, Any]]:
    """Per detector, the AUROC difference of every two generated sets of one kind (e.g. a regularised set and
    its plain twin) with the interval of the paired difference: the ID test resamples are the same, and the
    sets' images are resampled by position (image i of two sets of one size share their weight; the sets
    of one generator pair, plain and regularised, share their seeds by position)."""
    differences = []
    by_detector: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] in ("near_ood", "shift") and row["auroc"] is not None and not row["set"].endswith(LABEL_KEPT):
            by_detector.setdefault((row["model"], row["confidence function"]), []).append(row)
    for (model, kappa), sets in by_detector.items():
        for i, first in enumerate(sets):
            for second in sets[i + 1:]:
                if first["kind"] != second["kind"]:
                    continue
                a = replicates.get(f"{model}|{kappa}|{first['set']}|auroc")
                b = replicates.get(f"{model}|{kappa}|{second['set']}|auroc")
                if a is None or b is None or a.numel() != b.numel():
                    continue
                low, high, significant = paired_difference(a, b, level)
                differences.append({"model": model, "κ": kappa, "set A": first["set"], "set B": second["set"],
                              "AUROC A − B": cell(first["auroc"] - second["auroc"], low, high),
                              "significant": "yes" if significant else "no"})
    return differences
