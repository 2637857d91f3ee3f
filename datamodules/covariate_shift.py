"""Covariate-shifted copies of in-distribution images, in the manner of ImageNet-C.

Hendrycks & Dietterich, *Benchmarking Neural Network Robustness to Common Corruptions and Perturbations*
(ICLR 2019). A corrupted in-distribution test image keeps its class: these are the "csid" sets of the
full-spectrum benchmark (covariate-shifted **in**-distribution, scored as ID, DESIGN.md §5.5), and
:func:`shifted_set` keeps the ID labels.

The corruptions, for images ``x`` in ``[0, 1]`` (``(N, C, H, W)``, any channel count; every statistic is per
image and per channel) and a severity's constant ``c``:

==================  =========================================================================================
``gaussian_noise``  ``clip(x + c·z, 0, 1)``, ``z ~ N(0, 1)`` per pixel and channel
``shot_noise``      ``clip(Poisson(c·x) / c, 0, 1)``
``gaussian_blur``   ``clip(G_c * x, 0, 1)``: a Gaussian of standard deviation ``c`` px, truncated at 4·c,
                    edges extended by the nearest pixel (``skimage.filters.gaussian``'s defaults)
``defocus_blur``    ``clip(D_{r,a} * x, 0, 1)``: the normalised disk of radius ``r`` on a grid of
                    ``max(8, r)`` px each side, anti-aliased by a 3x3 (``r <= 8``) or 5x5 Gaussian of std
                    ``a``; both convolutions mirror the edges without repeating them (OpenCV's default)
``contrast``        ``clip((x - m)·c + m, 0, 1)``, ``m`` the mean of the image's channel
``brightness``      HSV value ``V = max_k x_k`` raised to ``V' = clip(V + c, 0, 1)`` with hue and saturation
                    kept: ``x·V'/V`` (``V'`` in every channel where ``V = 0``); a grey image gives
                    ``clip(x + c, 0, 1)``
==================  =========================================================================================

The constants (:data:`CONSTANTS`) are the authors', read from ``hendrycks/robustness``
(``ImageNet-C/create_c/``, commit ``8190fe329f5f072a06e3a2aea02bb5dda69aed9f``): ``make_imagenet_c.py`` for
224 px ImageNet crops, ``make_tinyimagenet_c.py`` for 64 px Tiny ImageNet, ``make_cifar_c.py`` for 32 px
CIFAR-10. The pixel sizes of blur kernels and the visibility of noise depend on the image size, so
``constants="auto"`` takes the set made for the size closest to the image's shorter side (on a log scale):
CIFAR-10-C's for 28 px Fashion-MNIST (and anything up to 45 px), Tiny ImageNet-C's from 46 to 119 px,
ImageNet-C's above. No constant is rescaled. A grey image (``C = 1``) is corrupted as one channel: each
noise draws one value per pixel, and brightness acts on the grey value (the value of an RGB image whose
three channels are equal).

Differences from the released data sets, by design: the images stay float (the authors' files are
``uint8``, truncated by ``np.uint8``); the random draws are PyTorch's, one generator per image
(:func:`image_seed`), so the same ``(seed, index)`` gives the same noise at every severity (common random
numbers: severity 5 is severity 1's noise, scaled) and an image's corruption does not depend on the batch it
is in. ``gaussian_blur`` is one of ImageNet-C's four held-out corruptions; ``defocus_blur`` one of its 15.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.batch import Sample
from datamodules.evaluation import dataset_fingerprint
from datamodules.images import TensorImageDataset, dataset_labels
from openset_common.artefacts import digest

ConstantSet = Literal["cifar", "tiny_imagenet", "imagenet"]
SOURCE = "hendrycks/robustness@8190fe329f5f072a06e3a2aea02bb5dda69aed9f, ImageNet-C/create_c/"
SEVERITIES = (1, 2, 3, 4, 5)
# The image size each constant set was made for (the shorter side, px): CIFAR-10 32, Tiny ImageNet 64,
# ImageNet-C's centre crop 224.
NATIVE_SIZE: dict[str, int] = {"cifar": 32, "tiny_imagenet": 64, "imagenet": 224}
FILES: dict[str, str] = {"cifar": "make_cifar_c.py", "tiny_imagenet": "make_tinyimagenet_c.py",
                         "imagenet": "make_imagenet_c.py"}

# Per severity 1..5, as in the authors' scripts (the ``c = [...]`` of each function).
CONSTANTS: dict[str, dict[str, tuple[Any, ...]]] = {
    "gaussian_noise": {"cifar": (0.04, 0.06, 0.08, 0.09, 0.10),
                       "tiny_imagenet": (0.04, 0.08, 0.12, 0.15, 0.18),
                       "imagenet": (0.08, 0.12, 0.18, 0.26, 0.38)},
    "shot_noise": {"cifar": (500, 250, 100, 75, 50),
                   "tiny_imagenet": (250, 100, 50, 30, 15),
                   "imagenet": (60, 25, 12, 5, 3)},
    "gaussian_blur": {"cifar": (0.4, 0.6, 0.7, 0.8, 1.0),
                      "tiny_imagenet": (0.5, 0.75, 1.0, 1.25, 1.5),
                      "imagenet": (1, 2, 3, 4, 6)},
    "defocus_blur": {"cifar": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
                     "tiny_imagenet": ((0.5, 0.6), (1, 0.1), (1.5, 0.1), (2.5, 0.01), (3, 0.1)),
                     "imagenet": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))},
    "contrast": {"cifar": (0.75, 0.5, 0.4, 0.3, 0.15),
                 "tiny_imagenet": (0.4, 0.3, 0.2, 0.1, 0.05),
                 "imagenet": (0.4, 0.3, 0.2, 0.1, 0.05)},
    "brightness": {"cifar": (0.05, 0.1, 0.15, 0.2, 0.3),
                   "tiny_imagenet": (0.1, 0.2, 0.3, 0.4, 0.5),
                   "imagenet": (0.1, 0.2, 0.3, 0.4, 0.5)},
}


# ---------------------------------------------------------------------------------------------- filtering


BoundaryMode = Literal["wrap", "nearest", "mirror", "reflect"]


def boundary_indices(size: int, radius: int, mode: BoundaryMode) -> Tensor:
    """The source index of each position ``-radius .. size - 1 + radius`` of a line of ``size`` pixels
    extended by ``radius`` on both sides, as ``scipy.ndimage`` names the extensions:

    ``wrap`` ``(a b c d | a b c d | a b c d)``, ``nearest`` ``(a a a a | a b c d | d d d d)``,
    ``mirror`` ``(d c b | a b c d | c b a)`` (OpenCV's ``BORDER_REFLECT_101``), ``reflect``
    ``(d c b a | a b c d | d c b a)``; any radius, also one longer than the line.
    """
    position = torch.arange(-radius, size + radius)
    if mode == "wrap":
        return position % size
    if mode == "nearest":
        return position.clamp(0, size - 1)
    if mode == "mirror":
        if size == 1:
            return torch.zeros_like(position)
        period = 2 * size - 2
        folded = position.abs() % period
        return torch.where(folded >= size, period - folded, folded)
    if mode == "reflect":
        folded = position % (2 * size)
        return torch.where(folded >= size, 2 * size - 1 - folded, folded)
    raise ValueError(f"boundary mode must be one of wrap, nearest, mirror, reflect, got {mode!r}")


def gaussian_kernel1d(sigma: float, truncate: float = 4.0) -> Tensor:
    """The normalised 1-d Gaussian ``exp(-k²/(2σ²)) / Σ`` on ``k = -r..r``, ``r = int(truncate·σ + 0.5)``
    (``scipy.ndimage.gaussian_filter``'s kernel, which ``skimage.filters.gaussian`` uses), float64."""
    if not sigma > 0:
        raise ValueError(f"a Gaussian's standard deviation must be positive, got {sigma}")
    radius = int(truncate * float(sigma) + 0.5)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * offsets**2 / float(sigma) ** 2)
    return weights / weights.sum()


def filter_matrix(size: int, weights: Tensor, mode: BoundaryMode) -> Tensor:
    """The ``(size, size)`` matrix ``M`` of a 1-d correlation with ``weights`` (odd length, centred) under a
    boundary mode, so that ``M @ line`` filters a line; a kernel longer than the line folds onto it."""
    radius = (weights.numel() - 1) // 2
    source = boundary_indices(size, radius, mode).unfold(0, weights.numel(), 1)  # (size, 2r+1)
    matrix = torch.zeros(size, size, dtype=weights.dtype)
    rows = torch.arange(size).unsqueeze(1).expand_as(source)
    matrix.index_put_((rows.reshape(-1), source.reshape(-1)), weights.repeat(size), accumulate=True)
    return matrix


def gaussian_filter(images: Tensor, sigma: float, *, mode: BoundaryMode, truncate: float = 4.0) -> Tensor:
    """Each channel of ``images`` (``(..., H, W)``) filtered by a 2-d Gaussian of std ``sigma`` px (separable,
    :func:`gaussian_kernel1d`) with the given edge extension: ``scipy.ndimage.gaussian_filter`` over the last
    two axes (computed in float64, returned in the input's dtype)."""
    weights = gaussian_kernel1d(sigma, truncate)
    height, width = images.shape[-2:]
    rows = filter_matrix(height, weights, mode).to(images.device)
    columns = filter_matrix(width, weights, mode).to(images.device)
    filtered = rows @ images.double() @ columns.T
    return filtered.to(images.dtype)


def disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """ImageNet-C's defocus kernel: the disk ``X² + Y² <= radius²`` on the grid ``-L..L`` (``L = 8`` for
    ``radius <= 8``, else ``radius``), normalised, then blurred by an OpenCV-style Gaussian of std
    ``alias_blur`` and size 3 (5 for ``radius > 8``; ``exp(-k²/(2σ²))`` normalised), edges mirrored
    (``BORDER_REFLECT_101``) -- the authors' ``disk()``, float64."""
    half, size = (8, 3) if radius <= 8 else (int(radius), 5)
    grid = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius**2).double()
    disk /= disk.sum()
    offsets = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    gauss = torch.exp(-(offsets**2) / (2 * alias_blur**2))
    gauss /= gauss.sum()
    matrix = filter_matrix(disk.shape[0], gauss, "mirror")
    return matrix @ disk @ matrix.T


