"""``evaluate.py ood``: the OOD detection benchmark the field reports first, OpenOOD v1.5's (Zhang et al. 2023), as
this project's fifth method (:class:`OODEvaluation`, :class:`OODBenchmark`, :class:`OODMethod`).

Models x detectors x sets: every (model, set) pass runs once (:class:`evaluation_engine.scoring.ScoringPasses`,
shared with every detector and every other method of a report card, sharded and exact under DDP, cached), and every
detector is scored on the ID test set, each near-, far- and unit-test OOD set and, in the full-spectrum setting, the
covariate-shifted ID sets (:mod:`datamodules.ood_benchmark`). The metrics are :mod:`metrics.ood_benchmark`'s: per set
AUROC, FPR@95 in both conventions, AUPR-In, AUPR-Out, AURC and AUGRC; their means over the near, far and unit-test sets
as OpenOOD averages them; the ID accuracy. Every number has its interval: the images resampled within each set (ID
once, each OOD set on its own, keyed by image so every row and mean shares one resample), the sets held fixed.

Detector parameters: the project's defaults (the papers'), ``--preset openood`` (OpenOOD v1.5's values for the
benchmark, :mod:`metrics.detectors.presets`) or ``--tune`` (OpenOOD's search on the ID and OOD validation sets only);
what was used is written to ``provenance.json`` and the card. Scores of any other tool are read with ``--scores``
(one CSV per detector and set, checked against the benchmark's lists) and give the same tables.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from datamodules.evaluation import EvaluationSet, dataset_fingerprint
from datamodules.images import ImageFileDataset
from datamodules.ood_benchmark import TEST_GROUPS, OODBenchmarkData
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataOptions, DetectorOptions, ModelOptions, OutputOptions
from evaluation_engine.outputs import (
    check_output_dir,
    log_table,
    markdown_table,
    metric_key,
    slug,
    write_csv,
    write_json,
    write_replicates,
    write_tables,
)
from evaluation_engine.results import Estimate, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    ScoringPasses,
    check_detectors,
    detector_pairs,
    write_fitted,
)
from evaluation_methods.registry import (
    CardContext,
    Headline,
    Method,
    Section,
    Table,
    cell,
    register,
)
from lightning_modules.checkpoint import class_indices
from lightning_modules.scoring import classification_head
from metrics.detectors import Detector
from metrics.ood_benchmark import METRICS, ResampleCache, benchmark_table, table_marks
from openset_common.artefacts import atomic_write_text
from openset_common.labels import known_columns

SETTINGS = ("standard", "full-spectrum")
SIGNS = ("higher_is_id", "higher_is_ood")
SCORES_MANIFEST = "scores.json"
# the card's columns of each metric (the tables' keys are metrics.ood_benchmark's)
METRIC_TITLES = {"auroc": "AUROC", "fpr@95tpr": "FPR@95 (ID+)", "fpr@95tpr-openood": "FPR@95 (OpenOOD)",
                 "aupr-in": "AUPR-In", "aupr-out": "AUPR-Out", "aurc": "AURC", "augrc": "AUGRC"}


def model_label(model: Any) -> str:
    return getattr(model, "display_name", type(model).__name__)


# --------------------------------------------------------------------------------------------------
# score files: what the method writes and what --scores reads


def set_keys(evaluation_set: EvaluationSet) -> list[str]:
    """The identity of each image of a set in a score file: its path as in the benchmark's list (a list's set keeps
    them in ``info["paths"]``), the path under its folder for an image folder, else ``<set>/<index>`` (an in-memory
    set: the demo's)."""
    paths = evaluation_set.info.get("paths")
    if paths is not None:
        return [str(p) for p in paths]
    dataset = evaluation_set.dataset
    if isinstance(dataset, ImageFileDataset):
        return [str(path) for path, _ in dataset.rows]
    return [f"{evaluation_set.name}/{i}" for i in range(len(evaluation_set))]


def write_scores(folder: Path, model: str, kappa: str, sets: Mapping[str, EvaluationSet], scores: Mapping[str, Tensor],
                 predictions: Mapping[str, Tensor], *, benchmark: str) -> None:
    """``<folder>/<κ>/<set>.csv`` (``path,score[,prediction]``, score = κ, higher = more in-distribution) and
    ``<folder>/scores.json`` (the sign convention, the benchmark, the model): what ``--scores <folder>`` reads."""
    for name, values in scores.items():
        keys = set_keys(sets[name])
        prediction = predictions.get(name)
        rows = [{"path": key, "score": repr(float(value)),
                 **({"prediction": int(prediction[i])} if prediction is not None else {})}
                for i, (key, value) in enumerate(zip(keys, values.tolist(), strict=True))]
        write_csv(folder / slug(kappa) / f"{slug(name)}.csv", rows,
                  ["path", "score", *(["prediction"] if prediction is not None else [])])
    manifest = folder / SCORES_MANIFEST
    written = json.loads(manifest.read_text()).get("detectors", []) if manifest.is_file() else []
    detectors = [*written, *([kappa] if kappa not in written else [])]  # in the order they were scored
    write_json(manifest, {"sign": "higher_is_id", "benchmark": benchmark, "model": model, "detectors": detectors,
                          "written_by": "openset-bench evaluate.py ood"})


def read_scores(folder: str | Path, data: OODBenchmarkData, sets: Sequence[str], *, sign: str | None
                ) -> tuple[str, dict[str, dict[str, Tensor]], dict[str, Tensor]]:
    """``(model name, {κ: {set: scores}}, {set: predictions})`` of a score folder (:func:`write_scores`' layout,
    any tool's): each file must hold every image of its set's list exactly once and nothing else; scores are turned
    into the project's convention (higher = more in-distribution).

    Raises:
        FileNotFoundError: no folder, no manifest and no ``sign``, a set without its file, naming them.
        ValueError: a sign that contradicts the manifest's; a file with duplicated, missing or extra images (naming
            the set, the counts and the first few), a NaN or infinite score, a prediction outside the classes.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--scores {folder}: no such folder (one sub-folder per detector, one <set>.csv each)")
    manifest = json.loads((folder / SCORES_MANIFEST).read_text()) if (folder / SCORES_MANIFEST).is_file() else {}
    declared = manifest.get("sign")
    if sign is None and declared is None:
        raise ValueError(f"--scores {folder}: say which way the scores point: --score-sign higher_is_id (a confidence, "
                         f"as this project's κ) or higher_is_ood (an outlier score), or a {SCORES_MANIFEST} with "
                         '{"sign": ...}')
    for value in (sign, declared):
        if value is not None and value not in SIGNS:
            raise ValueError(f"--scores {folder}: the sign must be one of {list(SIGNS)}, got {value!r}")
    if sign is not None and declared is not None and sign != declared:
        raise ValueError(f"--scores {folder}: --score-sign {sign} contradicts its {SCORES_MANIFEST}, which declares "
                         f"{declared}: the numbers would be mirrored; give the sign the files were written with")
    flip = (sign or declared) == "higher_is_ood"
    if manifest.get("benchmark") not in (None, data.name):
        raise ValueError(f"--scores {folder}: its {SCORES_MANIFEST} says the scores are of the benchmark "
                         f"{manifest['benchmark']}, not {data.name}")
    folders = sorted(p.name for p in folder.iterdir() if p.is_dir())
    detectors = [d for d in manifest.get("detectors", []) if d in folders] + \
        [d for d in folders if d not in manifest.get("detectors", [])]  # the manifest's order, then any other
    if not detectors:
        raise FileNotFoundError(f"--scores {folder}: no detector folder (<folder>/<detector>/<set>.csv)")
    scores: dict[str, dict[str, Tensor]] = {}
    predictions: dict[str, Tensor] = {}
    for kappa in detectors:
        scores[kappa] = {}
        for name in sets:
            path = folder / kappa / f"{slug(name)}.csv"
            if not path.is_file():
                raise FileNotFoundError(f"--scores {folder}: detector {kappa} has no scores of the set {name} "
                                        f"({path} is missing)")
            values, predicted = _read_score_file(path, set_keys(data[name]), name=name,
                                                 hashed=data.provenance.get(name, {}).get("sha256"))
            scores[kappa][name] = -values if flip else values
            if predicted is not None and data.groups[name] in ("id_test", "csid"):
                if int(predicted.min()) < 0 or int(predicted.max()) >= data.num_classes:
                    raise ValueError(f"{path}: predictions outside the benchmark's classes 0..{data.num_classes - 1}")
                known = predictions.setdefault(name, predicted)
                if not torch.equal(known, predicted):  # one classifier: every detector's file predicts alike
                    raise ValueError(f"{path}: its predictions of {name} differ from another detector's file of the same "
                                     f"folder on {int((known != predicted).sum())} images: one folder holds one model's "
                                     "scores")
    return str(manifest.get("model") or folder.name), scores, predictions


def _read_score_file(path: Path, keys: list[str], *, name: str, hashed: str | None) -> tuple[Tensor, Tensor | None]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"path", "score"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: a score file has the columns path,score[,prediction], got {reader.fieldnames}")
        rows = list(reader)
    seen: dict[str, int] = {}
    duplicated = []
    for i, row in enumerate(rows):
        if row["path"] in seen:
            duplicated.append(row["path"])
        seen[row["path"]] = i
    expected = set(keys)
    missing = [k for k in keys if k not in seen]
    extra = [k for k in seen if k not in expected]
    if duplicated or missing or extra:
        version = f" (the list's sha256 {hashed})" if hashed else ""
        listed, given = (hashlib.sha256("\n".join(paths).encode()).hexdigest()[:16]
                         for paths in (keys, [row["path"] for row in rows]))
        raise ValueError(
            f"{path}: the scores of {name} do not cover its list{version} exactly: {len(rows)} rows for {len(keys)} "
            f"images (sha256 of the paths: the list's {listed}, the file's {given})" + (f"; {len(duplicated)} duplicated, e.g. {duplicated[:3]}" if duplicated else "")
            + (f"; {len(missing)} missing, e.g. {missing[:3]}" if missing else "")
            + (f"; {len(extra)} not in the list, e.g. {extra[:3]}" if extra else "")
            + " (scores of another version of the list?)")
    try:
        values = torch.tensor([float(rows[seen[k]]["score"]) for k in keys], dtype=torch.float64)
    except ValueError as error:
        raise ValueError(f"{path}: a score is not a number ({error})") from None
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        first = [keys[i] for i in torch.nonzero(bad).flatten()[:3].tolist()]
        raise ValueError(f"{path}: {int(bad.sum())} NaN or infinite scores, e.g. {first}")
    predicted = None
    if "prediction" in (rows[0] if rows else {}) and all(r.get("prediction", "") != "" for r in rows):
        predicted = torch.tensor([int(rows[seen[k]]["prediction"]) for k in keys], dtype=torch.long)
    return values, predicted


# --------------------------------------------------------------------------------------------------
# the evaluation


@dataclass
class Scored:
    """The scores of one (model, κ): per set, and the ID test and covariate-shifted predictions (``None``: the model
    did not predict, a score file without them)."""

    model: str
    kappa: str
    scores: dict[str, Tensor]
    predictions: dict[str, Tensor] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    fit_overlap: str = ""


class OODBenchmark:
    """Every detector of every model on every set of an :class:`OODBenchmarkData` (module docstring).

    Args:
        data: the benchmark's sets.
        kappas: the detector classes; ``kappa_parameters`` their parameters by name (preset or tuned ones merged in by
            the command); ``fit``: their fit caps.
        passes: the run's scoring passes (shared with a card's other methods).
        intervals: level, resamples and seed of every interval.
        full_spectrum: also the full-spectrum setting (FSOOD: the covariate-shifted ID sets counted as ID).
        fit_set: the ID training images of fitted detectors (``None``: none fits on data).
        output_dir: the tables, replicates, score files and figures (``None``: nothing written).
    """

    def __init__(self, data: OODBenchmarkData, kappas: Sequence[type[Detector]], *,
                 kappa_parameters: Mapping[str, dict[str, Any]], passes: ScoringPasses | None = None,
                 intervals: Intervals | None = None, full_spectrum: bool = False, fit_set: EvaluationSet | None = None,
                 fit: Mapping[str, dict[str, Any]] | None = None, allow_fit_overlap: bool = False,
                 output_dir: str | Path | None = None, plots: bool = True, provenance: dict[str, Any] | None = None,
                 published: Sequence[dict[str, Any]] = (), tune: bool = False,
                 fit_sets: Mapping[str, EvaluationSet] | None = None) -> None:
        self.data, self.kappas = data, list(kappas)
        self.kappa_parameters = {k: dict(v) for k, v in kappa_parameters.items()}
        self.passes = passes if passes is not None else ScoringPasses()
        self.intervals = Intervals.of(intervals)
        if full_spectrum and not data.of("csid"):
            raise ValueError(f"benchmark {data.name} has no covariate-shifted ID set: no full-spectrum setting "
                             "(leave --full-spectrum off)")
        self.full_spectrum, self.fit_set, self.fit = full_spectrum, fit_set, dict(fit or {})
        self.allow_fit_overlap = allow_fit_overlap
        self.output_dir, self.plots = (Path(output_dir) if output_dir is not None else None), plots
        self.provenance = dict(provenance or {})
        self.published = list(published)
        self.tune = tune
        self.fit_sets = dict(fit_sets or {})  # per κ, a fit set of its own (OpenOOD's ReAct: the ID validation set)
        self.tuned: list[dict[str, Any]] = []
        self._fitted: list[Detector] = []
        if tune:
            check_validation_sets(data, self.scored_sets)

    # -- checks before any pass --------------------------------------------------------------------

    @property
    def test_sets(self) -> list[str]:
        return self.data.of(*TEST_GROUPS)

    @property
    def scored_sets(self) -> list[str]:
        """The sets every detector scores: ID test, the OOD test sets, the covariate-shifted ones when asked."""
        return [*self.data.of("id_test"), *self.test_sets, *(self.data.of("csid") if self.full_spectrum else [])]

    def check(self, models: Sequence[Any]) -> None:
        """Refuse, before any pass, a model of another class count than the benchmark's, a κ a model cannot serve
        and a fit set holding the benchmark's images."""
        pairs = detector_pairs(list(models), self.kappas)
        for model in models:
            check_class_count(model, self.data)
        for model, kappa in pairs:
            check_detectors([kappa], model, self.fit_set_of(kappa))
        checked = {self.fit_set_of(k).fingerprint(): self.fit_set_of(k) for _, k in pairs
                   if k.fit_data and self.fit_set_of(k) is not None}
        for fit_set in checked.values():
            self.passes.check_fit_overlap(fit_set, [self.data[n] for n in self.scored_sets],
                                          allow=self.allow_fit_overlap)

    def fit_set_of(self, kappa: type[Detector]) -> EvaluationSet | None:
        return self.fit_sets.get(kappa.name, self.fit_set)

    # -- scoring -----------------------------------------------------------------------------------

    def score(self, runner: Runner, models: Sequence[Any]) -> list[Scored]:
        """Every (model, κ)'s scores on :attr:`scored_sets` and the model's predictions on the ID sets."""
        batch = {"batch_size": self.data.batch_size, "num_workers": self.data.num_workers}
        scored = []
        predicted: dict[tuple[int, str], Tensor] = {}  # per (model, set): one model's predictions, for all its κ
        with runner.on_device(*models), torch.inference_mode(False), torch.no_grad():
            for model, kappa in detector_pairs(list(models), self.kappas):
                parameters = self.kappa_parameters.get(kappa.name, {})
                if self.tune:
                    parameters = self.tuned_parameters(runner, model, kappa, parameters, batch)
                note = ""
                if kappa.needs_fit:
                    self._fitted.append(self.passes.fitted_detector(runner, model, kappa, parameters,
                                                                    self.fit_set_of(kappa),
                                                                    fit=self.fit.get(kappa.name), **batch))
                    note = self.passes.fit_notes(self._fitted[-1], [self.data[n] for n in self.scored_sets])
                scores = {name: self.passes.scores(runner, model, self.data[name], kappa, parameters, **batch).double()
                          for name in self.scored_sets}
                predictions = {}
                for name in self.scored_sets:
                    if self.data.groups[name] in ("id_test", "csid"):
                        if (id(model), name) not in predicted:
                            predicted[(id(model), name)] = self.predictions(runner, model, name, batch)
                        predictions[name] = predicted[(id(model), name)]
                scored.append(Scored(model_label(model), kappa.name, scores, predictions, parameters, note))
        return scored

    def tuned_parameters(self, runner: Runner, model: Any, kappa: type[Detector], parameters: dict[str, Any],
                         batch: dict[str, int]) -> dict[str, Any]:
        """OpenOOD's automatic search (:func:`metrics.detectors.presets.tune`) of a κ's parameters on the ID and OOD
        validation sets only; κ without a search grid keep ``parameters``. The grid, every value's validation AUROC
        and the choice are recorded in :attr:`tuned`."""
        from metrics.detectors.presets import SEARCH_GRIDS, tune

        if kappa.name not in SEARCH_GRIDS or not SEARCH_GRIDS[kappa.name]:
            self.tuned.append({"model": model_label(model), "κ": kappa.name, "grid": {}, "chosen": parameters,
                               "validation AUROC": None, "note": "no search grid in OpenOOD: its parameters as given"})
            return parameters
        id_val, ood_val = (self.data[self.data.of(group)[0]] for group in ("id_val", "ood_val"))

        def score(candidate: dict[str, Any]) -> tuple[Tensor, Tensor]:
            combined = {**parameters, **candidate}
            if kappa.needs_fit:
                self.passes.fitted_detector(runner, model, kappa, combined, self.fit_set_of(kappa),
                                            fit=self.fit.get(kappa.name), **batch)
            return tuple(self.passes.scores(runner, model, s, kappa, combined, **batch).double()  # type: ignore[return-value]
                         for s in (id_val, ood_val))

        result = tune(kappa, None, score, benchmark=self.data.name.removeprefix("openood:"))  # NAC's grid is per benchmark
        self.tuned.append({"model": model_label(model), "κ": kappa.name,
                           "grid": {k: list(v) for k, v in result.grid.items()},
                           "validation AUROC": dict(zip([json.dumps(dict(c), sort_keys=True) for c in result.combinations],
                                                        result.aurocs, strict=True)),
                           "chosen": result.parameters, "chosen validation AUROC": result.auroc,
                           "validation sets": [id_val.name, ood_val.name]})
        return {**parameters, **result.parameters}

    def predictions(self, runner: Runner, model: Any, name: str, batch: dict[str, int]) -> Tensor:
        """The model's predicted class of every image of an ID set, in the benchmark's labels (the model's columns
        mapped back: a model of the same classes in another order is read by name)."""
        outputs = self.passes.outputs(runner, model, self.data[name], **batch)
        logits = outputs["logits"].float()
        probabilities = torch.softmax(logits, dim=-1)
        if probabilities.ndim == 3:  # an ensemble: the members' mean
            probabilities = probabilities.mean(dim=1)
        predicted = known_columns(probabilities, bool(getattr(model, "background_class", False))).argmax(dim=1)
        columns = class_indices(getattr(model, "classes", None), self.data.classes)
        if columns is not None:  # model column -> benchmark label
            back = torch.full((int(columns.max()) + 1,), -1, dtype=torch.long)
            back[columns] = torch.arange(columns.numel())
            predicted = torch.where(predicted < back.numel(), back[predicted.clamp(max=back.numel() - 1)],
                                    torch.full_like(predicted, -1))
        return predicted

    # -- the tables --------------------------------------------------------------------------------

    def tables(self, scored: Sequence[Scored]) -> MethodResult:
        """The per-set and summary tables of every (model, κ, setting), their replicates, the simultaneous ▼ of
        every column (per model and setting, across its κ) and the headline estimates (the standard setting's
        near and far means)."""
        rows, summary, estimates, replicates = [], [], [], {}
        strata = {name: 1 + i for i, name in enumerate(self.data.sets)}  # one resample per set, whoever scores it
        cache = ResampleCache(self.intervals.resamples, self.intervals.seed)  # drawn once for every detector
        id_name = self.data.of("id_test")[0]
        labels = {name: self.data[name].labels() for name in self.scored_sets
                  if self.data.groups[name] in ("id_test", "csid")}
        units = "+".join(self.data[n].fingerprint()[:12] for n in (id_name, *self.test_sets))
        for setting in (SETTINGS if self.full_spectrum else SETTINGS[:1]):
            id_sets = [id_name, *(self.data.of("csid") if setting == "full-spectrum" else [])]
            tables: dict[tuple[str, str], Any] = {}
            for entry in scored:
                id_scores = torch.cat([entry.scores[n] for n in id_sets])
                correct = (torch.cat([(entry.predictions[n] == labels[n]) for n in id_sets])
                           if all(n in entry.predictions for n in id_sets) else None)
                tables[(entry.model, entry.kappa)] = benchmark_table(
                    id_scores, correct, {n: entry.scores[n] for n in self.test_sets},
                    {n: self.data.groups[n] for n in self.test_sets}, intervals=self.intervals,
                    strata={n: strata[n] for n in self.test_sets},
                    # the ID test images stratum 0, each covariate-shifted set on its own
                    id_parts=[(entry.scores[n].numel(), 0 if n == id_name else strata[n]) for n in id_sets],
                    cache=cache)
            marks = {}
            for model in dict.fromkeys(e.model for e in scored):  # ▼: worse than the model's best κ, simultaneously
                mine = {kappa: table for (owner, kappa), table in tables.items() if owner == model}
                if len(mine) > 1:
                    marks[model] = table_marks(mine)
            for entry in scored:
                table = tables[(entry.model, entry.kappa)]
                common = {"model": entry.model, "κ": entry.kappa, "setting": setting}
                overlap = {FIT_OVERLAP: entry.fit_overlap} if entry.fit_overlap else {}
                for row in table.rows:
                    worse = [m for m in METRICS if marks.get(entry.model, {}).get((row["set"], m), {}).get(entry.kappa)]
                    rows.append({**common, **row, "worse than best": " ".join(worse), **overlap})
                for (row_name, metric), values in table.replicates.items():
                    replicates[f"{entry.model}|{entry.kappa}|{setting}|{row_name}|{metric}"] = values
                means = {row["set"]: row for row in table.rows if row["group"] == "mean"}
                accuracy, low, high = table.accuracy if table.accuracy is not None else (None, None, None)
                summary_row = {**common, "ID accuracy": accuracy, "ID accuracy low": low, "ID accuracy high": high,
                               **{f"{group} {metric}{suffix}": means[group].get(f"{metric}{suffix}")
                                  for group in means for metric in ("auroc", "fpr@95tpr", "fpr@95tpr-openood")
                                  for suffix in ("", " low", " high")}, **overlap}
                for name in id_sets[1:]:
                    if name in entry.predictions:
                        right = int((entry.predictions[name] == labels[name]).sum())
                        summary_row[f"accuracy {name}"] = right / labels[name].numel()
                        summary_row[f"accuracy {name} low"], summary_row[f"accuracy {name} high"] = \
                            self.intervals.proportion(right, labels[name].numel())
                summary.append(summary_row)
                if setting != "standard":
                    continue
                for group in ("near", "far"):
                    if group not in means:
                        continue
                    for metric, key in (("auroc", f"ood_{group}_auroc"), ("fpr@95tpr", f"ood_{group}_fpr95")):
                        estimates.append(Estimate(
                            entry.model, entry.kappa, key, means[group].get(metric),
                            means[group].get(f"{metric} low"), means[group].get(f"{metric} high"),
                            table.replicates.get((group, metric)), units, fit_overlap=entry.fit_overlap))
        return MethodResult("ood", {"sets": rows, "summary": summary, "per_class": self.per_class(scored)},
                            folder=self.output_dir, estimates=estimates, replicates=replicates, units=units)

    def per_class(self, scored: Sequence[Scored]) -> list[dict[str, Any]]:
        """The per-class dispersion of the detection (GHOST's reported quantity, :func:`metrics.per_class_auroc`),
        standard setting: per (model, κ) and group (near, far), each ID class's AUROC against each of the group's sets,
        averaged over the sets (the per-class form of OpenOOD's mean), and over the classes their mean, population
        standard deviation, worst and best class and range."""
        from metrics.per_class import per_class_auroc

        id_name = self.data.of("id_test")[0]
        labels = self.data[id_name].labels()
        rows = []
        for entry in scored:
            for group in ("near", "far"):
                names = [n for n in self.test_sets if self.data.groups[n] == group]
                if not names:
                    continue
                results = [per_class_auroc(torch.cat([entry.scores[id_name], entry.scores[n]]),
                                           torch.cat([labels, torch.full((entry.scores[n].numel(),), -2)]))
                           for n in names]
                aurocs = torch.stack([r.auroc for r in results]).mean(dim=0)
                classes = results[0].classes
                worst, best = int(aurocs.argmin()), int(aurocs.argmax())
                rows.append({"model": entry.model, "κ": entry.kappa, "group": group, "sets": len(names),
                             "classes": int(classes.numel()), "mean per-class AUROC": float(aurocs.mean()),
                             "std over classes": float(aurocs.std(unbiased=False)),
                             "worst class": int(classes[worst]), "worst AUROC": float(aurocs[worst]),
                             "best class": int(classes[best]), "best AUROC": float(aurocs[best]),
                             "range": float(aurocs[best] - aurocs[worst])})
        return rows

    def evaluate(self, runner: Runner, models: Sequence[Any]) -> MethodResult:
        """Score every model (:meth:`score`), then the tables; files and W&B on global rank zero."""
        self.check(models)
        scored = self.score(runner, models)
        result = self.tables(scored)
        runner.log_metrics({metric_key("test", "ood", row["model"], row["κ"], row["setting"], row["set"], metric):
                            row[metric] for row in result["sets"] for metric in ("auroc", "fpr@95tpr")
                            if row.get(metric) is not None})
        log_table(runner, metric_key("test", "ood", "sets"), result["sets"], SET_COLUMNS)
        if runner.is_global_zero and self.output_dir is not None:
            self.write(result, scored)
            self.figures(result)
        return result

    def write(self, result: MethodResult, scored: Sequence[Scored]) -> None:
        out = self.output_dir
        assert out is not None
        columns = [c for c in SET_COLUMNS if any(c in row for row in result["sets"])]
        write_tables(out, "sets", result["sets"], columns, preamble=f"{self.intervals.describe()}. {INTERVAL_NOTE}")
        summary_columns = list(dict.fromkeys(k for row in result["summary"] for k in row))
        write_csv(out / "summary.csv", result["summary"], summary_columns)
        write_replicates(out, result.replicates, self.intervals)
        if result.get("per_class"):
            write_csv(out / "per_class.csv", result["per_class"], list(result["per_class"][0]))
        write_fitted(out, self.passes, self._fitted)
        for model in dict.fromkeys(entry.model for entry in scored):
            # a model's score folder whole or not at all: written aside, then put in the place of an earlier run's
            # (whose detectors a later --scores would otherwise read with this run's)
            final = out / "scores" / slug(model)
            staging = final.with_name(f".{final.name}.staging")
            shutil.rmtree(staging, ignore_errors=True)
            for entry in (e for e in scored if e.model == model):
                write_scores(staging, entry.model, entry.kappa, {n: self.data[n] for n in entry.scores},
                             entry.scores, entry.predictions, benchmark=self.data.name)
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
        write_json(out / "provenance.json", {"benchmark": self.data.name, "description": self.data.description,
                                             "sets": list(self.data.provenance.values()),
                                             "parameters": {f"{e.model}|{e.kappa}": e.parameters for e in scored},
                                             "tuned": self.tuned, **self.provenance})
        atomic_write_text(out / "README.md", f"# OOD benchmark {self.data.name}\n\n" + markdown_table(
            [r for r in result["sets"] if r["group"] == "mean"], ["model", "κ", "setting", "set", *METRICS]))

    def figures(self, result: MethodResult) -> None:
        """The per-set AUROC bars (with their intervals) and a grid of the unit tests' first images."""
        if not self.plots or self.output_dir is None:
            return
        from evaluation_engine.plots import plot_image_rows, plot_set_bars

        standard = [r for r in result["sets"] if r["setting"] == "standard" and r["group"] != "mean"]
        path = plot_set_bars(standard, self.output_dir / "auroc_per_set.png",
                             title=f"AUROC per set ({self.intervals.level:.0%} intervals)")
        result.figure("AUROC per set", path, "one bar per (model, κ); the error bars are the intervals")
        units = self.data.of("unit")
        if units:
            images = {n.removeprefix("unit:"): torch.stack([self.data[n].dataset[i].image
                                                            for i in range(min(6, len(self.data[n])))])
                      for n in units}
            grid = plot_image_rows(images, self.output_dir / "unit_tests.png", title="OOD unit tests")
            result.figure("OOD unit tests", grid, "the first images of each unit test (Bitterwolf et al. 2023), "
                          "generated here")


