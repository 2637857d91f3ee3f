"""NINCO's OOD unit tests (``datamodules.unit_tests``; Bitterwolf, Müller, Hein, ICML 2023): the property that
identifies each test, the random ones against an independent numpy/scipy implementation of the authors'
recipe fed the same draws, seeds, sizes and channels, the photo tests, the data set and the grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage as ndimage
import scipy.stats as stats
import torch
from PIL import Image

from datamodules.images import dataset_labels
from datamodules.unit_tests import (
    BLOB_SIGMAS,
    GAUSSIAN_SIGMAS,
    LOW_FREQ_SIGMAS,
    PHOTO_UNIT_TESTS,
    PIXEL_PERM_SIGMAS,
    REFERENCE_SIDE,
    STRIPE_COUNTS,
    UNIT_TESTS,
    photo_unit_test_images,
    unit_test_grid,
    unit_test_images,
    unit_test_seed,
    unit_test_set,
)
from openset_common.labels import UNKNOWN_LABEL

pytestmark = pytest.mark.usefixtures("one_thread")  # tests.conftest: the machine's cores are shared


def test_the_authors_seventeen_tests() -> None:
    # data/NINCO_class_names.csv: the 17 rows of benchmark status "unit test", with print name and abbreviation
    names = set(UNIT_TESTS) | set(PHOTO_UNIT_TESTS)
    assert names == {"uni", "Gaussian", "Rademacher", "pixel_perm", "white", "black", "grey", "monochrome", "tricolour",
                     "tricolour_primary", "horizontal_stripes", "vertical_stripes", "low_freq",
                     "low_freq_channelfullscale", "low_freq_colorrange", "low_freq_pixel_perm", "blobs"}
    assert (UNIT_TESTS["low_freq_colorrange"].title, UNIT_TESTS["low_freq_colorrange"].abbreviation) == \
        ("smooth color", "SmCol")
    assert PHOTO_UNIT_TESTS["pixel_perm"][:2] == ("IN pixel permutations", "PxPerm")


# ---------------------------------------------------------------------------------------------- seeds, sizes


@pytest.mark.parametrize("name", list(UNIT_TESTS))
def test_seeded_prefix_stable_in_range_and_sized(name: str) -> None:
    images = unit_test_images(name, 5, (12, 17), channels=3, seed=1)
    assert images.dtype == torch.float32 and tuple(images.shape) == (5, 3, 12, 17)
    assert float(images.min()) >= 0 and float(images.max()) <= 1
    assert torch.equal(images, unit_test_images(name, 5, (12, 17), channels=3, seed=1))
    assert torch.equal(images[:2], unit_test_images(name, 2, (12, 17), channels=3, seed=1))
    other = unit_test_images(name, 5, (12, 17), channels=3, seed=2)
    assert torch.equal(images, other) == (name in ("white", "black"))  # the constant tests do not draw
    grey = unit_test_images(name, 3, 9, channels=1, seed=1)
    assert tuple(grey.shape) == (3, 1, 9, 9) and float(grey.min()) >= 0 and float(grey.max()) <= 1


def test_tests_never_share_draws() -> None:
    # with one seed, Rademacher is not uniform noise thresholded (each test seeds its own generators)
    uni = unit_test_images("uni", 2, 16, seed=0)
    rademacher = unit_test_images("Rademacher", 2, 16, seed=0)
    assert not torch.equal((uni > 0.5).float(), rademacher)
    assert unit_test_seed("uni", 0, 0) != unit_test_seed("Rademacher", 0, 0) != unit_test_seed("uni", 0, 1)


# ---------------------------------------------------------------------------------------------- properties


def test_uniform_noise_is_uniform() -> None:
    pixels = unit_test_images("uni", 8, 16, seed=3).double().flatten().numpy()
    assert stats.kstest(pixels, "uniform").pvalue > 1e-3
    assert pixels.var() == pytest.approx(1 / 12, rel=0.05)


def test_gaussian_noise_has_the_authors_sigmas_around_one_half() -> None:
    images = unit_test_images("Gaussian", 40, 32, seed=0).double()
    seen = set()
    for image in images:
        pixels = image.flatten()
        median = float(pixels.median())
        sigma = 1.4826 * float((pixels - median).abs().median())  # the MAD is blind to the clipped tails
        nearest = min(GAUSSIAN_SIGMAS, key=lambda s: abs(s - sigma))
        assert sigma == pytest.approx(nearest, rel=0.1)
        assert median == pytest.approx(0.5, abs=0.02)
        seen.add(nearest)
    assert len(seen) >= 5


def test_rademacher_black_white_grey_monochrome() -> None:
    rademacher = unit_test_images("Rademacher", 4, 20, seed=0)
    assert set(rademacher.unique().tolist()) == {0.0, 1.0}
    assert float(rademacher.mean()) == pytest.approx(0.5, abs=0.03)
    assert torch.equal(unit_test_images("white", 2, 5), torch.ones(2, 3, 5, 5))
    assert torch.equal(unit_test_images("black", 2, (5, 4), channels=1), torch.zeros(2, 1, 5, 4))
    grey = unit_test_images("grey", 6, 7)
    assert torch.equal(grey.amax(dim=(1, 2, 3)), grey.amin(dim=(1, 2, 3)))  # one value per image
    assert len(set(grey[:, 0, 0, 0].tolist())) == 6
    mono = unit_test_images("monochrome", 6, 7)
    assert torch.equal(mono.amax(dim=(2, 3)), mono.amin(dim=(2, 3)))  # zero variance per channel
    assert all(len(set(colour.tolist())) == 3 for colour in mono[:, :, 0, 0])  # a colour, not a grey


def stripe_profile(image: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """('rows', (C, H)) when every row is constant, ('columns', (C, W)) when every column is."""
    if torch.equal(image, image[:, :, :1].expand_as(image)):
        return "rows", image[:, :, 0]
    if torch.equal(image, image[:, :1, :].expand_as(image)):
        return "columns", image[:, 0, :]
    return None


def stripe_count(profile: torch.Tensor, counts: tuple[int, ...]) -> int | None:
    """The n of ``counts`` whose layout (floor(side/n) px per stripe, the last one to the edge) the profile
    follows with n distinct colours, or None."""
    side = profile.shape[1]
    for n in counts:
        n_here = min(n, side)
        index = np.minimum(np.arange(side) // (side // n_here), n_here - 1)
        colours = [profile[:, index == k] for k in range(n_here)]
        if all(torch.equal(c, c[:, :1].expand_as(c)) for c in colours) and \
                len({tuple(c[:, 0].tolist()) for c in colours}) == n_here:
            return n_here
    return None


@pytest.mark.parametrize("channels", [1, 3])
def test_stripes_follow_the_authors_layout(channels: int) -> None:
    horizontal = unit_test_images("horizontal_stripes", 12, (41, 23), channels=channels, seed=0)
    counts = set()
    for image in horizontal:
        kind, profile = stripe_profile(image)  # type: ignore[misc]
        assert kind == "rows"
        counts.add(stripe_count(profile, STRIPE_COUNTS))
    assert None not in counts and len(counts) >= 4
    for image in unit_test_images("vertical_stripes", 6, (23, 41), channels=channels, seed=0):
        kind, profile = stripe_profile(image)  # type: ignore[misc]
        assert kind == "columns" and stripe_count(profile, STRIPE_COUNTS) is not None
    kinds = set()
    for primary in (False, True):
        images = unit_test_images("tricolour_primary" if primary else "tricolour", 12, (17, 29), channels=channels)
        for image in images:
            kind, profile = stripe_profile(image)  # type: ignore[misc]
            kinds.add(kind)
            index = np.minimum(np.arange(profile.shape[1]) // (profile.shape[1] // 3), 2)
            assert all(torch.equal(profile[:, index == k], profile[:, index == k][:, :1].expand(-1, int((index == k).sum())))
                       for k in range(3))
        if primary:
            assert set(images.unique().tolist()) <= {0.0, 1.0}
    assert kinds == {"rows", "columns"}


def test_stripes_of_a_tiny_image_are_one_pixel_each() -> None:
    # 20 stripes do not fit 3 rows: capped at one stripe per row
    for image in unit_test_images("horizontal_stripes", 10, (3, 4), seed=0):
        kind, profile = stripe_profile(image)  # type: ignore[misc]
        assert kind == "rows" and profile.shape[1] == 3
        assert stripe_count(profile, STRIPE_COUNTS) in (3, *(n for n in STRIPE_COUNTS if n <= 3))


# ------------------------------------------------------------------ the random tests against a numpy reference


def replay(name: str, seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(unit_test_seed(name, seed, index))


def choose(options: tuple[float, ...], generator: torch.Generator) -> float:
    return float(options[int(torch.randint(len(options), (1,), generator=generator))])


def numpy_smooth(noise: np.ndarray, sigma: float) -> np.ndarray:
    """skimage.filters.gaussian(image, sigma, channel_axis, mode="wrap"): scipy's, truncated at 4 sigma."""
    return ndimage.gaussian_filter(noise, sigma=(0, sigma, sigma), mode="wrap", truncate=4.0)


