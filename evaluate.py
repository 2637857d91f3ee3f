"""Evaluation entry point.

    python evaluate.py oscr --ckpt runs/.../checkpoints/best.ckpt [--devices 2 --strategy ddp]
    python evaluate.py severity --model timm:resnet50 --kappa softmax entropy odin --data imagenet \
        --data-arg id_root=/data/ILSVRC2012/val --data-arg pool_root=/data/imagenet21k --data-arg pool_file=pool.csv

``oscr``: the open-set test report of Palechor et al. (CCR at FPR on negatives and unknowns, AUROC,
closed-set accuracy, OSCR curves and score histograms) of a checkpoint of ``train.py``. The model and the
datamodule are rebuilt from the checkpoint alone; ``--data KEY=VALUE`` overrides a datamodule argument
(for example the ImageNet root on another machine). The report goes next to the checkpoint unless
``--output-dir`` is given, and to W&B (offline unless ``--wandb-mode online``).

``severity``: the model-tailored C-OOD severity benchmark of Galil et al. (11 severity levels built for
each (model, κ) pair, AUROC per level) of any timm/torchvision ImageNet classifier or checkpoint of
``train.py``. Model outputs are cached in ``--cache-dir``, so a second κ on the same model does not run
the model again. ``--data imagenet`` uses ImageNet-1k val and the ImageNet-21k pool file of
``python -m datamodules.imagenet21k sample``; ``--data protocol`` the pool of a P1-P3 checkpoint (its
unknown classes); ``--data fashion`` is the embedded Fashion-MNIST + digits default.

Both commands run the same callbacks as training (:class:`callbacks.OpenSetEvaluation`,
:class:`callbacks.SeverityAUROC`) through ``trainer.test``; this file only parses, builds and runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import yaml
from pytorch_lightning.loggers import Logger, WandbLogger

from callbacks import OpenSetEvaluation
from lightning_modules.checkpoint import CheckpointError, import_class, load_module, read_checkpoint
from metrics import DEFAULT_FPR_TARGETS


def parse_overrides(pairs: list[str], option: str = "--data") -> dict[str, Any]:
    """``["root=/data", "batch_size=32"]`` -> ``{"root": "/data", "batch_size": 32}`` (values parsed as YAML)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{option} expects KEY=VALUE, got {pair!r}")
        overrides[key] = yaml.safe_load(value)
    return overrides