SET_COLUMNS = ("model", "κ", "setting", "set", "group", "images",
               *[c for m in METRICS for c in (m, f"{m} low", f"{m} high")], "worse than best", FIT_OVERLAP)
INTERVAL_NOTE = ("Intervals: percentile bootstrap over the images, resampled within each set (the ID test images once, "
                 "each OOD set on its own), keyed by image, so every row, mean and detector shares one resample; the "
                 "means over a group's sets hold the sets fixed (they cover the sampling of images, not the choice of "
                 "sets). AUROC per set: the project's interval (logit DeLong). fpr@95tpr: ID positive, the papers' "
                 "definition; fpr@95tpr-openood: OOD positive, as OpenOOD v1.5's compute_all_metrics.")


def check_validation_sets(data: OODBenchmarkData, test_sets: Sequence[str]) -> None:
    """Refuse tuning on anything but validation data: the benchmark needs one ID and one OOD validation set, and
    neither may be a test set (the same set, the same content, or a shared image file)."""
    for group in ("id_val", "ood_val"):
        if not data.of(group):
            raise ValueError(f"--tune searches on the ID and OOD validation sets and the benchmark {data.name} has no "
                             f"{group} set")
    tests = {dataset_fingerprint(data[n].dataset): n for n in test_sets}  # the content, whatever a set is called
    files = {n: set(set_keys(data[n])) for n in test_sets if data[n].info.get("paths") is not None
             or isinstance(data[n].dataset, ImageFileDataset)}
    for name in data.of("id_val", "ood_val"):
        shared = tests.get(dataset_fingerprint(data[name].dataset))
        if shared is None and (data[name].info.get("paths") is not None or isinstance(data[name].dataset,
                                                                                       ImageFileDataset)):
            mine = set(set_keys(data[name]))
            shared = next((n for n, keys in files.items() if keys & mine), None)
        if shared is not None or name in test_sets:
            raise ValueError(f"--tune: the validation set {name} is also the test set {shared or name} (or shares "
                             "images with it): parameters tuned on test images would be reported as if they were not")


