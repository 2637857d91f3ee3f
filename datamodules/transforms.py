"""Image and target transforms: the open-set protocols' (DESIGN.md §5.1), and how a model takes images.

:class:`ModelInput` is what every evaluation asks of a model: the pipeline from a raw evaluation image (a
decoded file as a PIL image, an in-memory image as a float tensor in ``[0, 1]``) to a float tensor at the
model's size, and the normalisation after it. A timm model's comes from its data configuration, a
torchvision model's from its weights, a checkpoint's from its own datamodule
(:meth:`datamodules.OpenSetDataModule.model_input`). PIL-based pipelines (:class:`PILPipeline`) take tensors
too, turned into PIL images exactly as if they had been written to a PNG file; tensor pipelines
(:class:`TensorPipeline`) take PIL images too. So every method feeds a model the same input, and a set of
another size or channel count is resized and converted by the model's own rule, never scored as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision import transforms as T
from torchvision.transforms import functional as TF
from torchvision.transforms._presets import ImageClassification

from openset_common.labels import NEGATIVE_LABEL

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


# --------------------------------------------------------------------------------------------------
# What a model takes: from a raw evaluation image to the model's input


def to_float_tensor(image: Any) -> Tensor:
    """A raw image -> float tensor ``(C, H, W)`` in ``[0, 1]`` (PIL images decoded, uint8 tensors divided)."""
    if isinstance(image, Tensor):
        return image.float().div(255) if image.dtype == torch.uint8 else image.float()
    return TF.to_tensor(image)


def to_pil_image(image: Any, mode: str) -> Image.Image:
    """A raw image -> PIL image of ``mode`` (``"RGB"`` or ``"L"``); float tensors in ``[0, 1]`` are rounded to
    8 bits, exactly as if they had been written to a PNG file first."""
    if isinstance(image, Tensor):
        pixels = image if image.dtype == torch.uint8 else (image.float().clamp(0, 1) * 255).round().to(torch.uint8)
        if pixels.ndim != 3 or pixels.shape[0] not in (1, 3):
            raise ValueError(f"expected an image tensor (1 or 3, H, W), got shape {tuple(image.shape)}")
        array = pixels.permute(1, 2, 0).cpu().numpy()
        image = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    return image if image.mode == mode else image.convert(mode)


class TensorPipeline:
    """A model input built on tensors: ``channels`` (grey -> the mean of the channels, or repeated to 3) and a
    bilinear, antialiased resize to ``size`` (skipped when the image has it already). The input of this
    project's own small-image models (the Fashion-MNIST demo, the generators' 32 px)."""

    def __init__(self, size: int | tuple[int, int] | None, channels: int | None) -> None:
        self.size = (size, size) if isinstance(size, int) else (tuple(size) if size is not None else None)
        self.channels = channels
        if channels not in (None, 1, 3):
            raise ValueError(f"channels must be 1, 3 or None, got {channels!r}")

    def __call__(self, image: Any) -> Tensor:
        image = to_float_tensor(image)
        if self.channels is not None and image.shape[0] != self.channels:
            image = image.mean(dim=0, keepdim=True) if self.channels == 1 else image.expand(self.channels, -1, -1)
        if self.size is not None and tuple(image.shape[-2:]) != self.size:
            image = torch.nn.functional.interpolate(image[None], size=self.size, mode="bilinear", align_corners=False,
                                                    antialias=True)[0]
        return image

    def __repr__(self) -> str:
        return f"TensorPipeline(size={self.size}, channels={self.channels})"


class PILPipeline:
    """A model input built on PIL images (timm's and torchvision's evaluation transforms, the ImageNet
    protocols' Resize -> CenterCrop -> ToTensor): tensors are turned into PIL images of ``mode`` first."""

    def __init__(self, transform: Callable, mode: str = "RGB") -> None:
        self.transform, self.mode = transform, mode

    def __call__(self, image: Any) -> Tensor:
        return self.transform(to_pil_image(image, self.mode))

    def __repr__(self) -> str:
        return f"PILPipeline({self.mode}, {self.transform!r})"


@dataclass(frozen=True)
class ModelInput:
    """How a model takes images.

    Attributes:
        pipeline: raw image (PIL or tensor) -> float tensor ``(C, H, W)`` in ``[0, 1]`` at the model's size.
        mean, std: the per-channel normalisation applied after it (``None``: none; this project's models).
        size: the ``(H, W)`` the pipeline makes (``None``: it keeps the size it gets).
        channels: the channels the model takes.
    """

    pipeline: Callable[[Any], Tensor]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    size: tuple[int, int] | None = None
    channels: int | None = None

    def transform(self) -> Callable[[Any], Tensor]:
        """raw image -> the model's input (the pipeline, then the normalisation)."""
        if self.mean is None:
            return self.pipeline
        return T.Compose([self.pipeline, T.Normalize(self.mean, self.std)])

    def normalise(self, images: Tensor) -> Tensor:
        """Normalise a batch ``(N, C, H, W)`` of pipeline outputs (EvG's varied images), on their device."""
        if self.mean is None:
            return images
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
        return (images - mean) / std

    def key(self) -> str:
        """What identifies the input in cache keys."""
        return f"{self.pipeline!r}|mean={self.mean}|std={self.std}"

    @classmethod
    def from_transform(cls, transform: Callable, *, channels: int = 3, size: tuple[int, int] | None = None,
                       mode: str | None = None) -> ModelInput:
        """Split a PIL-based evaluation transform (a ``Compose``, torchvision's ``ImageClassification``
        preset) into the pipeline and its final ``Normalize``."""
        mode = mode or ("RGB" if channels == 3 else "L")
        if isinstance(transform, ImageClassification):
            steps = [T.Resize(transform.resize_size, interpolation=transform.interpolation, antialias=transform.antialias),
                     T.CenterCrop(transform.crop_size), T.ToTensor()]
            crop = transform.crop_size[0]
            return cls(PILPipeline(T.Compose(steps), mode), tuple(transform.mean), tuple(transform.std),
                       size or (crop, crop), channels)
        steps = list(getattr(transform, "transforms", [transform]))
        mean = std = None
        if steps and isinstance(steps[-1], T.Normalize):
            normalise = steps.pop()
            mean = tuple(float(m) for m in torch.as_tensor(normalise.mean).flatten())
            std = tuple(float(s) for s in torch.as_tensor(normalise.std).flatten())
        if size is None:
            crops = [s for s in steps if isinstance(s, T.CenterCrop)]
            if crops:
                crop = crops[-1].size
                size = (crop[0], crop[-1]) if isinstance(crop, (tuple, list)) else (crop, crop)
        return cls(PILPipeline(T.Compose(steps), mode), mean, std, size, channels)
