"""``OpenSetClassifier``: SoftMax, Background-class and Entropic Open-Set training (Palechor et al., WACV 2023).

The network is :class:`lightning_modules.nets.backbones.OpenSetNetwork` (a backbone by name, the deep-feature
layer and bias-free logits). Validation logs γ (``val/gamma``, ``val/gamma_plus``, ``val/gamma_minus``),
the checkpoint-selection metric of the paper, computed on all ranks from the gathered predictions (exact
under DDP, also when a rank has no batch). ``validation_step`` and ``test_step`` return probabilities,
labels and dataset indices for the evaluation callbacks (:class:`callbacks.OpenSetEvaluation`).

γ needs known and negative validation samples: a validation split without either fails in ``setup``,
before training starts, and a NaN γ during training is an error rather than a value that
``ModelCheckpoint`` would rank (Lightning maps NaN to -inf, so it could become ``best.ckpt``).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torchmetrics import MeanMetric

from datamodules.batch import unpack_batch
from datamodules.transforms import BackgroundClassTarget
from lightning_modules.checkpoint import record_run
from lightning_modules.losses import BackgroundClassLoss, EntropicOpenSetLoss, SoftMaxLoss
from lightning_modules.nets.backbones import OpenSetNetwork, build_backbone
from metrics import Gamma
from openset_common.labels import NEGATIVE_LABEL

Loss = Literal["softmax", "bg", "eos"]
# How the training set must treat negatives for each loss (see datamodules.open_set).
TRAIN_NEGATIVES: dict[str, str] = {"softmax": "exclude", "bg": "background", "eos": "include"}


def train_negatives_for_loss(loss: str) -> str:
    """``"softmax"`` -> ``"exclude"``, ``"bg"`` -> ``"background"``, ``"eos"`` -> ``"include"``."""
    if loss not in TRAIN_NEGATIVES:
        raise ValueError(f"loss must be one of {sorted(TRAIN_NEGATIVES)}, got {loss!r}")
    return TRAIN_NEGATIVES[loss]


class OpenSetClassifier(pl.LightningModule):
    """An open-set classifier trained with the SoftMax (S), background-class (BG) or EOS loss.

    Args:
        num_classes: ``K``, the number of known classes (linked from the datamodule by ``train.py``).
        loss: ``"softmax"``, ``"bg"`` or ``"eos"``.
        backbone: ``torchvision:<name>``, ``timm:<name>`` or ``small_cnn``; the paper's is
            ``torchvision:resnet50`` trained from scratch.
        pretrained: load backbone weights from the local cache (clear error if absent).
        pretrained_file: explicit weight file for timm backbones.
        backbone_args: extra ``timm.create_model`` arguments of a timm backbone (e.g. ``{"drop_rate": 0.2}``).
        in_channels: image channels (1 for Fashion-MNIST).
        deep_feature_dim: size of the deep-feature layer (default ``K'``, as the paper).
        negative_weight: weight of the negative term of EOS (1 in the paper).
        optimizer: optimizer factory (the paper: Adam, lr 1e-3, no weight decay).
        lr_scheduler: optional scheduler factory (the paper: none).
        lr_scheduler_interval: when the scheduler steps: ``"epoch"`` (Lightning's default) or ``"step"`` (every
            optimiser step, e.g. a cosine schedule over a single epoch, as the demo's ensemble members train).
    """

    def __init__(
        self,
        num_classes: int,
        loss: Loss = "eos",
        backbone: str = "torchvision:resnet50",
        pretrained: bool = False,
        pretrained_file: str | None = None,
        backbone_args: dict[str, Any] | None = None,
        in_channels: int = 3,
        deep_feature_dim: int | None = None,
        negative_weight: float = 1.0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["epoch", "step"] = "epoch",
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        train_negatives_for_loss(loss)
        if lr_scheduler_interval not in ("epoch", "step"):
            raise ValueError(f"lr_scheduler_interval must be 'epoch' or 'step', got {lr_scheduler_interval!r}")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.num_classes = num_classes
        self.loss_name = loss
        self.background_class = loss == "bg"
        features, feature_dim = build_backbone(
            backbone, pretrained=pretrained, in_channels=in_channels, pretrained_file=pretrained_file,
            backbone_args=backbone_args,
        )
        self.network = OpenSetNetwork(features, feature_dim, num_classes + int(self.background_class), deep_feature_dim)
        if loss == "softmax":
            self.criterion: torch.nn.Module = SoftMaxLoss()
        elif loss == "bg":
            self.criterion = BackgroundClassLoss(num_classes)
        else:
            self.criterion = EntropicOpenSetLoss(negative_weight)
        self.to_background = BackgroundClassTarget(num_classes)
        # Validation metrics are torchmetrics states, logged once per epoch by every rank: a `self.log(...,
        # sync_dist=True)` per step would leave a rank without batches out of the epoch-end reduction (a hang).
        self.val_gamma = Gamma(background=self.background_class, num_classes=num_classes)
        self.val_loss = MeanMetric()
        self._extra_val_metrics: list[tuple[Gamma, MeanMetric]] = []  # dataloaders 1, 2, ... (indices may overlap)

    @property
    def train_negatives(self) -> str:
        return TRAIN_NEGATIVES[self.loss_name]

    @property
    def display_name(self) -> str:
        """``<backbone>-<loss>``, e.g. ``resnet50-eos``: names the model in evaluation tables."""
        return f"{self.hparams.backbone.rpartition(':')[2]}-{self.loss_name}"

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(N, K')``."""
        return self.network(images)[0]

    def features(self, images: Tensor) -> Tensor:
        """The backbone's pooled activations ``(N, F)`` (ResNet-50's 2048, after its last ReLU), the penultimate
        layer of the field's feature-based detectors (Mahalanobis, KNN, ViM, ReAct, ASH): the deep-feature
        layer ``Linear(F, D)`` and the logit layer ``Linear(D, K')`` after it are both linear, so the head from
        these features to the logits is their composition, exactly
        (:func:`lightning_modules.scoring.classification_head`). The deep features are ``network(x)[1]``."""
        return self.network.backbone(images)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None:
            return
        if getattr(datamodule, "num_classes", self.num_classes) != self.num_classes:
            raise ValueError(f"the model has {self.num_classes} known classes but the data has {datamodule.num_classes}")
        if stage == "fit":
            data_negatives = getattr(datamodule, "train_negatives", self.train_negatives)
            if data_negatives != self.train_negatives:
                raise ValueError(
                    f"loss {self.loss_name!r} needs the datamodule's train_negatives={self.train_negatives!r}, "
                    f"got {data_negatives!r}"
                )
            if self.background_class:
                self.criterion.set_class_counts(datamodule.train_class_counts())  # type: ignore[operator]
            labels = getattr(datamodule, "split_labels", lambda split: None)("val")
            if labels is not None:
                check_gamma_split(labels, split="validation")

    def _loss(self, logits: Tensor, targets: Tensor, *, stage: str) -> Tensor | None:
        if stage == "train":
            return self.criterion(logits, targets)
        # Validation keeps the project's labels (negatives -1) for γ; adapt them to each loss here.
        if self.loss_name == "softmax":
            known = targets >= 0
            return self.criterion(logits[known], targets[known]) if known.any() else None
        if self.background_class:
            return self.criterion(logits, self.to_background(targets))
        return self.criterion(logits, targets)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        images, targets, _, skipped = unpack_batch(batch)
        if skipped is not None:
            self.log("data/skipped_images", float(skipped.numel()), on_step=False, on_epoch=True, reduce_fx="sum",
                     sync_dist=True, batch_size=1)
        if images.numel() == 0:
            return None
        logits, _ = self.network(images)
        loss = self._loss(logits.float(), targets, stage="train")
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=targets.numel(), sync_dist=True)
        return loss

    def _val_metrics(self, dataloader_idx: int) -> tuple[Gamma, MeanMetric]:
        if dataloader_idx == 0:
            return self.val_gamma, self.val_loss
        while len(self._extra_val_metrics) < dataloader_idx:
            self._extra_val_metrics.append((
                Gamma(background=self.background_class, num_classes=self.num_classes).to(self.device),
                MeanMetric().to(self.device),
            ))
        return self._extra_val_metrics[dataloader_idx - 1]

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor] | None:
        out = self._predict(batch)
        if out["targets"].numel() == 0:
            return None
        gamma_metric, loss_metric = self._val_metrics(dataloader_idx)
        gamma_metric.update(out["probs"], out["targets"], out.get("indices"))
        loss = self._loss(out["logits"], out["targets"], stage="val")
        if loss is not None:
            loss_metric.update(loss.detach(), weight=out["targets"].numel())
        return out

    def _num_val_dataloaders(self) -> int:
        trainer = self.trainer
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return max(1, len(counts)) if isinstance(counts, list) else 1

    def on_validation_epoch_end(self) -> None:
        # Every rank computes, also one that had no batch: compute() gathers from all ranks.
        for dataloader_idx in range(self._num_val_dataloaders()):
            metric, loss_metric = self._val_metrics(dataloader_idx)
            suffix = "" if dataloader_idx == 0 else f"/dataloader_idx_{dataloader_idx}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an empty side is handled just below; no loss: NaN, not logged
                gamma_plus, gamma_minus, gamma = metric.compute()
                loss = loss_metric.compute()
            metric.reset()
            loss_metric.reset()
            # equal on every rank: max keeps them bit for bit; the dataloader suffix is ours
            exact = {"sync_dist": True, "reduce_fx": "max", "add_dataloader_idx": False}
            if not torch.isnan(loss):
                self.log(f"val/loss{suffix}", loss.float(), **exact)
            if torch.isnan(gamma):
                reason = "no known samples" if torch.isnan(gamma_plus) else f"no negatives (label {NEGATIVE_LABEL})"
                message = f"val/gamma{suffix} is undefined: the validation batches hold {reason}"
                if self.trainer.sanity_checking or self.trainer.fast_dev_run or self.trainer.state.fn != "fit":
                    warnings.warn(f"{message}; it is not logged", RuntimeWarning, stacklevel=1)
                    continue
                raise ValueError(
                    f"{message}. A NaN gamma cannot select checkpoints (Lightning would rank it as -inf and could "
                    "keep it as best.ckpt): check limit_val_batches and that the validation split holds both"
                )
            self.log_dict({f"val/gamma_plus{suffix}": gamma_plus.float(), f"val/gamma_minus{suffix}": gamma_minus.float()},
                          **exact)
            self.log(f"val/gamma{suffix}", gamma.float(), prog_bar=dataloader_idx == 0, **exact)

    def _predict(self, batch: Any) -> dict[str, Tensor]:
        images, targets, indices, skipped = unpack_batch(batch)
        if images.numel() == 0:  # every image of the batch was unreadable and skipped
            outputs = self.network.logits.out_features
            logits = torch.empty(0, outputs, device=self.device)
            features = torch.empty(0, self.network.logits.in_features, device=self.device)
        else:
            logits, features = self.network(images)
        logits = logits.float()
        out = {"logits": logits, "probs": torch.softmax(logits, dim=1), "features": features.float(), "targets": targets}
        if indices is not None:
            out["indices"] = indices
        if skipped is not None:
            out["skipped"] = skipped
        return out

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._predict(batch)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        return self._predict(batch)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer),
                                                         "interval": self.hparams.lr_scheduler_interval}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record_run(self, checkpoint)


def check_gamma_split(labels: Tensor, *, split: str) -> None:
    """γ needs known (label >= 0) and negative (label -1) samples; raise naming what is missing."""
    missing = [name for name, present in (("known samples (label >= 0)", bool((labels >= 0).any())),
                                           (f"negatives (label {NEGATIVE_LABEL})", bool((labels == NEGATIVE_LABEL).any())))
               if not present]
    if missing:
        raise ValueError(
            f"the {split} split ({labels.numel()} samples) holds no {' and no '.join(missing)}: gamma, the "
            "checkpoint-selection metric, needs both (gamma+ over the knowns, gamma- over the negatives)"
        )