def correlate2d(images: Tensor, kernel: Tensor, *, mode: BoundaryMode, chunk: int = 64) -> Tensor:
    """Each channel of ``images`` (``(N, C, H, W)``) correlated with a centred 2-d ``kernel`` (odd sizes),
    edges extended by ``mode`` (:func:`boundary_indices`): OpenCV's ``filter2D`` for ``mode="mirror"``.

    ``out[i, j] = Σ_{u,v} K[u, v] · P[i + u, j + v]`` over the extended image ``P``, computed in float64 as
    the product of discrete Fourier transforms (the extended image is as large as every shift the kernel
    needs, so no circular wrap reaches the output), ``chunk`` channel images at a time.
    """
    ky, kx = kernel.shape
    n, c, height, width = images.shape
    rows = boundary_indices(height, (ky - 1) // 2, mode).to(images.device)
    columns = boundary_indices(width, (kx - 1) // 2, mode).to(images.device)
    size = (height + ky - 1, width + kx - 1)
    flipped = torch.zeros(size, dtype=torch.float64, device=images.device)
    flipped[:ky, :kx] = kernel.double().flip(0, 1)
    spectrum = torch.fft.rfft2(flipped)
    flat = images.reshape(n * c, height, width)
    out = torch.empty((n * c, height, width), dtype=torch.float64, device=images.device)
    for start in range(0, n * c, chunk):
        padded = flat[start:start + chunk].double()[:, rows][:, :, columns]
        full = torch.fft.irfft2(torch.fft.rfft2(padded) * spectrum, s=size)
        out[start:start + chunk] = full[:, ky - 1:ky - 1 + height, kx - 1:kx - 1 + width]
    return out.reshape(n, c, height, width).to(images.dtype)


# ---------------------------------------------------------------------------------------------- corruptions


def image_seed(seed: int, index: int) -> int:
    """The seed of image ``index``'s generator: the first 8 bytes (little-endian) of
    ``sha256(f"{seed}:{index}")``. An image's draws depend on its index and the seed only."""
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{int(index)}".encode()).digest()[:8], "little")


def _generators(seed: int, first_index: int, count: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(image_seed(seed, first_index + i)) for i in range(count)]


def _gaussian_noise(images: Tensor, c: float, generators: Sequence[torch.Generator]) -> Tensor:
    noise = torch.stack([torch.randn(images.shape[1:], generator=g, dtype=torch.float64) for g in generators])
    return (images.double() + c * noise.to(images.device)).clamp(0, 1).to(images.dtype)


def _shot_noise(images: Tensor, c: float, generators: Sequence[torch.Generator]) -> Tensor:
    rates = images.double().cpu() * c
    counts = torch.stack([torch.poisson(rate, generator=g) for rate, g in zip(rates, generators, strict=True)])
    return (counts / c).clamp(0, 1).to(device=images.device, dtype=images.dtype)


def _gaussian_blur(images: Tensor, c: float, generators: Sequence[torch.Generator]) -> Tensor:
    return gaussian_filter(images, c, mode="nearest").clamp(0, 1)


def _defocus_blur(images: Tensor, c: tuple[float, float], generators: Sequence[torch.Generator]) -> Tensor:
    kernel = disk_kernel(*c).to(images.device)
    return correlate2d(images, kernel, mode="mirror").clamp(0, 1)


def _contrast(images: Tensor, c: float, generators: Sequence[torch.Generator]) -> Tensor:
    means = images.double().mean(dim=(-2, -1), keepdim=True)
    return ((images.double() - means) * c + means).clamp(0, 1).to(images.dtype)


def _brightness(images: Tensor, c: float, generators: Sequence[torch.Generator]) -> Tensor:
    x = images.double()
    value = x.amax(dim=1, keepdim=True)
    raised = (value + c).clamp(0, 1)
    scaled = torch.where(value > 0, x * (raised / value.clamp_min(torch.finfo(torch.float64).tiny)), raised)
    return scaled.clamp(0, 1).to(images.dtype)


@dataclass(frozen=True)
class Corruption:
    """One corruption: its ImageNet-C name, the formula in words, the authors' constants per size
    (:data:`CONSTANTS`) and ``apply(images, c, generators)``."""

    name: str
    description: str
    constants: dict[str, tuple[Any, ...]]
    apply: Callable[[Tensor, Any, Sequence[torch.Generator]], Tensor]
    random: bool


CORRUPTIONS: dict[str, Corruption] = {
    corruption.name: corruption
    for corruption in (
        Corruption("gaussian_noise", "clip(x + c·z), z standard normal per pixel and channel",
                   CONSTANTS["gaussian_noise"], _gaussian_noise, True),
        Corruption("shot_noise", "clip(Poisson(c·x) / c): photon noise of c photons at full intensity",
                   CONSTANTS["shot_noise"], _shot_noise, True),
        Corruption("gaussian_blur", "a Gaussian blur of std c px (truncated at 4c, nearest-pixel edges)",
                   CONSTANTS["gaussian_blur"], _gaussian_blur, False),
        Corruption("defocus_blur", "a disk of radius r px, anti-aliased by a Gaussian of std a (mirrored edges)",
                   CONSTANTS["defocus_blur"], _defocus_blur, False),
        Corruption("contrast", "clip((x - m)·c + m), m the mean of each channel of each image",
                   CONSTANTS["contrast"], _contrast, False),
        Corruption("brightness", "HSV value V raised to clip(V + c), hue and saturation kept",
                   CONSTANTS["brightness"], _brightness, False),
    )
}


def constant_set_for(height: int, width: int) -> str:
    """The constant set made for the size closest to ``min(height, width)`` on a log scale
    (:data:`NATIVE_SIZE`): ``cifar`` up to 45 px, ``tiny_imagenet`` 46-119 px, ``imagenet`` above."""
    side = min(height, width)
    return min(NATIVE_SIZE, key=lambda name: abs(math.log(side / NATIVE_SIZE[name])))


def corruption_constant(name: str, severity: int, constants: str = "auto", *, size: tuple[int, int] | None = None):
    """The constant ``c`` of a corruption at a severity, from the set ``constants`` (``"auto"``: the set for
    ``size``, :func:`constant_set_for`)."""
    corruption = _corruption(name)
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise ValueError(f"corruption {name!r}: severity must be an integer 1..5, got {severity!r}")
    if constants == "auto":
        if size is None:
            raise ValueError("constants='auto' needs the image size")
        constants = constant_set_for(*size)
    if constants not in NATIVE_SIZE:
        raise ValueError(f"constants must be 'auto' or one of {list(NATIVE_SIZE)}, got {constants!r}")
    return corruption.constants[constants][int(severity) - 1]


def _corruption(name: str) -> Corruption:
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; known: {sorted(CORRUPTIONS)}")
    return CORRUPTIONS[name]


def _check_images(images: Tensor, *, what: str) -> None:
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"{what}: give images as a (N, C, H, W) tensor, got {shape}")
    if not images.is_floating_point():
        raise ValueError(f"{what}: images must be float in [0, 1], got {images.dtype} (divide uint8 images by 255)")
    if images.numel():
        low, high = float(images.min()), float(images.max())
        if not (0.0 <= low and high <= 1.0):
            raise ValueError(f"{what}: images must lie in [0, 1], got values in [{low:g}, {high:g}]")


def corrupt(images: Tensor, name: str, severity: int, seed: int = 0, *, constants: str = "auto",
            first_index: int = 0) -> Tensor:
    """Corrupted copies of ``images`` (``(N, C, H, W)``, float in ``[0, 1]``), float in ``[0, 1]``, same shape
    and dtype.

    Args:
        name: one of :data:`CORRUPTIONS` (formulas in the module docstring).
        severity: 1..5.
        seed: image ``i`` draws its noise from a generator seeded with ``image_seed(seed, first_index + i)``.
        constants: ``"cifar"``, ``"tiny_imagenet"``, ``"imagenet"`` or ``"auto"`` (by image size,
            :func:`constant_set_for`).
        first_index: the dataset index of the first image (a batch of a larger set gets the same noise as
            the whole set would).

    Raises:
        ValueError: an unknown name, a severity outside 1..5, images that are not ``(N, C, H, W)`` floats in
            ``[0, 1]``.
    """
    what = f"corruption {name!r}"
    corruption = _corruption(name)
    _check_images(images, what=what)
    c = corruption_constant(name, severity, constants, size=(images.shape[-2], images.shape[-1]))
    generators = _generators(seed, first_index, images.shape[0]) if corruption.random else []
    return corruption.apply(images, c, generators)


# ---------------------------------------------------------------------------------------------- data sets


def _as_tensor(image: Any) -> Tensor:
    """A raw image as a float ``(C, H, W)`` tensor in ``[0, 1]``: a PIL image (decoded file) or a tensor
    (uint8 divided by 255)."""
    if isinstance(image, Image.Image):
        array = np.asarray(image)
        array = array[:, :, None] if array.ndim == 2 else array
        return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(255)
    tensor = torch.as_tensor(image)
    return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor.float()


class ShiftedDataset(Dataset):
    """The samples of an in-distribution data set with every image corrupted (:func:`corrupt`), lazily, each
    with its own generator (``image_seed(seed, index)``): sample ``i`` equals ``corrupt`` of the clean image
    ``i`` with ``first_index=i``. Labels, indices and source classes are the clean set's.

    Args:
        dataset: yields :class:`datamodules.batch.Sample` with raw images (PIL images or tensors in ``[0, 1]``).
        prepare: applied to each raw image before it is corrupted (e.g. ImageNet-C's ``Resize(256)``,
            ``CenterCrop(224)``, so that the constants meet the size they were made for); ``None``: as is.
    """

    def __init__(self, dataset: Dataset, name: str, severity: int, seed: int = 0, *, constants: str = "auto",
                 prepare: Callable[[Any], Any] | None = None) -> None:
        _corruption(name)
        corruption_constant(name, severity, constants, size=(NATIVE_SIZE["imagenet"],) * 2)  # checks both
        self.dataset, self.name, self.severity, self.seed = dataset, name, int(severity), int(seed)
        self.constants, self.prepare = constants, prepare
        self.source_classes = getattr(dataset, "source_classes", None)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Sample:
        sample = self.dataset[index]
        if sample.image is None:
            return sample
        image = _as_tensor(self.prepare(sample.image) if self.prepare is not None else sample.image)
        what = f"corruption {self.name!r} of image {index}"
        _check_images(image.unsqueeze(0), what=what)
        shifted = corrupt(image.unsqueeze(0), self.name, self.severity, self.seed, constants=self.constants,
                          first_index=index)[0]
        return Sample(shifted, sample.target, sample.index)

    def labels(self) -> Tensor:
        return dataset_labels(self.dataset)

    def without_transform(self) -> ShiftedDataset:
        """Itself: it yields raw images (float tensors in ``[0, 1]``) already."""
        return self

    def fingerprint(self) -> str:
        return digest({"corruption": self.name, "severity": self.severity, "seed": self.seed,
                       "constants": self.constants, "source": SOURCE, "prepare": repr(self.prepare),
                       "of": dataset_fingerprint(self.dataset)})


def shifted_set(images: Tensor | Dataset, labels: Tensor | Sequence[int] | None = None, *, name: str,
                severity: int, seed: int = 0, constants: str = "auto",
                prepare: Callable[[Any], Any] | None = None) -> ShiftedDataset:
    """A covariate-shifted in-distribution ("csid") set: the images corrupted, the ID labels kept.

    Args:
        images: a ``(N, C, H, W)`` float tensor in ``[0, 1]`` (with ``labels``), or a data set yielding
            :class:`datamodules.batch.Sample` with raw images (its own labels are kept; ``labels`` must be
            ``None``).
        labels: ``(N,)`` the ID labels of a tensor of images.
        name, severity, seed, constants: as :func:`corrupt`.
        prepare: see :class:`ShiftedDataset`.

    Raises:
        ValueError: labels missing for tensors or given with a data set, or not one per image; a bad name,
            severity or image tensor.
    """
    if isinstance(images, Tensor):
        _check_images(images, what=f"shifted set {name!r}")
        if labels is None:
            raise ValueError(f"shifted set {name!r}: a tensor of images needs its ID labels")
        labels = torch.as_tensor(labels, dtype=torch.long).flatten()
        if labels.numel() != images.shape[0]:
            raise ValueError(f"shifted set {name!r}: {images.shape[0]} images but {labels.numel()} labels")
        dataset: Dataset = TensorImageDataset(images, labels)
    else:
        if labels is not None:
            raise ValueError(f"shifted set {name!r}: the labels of a data set are its own; pass labels only "
                             "with a tensor of images")
        dataset = images
    return ShiftedDataset(dataset, name, severity, seed, constants=constants, prepare=prepare)


__all__ = ["CONSTANTS", "CORRUPTIONS", "NATIVE_SIZE", "SEVERITIES", "Corruption", "ShiftedDataset",
           "boundary_indices", "constant_set_for", "correlate2d", "corrupt", "corruption_constant",
           "disk_kernel", "filter_matrix", "gaussian_filter", "gaussian_kernel1d", "image_seed", "shifted_set"]
