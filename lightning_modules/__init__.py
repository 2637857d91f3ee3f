"""LightningModules and the nn.Modules and losses they are built from.

The top of the package is what every method reuses: the open-set classifier (Palechor et al.), the scoring
model that evaluates any classifier, the losses and checkpoint I/O. The rooms below it show the papers:
``nets/`` (plain networks), ``generated/`` (Mukhoti et al.'s generators), ``evg/`` (Yoon et al.'s EvG).
Every public name is importable from here (``from lightning_modules import ShiftGenerator``), and
checkpoints record these public class paths.
"""

from lightning_modules.evg import (
    SAMPLERS,
    AdversarialSearch,
    AffineVariation,
    BlackBox,
    ColourVariation,
    LatentVariation,
    PixelPerturbation,
)
from lightning_modules.generated import NearOODGenerator, RegularisedGenerator, ShiftGenerator
from lightning_modules.losses import (
    BackgroundClassLoss,
    EntropicOpenSetLoss,
    SoftMaxLoss,
    background_class_weights,
)
from lightning_modules.nets import (
    DeepEnsemble,
    OpenSetNetwork,
    PerceptualDistance,
    PretrainedWeightsMissing,
    build_backbone,
    build_classifier,
)
from lightning_modules.open_set_classifier import OpenSetClassifier, train_negatives_for_loss
from lightning_modules.scoring import ScoringModel

__all__ = [
    "SAMPLERS",
    "AdversarialSearch",
    "AffineVariation",
    "BackgroundClassLoss",
    "ColourVariation",
    "DeepEnsemble",
    "BlackBox",
    "EntropicOpenSetLoss",
    "LatentVariation",
    "NearOODGenerator",
    "OpenSetClassifier",
    "OpenSetNetwork",
    "PerceptualDistance",
    "PixelPerturbation",
    "PretrainedWeightsMissing",
    "RegularisedGenerator",
    "ScoringModel",
    "ShiftGenerator",
    "SoftMaxLoss",
    "background_class_weights",
    "build_backbone",
    "build_classifier",
    "train_negatives_for_loss",
]
