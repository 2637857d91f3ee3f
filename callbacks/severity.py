"""C-OOD severity AUROC as a Lightning callback (Galil, Dabbah, El-Yaniv, ICLR 2023; DESIGN.md §5.2).

:class:`SeverityAUROC` evaluates the model being trained (every ``every_n_epochs`` validation epochs) or
tested (``evaluate.py severity``, and at ``trainer.test``) on a severity data set
(:mod:`datamodules.severity`): the ID test images, and the OOD pool's estimation and test images.

1. collect: one sharded pass over each split (:func:`callbacks.scoring.sharded_outputs`; every
   rank joins every gather) gives the logits; a model-based κ (ODIN, MC dropout) gets its own pass. With
   ``cache_dir`` (fixed models) the passes are cached on disk, keyed by the weights, the data files, the
   transform, the precision and each κ's parameters; during training nothing is cached across epochs
   (the weights change).
2. score: every logit-based κ from the same logits (background-class models: softmax over ``K+1``, the
   background column dropped afterwards, as in OSCR).
3. metric: per κ, the per-class mean score on the estimation images, the severity groups
   (:func:`metrics.severity_levels`) and the per-level table (:func:`metrics.severity_table`).
4. log/plot: per κ the AUROC of each level, their mean (``<stage>/severity/<κ>/mean_auroc``) and the
   hardest level's (``<stage>/severity/<κ>/hardest_auroc``) as scalars that ``ModelCheckpoint`` can
   monitor; to W&B a line plot of AUROC against severity level with one line per evaluated epoch, and
   the table. Global rank zero writes the files: at validation ``history.csv`` and
   ``auroc_by_level_<κ>.png``; at test the tables of the paper (``<model>_<κ>_n<levels>.csv``),
   ``levels_<model>_<κ>.csv`` (the classes of each level and whether the model saw them in training as
   negatives), ``severity.csv`` and ``severity_auroc.png``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor

from callbacks.plots import plot_severity
from callbacks.scoring import PredictionCache, sharded_outputs
from common import atomic_write_text, digest, known_columns, tensors_fingerprint
from datamodules.severity import SEVERITY_SPLITS, SeverityDataModule
from metrics import TABLE_COLUMNS, Kappa, class_mean_scores, get_kappa, severity_levels, severity_table

LEVEL_COLUMNS = ("severity level", "level score", "class index", "class", "class score", "seen in training")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def rows_to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def model_logits(pl_module: pl.LightningModule, images: Tensor) -> Tensor:
    """Per-sample logits: ``(N, C)``, or ``(N, M, C)`` for an ensemble (which returns ``(M, N, C)``)."""
    logits = pl_module(images)
    return logits.transpose(0, 1) if logits.ndim == 3 else logits


def kappa_scores(kappa: Kappa, outputs: dict[str, Tensor], *, background: bool, parameters: dict[str, Any]) -> Tensor:
    """κ of every sample from gathered outputs: logits ``(N, C)`` (or ``(N, M, C)`` for ensemble κ), features,
    or the scores of a model-based κ's own pass."""
    if kappa.kind == "logits":
        if outputs["logits"].ndim != 2:
            raise ValueError(f"confidence function {kappa.name!r} scores one model; for an ensemble use "
                             "ensemble_mi, ensemble_softmax or ensemble_entropy")
        return kappa(outputs["logits"], background=background, **parameters)
    if kappa.kind == "ensemble":
        if outputs["logits"].ndim != 3:
            raise ValueError(f"confidence function {kappa.name!r} needs an ensemble (member logits (M, N, C)); "
                             "give the model as ensemble:<members file or checkpoints>")
        return kappa(outputs["logits"].transpose(0, 1), background=background, **parameters)
    if kappa.kind == "features":
        return kappa(outputs["features"], background=background, **parameters)
    return outputs[f"scores/{kappa.name}"]


def model_fingerprint(pl_module: pl.LightningModule) -> str:
    fingerprint = getattr(pl_module, "fingerprint", None)
    return fingerprint() if callable(fingerprint) else tensors_fingerprint(pl_module.state_dict())


