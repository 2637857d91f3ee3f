"""LightningDataModules, protocols, WordNet and data files. Never imports a model."""

from datamodules.base import OpenSetDataModule, UnreadableImageError
from datamodules.batch import Batch, Sample, collate_samples
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.imagenet import ImageNetProtocolDataModule
from datamodules.protocols import Protocol, imagenet_protocol
from datamodules.transforms import BackgroundClassTarget

__all__ = [
    "BackgroundClassTarget",
    "Batch",
    "FashionMNISTOpenSetDataModule",
    "ImageNetProtocolDataModule",
    "OpenSetDataModule",
    "Protocol",
    "Sample",
    "UnreadableImageError",
    "collate_samples",
    "imagenet_protocol",
]
