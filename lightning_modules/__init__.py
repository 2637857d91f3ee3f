"""LightningModules and the nn.Modules and losses they are built from."""

from lightning_modules.losses import (
    BackgroundClassLoss,
    EntropicOpenSetLoss,
    SoftMaxLoss,
    background_class_weights,
)
from lightning_modules.networks import OpenSetNetwork, PretrainedWeightsMissing, build_backbone
from lightning_modules.open_set_classifier import OpenSetClassifier, train_negatives_for_loss

__all__ = [
    "BackgroundClassLoss",
    "EntropicOpenSetLoss",
    "OpenSetClassifier",
    "OpenSetNetwork",
    "PretrainedWeightsMissing",
    "SoftMaxLoss",
    "background_class_weights",
    "build_backbone",
    "train_negatives_for_loss",
]
