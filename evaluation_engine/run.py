"""What every evaluation command shares: the trainer and W&B options, and the base of the typed evaluations.

Each command of ``evaluate.py`` is a typed evaluation object (:class:`Evaluation`): its ``__init__``
signature is the command's options (``evaluate.py`` parses them with jsonargparse, so ``--config`` files
are YAML of the same keys, ``class_path`` where a component is configured, and every value is checked by
type), and :meth:`Evaluation.run` builds the Trainer with the method's callback and returns the rows it
writes. The same objects run from Python in a few lines::

    from evaluation_methods import SeverityEvaluation
    from evaluation_engine import TrainerOptions
    tables = SeverityEvaluation.of(model="runs/demo/checkpoints/best.ckpt", data="fashion",
                                   kappa=["softmax", "energy"], trainer=TrainerOptions(accelerator="cpu")).run()

The options every command repeats are typed groups (:mod:`evaluation_engine.options`): ``.of`` takes them by
their flat names, as the command line does; the constructor takes the groups themselves
(``SeverityEvaluation(model=..., detector_options=DetectorOptions(kappa=["energy"]))``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import Logger, WandbLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from openset_common import dataclass_of

WANDB_MODES = ("offline", "online", "disabled")
# W&B's spellings of its modes in WANDB_MODE (wandb.sdk's settings): dryrun is offline, run and shared online
WANDB_ENV_MODES = {"offline": "offline", "dryrun": "offline", "online": "online", "run": "online",
                   "shared": "online", "disabled": "disabled"}


def wandb_env_mode() -> Literal["offline", "online", "disabled"] | None:
    """The W&B mode the environment asks for (``WANDB_MODE``, in W&B's own values), or ``None`` where it is unset.

    Raises:
        ValueError: ``WANDB_MODE`` holds a value W&B does not know, naming it and the values it takes.
    """
    value = os.environ.get("WANDB_MODE", "").strip()
    if not value:
        return None
    if value.lower() not in WANDB_ENV_MODES:
        raise ValueError(f"the environment's WANDB_MODE={value!r} is not a W&B mode (one of "
                         f"{sorted(WANDB_ENV_MODES)}); set it to one of them, or give --wandb-mode")
    return WANDB_ENV_MODES[value.lower()]  # type: ignore[return-value]


@dataclass
class TrainerOptions:
    """The Trainer and logging options of every evaluation command.

    Attributes:
        accelerator, devices, strategy, num_nodes, precision: the Lightning Trainer's (``devices 8``,
            ``strategy ddp``, ``precision bf16-mixed`` on GPUs).
        progress_bar: show Lightning's progress bar.
        wandb_mode: ``offline`` (runs in ``<log_dir>/wandb``, ``wandb sync`` uploads them), ``online`` or
            ``disabled``; default: the environment's ``WANDB_MODE`` where it is set (W&B's own values, ``dryrun``
            read as ``offline`` and ``run`` as ``online``), else ``offline`` (:func:`wandb_env_mode`). An option
            given wins over the environment.
        wandb_project: the W&B project.
        wandb_id: log into this W&B run (default: the checkpoint's own run, where there is one).
        log_dir: where W&B writes its run folders.
        decode: where the images of the scoring passes are decoded: ``cpu`` (in the loader's workers, with
            PIL) or ``device`` (the workers read the JPEG bytes; each batch is decoded and transformed on the
            model's device, nvJPEG on a GPU: :mod:`datamodules.device_decode`; sets of other images and model
            inputs of other steps than resize/crop stay on the CPU path). The two agree to 1/255 per pixel, and
            their passes are cached apart.
    """

    accelerator: str = "auto"
    devices: int | str = "auto"
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    progress_bar: bool = True
    wandb_mode: Literal["offline", "online", "disabled"] | None = None
    wandb_project: str = "openset-bench"
    wandb_id: str | None = None
    log_dir: str = "runs"
    decode: Literal["cpu", "device"] = "cpu"

    def __post_init__(self) -> None:
        if self.wandb_mode is None:  # not given: the user's environment, else the project's default
            self.wandb_mode = wandb_env_mode() or "offline"
        elif self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"wandb_mode must be one of {list(WANDB_MODES)}, got {self.wandb_mode!r}")
        if isinstance(self.devices, str) and self.devices.isdigit():
            self.devices = int(self.devices)
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be positive, got {self.num_nodes}")
        if isinstance(self.devices, int) and self.devices < 1:
            raise ValueError(f"devices must be a positive number of devices (or 'auto', '-1', a list such as "
                             f"'0,1'), got {self.devices}")

    @classmethod
    def of(cls, value: TrainerOptions | dict[str, Any] | None) -> TrainerOptions:
        """The options from ``None`` (the defaults), a mapping of their names (from Python or YAML), or themselves."""
        return dataclass_of(cls, value, what="trainer")


def release_peers(accelerator: str = "auto") -> bool:
    """On a process of a ``torchrun`` launch that fails before the run's process group exists (bad input on one
    node: its copy of the data missing): join the group and leave, so that the processes of the other nodes,
    waiting for this one in Lightning's set-up of the group, fail at their next collective instead of waiting out
    the group's 30-minute timeout. Returns whether it joined.

    The backend is the one Lightning picks (NCCL for CUDA devices, gloo otherwise); a join that does not come
    about within a minute is given up (the process then just exits)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized() or "TORCHELASTIC_RUN_ID" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    try:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=60))
    except Exception:  # noqa: BLE001 - the peers are gone or never came: nothing left to release
        return False
    return True


