"""``evaluate.py oscr`` (Palechor et al.; DESIGN.md §5.1): :class:`OSCREvaluation`, the open-set test report of
a checkpoint of ``train.py`` on its protocol's test set (negatives and unknowns), run through the
:class:`callbacks.OpenSetEvaluation` callback; the tables, curves and intervals are that callback's."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from callbacks.open_set import OpenSetEvaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataOptions, OutputOptions
from evaluation_engine.outputs import check_output_dir
from evaluation_engine.run import (
    DATA_OVERRIDES_RENAMED,
    Evaluation,
    TrainerOptions,
    evaluation_logger,
    make_trainer,
)
from evaluation_methods.registry import (
    CardContext,
    Estimate,
    Headline,
    Method,
    MethodResult,
    Run,
    Section,
    Table,
    cell,
    register,
)
from lightning_modules.checkpoint import check_classes, checkpoint_classes, load_run
from lightning_modules.open_set_classifier import OpenSetClassifier
from lightning_modules.scoring import checkpoint_display_name
from metrics import DEFAULT_FPR_TARGETS


class OSCREvaluation(Evaluation):
    """``evaluate.py oscr``: the open-set test report (Palechor et al.) of a checkpoint of ``train.py`` -- CCR
    at FPR on negatives and unknowns, AUROC, closed-set accuracy, γ, the OSCR curves and score histograms.

    The model and the datamodule are rebuilt from the checkpoint alone; ``data_args`` change datamodule
    arguments (e.g. the ImageNet root on another machine), and data of other known classes than the
    checkpoint's are refused. The report goes next to the checkpoint (``<checkpoint>-oscr/``) unless
    ``output_dir`` is given, and to W&B.

    Args:
        model: a checkpoint of ``train.py``.
        fpr: the FPR targets of CCR@FPR.
        ccr_convention: ``exact`` (the largest CCR with FPR <= target) and/or ``authors`` (the published
            tables' procedure, keys ``authors_ccr@fpr=...``).
        intervals: level, bootstrap resamples and seed of the intervals.
        data_options: ``data_args``, the datamodule arguments to change (:class:`DataOptions`).
        output_options: ``output_dir``, the report folder; ``plots`` (:class:`OutputOptions`).
    """

    command = "oscr"
    renamed_options = DATA_OVERRIDES_RENAMED

    option_fields = {"data_options": ("data_args",), "output_options": ("output_dir", "plots")}

    def __init__(self, model: str, fpr: Sequence[float] = DEFAULT_FPR_TARGETS,
                 ccr_convention: Sequence[Literal["exact", "authors"]] = ("exact",),
                 intervals: Intervals | None = None, *, data_options: DataOptions | None = None,
                 output_options: OutputOptions | None = None, trainer: TrainerOptions | None = None) -> None:
        super().__init__(trainer=trainer, data_options=data_options, output_options=output_options)
        if str(model).startswith(("timm:", "torchvision:", "ensemble:")):
            raise ValueError(f"oscr needs a checkpoint of train.py (a classifier trained on an open-set protocol, whose "
                             f"test set holds its negatives and unknowns), got the model name {model!r}; the other "
                             "commands (severity, generated, evg) take timm:, torchvision: and ensemble: models")
        self.intervals = Intervals.of(intervals)
        self.model, self.fpr = model, list(fpr)
        self.conventions = list(ccr_convention)

    def run(self) -> MethodResult | None:
        # both refusals before anything runs: a model that is no classifier of train.py (a generator has no
        # test step to score), and a report folder that cannot be written (by default next to the checkpoint)
        built = (self.built_models or {}).get(self.model)  # a report card's: its network and record, no second read
        if built is not None and isinstance(built.network, OpenSetClassifier) and built.checkpoint is not None:
            model, checkpoint = built.network, built.checkpoint
            datamodule = built.training_datamodule(self.data_args)
            names = getattr(datamodule, "class_names", None)
            check_classes(checkpoint_classes(checkpoint, self.model), list(names) if names is not None else None,
                          model=f"checkpoint {self.model}", data=f"its datamodule with {self.data_args or {}}")
        else:
            model, datamodule, checkpoint = load_run(
                self.model, self.data_args, expected=OpenSetClassifier,
                hint="oscr needs a classifier of train.py (trained with a loss of configs/loss/), whose test set "
                     "holds its protocol's negatives and unknowns")
        checkpoint_path = Path(self.model)
        output_dir = Path(self.output_dir if self.output_dir is not None
                          else checkpoint_path.parent / f"{checkpoint_path.stem}-oscr")
        check_output_dir(output_dir)
        evaluation = OpenSetEvaluation(fpr_targets=self.fpr, output_dir=self.output_dir, plots=self.plots,
                                       conventions=self.conventions, intervals=self.intervals,
                                       checkpoint=self.model)
        with evaluation_logger(self.options, name=f"oscr-{Path(self.model).stem}",
                               version=checkpoint.get("logger_version")) as logger:
            trainer = make_trainer(self.options, logger=logger, callbacks=[evaluation])
            trainer.test(model, datamodule=datamodule)  # the weights the model was built with: the checkpoint's
        if not (trainer.is_global_zero and evaluation.report_path is not None):
            return None
        folder = evaluation.report_path
        report = json.loads((folder / "metrics.json").read_text())
        found = evaluation.report
        result = MethodResult("oscr", report, folder=folder, replicates=found.get("replicates"),
                              units=found.get("units") or json.dumps(report.get("counts", {}), sort_keys=True))
        name = checkpoint_display_name(checkpoint_path)
        for key, scalar in HEADLINE_SCALARS:
            if scalar in found["scalars"]:
                low, high = found.get("intervals", {}).get(scalar, (None, None))
                result.estimates.append(Estimate(name, "softmax", key, found["scalars"][scalar], low, high,
                                                 result.replicates.get(scalar), result.units))
        for file, title, caption in FIGURES:
            result.figure(title, folder / file, caption)
        print(f"\nOpen-set report written to {evaluation.report_path} (CCR@FPR conventions: "
              + ", ".join(f"{c} = {'authors_ccr@fpr' if c == 'authors' else 'ccr@fpr'}" for c in self.conventions)
              + "; nan = the authors' '—')")
        intervals = report.get("intervals", {})
        for name, value in sorted(report["scalars"].items()):
            low, high = intervals.get(name, (None, None))
            print(f"  {name:40s} {value:.4f}" + (f"  [{low:.4f}, {high:.4f}]" if low is not None else ""))
        return result


# the leaderboard's columns: the maximum softmax probability against the protocol's unknown classes
HEADLINE_SCALARS = (("oscr_ccr", "unknowns/ccr@fpr=0.1"), ("oscr_auroc", "unknowns/auroc"))
FIGURES = (("oscr_curves.png", "OSCR curves", "CCR against FPR (log axis), negatives and unknowns"),
           ("score_histograms.png", "score histograms",
            "true-class score of the knowns vs maximum score of negatives and unknowns"))


def is_checkpoint(spec: str) -> bool:
    """A checkpoint of ``train.py`` (what OSCR needs: its protocol's test set)."""
    return spec.endswith(".ckpt") and not spec.startswith("ensemble:")


@register
class OpenSetMethod(Method):
    """Open-set recognition (Palechor et al.): every checkpoint of ``train.py`` on its protocol's test set."""

    key, slug, evaluation, per_model = "oscr", "open_set", OSCREvaluation, True
    title, name, group = "Open-set recognition (Palechor et al.)", "Open set (OSCR)", "Open set"
    unit = "test images (knowns, negatives, unknowns resampled separately)"
    headlines = (
        Headline("oscr_ccr", "CCR@FPR 0.1 unknowns", "open_set", True,
                 "correct classification rate of the knowns at FPR 0.1 on the protocol's unknown classes (exact "
                 "convention); the maximum softmax probability, so on the softmax rows of train.py checkpoints"),
        Headline("oscr_auroc", "AUROC unknowns", "open_set", True,
                 "knowns vs the protocol's unknown classes, maximum softmax probability"),
    )

    def runs(self, models: Any, kappas: Any) -> list[Run]:
        return [Run(model.display_name, spec, None) for spec, model in models.items() if is_checkpoint(spec)]

    def check(self, specs: Any) -> None:
        if not any(is_checkpoint(spec) for spec in specs):
            raise ValueError(f"report section oscr needs a classifier checkpoint of train.py (its protocol's test "
                             f"set: negatives and unknowns); the models are {list(specs)}")

    def section(self, results: Any, context: CardContext) -> Section:
        table, figures = [], []
        for model, result in results.items():
            intervals = result.get("intervals", {})
            for name, value in sorted(result["scalars"].items()):
                low, high = intervals.get(name, (None, None))
                table.append({"model": model, "metric": name, "value": cell(value, low, high)})
            figures += [dataclasses.replace(f, title=f"{model}: {f.title}") for f in result.figures]
        return Section(self.slug, self.title, (
            "Every number of the open-set test report of each checkpoint on its protocol's test set: CCR at each "
            "FPR target on negatives (-1, seen in training) and unknowns (-2, never seen), the AUROC of knowns vs "
            f"each group, closed-set accuracy and γ. Intervals: resampling unit {self.unit}."),
            [Table("open-set report", ["model", "metric", "value"], table)], figures)

    def notes(self, results: Any, models: Any) -> list[str]:
        skipped = [m.display_name for m in models if m.display_name not in results]
        return ([f"OSCR needs a checkpoint of train.py (its protocol's test set): not run for {', '.join(skipped)}."]
                if skipped else [])
