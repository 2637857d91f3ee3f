"""Training entry point: LightningCLI ``fit`` / ``validate`` / ``test`` / ``predict`` of every LightningModule.

    python train.py fit --config configs/trainer/default.yaml --config configs/protocol/p1.yaml \\
        --config configs/model/resnet50.yaml --config configs/loss/eos.yaml --data.init_args.root /data/ILSVRC2012

Configs compose left to right (later ones override). The number of known classes is linked from the
datamodule to the model, and the model's loss decides how the training set treats negatives
(``train_negatives``), so a config names the protocol and the loss once each. ``fit --ckpt_path`` resumes
training and, unless a logger version is given, logging into the same logger run.

A deep ensemble (Mukhoti et al.'s semantic regulariser) is M ordinary ``fit`` runs with seeds
``seed, seed+1, ...`` (initialisation and data order), each writing its checkpoints to
``<out-dir>/member_<m>/checkpoints/``, and ``<out-dir>/ensemble.txt`` listing the members' best checkpoints
(``lightning_modules.nets.ensemble.DeepEnsemble.from_checkpoints`` loads them)::

    python train.py ensemble --members 5 --seed 0 --out-dir runs/ensemble --config configs/demo/fashion_mnist_eos.yaml

After each fit the member's listed checkpoint is scored on the known classes of its datamodule's ID test split
and its accuracy printed; ``--min-accuracy`` states the bar every member must reach (the run stops at the
first member below it, naming it, its accuracy and the bar, and writes no members file). The accuracies and
the bar are recorded in ``<out-dir>/ensemble.json`` (:mod:`lightning_modules.ensemble_quality`), which the
generators and ``evaluate.py generate`` / ``generated`` read before they let the ensemble shape anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from datamodules.images import UnreadableImageError
from datamodules.shard_store import ShardError
from evaluation_engine.runner import wandb_env_mode
from lightning_modules.checkpoint import load_module, read_checkpoint
from lightning_modules.ensemble_quality import (
    QUALITY_FILE,
    EnsembleQuality,
    MemberAccuracy,
    WeakEnsembleError,
    check_bar,
    known_class_accuracy,
    sanity_bar,
    write_record,
)
from lightning_modules.open_set_classifier import OpenSetClassifier, train_negatives_for_loss
from openset_common.artefacts import atomic_write_text, file_sha256


def _loggers(trainer_config: Any) -> list[Any]:
    logger = trainer_config.get("logger")
    if logger is None or isinstance(logger, bool):
        return []
    return list(logger) if isinstance(logger, list) else [logger]


def follow_wandb_environment(loggers: list[Any], command_line: list[str]) -> None:
    """A W&B logger's ``offline: true`` from a config (the project's default, configs/trainer/default.yaml)
    gives way to the mode the environment sets (``WANDB_MODE`` ``disabled`` or ``online``, W&B's own values), as
    ``evaluate.py``'s default does: Lightning's ``WandbLogger(offline=True)`` would overwrite ``WANDB_MODE`` with
    ``dryrun``. ``offline`` given on the command line still wins."""
    mode = wandb_env_mode()
    if mode in (None, "offline") or any(arg.lstrip("-").startswith("trainer.logger") and "offline" in arg
                                        for arg in command_line):
        return
    for logger in loggers:
        init_args = logger.get("init_args")
        if logger.get("class_path", "").endswith("WandbLogger") and init_args is not None and init_args.get("offline"):
            init_args["offline"] = False  # wandb.init then reads WANDB_MODE itself


def checkpoint_logger_version(path: str) -> Any:
    """The logger version (W&B run id, CSV version) recorded in a checkpoint, or ``None``."""
    return read_checkpoint(path).get("logger_version")


class OpenSetCLI(LightningCLI):
    member_dir: Path | None = None  # set by `train.py ensemble`: this run's checkpoints go there
    command_line: list[str] = []  # the arguments given (main's args, else sys.argv's)

    def before_fit(self) -> None:
        folder = self.config[self.subcommand].get("checkpoint_dir")
        if self.member_dir is not None:
            folder = str(self.member_dir / "checkpoints")
        if folder is None:
            return
        for callback in self.trainer.checkpoint_callbacks:
            callback.dirpath = str(folder)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--checkpoint_dir", type=str | None, default=None,
                            help="write every ModelCheckpoint's files to this folder (overrides their dirpath)")
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments(
            "model.init_args.loss", "data.init_args.train_negatives", compute_fn=train_negatives_for_loss, apply_on="parse"
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("trainer") is not None:
            follow_wandb_environment(_loggers(config.trainer), self.command_line)
        ckpt_path = config.get("ckpt_path")
        if self.subcommand != "fit" or not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):
            return
        version = checkpoint_logger_version(ckpt_path)
        if version is None:
            return
        for logger in _loggers(config.trainer):
            init_args = logger.get("init_args")
            if init_args is not None and init_args.get("version") is None and init_args.get("id") is None:
                init_args["version"] = version
                if logger.get("class_path", "").endswith("WandbLogger"):
                    init_args["resume"] = "allow"


def main(args: list[str] | None = None, *, member_dir: Path | None = None) -> OpenSetCLI:
    OpenSetCLI.member_dir = member_dir
    OpenSetCLI.command_line = [str(a) for a in args] if isinstance(args, list) else sys.argv[1:] if args is None else []
    return OpenSetCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=42,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


def train_ensemble(argv: list[str]) -> list[Path]:
    """``train.py ensemble --members M --seed S --out-dir D [--min-accuracy A] <fit arguments>``: M fit runs, one
    per seed, each member's ID-test accuracy measured and checked against the bar.

    Returns the members' best checkpoints (also listed in ``<out-dir>/ensemble.txt``, written last and
    atomically, so an interrupted ensemble is never taken as complete; the accuracies in
    ``<out-dir>/ensemble.json`` just before it). A members file and record of an earlier run in ``D`` are
    removed before the first member trains: its members are about to be overwritten.

    Raises:
        WeakEnsembleError: a member's ID-test accuracy is below ``--min-accuracy`` (the message names the
            member, its accuracy and the bar; no members file is written).
    """
    parser = argparse.ArgumentParser(prog="train.py ensemble", description=train_ensemble.__doc__)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="member m is trained with seed + m")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--min-accuracy", type=float, default=None,
                        help="the known-class ID-test accuracy every member must reach (default: none stated; the "
                             "commands that use the ensemble then hold it to the sanity bar, chance plus half the way "
                             "to 1)")
    args, fit_args = parser.parse_known_args(argv)
    if args.members < 1:
        raise SystemExit(f"--members must be positive, got {args.members}")
    try:
        min_accuracy = check_bar(args.min_accuracy)
    except ValueError as error:
        raise SystemExit(f"--min-accuracy: {error}") from None
    for stale in ("ensemble.txt", QUALITY_FILE):  # an earlier run's: its members are about to be replaced
        (args.out_dir / stale).unlink(missing_ok=True)
    checkpoints, accuracies = [], []
    for member in range(args.members):
        member_dir = args.out_dir / f"member_{member}"
        seed = args.seed + member
        cli = main(["fit", *fit_args, f"--seed_everything={seed}"], member_dir=member_dir)
        callback = cli.trainer.checkpoint_callback
        best = Path(callback.best_model_path) if callback is not None and callback.best_model_path else None
        if best is None or not best.is_file():
            raise SystemExit(f"member {member} wrote no checkpoint in {member_dir}: the configuration needs a "
                             "ModelCheckpoint callback")
        accuracy = member_accuracy(best, cli, seed=seed)
        num_classes = int(cli.model.num_classes)
        bar = min_accuracy if min_accuracy is not None else sanity_bar(num_classes)
        stated = "the stated bar (--min-accuracy)" if min_accuracy is not None else "the sanity bar (none stated)"
        print(f"ensemble member {member} (seed {seed}): ID-test accuracy {accuracy.accuracy:.4f} on "
              f"{accuracy.images} known-class images; {stated} {bar:.3f}", flush=True)
        if accuracy.accuracy < bar:
            if min_accuracy is not None:
                raise WeakEnsembleError(
                    f"ensemble member {member} ({best}) has ID-test accuracy {accuracy.accuracy:.4f} on "
                    f"{accuracy.images} known-class images, below the bar --min-accuracy {min_accuracy}: no members "
                    f"file is written in {args.out_dir}; train the members longer (e.g. --trainer.max_epochs) or "
                    "state a lower bar")
            print(f"warning: member {member} is below the sanity bar {bar:.3f}: the generators and evaluate.py "
                  "generate/generated refuse this ensemble unless told (--allow-weak-ensemble)", flush=True)
        checkpoints.append(best)
        accuracies.append(accuracy)
    members_file = args.out_dir / "ensemble.txt"
    write_record(members_file, EnsembleQuality(tuple(accuracies), num_classes=num_classes, min_accuracy=min_accuracy,
                                               name=str(members_file)))
    # paths relative to the members file: the ensemble can be moved or read from another directory
    listed = [os.path.relpath(path.resolve(), args.out_dir.resolve()) for path in checkpoints]
    atomic_write_text(members_file, "".join(f"{path}\n" for path in listed))
    return checkpoints


def member_accuracy(checkpoint: Path, cli: OpenSetCLI, *, seed: int) -> MemberAccuracy:
    """The known-class ID-test accuracy of a member's listed checkpoint, on the datamodule it was trained with
    (already configured, e.g. with the data root of this machine), on the trainer's device."""
    module = load_module(checkpoint, expected=OpenSetClassifier,
                         hint="an ensemble member is a classifier (OpenSetClassifier) configuration")
    accuracy, images = known_class_accuracy(module, cli.datamodule, device=cli.trainer.strategy.root_device)
    return MemberAccuracy(str(checkpoint), accuracy, images, sha256=file_sha256(checkpoint), seed=seed)


