"""The C-OOD severity benchmark of one model for several κ: collect -> score -> metric -> log/plot.

For a :class:`lightning_modules.scoring.ScoringModel` and a :class:`datamodules.severity.SeverityDataModule`:

1. one forward pass over the OOD estimation images, the OOD test images and the ID test images (each
   sharded over the trainer's devices, gathered without padding duplicates, cached on disk);
2. every logit-based κ is computed from those logits (no further model call); a model-based κ (ODIN,
   MC dropout) gets its own pass per split, cached as well;
3. per κ: per-class mean score on the estimation images, severity groups
   (:func:`metrics.severity_levels`), the per-level table (:func:`metrics.severity_table`);
4. global rank zero writes ``<model>_<κ>_n<levels>.csv`` (the columns of the paper's published tables),
   ``levels_<model>_<κ>.csv`` (which classes form each level), ``severity.csv`` (all κ),
   ``severity_auroc.png`` and logs the tables and the figure to W&B.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor

from callbacks.plots import plot_severity
from callbacks.prediction_cache import PredictionCache, PredictionCollector, cache_key
from datamodules.io import atomic_write_text
from lightning_modules.scoring import weights_fingerprint
from metrics import TABLE_COLUMNS, Kappa, class_mean_scores, get_kappa, severity_levels, severity_table


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def rows_to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class SeverityBenchmark:
    """Runs the benchmark (see the module docstring).

    Args:
        scoring: the model wrapper (its ``display_name`` names the tables).
        datamodule: the ID and OOD data.
        kappas: κ names of :data:`metrics.KAPPAS`, or :class:`metrics.Kappa` objects (e.g. from
            :func:`metrics.from_pytorch_ood`).
        trainer: a Trainer whose callbacks include a :class:`PredictionCollector` (``inference_mode=False``
            when a κ needs input gradients, e.g. ODIN).
        cache_dir: where model outputs are cached.
        output_dir: where the tables and the figure go.
        num_levels: severity levels (11 in the paper).
    """

    def __init__(
        self,
        scoring: pl.LightningModule,
        datamodule: Any,
        kappas: Sequence[str | Kappa],
        trainer: pl.Trainer,
        cache_dir: str | Path,
        output_dir: str | Path,
        num_levels: int = 11,
    ) -> None:
        self.scoring = scoring
        self.datamodule = datamodule
        self.kappas = [k if isinstance(k, Kappa) else get_kappa(k) for k in kappas]
        if not self.kappas:
            raise ValueError("give at least one confidence function")
        self.trainer = trainer
        collectors = [c for c in trainer.callbacks if isinstance(c, PredictionCollector)]
        if len(collectors) != 1:
            raise ValueError("the trainer needs exactly one PredictionCollector callback")
        self.collector = collectors[0]
        if any(k.name == "odin" for k in self.kappas) and trainer.predict_loop.inference_mode:
            raise ValueError("ODIN needs input gradients: create the Trainer with inference_mode=False")
        self.cache = PredictionCache(cache_dir)
        self.output_dir = Path(output_dir)
        self.num_levels = num_levels
        self.model_name = getattr(scoring, "display_name", type(scoring).__name__)
        self._model_fingerprint: str | None = None
        self._loaded: dict[str, dict[str, Tensor]] = {}  # per cache key: each split is read from disk once
        self.model_calls = 0  # predict passes actually run (cache misses)

    def model_fingerprint(self) -> str:
        if self._model_fingerprint is None:
            self._model_fingerprint = weights_fingerprint(self.scoring.network)
        return self._model_fingerprint

    def predictions(self, split: str, kappa: Any = None) -> dict[str, Tensor]:
        """Gathered outputs of one pass over ``split``: logits (``kappa=None``) or a model-based κ's scores."""
        kappa_args = dict(getattr(self.scoring, "kappa_args", {})) if kappa is not None else {}
        key = cache_key(model=self.model_fingerprint(), data=self.datamodule.fingerprint(split),
                        kappa=kappa.name if kappa is not None else None, kappa_args=kappa_args,
                        features=bool(getattr(self.scoring, "features", False)) and kappa is None)
        if key in self._loaded:
            return self._loaded[key]
        name = slug(f"{self.model_name}-{split}" + (f"-{kappa.name}" if kappa is not None else ""))
        rows = len(self.datamodule.dataset(split))
        cached = self.cache.load(name, key, rows=rows)
        if cached is not None:
            self._loaded[key] = cached
            return cached
        self.scoring.kappa = kappa
        self.trainer.predict(self.scoring, dataloaders=self.datamodule.dataloader(split), return_predictions=False)
        self.model_calls += 1
        result = self.collector.result
        if result is None or result["targets"].shape[0] != rows:
            got = None if result is None else result["targets"].shape[0]
            raise RuntimeError(f"predictions on {split} cover {got} of {rows} samples (unreadable images skipped?)")
        expected = self.datamodule.targets(split)
        if not torch.equal(result["targets"], expected):
            raise RuntimeError(f"gathered targets of {split} do not match the data set order")
        if self.trainer.is_global_zero:
            self.cache.save(name, key, result, {"model": self.model_name, "split": split,
                                                "kappa": kappa.name if kappa is not None else None})
        self._loaded[key] = result
        return result

    def scores(self, split: str, kappa: Any) -> Tensor:
        if kappa.kind == "logits":
            return kappa(self.predictions(split)["logits"])
        if kappa.kind == "features":
            return kappa(self.predictions(split)["features"])
        return self.predictions(split, kappa)["scores"]

    def run(self) -> dict[str, list[dict[str, Any]]]:
        """The per-level table of every κ (also written to ``output_dir`` by global rank zero)."""
        datamodule = self.datamodule
        datamodule.setup()
        num_classes = len(datamodule.ood_classes)
        estimation_targets = datamodule.targets("ood_estimation")
        test_classes = datamodule.targets("ood_test")
        id_logits = self.predictions("id")["logits"]
        id_correct = id_logits.argmax(dim=1) == datamodule.targets("id")
        tables: dict[str, list[dict[str, Any]]] = {}
        levels: dict[str, list[dict[str, Any]]] = {}
        for kappa in self.kappas:
            class_scores = class_mean_scores(self.scores("ood_estimation", kappa), estimation_targets, num_classes)
            groups, level_scores = severity_levels(class_scores, datamodule.group_size, self.num_levels)
            tables[kappa.name] = severity_table(
                id_scores=self.scores("id", kappa), id_correct=id_correct, ood_scores=self.scores("ood_test", kappa),
                ood_classes=test_classes, groups=groups, model_name=self.model_name, kappa_name=kappa.name,
            )
            levels[kappa.name] = [
                {"severity level": level, "level score": float(level_scores[level]), "class index": int(c),
                 "class": datamodule.ood_class_name(int(c)), "class score": float(class_scores[c])}
                for level, group in enumerate(groups) for c in group
            ]
        if self.trainer.is_global_zero:
            self._write(tables, levels)
        return tables

    def _write(self, tables: dict[str, list[dict[str, Any]]], levels: dict[str, list[dict[str, Any]]]) -> None:
        out = self.output_dir
        for name, rows in tables.items():
            stem = slug(f"{self.model_name}_{name}")
            atomic_write_text(out / f"{stem}_n{self.num_levels}.csv", rows_to_csv(rows, TABLE_COLUMNS))
            atomic_write_text(out / f"levels_{stem}.csv", rows_to_csv(
                levels[name], ["severity level", "level score", "class index", "class", "class score"]))
        all_rows = [row for rows in tables.values() for row in rows]
        atomic_write_text(out / "severity.csv", rows_to_csv(all_rows, TABLE_COLUMNS))
        figure = plot_severity({f"{self.model_name} / {name}": rows for name, rows in tables.items()},
                               out / "severity_auroc.png", title=f"C-OOD severity: {self.model_name}")
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(key="severity/table", columns=list(TABLE_COLUMNS),
                                 data=[[row[c] for c in TABLE_COLUMNS] for row in all_rows])
                logger.log_image(key="severity/auroc", images=[str(figure)])
            for name, rows in tables.items():
                logger.log_metrics({f"severity/{name}/ood-auroc/level_{row['severity level']:02d}": row["ood-auroc"]
                                    for row in rows})
        rank_zero_info(f"Severity tables and figure: {out}")
