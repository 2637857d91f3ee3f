"""The synthetic OOD unit tests of NINCO: noise and patterns that a good detector must reject.

Bitterwolf, Müller, Hein, *In or Out? Fixing ImageNet Out-of-Distribution Detection Evaluation* (ICML 2023),
github.com/j-cb/NINCO. The authors ship 17 unit tests of 400 images each; their names, print names and
abbreviations are those of the repository's ``data/NINCO_class_names.csv`` and how each is made is their
``noise_functions.py`` and ``create_unit_test_data.ipynb`` (read at commit ``8f42ce7b7cccf4304421e551dcbbfe64ce090a9a``). This module writes its own generator for the 15 that need no photo
(:data:`UNIT_TESTS`); every image is float in ``[0, 1]`` (the authors clip every test to ``[0, 1]``):

=============================  ==================================================================================
``uni``                        uniform noise: every pixel and channel ``U(0, 1)``
``Gaussian``                   ``clip(0.5 + σ·z)``, ``z ~ N(0, 1)``, σ per image from {.05, .075, .1, .15, .2, .3, .5}
``Rademacher``                 every pixel and channel 0 or 1 with probability 1/2
``white`` / ``black``          every pixel 1 / 0
``grey``                       one value ``U(0, 1)`` in every pixel and channel
``monochrome``                 one colour ``U(0, 1)^C`` in every pixel
``tricolour``                  3 stripes of random colours ``U(0, 1)^C``, horizontal or vertical (1/2 each)
``tricolour_primary``          the same with every colour channel 0 or 1 (probability 1/2)
``horizontal_stripes``         n stripes of random colours, n from {4, 5, 7, 10, 15, 20}; ``vertical_stripes``
                               the same across
``low_freq``                   uniform noise blurred by a Gaussian of σ from {10, 15, 25, 40, 60, 85} px
                               (wrapping edges), stretched to the full range over all channels
                               ``(b - min b) / max(b - min b)``
``low_freq_channelfullscale``  the same, stretched per channel
``low_freq_colorrange``        the same blur, per channel ``clip(c + 2d·(b - q_.025) / q_.975(b - q_.025))``:
                               the central 95% of the values spread over ``[c, c + 2d]``, colour ``c ~ U(0,1)^C``,
                               ``d ~ U(0.1, 0.3)``
``blobs``                      Bernoulli(0.7) pixels and channels blurred by a Gaussian of σ from
                               {1.5, 2, 2.5, 3, 3.5, 4} px (wrapping edges); values below 0.75 set to 0
=============================  ==================================================================================

Stripes are ``floor(side / n)`` pixels wide and the last one takes the remainder, as in the authors' code;
``n`` is capped at the side length. The Gaussians are ``scipy.ndimage.gaussian_filter``'s (truncated at
4σ) with ``mode="wrap"``, as ``skimage.filters.gaussian(..., mode="wrap")`` applies them.

**The two photo tests** (:data:`PHOTO_UNIT_TESTS`) are not generated from nothing: ``pixel_perm`` ("IN pixel
permutations") shuffles the pixel positions of an ImageNet-1k validation photo (each pixel's colour kept),
and ``low_freq_pixel_perm`` ("smooth IN pixel permutations") blurs that by a Gaussian of σ from {1, 1.5, 2, 3,
4, 6, 8} px. They are left out of :data:`UNIT_TESTS` and :func:`unit_test_images`; give the photos to
:func:`photo_unit_test_images` (the authors used in-distribution photos, so a data set's own ID test images
reproduce the test).

**Image size.** The authors' images have the size of the ImageNet validation photo each replaced (typically
500x375). A blur's σ is a size in pixels, so here it is scaled by ``min(H, W) / reference_side`` with
``reference_side = 375`` (:data:`REFERENCE_SIDE`): the blobs and the smooth noise cover the same share of the
image at any size (at 28 px a blob's σ of 1.5-4 px becomes 0.1-0.3 px, so blobs are single pixels);
``reference_side=None`` keeps the authors' pixel values. The authors' files are 8-bit PNG or JPEG (every other
image); these images are float, not compressed. Randomness: image ``i`` of a test draws everything from its
own generator seeded with :func:`unit_test_seed` ``(name, seed, i)``, so the first ``k`` of ``n`` images are
the ``k`` images, and two tests never share draws.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from datamodules.covariate_shift import gaussian_filter
from datamodules.images import TensorImageDataset
from openset_common.artefacts import atomic_write_bytes
from openset_common.labels import UNKNOWN_LABEL

REFERENCE_SIDE = 375
SOURCE = "github.com/j-cb/NINCO: noise_functions.py, create_unit_test_data.ipynb, data/NINCO_class_names.csv"

# The authors' choices, per image (create_unit_test_data.ipynb)
GAUSSIAN_SIGMAS = (0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5)
LOW_FREQ_SIGMAS = (10, 15, 25, 40, 60, 85)
BLOB_SIGMAS = (1.5, 2, 2.5, 3, 3.5, 4)
PIXEL_PERM_SIGMAS = (1, 1.5, 2, 3, 4, 6, 8)
STRIPE_COUNTS = (4, 5, 7, 10, 15, 20)
BLOB_PROBABILITY = 0.7
BLOB_THRESHOLD = 0.75
COLOUR_DEVIATION = (0.1, 0.3)
CENTRAL_SHARE = 0.95  # scale_color_range's quantile_in_deviation

Size = tuple[int, int]
Generate = Callable[[torch.Generator, Size, int, float], Tensor]


@dataclass(frozen=True)
class UnitTest:
    """One unit test: the authors' name (their folder), print name and abbreviation, how its images are
    made, and ``generate(generator, (H, W), channels, scale) -> (C, H, W)`` (``scale`` multiplies the
    authors' blur σ in pixels)."""

    name: str
    title: str
    abbreviation: str
    description: str
    generate: Generate


def _choice(options: Sequence[float], generator: torch.Generator) -> float:
    return float(options[int(torch.randint(len(options), (1,), generator=generator))])


def _uniform(generator: torch.Generator, size: Size, channels: int) -> Tensor:
    return torch.rand((channels, *size), generator=generator, dtype=torch.float64)


def _stripes(colours: Tensor, size: Size, horizontal: bool) -> Tensor:
    """Stripes of ``colours`` (``(n, C)``) across the image: ``floor(side / n)`` px each, the last stripe
    reaching the far edge (the authors' ``noise_stripes``)."""
    count = colours.shape[0]
    side = size[0] if horizontal else size[1]
    width = side // count
    stripe = (torch.arange(side) // width).clamp(max=count - 1)
    line = colours[stripe].T  # (C, side)
    if horizontal:
        return line[:, :, None].expand(-1, size[0], size[1])
    return line[:, None, :].expand(-1, size[0], size[1])


def _full_range(image: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``(b - min b) / max(b - min b)`` over ``dims``; a constant image gives 0."""
    shifted = image - image.amin(dim=dims, keepdim=True)
    top = shifted.amax(dim=dims, keepdim=True)
    return torch.where(top > 0, shifted / top.clamp_min(torch.finfo(image.dtype).tiny), torch.zeros_like(shifted))


def colour_range(image: Tensor, centre: Tensor, deviation: float) -> Tensor:
    """The authors' ``scale_color_range`` per channel of ``image`` (``(C, H, W)``):
    ``clip(c + 2d·(b - q_lo) / q_hi(b - q_lo), 0, 1)`` with ``q_lo`` the 2.5% quantile of the channel and
    ``q_hi`` the 97.5% quantile of the shifted channel (linear interpolation, numpy's default)."""
    flat = image.reshape(image.shape[0], -1)
    low = torch.quantile(flat, (1 - CENTRAL_SHARE) / 2, dim=1)[:, None, None]
    shifted = image - low
    high = torch.quantile(shifted.reshape(image.shape[0], -1), 0.5 + CENTRAL_SHARE / 2, dim=1)[:, None, None]
    normalised = torch.where(high > 0, shifted / high.clamp_min(torch.finfo(image.dtype).tiny), torch.zeros_like(shifted))
    return (2 * normalised * deviation + centre.reshape(-1, 1, 1)).clamp(0, 1)


def _smooth_uniform(generator: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    sigma = _choice(LOW_FREQ_SIGMAS, generator) * scale
    return gaussian_filter(_uniform(generator, size, channels), sigma, mode="wrap")


def _gen_uni(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    return _uniform(g, size, channels)


def _gen_gaussian(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    sigma = _choice(GAUSSIAN_SIGMAS, g)
    return (0.5 + sigma * torch.randn((channels, *size), generator=g, dtype=torch.float64)).clamp(0, 1)


def _gen_rademacher(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    return (_uniform(g, size, channels) > 0.5).double()


def _gen_constant(value: float) -> Generate:
    def generate(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
        return torch.full((channels, *size), value, dtype=torch.float64)
    return generate


def _gen_grey(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    value = torch.rand(1, generator=g, dtype=torch.float64)
    return value.reshape(1, 1, 1).expand(channels, *size).clone()


def _gen_monochrome(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    colour = torch.rand(channels, generator=g, dtype=torch.float64)
    return colour.reshape(-1, 1, 1).expand(channels, *size).clone()


def _gen_tricolour(primary: bool) -> Generate:
    def generate(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
        horizontal = bool(torch.randint(2, (1,), generator=g) == 0)
        colours = torch.rand((3, channels), generator=g, dtype=torch.float64)
        if primary:
            colours = (colours < 0.5).double()
        return _stripes(colours, size, horizontal).clone()
    return generate


def _gen_stripes(horizontal: bool) -> Generate:
    def generate(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
        count = min(int(_choice(STRIPE_COUNTS, g)), size[0] if horizontal else size[1])
        colours = torch.rand((count, channels), generator=g, dtype=torch.float64)
        return _stripes(colours, size, horizontal).clone()
    return generate


def _gen_low_freq(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    return _full_range(_smooth_uniform(g, size, channels, scale), (0, 1, 2)).clamp(0, 1)


def _gen_low_freq_channel(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    return _full_range(_smooth_uniform(g, size, channels, scale), (1, 2)).clamp(0, 1)


def _gen_low_freq_colour(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    smooth = _smooth_uniform(g, size, channels, scale)
    centre = torch.rand(channels, generator=g, dtype=torch.float64)
    low, high = COLOUR_DEVIATION
    deviation = low + (high - low) * float(torch.rand(1, generator=g, dtype=torch.float64))
    return colour_range(smooth, centre, deviation)


def _gen_blobs(g: torch.Generator, size: Size, channels: int, scale: float) -> Tensor:
    sigma = _choice(BLOB_SIGMAS, g) * scale
    spots = (_uniform(g, size, channels) < BLOB_PROBABILITY).double()
    blurred = gaussian_filter(spots, sigma, mode="wrap")
    # the authors' push_out: below 0.75 -> 0, above 1 -> 1 (a blur of {0, 1} never exceeds 1)
    return torch.where(blurred < BLOB_THRESHOLD, torch.zeros_like(blurred), blurred).clamp(0, 1)


UNIT_TESTS: dict[str, UnitTest] = {
    test.name: test
    for test in (
        UnitTest("uni", "uniform noise", "Uni", "every pixel and channel uniform on [0, 1]", _gen_uni),
        UnitTest("Gaussian", "Gaussian noise", "Gauss",
                 "0.5 + σ·N(0, 1) per pixel and channel, clipped; σ per image from {.05, .075, .1, .15, .2, .3, .5}",
                 _gen_gaussian),
        UnitTest("Rademacher", "Rademacher noise", "Rade", "every pixel and channel 0 or 1, each with probability 1/2",
                 _gen_rademacher),
        UnitTest("white", "white", "White", "every pixel 1", _gen_constant(1.0)),
        UnitTest("black", "black", "Black", "every pixel 0", _gen_constant(0.0)),
        UnitTest("grey", "shades of grey", "Grey", "one grey value U(0, 1) everywhere", _gen_grey),
        UnitTest("monochrome", "monochrome", "Mono", "one colour U(0, 1) per channel everywhere", _gen_monochrome),
        UnitTest("tricolour", "tricolour", "Tri", "three stripes of random colours, horizontal or vertical",
                 _gen_tricolour(primary=False)),
        UnitTest("tricolour_primary", "primary tricolour", "PrTri",
                 "three stripes of colours whose channels are 0 or 1, horizontal or vertical", _gen_tricolour(primary=True)),
        UnitTest("horizontal_stripes", "horizontal stripes", "Hor",
                 "n horizontal stripes of random colours, n from {4, 5, 7, 10, 15, 20}", _gen_stripes(horizontal=True)),
        UnitTest("vertical_stripes", "vertical stripes", "Ver",
                 "n vertical stripes of random colours, n from {4, 5, 7, 10, 15, 20}", _gen_stripes(horizontal=False)),
        UnitTest("low_freq", "smooth noise", "SmN",
                 "uniform noise blurred (σ 10-85 px at 375 px), stretched to [0, 1] over all channels", _gen_low_freq),
        UnitTest("low_freq_channelfullscale", "smooth noise+", "SmN+",
                 "uniform noise blurred (σ 10-85 px at 375 px), stretched to [0, 1] per channel", _gen_low_freq_channel),
        UnitTest("low_freq_colorrange", "smooth color", "SmCol",
                 "uniform noise blurred (σ 10-85 px at 375 px), its central 95% spread over [c, c + 2d] per channel",
                 _gen_low_freq_colour),
        UnitTest("blobs", "blobs", "Blob",
                 "Bernoulli(0.7) noise blurred (σ 1.5-4 px at 375 px), values below 0.75 set to 0", _gen_blobs),
    )
}

# The tests made from photos: name -> (print name, abbreviation, description)
PHOTO_UNIT_TESTS: dict[str, tuple[str, str, str]] = {
    "pixel_perm": ("IN pixel permutations", "PxPerm", "the pixel positions of an ImageNet photo shuffled"),
    "low_freq_pixel_perm": ("smooth IN pixel permutations", "SmPxPerm",
                            "an ImageNet photo's pixels shuffled, then blurred (σ 1-8 px at 375 px)"),
}


def unit_test_seed(name: str, seed: int, index: int) -> int:
    """The seed of the generator of image ``index`` of test ``name``: the first 8 bytes (little-endian) of
    ``sha256(f"{name}:{seed}:{index}")``."""
    return int.from_bytes(hashlib.sha256(f"{name}:{int(seed)}:{int(index)}".encode()).digest()[:8], "little")


def _size(size: int | Sequence[int], *, what: str) -> Size:
    try:
        pair = (size, size) if isinstance(size, int) else tuple(size)
    except TypeError:
        pair = ()
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in pair):
        raise ValueError(f"{what}: size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


def _scale(size: Size, reference_side: int | None, *, what: str) -> float:
    if reference_side is None:
        return 1.0
    if reference_side < 1:
        raise ValueError(f"{what}: reference_side must be positive or None, got {reference_side!r}")
    return min(size) / reference_side


def _check_count(count: int, channels: int, *, what: str) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{what}: count must be a positive int, got {count!r}")
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise ValueError(f"{what}: channels must be a positive int, got {channels!r}")


def unit_test_images(name: str, count: int, size: int | Sequence[int], channels: int = 3, seed: int = 0, *,
                     reference_side: int | None = REFERENCE_SIDE) -> Tensor:
    """``count`` images of unit test ``name``: float32 ``(count, channels, H, W)`` in ``[0, 1]``.

    Args:
        name: one of :data:`UNIT_TESTS`.
        size: ``H = W`` or ``(H, W)``.
        channels: 3 for RGB, 1 for grey (every colour drawn per channel).
        seed: with the name and the image's index, seeds each image's generator (:func:`unit_test_seed`).
        reference_side: the blur σ of the authors (pixels of ~375 px photos) are scaled by
            ``min(H, W) / reference_side``; ``None`` keeps them.

    Raises:
        ValueError: an unknown name (a photo test names :func:`photo_unit_test_images`), a count, size or
            channel count that is not positive.
    """
    what = f"unit test {name!r}"
    if name in PHOTO_UNIT_TESTS:
        raise ValueError(f"{what} is made from photos (ImageNet validation images in NINCO): give the photos to "
                         "photo_unit_test_images()")
    if name not in UNIT_TESTS:
        raise ValueError(f"unknown unit test {name!r}; known: {list(UNIT_TESTS)} (made from photos: "
                         f"{list(PHOTO_UNIT_TESTS)})")
    _check_count(count, channels, what=what)
    shape = _size(size, what=what)
    scale = _scale(shape, reference_side, what=what)
    generate = UNIT_TESTS[name].generate
    images = [generate(torch.Generator().manual_seed(unit_test_seed(name, seed, index)), shape, channels, scale)
              for index in range(count)]
    return torch.stack(images).float()


def photo_unit_test_images(name: str, photos: Tensor, seed: int = 0, *,
                           reference_side: int | None = REFERENCE_SIDE) -> Tensor:
    """The photo tests of NINCO (:data:`PHOTO_UNIT_TESTS`) made from ``photos`` (``(N, C, H, W)``, float in
    ``[0, 1]``): ``pixel_perm`` shuffles each photo's pixel positions (one permutation for all channels);
    ``low_freq_pixel_perm`` then blurs it with a Gaussian of σ from {1, 1.5, 2, 3, 4, 6, 8} px times
    ``min(H, W) / reference_side`` (wrapping edges). Image ``i`` draws from ``unit_test_seed(name, seed, i)``.

    Raises:
        ValueError: an unknown name, photos that are not ``(N, C, H, W)`` floats in ``[0, 1]``.
    """
    what = f"unit test {name!r}"
    if name not in PHOTO_UNIT_TESTS:
        raise ValueError(f"unknown photo unit test {name!r}; known: {list(PHOTO_UNIT_TESTS)}")
    if not isinstance(photos, Tensor) or photos.dim() != 4 or not photos.is_floating_point():
        raise ValueError(f"{what}: give the photos as a float (N, C, H, W) tensor in [0, 1], got "
                         f"{photos.dtype if isinstance(photos, Tensor) else type(photos).__name__}"
                         f"{tuple(photos.shape) if isinstance(photos, Tensor) else ''}")
    if photos.numel() and not (0 <= float(photos.min()) and float(photos.max()) <= 1):
        raise ValueError(f"{what}: photos must lie in [0, 1], got [{float(photos.min()):g}, {float(photos.max()):g}]")
    _, channels, height, width = photos.shape
    scale = _scale((height, width), reference_side, what=what)
    out = []
    for index, photo in enumerate(photos.double().cpu()):
        generator = torch.Generator().manual_seed(unit_test_seed(name, seed, index))
        sigma = _choice(PIXEL_PERM_SIGMAS, generator) * scale
        order = torch.randperm(height * width, generator=generator)
        shuffled = photo.reshape(channels, -1)[:, order].reshape(channels, height, width)
        if name == "low_freq_pixel_perm":
            shuffled = gaussian_filter(shuffled, sigma, mode="wrap").clamp(0, 1)
        out.append(shuffled)
    return torch.stack(out).to(photos.dtype)


def unit_test_set(name: str | Sequence[str], count: int, size: int | Sequence[int], channels: int = 3,
                  seed: int = 0, *, reference_side: int | None = REFERENCE_SIDE) -> TensorImageDataset:
    """An OOD data set of unit tests: ``count`` images of each named test (:func:`unit_test_images`), stored
    as 8-bit images (``round(255·x)``, like the authors' files; 4x less memory than float), every label
    ``UNKNOWN_LABEL``, and each image's test (its index in :data:`UNIT_TESTS`) as ``source_classes``."""
    names = [name] if isinstance(name, str) else list(name)
    if not names:
        raise ValueError("unit_test_set: give at least one unit test name")
    parts = [unit_test_images(n, count, size, channels, seed, reference_side=reference_side) for n in names]
    images = torch.cat(parts).mul(255).round().to(torch.uint8)
    order = list(UNIT_TESTS)
    dataset = TensorImageDataset(images, torch.full((images.shape[0],), UNKNOWN_LABEL, dtype=torch.long))
    dataset.source_classes = torch.tensor(  # type: ignore[attr-defined]
        [order.index(n) for n in names for _ in range(count)], dtype=torch.long)
    return dataset


def unit_test_grid(path: str | Path, size: int | Sequence[int] = 64, channels: int = 3, seed: int = 0, *,
                   per_test: int = 4, names: Sequence[str] | None = None,
                   reference_side: int | None = REFERENCE_SIDE) -> Path:
    """A PNG grid of the unit tests for a report: one row per test (its print name and name on the left),
    ``per_test`` images each; written atomically. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(UNIT_TESTS) if names is None else list(names)
    if not names:
        raise ValueError("unit_test_grid: name at least one unit test")
    if isinstance(per_test, bool) or not isinstance(per_test, int) or per_test < 1:
        raise ValueError(f"unit_test_grid: per_test must be a positive int, got {per_test!r}")
    if channels not in (1, 3):
        raise ValueError(f"unit_test_grid: shows grey (1) or RGB (3) images, got channels={channels!r}")
    figure, axes = plt.subplots(len(names), per_test, figsize=(1.1 * per_test + 1.9, 1.1 * len(names)),
                                squeeze=False)
    for row, name in enumerate(names):
        images = unit_test_images(name, per_test, size, channels, seed, reference_side=reference_side)
        for column in range(per_test):
            axis = axes[row][column]
            image = images[column].permute(1, 2, 0).numpy()
            if channels == 1:
                axis.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            else:
                axis.imshow(image, vmin=0, vmax=1, interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
        axes[row][0].set_ylabel(f"{UNIT_TESTS[name].title}\n({name})", rotation=0, ha="right", va="center",
                                fontsize=7)
    height = figure.get_figheight()
    figure.subplots_adjust(top=1 - 0.45 / height, bottom=0.05 / height, hspace=0.12, wspace=0.08)
    figure.suptitle("NINCO OOD unit tests (Bitterwolf et al., ICML 2023)", fontsize=9, y=1 - 0.12 / height)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


__all__ = ["PHOTO_UNIT_TESTS", "REFERENCE_SIDE", "UNIT_TESTS", "UnitTest", "colour_range", "photo_unit_test_images",
           "unit_test_grid", "unit_test_images", "unit_test_seed", "unit_test_set"]
