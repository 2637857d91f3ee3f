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


def load_scorers(args: argparse.Namespace, hparams: Any) -> tuple[Any, Any]:
    """The ensemble and LPIPS that measure a generated set: the command line's, else the generator's own."""
    from lightning_modules.nets.ensemble import DeepEnsemble
    from lightning_modules.nets.lpips import PerceptualDistance

    members = args.ensemble or hparams.get("ensemble")
    net = args.lpips_net or hparams.get("lpips_net", "vgg")
    random_backbone = args.lpips_random_backbone or bool(hparams.get("lpips_random_backbone", False))
    ensemble = DeepEnsemble.from_checkpoints(members) if members else None
    return ensemble, PerceptualDistance(net, random_backbone=random_backbone)


def run_generate(args: argparse.Namespace) -> Path | list[Path]:
    """Write ``--num`` images of each generator checkpoint as a generated set (:mod:`datamodules.generated`);
    several ``--ckpt`` with as many ``--output-dir`` share one process (and one start-up)."""
    if isinstance(args.ckpt, list):
        if len(args.ckpt) != len(args.output_dir):
            raise SystemExit(f"give one --output-dir per --ckpt: {len(args.ckpt)} checkpoints, "
                             f"{len(args.output_dir)} folders")
        folders = [run_generate(argparse.Namespace(**{**vars(args), "ckpt": ckpt, "output_dir": folder}))
                   for ckpt, folder in zip(args.ckpt, args.output_dir, strict=True)]
        return folders[0] if len(folders) == 1 else folders
    import torch
    from torch.utils.data import DataLoader, Subset

    from callbacks.generated import GeneratedSetWriter
    from common import file_sha256
    from datamodules.batch import collate_samples
    from datamodules.generated import LatentSeeds
    from lightning_modules.generated.generators import NearOODGenerator, RegularisedGenerator, ShiftGenerator

    try:
        checkpoint = read_checkpoint(args.ckpt)
        module = load_module(args.ckpt, checkpoint, expected=RegularisedGenerator)
    except (FileNotFoundError, CheckpointError) as error:
        raise SystemExit(str(error)) from None
    datamodule = import_class(checkpoint["datamodule_class"])(**{
        **{k: v for k, v in checkpoint.get("datamodule_hyper_parameters", {}).items() if not k.startswith("_")},
        **parse_overrides(args.data)})
    datamodule.setup("test")
    known = torch.nonzero(datamodule.test_set.labels >= 0).flatten()  # in-distribution test images
    ensemble, perceptual = load_scorers(args, module.hparams)
    if isinstance(module, ShiftGenerator):
        kind = "shift"
        chosen = known[: args.num].tolist()
        if len(chosen) < args.num:
            raise SystemExit(f"--num {args.num}: the data has only {len(chosen)} in-distribution test images to shift")
        loader = DataLoader(Subset(datamodule.test_set, chosen), batch_size=args.batch_size, collate_fn=collate_samples)
        module.attach_scorers(ensemble, perceptual)
    elif isinstance(module, NearOODGenerator):
        kind = "near_ood"
        loader = DataLoader(LatentSeeds(args.num, args.seed), batch_size=args.batch_size)
        reference = torch.stack([datamodule.test_set[i].image for i in known[: args.reference].tolist()])
        module.attach_scorers(ensemble, perceptual, reference=reference)
    else:
        raise SystemExit(f"{args.ckpt} holds a {type(module).__name__}, which generate does not know")
    info = {
        "kind": kind, "generator": str(args.ckpt), "generator_sha256": file_sha256(args.ckpt),
        "generator_class": type(module).__name__, "seed": args.seed,
        "lambda_perceptual": module.lambda_perceptual, "lambda_semantic": module.lambda_semantic,
        "lpips": perceptual.description, "ensemble": ensemble.paths if ensemble is not None else [],
        "reference_images": args.reference if kind == "near_ood" else None,
        "source": "in-distribution test images, in test-set order" if kind == "shift" else None,
    }
    writer = GeneratedSetWriter(args.output_dir, info, overwrite=args.overwrite)
    trainer = make_trainer(args, False, [writer])
    trainer.predict(module, dataloaders=loader, return_predictions=False)
    if trainer.is_global_zero:
        print(f"{writer.count} {kind} images written to {args.output_dir} ({perceptual.description})")
    return Path(args.output_dir)


