"""The OOD report card: one page per run of one or several models across the four methods, with a confidence
interval on every number (``evaluate.py report``).

A researcher asks "how good is this model at saying I don't know?" and gets one answer with its uncertainty:

- **runs** every method the configuration's data allow, each through its own typed evaluation (the same code
  as ``evaluate.py oscr | severity | generated | evg``, so numbers equal the commands' own): open-set OSCR for
  every checkpoint of ``train.py`` (its protocol's test set: negatives and unknowns), the severity levels of
  each (model, κ), the generated near-OOD and shifted sets next to real ones, and EvG over the chosen
  variations. Every method shares the run's scoring passes (:class:`evaluation_engine.scoring.ScoringPasses`, one
  sharded pass per (model, data set), kept in memory and in ``cache_dir``): a pass another method or an
  earlier run already made is never run again, and the report states for every pass whether it was run or
  reused (``passes`` in ``report.json``). EvG resumes the chain results of its ``output_dir``.
- **intervals**: each method computes its intervals with the right resampling unit
  (:class:`evaluation_engine.outputs.Intervals`: images, ID and OOD separately, for AUROC, CCR and ECE; classes within
  each severity level and ID images; chains and ID images for worst-case AUROC and MinRank) and keeps the
  bootstrap replicates (``replicates.pt``). Resamples depend only on (seed, unit, size), so two detectors
  scored on the same images are resampled alike and their difference is paired.
- **leaderboard**: one row per (model, κ) with the headline numbers of each method (:data:`HEADLINES`),
  each with its interval; per column the best row is marked, every other row is compared with it from the
  paired replicates (the interval of the difference; ``significant`` when it excludes 0), and every row gets
  the probability of ranking first over the resamples. Then one section per method with its tables and
  plots (OSCR curves, AUROC by severity level with interval bands, generated grids, worst-case grids and
  the transfer heat-maps).
- **writes** ``<output_dir>/index.html`` (self-contained: images inline, tables sortable without external
  scripts), ``report.md``, ``report.json`` (every number with its interval, the versions, the data
  fingerprints, the passes, the command) and the same tables and images to one W&B run.

From Python, :func:`report` returns the leaderboard rows the page shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import inspect
import json
import math
import os
import platform
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from pytorch_lightning.utilities.rank_zero import rank_zero_only
from torch import Tensor

from callbacks.evg import ENSEMBLE_SAMPLER
from callbacks.generated import LABEL_KEPT
from evaluation_engine.intervals import DETECTION_METRICS, Intervals
from evaluation_engine.outputs import check_output_dir, read_replicates, read_units, slug
from evaluation_engine.plots import plot_severity
from evaluation_engine.run import Evaluation, TrainerOptions, make_logger
from evaluation_engine.scoring import ScoringPasses
from evaluation_methods.evg import EvGEvaluation
from evaluation_methods.generated import GeneratedEvaluation
from evaluation_methods.open_set import OSCREvaluation
from evaluation_methods.severity import SeverityEvaluation
from lightning_modules.scoring import ScoringModel
from metrics import get_kappa, pairs_with, seed_mean, seed_mean_replicates, share_first, worse_than_best
from metrics.intervals import paired_difference
from openset_common import atomic_write_text, file_sha256, typed_arguments

SECTIONS: dict[str, type[Evaluation]] = {"oscr": OSCREvaluation, "severity": SeverityEvaluation,
                                         "generated": GeneratedEvaluation, "evg": EvGEvaluation}
METHOD_OF = {"oscr": "open_set", "severity": "severity", "generated": "generated", "evg": "evg"}
TITLES = {"open_set": "Open-set recognition (Palechor et al.)", "severity": "C-OOD severity levels (Galil et al.)",
          "generated": "Generated near-OOD and shifted sets (Mukhoti et al.)",
          "evg": "Adversarial generation of outliers, EvG (Yoon et al.)"}
TRAINER_KEYS = {f.name for f in dataclasses.fields(TrainerOptions)}
# keys a section's own config file may not set: the report card's models, κ and trainer are every section's
REPORT_KEYS = {"model", "kappa", *TRAINER_KEYS}
UNITS = {"open_set": "test images (knowns, negatives, unknowns resampled separately)",
         "severity": "the pool's classes (keyed by pool index) + ID images",
         "generated": "images (ID test and the set resampled separately)",
         "evg": "seed images (a chain's weight is its seed's) + ID test images; MinRank: ID test images, the "
                "worst cases held fixed"}
PAGE_FILES = ("index.html", "report.md", "report.json")


@dataclasses.dataclass(frozen=True)
class Headline:
    """A leaderboard column: ``key``, its title, the method, whether higher is better, what it is."""

    key: str
    title: str
    method: str
    higher_is_better: bool
    description: str


HEADLINES = (
    Headline("oscr_ccr", "CCR@FPR 0.1 unknowns", "open_set", True,
             "correct classification rate of the knowns at FPR 0.1 on the protocol's unknown classes (exact "
             "convention); the maximum softmax probability, so on the softmax rows of train.py checkpoints"),
    Headline("oscr_auroc", "AUROC unknowns", "open_set", True,
             "knowns vs the protocol's unknown classes, maximum softmax probability"),
    Headline("severity_mean", "mean AUROC", "severity", True,
             "OOD AUROC averaged over the severity levels built for this (model, κ)"),
    Headline("severity_hardest", "hardest level", "severity", True,
             "OOD AUROC of the hardest severity level (the classes this (model, κ) trusts most)"),
    Headline("near_ood", "near-OOD", "generated", True, "ID test vs the first generated near-OOD set"),
    Headline("shift", "shift", "generated", True, "ID test vs the first generated shifted set"),
    Headline("real_ood", "real OOD", "generated", True, "ID test vs the first real OOD set"),
    Headline("evg_worst", "worst-case AUROC", "evg", True,
             "ID test vs each chain's worst case, the lowest over the variations (eV1 where several samplers ran)"),
    Headline("evg_min_rank", "MinRank", "evg", True,
             "ID test images scoring above the most trusted worst case, the lowest over the variations"),
)


@dataclasses.dataclass
class ModelSeeds:
    """Several training runs of one recipe (their checkpoints, one per training seed), reported as one model.

    The leaderboard shows the mean over the seeds with an interval that combines the sampling of the test
    data and the seeds (:func:`metrics.seed_mean`: between-seed variance over S plus the test sampling the
    seeds share; the quantile of a t on S - 1 degrees of freedom for the seeds plus a normal for the shared
    test sampling); each seed's own numbers are in the
    sections and in the "training seeds" table. In YAML: ``model: [{name: eos, seeds: [a.ckpt, b.ckpt,
    c.ckpt]}]``.

    Attributes:
        name: the model's name on the card.
        seeds: at least two model specs (checkpoints of ``train.py``, ``timm:``, ``ensemble:``), one per seed.
    """

    name: str
    seeds: list[str]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a model of several seeds needs a name, got {self.name!r}")
        if isinstance(self.seeds, str) or not all(isinstance(s, str) for s in self.seeds):
            raise ValueError(f"model {self.name}: seeds must be a list of model specs, got {self.seeds!r}")
        if len(set(self.seeds)) < 2:
            raise ValueError(f"model {self.name}: a mean over seeds needs at least two different runs, got "
                             f"{list(self.seeds)}")


DETECTION_HEADERS = ("FPR@95TPR", "AUPR-In", "AUPR-Out")


def detection_cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """The detector metrics beside the AUROC of a method's table row, as the card's cells (empty where the row
    has none: an ID row, a table of before)."""
    return {header: cell(row.get(column), row.get(f"{column} low"), row.get(f"{column} high"))
            for header, column in zip(DETECTION_HEADERS, DETECTION_METRICS, strict=True)}


class ReportCard(Evaluation):
    """``evaluate.py report``: one OOD report card of one or several models across the four methods, with a
    confidence interval on every number, as one self-contained page, Markdown, JSON and W&B.

    See the module docstring for what it runs, compares and writes.

    Args:
        model: the models: checkpoints of ``train.py``, ``timm:<name>``, ``torchvision:<name>``,
            ``ensemble:<members>``, or :class:`ModelSeeds` (``{name: eos, seeds: [a.ckpt, b.ckpt]}``: several
            training runs of one recipe as one model).
        kappa: the confidence functions; each is paired with the models it applies to (ensemble κ with
            ensembles); a κ that pairs with no model is refused. A section may give its own ``kappa``.
        kappa_args: per κ, its arguments.
        oscr, severity, generated, evg: the sections to run, each the options of that method's command
            (``evaluate.py <method> --help``) without the models, checked by type before anything runs;
            ``config: FILE`` takes them from that command's YAML (its ``model``, ``kappa`` and trainer options
            left out; a relative FILE in a ``--config`` file is read relative to that file), keys next to it
            override it. ``oscr: {}`` runs OSCR for every checkpoint model on its own protocol. A section left
            out (``null``) is not run.
        output_dir: the report folder (each section's folders inside it unless the section names its own).
        cache_dir: the run's cache of scoring passes (``None``: in memory for the run only).
        intervals: level, bootstrap resamples, seed and AUROC method of every interval (a mapping of them
            from Python).
        title: the page's title.
        random_weights: timm/torchvision models without pretrained weights (tests).
        plots: write the figures.
        fit_data: the in-distribution training images of fitted detectors (Mahalanobis, KNN, ViM, ReAct, ...):
            ``<folder>/<class>/*`` with the models' classes; default: a checkpoint's training split.
        fit: per κ, the cap of its fit set (``{"knn": {"fraction": 0.01}}``), for every section.
    """

    command = "report"

    def __init__(self, model: Sequence[str | ModelSeeds], kappa: str | Sequence[str] = ("softmax",),
                 kappa_args: dict[str, dict[str, Any]] | None = None, oscr: dict[str, Any] | None = None,
                 severity: dict[str, Any] | None = None, generated: dict[str, Any] | None = None,
                 evg: dict[str, Any] | None = None, output_dir: str = "runs/report", cache_dir: str | None = "runs/cache",
                 intervals: Intervals | None = None, title: str | None = None, random_weights: bool = False,
                 plots: bool = True, fit_data: str | None = None, fit: dict[str, dict[str, Any]] | None = None,
                 *, trainer: TrainerOptions | None = None) -> None:
        super().__init__(trainer=trainer)
        self.fit_data, self.fit = fit_data, dict(fit or {})
        if not model:
            raise ValueError("give at least one model (--model, or model: in --config)")
        specs, self.groups = _model_specs([model] if isinstance(model, (str, ModelSeeds, Mapping)) else model)
        self.model = specs
        self.kappa = [kappa] if isinstance(kappa, str) else list(kappa)
        self.kappa_args = dict(kappa_args or {})
        for name in self.kappa:
            get_kappa(name)  # an unknown κ is named before anything runs
        self.sections = {name: section for name, section in
                         (("oscr", oscr), ("severity", severity), ("generated", generated), ("evg", evg))
                         if section is not None}
        if not self.sections:
            raise ValueError("the report has no section: give at least one of oscr, severity, generated, evg")
        self.output_dir, self.cache_dir = Path(output_dir), cache_dir
        self.intervals = Intervals.of(intervals)
        self.title, self.random_weights, self.plots = title, random_weights, plots
        self.passes: ScoringPasses | None = None
        self.command_line = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""
        self.section_options = {name: self._options(name, section) for name, section in self.sections.items()}
        self._check_pairs()

    def _check_pairs(self) -> None:
        """Refuse, before anything runs, a κ that pairs with no model of the card and an OSCR section without a
        checkpoint of ``train.py``, as the other commands refuse them."""
        ensembles = [spec.startswith("ensemble:") for spec in self.model]
        for where, names in [("kappa", self.kappa)] + [(f"{s}.kappa", o["kappa"]) for s, o in
                                                       self.section_options.items() if "kappa" in o]:
            names = [names] if isinstance(names, str) else list(names)
            for name in names:
                if not any(pairs_with(get_kappa(name), ensemble=e) for e in ensembles):
                    kind = "an ensemble (ensemble:FILE)" if pairs_with(get_kappa(name), ensemble=True) else "a single model"
                    raise ValueError(f"{where}: the confidence function {name!r} pairs with no model of the report "
                                     f"(it needs {kind}; the models: {self.model})")
        if "oscr" in self.sections and not any(_is_checkpoint(spec) for spec in self.model):
            raise ValueError(f"report section oscr needs a classifier checkpoint of train.py (its protocol's test "
                             f"set: negatives and unknowns); the models are {self.model}")

    # -- configuration ----------------------------------------------------------------------------

    def _options(self, name: str, section: Mapping[str, Any]) -> dict[str, Any]:
        """A section's options: its ``config`` file's (without the report's keys), then its own keys; every key
        and value checked against the method's command (names and types) before anything runs."""
        if not isinstance(section, Mapping):
            raise ValueError(f"report section {name} must be a mapping of {name}'s options, got {section!r}")
        options: dict[str, Any] = {}
        if section.get("config") is not None:
            path = Path(section["config"])
            if not path.is_file():
                raise FileNotFoundError(f"report section {name}: its config {path} does not exist")
            loaded = yaml.safe_load(path.read_text()) or {}
            if not isinstance(loaded, Mapping):
                raise ValueError(f"report section {name}: {path} is not a YAML mapping of options")
            options.update({k: v for k, v in loaded.items() if k not in REPORT_KEYS})
        options.update({k: v for k, v in section.items() if k != "config"})
        accepted = set(inspect.signature(SECTIONS[name].__init__).parameters) - {"self", "trainer"}
        unknown = sorted(set(options) - accepted - {"kappa"})
        if unknown:
            raise ValueError(f"report section {name}: {unknown} are not options of evaluate.py "
                             f"{SECTIONS[name].command} (its options: {sorted(accepted - {'model'})})")
        if "model" in options:
            raise ValueError(f"report section {name}: the models are the report's (model:), not a section's")
        # the types, as the command's parser checks them (a word where a number is expected names the key)
        typed_arguments(SECTIONS[name], {k: v for k, v in options.items() if k != "intervals"},
                        what=f"report section {name}")
        if "intervals" in options:
            options["intervals"] = Intervals.of(options["intervals"])
        return options

    def _evaluation(self, name: str, model: Any, kappa: Sequence[str] | None, output_dir: Path) -> Evaluation:
        cls = SECTIONS[name]
        accepted = set(inspect.signature(cls.__init__).parameters)
        options = dict(self.section_options[name])
        options["output_dir"] = str(output_dir)  # the caller's choice: the section's folder or one inside it
        defaults = {"intervals": self.intervals, "plots": self.plots,
                    "random_weights": self.random_weights, "kappa_args": self.kappa_args, "cache_dir": self.cache_dir}
        if kappa is not None:
            options.setdefault("kappa", list(kappa))
        kappas = options.get("kappa", self.kappa)
        kappas = [kappas] if isinstance(kappas, str) else list(kappas)
        defaults["fit_data"] = self.fit_data
        defaults["fit"] = {k: v for k, v in self.fit.items() if k in kappas}  # the section's own κ only
        for key, value in defaults.items():
            if key in accepted:
                options.setdefault(key, value)
        # one W&B run for the whole report: the sections do not open their own
        evaluation = cls(model=model, **options,
                         trainer=dataclasses.replace(self.options, wandb_mode="disabled"))
        evaluation.shared_passes = self.passes
        return evaluation

    def _kappas(self, section: str, model: ScoringModel) -> list[str]:
        names = self.section_options[section].get("kappa", self.kappa)
        return [k for k in names if pairs_with(get_kappa(k), ensemble=bool(model.ensemble))]

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        check_output_dir(self.output_dir)
        models = {spec: ScoringModel(spec, pretrained=not self.random_weights) for spec in self.model}
        names = {spec: m.display_name for spec, m in models.items()}
        self.members = {group: [names[spec] for spec in specs] for group, specs in self.groups.items()}
        clash = sorted(set(self.groups) & set(names.values()))
        if clash:
            raise ValueError(f"the models of several seeds {clash} are named like another model of the report")
        self.passes = ScoringPasses(self.cache_dir)
        # every section's evaluation built first: options and output folders checked before anything runs
        plan: list[tuple[str, Any, Evaluation, Path]] = []
        if "oscr" in self.sections:
            for spec in self.model:
                if _is_checkpoint(spec):
                    folder = self._folder("oscr") / slug(names[spec])
                    plan.append(("open_set", names[spec], self._evaluation("oscr", spec, None, folder), folder))
        if "severity" in self.sections:
            for spec in self.model:
                kappas = self._kappas("severity", models[spec])
                if kappas:
                    folder = self._folder("severity") / slug(names[spec])
                    plan.append(("severity", names[spec], self._evaluation("severity", spec, kappas, folder), folder))
        for section in ("generated", "evg"):
            if section in self.sections:
                folder = self._folder(section)
                plan.append((section, None, self._evaluation(
                    section, list(self.model), self.section_options[section].get("kappa", self.kappa), folder), folder))
        for *_, folder in plan:
            check_output_dir(folder)
        if rank_zero_only.rank == 0:
            mark_stale(self.output_dir)  # until the card is written whole, a page there is an old one
        found: dict[str, Any] = {}
        for method, name, evaluation, folder in plan:
            result = evaluation.run()
            if method == "open_set":
                found.setdefault(method, {})[name] = folder
            elif method == "severity":
                found.setdefault(method, {})[name] = (folder, result)
            else:
                found[method] = (folder, result)
        if rank_zero_only.rank != 0:  # every process ran the sections; global rank zero writes the card
            return []
        card = self.assemble(found, models=list(models.values()))
        from report_card.page import write_page

        paths = write_page(card, self.output_dir)
        self._wandb(card)
        print(f"\nReport card written to {paths['html']} ({self._pass_summary()})")
        print(leaderboard_text(card))
        self.card = card
        return card["leaderboard"]["rows"]

    def _folder(self, section: str) -> Path:
        """A section's folder: its own ``output_dir``, else ``<report>/<method>``."""
        return Path(self.section_options[section].get("output_dir") or self.output_dir / METHOD_OF[section])

    def _pass_summary(self) -> str:
        log = self.passes.log if self.passes is not None else []
        run = sum(entry["source"] == "run" for entry in log)
        return f"{run} model passes run, {len(log) - run} reused from memory or the cache"

    # -- the card ---------------------------------------------------------------------------------

    def assemble(self, found: dict[str, Any], *, models: Sequence[ScoringModel]) -> dict[str, Any]:
        """The report (the schema of :mod:`report_card.page`) from the sections' results and files."""
        cells: dict[tuple[str, str], dict[str, tuple]] = {}
        rows_order: list[tuple[str, str]] = []
        for model in models:
            for name in self.kappa:
                if pairs_with(get_kappa(name), ensemble=bool(model.ensemble)):
                    rows_order.append((model.display_name, name))
        sections = []

        def put(model: str, kappa: str, key: str, value: Any, low: Any, high: Any, replicates: Tensor | None,
                units: str = "") -> None:
            """One headline number; ``units`` names the resampled units it was measured on (data fingerprints):
            only rows of the same units are compared (their resamples are paired)."""
            if (model, kappa) not in rows_order:
                rows_order.append((model, kappa))
            cells.setdefault((model, kappa), {})[key] = (_number(value), _number(low), _number(high), replicates,
                                                         units)

        if "open_set" in found:
            sections.append(self._open_set_section(found["open_set"], put))
        if "severity" in found:
            sections.append(self._severity_section(found["severity"], put))
        if "generated" in found:
            sections.append(self._generated_section(*found["generated"], put))
        if "evg" in found:
            sections.append(self._evg_section(*found["evg"], put))
        if self.groups:
            sections.append(self._seeds_section(cells, rows_order))
        for section in sections:  # the page and the JSON name images relative to the report folder
            for image in section["images"]:
                image["path"] = os.path.relpath(Path(image["path"]).resolve(), self.output_dir.resolve())
        columns = [h for h in HEADLINES if any(h.key in c for c in cells.values())]
        rows = [{"model": m, "kappa": k, "cells": {}} for m, k in rows_order]
        for column in columns:
            entries = [(row, cells.get((row["model"], row["kappa"]), {}).get(column.key)) for row in rows]
            compare_column(entries, column, self.intervals)
        shown = [m.display_name for m in models if not any(m.display_name in v for v in self.members.values())]
        return {
            "title": self.title or "OOD report card: " + ", ".join([*self.groups, *shown]),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": self.command_line,
            "level": self.intervals.level, "resamples": self.intervals.resamples, "seed": self.intervals.seed,
            "comparison": {"method": COMPARISON_METHOD, "level": self.intervals.level,
                           "controls": "per column, family-wise", "not controlled": "across columns"},
            "versions": versions(),
            "models": [{"name": m.display_name, "source": m.spec, "sha256": _sha256(m.spec),
                        "seed of": next((g for g, v in self.members.items() if m.display_name in v), None)}
                       for m in models],
            "data": self._data(),
            "passes": list(self.passes.log) if self.passes is not None else [],
            "leaderboard": {"columns": [dataclasses.asdict(c) for c in columns], "rows": rows},
            "sections": sections,
            "notes": self._notes(found, models),
        }

    def _seeds_section(self, cells: dict[tuple[str, str], dict[str, tuple]],
                       rows_order: list[tuple[str, str]]) -> dict[str, Any]:
        """Each model of several seeds: its members' headline numbers combined into one row (:func:`metrics.seed_mean`)
        in ``cells`` (the members' own rows leave the leaderboard), and the table of every seed's number."""
        table = []
        members_of = {name: group for group, names in self.members.items() for name in names}
        for group, names in self.members.items():
            for kappa in dict.fromkeys(k for m, k in rows_order if m in names):
                for headline in HEADLINES:
                    entries = [cells.get((name, kappa), {}).get(headline.key) for name in names]
                    if any(e is None or e[0] is None for e in entries):
                        continue
                    row = {"model": group, "κ": kappa, "metric": headline.title,
                           **{f"seed {i + 1}": e[0] for i, e in enumerate(entries)}}
                    usable = (all(e[3] is not None for e in entries) and len({e[3].numel() for e in entries}) == 1
                              and len({e[4] for e in entries}) == 1
                              and int(torch.stack([e[3] for e in entries]).isfinite().all(dim=0).sum()) >= 2)
                    if not usable:
                        continue
                    estimates = torch.tensor([e[0] for e in entries], dtype=torch.float64)
                    replicates = torch.stack([e[3].double() for e in entries])
                    combined = seed_mean(estimates, replicates, self.intervals.level)
                    low, high = combined.low, combined.high
                    if headline.key != "evg_min_rank":  # AUROC, CCR: within [0, 1]
                        low, high = max(0.0, low), min(1.0, high)
                    else:
                        low = max(0.0, low)
                    stream = self.intervals.seed + zlib.crc32(f"{group}|{kappa}|{headline.key}".encode())
                    cells.setdefault((group, kappa), {})[headline.key] = (
                        combined.value, low, high, seed_mean_replicates(estimates, replicates, seed=stream),
                        entries[0][4])
                    table.append({**row, "mean": cell(combined.value, low, high), "between-seed sd": combined.std,
                                  "shared test variance": combined.shared, "dof": combined.dof})
                if (group, kappa) not in rows_order and (group, kappa) in cells:
                    first = next(i for i, (m, k) in enumerate(rows_order) if m in names and k == kappa)
                    rows_order.insert(first, (group, kappa))
        rows_order[:] = [(m, k) for m, k in rows_order if m not in members_of]
        seeds = max((len(v) for v in self.members.values()), default=0)
        return {"method": "seeds", "title": "Models of several training seeds", "text": (
            "Each model below is several training runs of one recipe. The leaderboard shows the mean over its seeds "
            "with an interval that combines the sampling of the test data and the seeds: the between-seed variance "
            "over S plus the test-sampling variance the seeds share (the bootstrap covariance of their replicates "
            "over the same resamples); the interval's half-width is the quantile of a Student t on S − 1 degrees "
            "of freedom (the seeds' part, estimated from S numbers) plus a normal (the shared test sampling), a "
            "one-way random-effects model (metrics.seed_mean; Satterthwaite's t under-covers with three seeds). "
            "Each seed's own numbers are in the method sections."),
            "tables": [{"title": "every seed", "columns": ["model", "κ", "metric", *[f"seed {i + 1}" for i in
                                                                                    range(seeds)],
                                                          "mean", "between-seed sd", "shared test variance", "dof"],
                        "rows": table}], "images": []}

    def _data(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for entry in self.passes.log if self.passes is not None else []:
            seen.setdefault(entry["fingerprint"], {"name": entry["set"], "role": entry["role"],
                                                   "fingerprint": entry["fingerprint"], "samples": entry["samples"]})
        return list(seen.values())

    def _notes(self, found: dict[str, Any], models: Sequence[ScoringModel]) -> list[str]:
        notes = [f"{self.intervals.describe()}; every other number: percentile bootstrap over its resampling unit.",
                 "What the intervals cover: the sampling of the test data (images, classes, chains) for one trained "
                 "model, not the variance over training runs; a model given as several seeds adds that (its "
                 "section says how).",
                 f"{SIGNIFICANT_TEXT}",
                 "The small number beside a leaderboard value is the share of resamples in which the row ranks first: "
                 "not a probability of being the best, it favours the observed leader (with equal true values the "
                 "observed leader still ranks first in most resamples).",
                 f"Passes: {self._pass_summary()}."]
        if "open_set" in found:
            skipped = [m.display_name for m in models if m.display_name not in found["open_set"]]
            if skipped:
                notes.append(f"OSCR needs a checkpoint of train.py (its protocol's test set): not run for "
                             f"{', '.join(skipped)}.")
        if "severity" in found:
            pools = {read_units(folder).get("*", "") for folder, _ in found["severity"].values()}
            notes.append("Severity levels are built per (model, κ), so two rows' levels hold different classes; rows "
                         "measured on the same pool and ID test set are compared on the same resamples (a pool class "
                         "has one weight in every level and row)"
                         + ("." if len(pools) <= 1 else "; the models here use different severity data, and rows of "
                            "different data are not compared."))
        return notes

    # -- sections ---------------------------------------------------------------------------------

    def _open_set_section(self, folders: dict[str, Path], put: Any) -> dict[str, Any]:
        table, images = [], []
        for model, folder in folders.items():
            metrics = json.loads((folder / "metrics.json").read_text())
            intervals = metrics.get("intervals", {})
            replicates = read_replicates(folder)
            units = read_units(folder).get("*") or json.dumps(metrics.get("counts", {}), sort_keys=True)
            for name, value in sorted(metrics["scalars"].items()):
                low, high = intervals.get(name, (None, None))
                table.append({"model": model, "metric": name, "value": cell(value, low, high)})
            for key, scalar in (("oscr_ccr", "unknowns/ccr@fpr=0.1"), ("oscr_auroc", "unknowns/auroc")):
                if scalar in metrics["scalars"]:
                    low, high = intervals.get(scalar, (None, None))
                    put(model, "softmax", key, metrics["scalars"][scalar], low, high, replicates.get(scalar), units)
            images += [{"title": f"{model}: {title}", "path": str(folder / file), "caption": caption}
                       for file, title, caption in (
                           ("oscr_curves.png", "OSCR curves", "CCR against FPR (log axis), negatives and unknowns"),
                           ("score_histograms.png", "score histograms",
                            "true-class score of the knowns vs maximum score of negatives and unknowns"))
                       if (folder / file).is_file()]
        return {"method": "open_set", "title": TITLES["open_set"], "text": (
            "Every number of the open-set test report of each checkpoint on its protocol's test set: CCR at each "
            "FPR target on negatives (-1, seen in training) and unknowns (-2, never seen), the AUROC of knowns vs "
            f"each group, closed-set accuracy and γ. Intervals: resampling unit {UNITS['open_set']}."),
            "tables": [{"title": "open-set report", "columns": ["model", "metric", "value"], "rows": table}],
            "images": images}

    def _severity_section(self, found: dict[str, tuple[Path, dict[str, list[dict]]]], put: Any) -> dict[str, Any]:
        summary, levels, lines = [], [], {}
        for model, (folder, tables) in found.items():
            replicates = read_replicates(folder)
            units = read_units(folder).get("*", "")  # the ID test set and the pool: rows of the same data are paired
            for kappa, rows in tables.items():
                aurocs = [r["ood-auroc"] for r in rows]
                mean, hardest = replicates.get(f"{kappa}/mean"), replicates.get(f"{kappa}/hardest")
                mean_bounds = self.intervals.bounds(mean) if mean is not None else (None, None)
                put(model, kappa, "severity_mean", sum(aurocs) / len(aurocs), *mean_bounds, mean, units)
                put(model, kappa, "severity_hardest", aurocs[-1], rows[-1].get("ood-auroc low"),
                    rows[-1].get("ood-auroc high"), hardest, units)
                summary.append({"model": model, "κ": kappa,
                                "mean AUROC": cell(sum(aurocs) / len(aurocs), *mean_bounds),
                                "hardest level": cell(aurocs[-1], rows[-1].get("ood-auroc low"),
                                                      rows[-1].get("ood-auroc high")),
                                "easiest level": cell(aurocs[0], rows[0].get("ood-auroc low"),
                                                      rows[0].get("ood-auroc high")),
                                **{f"hardest {k}": v for k, v in detection_cells(rows[-1]).items()},
                                "empty resamples": int(torch.isnan(mean).sum()) if mean is not None else ""})
                levels.append({"model": model, "κ": kappa, **{
                    f"level {r['severity level']}": cell(r["ood-auroc"], r.get("ood-auroc low"), r.get("ood-auroc high"))
                    for r in rows}})
                lines[f"{model} / {kappa}"] = rows
        images = []
        if self.plots and lines:
            path = plot_severity(lines, self.output_dir / "severity_auroc.png",
                                 title=f"OOD AUROC by severity level ({self.intervals.level:.0%} intervals)")
            images.append({"title": "AUROC by severity level", "path": str(path),
                           "caption": "level 0 = easiest, the last level = hardest; bands: the class-resampled intervals"})
        level_columns = ["model", "κ", *[k for k in (levels[0] if levels else {}) if k.startswith("level ")]]
        return {"method": "severity", "title": TITLES["severity"], "text": (
            "For each (model, κ) the OOD classes are sorted by the model's mean κ on their estimation images and "
            "grouped into severity levels of |Y_ID| classes each (level 0: the easiest to detect; the last: the "
            "classes the model trusts most). Each level's AUROC is ID test vs that level's test images. "
            f"Intervals: resampling unit {UNITS['severity']} (a level is a group of classes; a class has one weight "
            "in every level and row of a resample). Empty resamples: those in which every class of some level drew "
            "0 (no AUROC there), left out of the mean's interval."),
            "tables": [{"title": "summary", "columns": ["model", "κ", "mean AUROC", "hardest level", "easiest level",
                                                        *[f"hardest {h}" for h in DETECTION_HEADERS],
                                                        "empty resamples"],
                        "rows": summary},
                       {"title": "AUROC per level", "columns": level_columns, "rows": levels}],
            "images": images}

    def _generated_section(self, folder: Path, result: dict[str, Any], put: Any) -> dict[str, Any]:
        replicates = read_replicates(folder)
        rows = result["detectors"]
        first: dict[str, str] = {}
        for row in rows:
            if not row["set"].endswith(LABEL_KEPT):
                first.setdefault(row["kind"], row["set"])
        table = []
        for row in rows:
            key = f"{row['model']}|{row['confidence function']}|{row['set']}"
            for headline, kind in (("near_ood", "near_ood"), ("shift", "shift"), ("real_ood", "real_ood")):
                if first.get(kind) == row["set"] and row["auroc"] is not None:
                    put(row["model"], row["confidence function"], headline, row["auroc"], row.get("auroc low"),
                        row.get("auroc high"), replicates.get(f"{key}|auroc"), f"{row['set']}:{row['images']}")
            table.append({"model": row["model"], "κ": row["confidence function"], "set": row["set"],
                          "kind": row["kind"], "images": row["images"],
                          "AUROC": cell(row["auroc"], row.get("auroc low"), row.get("auroc high")),
                          "accuracy": cell(row.get("accuracy"), row.get("accuracy low"), row.get("accuracy high")),
                          "ECE": cell(row.get("ece"), row.get("ece low"), row.get("ece high")),
                          **detection_cells(row),
                          "shares generator ensemble": row.get("shares generator ensemble", "")})
        sets = [{k: v for k, v in r.items() if k in ("set", "kind", "images", "mean MI", "mean LPIPS to nearest ID",
                                                       "keeps ensemble label", "mode")} for r in result.get("sets", [])]
        images = [{"title": f"set {path.stem}", "path": str(path), "caption": "the first images of the set"}
                  for path in sorted((folder / "grids").glob("*.png"))]
        text = ("Detectors on the generated near-OOD and shifted sets next to the real ones: the AUROC of ID test "
                "vs each set, and on the shifted sets (and the ID test set, the baseline) the accuracy and ECE. "
                f"Headline columns: near-OOD = {first.get('near_ood', '—')}, shift = {first.get('shift', '—')}, "
                f"real OOD = {first.get('real_ood', '—')}. Intervals: AUROC DeLong, accuracy and ECE bootstrap; "
                f"resampling unit {UNITS['generated']}. A detector sharing the generators' training ensemble "
                "reports the generator's own objective back (flagged).")
        tables = [{"title": "detectors", "columns": ["model", "κ", "set", "kind", "images", "AUROC", *DETECTION_HEADERS,
                                                     "accuracy", "ECE", "shares generator ensemble"], "rows": table}]
        differences = self._set_differences(rows, replicates)
        if differences:
            tables.append({"title": "differences between sets of one kind (paired; each pair's interval on its own, "
                                    "not simultaneous)", "columns": list(differences[0]),
                           "rows": differences})
        if sets:
            tables.append({"title": "what the sets are", "columns": list(sets[0]), "rows": sets})
        return {"method": "generated", "title": TITLES["generated"], "text": text, "tables": tables, "images": images}

    def _set_differences(self, rows: Sequence[dict[str, Any]], replicates: dict[str, Tensor]) -> list[dict[str, Any]]:
        """Per detector, the AUROC difference of every two generated sets of one kind (e.g. a regularised set and
        its plain twin) with the interval of the paired difference: the ID test resamples are the same, and the
        sets' images are resampled by position (image i of two sets of one size share their weight; the sets
        of one generator pair, plain and regularised, share their seeds by position)."""
        found = []
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
                    low, high, significant = paired_difference(a, b, self.intervals.level)
                    found.append({"model": model, "κ": kappa, "set A": first["set"], "set B": second["set"],
                                  "AUROC A − B": cell(first["auroc"] - second["auroc"], low, high),
                                  "significant": "yes" if significant else "no"})
        return found

    def _evg_section(self, folder: Path, result: dict[str, Any], put: Any) -> dict[str, Any]:
        replicates = read_replicates(folder)
        units = read_units(folder).get("*", "")  # the ID test images and the seed images
        rows = result["rows"]
        samplers = {r["sampler"] for r in rows}
        headline_sampler = ENSEMBLE_SAMPLER if ENSEMBLE_SAMPLER in samplers else sorted(samplers)[0]
        # per (detector, variation) the eV1 row where several samplers ran, else the row of its one sampler
        chosen = {}
        for row in rows:
            pair = (row["detector"], row["variation"])
            if pair not in chosen or row["sampler"] == ENSEMBLE_SAMPLER:
                chosen[pair] = row["sampler"]
        table, per_detector = [], {}
        for row in rows:
            key = f"{row['detector']}|{row['variation']}|{row['sampler']}"
            sampler = row["sampler"] + (f" ({row['eV1 of']})" if row.get("eV1 of") else "")
            table.append({"detector": row["detector"], "variation": row["variation"], "sampler": sampler,
                          "chains": row["chains"],
                          "clean AUROC": cell(row["clean auroc"], row.get("clean auroc low"), row.get("clean auroc high")),
                          "worst-case AUROC": cell(row["worst-case auroc"], row.get("worst-case auroc low"),
                                                   row.get("worst-case auroc high")),
                          "MinRank": cell(row["min rank"], row.get("min rank low"), row.get("min rank high")),
                          "clean MinRank": row["clean min rank"]})
            if row["sampler"] == chosen[(row["detector"], row["variation"])]:
                per_detector.setdefault(row["detector"], []).append(
                    (row, replicates.get(f"{key}|worst_auroc"), replicates.get(f"{key}|min_rank")))
        for detector, entries in per_detector.items():
            model, _, kappa = detector.rpartition("/")
            for headline, column, index in (("evg_worst", "worst-case auroc", 1), ("evg_min_rank", "min rank", 2)):
                value = min(e[0][column] for e in entries)
                reps = [e[index] for e in entries]
                # the minimum over the variations, resample by resample (the same resamples for every variation)
                replicate = torch.stack(reps).min(dim=0).values if all(r is not None for r in reps) else None
                if headline == "evg_min_rank":  # conditional on the searches: a count of ID images, Wilson's
                    bounds = self.intervals.count(int(value), int(entries[0][0]["id test images"]))
                else:
                    bounds = self.intervals.bounds(replicate) if replicate is not None else (None, None)
                chains = min(int(e[0]["chains"]) for e in entries)  # a pooled GAN eV1 row counts samplers × chains
                put(model, kappa, headline, value, *bounds, replicate,
                    f"{units}|{chains} chains, {entries[0][0]['id test images']} ID test images")
        images = [{"title": path.stem.replace("_", " "), "path": str(path),
                   "caption": "worst-case AUROC of each column's detector on the worst cases found against each row's"}
                  for path in sorted(folder.glob("transfer_*.png")) if path.stem.endswith(f"_{slug(headline_sampler)}")
                  or headline_sampler == ENSEMBLE_SAMPLER and path.stem.endswith("_mh")]
        grid_sampler = "mh" if "mh" in samplers else headline_sampler
        images += [{"title": path.stem.replace("__", " / "), "path": str(path),
                    "caption": "the lowest-energy worst cases (each seed next to its worst case where conditional)"}
                   for path in sorted((folder / "grids").glob(f"*__{slug(grid_sampler)}.png"))]
        return {"method": "evg", "title": TITLES["evg"], "text": (
            "Metropolis-Hastings (and the other samplers) over affine, colour and GAN-latent variations of the OOD "
            "set find, per chain, the outlier each detector trusts most. Worst-case AUROC: ID test vs the chains' "
            "worst cases; MinRank: how many ID test images score above the most trusted one (0: an outlier beats "
            f"every ID image). Leaderboard: the lowest over the variations, of the {ENSEMBLE_SAMPLER} rows where "
            "several samplers ran (a variation searched by one sampler: its row). "
            "Intervals: the clean and worst-case AUROC's (chains of one seed image clustered); MinRank conditional "
            "on the search (Wilson's interval of the count of ID test images above the fixed worst case; the "
            f"bootstrap of a maximum over chains does not cover). Resampled: {UNITS['evg']}."),
            "tables": [{"title": "results", "columns": list(table[0]) if table else [], "rows": table}],
            "images": images}

    # -- W&B --------------------------------------------------------------------------------------

    def _wandb(self, card: dict[str, Any]) -> None:
        from pytorch_lightning.loggers import WandbLogger

        logger = make_logger(self.options, name="report-card")
        if not isinstance(logger, WandbLogger):
            return
        columns = ["model", "kappa"] + [f"{c['key']}{suffix}" for c in card["leaderboard"]["columns"]
                                        for suffix in ("", " low", " high", " share_first")]
        data = []
        for row in card["leaderboard"]["rows"]:
            values: list[Any] = [row["model"], row["kappa"]]
            for column in card["leaderboard"]["columns"]:
                found = row["cells"].get(column["key"]) or {}
                values += [found.get("value"), found.get("low"), found.get("high"), found.get("share_first")]
            data.append(values)
        logger.log_table(key="report/leaderboard", columns=columns, data=data)
        for section in card["sections"]:
            for table in section["tables"]:
                logger.log_table(key=f"report/{section['method']}/{slug(table['title'])}", columns=table["columns"],
                                 data=[[flat(row.get(c)) for c in table["columns"]] for row in table["rows"]])
            for image in section["images"]:
                if Path(image["path"]).is_file():
                    logger.log_image(key=f"report/{section['method']}/{slug(image['title'])}", images=[image["path"]])
        logger.experiment.finish()


def report(model: str | ModelSeeds | Sequence[str | ModelSeeds], kappa: str | Sequence[str] = ("softmax",), *,
           trainer: TrainerOptions | None = None, **options: Any) -> list[dict[str, Any]]:
    """The report card from Python: the leaderboard rows the page shows (``{"model", "kappa", "cells": {column:
    {"value", "low", "high", "best", "significant", "share_first", "unit"}}}``); the files are written as by
    ``evaluate.py report``. ``options`` are :class:`ReportCard`'s (``severity={...}``, ``output_dir=...``)."""
    single = isinstance(model, (str, ModelSeeds, Mapping))
    return ReportCard([model] if single else list(model), [kappa] if isinstance(kappa, str) else list(kappa),
                      trainer=TrainerOptions.of(trainer), **options).run()


# -- comparisons ----------------------------------------------------------------------------------


def compare_column(entries: Sequence[tuple[dict[str, Any], Any]], column: Headline, intervals: Intervals) -> None:
    """Fill each row's cell of one leaderboard column: the value, its interval, ``best``, ``significant`` (worse
    than the best row, simultaneously over the column: :func:`metrics.worse_than_best` over the rows measured
    on the same units as the best row, at the card's level) and ``share_first`` (the share of resamples in
    which the row ranks first, where every row shares the units)."""
    present = [(row, entry) for row, entry in entries if entry is not None and entry[0] is not None]
    if not present:
        return
    sign = 1.0 if column.higher_is_better else -1.0
    _, best = max(present, key=lambda item: sign * item[1][0])
    tied = {id(row) for row, entry in present if entry[0] == best[0]}  # equal values share the best mark
    # the family: rows measured on the same units as the best row, with replicates over the same resamples
    family = [(row, entry) for row, entry in present
              if _units(entry) == _units(best) and entry[3] is not None and best[3] is not None
              and entry[3].numel() == best[3].numel() and entry[3].numel() > 1]
    worse: dict[int, bool] = {}
    if len(family) > 1:
        flags = worse_than_best(torch.tensor([e[0] for _, e in family], dtype=torch.float64),
                                torch.stack([e[3].double().flatten() for _, e in family]), intervals.level,
                                higher_is_better=column.higher_is_better)
        worse = {id(row): bool(flag) for (row, _), flag in zip(family, flags, strict=True)}
    shares: dict[int, float] = {}
    if len(family) == len(present):
        stacked = torch.stack([e[3].double().flatten() for _, e in family]) if family else torch.empty(0, 0)
        stacked = stacked[:, ~torch.isnan(stacked).any(dim=0)] if family else stacked
        if family and stacked.shape[1]:
            shares = {id(row): float(p) for (row, _), p in zip(
                family, share_first(stacked, higher_is_better=column.higher_is_better), strict=True)}
    for row, (value, low, high, *_) in present:
        row["cells"][column.key] = {"value": value, "low": low, "high": high, "best": id(row) in tied,
                                    "significant": worse.get(id(row), False), "share_first": shares.get(id(row)),
                                    "unit": UNITS[column.method]}


def _units(entry: tuple) -> str:
    return entry[4] if len(entry) > 4 else ""


def _is_checkpoint(spec: str) -> bool:
    """A checkpoint of ``train.py`` (what OSCR needs: its protocol's test set)."""
    return spec.endswith(".ckpt") and not spec.startswith("ensemble:")


def _model_specs(entries: Sequence[Any]) -> tuple[list[str], dict[str, list[str]]]:
    """The model specs of the card (members of several-seed models included, each once) and the several-seed
    models by name."""
    specs: list[str] = []
    groups: dict[str, list[str]] = {}
    for entry in entries:
        if hasattr(entry, "as_dict"):  # jsonargparse's Namespace of a {name, seeds} entry
            entry = entry.as_dict()
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"name", "seeds"})
            if unknown:
                raise ValueError(f"a model of several seeds takes name and seeds, got also {unknown}")
            entry = ModelSeeds(**entry)
        if isinstance(entry, ModelSeeds):
            if entry.name in groups:
                raise ValueError(f"two models of several seeds are named {entry.name!r}")
            groups[entry.name] = list(dict.fromkeys(entry.seeds))
            specs += groups[entry.name]
        elif isinstance(entry, str):
            specs.append(entry)
        else:
            raise TypeError(f"a report model is a spec (checkpoint, timm:NAME, ensemble:FILE) or "
                            f"{{name, seeds}}, got {entry!r}")
    for group, members in groups.items():
        others = [g for g, m in groups.items() if g != group and set(m) & set(members)]
        if others:
            raise ValueError(f"models {group!r} and {others[0]!r} share a seed's run")
    return list(dict.fromkeys(specs)), groups


def mark_stale(folder: Path) -> None:
    """Mark the card a previous run left in ``folder`` as stale while a new one runs (a run killed midway leaves
    the mark): a banner at the top of ``index.html``, a first line in ``report.md``, ``"stale"`` in
    ``report.json``. A finished run writes all three anew."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = (f"STALE: a report card run over this folder started at {started} and has not finished; the numbers "
            "below are from an earlier run.")
    page = folder / "index.html"
    if page.is_file():
        content = page.read_text()
        if STALE_MARK not in content:
            content = content.replace("<body>", f'<body>\n<p class="stale" {STALE_MARK} style="background:#fdd;'
                                      f'padding:.5em;font-weight:bold">{text}</p>', 1)
            atomic_write_text(page, content)
    markdown = folder / "report.md"
    if markdown.is_file() and not markdown.read_text().startswith("**STALE"):
        atomic_write_text(markdown, f"**{text}**\n\n" + markdown.read_text())
    payload = folder / "report.json"
    if payload.is_file():
        try:
            report_json = json.loads(payload.read_text())
        except ValueError:
            report_json = None
        if isinstance(report_json, dict):
            report_json["stale"] = text
            atomic_write_text(payload, json.dumps(report_json, indent=2) + "\n")


STALE_MARK = 'data-stale="true"'
COMPARISON_METHOD = ("studentised bootstrap max-T over all pairs of rows, stepped down (Romano & Wolf 2005), "
                     "metrics.worse_than_best")
SIGNIFICANT_TEXT = ("▼ (significantly worse than the best row of its column) is a simultaneous statement over the "
                    "rows of that column compared on the same units: " + COMPARISON_METHOD + "; the chance that any "
                    "▼ of a column is false is at most 1 − the card's level. Not controlled: marks across columns "
                    "(each column is its own family).")


def cell(value: Any, low: Any = None, high: Any = None) -> dict[str, Any] | Any:
    """A table cell with its interval (the page's Cell), or the plain value where it has none."""
    if value is None or isinstance(value, str):
        return value
    return {"value": _number(value), "low": _number(low), "high": _number(high), "best": False,
            "significant": False, "share_first": None, "unit": ""}


def flat(value: Any) -> Any:
    """A W&B cell: a Cell as "value [low, high]", numbers as they are."""
    if isinstance(value, dict):
        if value.get("low") is None:
            return value.get("value")
        return f"{value['value']:.4f} [{value['low']:.4f}, {value['high']:.4f}]"
    return value


def leaderboard_text(card: dict[str, Any]) -> str:
    """The leaderboard as plain text for the terminal."""
    columns = card["leaderboard"]["columns"]
    lines = []
    for row in card["leaderboard"]["rows"]:
        parts = []
        for column in columns:
            found = row["cells"].get(column["key"])
            if found and found.get("value") is not None:
                digits = 0 if column["key"] == "evg_min_rank" else 3
                interval = (f" [{found['low']:.{digits}f}, {found['high']:.{digits}f}]"
                            if found.get("low") is not None else "")
                mark = " (best)" if found["best"] else (" (worse)" if found["significant"] else "")
                parts.append(f"{column['method']} {column['title']} {found['value']:.{digits}f}{interval}{mark}")
        lines.append(f"  {row['model']} / {row['kappa']}: " + "; ".join(parts))
    return "\n".join(lines)


def _number(value: Any) -> float | None:
    if value is None or value == "":
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _sha256(spec: str) -> str | None:
    path = Path(spec.removeprefix("ensemble:"))
    return file_sha256(path) if path.is_file() else None


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("openset-bench", "torch", "torchvision", "pytorch-lightning", "torchmetrics", "timm", "numpy",
                    "scikit-learn", "wandb"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


__all__ = ["HEADLINES", "Headline", "ModelSeeds", "ReportCard", "compare_column", "mark_stale", "report"]