def parse_kappa_args(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """``["odin.temperature=1000"]`` -> ``{"odin": {"temperature": 1000}}``."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in parse_overrides(pairs, "--kappa-arg").items():
        kappa, dot, name = key.partition(".")
        if not dot or not name:
            raise SystemExit(f"--kappa-arg expects KAPPA.NAME=VALUE (e.g. odin.temperature=1000), got {key!r}")
        nested.setdefault(kappa, {})[name] = value
    return nested


def load_checkpoint_run(ckpt: str, data_overrides: dict[str, Any]) -> tuple[pl.LightningModule, pl.LightningDataModule, dict]:
    """Rebuild the model and datamodule recorded in a checkpoint of ``train.py``."""
    path = Path(ckpt)
    try:
        checkpoint = read_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as error:
        raise SystemExit(str(error)) from None
    for key in ("model_class", "datamodule_class", "datamodule_hyper_parameters"):
        if key not in checkpoint:
            raise SystemExit(f"checkpoint {path} has no {key!r}: it was not written by train.py with a datamodule")
    model = load_module(path, checkpoint)
    # LightningCLI records bookkeeping keys such as "_class_path" next to the arguments.
    saved = {k: v for k, v in checkpoint["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    datamodule_args = {**saved, **data_overrides}
    datamodule = import_class(checkpoint["datamodule_class"])(**datamodule_args)
    return model, datamodule, checkpoint


def make_logger(args: argparse.Namespace, checkpoint: dict, name: str) -> Logger | bool:
    if args.wandb_mode == "disabled":
        return False
    version = args.wandb_id or checkpoint.get("logger_version")
    return WandbLogger(
        project=args.wandb_project,
        name=name,
        save_dir=args.log_dir,
        offline=args.wandb_mode == "offline",
        id=version if isinstance(version, str) else None,
        resume="allow",
    )


def make_trainer(args: argparse.Namespace, logger: Logger | bool, callbacks: list[pl.Callback], **overrides: Any
                 ) -> pl.Trainer:
    return pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        num_nodes=args.num_nodes,
        precision=args.precision,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=not args.no_progress_bar,
        **overrides,
    )


def run_oscr(args: argparse.Namespace) -> dict[str, Any] | None:
    model, datamodule, checkpoint = load_checkpoint_run(args.ckpt, parse_overrides(args.data))
    evaluation = OpenSetEvaluation(fpr_targets=args.fpr, output_dir=args.output_dir, plots=not args.no_plots,
                                   conventions=args.ccr_convention)
    logger = make_logger(args, checkpoint, name=f"oscr-{Path(args.ckpt).stem}")
    trainer = make_trainer(args, logger, [evaluation])
    trainer.test(model, datamodule=datamodule, ckpt_path=args.ckpt)
    if trainer.is_global_zero and evaluation.report_path is not None:
        report = json.loads((evaluation.report_path / "metrics.json").read_text())
        print(f"\nOpen-set report written to {evaluation.report_path} (CCR@FPR conventions: "
              + ", ".join(f"{c} = {'authors_ccr@fpr' if c == 'authors' else 'ccr@fpr'}" for c in args.ccr_convention)
              + "; nan = the authors' '—')")
        for name, value in sorted(report["scalars"].items()):
            print(f"  {name:40s} {value:.4f}")
        return report
    return None


DATA_SHORTCUTS = {
    "imagenet": "datamodules.severity.ImageNetSeverityDataModule",
    "protocol": "datamodules.severity.ProtocolSeverityDataModule",
    "fashion": "datamodules.severity.FashionSeverityDataModule",
}
# arguments of a severity datamodule that a checkpoint's own datamodule determines (its classes, its data)
FROM_CHECKPOINT = {"known": "known", "negative": "negative", "protocol": "protocol", "root": "root"}


def build_severity_data(args: argparse.Namespace, scoring: pl.LightningModule) -> Any:
    import inspect

    data_class = import_class(DATA_SHORTCUTS.get(args.data, args.data))
    data_args = parse_overrides(args.data_arg)
    parameters = inspect.signature(data_class).parameters
    if "transform" in parameters and "transform" not in data_args:
        data_args["transform"] = scoring.eval_transform  # the model's own evaluation transform
    if args.model.endswith(".ckpt"):  # the classes (and data) this checkpoint was trained on
        trained = read_checkpoint(args.model).get("datamodule_hyper_parameters", {})
        for name, source in FROM_CHECKPOINT.items():
            if name in parameters and name not in data_args and trained.get(source) is not None:
                value = trained[source]
                data_args[name] = list(value) if isinstance(value, (list, tuple)) else value
    for name in ("batch_size", "num_workers"):
        if getattr(args, name) is not None and name in parameters:
            data_args.setdefault(name, getattr(args, name))
    return data_class(**data_args)


def run_severity(args: argparse.Namespace) -> dict[str, Any]:
    from callbacks import SeverityAUROC
    from callbacks.severity import slug
    from lightning_modules.scoring import ScoringModel

    try:
        scoring = ScoringModel(args.model, pretrained=not args.random_weights, pretrained_file=args.pretrained_file,
                               model_args=parse_overrides(args.model_arg, "--model-arg"))
    except (FileNotFoundError, CheckpointError) as error:
        raise SystemExit(str(error)) from None
    datamodule = build_severity_data(args, scoring)
    output_dir = Path(args.output_dir or Path("runs/severity") / slug(scoring.display_name))
    severity = SeverityAUROC(data=datamodule, kappas=args.kappa, kappa_args=parse_kappa_args(args.kappa_arg),
                             every_n_epochs=0, num_levels=args.num_levels, cache_dir=args.cache_dir,
                             output_dir=str(output_dir), plots=not args.no_plots)
    logger = make_logger(args, {}, name=f"severity-{scoring.display_name}")
    # The callback shards its own passes over the ID and OOD splits; the test loop only starts the processes
    # and calls it, so one batch of the ID images is all it needs to see.
    trainer = make_trainer(args, logger, [severity], limit_test_batches=1)
    trainer.test(scoring, dataloaders=datamodule.dataloader("id"))
    tables = severity.tables
    if trainer.is_global_zero:
        print(f"\nSeverity tables written to {output_dir} ({severity.model_passes} model passes, "
              f"the rest from the cache {args.cache_dir})")
        for name, rows in tables.items():
            print(f"  {scoring.display_name} / {name}: OOD AUROC by level "
                  + " ".join(f"{row['ood-auroc']:.3f}" for row in rows))
    return tables


def run_severity_plot(args: argparse.Namespace) -> Path:
    """One figure of OOD AUROC against severity for every (model, κ) in the given tables."""
    import csv

    from callbacks.plots import plot_severity
    from metrics import TABLE_COLUMNS

    tables: dict[str, list[dict[str, float]]] = {}
    for path in args.tables:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in ("severity level", "ood-auroc", "model name - confidence function")
                       if c not in (reader.fieldnames or [])]
            if missing:
                raise SystemExit(f"{path} is not a severity table: columns {missing} are missing ({list(TABLE_COLUMNS)})")
            for row in reader:
                tables.setdefault(row["model name - confidence function"], []).append(
                    {"severity level": int(row["severity level"]), "ood-auroc": float(row["ood-auroc"])})
    figure = plot_severity(tables, args.output)
    print(f"Severity figure of {len(tables)} tables: {figure}")
    return figure


def add_trainer_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("trainer")
    group.add_argument("--accelerator", default="auto")
    group.add_argument("--devices", default="auto", help="number of devices per node, or 'auto'")
    group.add_argument("--strategy", default="auto", help="e.g. ddp for several devices")
    group.add_argument("--num-nodes", type=int, default=1)
    group.add_argument("--precision", default="32-true", help="e.g. bf16-mixed on GPUs")
    group.add_argument("--wandb-mode", choices=("offline", "online", "disabled"), default="offline")
    group.add_argument("--wandb-project", default="openset-bench")
    group.add_argument("--wandb-id", default=None, help="log into this W&B run (default: the checkpoint's run)")
    group.add_argument("--log-dir", default="runs", help="where W&B writes its run folders")
    group.add_argument("--no-progress-bar", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    oscr = commands.add_parser("oscr", help="open-set report of a checkpoint (Palechor et al.)")
    oscr.add_argument("--ckpt", required=True, help="checkpoint written by train.py")
    oscr.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override a datamodule argument")
    oscr.add_argument("--fpr", type=float, nargs="+", default=list(DEFAULT_FPR_TARGETS), help="FPR targets for CCR")
    oscr.add_argument("--output-dir", default=None, help="report folder (default: <checkpoint dir>/<name>-oscr)")
    oscr.add_argument("--no-plots", action="store_true")
    oscr.add_argument("--ccr-convention", nargs="+", choices=("exact", "authors"), default=["exact"],
                      help="CCR@FPR: exact (largest CCR with FPR <= target) and/or the authors' table procedure")
    add_trainer_arguments(oscr)
    severity = commands.add_parser("severity", help="C-OOD severity benchmark of a model (Galil et al.)")
    severity.add_argument("--model", required=True, help="timm:<name>, torchvision:<name> or a train.py checkpoint")
    severity.add_argument("--kappa", nargs="+", default=["softmax"], help="confidence functions (metrics.KAPPAS)")
    severity.add_argument("--kappa-arg", action="append", default=[], metavar="KAPPA.NAME=VALUE",
                          help="a κ argument, e.g. odin.temperature=1000 or mc_dropout.passes=10")
    severity.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                          help="timm/torchvision model argument, e.g. drop_rate=0.2 (for mc_dropout)")
    severity.add_argument("--no-plots", action="store_true")
    severity.add_argument("--data", default="imagenet", help="imagenet, fashion, or a datamodule class path")
    severity.add_argument("--data-arg", action="append", default=[], metavar="KEY=VALUE", help="datamodule argument")
    severity.add_argument("--num-levels", type=int, default=11)
    severity.add_argument("--batch-size", type=int, default=None)
    severity.add_argument("--num-workers", type=int, default=None)
    severity.add_argument("--cache-dir", default="runs/cache", help="cached model outputs")
    severity.add_argument("--output-dir", default=None, help="tables and figure (default: runs/severity/<model>)")
    severity.add_argument("--pretrained-file", default=None, help="explicit weights file (timm)")
    severity.add_argument("--random-weights", action="store_true", help="no pretrained weights (tests only)")
    add_trainer_arguments(severity)
    severity_plot = commands.add_parser("severity-plot", help="plot several severity tables (models, κ) together")
    severity_plot.add_argument("tables", nargs="+", help="CSV tables of `evaluate.py severity` or the paper's")
    severity_plot.add_argument("--output", required=True, help="PNG file to write")
    return parser


def main(argv: list[str] | None = None) -> Any:
    args = build_parser().parse_args(argv)
    if isinstance(getattr(args, "devices", None), str) and args.devices.isdigit():
        args.devices = int(args.devices)
    if args.command == "oscr":
        return run_oscr(args)
    if args.command == "severity":
        return run_severity(args)
    if args.command == "severity-plot":
        return run_severity_plot(args)
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    main(sys.argv[1:])