def check_class_count(model: Any, data: OODBenchmarkData) -> None:
    """Refuse a model whose known classes are not the benchmark's ``num_classes`` (from its class list or its
    classification head), naming both; an ImageNet-1K model on a Fashion benchmark never gets to a pass."""
    classes = getattr(model, "classes", None)
    count = None
    if classes is not None:
        count = len(classes)
    else:
        try:
            weight, _ = classification_head(model)
            count = weight.shape[0] - int(bool(getattr(model, "background_class", False)))
        except (ValueError, AttributeError, TypeError):
            return
    if count != data.num_classes:
        raise ValueError(f"{model_label(model)} has {count} known classes and the benchmark {data.name} "
                         f"{data.num_classes}: a model of the benchmark's classes is needed")


# --------------------------------------------------------------------------------------------------
# the command


@dataclass(kw_only=True, eq=False)
class OODEvaluation(Evaluation, ModelOptions, DataOptions, DetectorOptions, OutputOptions):
    """``evaluate.py ood``: the OOD detection benchmark (OpenOOD v1.5's shape) of models x detectors.

    Attributes:
        model: ``timm:<name>``, ``torchvision:<name>`` (ImageNet-1K, weights from the local cache or
            ``pretrained_file``), checkpoints of ``train.py``, ``ensemble:<members>``; none with ``scores``.
        data: the benchmark: ``fashion`` (the demo), ``openood:imagenet1k``, ``openood:imagenet200``,
            ``openood:cifar10``, ``openood:cifar100`` (:data:`datamodules.catalog.OOD_BENCHMARKS`); its
            ``data_args``: the demo's ``unit_images``, ``severity``, ...; an OpenOOD benchmark's ``subset_lists``,
            ``sets``, ``on_bad_image``.
        data_root: an OpenOOD benchmark's data folder in OpenOOD's layout (``images_largescale/``,
            ``images_classic/``) or a shard set of it.
        set_roots: another root per set (``--set-root ninco=/data/NINCO``: the list's first folder replaced by it).
        lists: the user's copy of a list the package does not ship (``--list imagenet_es=test_imagenet_es.txt``),
            checked to be the published one.
        full_spectrum: also the full-spectrum setting (the covariate-shifted ID sets counted as ID).
        preset: detector parameters: ``paper`` (the project's defaults) or ``openood`` (OpenOOD v1.5's for the
            benchmark; ReAct then fits on the ID validation set, as OpenOOD's); ``kappa_args`` given win over either.
        tune: OpenOOD's automatic parameter search of every κ it searches, on the ID and OOD validation sets only
            (a validation set that is also a test set is refused); the grid, each value's validation AUROC and the
            choice are recorded. Without it the preset's values are used, and the card says so.
        scores: a folder of score files (``<κ>/<set>.csv``: ``path,score[,prediction]``) of any tool, read instead of
            running a model; ``score_sign``: ``higher_is_id`` or ``higher_is_ood`` (or the folder's ``scores.json``).
        intervals: level, bootstrap resamples and seed.
        output_dir: default ``runs/ood/<benchmark>``.
        cache_dir: the cache of model passes (default ``runs/cache``).
    """

    command: ClassVar[str] = "ood"
    decodes_on_device: ClassVar[bool] = True

    model: Sequence[str] = ()
    data: str | None = "fashion"
    data_root: str | None = None
    set_roots: dict[str, str] | None = None
    lists: dict[str, str] | None = None
    full_spectrum: bool = False
    preset: Literal["paper", "openood"] = "paper"
    tune: bool = False
    scores: str | None = None
    score_sign: Literal["higher_is_id", "higher_is_ood"] | None = None
    intervals: Intervals | None = None
    batch_size: int | None = 256
    num_workers: int | None = 0
    cache_dir: str | None = "runs/cache"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.intervals = Intervals.of(self.intervals)
        self.model = [self.model] if isinstance(self.model, str) else list(self.model)
        if bool(self.model) == bool(self.scores):
            raise ValueError("give models (--model) to score, or --scores <folder> of scores made elsewhere, not both "
                             "and not neither")
        if self.scores:  # the scores are the other tool's: nothing of ours chose their parameters or fits
            ignored = [option for option, given in (("--tune", self.tune), ("--preset openood", self.preset != "paper"),
                                                    ("--kappa-arg", bool(self.kappa_args)),
                                                    ("--fit-data", self.fit_data is not None),
                                                    ("--fit-arg", bool(self.fit))) if given]
            if ignored:
                raise ValueError(f"--scores reads scores another tool made: {ignored} would apply to no detector here "
                                 "(the parameters and fits are that tool's); leave them out")
        if self.data is None:
            raise ValueError("give the benchmark (--data fashion, openood:imagenet1k, ...)")
        self._prepared: tuple[Any, ...] | None = None

    def benchmark_data(self) -> OODBenchmarkData:
        from datamodules.catalog import build_ood_benchmark

        arguments = {"batch_size": self.batch_size or 256, "num_workers": self.num_workers or 0,
                     "full_spectrum": self.full_spectrum, **self.data_args}
        for name in ("data_root", "set_roots", "lists"):
            if getattr(self, name):
                if not str(self.data).startswith("openood:"):
                    raise ValueError(f"--{name.replace('_', '-').removesuffix('s')} is an OpenOOD benchmark's (the "
                                     f"images of its lists); the benchmark {self.data} makes its own sets")
                arguments[name] = getattr(self, name)
        if self.scores and str(self.data).startswith("openood:"):  # the lists only: no image is read
            arguments["images"] = False
            arguments.pop("data_root", None)
            arguments.pop("set_roots", None)
        return build_ood_benchmark(str(self.data), arguments)

    def parameters(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[str]]:
        """Each κ's parameters (the preset's, then the user's ``kappa_args`` over them), what to record, and the κ
        fitted on the ID validation set: those that fit on it by their paper (``fit_split = "val"``: VRA, AdaSCALE)
        and those the preset fits on it (OpenOOD's ReAct)."""
        search = "searched on the validation sets (--tune)" if self.tune else "not tuned (no --tune)"
        by_paper = [k.name for k in self.detector_classes if k.fit_split == "val"]
        if self.preset == "paper":
            return ({k: dict(v) for k, v in self.kappa_parameters.items()},
                    {"preset": f"detector parameters: the project's defaults (the papers' values), {search}"}, by_paper)
        from metrics.detectors.presets import preset_entry

        benchmark = str(self.data).removeprefix("openood:")
        given = {name: set((self.kappa_args or {}).get(name, {})) for name in self.kappa}
        merged, sources, on_validation = {}, {}, []
        for name in self.kappa:
            entry = preset_entry("openood", benchmark, name)
            merged[name] = {**entry.parameters, **{k: v for k, v in self.kappa_parameters[name].items()
                                                   if k in given[name]}}
            sources[name] = {"parameters": dict(entry.parameters), "source": entry.source, "notes": entry.notes,
                             "fit split": entry.fit_split, "given over it": sorted(given[name])}
            if entry.fit_split == "id_val" or name in by_paper:
                on_validation.append(name)
        searched = [name for name in self.kappa if preset_entry("openood", benchmark, name).searched
                    and not self.tune]
        note = ""
        if searched:  # OpenOOD's evaluator searches these (APS_mode) before its leaderboard's numbers
            note = (f"; OpenOOD's leaderboard searched the parameters of {searched} on its validation lists (APS_mode): "
                    "these rows use its starting values, add --tune to reproduce its rows")
            warnings.warn(f"--preset openood without --tune: OpenOOD v1.5 searches the parameters of {searched} on its "
                          "validation lists before it reports them (APS_mode); the rows here use its starting values. "
                          "Add --tune to reproduce OpenOOD's rows", UserWarning, stacklevel=3)
        return merged, {"preset": f"detector parameters: OpenOOD v1.5's for {benchmark}, {search}{note}",
                        "presets": sources}, on_validation

    def prepare(self) -> None:
        if self._prepared is not None:
            return
        parameters, recorded, on_validation = self.parameters()  # a detector the preset lacks: before any data
        output_dir = Path(self.output_dir or Path("runs/ood") / slug(str(self.data)))
        check_output_dir(output_dir)
        data = self.benchmark_data()
        models = [self.scoring_model(m, pretrained=not self.random_weights, pretrained_file=self.pretrained_file,
                                     model_args=self.model_args) for m in self.model]
        from evaluation_engine.scoring import command_fit_set

        # the fit set of fitted detectors: --fit-data, else the benchmark's own (OpenOOD's ID training list; the demo's
        # training split), else a checkpoint's training split
        fits = models and any(k.fit_data for k in self.detector_classes)
        fit_set = (command_fit_set(models[0], self.fit_data, self.detector_classes) if self.fit_data else
                   data.fit_set() or command_fit_set(models[0], None, self.detector_classes)) if fits else None
        if fit_set is not None:
            recorded["fit set"] = {"name": fit_set.name, "images": len(fit_set),
                                   **{k: fit_set.info[k] for k in ("list", "list_sha256", "root") if k in fit_set.info}}
        recorded["notes"] = list(data.notes)
        if on_validation and not data.of("id_val"):
            recorded["notes"].append(f"{on_validation} fit on ID validation images (their papers', OpenOOD's); the "
                                     f"benchmark {data.name} has none, so they fit on the fit set "
                                     f"{fit_set.name if fit_set is not None else '(none)'}")
        benchmark = OODBenchmark(data, self.detector_classes, kappa_parameters=parameters,
                                 passes=self.scoring_passes(self.cache_dir), intervals=self.intervals,
                                 full_spectrum=self.full_spectrum, fit_set=fit_set, fit=self.fit,
                                 allow_fit_overlap=self.allow_fit_overlap, output_dir=output_dir, plots=self.plots,
                                 provenance=recorded, tune=self.tune,
                                 published=published_rows(data.name) + (published_rows(data.name, full_spectrum=True)
                                                                         if self.full_spectrum else []),
                                 fit_sets={name: data[data.of("id_val")[0]] for name in on_validation
                                           if data.of("id_val")})
        if models:
            benchmark.check(models)
        self._prepared = (data, models, benchmark, output_dir)

    def run(self) -> MethodResult:
        self.prepare()
        data, models, benchmark, output_dir = self._prepared  # type: ignore[misc]
        if self.scores:
            model, scores, predictions = read_scores(self.scores, data, benchmark.scored_sets, sign=self.score_sign)
            benchmark.provenance["preset"] = (f"scores read from {self.scores} (made elsewhere: their detectors' "
                                              "parameters and fits are that tool's)")
            scored = [Scored(model, kappa, sets, predictions) for kappa, sets in scores.items()]
            result = benchmark.tables(scored)
            benchmark.write(result, [])
            benchmark.figures(result)
            summarise(result, data.name, output_dir)
        else:
            def evaluate(runner: Runner) -> MethodResult:
                result = benchmark.evaluate(runner, models)
                if runner.is_global_zero:
                    summarise(result, data.name, output_dir)
                return result

            result = Runner.launch(self.options, evaluate, name=f"ood-{data.name}")
        result.folder = output_dir
        result["published"] = benchmark.published
        result["provenance"] = {"benchmark": data.name, "sets": list(data.provenance.values()),
                                "tuned": benchmark.tuned, **benchmark.provenance,
                                "parameters": [] if self.scores else [
                                    {"κ": name, "parameters": json.dumps(benchmark.kappa_parameters.get(name, {})),
                                     "source": benchmark.provenance.get("presets", {}).get(name, {}).get(
                                         "source", "the project's default" if self.preset == "paper" else "")}
                                    for name in self.kappa]}
        return result


