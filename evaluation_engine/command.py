"""What every evaluation command shares: the base of the typed evaluations (:class:`Evaluation`).

Each command of ``evaluate.py`` is a typed evaluation object (:class:`Evaluation`): its ``__init__``
signature is the command's options (``evaluate.py`` parses them with jsonargparse, so ``--config`` files
are YAML of the same keys, ``class_path`` where a component is configured, and every value is checked by
type), and :meth:`Evaluation.run` checks and builds what the method needs (models once, data, detectors), then
runs its callback's ``evaluate`` in the processes of a :class:`evaluation_engine.runner.Runner` and returns its
:class:`evaluation_engine.results.MethodResult`. The same objects run from Python in a few lines::

    from evaluation_methods import SeverityEvaluation
    from evaluation_engine import TrainerOptions
    tables = SeverityEvaluation(model="runs/demo/checkpoints/best.ckpt", data="fashion",
                                kappa=["softmax", "energy"], trainer=TrainerOptions(accelerator="cpu")).run()

A command is a keyword-only dataclass: its fields are its options, and it inherits the typed groups every command
shares (:mod:`evaluation_engine.options`), whose fields are its own by their flat names, as on the command line.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytorch_lightning as pl
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from evaluation_engine.options import OptionGroup
from evaluation_engine.runner import TrainerOptions


def make_trainer(options: TrainerOptions, *, logger: Logger | bool, callbacks: list[pl.Callback],
                 **overrides: Any) -> pl.Trainer:
    try:
        return pl.Trainer(accelerator=options.accelerator, devices=options.devices, strategy=options.strategy,
                          num_nodes=options.num_nodes, precision=options.precision, logger=logger,
                          callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=options.progress_bar,
                          enable_model_summary=False, **overrides)
    except MisconfigurationException as error:  # accelerator, devices, strategy or precision Lightning refuses
        raise ValueError(f"the trainer options are not valid here: {error}") from None


# oscr's and generate's --data KEY=VALUE of before one vocabulary: the datamodule overrides (kept for one release)
DATA_OVERRIDES_RENAMED = {"data": ("data_arg", "--data KEY=VALUE is deprecated (kept for one release): use --data-arg "
                                               "KEY=VALUE")}


@dataclass(kw_only=True, eq=False)
class Evaluation(OptionGroup):
    """The base of the typed evaluations: a keyword-only dataclass whose fields are the command's options, the
    trainer options, and :meth:`run`. A command inherits the option groups it reads
    (``class SeverityEvaluation(Evaluation, ModelOptions, DataOptions, DetectorOptions, OutputOptions)``), declares
    its own fields, checks them in ``__post_init__`` (after ``super().__post_init__()``, which checks the groups'),
    and is decorated ``@dataclass(kw_only=True, eq=False)`` itself.

    Attributes:
        trainer: the Trainer and logging options (default: :class:`TrainerOptions`' defaults); kept checked as
            :attr:`options`.
    """

    command: ClassVar[str] = ""
    # how evaluate.py reads the command's line beyond the shared vocabulary: the option that takes the leading
    # positional values (``severity-plot TABLE...``); options of an old spelling, mapped with a deprecation
    # warning (name -> (new name, what the warning says)); options no longer needed, ignored with a warning
    # that says why (name -> why)
    positional: ClassVar[str | None] = None
    renamed_options: ClassVar[dict[str, tuple[str, str]]] = {}
    dropped_options: ClassVar[dict[str, str]] = {}
    # the command's scoring passes read image files and can decode them on the device (--decode device)
    decodes_on_device: ClassVar[bool] = False

    # a command is compared and hashed as the object it is (the option groups it inherits compare by value)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    trainer: TrainerOptions | None = None
    # the scoring passes of a run of several evaluations (the report card's): set by that run, else None and
    # each evaluation keeps its own (evaluation_engine.scoring.ScoringPasses)
    shared_passes: Any = field(default=None, init=False, repr=False)
    # the models a run of several evaluations built (the report card's), by spec: each section scores those
    # (its checkpoints are read once per card); else None and each evaluation builds its own
    built_models: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.options = TrainerOptions.of(self.trainer)
        if self.options.decode == "device" and not self.decodes_on_device:
            raise ValueError(f"evaluate.py {self.command} decodes its images on the CPU (--decode device applies to "
                             "the scoring passes of oscr, severity, generated, evg and report)")

    @classmethod
    def of(cls, **options: Any) -> Evaluation:
        """Deprecated (kept for one release): the command is a keyword-only dataclass; call it with the same
        keywords."""
        warnings.warn(f"{cls.__name__}.of(...) is deprecated (kept for one release): call {cls.__name__}(...) with "
                      "the same keywords", FutureWarning, stacklevel=2)
        return cls(**options)

    def scoring_passes(self, cache_dir: str | Path | None) -> Any:
        """The passes the command's callback scores with: the run's shared ones (the report card's), else its own
        over ``cache_dir``, decoding where ``--decode`` says."""
        from evaluation_engine.scoring import ScoringPasses

        return self.shared_passes or ScoringPasses(cache_dir, decode=self.options.decode)

    def scoring_model(self, spec: Any, **build: Any) -> Any:
        """The :class:`lightning_modules.scoring.ScoringModel` of ``spec``: a model given built, the run's built one
        of that spec (the report card's) where this evaluation would build it alike, else built now with ``build``
        (``pretrained``, ``pretrained_file``, ``model_args``: a section's own ``model_args`` get a model of their
        own)."""
        from lightning_modules.scoring import ScoringModel, build_arguments

        if isinstance(spec, ScoringModel):
            return spec
        built = (self.built_models or {}).get(spec)
        if built is not None and built.build_arguments == build_arguments(spec, **build):
            return built
        return ScoringModel(spec, **build)

    def prepare(self) -> None:
        """What the command checks and builds before its first pass, for a run of several evaluations to do for
        all of them before any runs (the report card); :meth:`run` prepares what is not. Nothing by default."""

    def run(self) -> Any:
        raise NotImplementedError
