"""Where an evaluation runs: :class:`Runner`, its processes, its precision and its loggers (DESIGN.md §2).

Every evaluation of this project (severity, the generated benchmarks, EvG, OSCR, a plug-in's) is one method,
``evaluate(runner, ...)`` of its callback, and runs in one of two places:

- **launched** (``evaluate.py``, Python, the report card): :meth:`Runner.launch` starts the processes with
  Lightning Fabric's launcher (one process on the CPU or one GPU; ``--devices N --strategy ddp`` starts the
  other ranks as Lightning's Trainer does; under ``torchrun`` each process joins the group), moves nothing,
  loops over nothing, and calls the evaluation once in every process;
- **inside a Trainer** (a callback during training, or at a user's ``trainer.test``): :meth:`Runner.of` is the
  running Trainer's processes, precision and loggers.

Either way the evaluation sees the same few things: the rank and world size its sharded passes split the data
by (:func:`evaluation_engine.scoring.sharded_outputs`), the precision's forward context, a broadcast and a
barrier, the loggers, and a ``log_metrics`` that logs numbers equal on every rank once.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pytorch_lightning as pl
import torch
from lightning_fabric import Fabric
from pytorch_lightning.loggers import Logger, WandbLogger

from openset_common.typed import dataclass_of

T = TypeVar("T")

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


class Runner:
    """The processes an evaluation runs in (see the module docstring): give a ``fabric`` or a ``trainer``.

    Attributes:
        trainer: the Trainer it runs inside (during training, at a user's ``trainer.test``), else ``None``.
        stage: ``"val"`` inside a Trainer's validation (during training, ``trainer.validate``), else ``"test"`` (a
            launched run, a user's ``trainer.test``).
    """

    def __init__(self, *, fabric: Fabric | None = None, trainer: pl.Trainer | None = None) -> None:
        if (fabric is None) == (trainer is None):
            raise TypeError("a Runner runs in a Fabric or in a Trainer: give one of them")
        self.fabric, self.trainer = fabric, trainer
        # the precision that runs (Fabric's: on a CPU, 16-mixed runs as bf16-mixed), part of every cache key
        self._precision = str(trainer.precision if trainer is not None else fabric.strategy.precision.precision)

    @classmethod
    def of(cls, trainer: pl.Trainer) -> Runner:
        """The running Trainer's processes (a callback's hook)."""
        return cls(trainer=trainer)

    @classmethod
    def local(cls, precision: str = "32-true") -> Runner:
        """This one process on the CPU, launching nothing (a test, a notebook)."""
        return cls(fabric=Fabric(accelerator="cpu", devices=1, precision=precision))  # type: ignore[arg-type]

    @staticmethod
    def launch(options: TrainerOptions, evaluation: Callable[[Runner], T], *, name: str, version: Any = None) -> T:
        """Start the processes ``options`` ask for, with ``name``'s W&B run (:func:`evaluation_logger`), and call
        ``evaluation(runner)`` once in every process; returns its value (every rank's own).

        Raises:
            ValueError: an accelerator, device count, strategy or precision Lightning refuses here, naming it.
        """
        with evaluation_logger(options, name=name, version=version) as logger:
            try:
                fabric = Fabric(accelerator=options.accelerator, devices=options.devices, strategy=options.strategy,
                                num_nodes=options.num_nodes, precision=options.precision,  # type: ignore[arg-type]
                                loggers=[logger] if isinstance(logger, Logger) else None)
            except (ValueError, RuntimeError) as error:  # Fabric's refusal of an accelerator, a strategy, ...
                raise ValueError(f"the trainer options are not valid here: {error}") from None
            return fabric.launch(lambda fabric: evaluation(Runner(fabric=fabric)))

    # -- the processes ---------------------------------------------------------------------------

    @property
    def global_rank(self) -> int:
        return (self.fabric or self.trainer).global_rank  # type: ignore[union-attr]

    @property
    def world_size(self) -> int:
        return (self.fabric or self.trainer).world_size  # type: ignore[union-attr]

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def device(self) -> torch.device:
        return self.fabric.device if self.fabric is not None else self.trainer.strategy.root_device  # type: ignore[union-attr]

    def broadcast(self, value: T, src: int = 0) -> T:
        """``value`` of rank ``src`` on every rank (a collective)."""
        if self.fabric is not None:
            return self.fabric.broadcast(value, src=src)
        return self.trainer.strategy.broadcast(value, src=src)  # type: ignore[union-attr]

    def barrier(self) -> None:
        if self.fabric is not None:
            self.fabric.barrier()
        else:
            self.trainer.strategy.barrier()  # type: ignore[union-attr]

    # -- the precision ---------------------------------------------------------------------------

    @property
    def precision(self) -> str:
        """Lightning's name of the precision (``32-true``, ``bf16-mixed``): part of every pass's cache key."""
        return self._precision

    def forward_context(self) -> contextlib.AbstractContextManager:
        """The precision's context of a forward pass (autocast under ``*-mixed``)."""
        if self.fabric is not None:
            return self.fabric.autocast()
        return self.trainer.precision_plugin.forward_context()  # type: ignore[union-attr]

    # -- the run's place and its loggers ---------------------------------------------------------

    @property
    def stage(self) -> str:
        return "test" if self.trainer is None or self.trainer.testing else "val"

    @property
    def epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    @property
    def step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    @property
    def loggers(self) -> list[Any]:
        """The loggers on global rank zero (none on the other ranks: a report is rank zero's)."""
        if not self.is_global_zero:
            return []
        return list(self.fabric.loggers if self.fabric is not None else self.trainer.loggers)  # type: ignore[union-attr]

    @property
    def datamodule(self) -> Any:
        """The training datamodule of the Trainer it runs inside, else ``None``."""
        return getattr(self.trainer, "datamodule", None) if self.trainer is not None else None

    def log_metrics(self, scalars: Mapping[str, float], module: pl.LightningModule | None = None) -> None:
        """Log numbers equal on every rank: inside a Trainer's loop through ``module.log_dict`` (so that
        ``ModelCheckpoint`` can monitor them, NaN included; ``max`` keeps them exact for any world size), else
        straight to the loggers on global rank zero (finite values only)."""
        if self.trainer is not None and module is not None and getattr(module, "_trainer", None) is self.trainer:
            module.log_dict({k: torch.tensor(float(v), dtype=torch.float32) for k, v in scalars.items() if v is not None},
                            sync_dist=True, reduce_fx="max", add_dataloader_idx=False)  # NaN too: a monitored key stays
            return
        finite = {k: float(v) for k, v in scalars.items() if v is not None and math.isfinite(float(v))}
        for logger in self.loggers:
            logger.log_metrics(finite, step=self.step)

    @contextlib.contextmanager
    def on_device(self, *modules: torch.nn.Module) -> Iterator[None]:
        """The modules on this process's device, in the run's precision (a launched run's ``*-true`` precision
        converts their weights, as a Trainer's set-up does: ``64-true`` scores in float64) and in eval mode for the
        block; afterwards every parameter and buffer is back in its dtype and every submodule in its mode (a
        report card's models are shared by its sections; a model may keep parts in eval mode while it trains)."""
        modes = [(part, part.training) for module in modules for part in module.modules()]
        dtypes = [(owner, name, tensor.dtype, kind) for module in modules for owner in module.modules()
                  for kind, tensors in (("_parameters", owner._parameters), ("_buffers", owner._buffers))
                  for name, tensor in tensors.items() if tensor is not None]
        for module in modules:
            module.to(self.device).eval()
            if self.fabric is not None:  # a Trainer converted its module at set-up
                self.fabric.strategy.precision.convert_module(module)
        try:
            yield
        finally:
            for part, mode in modes:
                part.training = mode
            for owner, name, dtype, kind in dtypes:
                tensor = getattr(owner, kind)[name]
                if tensor is not None and tensor.dtype != dtype:
                    if kind == "_parameters":
                        tensor.data = tensor.data.to(dtype)
                    else:
                        owner._buffers[name] = tensor.to(dtype)