@pytest.mark.parametrize("channels, size", [(3, (20, 26)), (1, (28, 28))])
def test_smooth_noise_is_the_authors_recipe(channels: int, size: tuple[int, int]) -> None:
    scale = min(size) / REFERENCE_SIDE
    images = {name: unit_test_images(name, 4, size, channels, seed=9).double().numpy()
              for name in ("low_freq", "low_freq_channelfullscale", "low_freq_colorrange")}
    for index in range(4):
        for name, axes in (("low_freq", (0, 1, 2)), ("low_freq_channelfullscale", (1, 2))):
            g = replay(name, 9, index)
            sigma = choose(LOW_FREQ_SIGMAS, g) * scale
            smooth = numpy_smooth(torch.rand((channels, *size), generator=g, dtype=torch.float64).numpy(), sigma)
            shifted = smooth - smooth.min(axis=axes, keepdims=True)
            expected = np.clip(shifted / shifted.max(axis=axes, keepdims=True), 0, 1)
            np.testing.assert_allclose(images[name][index], expected, rtol=0, atol=1e-6)
            assert images[name][index].min(axis=axes).max() == 0 and images[name][index].max(axis=axes).min() == 1
        g = replay("low_freq_colorrange", 9, index)
        sigma = choose(LOW_FREQ_SIGMAS, g) * scale
        smooth = numpy_smooth(torch.rand((channels, *size), generator=g, dtype=torch.float64).numpy(), sigma)
        centre = torch.rand(channels, generator=g, dtype=torch.float64).numpy()
        deviation = 0.1 + 0.2 * float(torch.rand(1, generator=g, dtype=torch.float64))
        based = smooth - np.quantile(smooth, 0.025, axis=(1, 2), keepdims=True)
        normalised = based / np.quantile(based, 0.975, axis=(1, 2), keepdims=True)
        expected = np.clip(2 * normalised * deviation + centre[:, None, None], 0, 1)
        np.testing.assert_allclose(images["low_freq_colorrange"][index], expected, rtol=0, atol=1e-6)


