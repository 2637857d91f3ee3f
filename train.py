"""Training entry point: LightningCLI ``fit`` / ``validate`` / ``test`` / ``predict`` of every LightningModule.

    python train.py fit --config configs/trainer/default.yaml --config configs/protocol/p1.yaml \\
        --config configs/model/resnet50.yaml --config configs/loss/eos.yaml --data.init_args.root /data/ILSVRC2012

Configs compose left to right (later ones override). The number of known classes is linked from the
datamodule to the model, and the model's loss decides how the training set treats negatives
(``train_negatives``), so a config names the protocol and the loss once each. ``fit --ckpt_path`` resumes
training and, unless a logger version is given, logging into the same logger run.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from lightning_modules.checkpoint import read_checkpoint
from lightning_modules.open_set_classifier import train_negatives_for_loss


def _loggers(trainer_config: Any) -> list[Any]:
    logger = trainer_config.get("logger")
    if logger is None or isinstance(logger, bool):
        return []
    return list(logger) if isinstance(logger, list) else [logger]


def checkpoint_logger_version(path: str) -> Any:
    """The logger version (W&B run id, CSV version) recorded in a checkpoint, or ``None``."""
    return read_checkpoint(path).get("logger_version")


class OpenSetCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
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


def main(args: list[str] | None = None) -> OpenSetCLI:
    return OpenSetCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=42,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
