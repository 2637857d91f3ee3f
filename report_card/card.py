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
- **leaderboard**: one row per (model, κ) with the headline numbers of each method (its
  :attr:`evaluation_methods.registry.Method.headlines`),
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
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pytorch_lightning.utilities.rank_zero import rank_zero_only

from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import (
    DetectorOptions,
    OutputOptions,
    WeightOptions,
    check_options,
    command_options,
    read_options,
)
from evaluation_engine.outputs import check_output_dir, slug
from evaluation_engine.runner import TrainerOptions
from evaluation_engine.scoring import ScoringPasses
from evaluation_methods.registry import (
    CardContext,
    MethodResult,
    Run,
    headlines,
    methods,
)
from lightning_modules.scoring import ScoringModel
from metrics import pairs_with
from report_card.costs import cost_section
from report_card.leaderboard import (
    COMPARISON_METHOD,
    SIGNIFICANT_TEXT,
    compare_column,
    leaderboard_text,
    seeds_section,
    two_seeds_note,
)
from report_card.provenance import (
    data_sets,
    fit_overlap_notes,
    fit_split_notes,
    mark_stale,
    model_sha256,
    versions,
)
from report_card.publish import log_card

TRAINER_KEYS = {f.name for f in dataclasses.fields(TrainerOptions)}
# keys a section's own config file may not set: the report card's models, κ and trainer are every section's
REPORT_KEYS = {"model", "kappa", *TRAINER_KEYS}
# the sections of an old name (kept for one release): the old key -> the method's key
RENAMED_SECTIONS = {"oscr": "open_set"}
PAGE_FILES = ("index.html", "report.md", "report.json")


@dataclasses.dataclass
class ModelSeeds:
    """Several training runs of one recipe (their checkpoints, one per training seed), reported as one model.

    The leaderboard shows the mean over the seeds with an interval that combines the sampling of the test
    data and the seeds (:func:`metrics.seed_mean`: between-seed variance over S plus the test sampling the
    seeds share; the quantile of a t on S - 1 degrees of freedom for the seeds plus a normal for the shared
    test sampling); each seed's own numbers are in the
    sections and in the "training seeds" table. In YAML: ``model: [{name: eos, seeds: [a.ckpt, b.ckpt,
    c.ckpt]}]``.

    The seeds must be runs of one recipe: the same kind (checkpoints of ``train.py``, or ensembles, not both),
    module class, architecture, loss, classes and data, as their specs say (:func:`seed_differences`); the card
    refuses others before any pass, naming the differing seeds and what differs. Two seeds are allowed with a
    warning: their interval's t on 1 degree of freedom makes it uninformative.

    Attributes:
        name: the model's name on the card.
        seeds: at least two model specs (checkpoints of ``train.py``, ``timm:``, ``ensemble:``), one per seed.
    """

    name: str
    seeds: list[str]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a model of several seeds needs a name, got {self.name!r}")
        if isinstance(self.seeds, str) or not isinstance(self.seeds, Sequence) or \
                not all(isinstance(s, str) for s in self.seeds):
            raise TypeError(f"model {self.name}: seeds must be a list of model specs (str), got {self.seeds!r}")
        if len(set(self.seeds)) < 2:
            raise ValueError(f"model {self.name}: a mean over seeds needs at least two different runs, got "
                             f"{list(self.seeds)}")
        # the kind is in the spec itself: refused before anything is read
        check_seed_recipes(self.name, list(dict.fromkeys(self.seeds)),
                           [{"kind": spec_kind(s)} for s in dict.fromkeys(self.seeds)])


