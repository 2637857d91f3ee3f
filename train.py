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
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from lightning_modules.checkpoint import read_checkpoint
from lightning_modules.open_set_classifier import train_negatives_for_loss
from openset_common import atomic_write_text


def _loggers(trainer_config: Any) -> list[Any]:
    logger = trainer_config.get("logger")
    if logger is None or isinstance(logger, bool):
        return []
    return list(logger) if isinstance(logger, list) else [logger]


def checkpoint_logger_version(path: str) -> Any:
    """The logger version (W&B run id, CSV version) recorded in a checkpoint, or ``None``."""
    return read_checkpoint(path).get("logger_version")


class OpenSetCLI(LightningCLI):
    member_dir: Path | None = None  # set by `train.py ensemble`: this run's checkpoints go there

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
    """``train.py ensemble --members M --seed S --out-dir D <fit arguments>``: M fit runs, one per seed.

    Returns the members' best checkpoints (also listed in ``<out-dir>/ensemble.txt``, written last and
    atomically, so an interrupted ensemble is never taken as complete).
    """
    parser = argparse.ArgumentParser(prog="train.py ensemble", description=train_ensemble.__doc__)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="member m is trained with seed + m")
    parser.add_argument("--out-dir", type=Path, required=True)
    args, fit_args = parser.parse_known_args(argv)
    if args.members < 1:
        raise SystemExit(f"--members must be positive, got {args.members}")
    checkpoints = []
    for member in range(args.members):
        member_dir = args.out_dir / f"member_{member}"
        cli = main(["fit", *fit_args, f"--seed_everything={args.seed + member}"], member_dir=member_dir)
        callback = cli.trainer.checkpoint_callback
        best = Path(callback.best_model_path) if callback is not None and callback.best_model_path else None
        if best is None or not best.is_file():
            raise SystemExit(f"member {member} wrote no checkpoint in {member_dir}: the configuration needs a "
                             "ModelCheckpoint callback")
        checkpoints.append(best)
    # paths relative to the members file: the ensemble can be moved or read from another directory
    listed = [os.path.relpath(path.resolve(), args.out_dir.resolve()) for path in checkpoints]
    atomic_write_text(args.out_dir / "ensemble.txt", "".join(f"{path}\n" for path in listed))
    return checkpoints


if __name__ == "__main__":
    if sys.argv[1:2] == ["ensemble"]:
        train_ensemble(sys.argv[2:])
    else:
        main()