def make_logger(options: TrainerOptions, *, name: str, version: Any = None) -> Logger | bool:
    """The W&B logger of an evaluation (offline unless asked), into ``version``'s run when given."""
    if options.wandb_mode == "disabled":
        return False
    version = options.wandb_id or version
    # an ``online`` option wins over another WANDB_MODE of the environment, which wandb.init would read (offline:
    # Lightning sets WANDB_MODE itself)
    mode = {"mode": "online"} if options.wandb_mode == "online" and wandb_env_mode() not in (None, "online") else {}
    return WandbLogger(project=options.wandb_project, name=name, save_dir=options.log_dir,
                       offline=options.wandb_mode == "offline", id=version if isinstance(version, str) else None,
                       resume="allow", **mode)


@contextlib.contextmanager
def evaluation_logger(options: TrainerOptions, *, name: str, version: Any = None) -> Iterator[Logger | bool]:
    """:func:`make_logger`'s logger for one evaluation. The W&B run it starts is finished when the block ends, so
    the next evaluation of the process (the next command from Python, the report card's own W&B run) gets a run
    of its own instead of writing into this one (Lightning's logger reuses any run still open); a run that was
    open before the block (the user's own) is left open."""
    logger = make_logger(options, name=name, version=version)
    before = _open_wandb_run() if isinstance(logger, WandbLogger) else None
    try:
        yield logger
    finally:
        run = getattr(logger, "_experiment", None)  # None: the run never started (another rank, nothing logged)
        if run is not None and run is not before and callable(getattr(run, "finish", None)):
            run.finish()


def _open_wandb_run() -> Any:
    import wandb

    return wandb.run


def make_trainer(options: TrainerOptions, *, logger: Logger | bool, callbacks: list[pl.Callback],
                 **overrides: Any) -> pl.Trainer:
    try:
        return pl.Trainer(accelerator=options.accelerator, devices=options.devices, strategy=options.strategy,
                          num_nodes=options.num_nodes, precision=options.precision, logger=logger,
                          callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=options.progress_bar,
                          enable_model_summary=False, **overrides)
    except MisconfigurationException as error:  # accelerator, devices, strategy or precision Lightning refuses
        raise ValueError(f"the trainer options are not valid here: {error}") from None


def launch_loader() -> DataLoader:
    """The one-batch loader ``trainer.test`` / ``trainer.predict`` run to start the processes and call the
    callbacks, which run their own sharded passes over the evaluation data (never raw images in a batch)."""
    return DataLoader(TensorDataset(torch.zeros(1)), batch_size=1)


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
                             "the scoring passes of severity, generated, evg and report)")
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
