"""Plain ``nn.Module``\\ s, no LightningModules: classifier backbones, the Pix2Pix, DCGAN and SNGAN networks,
the LPIPS distance and the deep ensemble. The LightningModules of the package are built from them."""

from lightning_modules.nets.backbones import (
    OpenSetNetwork,
    PretrainedWeightsMissing,
    SmallCNN,
    build_backbone,
    build_classifier,
)
from lightning_modules.nets.ensemble import DeepEnsemble
from lightning_modules.nets.gans import (
    DCGANDiscriminator,
    DCGANGenerator,
    PatchGANDiscriminator,
    ResNetDiscriminator,
    ResNetGenerator,
    UNetGenerator,
    build_gan,
)
from lightning_modules.nets.lpips import PerceptualDistance

__all__ = [
    "DCGANDiscriminator",
    "DCGANGenerator",
    "DeepEnsemble",
    "OpenSetNetwork",
    "PatchGANDiscriminator",
    "PerceptualDistance",
    "PretrainedWeightsMissing",
    "ResNetDiscriminator",
    "ResNetGenerator",
    "SmallCNN",
    "UNetGenerator",
    "build_backbone",
    "build_classifier",
    "build_gan",
]
