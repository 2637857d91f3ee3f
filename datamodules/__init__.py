"""LightningDataModules, protocols, WordNet and data files. Never imports a model."""

import warnings

from datamodules.batch import Batch, Sample, collate_samples, unpack_batch
from datamodules.evg import OODImagesDataModule
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.imagenet import ClassFolderDataModule, FolderProtocolDataModule, ImageNetProtocolDataModule
from datamodules.images import (
    IMAGE_EXTENSIONS,
    ImageFileDataset,
    NonImageFilesWarning,
    TensorImageDataset,
    UnreadableImageError,
    dataset_labels,
)
from datamodules.open_set import OpenSetDataModule
from datamodules.overlap import FitOverlapError
from datamodules.protocols import Protocol, imagenet_protocol
from datamodules.transforms import BackgroundClassTarget

# ``python -m datamodules.<module>`` (protocols, imagenet21k, wordnet: the documented commands) finds <module>
# already imported by this file, and runpy warns that it runs a second copy; their ``__main__`` blocks run
# the imported copy, so that warning is noise.
warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message=r"'datamodules\.\w+' found in sys.modules after import of package 'datamodules'")

__all__ = [
    "IMAGE_EXTENSIONS",
    "BackgroundClassTarget",
    "Batch",
    "ClassFolderDataModule",
    "FolderProtocolDataModule",
    "FashionMNISTOpenSetDataModule",
    "FitOverlapError",
    "ImageFileDataset",
    "ImageNetProtocolDataModule",
    "NonImageFilesWarning",
    "OODImagesDataModule",
    "OpenSetDataModule",
    "Protocol",
    "Sample",
    "TensorImageDataset",
    "UnreadableImageError",
    "collate_samples",
    "dataset_labels",
    "imagenet_protocol",
    "unpack_batch",
]