def id_test_set(args: argparse.Namespace) -> Any:
    """The in-distribution test images of the generated benchmark: the known classes of a Fashion-MNIST
    protocol (``--id fashion``; ``--id-arg known=[0,1,7,8]``) or of a checkpoint's own datamodule."""
    (test,), datamodule = id_sets(args, ("test",))
    return test, datamodule


def id_sets(args: argparse.Namespace, splits: tuple[str, ...]) -> tuple[list[Any], Any]:
    """The known-class images of the ID datamodule's ``val`` / ``test`` sets (``--id``, ``--id-arg``)."""
    import torch

    from datamodules.images import TensorImageDataset

    id_args = parse_overrides(args.id_arg, "--id-arg")
    if args.id == "fashion":
        from datamodules import FashionMNISTOpenSetDataModule

        datamodule = FashionMNISTOpenSetDataModule(**id_args)
    else:
        checkpoint = read_checkpoint(args.id)
        saved = {k: v for k, v in checkpoint.get("datamodule_hyper_parameters", {}).items() if not k.startswith("_")}
        datamodule = import_class(checkpoint["datamodule_class"])(**{**saved, **id_args})
    sets = []
    for split in splits:
        datamodule.setup("fit" if split == "val" else "test")
        data = getattr(datamodule, f"{split}_set")
        known = torch.nonzero(data.labels >= 0).flatten() if isinstance(data, TensorImageDataset) else None
        if known is None:
            raise SystemExit(f"--id {args.id}: its {split} set is not an in-memory image set")
        # the datamodule's own transform (e.g. a generator checkpoint's 32 px resize) stays with the images
        sets.append(TensorImageDataset(data.images[known], data.labels[known], transform=data.transform))
    return sets, datamodule


def run_generated(args: argparse.Namespace) -> dict[str, Any]:
    """Detectors on generated sets next to real OOD sets, the sets' description, and the rank agreement."""
    from callbacks.generated import GeneratedBenchmark, markdown_table
    from callbacks.severity import rows_to_csv
    from common import atomic_write_text
    from datamodules.generated import GeneratedBenchmarkData
    from datamodules.sources import real_ood_set
    from lightning_modules.nets.ensemble import DeepEnsemble
    from lightning_modules.nets.lpips import PerceptualDistance
    from lightning_modules.scoring import ScoringModel
    from metrics import kendall_tau

    if not args.model:
        raise SystemExit("give at least one --model (or `model:` in --config)")
    id_test, datamodule = id_test_set(args)
    real = {}
    for pair in args.real_ood:
        name, sep, spec = pair.partition("=")
        real[name if sep else pair] = real_ood_set(spec if sep else pair, data_dir=datamodule._folder(),
                                                   known=datamodule.known)
    data = GeneratedBenchmarkData(id_test, near_ood=args.near_ood, shift=args.shift, real_ood=real,
                                  image_size=args.image_size, channels=args.channels, batch_size=args.batch_size)
    ensemble = DeepEnsemble.from_checkpoints(args.ensemble) if args.ensemble else None
    perceptual = (PerceptualDistance(args.lpips_net, random_backbone=args.lpips_random_backbone)
                  if args.lpips_net else None)
    output_dir = Path(args.output_dir)
    logger = make_logger(args, {}, name="generated-benchmark")
    detectors: list[dict[str, Any]] = []
    sets: list[dict[str, Any]] = []
    for index, model in enumerate(args.model):
        try:
            scoring = ScoringModel(model, pretrained=not args.random_weights)
        except (FileNotFoundError, CheckpointError) as error:
            raise SystemExit(str(error)) from None
        kappas = [k for k in args.kappa if (k.startswith("ensemble_")) == model.startswith("ensemble:")]
        benchmark = GeneratedBenchmark(data, kappas, ensemble=ensemble, perceptual=perceptual,
                                       reference=args.reference, describe_sets=index == 0, output_dir=output_dir,
                                       plots=not args.no_plots and index == 0)
        trainer = make_trainer(args, logger, [benchmark], limit_test_batches=1)
        trainer.test(scoring, dataloaders=data_loader(data), verbose=False)
        detectors += benchmark.detectors
        sets = sets or benchmark.sets
    result: dict[str, Any] = {"detectors": detectors, "sets": sets, "agreement": []}
    # rank agreement of the detectors between each generated near-OOD set and each real OOD set
    detectors_of = {}
    for row in detectors:
        detectors_of.setdefault(row["set"], {})[(row["model"], row["confidence function"])] = row["auroc"]
    generated = [n for n, k in data.kinds.items() if k == "near_ood"]
    real_sets = [n for n, k in data.kinds.items() if k == "real_ood"]
    for name in generated:
        for other in real_sets:
            pairs = sorted(set(detectors_of[name]) & set(detectors_of[other]))
            if len(pairs) >= 2:
                tau, p_value = kendall_tau([detectors_of[name][d] for d in pairs], [detectors_of[other][d] for d in pairs])
                result["agreement"].append({"generated": name, "real": other, "detectors": len(pairs),
                                            "kendall tau": tau, "p-value": p_value})
    if result["agreement"]:
        columns = ("generated", "real", "detectors", "kendall tau", "p-value")
        atomic_write_text(output_dir / "agreement.csv", rows_to_csv(result["agreement"], columns))
        atomic_write_text(output_dir / "agreement.md", markdown_table(result["agreement"], columns))
    columns = ("model", "confidence function", "set", "kind", "auroc", "accuracy", "ece", "images")
    atomic_write_text(output_dir / "detectors.md", markdown_table(detectors, columns))
    atomic_write_text(output_dir / "detectors.csv", rows_to_csv(detectors, columns))
    print(f"\nGenerated benchmark written to {output_dir}")
    print(markdown_table(detectors, columns))
    if sets:
        print((output_dir / "sets.md").read_text())
    return result


