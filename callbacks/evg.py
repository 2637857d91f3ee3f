"""The report of EvG, the adversarial evaluation of OOD detectors (Yoon et al.; DESIGN.md §5.4).

:meth:`EvGReport.evaluate` runs an :class:`lightning_modules.evg.EvGSearch` in the processes of an
:class:`evaluation_engine.runner.Runner`:

1. :meth:`EvGReport.score_fixed_sets`: κ of every detector on the ID validation, ID test and clean OOD images, from the
   engine's scoring passes (one pass per model and set, whatever the number of κ of the model; sharded over
   the devices, every rank joins every gather, cached on disk). The command then fits each detector's
   energy standardisation on its **ID validation** scores (the paper's text; ``standardise_on: id_test``
   takes the ID test scores, as the authors' code did), explicitly (``EvGSearch.fit_standardisation``).
2. :meth:`EvGReport.run_chains`, the search's prediction loop (rank ``r`` of ``W`` runs the batches ``r, r + W, ...``):
   the results of a batch of chains are written at once (atomically) to
   ``chains/<run key>/chains-<first>-<last>.pt``; a resumed run with the same detectors, data, variation
   models, samplers and seed skips the batches found there (:meth:`done`).
3. the report (global rank zero, after every rank finished): per (detector, variation model, sampler)
   the clean AUROC (ID test vs the unmodified OOD test images), the worst-case AUROC (ID test vs each
   chain's lowest-energy image), MinRank of both, the acceptance rate and the step at which each chain
   found its minimum; the transferability matrices (worst cases found against detector A scored by
   detector B); the ``eV1`` rows of the samplers together (:func:`sampler_ensemble`, the authors'
   ``ensemble_attack.py``); ``results.csv`` / ``.md``, ``transfer_<variation>_<sampler>.csv`` / ``.md`` /
   ``.png``, worst-case grids (seed image, then its worst case), energy traces, ``worst_cases.pt`` (the worst
   cases' points, energies and κ of every detector) and ``clean_scores.pt`` (the κ of the fixed sets), from
   which every number of the tables is recomputed without a network; and the same to W&B.

What the variations act on (:meth:`evaluation_methods.evg.EvGEvaluation.seed_input`): by default the OOD images at their own size,
each detector taking the varied images through its own input transform, the one the passes apply to the ID
and clean OOD images (the authors'), so that the identity variation of a seed scores its clean score.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor, nn

from datamodules.evaluation import EvaluationSet
from datamodules.evg import SEED_RULES, ChainBatches, EvGData, SeedChoice, chain_ranges
from evaluation_engine.chains import ChainStore
from evaluation_engine.intervals import Intervals, interval_columns, with_bounds
from evaluation_engine.outputs import (
    log_images,
    log_table,
    markdown_table,
    metric_key,
    slug,
    write_csv,
    write_markdown,
    write_replicates,
    write_tables,
)
from evaluation_engine.plots import plot_energy_traces, plot_heatmap, save_image_grid
from evaluation_engine.results import MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    ScoringPasses,
    overlap_columns,
    write_fitted,
)
from metrics import auroc, min_rank
from metrics.auroc import weighted_auroc
from metrics.detectors import Detector
from metrics.evg import weighted_min_rank
from metrics.resampling import resample_weights
from openset_common.artefacts import atomic_write_bytes, atomic_write_text, digest, tensors_fingerprint

RESULT_COLUMNS = ("detector", "variation", "preset", "sampler", "eV1 of", "chains", "steps", "clean auroc",
                  "worst-case auroc", "clean min rank", "min rank", "seed auroc", "seed min rank", "id test images",
                  "ood test images", "seed images", "acceptance", "nan proposals", "mean step of minimum",
                  "mean start energy", "mean lowest energy", "varied", *interval_columns("clean auroc", "worst-case auroc", "min rank"))
SPLITS = ("id_val", "id_test", "ood")
VaryAt = Literal["data", "input"]
VARY_AT: tuple[str, ...] = get_args(VaryAt)


ENSEMBLE_SAMPLER = "eV1"  # the authors' released tables (ensemble_attack.py --ensemble V1) over the samplers run
AUTHORS_ENSEMBLE = ("mh", "random", "grad", "lgv")  # the samplers of their V1
StandardiseOn = Literal["id_val", "id_test"]
STANDARDISATION_SETS = {"id_val": "ID validation (the paper's text)", "id_test": "ID test (the authors' code)"}


def finite_worst(kappa: Tensor) -> Tensor:
    """The worst cases' κ without those of chains that never had a finite energy (every state NaN: a start
    deep in a region the detector cannot score); the ``nan proposals`` column counts them."""
    kept = kappa[~torch.isnan(kappa)]
    if kept.numel() == 0:
        raise RuntimeError("no chain of this search found an image the detector could score (every energy NaN)")
    return kept


def sampler_ensemble(results: dict[tuple[str, str, str], dict[str, Tensor]], *, pooled: Collection[str] = ()
                     ) -> dict[tuple[str, str, str], dict[str, Tensor]]:
    """The ``eV1`` row of each (detector, variation) searched by two samplers or more, as the authors'
    ``ensemble_attack.py`` (mode ``V1``) builds it.

    - An instance-conditioned variation (affine, colour, l∞): per chain, the result of the sampler whose
      worst case has the lowest energy (a NaN energy counts as +inf; ties go to the sampler run first; their
      ``min(score, dim=0)`` over the samplers' results of the same seed images). Its κ of every detector is
      that worst case's, so its worst-case AUROC and MinRank are at most each sampler's.
    - A variation in ``pooled`` (the unconditional GAN: chain ``i`` of one sampler and of another share
      nothing): every sampler's worst cases pooled, ``S·C`` of them (their ``torch.cat`` of the samplers'
      samples), in sampler order; ``sampler_choice`` says whose each is. Its worst-case AUROC is the mean of
      the samplers' (equal chain counts), its MinRank the lowest of theirs.

    The authors' ``V1`` holds the samplers mh, random, grad and lgv; this project has no gradient samplers, so a
    per-chain eV1 and every MinRank bound theirs from above (a pooled AUROC may move either way).
    """
    grouped: dict[tuple[str, str], list[str]] = {}
    for detector, variation, sampler in results:
        grouped.setdefault((detector, variation), []).append(sampler)
    combined: dict[tuple[str, str, str], dict[str, Tensor]] = {}
    for (detector, variation), samplers in grouped.items():
        if len(samplers) < 2:
            continue
        parts = [results[(detector, variation, s)] for s in samplers]
        chains = parts[0]["energy"].numel()
        keys = ("points", "energy", "best_step", "start_energy", "nan_proposals",
                *(k for k in parts[0] if k.startswith("kappa/")))
        merged: dict[str, Tensor] = {}
        if variation in pooled:
            for key in keys:
                if all(key in p for p in parts):
                    merged[key] = torch.cat([p[key] for p in parts])
            choice = torch.arange(len(parts)).repeat_interleave(chains)
            merged["chain"] = torch.arange(chains).repeat(len(parts))
        else:
            energies = torch.stack([p["energy"].double() for p in parts])
            choice = torch.nan_to_num(energies, nan=float("inf")).argmin(dim=0)  # first minimum: the earlier sampler
            index = torch.arange(chains)
            for key in keys:
                if key == "nan_proposals":  # every sampler's NaN proposals of the chain
                    if all(key in p for p in parts):
                        merged[key] = torch.stack([p[key] for p in parts]).sum(dim=0)
                elif all(key in p for p in parts):
                    merged[key] = torch.stack([p[key] for p in parts])[choice, index]
            merged["chain"] = index
        merged["acceptance"] = torch.full((choice.numel(),), float("nan"))
        merged["calls"] = torch.tensor(sum(int(p["calls"]) for p in parts))  # every sampler's calls, and NaNs
        merged["sampler_choice"] = choice
        merged["trace_steps"] = torch.zeros(0, dtype=torch.long)
        combined[(detector, variation, ENSEMBLE_SAMPLER)] = merged
    return combined


def ensemble_label(samplers: Sequence[str], *, pooled: bool) -> str:
    """What an ``eV1`` row holds, e.g. ``mh, random: per-chain minimum``."""
    return f"{', '.join(samplers)}: {'pooled samples' if pooled else 'per-chain minimum'}"


def _variation_config(variation: torch.nn.Module) -> dict[str, Any]:
    config = {k: v for k, v in vars(variation).items() if not k.startswith("_") and k != "training"
              and isinstance(v, (int, float, str, tuple, list, bool))}
    weights = dict(variation.named_parameters()) | dict(variation.named_buffers())
    return {"class": type(variation).__name__, **config, "weights": tensors_fingerprint(weights) if weights else ""}


class EvGReport:
    """See the module docstring.

    Args:
        data: the ID validation, ID test and OOD sets (:class:`datamodules.evg.EvGData`).
        chains: the number of chains of the run (the report checks that every one has a result).
        output_dir: where the tables, figures and chain results go.
        cache_dir: cache of the scoring passes over the fixed sets (``None``: ``<output_dir>/cache``).
        plots: write and log figures.
        grid_chains: worst cases shown per grid (the lowest energies first).
        passes: the run's scoring passes (shared with every other evaluation of the run).
        seed_indices: the OOD images the chains start from (indices into ``data["ood"]``; default: all of them,
            in order); their clean AUROC and MinRank are reported next to those of the whole OOD set.
        seed_choice: how they were chosen, ``balanced`` or ``first`` (:data:`datamodules.evg.SEED_RULES`).
        seed: the seed of a balanced choice (recorded in the report).
        vary_at: what the variations act on, in words (recorded in the report and its run key).
        standardise_on: the ID set whose κ standardise the energy (recorded in the report and the run key).
        precision: the run's precision (chains of another precision are another run).
        intervals: level, bootstrap resamples and seed of the intervals: the clean AUROC gets DeLong's (images),
            the worst-case AUROC and MinRank a percentile bootstrap whose units are the chains (each gives one
            worst case, an independent search) and the ID test images, resampled separately.
        fit_set: the in-distribution training images fitted detectors fit on, before the fixed sets are scored;
            the fitted detector is then a fixed black box of the search (its state is part of the run key).
        fit: per κ name, the cap of its fit set.
        allow_fit_overlap: run even when the fit set holds images of the fixed sets (ID validation, ID test, the
            OOD set the seeds come from): refused otherwise at ``setup``, before any pass; allowed, the rows of a
            fitted detector say so (``fit overlap``), and so do the transfer and standardisation tables.
    """

    def __init__(self, data: EvGData, *, chains: int, output_dir: str | Path, cache_dir: str | Path | None = None,
                 plots: bool = True, grid_chains: int = 32, passes: ScoringPasses | None = None,
                 seed_indices: Tensor | None = None, seed_choice: SeedChoice = "balanced", seed: int = 0,
                 vary_at: str = "", standardise_on: StandardiseOn = "id_val", precision: str = "32-true",
                 intervals: Intervals | None = None, fit_set: EvaluationSet | None = None,
                 fit: dict[str, dict[str, Any]] | None = None, allow_fit_overlap: bool = False) -> None:
        self.data, self.chains = data, chains
        self.fit_set, self.allow_fit_overlap = fit_set, allow_fit_overlap
        self.fit = {name: dict(options) for name, options in (fit or {}).items()}  # checked where the detector fits
        self.intervals = Intervals.of(intervals)
        self.replicates: dict[str, Tensor] = {}
        self._weight_cache: dict[tuple[int, int], Tensor] = {}
        self.seed_indices = (torch.arange(len(data["ood"])) if seed_indices is None else seed_indices).long().cpu()
        if seed_choice not in SEED_RULES:
            raise ValueError(f"seed_choice must be one of {sorted(SEED_RULES)}, got {seed_choice!r}")
        self.seed_choice, self.seed, self.vary_at = seed_choice, int(seed), vary_at
        self.standardise_on, self.precision = standardise_on, str(precision)
        self.output_dir = Path(output_dir)
        self.passes = passes if passes is not None else ScoringPasses(
            cache_dir if cache_dir is not None else self.output_dir / "cache")
        self.plots, self.grid_chains = plots, grid_chains
        self.scores: dict[str, dict[str, Tensor]] = {}
        self.rows: list[dict[str, Any]] = []
        self.units = ""  # the identity of the units the replicates resampled (ID test images, seed images)
        self.figures: dict[str, Path] = {}  # every figure written, by name (transfer_*, grid/*, trace/*)
        self.transfer: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        self._started = 0.0

    # -- the run's identity and its finished batches ----------------------------------------------

    def run_key(self, module: Any) -> str:
        """A digest of everything a chain's result depends on (the same in every process)."""
        seeds = module.seed_images
        return digest({
            "detectors": {name: [d.fingerprint(), d.kappa.name, d.kappa_args, d.background, d.model.model_input.key(),
                                 module.standardisation()[name], d.varied_images]
                          for name, d in module.detectors.items()},
            "variations": {name: _variation_config(v) for name, v in module.variations.items()},
            "samplers": module.sampler_args, "pairs": module.pairs, "steps": module.steps, "seed": module.seed,
            "trace_every": module.trace_every, "seed_images": tensors_fingerprint({"seeds": seeds}),
            "standardise_on": self.standardise_on, "standardisation_set": self.data[self.standardise_on].fingerprint(),
            "precision": self.precision, "vary_at": self.vary_at,
        })

    def store(self, module: Any) -> ChainStore:
        """The run's chain results (:class:`evaluation_engine.chains.ChainStore`), in ``chains/<run key>``."""
        if not hasattr(self, "_store"):
            self._store = ChainStore(self.output_dir / "chains" / self.run_key(module)[:16], self.chains)
        return self._store

    def chain_dir(self, module: Any) -> Path:
        return self.store(module).directory

    def check_batches(self, module: Any, bounds: Sequence[tuple[int, int]]) -> None:
        """:meth:`ChainStore.check_batches` of this run's store."""
        self.store(module).check_batches(bounds)

    def done(self, module: Any) -> Callable[[int, int], bool]:
        """``(first, stop) -> True`` when the batch of chains ``[first, stop)`` has a readable result."""
        return self.store(module).done

    # -- hooks ------------------------------------------------------------------------------------

    def check(self, kappas: Collection[type[Detector]]) -> None:
        """Refuse, before any pass, a fit set of the detectors that holds images of the fixed sets: the ID
        validation and test images, and the OOD set the chains' seeds are drawn from
        (:meth:`ScoringPasses.check_fit_overlap`)."""
        if any(kappa.fit_data for kappa in kappas):
            self.passes.check_fit_overlap(self.fit_set, self.data, allow=self.allow_fit_overlap)

    def evaluate(self, runner: Runner, pairs: Sequence[tuple[nn.Module, type[Detector], dict[str, Any]]],
                 search: Callable[[Mapping[tuple[int, str], Detector]], Any], *,
                 chains_per_batch: int) -> MethodResult | None:
        """The whole evaluation in ``runner``'s processes: the detectors that fit, fitted (:meth:`fit_detectors`)
        for ``search`` to build the search of their black boxes from; the fixed sets' κ (:meth:`score_fixed_sets`);
        each detector's energy standardisation on them; the chains not yet in :meth:`chain_dir`, in batches of
        ``chains_per_batch`` (:meth:`run_chains`); and the report (global rank zero). ``pairs``: (model, κ, its
        parameters) of every detector. Returns the rows, the transfer matrices, their replicates and units on
        global rank zero, ``None`` on the others."""
        module = search(self.fit_detectors(runner, pairs))
        self.score_fixed_sets(runner, module)
        module.fit_standardisation({name: scores[self.standardise_on] for name, scores in self.scores.items()})
        batches = ChainBatches(self.chains, chains_per_batch, done=self.done(module))
        # global rank zero's view of the finished batches for every rank (a rank that looked a moment later, after
        # another wrote a chain file, would run another loader or skip the barriers)
        batches.bounds = runner.broadcast(batches.bounds)
        self.check_batches(module, batches.all_bounds)
        skipped = [b for b in batches.all_bounds if b not in batches.bounds]
        if skipped and runner.is_global_zero:
            print(f"resuming: chains {chain_ranges(skipped)} have results in {self.chain_dir(module)} and are not rerun")
        if batches.bounds:
            self.run_chains(runner, module, batches)
        elif runner.is_global_zero:  # every chain has its result (a finished run, a report card): no search runs
            print(f"every chain has its result in {self.chain_dir(module)}: only the report is written")
            self.chain_dir(module).mkdir(parents=True, exist_ok=True)
            self._report(runner, module)
        if not runner.is_global_zero:  # the report (its rows, replicates, figures) is global rank zero's
            return None
        return MethodResult("evg", {"rows": self.rows, "transfer": self.transfer, "output_dir": self.output_dir},
                            folder=self.output_dir, replicates=self.replicates, units=self.units)

    def fit_detectors(self, runner: Runner, pairs: Sequence[tuple[nn.Module, type[Detector], dict[str, Any]]]
                      ) -> dict[tuple[int, str], Detector]:
        """Each (model, κ) whose κ fits, fitted on the fit set (one fit pass per model, through the engine):
        ``(id(model), κ name) -> fitted detector``, a fixed black box of the search from then on."""
        self.check([kappa for _, kappa, _ in pairs])
        batch = {"batch_size": self.data.batch_size, "num_workers": self.data.num_workers}
        fitting = [(model, kappa, parameters) for model, kappa, parameters in pairs if kappa.needs_fit]
        with runner.on_device(*dict.fromkeys(model for model, _, _ in fitting)), torch.no_grad():
            return {(id(model), kappa.name): self.passes.fitted_detector(
                runner, model, kappa, parameters, self.fit_set, fit=self.fit.get(kappa.name), **batch)
                for model, kappa, parameters in fitting}

    def score_fixed_sets(self, runner: Runner, module: Any) -> None:
        """κ of every detector of the search on the fixed sets (one pass per model and set, through the engine)."""
        batch = {"batch_size": self.data.batch_size, "num_workers": self.data.num_workers}
        models = list(dict.fromkeys(detector.model for detector in module.detectors.values()))
        with runner.on_device(*models):
            self.scores = {name: {split: self.passes.scores(runner, detector.model, self.data[split], detector.kappa,
                                                            detector.kappa_args, **batch) for split in SPLITS}
                           for name, detector in module.detectors.items()}

    def run_chains(self, runner: Runner, module: Any, batches: ChainBatches) -> None:
        """The search's prediction loop: rank ``r`` of ``W`` runs batches ``r, r + W, ...`` of
        :meth:`ChainBatches.loader` (every rank at least one), each written as it finishes; then, after every rank
        finished, the report on global rank zero."""
        if not self.scores:
            raise RuntimeError("EvGReport has no scores of the fixed sets: call score_fixed_sets first")
        module.check_standardised()
        self._started = time.perf_counter()
        self.chain_dir(module).mkdir(parents=True, exist_ok=True)
        loader = batches.loader(runner.world_size)
        with runner.on_device(module), torch.no_grad(), runner.forward_context():
            for index in range(runner.global_rank, len(loader.dataset), runner.world_size):
                outputs = module.predict_step(loader.dataset[index], index)
                first, stop = self.store(module).write(outputs)
                rank_zero_info(f"chains {first}-{stop - 1}: {len(outputs['results'])} searches done "
                               f"({time.perf_counter() - self._started:.1f} s since the start)")
        runner.barrier()  # every rank's chain files are written
        if runner.is_global_zero:
            self._report(runner, module)
        runner.barrier()

    # -- the report -------------------------------------------------------------------------------

    def assemble(self, module: Any) -> dict[tuple[str, str, str], dict[str, Tensor]]:
        """Every chain's result, per (detector, variation, sampler), ordered by chain index."""
        return self.store(module).assemble()

    def _report(self, runner: Runner, module: Any) -> None:
        out = self.output_dir
        marker = out / "report.json"
        marker.unlink(missing_ok=True)  # until the whole report is written again, it is not complete
        results = self.assemble(module)
        # the unconditional variations (the GAN): their eV1 pools the samplers' samples (ensemble_attack.py)
        pooled = {name for name, model in module.variations.items() if not getattr(model, "conditional", True)}
        results.update(sampler_ensemble(results, pooled=pooled))
        searched: dict[tuple[str, str], list[str]] = {}
        for detector, variation, sampler in results:
            if sampler != ENSEMBLE_SAMPLER:
                searched.setdefault((detector, variation), []).append(sampler)
        self.rows, self.transfer = [], {}
        for (detector, variation, sampler), result in results.items():
            scores = self.scores[detector]
            worst = finite_worst(result[f"kappa/{detector}"])
            seeds = scores["ood"][self.seed_indices]
            self.rows.append({
                "detector": detector, "variation": variation,
                "preset": getattr(module.variations[variation], "preset", None) or "", "sampler": sampler,
                "eV1 of": ensemble_label(searched[(detector, variation)], pooled=variation in pooled)
                if sampler == ENSEMBLE_SAMPLER else "",
                "chains": int(worst.numel()),
                "steps": int(result["calls"]), "clean auroc": auroc(scores["id_test"], scores["ood"]),
                "worst-case auroc": auroc(scores["id_test"], worst),
                "clean min rank": min_rank(scores["id_test"], scores["ood"]), "min rank": min_rank(scores["id_test"], worst),
                "seed auroc": auroc(scores["id_test"], seeds), "seed min rank": min_rank(scores["id_test"], seeds),
                "id test images": int(scores["id_test"].numel()), "ood test images": int(scores["ood"].numel()),
                "seed images": int(seeds.numel()),
                "acceptance": float(result["acceptance"].double().mean()),
                "nan proposals": int(result["nan_proposals"].sum()) if "nan_proposals" in result else 0,
                "mean step of minimum": float(result["best_step"].double().mean()),
                "mean start energy": float(result["start_energy"].double().mean()),
                "mean lowest energy": float(result["energy"].double().mean()),
                "varied": ", ".join(module.variations[variation].active_parameters),
            })
            note = self.passes.fit_notes(module.detectors[detector].fitted, self.data)  # an allowed overlap of its fit set
            if note:
                self.rows[-1][FIT_OVERLAP] = note
            self._intervals(self.rows[-1], scores, worst, ~torch.isnan(result[f"kappa/{detector}"]),
                            f"{detector}|{variation}|{sampler}",
                            conditional=getattr(module.variations[variation], "conditional", True))
            matrix = self.transfer.setdefault((variation, sampler), {})
            matrix[detector] = {other: auroc(self.scores[other]["id_test"], finite_worst(result[f"kappa/{other}"]))
                                for other in module.detectors}
        fitted = module.standardisation()
        result_columns = overlap_columns(RESULT_COLUMNS, self.rows)
        overlaps = "".join(f" Warning: {note}: the detector scored images it was fitted on."
                           for note in dict.fromkeys(r[FIT_OVERLAP] for r in self.rows if r.get(FIT_OVERLAP)))
        write_csv(out / "results.csv", self.rows, result_columns)
        # the units the replicates resample: the ID test images and the seed images (their identity, for the card)
        self.units = digest({"id_test": self.data["id_test"].fingerprint(), "ood": self.data["ood"].fingerprint(),
                             "seeds": [int(i) for i in self.seed_indices.tolist()]})
        write_replicates(out, self.replicates, self.intervals, units={"*": self.units})
        standardisation = "; ".join(f"{n}: mean {m:.4g}, scale {s:.4g}" for n, (m, s) in fitted.items())
        on = STANDARDISATION_SETS[self.standardise_on]
        notes = [n for n in (getattr(v, "size_note", "") for v in module.variations.values()) if n]
        write_markdown(out / "results.md", self.rows, result_columns, preamble=(
            f"Energy standardisation on {on} (-κ): {standardisation}. Seeds: {self.seed_rule()}. "
            + (f"Varied: {self.vary_at}. " if self.vary_at else "")
            + f"{ENSEMBLE_SAMPLER} (the authors' released tables, ensemble_attack.py): for the instance-conditioned "
            "variations, per chain the lowest energy over the samplers of its `eV1 of` column; for the unconditional "
            "GAN the samplers' samples pooled. The authors' eV1 also holds two gradient samplers (grad, lgv), not run "
            "here: a per-chain eV1 and every MinRank bound theirs from above (a pooled AUROC is the mean of the "
            "samplers' and may move either way). Seed auroc / seed min rank: the clean scores of exactly the seed "
            f"images. {self.intervals.describe()}: clean AUROC over the images; worst-case AUROC over the ID test "
            "images and the seed images (chains of one seed image are one unit: clustered); MinRank conditional on "
            "the search (the worst case held fixed: Wilson's interval of a count of ID test images)"
            + "".join(f". Warning: {note}" for note in notes) + ("." + overlaps if overlaps else "")))
        ood = self.data["ood"].dataset
        groups = getattr(ood, "source_classes", None)
        write_tables(out, "seeds", [{"seed": i, "ood index": int(index), "source class":
                                     int(groups[index]) if groups is not None else "",
                                     "chains": len(range(i, self.chains, len(self.seed_indices)))}
                                    for i, index in enumerate(self.seed_indices.tolist())],
                     ("seed", "ood index", "source class", "chains"), preamble=f"The seeds of the chains: {self.seed_rule()}")
        names = list(module.detectors)
        figures: dict[str, Path] = {}
        for (variation, sampler), matrix in self.transfer.items():
            columns = ("searched against", *names)
            rows = [{"searched against": a, **{b: matrix[a][b] for b in names}} for a in matrix]
            stem = f"transfer_{slug(variation)}_{slug(sampler)}"
            write_tables(out, stem, rows, columns, preamble="Worst-case AUROC of the detector of each column on the "
                         "worst cases found against the detector of each row" + ("." + overlaps if overlaps else ""))
            if self.plots:
                values = np.array([[matrix[a][b] for b in names] for a in matrix])
                figures[stem] = plot_heatmap(values, list(matrix), names, out / f"{stem}.png",
                                             title=f"transfer of worst cases: {variation}, {sampler}",
                                             row_label="searched against", column_label="scored by (AUROC)")
        buffer = io.BytesIO()
        seed_of_chain = self.seed_indices[torch.arange(self.chains) % len(self.seed_indices)]
        torch.save({f"{d}|{v}|{s}": {**{k: r[k] for k in ("points", "energy", "best_step", "sampler_choice", "chain")
                                        if k in r},
                                     "kappa": r[f"kappa/{d}"], **{k: r[k] for k in r if k.startswith("kappa/")},
                                     "seed_index": seed_of_chain[r["chain"]] if "chain" in r else seed_of_chain}
                    for (d, v, s), r in results.items()}, buffer)
        atomic_write_bytes(out / "worst_cases.pt", buffer.getvalue())
        # the clean κ every number above is computed from (ID validation, ID test, the OOD set): the report's
        # numbers can be recomputed from the files alone, without a pass through the networks
        buffer = io.BytesIO()
        torch.save({name: {split: kappa.cpu() for split, kappa in per_set.items()}
                    for name, per_set in self.scores.items()}, buffer)
        atomic_write_bytes(out / "clean_scores.pt", buffer.getvalue())
        # the fitted state of the run: the detectors' energy standardisation
        write_tables(out, "standardisation", [{"detector": n, "mean": m, "scale": s} for n, (m, s) in fitted.items()],
                     ("detector", "mean", "scale"), preamble=f"Energy = (-κ - mean) / scale, fitted on {on}" + ("." + overlaps if overlaps else ""))
        write_fitted(out, self.passes, [d.fitted for d in module.detectors.values() if d.fitted is not None])
        if self.plots:
            figures.update(self._figures(module, results))
        self.figures = dict(figures)
        runner.log_metrics({metric_key("predict", "evg", row["detector"], row["variation"], row["sampler"], name):
                              row[column] for row in self.rows for name, column in
                              (("auroc", "clean auroc"), ("worst_auroc", "worst-case auroc"), ("min_rank", "min rank"))})
        log_table(runner, metric_key("predict", "evg", "results"), self.rows, result_columns)
        log_images(runner, {metric_key("predict", "evg", name): path for name, path in figures.items()})
        # written last: a report without it (a run killed while writing) is rewritten whole by the next run
        atomic_write_text(marker, json.dumps({"run_key": self.run_key(module), "rows": self.rows,
                                              "standardise_on": self.standardise_on, "seeds": self.seed_rule(),
                                              "seed_choice": self.seed_choice, "vary_at": self.vary_at},
                                             indent=1, default=float) + "\n")
        rank_zero_info(f"\nEvG written to {out}\n" + markdown_table(self.rows, result_columns))

    def _weights(self, n: int, stratum: int) -> Tensor:
        """The bootstrap's resamples of ``n`` units (ID test images, or seed images), drawn once per report."""
        if (n, stratum) not in self._weight_cache:
            self._weight_cache[(n, stratum)] = resample_weights(n, self.intervals.resamples, self.intervals.seed,
                                                                stratum=stratum)
        return self._weight_cache[(n, stratum)]

    def _intervals(self, row: dict[str, Any], scores: dict[str, Tensor], worst: Tensor, kept: Tensor, key: str, *,
                   conditional: bool = True) -> None:
        """The intervals of one results row; the worst-case AUROC's and MinRank's replicates under ``key``.

        - worst-case AUROC: the units are the ID test images and the **seed images** (chain i varies seed
          ``i mod N_seeds``; chains that share a seed image are one unit; an unconditional variation, the GAN,
          has no seed image: each of its chains, or pooled samples, is its own unit): its interval is
          :meth:`Intervals.auroc` with the chains clustered by seed (Obuchowski's clustered DeLong), its
          replicates resample the seeds keyed by their index (chain i's weight is its seed's, the same for every
          detector, variation and sampler: paired; a chain without a finite energy keeps its seed and drops out);
        - MinRank: conditional on the search. The most trusted worst case is a maximum over the chains, whose
          bootstrap is invalid (Bickel & Freedman 1981: it covers E[MinRank] in about 60% of repetitions);
          held fixed, MinRank counts the ID test images above it, a binomial count: Wilson's interval, and
          replicates that resample the ID test images only."""
        options = self.intervals
        with_bounds(row, "clean auroc", options.auroc(scores["id_test"], scores["ood"]))
        num_seeds = len(self.seed_indices) if conditional else kept.numel()
        seed_of_chain = (torch.arange(kept.numel()) % num_seeds)[kept.cpu()]
        id_weights = self._weights(scores["id_test"].numel(), 0)
        chain_weights = self._weights(num_seeds, 1)[:, seed_of_chain]
        with_bounds(row, "worst-case auroc", options.auroc(scores["id_test"], worst, ood_clusters=seed_of_chain))
        self.replicates[f"{key}|worst_auroc"] = weighted_auroc(scores["id_test"], worst, id_weights,
                                                               chain_weights).double()
        with_bounds(row, "min rank", options.count(row["min rank"], scores["id_test"].numel()))
        held = torch.ones(id_weights.shape[0], worst.numel(), dtype=id_weights.dtype)
        self.replicates[f"{key}|min_rank"] = weighted_min_rank(scores["id_test"], worst, id_weights, held).double()

    def seed_rule(self) -> str:
        repeats = -(-self.chains // len(self.seed_indices))
        rule = SEED_RULES[self.seed_choice] + (f" (seed {self.seed})" if self.seed_choice == "balanced" else "")
        return (f"{len(self.seed_indices)} of {len(self.data['ood'])} OOD images, {self.seed_choice}: {rule}; "
                f"chain i varies seed i mod {len(self.seed_indices)}"
                + (f", each seed up to {repeats} chains" if repeats > 1 else ""))

    def _figures(self, module: Any, results: dict[tuple[str, str, str], dict[str, Tensor]]) -> dict[str, Path]:
        figures: dict[str, Path] = {}
        traces: dict[tuple[str, str], dict[str, tuple[Tensor, Tensor, Tensor]]] = {}
        for (detector, variation, sampler), result in results.items():
            model = module.variations[variation]
            shown = torch.argsort(result["energy"])[: self.grid_chains]  # the most trusted worst cases first
            chains = shown.to(module.device)
            with torch.no_grad():
                points = result["points"][shown].to(module.device)
                seeds = module.seeds_of(chains) if model.conditional else None
                worst = model(points, seeds).cpu()
            # conditional models: each seed image next to its worst case
            images = torch.stack([seeds.cpu(), worst], dim=1).flatten(0, 1) if seeds is not None else worst
            stem = f"{slug(detector)}__{slug(variation)}__{slug(sampler)}"
            figures[f"grid/{stem}"] = save_image_grid(images, self.output_dir / "grids" / f"{stem}.png")
            if result["trace_steps"].numel():  # eV1 has no trace of its own
                traces.setdefault((detector, variation), {})[sampler] = (
                    result["trace_steps"], result["trace_energy"], result["trace_best"])
        for (detector, variation), per_sampler in traces.items():
            stem = f"{slug(detector)}__{slug(variation)}"
            figures[f"trace/{stem}"] = plot_energy_traces(per_sampler, self.output_dir / "traces" / f"{stem}.png",
                                                          title=f"{detector}, {variation}")
        return figures


AdversarialReport = EvGReport  # the name of before, kept for one release