def summarise(result: MethodResult, benchmark: str, output_dir: Path) -> None:
    """The standard setting's means of every (model, κ), printed (once: global rank zero)."""
    means = [r for r in result["sets"] if r["group"] == "mean" and r["setting"] == "standard"]
    print(f"\nOOD benchmark {benchmark} written to {output_dir}")
    print(markdown_table(means, ["model", "κ", "set", "auroc", "fpr@95tpr", "fpr@95tpr-openood"]))


def published_rows(benchmark: str, *, full_spectrum: bool = False) -> list[dict[str, Any]]:
    """OpenOOD's published leaderboard rows of a benchmark (package data, :func:`datamodules.openood.read_leaderboard`)
    as they are published (percentages; CIFAR's and ImageNet-200's "mean ± std" over three training runs), each
    with its table's source and date; none for a benchmark OpenOOD does not have (the demo's)."""
    if not benchmark.startswith("openood:"):
        return []
    from datamodules.openood import LEADERBOARD, read_leaderboard

    name = benchmark.removeprefix("openood:")
    table = f"{name}_{'fsood' if full_spectrum else 'ood'}" if f"{name}_ood" in LEADERBOARD else \
        (name if not full_spectrum else "")
    if table not in LEADERBOARD:  # CIFAR: no full-spectrum table
        return []
    entry = LEADERBOARD[table]
    setting = "full-spectrum" if table.endswith("_fsood") else "standard"
    return [{"setting": setting, **row, "published": f"{entry.source} ({entry.date}), no interval"}
            for row in read_leaderboard(table)]


