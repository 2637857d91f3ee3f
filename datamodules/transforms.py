"""Image and target transforms of the open-set protocols (DESIGN.md §5.1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision import transforms as T

from common import NEGATIVE_LABEL

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class BackgroundClassTarget:
    """Target transform of the background-class (BG) approach: negatives ``-1`` become class ``K``.

    Applied to the training set only; the dataset itself keeps the project's labels, so validation and
    test metrics still see ``-1`` for negatives.
    """

    def __init__(self, num_known: int) -> None:
        if num_known < 1:
            raise ValueError(f"num_known must be positive, got {num_known}")
        self.num_known = num_known

    def __call__(self, target: int | Tensor) -> int | Tensor:
        if isinstance(target, Tensor):
            return torch.where(target == NEGATIVE_LABEL, torch.full_like(target, self.num_known), target)
        return self.num_known if target == NEGATIVE_LABEL else target

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_known={self.num_known})"


def _to_tensor(normalize: bool, mean: Sequence[float], std: Sequence[float]) -> list:
    steps: list = [T.ToTensor()]
    if normalize:
        steps.append(T.Normalize(mean, std))
    return steps


def train_transform(
    *, resize: int = 256, crop: int = 224, normalize: bool = False, mean=IMAGENET_MEAN, std=IMAGENET_STD
) -> T.Compose:
    """Resize(256) -> RandomCrop(224) -> RandomHorizontalFlip -> tensor (the authors': no normalisation)."""
    return T.Compose([T.Resize(resize), T.RandomCrop(crop), T.RandomHorizontalFlip(), *_to_tensor(normalize, mean, std)])


def eval_transform(
    *, resize: int = 256, crop: int = 224, normalize: bool = False, mean=IMAGENET_MEAN, std=IMAGENET_STD
) -> T.Compose:
    """Resize(256) -> CenterCrop(224) -> tensor."""
    return T.Compose([T.Resize(resize), T.CenterCrop(crop), *_to_tensor(normalize, mean, std)])