class SeverityAUROC(pl.Callback):
    """Severity AUROC during training and at test (see the module docstring).

    Args:
        data: the ID and OOD data; ``None`` asks the training datamodule (``severity_data(**data_args)``:
            for a protocol, its known classes as ID and its unknown classes as the pool).
        data_args: arguments of that ``severity_data`` call (e.g. ``{"estimation": 150}``, an ImageNet-21k
            ``pool_file``).
        kappas: κ names of :data:`metrics.KAPPAS` or :class:`metrics.Kappa` objects.
        kappa_args: per κ name, its keyword arguments (e.g. ``{"odin": {"temperature": 1000}}``).
        every_n_epochs: evaluate after every n-th validation epoch (0: never during training).
        on_test: evaluate at ``trainer.test``.
        num_levels: severity levels (11 in the paper).
        batch_size, num_workers: of the callback's own passes (default: the severity data's).
        cache_dir: cache the passes on disk (for fixed models; useless while weights change).
        output_dir: where files go (default: next to the checkpoint at test, the checkpoint folder's
            ``severity-val/`` during training).
        plots: write and log figures.
    """

    def __init__(
        self,
        data: SeverityDataModule | None = None,
        data_args: dict[str, Any] | None = None,
        kappas: Sequence[str | Kappa] = ("softmax",),
        kappa_args: dict[str, dict[str, Any]] | None = None,
        every_n_epochs: int = 1,
        on_test: bool = True,
        num_levels: int = 11,
        batch_size: int | None = None,
        num_workers: int | None = None,
        cache_dir: str | None = None,
        output_dir: str | None = None,
        plots: bool = True,
    ) -> None:
        super().__init__()
        self.kappas = [k if isinstance(k, Kappa) else get_kappa(k) for k in kappas]
        if not self.kappas:
            raise ValueError("give at least one confidence function")
        self.kappa_args = {name: dict(args) for name, args in (kappa_args or {}).items()}
        unknown = set(self.kappa_args) - {k.name for k in self.kappas}
        if unknown:
            raise ValueError(f"kappa_args for {sorted(unknown)}, which are not among the kappas")
        # resolved parameters of every κ (defaults + overrides): validated now, part of the cache keys
        self.kappa_parameters = {k.name: k.parameters(**self.kappa_args.get(k.name, {})) for k in self.kappas}
        if every_n_epochs < 0:
            raise ValueError(f"every_n_epochs must be >= 0, got {every_n_epochs}")
        self.data = data
        self.data_args = dict(data_args or {})
        self.every_n_epochs = every_n_epochs
        self.on_test = on_test
        self.num_levels = num_levels
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache = PredictionCache(cache_dir) if cache_dir is not None else None
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.plots = plots
        self.model_passes = 0  # passes actually run (cache misses)
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.history: list[dict[str, Any]] = []  # (epoch, κ, level, AUROC) of every validation evaluation
        self.report_path: Path | None = None
        self._weights: str | None = None  # fingerprint of the weights of the running evaluation

    # -- hooks -------------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.data is None:
            datamodule = getattr(trainer, "datamodule", None)
            factory = getattr(datamodule, "severity_data", None)
            if factory is None:
                raise ValueError(
                    "SeverityAUROC needs `data` (a datamodules.severity.SeverityDataModule), or a training "
                    f"datamodule with a severity_data() method; got {type(datamodule).__name__}"
                )
            self.data = factory(**self.data_args)
        elif self.data_args:
            raise ValueError("give either `data` or `data_args` (arguments of the training datamodule's severity_data)")
        self.data.setup()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.every_n_epochs == 0 or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        self.evaluate(trainer, pl_module, stage="val")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_test:
            self.evaluate(trainer, pl_module, stage="test")

    # -- collect -----------------------------------------------------------------------------------

    def _check_width(self, pl_module: pl.LightningModule, background: bool) -> None:
        """Refuse a model whose output width is not the number of ID classes (+1 background), on every rank."""
        image = self.data.dataset("id")[0].image
        with torch.no_grad():
            width = pl_module(image[None].to(pl_module.device)).shape[-1]
        expected = self.data.group_size + int(background)
        if width != expected:
            raise ValueError(
                f"the model outputs {width} logits but the severity data has {self.data.group_size} ID classes"
                + (" plus the background class" if background else "")
                + f" ({expected} expected): a model with another head (e.g. 21k or 1001 classes) cannot be scored "
                "on these ID classes"
            )

    def _passes(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, split: str, background: bool
    ) -> dict[str, Tensor]:
        """Logits (and features, model-based κ scores) of every sample of a split, gathered on every rank."""
        dataset = self.data.dataset(split)
        features = any(k.kind == "features" for k in self.kappas)
        entries: list[tuple[str, dict[str, Any], Any, list[str]]] = [(
            "logits", {"features": features},
            lambda images: {"logits": model_logits(pl_module, images),
                            **({"features": pl_module.features(images)} if features else {})},
            ["logits", "features"] if features else ["logits"],
        )]
        for kappa in self.kappas:
            if kappa.kind == "model":
                parameters = self.kappa_parameters[kappa.name]
                entries.append((kappa.name, {"kappa": kappa.name, "parameters": parameters},
                                lambda images, k=kappa, p=parameters: {f"scores/{k.name}": k(pl_module, images,
                                                                                            background=background, **p)},
                                [f"scores/{kappa.name}"]))
        batch_size = self.batch_size or self.data.batch_size
        num_workers = self.num_workers if self.num_workers is not None else self.data.num_workers
        result: dict[str, Tensor] = {}
        for entry, parts, step, keys in entries:
            name = slug(f"{getattr(pl_module, 'display_name', type(pl_module).__name__)}-{split}-{entry}")
            key = None
            outputs = None
            if self.cache is not None:
                key = digest({"model": self._fingerprint(trainer, pl_module), "data": self.data.fingerprint(split),
                              "precision": str(trainer.precision), "background": background, **parts}) \
                    if trainer.is_global_zero else ""
                outputs = self.cache.load_on_rank_zero(trainer, name, key, rows=len(dataset))
            if outputs is None:
                outputs = sharded_outputs(trainer, dataset, step, keys=keys, batch_size=batch_size,
                                          num_workers=num_workers, device=pl_module.device)
                self.model_passes += 1
                if not torch.equal(outputs["targets"], self.data.targets(split)):
                    raise RuntimeError(f"gathered targets of {split} do not match the data set order")
                if self.cache is not None and trainer.is_global_zero:
                    self.cache.save(name, key, outputs, {"split": split, **parts})
            result.update(outputs)
        return result

    def _fingerprint(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> str:
        if self._weights is None:
            self._weights = model_fingerprint(pl_module)
        return self._weights

    # -- score, metric -----------------------------------------------------------------------------

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, stage: str) -> dict[str, list[dict]]:
        """Run the benchmark on the current weights; log, and write files on global rank zero."""
        if self.data is None:
            self.setup(trainer, pl_module, stage)
        data = self.data
        background = bool(getattr(pl_module, "background_class", False))
        model_name = getattr(pl_module, "display_name", type(pl_module).__name__)
        self._weights = None  # the weights may have changed since the last evaluation: fingerprint anew if needed
        was_training = pl_module.training
        pl_module.eval()
        try:
            # ODIN needs input gradients even inside Lightning's inference-mode evaluation loops
            with torch.inference_mode(False), torch.no_grad():
                self._check_width(pl_module, background)
                outputs = {split: self._passes(trainer, pl_module, split, background) for split in SEVERITY_SPLITS}
        finally:
            pl_module.train(was_training)
        id_probs = torch.softmax(outputs["id"]["logits"].float(), dim=-1)
        if id_probs.ndim == 3:  # an ensemble predicts with the mean of its members' softmax
            id_probs = id_probs.mean(dim=1)
        id_correct = known_columns(id_probs, background).argmax(dim=1) == outputs["id"]["targets"]
        estimation_classes = outputs["ood_estimation"]["targets"]
        test_classes = outputs["ood_test"]["targets"]
        tables: dict[str, list[dict[str, Any]]] = {}
        levels: dict[str, list[dict[str, Any]]] = {}
        for kappa in self.kappas:
            scores = {split: kappa_scores(kappa, outputs[split], background=background,
                                          parameters=self.kappa_parameters[kappa.name]) for split in SEVERITY_SPLITS}
            class_scores = class_mean_scores(scores["ood_estimation"], estimation_classes, len(data.ood_classes))
            groups, level_scores = severity_levels(class_scores, data.group_size, self.num_levels)
            tables[kappa.name] = severity_table(
                id_scores=scores["id"], id_correct=id_correct, ood_scores=scores["ood_test"], ood_classes=test_classes,
                groups=groups, model_name=model_name, kappa_name=kappa.name,
            )
            levels[kappa.name] = [
                {"severity level": level, "level score": float(level_scores[level]), "class index": int(c),
                 "class": data.ood_class_name(int(c)), "class score": float(class_scores[c]),
                 "seen in training": data.ood_class_role(int(c))}
                for level, group in enumerate(groups) for c in group
            ]
        self.tables = tables
        self._log(trainer, pl_module, tables, stage=stage)
        if trainer.is_global_zero:
            if stage == "test":
                self.report_path = self._write_report(trainer, tables, levels, model_name)
            else:
                self._write_history(trainer, tables)
        return tables

    # -- log, plot ---------------------------------------------------------------------------------

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, tables: dict[str, list[dict]], *, stage: str) -> None:
        scalars: dict[str, float] = {}
        for name, rows in tables.items():
            aurocs = [row["ood-auroc"] for row in rows]
            scalars.update({f"{stage}/severity/{name}/auroc_level_{row['severity level']:02d}": row["ood-auroc"]
                            for row in rows})
            scalars[f"{stage}/severity/{name}/mean_auroc"] = sum(aurocs) / len(aurocs)
            scalars[f"{stage}/severity/{name}/hardest_auroc"] = aurocs[-1]
        # equal on every rank (computed from gathered data); max keeps them exact for any world size
        pl_module.log_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in scalars.items()}, sync_dist=True,
                           reduce_fx="max")
        if stage == "val" and trainer.is_global_zero:
            self.history += [{"epoch": trainer.current_epoch, "confidence function": name,
                              "severity level": row["severity level"], "ood-auroc": row["ood-auroc"]}
                             for name, rows in tables.items() for row in rows]
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if not isinstance(logger, WandbLogger):
                continue
            import wandb

            all_rows = [row for rows in tables.values() for row in rows]
            logger.log_table(key=f"{stage}/severity/table", columns=list(TABLE_COLUMNS),
                             data=[[row[c] for c in TABLE_COLUMNS] for row in all_rows])
            if stage == "val":
                for name in tables:
                    epochs = sorted({h["epoch"] for h in self.history if h["confidence function"] == name})
                    series = [[h["ood-auroc"] for h in self.history if h["confidence function"] == name and h["epoch"] == e]
                              for e in epochs]
                    chart = wandb.plot.line_series(xs=list(range(len(series[-1]))), ys=series,
                                                   keys=[f"epoch {e}" for e in epochs],
                                                   title=f"OOD AUROC by severity level ({name})", xname="severity level")
                    logger.experiment.log({f"val/severity/{name}/auroc_by_level": chart})

    def _default_dir(self, trainer: pl.Trainer, suffix: str) -> Path:
        if trainer.ckpt_path:
            checkpoint = Path(trainer.ckpt_path)
            return checkpoint.parent / f"{checkpoint.stem}-{suffix}"
        checkpointing = trainer.checkpoint_callback
        folder = getattr(checkpointing, "dirpath", None)
        return Path(folder) / suffix if folder else Path(trainer.default_root_dir) / suffix

    def _write_history(self, trainer: pl.Trainer, tables: dict[str, list[dict]]) -> None:
        out = self.output_dir / "val" if self.output_dir is not None else self._default_dir(trainer, "severity-val")
        atomic_write_text(out / "history.csv", rows_to_csv(
            self.history, ["epoch", "confidence function", "severity level", "ood-auroc"]))
        if self.plots:
            for name in tables:
                runs = {f"epoch {e}": [{"severity level": h["severity level"], "ood-auroc": h["ood-auroc"]}
                                       for h in self.history if h["confidence function"] == name and h["epoch"] == e]
                        for e in sorted({h["epoch"] for h in self.history if h["confidence function"] == name})}
                plot_severity(runs, out / f"auroc_by_level_{slug(name)}.png", title=f"C-OOD severity by epoch ({name})")

    def _write_report(
        self, trainer: pl.Trainer, tables: dict[str, list[dict]], levels: dict[str, list[dict]], model_name: str
    ) -> Path:
        out = self.output_dir if self.output_dir is not None else self._default_dir(trainer, "severity")
        for name, rows in tables.items():
            stem = slug(f"{model_name}_{name}")
            atomic_write_text(out / f"{stem}_n{self.num_levels}.csv", rows_to_csv(rows, TABLE_COLUMNS))
            atomic_write_text(out / f"levels_{stem}.csv", rows_to_csv(levels[name], LEVEL_COLUMNS))
        all_rows = [row for rows in tables.values() for row in rows]
        atomic_write_text(out / "severity.csv", rows_to_csv(all_rows, TABLE_COLUMNS))
        if self.plots:
            figure = plot_severity({f"{model_name} / {name}": rows for name, rows in tables.items()},
                                   out / "severity_auroc.png", title=f"C-OOD severity: {model_name}")
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_image(key="test/severity/auroc", images=[str(figure)])
        rank_zero_info(f"Severity tables and figure: {out}")
        return out