@dataclass(kw_only=True, eq=False)
class ReportCard(Evaluation, WeightOptions, DetectorOptions, OutputOptions):
    """``evaluate.py report``: one OOD report card of one or several models across the four methods, with a
    confidence interval on every number, as one self-contained page, Markdown, JSON and W&B.

    See the module docstring for what it runs, compares and writes.

    Attributes:
        model: the models: checkpoints of ``train.py``, ``timm:<name>``, ``torchvision:<name>``,
            ``ensemble:<members>``, or :class:`ModelSeeds` (``{name: eos, seeds: [a.ckpt, b.ckpt]}``: several
            training runs of one recipe as one model).
        intervals: level, bootstrap resamples, seed and AUROC method of every interval (a mapping of them
            from Python).
        title: the page's title.
        sections: the sections to run, one per registered method by its key (``open_set``, ``severity``,
            ``generated``, ``evg``, and any plug-in's: :func:`evaluation_methods.registry.methods`), each the
            options of that method's command
            (``evaluate.py <method> --help``) without the models, checked by type before anything runs;
            ``config: FILE`` takes them from that command's YAML (its ``model``, ``kappa`` and trainer options
            left out; a relative FILE in a ``--config`` file is read relative to that file), keys next to it
            override it. ``open_set: {}`` (``oscr: {}``, its old spelling) runs OSCR for every checkpoint model on its own protocol. A section left
            out (``None``) is not run. On the command line and in YAML each section is an option of its own
            (``--severity '{num_levels: 5}'``, ``severity:``).
        kappa: the confidence functions, each paired with the models it applies to (ensemble κ with ensembles; a
            κ that pairs with no model is refused; a section may give its own ``kappa``); with ``kappa_args``,
            ``fit_data``, ``fit``, ``allow_fit_overlap``, for every section (:class:`DetectorOptions`).
        output_dir: the report folder (default ``runs/report``; each section's folders inside it unless the section
            names its own).
        cache_dir: the run's cache of scoring passes (default ``runs/cache``; ``None``: in memory for the run only).
    """

    command: ClassVar[str] = "report"
    decodes_on_device: ClassVar[bool] = True

    model: Sequence[str | ModelSeeds]
    intervals: Intervals | None = None
    title: str | None = None
    sections: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    output_dir: str | None = "runs/report"
    cache_dir: str | None = "runs/cache"

    def __post_init__(self) -> None:
        model = self.model
        check_model_type(model)
        if self.title is not None and not isinstance(self.title, str):
            raise TypeError(f"report: title must be a str, got {self.title!r} ({type(self.title).__name__})")
        self._check_types()
        super().__post_init__()
        if not model:
            raise ValueError("give at least one model (--model, or model: in --config)")
        specs, self.groups = _model_specs([model] if isinstance(model, (str, ModelSeeds, Mapping)) else model)
        self.model = specs
        registered = methods()
        self.sections = dict(self.sections)
        for old, new in RENAMED_SECTIONS.items():
            if self.sections.get(old) is not None:
                if self.sections.get(new) is not None:
                    raise ValueError(f"report sections {old!r} and {new!r} name one method: give {new!r} only")
                warnings.warn(f"the report section {old!r} is now {new!r} (kept for one release)", FutureWarning,
                              stacklevel=3)
                self.sections[new] = self.sections.pop(old)
            self.sections.pop(old, None)
        unknown = sorted(set(self.sections) - set(registered))
        if unknown:
            raise ValueError(f"report sections {unknown} are no registered evaluation method (the methods: "
                             f"{sorted(registered)})")
        # in the order of the registry, whatever order they were given in
        self.sections = {name: self.sections[name] for name in registered if self.sections.get(name) is not None}
        if not self.sections:
            raise ValueError(f"the report has no section: give at least one of {', '.join(registered)}")
        self.output_dir = Path(self.output_dir)
        self.intervals = Intervals.of(self.intervals)
        for group, seeds in self.groups.items():
            if len(seeds) == 2:
                warnings.warn(f"model {group!r}: {two_seeds_note(self.intervals.level)}", UserWarning, stacklevel=2)
        self.passes: ScoringPasses | None = None
        self.command_line = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""
        self.section_options = {name: self._options(name, section) for name, section in self.sections.items()}
        # each section's detectors: its own κ, else the card's (resolved by the detector options, once)
        self.section_detectors = {name: list(dict.fromkeys(DetectorOptions.resolve(
            [options["kappa"]] if isinstance(options["kappa"], str) else options["kappa"]).values()))
            if "kappa" in options else self.detector_classes for name, options in self.section_options.items()}
        self._check_pairs()

    @classmethod
    def of(cls, **options: Any) -> ReportCard:
        """Deprecated (kept for one release): call ``ReportCard(model=..., sections={...})``, or :func:`report`,
        which takes each section as a keyword."""
        warnings.warn("ReportCard.of(...) is deprecated (kept for one release): call ReportCard(..., sections={...}) "
                      "or report(...)", FutureWarning, stacklevel=2)
        return cls(**with_sections(options))

    def _check_types(self) -> None:
        """The card's own options given from Python, each checked by its type by the command's parser before
        anything runs: a wrong type is a ``TypeError`` naming the option, the value and the type expected. Paths
        (``os.PathLike``) are taken as their strings; ``"no"`` is read as the command line reads it."""
        check_kappa_type(self.kappa)
        known = command_options(type(self))
        for name in ("output_dir", "cache_dir", "fit_data"):
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        values = {name: getattr(self, name) for name in sorted(set(known) - {"model", "kappa", "intervals", "title",
                                                                            "sections"})}
        try:  # one parser for them all; one per option only to name the wrong one
            parsed = check_options(type(self), values, what="report")
        except ValueError:
            for name, value in values.items():
                try:
                    check_options(type(self), {name: value}, what="report")
                except ValueError:
                    raise TypeError(f"report: {name} must be {_type_text(known[name])}, got {value!r} "
                                    f"({type(value).__name__})") from None
            raise
        for name, value in parsed.items():
            if isinstance(value, bool):
                setattr(self, name, value)

    def _check_pairs(self) -> None:
        """Refuse, before anything runs, a κ that pairs with no model of the card and an OSCR section without a
        model it can evaluate (OSCR without a checkpoint of ``train.py``), as the commands refuse them."""
        ensembles = [spec.startswith("ensemble:") for spec in self.model]
        for where, kappas in [("kappa", self.detector_classes)] + [
                (f"{s}.kappa", self.section_detectors[s]) for s, o in self.section_options.items() if "kappa" in o]:
            for kappa in kappas:
                if not any(pairs_with(kappa, ensemble=e) for e in ensembles):
                    kind = "an ensemble (ensemble:FILE)" if pairs_with(kappa, ensemble=True) else "a single model"
                    raise ValueError(f"{where}: the confidence function {kappa.name!r} pairs with no model of the "
                                     f"report (it needs {kind}; the models: {self.model})")
        for name in self.sections:
            methods()[name].check(self.model)
        # a model no κ pairs with would get no leaderboard row (a model of several seeds: its seeds are of one kind)
        every = list(dict.fromkeys([*self.detector_classes, *(k for kappas in self.section_detectors.values()
                                                                       for k in kappas)]))
        grouped = {spec: group for group, specs in self.groups.items() for spec in specs}
        for spec in dict.fromkeys(self.model):
            ensemble = spec.startswith("ensemble:")
            if not any(pairs_with(kappa, ensemble=ensemble) for kappa in every):
                which = f"model {grouped[spec]!r} (its seeds: {self.groups[grouped[spec]]})" if spec in grouped \
                    else f"model {spec}"
                needs = ("an ensemble needs an ensemble κ such as ensemble_mi" if ensemble else
                         "a single model needs a single-model κ such as softmax")
                raise ValueError(f"no confidence function of the report pairs with {which}: it would get no "
                                 f"leaderboard row (the report's κ: {[k.name for k in every]}; {needs})")

    # -- configuration ----------------------------------------------------------------------------

    def _options(self, name: str, section: Mapping[str, Any]) -> dict[str, Any]:
        """A section's options: its ``config`` file's (without the report's keys), then its own keys; every key
        and value checked against the method's command (names and types) before anything runs."""
        if not isinstance(section, Mapping):
            raise ValueError(f"report section {name} must be a mapping of {name}'s options, got {section!r}")
        options: dict[str, Any] = {}
        command = methods()[name].evaluation
        if section.get("config") is not None:  # a jsonargparse Path_fr where the command line or a config gave it
            path = Path(getattr(section["config"], "absolute", section["config"]))
            if not path.is_file():
                raise FileNotFoundError(f"report section {name}: its config {path} does not exist")
            loaded = read_options(command, path, what=f"report section {name}: its config {path}")
            options.update({k: v for k, v in loaded.items() if k not in REPORT_KEYS})
        options.update({k: v for k, v in section.items() if k != "config"})
        if "model" in options:
            raise ValueError(f"report section {name}: the models are the report's (model:), not a section's")
        if "trainer" in options or set(options) & TRAINER_KEYS:
            raise ValueError(f"report section {name}: the trainer options are the report's, not a section's")
        # names and types, by the command's own parser (a word where a number is expected names the key)
        checked = check_options(command, {k: v for k, v in options.items() if k != "intervals"},
                                what=f"report section {name}")
        if "intervals" in options:
            checked["intervals"] = Intervals.of(options["intervals"])
        return checked

    def _evaluation(self, name: str, model: Any, kappa: Sequence[str] | None, output_dir: Path) -> Evaluation:
        cls = methods()[name].evaluation
        accepted = command_options(cls)
        options = dict(self.section_options[name])
        options["output_dir"] = str(output_dir)  # the caller's choice: the section's folder or one inside it
        if kappa is not None and "kappa" in accepted:
            options["kappa"] = list(kappa)  # the section's (or the card's) κ that pair with this run's model
        kappas = options.get("kappa", self.kappa)
        # the card's detector options for the section's own κ only (a κ the section does not run would be refused
        # there); its intervals, plots, weights and cache
        kept = list(dict.fromkeys(c.name for c in DetectorOptions.resolve(
            [kappas] if isinstance(kappas, str) else list(kappas)).values()))  # a class path: its name
        defaults = {"kappa": kept, "kappa_args": {k: v for k, v in self.kappa_args.items() if k in kept},
                    "fit_data": self.fit_data, "fit": {k: v for k, v in self.fit.items() if k in kept},
                    "allow_fit_overlap": self.allow_fit_overlap, "intervals": self.intervals, "plots": self.plots,
                    "random_weights": self.random_weights, "cache_dir": self.cache_dir}
        for key, value in defaults.items():
            if key in accepted:
                options.setdefault(key, value)
        # one W&B run for the whole report: the sections do not open their own; --decode device for the sections
        # whose passes can
        decode = self.options.decode if getattr(cls, "decodes_on_device", False) else "cpu"
        evaluation = cls(model=model, **{k: v for k, v in options.items() if k in accepted},
                         trainer=dataclasses.replace(self.options, wandb_mode="disabled", decode=decode))
        evaluation.shared_passes = self.passes
        evaluation.built_models = self.built_models
        return evaluation

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        check_output_dir(self.output_dir)
        models = {spec: ScoringModel(spec, pretrained=not self.random_weights) for spec in self.model}
        self.built_models = models  # every section scores these: each checkpoint is read once per card
        names = {spec: m.display_name for spec, m in models.items()}
        self.members = {group: [names[spec] for spec in specs] for group, specs in self.groups.items()}
        clash = sorted(set(self.groups) & set(names.values()))
        if clash:
            raise ValueError(f"the models of several seeds {clash} are named like another model of the report")
        for group, specs in self.groups.items():  # what the checkpoints already read say, before any pass
            check_seed_recipes(group, specs, [models[spec].recipe for spec in specs])
            check_distinct_seeds(group, specs, [models[spec].fingerprint() for spec in specs])
        self.passes = ScoringPasses(self.cache_dir, decode=self.options.decode)
        # every section's evaluation built first: options and output folders checked before anything runs
        plan: list[tuple[str, Run, Evaluation, Path]] = []
        for key in self.sections:
            method = methods()[key]
            for planned in method.runs(models, self.section_detectors[key]):
                folder = self._folder(key) / slug(planned.name) if method.per_model else self._folder(key)
                plan.append((key, planned, self._evaluation(key, planned.model, planned.kappa, folder), folder))
        for *_, folder in plan:
            check_output_dir(folder)
        for *_, evaluation, _ in plan:  # every section's checks that need its data, before any section's pass
            evaluation.prepare()
        if rank_zero_only.rank == 0:
            mark_stale(self.output_dir)  # until the card is written whole, a page there is an old one
        method_results: dict[str, dict[str | None, MethodResult]] = {}
        for key, planned, evaluation, _ in plan:
            result = evaluation.run()
            if not isinstance(result, MethodResult):
                if rank_zero_only.rank != 0:
                    continue  # a command returns its result on global rank zero only
                raise TypeError(f"evaluate.py {key} returned {type(result).__name__}, not a MethodResult")
            method_results.setdefault(key, {})[planned.name] = result
        if rank_zero_only.rank != 0:  # every process ran the sections; global rank zero writes the card
            return []
        card = self.assemble(method_results, models=list(models.values()))
        from report_card.page import write_page

        paths = write_page(card, self.output_dir)
        log_card(card, self.options, folder=self.output_dir)
        print(f"\nReport card written to {paths['html']} ({self._pass_summary()})")
        print(leaderboard_text(card))
        self.card = card
        return card["leaderboard"]["rows"]

    def _folder(self, section: str) -> Path:
        """A section's folder: its own ``output_dir``, else ``<report>/<method>``."""
        return Path(self.section_options[section].get("output_dir") or self.output_dir / section)

    def _pass_summary(self) -> str:
        log = self.passes.log if self.passes is not None else []
        run = sum(entry["source"] == "run" for entry in log)
        return f"{run} model passes run, {len(log) - run} reused from memory or the cache"

    # -- the card ---------------------------------------------------------------------------------

    def assemble(self, method_results: dict[str, Any], *, models: Sequence[ScoringModel]) -> dict[str, Any]:
        """The report (the schema of :mod:`report_card.page`) from the sections' results and files."""
        cells: dict[tuple[str, str], dict[str, tuple]] = {}
        overlaps: dict[tuple[str, str], dict[str, str]] = {}  # (model, κ) -> column -> its allowed fit overlap
        rows_order: list[tuple[str, str]] = []
        for model in models:
            for kappa in self.detector_classes:
                if pairs_with(kappa, ensemble=bool(model.ensemble)):
                    rows_order.append((model.display_name, kappa.name))
        sections = []

        context = CardContext(self.intervals, self.plots, self.output_dir)
        for key, results in method_results.items():
            method = methods()[key]
            for estimate in (e for result in results.values() for e in result.estimates):
                row = (estimate.model, estimate.kappa)
                if row not in rows_order:
                    rows_order.append(row)
                # only rows measured on the same units (data fingerprints) are compared: their resamples are paired
                cells.setdefault(row, {})[estimate.key] = (estimate.value, estimate.low, estimate.high,
                                                           estimate.replicates, estimate.units)
                if estimate.fit_overlap:
                    overlaps.setdefault(row, {})[estimate.key] = estimate.fit_overlap
            sections.append(method.section(results, context).as_dict())
        problems: dict[str, list[str]] = {}
        if self.groups:
            sections.append(seeds_section(cells, rows_order, self.members, self.intervals, problems=problems))
            for group, names in self.members.items():  # a mean over seeds holds each seed's overlap
                for (model, kappa), marked in list(overlaps.items()):
                    for key, note in marked.items() if model in names else ():
                        merged = overlaps.setdefault((group, kappa), {})
                        merged[key] = f"{merged[key]}; {model}: {note}" if key in merged else f"{model}: {note}"
            lost = [group for group in self.groups if not any(m == group for m, _ in rows_order)]
            if lost:
                raise ValueError("; ".join(
                    f"model {group!r} of several seeds gets no leaderboard row: none of its numbers could be "
                    f"combined over its seeds ({'; '.join(problems.get(group) or ['no section measured it'])})"
                    for group in lost) + ". The card was not written (the sections' own tables are in their "
                    "folders)")
            for group, lines in problems.items():
                warnings.warn(f"model {group!r}: numbers not combined over its seeds, left out of the leaderboard: "
                              + "; ".join(lines), UserWarning, stacklevel=2)
        for section in sections:  # the page and the JSON name images relative to the report folder
            for image in section["images"]:
                image["path"] = os.path.relpath(Path(image["path"]).resolve(), self.output_dir.resolve())
        columns = [h for h in headlines() if any(h.key in c for c in cells.values())]
        by_key = methods()
        rows = [{"model": m, "kappa": k, "cells": {}} for m, k in rows_order]
        for column in columns:
            entries = [(row, cells.get((row["model"], row["kappa"]), {}).get(column.key)) for row in rows]
            compare_column(entries, column, self.intervals, unit=by_key[column.method].unit)
        mark_fit_overlaps(rows, overlaps)
        if not any(row["cells"] for row in rows):
            given = {key: sum(len(result.estimates) for result in results.values()) for key, results in method_results.items()}
            raise ValueError(
                f"the report card would have an empty leaderboard: the sections gave no headline number for any "
                f"(model, κ) row (numbers per section: {given}; rows: {[f'{m} / {k}' for m, k in rows_order]}). "
                "The card was not written (the sections' own tables are in their folders)")
        leaderboard = {"columns": [{**dataclasses.asdict(c), "group": by_key[c.method].group,
                                    "method_title": by_key[c.method].name} for c in columns], "rows": rows}
        costs = cost_section(self.passes.costs() if self.passes is not None else [], leaderboard,
                             output_dir=self.output_dir, plots=self.plots)
        if costs is not None:
            sections.append(costs.as_dict())
            for image in sections[-1]["images"]:
                image["path"] = os.path.relpath(Path(image["path"]).resolve(), self.output_dir.resolve())
        shown = [m.display_name for m in models if not any(m.display_name in v for v in self.members.values())]
        return {
            "title": self.title or "OOD report card: " + ", ".join([*self.groups, *shown]),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": self.command_line,
            "level": self.intervals.level, "resamples": self.intervals.resamples, "seed": self.intervals.seed,
            "comparison": {"method": COMPARISON_METHOD, "level": self.intervals.level,
                           "controls": "per column, family-wise", "not controlled": "across columns"},
            "versions": versions(),
            "models": [{"name": m.display_name, "source": m.spec, "sha256": model_sha256(m.spec),
                        "seed of": next((g for g, v in self.members.items() if m.display_name in v), None)}
                       for m in models],
            "data": data_sets(self.passes.log if self.passes is not None else []),
            "passes": list(self.passes.log) if self.passes is not None else [],
            "leaderboard": leaderboard,
            "sections": sections,
            "notes": self._notes(method_results, models) + [
                f"{group}: {two_seeds_note(self.intervals.level)}." for group, seeds in self.groups.items()
                if len(seeds) == 2] + [
                f"{group}: not combined over its seeds (left out of the leaderboard): {'; '.join(lines)}."
                for group, lines in problems.items()],
        }

    def _notes(self, method_results: dict[str, Any], models: Sequence[ScoringModel]) -> list[str]:
        notes = [f"{self.intervals.describe()}; every other number: percentile bootstrap over its resampling unit.",
                 "What the intervals cover: the sampling of the test data (images, classes, chains) for one trained "
                 "model, not the variance over training runs; a model given as several seeds adds that (its "
                 "section says how).",
                 f"{SIGNIFICANT_TEXT}",
                 "The small number beside a leaderboard value is the share of resamples in which the row ranks first: "
                 "not a probability of being the best, it favours the observed leader (with equal true values the "
                 "observed leader still ranks first in most resamples).",
                 f"Passes: {self._pass_summary()}."]
        for key, results in method_results.items():
            notes += methods()[key].notes(results, models)
        notes += fit_overlap_notes(self.passes.fits if self.passes is not None else [])
        notes += fit_split_notes(self.passes.fits if self.passes is not None else [])
        return notes