def run_adversarial(args: argparse.Namespace) -> dict[str, Any]:
    """Adversarial evaluation of detectors (EvG, Yoon et al.): MCMC over variation models of the OOD set."""
    import torch

    from callbacks.evg import AdversarialReport
    from datamodules.evg import AdversarialData, ChainBatches, chain_ranges
    from datamodules.sources import real_ood_set
    from lightning_modules.evg.search import AdversarialSearch, Detector
    from lightning_modules.evg.variations import (
        AffineVariation,
        ColourVariation,
        LatentVariation,
        PixelPerturbation,
    )
    from lightning_modules.generated.generators import NearOODGenerator

    if not args.model:
        raise SystemExit("give at least one --model (or `model:` in --config)")
    (id_validation, id_test), datamodule = id_sets(args, ("val", "test"))
    # Fashion-MNIST's folder and known classes matter for `fashion:` OOD sets only (an ImageNet protocol's
    # datamodule has neither; its OOD set is a folder)
    folder = datamodule._folder() if hasattr(datamodule, "_folder") else ""
    ood = real_ood_set(args.ood, data_dir=folder, known=getattr(datamodule, "known", ()))
    data = AdversarialData(id_validation=id_validation, id_test=id_test, ood=ood, image_size=args.image_size,
                           channels=args.channels, batch_size=args.batch_size)
    kappa_args = parse_kappa_args(args.kappa_arg)
    detectors: dict[str, Detector] = {}
    for model in args.model:
        for kappa in args.kappa:
            if kappa.startswith("ensemble_") != model.startswith("ensemble:"):
                continue  # ensemble κ go with ensemble models, the others with single models
            try:
                detector = Detector.from_spec(model, kappa, kappa_args=kappa_args.get(kappa),
                                              pretrained=not args.random_weights)
            except (FileNotFoundError, CheckpointError) as error:
                raise SystemExit(str(error)) from None
            detectors[detector.name] = detector
    if not detectors:
        raise SystemExit(f"no detector: models {args.model} and κ {args.kappa} do not pair (ensemble_* κ need "
                         "ensemble:<members> models, the others single models)")
    seeds = data.seed_images(args.chains)
    variation_args = parse_kappa_args(args.variation_arg)  # the same NAME.KEY=VALUE form
    variations: dict[str, torch.nn.Module] = {}
    for name in args.variation:
        options = variation_args.get(name, {})
        if name == "affine":
            variations[name] = AffineVariation(**options)
        elif name == "colour":
            variations[name] = ColourVariation(channels=seeds.shape[1], **options)
        elif name == "gan":
            if not args.gan:
                raise SystemExit("the gan variation needs --gan <generator checkpoint> (a plain GAN of train.py, "
                                 "e.g. configs/generators/digits_gan.yaml trained on the OOD set)")
            generator = load_module(args.gan, expected=NearOODGenerator)
            variations[name] = LatentVariation(generator, image_size=seeds.shape[-1], **options)
        elif name == "linf":
            variations[name] = PixelPerturbation(tuple(seeds.shape[1:]), **options)
        else:
            raise SystemExit(f"unknown variation model {name!r}; choose from affine, colour, gan, linf")
    sampler_args = parse_kappa_args(args.sampler_arg)
    module = AdversarialSearch(detectors, variations, {s: sampler_args.get(s, {}) for s in args.sampler}, seeds,
                               steps=args.steps, seed=args.seed, trace_every=args.trace_every)
    report = AdversarialReport(data, chains=args.chains, output_dir=args.output_dir, cache_dir=args.cache_dir,
                               plots=not args.no_plots)
    batches = ChainBatches(args.chains, args.chains_per_batch, done=report.done(module))
    skipped = [b for b in batches.all_bounds if b not in batches.bounds]
    if skipped:
        print(f"resuming: chains {chain_ranges(skipped)} have results in {report.chain_dir(module)} and are not rerun")
    logger = make_logger(args, {}, name="adversarial")
    # inference_mode off: model-based κ such as ODIN take input gradients inside the detector
    trainer = make_trainer(args, logger, [report], inference_mode=False)
    trainer.predict(module, dataloaders=batches.loader(), return_predictions=False)
    return {"rows": report.rows, "transfer": report.transfer, "output_dir": Path(args.output_dir)}


