"""A real OOD set as training data: what EvG's GAN-latent variation model is trained on (DESIGN.md §5.4).

The authors train the generator of the GAN-latent variation on the OOD data set itself, so that ``G(z)``
stays on that set's manifold while the sampler searches its latent space. ``OODImagesDataModule`` serves
the images of :func:`datamodules.generated.real_ood_set` (``digits``, ``fashion:<ids>`` or an image folder),
resized to the generator's size, as a training set (labels -2, which an unconditional GAN ignores).
scikit-learn's digits have no separate training split: the demo's GAN is trained on the 1,797 images the
chains then start from.
"""

from __future__ import annotations

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from datamodules.batch import collate_samples
from datamodules.fashion_mnist import DEBIAN_FASHION_MNIST_DIR
from datamodules.generated import ResizedImages, real_ood_set


class OODImagesDataModule(pl.LightningDataModule):
    """Args:
        ood: the set: ``digits``, ``fashion:<id>,<id>`` or an image folder.
        image_size, channels: what the generator makes.
        batch_size, num_workers: of the training loader.
        data_dir: Fashion-MNIST's folder (for ``fashion:`` sets).
    """

    def __init__(self, ood: str = "digits", image_size: int = 32, channels: int | None = 1, batch_size: int = 64,
                 num_workers: int = 0, data_dir: str = DEBIAN_FASHION_MNIST_DIR) -> None:
        super().__init__()
        self.save_hyperparameters()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.ood, self.image_size, self.channels = ood, image_size, channels
        self.batch_size, self.num_workers, self.data_dir = batch_size, num_workers, data_dir
        self.train_set: ResizedImages | None = None

    @property
    def num_classes(self) -> int:
        """No known classes: the generator trained here is unconditional."""
        return 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = ResizedImages(real_ood_set(self.ood, data_dir=self.data_dir, known=()), self.image_size,
                                           self.channels)

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            raise RuntimeError("the OOD training set is not set up; call setup() first")
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          collate_fn=collate_samples, drop_last=len(self.train_set) > self.batch_size,
                          persistent_workers=self.num_workers > 0)
