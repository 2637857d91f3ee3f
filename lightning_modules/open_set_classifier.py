"""``OpenSetClassifier``: SoftMax, Background-class and Entropic Open-Set training (Palechor et al., WACV 2023).

The network is :class:`lightning_modules.networks.OpenSetNetwork` (a backbone by name, the deep-feature
layer and bias-free logits). Validation logs γ (``val/gamma``, ``val/gamma_plus``, ``val/gamma_minus``),
the checkpoint-selection metric of the paper. ``test_step`` returns probabilities, labels and dataset
indices for the evaluation callbacks (:class:`callbacks.OpenSetEvaluation`).
"""

from __future__ import annotations

from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from datamodules.transforms import BackgroundClassTarget
from lightning_modules.losses import BackgroundClassLoss, EntropicOpenSetLoss, SoftMaxLoss
from lightning_modules.networks import OpenSetNetwork, build_backbone
from metrics import Gamma

Loss = Literal["softmax", "bg", "eos"]
# How the training set must treat negatives for each loss (see datamodules.base).
TRAIN_NEGATIVES: dict[str, str] = {"softmax": "exclude", "bg": "background", "eos": "include"}


def train_negatives_for_loss(loss: str) -> str:
    """``"softmax"`` -> ``"exclude"``, ``"bg"`` -> ``"background"``, ``"eos"`` -> ``"include"``."""
    if loss not in TRAIN_NEGATIVES:
        raise ValueError(f"loss must be one of {sorted(TRAIN_NEGATIVES)}, got {loss!r}")
    return TRAIN_NEGATIVES[loss]


def unpack_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(images, targets, indices or None, skipped or None)`` from a :class:`datamodules.Batch` or a tuple."""
    if isinstance(batch, (tuple, list)) and 2 <= len(batch) <= 4:
        images, targets, *rest = batch
        indices = rest[0] if rest else None
        skipped = rest[1] if len(rest) > 1 else None
        return images, targets, indices, skipped
    raise TypeError(f"expected a batch (images, targets[, indices[, skipped]]), got {type(batch).__name__}")


class OpenSetClassifier(pl.LightningModule):
    """An open-set classifier trained with the SoftMax (S), background-class (BG) or EOS loss.

    Args:
        num_classes: ``K``, the number of known classes (linked from the datamodule by ``train.py``).
        loss: ``"softmax"``, ``"bg"`` or ``"eos"``.
        backbone: ``torchvision:<name>``, ``timm:<name>`` or ``small_cnn``; the paper's is
            ``torchvision:resnet50`` trained from scratch.
        pretrained: load backbone weights from the local cache (clear error if absent).
        pretrained_file: explicit weight file for timm backbones.
        in_channels: image channels (1 for Fashion-MNIST).
        deep_feature_dim: size of the deep-feature layer (default ``K'``, as the paper).
        negative_weight: weight of the negative term of EOS (1 in the paper).
        optimizer: optimizer factory (the paper: Adam, lr 1e-3, no weight decay).
        lr_scheduler: optional scheduler factory (the paper: none).
    """

    def __init__(
        self,
        num_classes: int,
        loss: Loss = "eos",
        backbone: str = "torchvision:resnet50",
        pretrained: bool = False,
        pretrained_file: str | None = None,
        in_channels: int = 3,
        deep_feature_dim: int | None = None,
        negative_weight: float = 1.0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        train_negatives_for_loss(loss)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.num_classes = num_classes
        self.loss_name = loss
        self.background_class = loss == "bg"
        features, feature_dim = build_backbone(
            backbone, pretrained=pretrained, in_channels=in_channels, pretrained_file=pretrained_file
        )
        self.network = OpenSetNetwork(features, feature_dim, num_classes + int(self.background_class), deep_feature_dim)
        if loss == "softmax":
            self.criterion: torch.nn.Module = SoftMaxLoss()
        elif loss == "bg":
            self.criterion = BackgroundClassLoss(num_classes)
        else:
            self.criterion = EntropicOpenSetLoss(negative_weight)
        self.to_background = BackgroundClassTarget(num_classes)
        self.val_gamma = Gamma(background=self.background_class)

    @property
    def train_negatives(self) -> str:
        return TRAIN_NEGATIVES[self.loss_name]

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(N, K')``."""
        return self.network(images)[0]

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

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, targets, indices, _ = unpack_batch(batch)
        if images.numel() == 0:
            return
        logits = self(images).float()
        self.val_gamma.update(torch.softmax(logits, dim=1), targets, indices)
        loss = self._loss(logits, targets, stage="val")
        if loss is not None:
            self.log("val/loss", loss, on_epoch=True, sync_dist=True, batch_size=targets.numel())

    def on_validation_epoch_end(self) -> None:
        if self.val_gamma.update_count == 0:
            return
        gamma_plus, gamma_minus, gamma = self.val_gamma.compute()  # gathered from all ranks: equal everywhere
        # The values are equal on every rank; a max-reduction keeps them bit for bit for any world size.
        exact = {"sync_dist": True, "reduce_fx": "max"}
        self.log_dict({"val/gamma_plus": gamma_plus.float(), "val/gamma_minus": gamma_minus.float()}, **exact)
        self.log("val/gamma", gamma.float(), prog_bar=True, **exact)
        self.val_gamma.reset()

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
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Everything `evaluate.py` needs to rebuild the run from the checkpoint alone, and what
        # `train.py fit --ckpt_path` needs to resume logging into the same logger run.
        checkpoint["model_class"] = class_path(self)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            checkpoint["datamodule_class"] = class_path(datamodule)
        if self.logger is not None:
            checkpoint["logger_version"] = self.logger.version


def class_path(obj: object) -> str:
    """``module.QualifiedName`` of an object's class."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
