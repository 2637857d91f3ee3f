"""What every evaluation command shares: the base of the typed evaluations (:class:`Evaluation`).

Each command of ``evaluate.py`` is a typed evaluation object (:class:`Evaluation`): its ``__init__``
signature is the command's options (``evaluate.py`` parses them with jsonargparse, so ``--config`` files
are YAML of the same keys, ``class_path`` where a component is configured, and every value is checked by
type), and :meth:`Evaluation.run` checks and builds what the method needs (models once, data, detectors), then
runs its callback's ``evaluate`` in the processes of a :class:`evaluation_engine.runner.Runner` and returns its
:class:`evaluation_engine.results.MethodResult`. The same objects run from Python in a few lines::

    from evaluation_methods import SeverityEvaluation
    from evaluation_engine import TrainerOptions
    tables = SeverityEvaluation.of(model="runs/demo/checkpoints/best.ckpt", data="fashion",
                                   kappa=["softmax", "energy"], trainer=TrainerOptions(accelerator="cpu")).run()

The options every command repeats are typed groups (:mod:`evaluation_engine.options`): ``.of`` takes them by
their flat names, as the command line does; the constructor takes the groups themselves
(``SeverityEvaluation(model=..., detector_options=DetectorOptions(kappa=["energy"]))``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

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


class Evaluation:
    """The base of the typed evaluations: the trainer options, the shared option groups, and :meth:`run`.

    Args:
        trainer: the Trainer and logging options (default: :class:`TrainerOptions`' defaults).
        groups: the shared option groups the command composes (:mod:`evaluation_engine.options`: its ``__init__``
            names them, e.g. ``detector_options: DetectorOptions | None``), each ``None``, a mapping of its fields
            or the group; built over :attr:`option_defaults`, kept as attributes of their names, and their fields
            the command reads (:attr:`option_fields`) as attributes of theirs (``self.kappa``).
    """

    command: str = ""
    # how evaluate.py reads the command's line beyond the shared vocabulary: the option that takes the leading
    # positional values (``severity-plot TABLE...``); options of an old spelling, mapped with a deprecation
    # warning (name -> (new name, what the warning says)); options no longer needed, ignored with a warning
    # that says why (name -> why)
    positional: str | None = None
    renamed_options: dict[str, tuple[str, str]] = {}
    dropped_options: dict[str, str] = {}
    # the fields of a shared option group the command reads (group parameter -> field names; default: all of them)
    # and the command's defaults of group fields (field -> value), on the command line, in YAML and from Python
    option_fields: dict[str, tuple[str, ...]] = {}
    option_defaults: dict[str, Any] = {}
    # the scoring passes of a run of several evaluations (the report card's): set by that run, else None and
    # each evaluation keeps its own (evaluation_engine.scoring.ScoringPasses)
    shared_passes: Any = None
    # the models a run of several evaluations built (the report card's), by spec: each section scores those
    # (its checkpoints are read once per card); else None and each evaluation builds its own
    built_models: dict[str, Any] | None = None
    # the command's scoring passes read image files and can decode them on the device (--decode device)
    decodes_on_device: bool = False

    def __init__(self, *, trainer: TrainerOptions | None = None, **groups: Any) -> None:
        from evaluation_engine.options import build_group, group_fields, option_groups

        self.options = TrainerOptions.of(trainer)
        if self.options.decode == "device" and not self.decodes_on_device:
            raise ValueError(f"evaluate.py {self.command} decodes its images on the CPU (--decode device applies to "
                             "the scoring passes of oscr, severity, generated, evg and report)")
        declared = option_groups(type(self))
        for parameter in declared:
            group = build_group(type(self), parameter, groups.pop(parameter, None))
            setattr(self, parameter, group)
            for name in group_fields(type(self), parameter, declared[parameter]):
                setattr(self, name, getattr(group, name))
        if groups:
            raise TypeError(f"{type(self).__name__} composes no option groups {sorted(groups)}")

    @classmethod
    def of(cls, **options: Any) -> Evaluation:
        """The command from flat option names, as on the command line (``kappa=[...]``, ``data="fashion"``,
        ``output_dir=...``, its own options, ``trainer=``): each shared group's fields gathered into the group."""
        from evaluation_engine.options import compose

        return cls(**compose(cls, options))

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