def user_error(error: BaseException) -> BaseException:
    """The error a user's input raised, out of jsonargparse's wrapping: jsonargparse re-raises what a class's
    ``__init__`` raised while instantiating it ("Does not validate against any of the Union subtypes ...")
    with the original as ``__cause__``."""
    while error.__cause__ is not None and _raised_in_jsonargparse(error):
        error = error.__cause__
    return error


def _raised_in_jsonargparse(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}jsonargparse{os.sep}" in frames[-1].filename


def run(argv: list[str]) -> Any:
    """``train.py`` as a command: ``ensemble ...`` (:func:`train_ensemble`) or a LightningCLI subcommand
    (:func:`main`).

    Bad input (a ``ValueError``, ``OSError`` or unreadable image raised by the datamodule, the model or the
    data, also one that jsonargparse wrapped while it built a class) ends the command with its message, which
    names the file, class or value, instead of a traceback; any other error keeps its traceback.
    """
    try:
        if argv[:1] == ["ensemble"]:
            return train_ensemble(argv[1:])
        return main(argv)
    except (ValueError, OSError, UnreadableImageError, ShardError) as error:
        cause = user_error(error)
        if not isinstance(cause, (ValueError, OSError, UnreadableImageError, ShardError)):
            raise  # a class that failed for another reason than its input: keep the traceback
        raise SystemExit(f"train.py {argv[0]}: {cause}" if argv else f"train.py: {cause}") from None


if __name__ == "__main__":
    run(sys.argv[1:])
