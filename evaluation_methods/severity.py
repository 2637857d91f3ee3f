"""``evaluate.py severity`` and ``severity-plot`` (Galil et al.; DESIGN.md §5.2): :class:`SeverityEvaluation`, the
model-tailored C-OOD severity levels of any model (a checkpoint, ``timm:``, ``torchvision:``, ``ensemble:``) run
through the :class:`callbacks.SeverityAUROC` callback, and :class:`SeverityPlot`, one figure of several tables."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from callbacks.severity import SeverityAUROC
from datamodules.catalog import build_severity_data
from datamodules.severity import SeverityData
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataOptions, DetectorOptions, ModelOptions, OutputOptions
from evaluation_engine.outputs import (
    check_output_dir,
    slug,
)
from evaluation_engine.plots import plot_severity
from evaluation_engine.results import Figure, MethodResult
from evaluation_engine.runner import Runner
from evaluation_engine.scoring import (
    FIT_OVERLAP,
    command_fit_set,
)
from evaluation_methods.registry import (
    DETECTION_HEADERS,
    CardContext,
    Headline,
    Method,
    Run,
    Section,
    Table,
    cell,
    column_cell,
    detection_cells,
    register,
)
from lightning_modules.scoring import ScoringModel
from metrics import TABLE_COLUMNS, Detector, pairs_with


@dataclass(kw_only=True, eq=False)
class SeverityEvaluation(Evaluation, ModelOptions, DataOptions, DetectorOptions, OutputOptions):
    """``evaluate.py severity``: the model-tailored C-OOD severity benchmark (Galil et al.) of any model.

    11 severity levels are built for each (model, κ) and each level's AUROC is reported, with the columns of
    the paper's published tables. The model's passes are cached in ``cache_dir``, so a further κ on the same
    model does not run the model again.

    Attributes:
        model: ``timm:<name>``, ``torchvision:<name>``, a checkpoint of ``train.py`` or ``ensemble:<members>``
            (from Python also a :class:`lightning_modules.ScoringModel`).
        num_levels: severity levels (default: the paper's 11, fewer with a warning where the data have fewer
            windows M - G + 1; more than that is refused).
        intervals: level, bootstrap resamples and seed of the intervals (classes within each level resampled).
        data: ``imagenet`` (ImageNet-1k val + an ImageNet-21k pool file), ``protocol`` (a P1-P3 checkpoint's
            unknown classes), ``folder`` (class folders), ``fashion`` (the demo), or a class path; default: the
            checkpoint's own datamodule's, else ``imagenet`` (from Python also a :class:`SeverityData`); its
            ``data_args``: ``id_root``, ``pool_root``, ``pool_file``, ``estimation``, ...; ``batch_size`` and
            ``num_workers`` of the passes (default: the data's).
        output_dir: default ``runs/severity/<model>``.
        cache_dir: the cache of model passes (default ``runs/cache``; ``None``: none).

    The other options are the groups' (:class:`ModelOptions`, :class:`DataOptions`, :class:`DetectorOptions`,
    :class:`OutputOptions`).
    """

    command: ClassVar[str] = "severity"
    decodes_on_device: ClassVar[bool] = True

    model: str
    num_levels: int | None = None
    intervals: Intervals | None = None
    cache_dir: str | None = "runs/cache"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.intervals = Intervals.of(self.intervals)
        self._prepared: tuple[ScoringModel, Path, SeverityAUROC] | None = None

    def prepare(self) -> None:
        """Everything before the passes, once: the model, the data (listed), the callback and its checks (the κ,
        the classes, the number of levels, the fit set against the data). A report card prepares every section
        before any section's pass, so a severity section it would refuse costs no other section's pass."""
        if self._prepared is not None:
            return
        scoring = self.scoring_model(self.model, pretrained=not self.random_weights,
                                     pretrained_file=self.pretrained_file, model_args=self.model_args)
        data = self.data if isinstance(self.data, SeverityData) else build_severity_data(
            self.data, self.data_args, datamodule=training_datamodule(scoring))
        output_dir = Path(self.output_dir or Path("runs/severity") / slug(scoring.display_name))
        check_output_dir(output_dir)
        severity = SeverityAUROC(data=data, kappas=self.kappa, kappa_args=self.kappa_args, every_n_epochs=0,
                                 num_levels=self.num_levels, batch_size=self.batch_size, num_workers=self.num_workers,
                                 cache_dir=self.cache_dir, output_dir=str(output_dir), plots=self.plots,
                                 passes=self.scoring_passes(self.cache_dir), intervals=self.intervals,
                                 fit_set=command_fit_set(scoring, self.fit_data, self.detector_classes),
                                 fit=self.fit, allow_fit_overlap=self.allow_fit_overlap)
        severity.prepare(scoring)  # every class folder and the pool file, and every check, before the processes start
        self._prepared = (scoring, output_dir, severity)

    def run(self) -> MethodResult:
        self.prepare()
        scoring, output_dir, severity = self._prepared  # type: ignore[misc]

        def evaluate(runner: Runner) -> MethodResult:
            result = severity.evaluate(runner, scoring)
            if runner.is_global_zero:
                print(f"\nSeverity tables written to {output_dir} ({severity.model_passes} model passes, the rest "
                      f"from {'the cache ' + str(self.cache_dir) if self.cache_dir else 'memory'})")
                for name, rows in severity.tables.items():
                    print(f"  {scoring.display_name} / {name}: OOD AUROC by level "
                          + " ".join(f"{row['ood-auroc']:.3f}" for row in rows))
            result.folder = output_dir
            return result

        return Runner.launch(self.options, evaluate, name=f"severity-{scoring.display_name}")


@dataclass(kw_only=True, eq=False)
class SeverityPlot(Evaluation):
    """``evaluate.py severity-plot``: one figure of OOD AUROC against severity for every (model, κ) in the
    given tables (``evaluate.py severity``'s or the paper's published one).

    Attributes:
        tables: CSV tables with the columns of :data:`metrics.TABLE_COLUMNS`.
        output: the PNG file to write.
    """

    command: ClassVar[str] = "severity-plot"
    positional: ClassVar[str | None] = "tables"  # severity-plot runs/*/severity.csv --output all.png

    tables: Sequence[str]
    output: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tables:
            raise ValueError("give at least one severity table")
        self.tables = list(self.tables)

    def run(self) -> Path:
        lines: dict[str, list[dict[str, float]]] = {}
        for path in self.tables:
            if not Path(path).is_file():
                raise FileNotFoundError(f"severity table {path} does not exist")
            with open(path, newline="") as handle:
                reader = csv.DictReader(handle)
                missing = [c for c in ("severity level", "ood-auroc", "model name - confidence function")
                           if c not in (reader.fieldnames or [])]
                if missing:
                    raise ValueError(f"{path} is not a severity table: columns {missing} are missing "
                                     f"({list(TABLE_COLUMNS)})")
                for row in reader:
                    lines.setdefault(row["model name - confidence function"], []).append(
                        {"severity level": int(row["severity level"]), "ood-auroc": float(row["ood-auroc"])})
        check_output_dir(Path(self.output).parent, what=f"the figure {self.output}")
        figure = plot_severity(lines, self.output)
        print(f"Severity figure of {len(lines)} tables: {figure}")
        return figure


@register
class SeverityMethod(Method):
    """C-OOD severity levels (Galil et al.): per (model, κ), the levels built for it and their AUROC."""

    key, evaluation, commands, per_model = "severity", SeverityEvaluation, (SeverityPlot,), True
    title, name, group = "C-OOD severity levels (Galil et al.)", "C-OOD severity levels", "Severity"
    unit = "the pool's classes (keyed by pool index) + ID images"
    headlines = (
        Headline("severity_mean", "mean AUROC", "severity", True,
                 "OOD AUROC averaged over the severity levels built for this (model, κ)"),
        Headline("severity_hardest", "hardest level", "severity", True,
                 "OOD AUROC of the hardest severity level (the classes this (model, κ) trusts most)"),
    )

    def runs(self, models: Any, kappas: Sequence[type[Detector]]) -> list[Run]:
        runs = []
        for spec, model in models.items():
            paired = [k.name for k in kappas if pairs_with(k, ensemble=bool(model.ensemble))]
            if paired:
                runs.append(Run(model.display_name, spec, paired))
        return runs

    def section(self, results: Any, context: CardContext) -> Section:
        summary, levels, lines = [], [], {}
        for model, result in results.items():
            for kappa, rows in result.items():
                estimates = {e.key: e for e in result.estimates if e.kappa == kappa}
                mean = estimates["severity_mean"]
                replicates = result.replicates.get(f"{kappa}/mean")
                summary.append({"model": model, "κ": kappa, "mean AUROC": cell(mean.value, mean.low, mean.high),
                                "hardest level": column_cell(rows[-1], "ood-auroc"),
                                "easiest level": column_cell(rows[0], "ood-auroc"),
                                **{f"hardest {k}": v for k, v in detection_cells(rows[-1]).items()},
                                "empty resamples": int(torch.isnan(replicates).sum()) if replicates is not None else "",
                                FIT_OVERLAP: rows[0].get(FIT_OVERLAP, "")})
                levels.append({"model": model, "κ": kappa, **{
                    f"level {r['severity level']}": column_cell(r, "ood-auroc") for r in rows},
                    FIT_OVERLAP: rows[0].get(FIT_OVERLAP, "")})
                lines[f"{model} / {kappa}"] = rows
        figures = []
        if context.plots and lines:
            path = plot_severity(lines, context.output_dir / "severity_auroc.png",
                                 title=f"OOD AUROC by severity level ({context.intervals.level:.0%} intervals)")
            figures.append(Figure("AUROC by severity level", path,
                                  "level 0 = easiest, the last level = hardest; bands: the class-resampled intervals"))
        level_columns = ["model", "κ", *[k for k in (levels[0] if levels else {}) if k.startswith("level ")],
                         *([FIT_OVERLAP] if any(r[FIT_OVERLAP] for r in levels) else [])]
        return Section(self.key, self.title, (
            "For each (model, κ) the OOD classes are sorted by the model's mean κ on their estimation images and "
            "grouped into severity levels of |Y_ID| classes each (level 0: the easiest to detect; the last: the "
            "classes the model trusts most). Each level's AUROC is ID test vs that level's test images. "
            f"Intervals: resampling unit {self.unit} (a level is a group of classes; a class has one weight "
            "in every level and row of a resample). Empty resamples: those in which every class of some level drew "
            "0 (no AUROC there), left out of the mean's interval."),
            [Table("summary", ["model", "κ", "mean AUROC", "hardest level", "easiest level",
                               *[f"hardest {h}" for h in DETECTION_HEADERS], "empty resamples",
                               *([FIT_OVERLAP] if any(r[FIT_OVERLAP] for r in summary) else [])], summary),
             Table("AUROC per level", level_columns, levels)], figures)

    def notes(self, results: Any, models: Any) -> list[str]:
        pools = {result.units for result in results.values()}
        return ["Severity levels are built per (model, κ), so two rows' levels hold different classes; rows "
                "measured on the same pool and ID test set are compared on the same resamples (a pool class "
                "has one weight in every level and row)"
                + ("." if len(pools) <= 1 else "; the models here use different severity data, and rows of "
                   "different data are not compared.")]


def training_datamodule(scoring: ScoringModel) -> Any:
    """The training datamodule of a checkpoint model (kept by the built model), else ``None`` (an ensemble's
    severity data are the ones named, as a timm model's)."""
    return None if scoring.ensemble else scoring.training_datamodule()