# --------------------------------------------------------------------------------------------------
# the method


@register
class OODMethod(Method):
    """The OOD detection benchmark (OpenOOD v1.5): per (model, κ), AUROC and FPR@95 on near- and far-OOD sets."""

    key, evaluation = "ood", OODEvaluation
    title = "OOD benchmark (OpenOOD v1.5)"
    name, group = "OOD benchmark (OpenOOD v1.5)", "OOD benchmark"
    unit = "images, resampled within each set (ID once, each OOD set apart); the sets held fixed"
    headlines = (
        Headline("ood_near_auroc", "near AUROC", "ood", True, "AUROC averaged over the near-OOD sets"),
        Headline("ood_far_auroc", "far AUROC", "ood", True, "AUROC averaged over the far-OOD sets"),
        Headline("ood_near_fpr95", "near FPR@95", "ood", False,
                 "FPR at 95% TPR (ID positive) averaged over the near-OOD sets"),
        Headline("ood_far_fpr95", "far FPR@95", "ood", False,
                 "FPR at 95% TPR (ID positive) averaged over the far-OOD sets"),
    )

    def section(self, results: Any, context: CardContext) -> Section:
        (result,) = results.values()

        def marked(row: dict[str, Any], metric: str) -> Any:
            value = cell(row.get(metric), row.get(f"{metric} low"), row.get(f"{metric} high"))
            if isinstance(value, dict):
                value["significant"] = metric in str(row.get("worse than best", "")).split()
            return value

        metric_columns = [METRIC_TITLES[m] for m in METRICS]
        rows = result["sets"]
        overlap = [FIT_OVERLAP] if any(r.get(FIT_OVERLAP) for r in rows) else []
        means = [{"model": r["model"], "κ": r["κ"], "setting": r["setting"], "mean over": r["set"],
                  "images": r.get("images", ""), **{METRIC_TITLES[m]: marked(r, m) for m in METRICS},
                  **{c: r.get(c, "") for c in overlap}} for r in rows if r["group"] == "mean"]
        # per set on the page: the standard setting's named sets (the unit tests and the full-spectrum rows are their
        # means here, every row in sets.csv): a card of many detectors stays readable
        per_set = [{"model": r["model"], "κ": r["κ"], "set": r["set"], "group": r["group"],
                    "images": r.get("images", ""), **{METRIC_TITLES[m]: marked(r, m) for m in METRICS},
                    **{c: r.get(c, "") for c in overlap}} for r in rows
                   if r["group"] not in ("mean", "unit") and r["setting"] == "standard"]
        accuracy = []
        for r in result["summary"]:
            shifted = [k for k in r if k.startswith("accuracy ") and not k.endswith((" low", " high"))]
            accuracy.append({"model": r["model"], "κ": r["κ"], "setting": r["setting"],
                             "ID accuracy": cell(r.get("ID accuracy"), r.get("ID accuracy low"),
                                                 r.get("ID accuracy high")),
                             **{k: cell(r[k], r.get(f"{k} low"), r.get(f"{k} high")) for k in shifted}})
        tables = [Table("means over each group's sets (▼: worse than the model's best κ, simultaneously per column)",
                        ["model", "κ", "setting", "mean over", "images", *metric_columns, *overlap], means),
                  Table("per set (the standard setting; every set of both settings, the unit tests one by one: sets.csv)",
                        ["model", "κ", "set", "group", "images", *metric_columns, *overlap], per_set),
                  Table("classification (the full-spectrum ID sets: ID test and the covariate-shifted ones)",
                        list(dict.fromkeys(k for a in accuracy for k in a)), accuracy)]
        per_class = result.get("per_class") or []
        if per_class:
            tables.append(Table("per-class dispersion (GHOST): each ID class's AUROC, averaged over the group's sets "
                                "(no interval)",
                                list(per_class[0]), [{k: (round(v, 4) if isinstance(v, float) else v)
                                                      for k, v in r.items()} for r in per_class]))
        published = result.get("published") or []
        if published:
            tables.append(Table("published (OpenOOD v1.5 leaderboard; published, no interval)",
                                list(dict.fromkeys(k for r in published for k in r)), list(published)))
        provenance = result.get("provenance", {})
        sets = provenance.get("sets", [])
        if sets:
            tables.append(Table("the sets and where they come from", list(dict.fromkeys(k for r in sets for k in r)),
                                [{k: v for k, v in r.items()} for r in sets]))
        parameters = provenance.get("parameters") or []
        if parameters:
            tables.append(Table("detector parameters (before any --tune; the tuned values below)",
                                ["κ", "parameters", "source"], list(parameters)))
        tuned = provenance.get("tuned") or []
        if tuned:
            tables.append(Table("tuned on the validation sets (OpenOOD's search)",
                                ["model", "κ", "grid", "chosen", "chosen validation AUROC"],
                                [{k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in t.items()} for t in tuned]))
        notes = " ".join(f"Note: {note}." for note in provenance.get("notes", []))
        text = (f"Benchmark {provenance.get('benchmark', '')}; {provenance.get('preset', '')}. {notes} {INTERVAL_NOTE} "
                "Means: the plain mean of the per-set values, as OpenOOD v1.5 reports them (near, far; the ImageNet-21k "
                "sets (in21k) and the OOD unit tests (unit) each on their own; all = near and far). AURC and AUGRC (Traub et al. 2024) count every OOD image as "
                "a failure of the selective classifier, every misclassified ID image too.")
        return Section(self.key, self.title, text, tables, list(result.figures))


__all__ = ["OODBenchmark", "OODEvaluation", "OODMethod", "Scored", "read_scores", "set_keys", "write_scores"]