def mark_fit_overlaps(rows: Sequence[dict[str, Any]], overlaps: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
    """Mark the leaderboard's cells of a detector fitted on images of the data they were measured on (allowed by
    ``--allow-fit-overlap``): the cell's ``fit_overlap`` note, and the row's (its cells' notes, once each). The cell
    still competes for best and ▼ (the user asked for it): the page marks it, and its column's marks with it."""
    for row in rows:
        marked = {key: note for key, note in overlaps.get((row["model"], row["kappa"]), {}).items()
                  if key in row["cells"]}
        for key, note in marked.items():
            row["cells"][key]["fit_overlap"] = note
        if marked:
            row["fit_overlap"] = "; ".join(dict.fromkeys(marked.values()))


def report(model: str | ModelSeeds | Sequence[str | ModelSeeds], kappa: str | Sequence[str] = ("softmax",), *,
           trainer: TrainerOptions | None = None, **options: Any) -> list[dict[str, Any]]:
    """The report card from Python: the leaderboard rows the page shows (``{"model", "kappa", "cells": {column:
    {"value", "low", "high", "best", "significant", "share_first", "unit"}}}``); the files are written as by
    ``evaluate.py report``. ``options`` are :class:`ReportCard`'s (``severity={...}``, ``output_dir=...``).

    Raises:
        TypeError: an argument of another type than it takes (``report(42)``, ``report([m], 5)``,
            ``output_dir=123``), naming the argument, the value and the type expected, before anything runs.
    """
    check_model_type(model)
    check_kappa_type(kappa)
    single = isinstance(model, (str, ModelSeeds, Mapping))
    return ReportCard(model=[model] if single else list(model), kappa=[kappa] if isinstance(kappa, str) else list(kappa),
                      trainer=TrainerOptions.of(trainer), **with_sections(options)).run()


def with_sections(options: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`ReportCard`'s keyword arguments from Python's spelling, where each section is a keyword of its own
    (``severity={...}``): every keyword that is no option of the card is a section, named by the card if no
    method has that key."""
    options = dict(options)
    sections = dict(options.pop("sections", None) or {})
    known = {*command_options(ReportCard), "trainer"}
    sections.update({key: options.pop(key) for key in list(options) if key not in known})
    return {**options, "sections": sections}


# -- the types of the entry points ---------------------------------------------------------------------------


def check_model_type(model: Any) -> None:
    """Refuse a ``model`` that is neither a spec, a model of several seeds, nor a list of them (``TypeError``)."""
    one = (str, ModelSeeds, Mapping)
    if isinstance(model, one) or hasattr(model, "as_dict"):
        return
    if isinstance(model, Sequence):
        wrong = [m for m in model if not (isinstance(m, one) or hasattr(m, "as_dict"))]
        if not wrong:
            return
        raise TypeError(f"report: each model must be a model spec (str: a checkpoint of train.py, timm:NAME, "
                        f"ensemble:FILE) or a model of several seeds ({{name, seeds}} or ModelSeeds), got "
                        f"{wrong[0]!r} ({type(wrong[0]).__name__}) in {model!r}")
    raise TypeError(f"report: model must be a model spec (str: a checkpoint of train.py, timm:NAME, "
                    f"ensemble:FILE), a model of several seeds ({{name, seeds}} or ModelSeeds), or a list of them, "
                    f"got {model!r} ({type(model).__name__})")


def check_kappa_type(kappa: Any) -> None:
    """Refuse a ``kappa`` that is neither a confidence function's name nor a list of names (``TypeError``)."""
    if isinstance(kappa, str) or (isinstance(kappa, Sequence) and all(isinstance(k, str) for k in kappa)):
        return
    raise TypeError(f"report: kappa must be a confidence function's name (str) or a list of names (list[str]), got "
                    f"{kappa!r} ({type(kappa).__name__})")


def _type_text(hint: Any) -> str:
    """``str | None``, ``bool``, ``dict[str, Any] | None``: a type as it is written."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "").replace("NoneType", "None")


# -- the seeds of one recipe ----------------------------------------------------------------------------------


def spec_kind(spec: str) -> str:
    """The kind of model a spec names: ``ensemble``, ``timm``, ``torchvision``, else ``checkpoint`` (of
    ``train.py``), as :attr:`lightning_modules.scoring.ScoringModel.recipe` calls them."""
    prefix, colon, _ = spec.partition(":")
    return prefix if colon and prefix in ("ensemble", "timm", "torchvision") else "checkpoint"


def _shown(value: Any) -> str:
    """A recipe's value for an error message: a long list by its first entries and its length."""
    if isinstance(value, list) and len(value) > 6:
        return f"[{', '.join(repr(v) for v in value[:4])}, … ({len(value)} in all)]"
    return repr(value)


def seed_differences(seeds: Sequence[str], recipes: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between the seeds' recipes (:attr:`lightning_modules.scoring.ScoringModel.recipe`): one line
    per differing aspect (kind, members, model class, architecture, loss, classes, data), the seeds grouped by
    their value of it (of a mapping, only the keys that differ); empty when they are one recipe."""
    lines = []
    for aspect in dict.fromkeys(a for recipe in recipes for a in recipe):
        values = [recipe.get(aspect) for recipe in recipes]
        if all(v == values[0] for v in values):
            continue
        if all(isinstance(v, Mapping) for v in values):  # only the keys that differ
            keys = [k for k in dict.fromkeys(k for v in values for k in v)
                    if any(v.get(k) != values[0].get(k) for v in values)]
            values = [{k: v.get(k) for k in keys} for v in values]
        by_value: list[tuple[Any, list[int]]] = []
        for index, value in enumerate(values):
            same = next((entry for entry in by_value if entry[0] == value), None)
            if same is None:
                by_value.append((value, [index]))
            else:
                same[1].append(index)
        lines.append(f"{aspect}: " + "; ".join(
            f"{'seeds' if len(indices) > 1 else 'seed'} "
            + ", ".join(f"{i + 1} ({seeds[i]})" for i in indices) + f": {_shown(value)}"
            for value, indices in by_value))
    return lines


def check_seed_recipes(name: str, seeds: Sequence[str], recipes: Sequence[Mapping[str, Any]]) -> None:
    """Refuse the seeds of a model of several seeds that are not runs of one recipe (:func:`seed_differences`):
    their mean would average different models into one row.

    Raises:
        ValueError: naming the model, every differing aspect and the seeds with each value.
    """
    lines = seed_differences(seeds, recipes)
    if lines:
        raise ValueError(
            f"model {name!r} of several seeds: its seeds are not runs of one recipe, so their mean would average "
            f"different models into one row. They differ in\n  " + "\n  ".join(lines) + "\nGive as seeds runs of one "
            "recipe (one kind: checkpoints of train.py or ensembles; the same model class, architecture, loss, "
            "classes and data) that differ in their training seed; report other recipes as models of their own.")


def check_distinct_seeds(name: str, seeds: Sequence[str], weights: Sequence[str]) -> None:
    """Refuse seeds that are one network (identical weights: a run given twice, a copy of a checkpoint, or runs
    whose seed the configuration fixed): their mean would count one training run several times and narrow the
    interval that the spread over training runs should widen.

    Args:
        weights: each seed's weights fingerprint (:func:`lightning_modules.scoring.weights_fingerprint`).

    Raises:
        ValueError: naming the model and each group of seeds with the same weights.
    """
    by_weights: dict[str, list[str]] = {}
    for spec, fingerprint in zip(seeds, weights, strict=True):
        by_weights.setdefault(fingerprint, []).append(spec)
    same = [specs for specs in by_weights.values() if len(specs) > 1]
    if same:
        raise ValueError(
            f"model {name!r} of several seeds: " + "; ".join(" and ".join(specs) for specs in same)
            + " are one network (identical weights), not runs of different training seeds: their mean would count one "
            "run several times and narrow its interval. Train each seed with its own --seed_everything N "
            "(the configs fix 42), then give those checkpoints")


# -- the models ----------------------------------------------------------------------------------


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


__all__ = ["ModelSeeds", "ReportCard", "report"]
