"""``evaluate.py oscr`` (Palechor et al.; DESIGN.md §5.1): :class:`OSCREvaluation`, the open-set test report of
a checkpoint of ``train.py`` on its protocol's test set (negatives and unknowns), run through the
:class:`callbacks.OpenSetEvaluation` callback; the tables, curves and intervals are that callback's."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from callbacks.open_set import OpenSetEvaluation
from datamodules.evaluation import EvaluationSet
from datamodules.images import ImageFileDataset, without_unreadable
from evaluation_engine.command import DATA_OVERRIDES_RENAMED, Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.options import DataArgOptions, OutputOptions
from evaluation_engine.outputs import check_output_dir
from evaluation_engine.results import MethodResult
from evaluation_engine.runner import Runner
from evaluation_methods.registry import (
    CardContext,
    Headline,
    Method,
    Run,
    Section,
    Table,
    cell,
    register,
)
from lightning_modules.checkpoint import check_classes, checkpoint_classes
from lightning_modules.open_set_classifier import OpenSetClassifier
from metrics import DEFAULT_FPR_TARGETS


@dataclass(kw_only=True, eq=False)
class OSCREvaluation(Evaluation, DataArgOptions, OutputOptions):
    """``evaluate.py oscr``: the open-set test report (Palechor et al.) of a checkpoint of ``train.py`` -- CCR
    at FPR on negatives and unknowns, AUROC, closed-set accuracy, γ, the OSCR curves and score histograms.

    The model and the datamodule are rebuilt from the checkpoint alone (a report card's built model is used as
    built), and the test set is scored by the engine's scoring pass (the one every method shares and caches); ``data_args`` change datamodule
    arguments (e.g. the ImageNet root on another machine), and data of other known classes than the
    checkpoint's are refused. The report goes next to the checkpoint (``<checkpoint>-oscr/``) unless
    ``output_dir`` is given, and to W&B.

    Attributes:
        model: a checkpoint of ``train.py``.
        fpr: the FPR targets of CCR@FPR.
        ccr_convention: ``exact`` (the largest CCR with FPR <= target) and/or ``authors`` (the published
            tables' procedure, keys ``authors_ccr@fpr=...``).
        intervals: level, bootstrap resamples and seed of the intervals.
        data_args: the datamodule arguments to change.
        output_dir: the report folder (default: ``<checkpoint>-oscr/`` next to the checkpoint).
        cache_dir: the cache of the test set's pass (default none; the report card's).
    """

    command: ClassVar[str] = "oscr"
    decodes_on_device: ClassVar[bool] = True
    renamed_options: ClassVar[dict[str, tuple[str, str]]] = DATA_OVERRIDES_RENAMED

    model: str
    fpr: Sequence[float] = DEFAULT_FPR_TARGETS
    ccr_convention: Sequence[Literal["exact", "authors"]] = ("exact",)
    intervals: Intervals | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if str(self.model).startswith(("timm:", "torchvision:", "ensemble:")):
            raise ValueError(f"oscr needs a checkpoint of train.py (a classifier trained on an open-set protocol, whose "
                             f"test set holds its negatives and unknowns), got the model name {self.model!r}; the "
                             "other commands (severity, generated, evg) take timm:, torchvision: and ensemble: models")
        self.intervals = Intervals.of(self.intervals)
        self.fpr = list(self.fpr)
        self.conventions = list(self.ccr_convention)

    def run(self) -> MethodResult | None:
        # both refusals before anything runs: a model that is no classifier of train.py (a generator has no
        # protocol test set), and a report folder that cannot be written (by default next to the checkpoint)
        scoring = self.scoring_model(self.model)  # a report card's built model: no second read of the checkpoint
        if not isinstance(scoring.network, OpenSetClassifier) or scoring.checkpoint is None:
            raise ValueError(f"oscr needs a classifier of train.py (trained with a loss of configs/loss/), whose test "
                             f"set holds its protocol's negatives and unknowns; {self.model} holds a "
                             f"{type(scoring.network).__name__}")
        datamodule = scoring.training_datamodule(self.data_args)
        names = getattr(datamodule, "class_names", None)
        check_classes(checkpoint_classes(scoring.checkpoint, self.model), list(names) if names is not None else None,
                      model=f"checkpoint {self.model}", data=f"its datamodule with {self.data_args or {}}")
        checkpoint_path = Path(self.model)
        output_dir = Path(self.output_dir if self.output_dir is not None
                          else checkpoint_path.parent / f"{checkpoint_path.stem}-oscr")
        check_output_dir(output_dir)
        test_set, skipped = protocol_test_set(datamodule)
        evaluation = OpenSetEvaluation(fpr_targets=self.fpr, output_dir=self.output_dir, plots=self.plots,
                                       conventions=self.conventions, intervals=self.intervals,
                                       checkpoint=self.model)
        passes = self.scoring_passes(self.cache_dir)

        def evaluate(runner: Runner) -> MethodResult | None:
            result = evaluation.evaluate(runner, scoring, test_set, passes=passes, batch_size=datamodule.batch_size,
                                         num_workers=datamodule.num_workers, skipped=skipped,
                                         model_input=datamodule.model_input())
            if not runner.is_global_zero:
                return None
            print(f"\nOpen-set report written to {evaluation.report_path} (CCR@FPR conventions: "
                  + ", ".join(f"{c} = {'authors_ccr@fpr' if c == 'authors' else 'ccr@fpr'}" for c in self.conventions)
                  + "; nan = the authors' '—')")
            intervals = result.get("intervals", {})
            for name, value in sorted(result["scalars"].items()):
                low, high = intervals.get(name, (None, None))
                print(f"  {name:40s} {value:.4f}" + (f"  [{low:.4f}, {high:.4f}]" if low is not None else ""))
            return result

        return Runner.launch(self.options, evaluate, name=f"oscr-{checkpoint_path.stem}",
                             version=scoring.checkpoint.get("logger_version"))


def protocol_test_set(datamodule: Any) -> tuple[EvaluationSet, int]:
    """A protocol datamodule's test set (knowns, negatives -1, unknowns -2) as an evaluation set of raw images,
    and how many unreadable images were left out of it (its ``on_bad_image: skip``; each named in a warning)."""
    test_set = datamodule.evaluation_set("test", role="open_set_test", name="test")
    dataset = test_set.dataset
    if isinstance(dataset, ImageFileDataset) and dataset.on_bad_image == "skip":
        readable = without_unreadable(dataset, what=f"the test set of {type(datamodule).__name__}")
        if readable is not dataset:
            return (EvaluationSet(test_set.name, test_set.role, readable, info=test_set.info),
                    len(dataset) - len(readable))
    return test_set, 0


def is_checkpoint(spec: str) -> bool:
    """A checkpoint of ``train.py`` (what OSCR needs: its protocol's test set)."""
    return spec.endswith(".ckpt") and not spec.startswith("ensemble:")


@register
class OpenSetMethod(Method):
    """Open-set recognition (Palechor et al.): every checkpoint of ``train.py`` on its protocol's test set."""

    key, evaluation, per_model = "open_set", OSCREvaluation, True
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
        return Section(self.key, self.title, (
            "Every number of the open-set test report of each checkpoint on its protocol's test set: CCR at each "
            "FPR target on negatives (-1, seen in training) and unknowns (-2, never seen), the AUROC of knowns vs "
            f"each group, closed-set accuracy and γ. Intervals: resampling unit {self.unit}."),
            [Table("open-set report", ["model", "metric", "value"], table)], figures)

    def notes(self, results: Any, models: Any) -> list[str]:
        skipped = [m.display_name for m in models if m.display_name not in results]
        return ([f"OSCR needs a checkpoint of train.py (its protocol's test set): not run for {', '.join(skipped)}."]
                if skipped else [])