def test_smooth_noise_is_smooth() -> None:
    # neighbouring pixels of uniform noise differ by 1/3 on average; the smoothed ones far less
    for name in ("low_freq", "low_freq_channelfullscale", "low_freq_colorrange"):
        images = unit_test_images(name, 6, 64, seed=0)
        assert float((images[..., 1:] - images[..., :-1]).abs().mean()) < 0.08, name


def test_blobs_are_the_authors_recipe() -> None:
    size, scale = (30, 30), 30 / REFERENCE_SIDE
    images = unit_test_images("blobs", 5, size, 3, seed=2).double().numpy()
    for index in range(5):
        g = replay("blobs", 2, index)
        sigma = choose(BLOB_SIGMAS, g) * scale
        spots = (torch.rand((3, *size), generator=g, dtype=torch.float64) < 0.7).double().numpy()
        blurred = numpy_smooth(spots, sigma)
        expected = np.clip(np.where(blurred < 0.75, 0.0, np.where(blurred > 1, 1.0, blurred)), 0, 1)
        np.testing.assert_allclose(images[index], expected, rtol=0, atol=1e-6)
    assert not ((images > 0) & (images < 0.75 - 1e-6)).any()  # pushed out: 0 or at least 0.75
    # at the authors' pixel scale (reference_side=None) blobs are wide: smoother than at the scaled sigma
    wide = unit_test_images("blobs", 4, 64, seed=0, reference_side=None).numpy()
    assert 0.5 < (wide == 0).mean() < 0.97  # the blurred 0.7 lies mostly below the 0.75 cut
    assert np.abs(np.diff(wide, axis=-1)).mean() < np.abs(np.diff(images, axis=-1)).mean()


def test_gaussian_noise_is_the_authors_recipe() -> None:
    images = unit_test_images("Gaussian", 4, 11, 3, seed=5).double().numpy()
    for index in range(4):
        g = replay("Gaussian", 5, index)
        sigma = choose(GAUSSIAN_SIGMAS, g)
        z = torch.randn((3, 11, 11), generator=g, dtype=torch.float64).numpy()
        np.testing.assert_allclose(images[index], np.clip(0.5 + sigma * z, 0, 1), rtol=0, atol=1e-7)


# ---------------------------------------------------------------------------------------------- photo tests


def test_pixel_permutation_keeps_each_pixel_whole() -> None:
    rng = np.random.default_rng(0)
    photos = torch.from_numpy(rng.integers(0, 4, size=(3, 3, 10, 12)) / 3)  # few values: ties
    shuffled = photo_unit_test_images("pixel_perm", photos, seed=1)
    for photo, image in zip(photos, shuffled, strict=True):
        assert sorted(map(tuple, photo.reshape(3, -1).T.tolist())) == sorted(map(tuple, image.reshape(3, -1).T.tolist()))
        assert not torch.equal(photo, image)
    for index in range(3):
        g = replay("pixel_perm", 1, index)
        choose(PIXEL_PERM_SIGMAS, g)
        order = torch.randperm(120, generator=g)
        assert torch.equal(shuffled[index], photos[index].reshape(3, -1)[:, order].reshape(3, 10, 12))


