"""``evaluate.py evg`` (alias ``adversarial``; Yoon et al.; DESIGN.md §5.4): :class:`EvGEvaluation` builds the
detectors, the seed images (:class:`SeedInput`) and the search, and runs them through the
:class:`callbacks.EvGReport` callback (the chains, their resumption and the report are that callback's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from callbacks.evg import ENSEMBLE_SAMPLER, STANDARDISATION_SETS, VARY_AT, EvGReport, StandardiseOn, VaryAt
from datamodules.catalog import ood_context, real_ood_set
from datamodules.evaluation import fit_folder_set
from datamodules.evg import SEED_CHOICES, EvGData, SeedChoice
from datamodules.transforms import TensorPipeline
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataOptions, DetectorOptions, OutputOptions, WeightOptions
from evaluation_engine.outputs import check_output_dir, slug
from evaluation_engine.results import Estimate, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    check_detectors,
    default_fit_set,
    detector_pairs,
)
from evaluation_methods.generated import id_datamodule
from evaluation_methods.registry import (
    CardContext,
    Headline,
    Method,
    Section,
    Table,
    column_cell,
    register,
)
from lightning_modules.checkpoint import check_classes
from lightning_modules.evg import SAMPLERS, BlackBox, EvGSearch, build_variation
from lightning_modules.evg.black_box import VariedImages
from lightning_modules.evg.variations import variation_options
from lightning_modules.scoring import ScoringModel
from metrics.detectors import Detector


@dataclass(frozen=True)
class SeedInput:
    """What EvG's variations act on (:meth:`EvGEvaluation.seed_input`).

    Attributes:
        pipeline: raw OOD image -> seed image (``None``: the image at its own size).
        resize_ood: every OOD image, clean ones too, goes through ``pipeline`` first (``image_size``).
        varied_images: what the detectors get (:class:`lightning_modules.evg.BlackBox`): ``raw`` images
            (their own transform follows) or their ``model_input`` (only the normalisation follows).
        description: the rule in words, for the report.
    """

    pipeline: Callable[[Any], Tensor] | None
    resize_ood: bool
    varied_images: VariedImages
    description: str




@dataclass(kw_only=True, eq=False)
class EvGEvaluation(Evaluation, WeightOptions, DataOptions, DetectorOptions, OutputOptions):
    """``evaluate.py evg`` (alias ``adversarial``): EvG, the outliers each detector trusts most (Yoon et al.),
    found by MCMC over variation models of an OOD set; worst-case AUROC and MinRank next to the clean ones.

    The run has four steps, each explicit, in :meth:`EvGReport.evaluate`: the detectors that fit are fitted, the
    fixed sets are scored through the engine, :meth:`EvGSearch.fit_standardisation` fits each detector's energy on
    its ID validation (or, ``standardise_on: id_test``, ID test) scores, and the search's prediction loop runs the
    chains (resumable: finished batches are kept; a run's chains split into batches one way only).

    Attributes:
        model: the detectors' models (``timm:<name>``, ``torchvision:<name>``, checkpoints, ``ensemble:<members>``).
        ood: the OOD set: ``digits``, ``fashion:unknown``, ``fashion:<ids>`` or an image folder.
        image_size: the side every OOD image (the clean ones too) is first brought to (bilinear, antialiased),
            the variations then acting at it; default: none (see ``vary_at``).
        variation: variation models (:data:`lightning_modules.evg.VARIATIONS`): ``affine`` and ``colour`` (the
            authors' presets for the size the variations act at: affineV1 below 128 px, affineV2 from 128 px;
            colorV1; a preset whose translation reaches half the images' side is warned, naming both), the
            presets by name (``affineV0``-``affineV3``, ``colorV0``-``colorV2``), ``gan``, ``linf``.
        variation_args: per variation model, its arguments, e.g. ``{"affine": {"scale": [0.9, 1.2]}}``.
        gan: the generator of the ``gan`` variation: a plain GAN checkpoint of ``train.py`` trained on the OOD
            set, or a factory path ``pkg.mod:factory`` returning any module that maps latents ``(N, D)`` to
            ``[0, 1]`` images (e.g. a StyleGAN2 of your own); its options (``truncation``, ``latent_dim``,
            ``generator_args``) go in ``variation_args: {gan: ...}``.
        sampler: samplers (:data:`lightning_modules.evg.SAMPLERS`): mh (its start and ``steps`` proposals),
            random (``steps`` draws, as the authors' ``RandomSampler``), coordinate (the paper's Figure 2 finite
            difference, 2 calls per step), linf (its own 20,000 iterations, not ``steps``). Two or more give the
            ``eV1`` rows (:func:`sampler_ensemble`).
        sampler_args: per sampler, its arguments, e.g. ``{"mh": {"temperature": 1.0}}``.
        chains: chains per search (chain ``i`` varies seed image ``i mod N_seeds``; the seeds are
            ``min(chains, N_ood)`` OOD images chosen by ``seed_choice``).
        steps: the budget of each chain: MH's proposals, random search's draws (2000 in the paper).
        chains_per_batch: chains moved together (keep it to resume an interrupted run).
        seed: the run's seed (each chain's random numbers are keyed by it and the chain; it also chooses the
            seed images of a balanced choice).
        standardise_on: the ID scores that standardise the energy: ``id_val`` (the paper's text, default) or
            ``id_test`` (the authors' code, ``IN_score.pkl``). μ cancels in the MH acceptance; σ sets the
            effective temperature.
        trace_every: energy trace thinning (steps).
        intervals: level, bootstrap resamples and seed of the intervals (:class:`EvGReport`).
        vary_at: what the variations act on. ``data`` (default, the authors': ``cifar_vit_hf_md.yml`` warps
            the 32 px SVHN images with affineV1 for a 224 px ViT): the OOD images at their own size, each
            detector then taking the varied images through its own input transform, as every clean image (OOD
            images of several sizes, e.g. a folder of photographs, are brought to the detectors' common input
            first, as ``input``). ``input`` (this project's option): the detectors' common input (each seed
            through the models' transform, the variation after it, e.g. affineV2 at 224 px; needs
            ``image_size`` when their inputs differ). ``image_size`` overrides both.
        seed_choice: the seed images: ``balanced`` (default: seeded, balanced over the OOD set's classes) or
            ``first`` (the authors': the first ``min(chains, N_ood)`` images of the set; their scripts run
            1,000, ``attack.py --n_sample 1000``).
        data: the in-distribution data (validation standardises, test is the AUROC's positives): ``fashion``, a
            checkpoint (its datamodule) or a datamodule class path; default: the first checkpoint model's.
        batch_size: of the passes over the fixed sets (default 256).
        num_workers: data-loading workers of those passes (default 0).
        fit_data: the in-distribution training images of fitted detectors, ``<folder>/<class>/*`` with the model's
            classes (default: the ID datamodule's training split).
        output_dir: tables, figures and chain results (default ``runs/evg``).
        cache_dir: the cache of the fixed sets' passes (default: ``<output_dir>/cache``).

    The other options are the groups' (:class:`WeightOptions`, :class:`DataOptions`, :class:`DetectorOptions`,
    :class:`OutputOptions`).
    """

    command: ClassVar[str] = "evg"
    decodes_on_device: ClassVar[bool] = True

    model: Sequence[str]
    ood: str = "digits"
    image_size: int | None = None
    variation: Sequence[str] = ("affine", "colour")
    variation_args: dict[str, dict[str, Any]] | None = None
    gan: str | None = None
    sampler: Sequence[str] = ("mh", "random")
    sampler_args: dict[str, dict[str, Any]] | None = None
    chains: int = 1000
    steps: int = 2000
    chains_per_batch: int = 100
    seed: int = 0
    standardise_on: StandardiseOn = "id_val"
    trace_every: int = 10
    intervals: Intervals | None = None
    vary_at: VaryAt = "data"
    seed_choice: SeedChoice = "balanced"
    batch_size: int | None = 256
    num_workers: int | None = 0
    output_dir: str | None = "runs/evg"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.intervals = Intervals.of(self.intervals)
        if not self.model:
            raise ValueError("give at least one model (--model, or model: in --config)")
        for name in ("chains", "steps", "chains_per_batch", "trace_every", "batch_size"):
            if (getattr(self, name) or 0) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.image_size is not None and self.image_size < 8:
            raise ValueError(f"image_size must be at least 8, got {self.image_size}")
        unknown = sorted(set(self.sampler) - set(SAMPLERS))
        if unknown:
            raise ValueError(f"unknown samplers {unknown}; choose from {sorted(SAMPLERS)}")
        self.model, self.variation, self.variation_args = list(self.model), list(self.variation), \
            dict(self.variation_args or {})
        unknown = sorted(set(self.variation_args) - set(self.variation))
        if unknown:
            raise ValueError(f"variation_args for {unknown}, which are not among the variations {self.variation}")
        for name, options in self.variation_args.items():
            variation_options(name, options)  # by name and type, before any model is built or any pass runs
        self.sampler, self.sampler_args = list(self.sampler), dict(self.sampler_args or {})
        if self.standardise_on not in STANDARDISATION_SETS:
            raise ValueError(f"standardise_on must be one of {sorted(STANDARDISATION_SETS)}, got "
                             f"{self.standardise_on!r}")
        if self.vary_at not in VARY_AT:
            raise ValueError(f"vary_at must be one of {list(VARY_AT)}, got {self.vary_at!r}")
        if self.seed_choice not in SEED_CHOICES:
            raise ValueError(f"seed_choice must be one of {list(SEED_CHOICES)}, got {self.seed_choice!r}")

    def pairs(self, models: dict[str, ScoringModel]) -> list[tuple[ScoringModel, type[Detector], dict[str, Any]]]:
        """(model, κ, the κ's parameters) of every detector; a κ that pairs with no model, or a model with no κ,
        is refused."""
        return [(model, kappa, self.kappa_parameters[kappa.name])
                for model, kappa in detector_pairs(list(models.values()), self.detector_classes)]

    def detectors(self, pairs: Sequence[tuple[ScoringModel, type[Detector], dict[str, Any]]],
                  fitted: Mapping[tuple[int, str], Detector], varied_images: VariedImages = "raw") -> dict[str, BlackBox]:
        """The black box of each (model, κ): the fitted detector of a κ that fits (``fitted``, by (id(model), κ))."""
        detectors = [BlackBox(model, kappa, kappa_args=parameters, fitted=fitted.get((id(model), kappa.name)),
                              varied_images=varied_images) for model, kappa, parameters in pairs]
        return {detector.name: detector for detector in detectors}

    def seed_input(self, models: Sequence[ScoringModel], sizes: Sequence[tuple[int, int]]) -> SeedInput:
        """What the variations act on (see ``vary_at``), for models and seed images of ``sizes`` ``(H, W)``.

        Raises:
            ValueError: the variations would act at the detectors' common input, and their inputs differ
                (naming them): give ``image_size``.
        """
        if self.image_size is not None:
            channels = {m.model_input.channels for m in models}
            pipeline = TensorPipeline(self.image_size, channels.pop() if len(channels) == 1 else None)
            return SeedInput(pipeline, True, "raw", f"every OOD image (the clean ones too) first resized to "
                             f"{self.image_size}x{self.image_size} px (image_size, bilinear), the variations acting "
                             "there; each detector takes the varied images through its own input transform")
        if self.vary_at == "data" and len(sizes) == 1:
            height, width = sizes[0]
            return SeedInput(None, False, "raw", f"at the data's own size, {height}x{width} px (the authors'); each "
                             "detector takes the varied images through its own input transform, as every clean image")
        pipelines = {repr(m.model_input.pipeline): m.model_input.pipeline for m in models}
        if len(pipelines) > 1:
            inputs = {m.display_name: m.model_input.size for m in models}
            why = (f"the OOD images have several sizes ({', '.join(f'{h}x{w}' for h, w in sizes[:4])}, ...), so the "
                   "variations act at the detectors' common input, but " if self.vary_at == "data" else "")
            raise ValueError(f"{why}the detectors take images of other inputs ({inputs}): give image_size, the side "
                             "every OOD image is brought to first (each detector then takes the varied images "
                             "through its own input transform)")
        size = next(iter(models)).model_input.size
        reason = ("vary_at: input" if self.vary_at == "input" else
                  f"the OOD images have several sizes ({', '.join(f'{h}x{w}' for h, w in sizes[:4])})")
        return SeedInput(next(iter(pipelines.values())), False, "model_input",
                         f"at the detectors' common input ({'x'.join(map(str, size)) if size else 'their size'} px; "
                         f"{reason}): each seed through the models' transform, the variation after it")

    def run(self) -> MethodResult | None:
        models = {spec: self.scoring_model(spec, pretrained=not self.random_weights) for spec in dict.fromkeys(self.model)}
        for model in models.values():
            if not model.ensemble:  # its weights are stacked buffers; channels-last convolutions: oneDNN (CPU)
                model.network.to(memory_format=torch.channels_last)  # runs the demo's CNN about 1.6x faster
        pairs = self.pairs(models)  # a κ that pairs with no model is refused before any pass
        datamodule = id_datamodule(self.data, self.data_args, models=list(models.values()))
        data = EvGData(id_val=datamodule.evaluation_set("val", role="id_val", known_only=True),
                       id_test=datamodule.evaluation_set("test", role="id_test", known_only=True),
                       ood=real_ood_set(self.ood, **ood_context(datamodule)), classes=datamodule.class_names,
                       batch_size=self.batch_size, num_workers=self.num_workers)
        for model in models.values():
            check_classes(model.classes, data.classes, model=model.display_name, data="the ID data of EvG", subset=True)
        fit_set = None
        if any(k.fit_data for k in self.detector_classes):
            fit_set = fit_folder_set(self.fit_data, data.classes) if self.fit_data else default_fit_set(datamodule)
        for model, kappa, _ in pairs:
            check_detectors([kappa], model, fit_set)
        if self.chains > len(data["ood"]):
            print(f"{self.chains} chains on {len(data['ood'])} OOD images: chain i varies image i mod "
                  f"{len(data['ood'])}, so each image seeds up to {-(-self.chains // len(data['ood']))} chains")
        seed_indices = data.seed_indices(self.chains, self.seed, choice=self.seed_choice)
        seed_input = self.seed_input(list(models.values()), data.seed_sizes(seed_indices))
        if seed_input.resize_ood:  # the clean OOD images are the chains' unvaried images
            data = data.through(seed_input.pipeline)
        seeds = data.seed_images(seed_indices, None if seed_input.resize_ood else seed_input.pipeline)
        print(f"EvG varies the OOD images {seed_input.description}")
        generator = self.gan if self.gan and "gan" in self.variation else None  # a checkpoint or pkg.mod:factory
        variations = {name: build_variation(name, self.variation_args.get(name), seed_shape=tuple(seeds.shape[1:]),
                                            generator=generator) for name in self.variation}

        def search(fitted: Mapping[tuple[int, str], Detector]) -> EvGSearch:  # the detectors that fit, fitted
            return EvGSearch(self.detectors(pairs, fitted, seed_input.varied_images), variations,
                             {s: self.sampler_args.get(s, {}) for s in self.sampler}, seeds, steps=self.steps,
                             seed=self.seed, trace_every=self.trace_every)

        check_output_dir(self.output_dir)
        report = EvGReport(data, chains=self.chains, output_dir=self.output_dir, cache_dir=self.cache_dir,
                           plots=self.plots, seed_indices=seed_indices, seed_choice=self.seed_choice, seed=self.seed,
                           vary_at=seed_input.description, standardise_on=self.standardise_on,
                           precision=self.options.precision,
                           passes=self.scoring_passes(Path(self.output_dir) / "cache" if self.cache_dir is None
                                                      else self.cache_dir),
                           intervals=self.intervals, fit_set=fit_set, fit=self.fit,
                           allow_fit_overlap=self.allow_fit_overlap)
        result = Runner.launch(self.options, lambda runner: report.evaluate(
            runner, pairs, search, chains_per_batch=self.chains_per_batch), name="evg")
        if result is None:  # the report (its rows, replicates, figures) is global rank zero's
            return None
        result.estimates = evg_estimates(result, self.intervals)
        sampler = headline_sampler(report.rows)
        for name, path in sorted(report.figures.items(), key=lambda item: item[1].name):
            if name.startswith("transfer_") and (path.stem.endswith(f"_{slug(sampler)}")
                                                 or sampler == ENSEMBLE_SAMPLER and path.stem.endswith("_mh")):
                result.figure(path.stem.replace("_", " "), path, "worst-case AUROC of each column's detector on the "
                              "worst cases found against each row's")
        grid_sampler = "mh" if "mh" in {r["sampler"] for r in report.rows} else sampler
        for name, path in sorted(report.figures.items(), key=lambda item: item[1].name):
            if name.startswith("grid/") and path.stem.endswith(f"__{slug(grid_sampler)}"):
                result.figure(path.stem.replace("__", " / "), path,
                              "the lowest-energy worst cases (each seed next to its worst case where conditional)")
        return result


def headline_sampler(rows: Sequence[dict[str, Any]]) -> str:
    """The sampler of the leaderboard: eV1 where several samplers ran, else the first."""
    samplers = {r["sampler"] for r in rows}
    return ENSEMBLE_SAMPLER if ENSEMBLE_SAMPLER in samplers else sorted(samplers)[0]


def evg_estimates(result: MethodResult, intervals: Intervals) -> list[Estimate]:
    """The leaderboard's numbers: per detector the lowest worst-case AUROC and MinRank over the variations (of
    the eV1 rows where several samplers ran, else of the variation's one sampler), resample by resample; MinRank's
    interval is Wilson's of the count of ID test images (conditional on the searches)."""
    rows = result["rows"]
    chosen: dict[tuple[str, str], str] = {}
    for row in rows:
        pair = (row["detector"], row["variation"])
        if pair not in chosen or row["sampler"] == ENSEMBLE_SAMPLER:
            chosen[pair] = row["sampler"]
    per_detector: dict[str, list[tuple[dict[str, Any], Tensor | None, Tensor | None]]] = {}
    for row in rows:
        key = f"{row['detector']}|{row['variation']}|{row['sampler']}"
        if row["sampler"] == chosen[(row["detector"], row["variation"])]:
            per_detector.setdefault(row["detector"], []).append(
                (row, result.replicates.get(f"{key}|worst_auroc"), result.replicates.get(f"{key}|min_rank")))
    estimates = []
    for detector, entries in per_detector.items():
        model, _, kappa = detector.rpartition("/")
        for headline, column, index in (("evg_worst", "worst-case auroc", 1), ("evg_min_rank", "min rank", 2)):
            value = min(e[0][column] for e in entries)
            reps = [e[index] for e in entries]
            # the minimum over the variations, resample by resample (the same resamples for every variation)
            replicate = torch.stack(reps).min(dim=0).values if all(r is not None for r in reps) else None
            if headline == "evg_min_rank":  # conditional on the searches: a count of ID images, Wilson's
                bounds = intervals.count(int(value), int(entries[0][0]["id test images"]))
            else:
                bounds = intervals.bounds(replicate) if replicate is not None else (None, None)
            chains = min(int(e[0]["chains"]) for e in entries)  # a pooled GAN eV1 row counts samplers × chains
            # the units: the ID test and seed images (their digest), and how many chains searched them
            notes = dict.fromkeys(e[0][FIT_OVERLAP] for e in entries if e[0].get(FIT_OVERLAP))
            estimates.append(Estimate(model, kappa, headline, value, *bounds, replicate,
                                  f"{result.units}|{chains} chains, {entries[0][0]['id test images']} ID test images",
                                  fit_overlap="; ".join(notes)))
    return estimates


EVG_UNIT = ("seed images (a chain's weight is its seed's) + ID test images; MinRank: ID test images, the worst cases "
            "held fixed")


@register
class EvGMethod(Method):
    """Adversarial generation of outliers (Yoon et al.): per detector the worst case over the variations."""

    key, evaluation = "evg", EvGEvaluation
    title, name, group = "Adversarial generation of outliers, EvG (Yoon et al.)", "EvG adversarial outliers", "EvG"
    unit = EVG_UNIT
    headlines = (
        Headline("evg_worst", "worst-case AUROC", "evg", True,
                 "ID test vs each chain's worst case, the lowest over the variations (eV1 where several samplers ran)"),
        Headline("evg_min_rank", "MinRank", "evg", True,
                 "ID test images scoring above the most trusted worst case, the lowest over the variations", digits=0,
                 proportion=False),
    )

    def section(self, results: Any, context: CardContext) -> Section:
        (result,) = results.values()
        table = [{"detector": row["detector"], "variation": row["variation"],
                  "sampler": row["sampler"] + (f" ({row['eV1 of']})" if row.get("eV1 of") else ""),
                  "chains": row["chains"], "clean AUROC": column_cell(row, "clean auroc"),
                  "worst-case AUROC": column_cell(row, "worst-case auroc"), "MinRank": column_cell(row, "min rank"),
                  "clean MinRank": row["clean min rank"],
                  **({FIT_OVERLAP: row.get(FIT_OVERLAP, "")} if any(r.get(FIT_OVERLAP) for r in result["rows"])
                     else {})} for row in result["rows"]]
        return Section(self.key, self.title, (
            "Metropolis-Hastings (and the other samplers) over affine, colour and GAN-latent variations of the OOD "
            "set find, per chain, the outlier each detector trusts most. Worst-case AUROC: ID test vs the chains' "
            "worst cases; MinRank: how many ID test images score above the most trusted one (0: an outlier beats "
            f"every ID image). Leaderboard: the lowest over the variations, of the {ENSEMBLE_SAMPLER} rows where "
            "several samplers ran (a variation searched by one sampler: its row). "
            "Intervals: the clean and worst-case AUROC's (chains of one seed image clustered); MinRank conditional "
            "on the search (Wilson's interval of the count of ID test images above the fixed worst case; the "
            f"bootstrap of a maximum over chains does not cover). Resampled: {self.unit}."),
            [Table("results", list(table[0]) if table else [], table)], list(result.figures))