def data_loader(data: Any) -> Any:
    """One batch of the ID test set: ``trainer.test`` only starts the processes and calls the callback."""
    from torch.utils.data import DataLoader

    from datamodules.batch import collate_samples

    return DataLoader(data.sets["id_test"], batch_size=data.batch_size, collate_fn=collate_samples)


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


def add_detector_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--model`` and ``--kappa``: the detectors of the commands that evaluate several."""
    parser.add_argument("--config", default=None, help="a YAML file of these options (flags override it)")
    parser.add_argument("--model", nargs="+", default=None,
                        help="timm:<name>, torchvision:<name>, a train.py checkpoint or ensemble:<members file>")
    parser.add_argument("--kappa", nargs="+", default=["softmax"],
                        help="κ names; ensemble_* apply to ensemble models, the others to single models")


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
    generate = commands.add_parser("generate", help="write images of a generator checkpoint as a data set")
    generate.add_argument("--ckpt", nargs="+", required=True,
                          help="ShiftGenerator or NearOODGenerator checkpoints (one --output-dir each)")
    generate.add_argument("--num", type=int, required=True, help="number of images")
    generate.add_argument("--seed", type=int, default=0, help="near-OOD: image i comes from its own seed")
    generate.add_argument("--output-dir", nargs="+", required=True,
                          help="each set's folder (written whole or not at all)")
    generate.add_argument("--overwrite", action="store_true")
    generate.add_argument("--batch-size", type=int, default=64)
    generate.add_argument("--reference", type=int, default=256,
                          help="near-OOD: LPIPS to the nearest of this many ID test images")
    generate.add_argument("--ensemble", nargs="+", default=None, help="member checkpoints (default: the generator's)")
    generate.add_argument("--lpips-net", default=None, help="vgg, alex or squeeze (default: the generator's)")
    generate.add_argument("--lpips-random-backbone", action="store_true", help="random LPIPS backbone (tests)")
    generate.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="datamodule argument")
    add_trainer_arguments(generate)
    generated = commands.add_parser("generated", help="detectors on generated near-OOD and shifted sets")
    add_detector_arguments(generated)
    generated.add_argument("--id", default="fashion", help="fashion, or a checkpoint whose datamodule gives the ID test set")
    generated.add_argument("--id-arg", action="append", default=[], metavar="KEY=VALUE")
    generated.add_argument("--near-ood", nargs="*", default=[], help="generated near-OOD set folders")
    generated.add_argument("--shift", nargs="*", default=[], help="generated shifted set folders")
    generated.add_argument("--real-ood", nargs="*", default=[], metavar="NAME=SPEC",
                           help="real OOD sets: digits, fashion:unknown, fashion:<ids>, or an image folder")
    generated.add_argument("--image-size", type=int, default=None, help="resize every set to this (the models' input)")
    generated.add_argument("--channels", type=int, default=None, help="convert every set to this many channels")
    generated.add_argument("--ensemble", nargs="+", default=None,
                           help="ensemble members (checkpoints or a members file) that describe the sets (MI)")
    generated.add_argument("--lpips-net", default=None, help="LPIPS backbone that describes the sets")
    generated.add_argument("--lpips-random-backbone", action="store_true")
    generated.add_argument("--reference", type=int, default=128, help="ID images the nearest-image LPIPS searches")
    generated.add_argument("--batch-size", type=int, default=256)
    generated.add_argument("--random-weights", action="store_true", help="timm/torchvision without weights (tests)")
    generated.add_argument("--output-dir", default="runs/generated")
    generated.add_argument("--no-plots", action="store_true")
    add_trainer_arguments(generated)
    adversarial = commands.add_parser("adversarial", help="worst-case outliers of detectors by MCMC (EvG)")
    add_detector_arguments(adversarial)
    adversarial.add_argument("--kappa-arg", action="append", default=[], metavar="KAPPA.NAME=VALUE")
    adversarial.add_argument("--id", default="fashion", help="fashion, or a checkpoint whose datamodule gives the "
                             "ID validation and test sets")
    adversarial.add_argument("--id-arg", action="append", default=[], metavar="KEY=VALUE")
    adversarial.add_argument("--ood", default="digits", help="the OOD set: digits, fashion:unknown, fashion:<ids> "
                             "or an image folder")
    adversarial.add_argument("--image-size", type=int, default=None, help="the detectors' input size")
    adversarial.add_argument("--channels", type=int, default=None, help="the detectors' input channels")
    adversarial.add_argument("--variation", nargs="+", default=["affine", "colour"],
                             help="variation models: affine, colour, gan (needs --gan), linf")
    adversarial.add_argument("--variation-arg", action="append", default=[], metavar="VARIATION.NAME=VALUE",
                             help="e.g. affine.scale=[0.9,1.2] or gan.radius=8")
    adversarial.add_argument("--gan", default=None, help="generator checkpoint of the gan variation model")
    adversarial.add_argument("--sampler", nargs="+", default=["mh", "random"],
                             help="samplers: mh, random, coordinate, linf (the l-infinity baseline, with linf)")
    adversarial.add_argument("--sampler-arg", action="append", default=[], metavar="SAMPLER.NAME=VALUE",
                             help="e.g. mh.temperature=1 or mh.step_size=0.1")
    adversarial.add_argument("--chains", type=int, default=1000, help="chains per search (chain i varies OOD image i)")
    adversarial.add_argument("--steps", type=int, default=2000, help="detector calls per chain")
    adversarial.add_argument("--chains-per-batch", type=int, default=100,
                             help="chains moved together (keep it to resume an interrupted run)")
    adversarial.add_argument("--seed", type=int, default=0)
    adversarial.add_argument("--trace-every", type=int, default=10, help="energy trace thinning (steps)")
    adversarial.add_argument("--batch-size", type=int, default=256, help="of the passes over the ID and OOD sets")
    adversarial.add_argument("--random-weights", action="store_true", help="timm/torchvision without weights (tests)")
    adversarial.add_argument("--output-dir", default="runs/adversarial")
    adversarial.add_argument("--cache-dir", default=None, help="detector score cache (default: <output-dir>/cache)")
    adversarial.add_argument("--no-plots", action="store_true")
    add_trainer_arguments(adversarial)
    severity_plot = commands.add_parser("severity-plot", help="plot several severity tables (models, κ) together")
    severity_plot.add_argument("tables", nargs="+", help="CSV tables of `evaluate.py severity` or the paper's")
    severity_plot.add_argument("--output", required=True, help="PNG file to write")
    parser.commands = commands.choices  # type: ignore[attr-defined]
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Parse, with the options of a ``--config`` YAML (keys as the long options, ``-`` or ``_``) as defaults."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.is_file():
            raise SystemExit(f"--config {path} does not exist")
        values = yaml.safe_load(path.read_text()) or {}
        command = parser.commands[args.command]  # type: ignore[attr-defined]
        known = {action.dest for action in command._actions}
        unknown = sorted(k for k in values if k.replace("-", "_") not in known)
        if unknown:
            raise SystemExit(f"{path}: unknown options {unknown} for `evaluate.py {args.command}`")
        command.set_defaults(**{k.replace("-", "_"): v for k, v in values.items()})
        args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> Any:
    args = parse_arguments(argv)
    if isinstance(getattr(args, "devices", None), str) and args.devices.isdigit():
        args.devices = int(args.devices)
    if args.command == "oscr":
        return run_oscr(args)
    if args.command == "severity":
        return run_severity(args)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "generated":
        return run_generated(args)
    if args.command == "adversarial":
        return run_adversarial(args)
    if args.command == "severity-plot":
        return run_severity_plot(args)
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    main(sys.argv[1:])