def test_smooth_pixel_permutation_blurs_the_shuffled_photo() -> None:
    rng = np.random.default_rng(1)
    photos = torch.from_numpy(rng.random((2, 3, 40, 40)))
    smooth = photo_unit_test_images("low_freq_pixel_perm", photos, seed=0, reference_side=None).numpy()
    for index in range(2):
        g = replay("low_freq_pixel_perm", 0, index)
        sigma = choose(PIXEL_PERM_SIGMAS, g)
        order = torch.randperm(1600, generator=g)
        shuffled = photos[index].reshape(3, -1)[:, order].reshape(3, 40, 40).numpy()
        np.testing.assert_allclose(smooth[index], np.clip(numpy_smooth(shuffled, sigma), 0, 1), rtol=0, atol=1e-12)
        # a wrapping blur keeps each channel's mean
        np.testing.assert_allclose(smooth[index].mean(axis=(1, 2)), photos[index].numpy().mean(axis=(1, 2)), atol=1e-12)


# ---------------------------------------------------------------------------------------------- set, grid, errors


def test_unit_test_set_is_an_unknown_set_of_8_bit_images_with_its_tests_as_source_classes() -> None:
    dataset = unit_test_set(["grey", "blobs"], 3, 8, channels=1, seed=4)
    assert torch.equal(dataset_labels(dataset), torch.full((6,), UNKNOWN_LABEL))
    order = list(UNIT_TESTS)
    assert dataset.source_classes.tolist() == [order.index("grey")] * 3 + [order.index("blobs")] * 3  # type: ignore[attr-defined]
    expected = torch.cat([unit_test_images("grey", 3, 8, 1, 4), unit_test_images("blobs", 3, 8, 1, 4)])
    assert torch.equal(dataset.images, (expected * 255).round().to(torch.uint8))
    sample = dataset[4]
    assert sample.target == UNKNOWN_LABEL and sample.index == 4
    assert torch.allclose(sample.image, expected[4], atol=0.5 / 255 + 1e-7)
    single = unit_test_set("white", 2, 4, 3)
    assert torch.equal(single.images, torch.full((2, 3, 4, 4), 255, dtype=torch.uint8))


def test_grid_has_one_row_per_test(tmp_path: Path) -> None:
    two = unit_test_grid(tmp_path / "two.png", 16, 3, names=["white", "black"], per_test=3)
    four = unit_test_grid(tmp_path / "four.png", 16, 1, names=["white", "black", "grey", "uni"], per_test=3)
    with Image.open(two) as small, Image.open(four) as large:
        assert small.format == "PNG" and large.format == "PNG"
        assert large.height > 1.6 * small.height and abs(large.width - small.width) < 0.2 * small.width
        pixels = np.asarray(small.convert("L"))
    assert (pixels == 0).mean() > 0.05  # the black row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four.png", "two.png"]  # no temporary file left


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="unknown unit test 'fog'"):
        unit_test_images("fog", 1, 8)
    with pytest.raises(ValueError, match="made from photos.*photo_unit_test_images"):
        unit_test_images("pixel_perm", 1, 8)
    with pytest.raises(ValueError, match="count must be a positive int, got 0"):
        unit_test_images("uni", 0, 8)
    with pytest.raises(ValueError, match=r"size must be a positive int or \(height, width\), got \(0, 5\)"):
        unit_test_images("uni", 1, (0, 5))
    with pytest.raises(ValueError, match=r"size must be a positive int or \(height, width\), got 28.0"):
        unit_test_images("uni", 1, 28.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channels must be a positive int, got 0"):
        unit_test_images("uni", 1, 8, channels=0)
    with pytest.raises(ValueError, match="reference_side must be positive"):
        unit_test_images("blobs", 1, 8, reference_side=0)
    with pytest.raises(ValueError, match="unknown photo unit test 'uni'"):
        photo_unit_test_images("uni", torch.rand(1, 3, 4, 4))
    with pytest.raises(ValueError, match=r"photos must lie in \[0, 1\]"):
        photo_unit_test_images("pixel_perm", torch.rand(1, 3, 4, 4) * 2)
    with pytest.raises(ValueError, match="float"):
        photo_unit_test_images("pixel_perm", torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="channels=2"):
        unit_test_grid("unused.png", 8, 2)
