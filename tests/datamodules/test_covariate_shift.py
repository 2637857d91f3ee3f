"""ImageNet-C-style corruptions of in-distribution images (``datamodules.covariate_shift``): each corruption
against an independent numpy/scipy implementation of the authors' formula (Hendrycks & Dietterich, ICLR 2019,
``hendrycks/robustness`` ``make_*_c.py``), on random images with ties; severities monotone; seeds; the
covariate-shifted in-distribution sets keep their labels."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndimage
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

from datamodules.batch import Sample, collate_samples
from datamodules.covariate_shift import (
    CONSTANTS,
    CORRUPTIONS,
    boundary_indices,
    constant_set_for,
    correlate2d,
    corrupt,
    corruption_constant,
    disk_kernel,
    gaussian_filter,
    image_seed,
    shifted_set,
)
from datamodules.evaluation import dataset_fingerprint
from datamodules.images import TensorImageDataset, dataset_labels

pytestmark = pytest.mark.usefixtures("one_thread")  # tests.conftest: the machine's cores are shared


def images_with_ties(n: int = 3, channels: int = 3, height: int = 12, width: int = 10, seed: int = 0) -> torch.Tensor:
    """8-bit images (many equal values: ties) as float in [0, 1], with a black and a white patch."""
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, size=(n, channels, height, width)).astype(np.float64)
    array[:, :, :3, :3] = 0
    array[:, :, -3:, -3:] = 255
    array[:, :, 4, :] = array[:, :, 5, :]  # equal rows
    return torch.from_numpy(array / 255)


# ---------------------------------------------------------------------------------------------- filters


@pytest.mark.parametrize("mode", ["wrap", "nearest", "mirror", "reflect"])
@pytest.mark.parametrize("sigma", [0.4, 1.0, 2.5, 30.0])  # 30: the kernel is longer than the image
def test_gaussian_filter_is_scipys(mode: str, sigma: float) -> None:
    x = images_with_ties(2, 3, 9, 7)
    ours = gaussian_filter(x, sigma, mode=mode).numpy()  # type: ignore[arg-type]
    ref = ndimage.gaussian_filter(x.numpy(), sigma=(0, 0, sigma, sigma), mode=mode, truncate=4.0)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_boundary_indices_by_hand() -> None:
    # a line a b c (0 1 2) extended by 4 on each side
    assert boundary_indices(3, 4, "wrap").tolist() == [2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert boundary_indices(3, 4, "nearest").tolist() == [0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2]
    assert boundary_indices(3, 4, "mirror").tolist() == [0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]
    assert boundary_indices(3, 4, "reflect").tolist() == [2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0]
    with pytest.raises(ValueError, match="'edge'"):
        boundary_indices(3, 1, "edge")  # type: ignore[arg-type]


def numpy_disk(radius: float, alias_blur: float) -> np.ndarray:
    """The authors' disk(): the aliased disk, normalised, then cv2.GaussianBlur (kernel exp(-k²/2σ²) of size 3
    or 5, BORDER_REFLECT_101 = scipy's 'mirror')."""
    half, ksize = (8, 3) if radius <= 8 else (int(radius), 5)
    grid = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(grid, grid)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk /= disk.sum()
    k = np.arange(ksize) - (ksize - 1) / 2
    gauss = np.exp(-(k**2) / (2 * alias_blur**2))
    gauss /= gauss.sum()
    blurred = ndimage.correlate1d(disk, gauss, axis=0, mode="mirror")
    return ndimage.correlate1d(blurred, gauss, axis=1, mode="mirror")


@pytest.mark.parametrize("radius, alias", [(0.3, 0.4), (1.5, 0.1), (3, 0.1), (8, 0.5), (10, 0.5)])
def test_disk_kernel_is_the_authors(radius: float, alias: float) -> None:
    np.testing.assert_allclose(disk_kernel(radius, alias).numpy(), numpy_disk(radius, alias), rtol=0, atol=1e-15)


def test_disk_kernel_by_hand() -> None:
    # radius 0.3 holds the centre only; a 3-tap Gaussian of std 0.4 has weights (e, 1, e) / (1 + 2e),
    # e = exp(-1 / 0.32)
    e = np.exp(-1 / 0.32)
    kernel = disk_kernel(0.3, 0.4)
    assert kernel.shape == (17, 17)
    assert float(kernel[8, 8]) == pytest.approx((1 / (1 + 2 * e)) ** 2, abs=1e-15)
    assert float(kernel[8, 9]) == pytest.approx(e / (1 + 2 * e) ** 2, abs=1e-15)
    assert float(kernel[7, 9]) == pytest.approx((e / (1 + 2 * e)) ** 2, abs=1e-15)
    assert float(kernel.sum()) == pytest.approx(1.0, abs=1e-14)


def test_correlate2d_is_scipys_on_images_smaller_than_the_kernel() -> None:
    x = images_with_ties(2, 1, 6, 11)
    kernel = disk_kernel(1.5, 0.1) + torch.linspace(0, 1e-3, 17 * 17, dtype=torch.float64).reshape(17, 17)  # asymmetric
    ref = ndimage.correlate(x.numpy(), kernel.numpy()[None, None], mode="mirror")
    np.testing.assert_allclose(correlate2d(x, kernel, mode="mirror").numpy(), ref, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------- corruptions


def standard_normal_draws(seed: int, count: int, shape: tuple[int, ...], first: int = 0) -> np.ndarray:
    """The documented draws: image i's generator seeded with image_seed(seed, first + i), float64 randn."""
    return np.stack([torch.randn(shape, generator=torch.Generator().manual_seed(image_seed(seed, first + i)),
                                 dtype=torch.float64).numpy() for i in range(count)])


@pytest.mark.parametrize("constants", ["cifar", "tiny_imagenet", "imagenet"])
@pytest.mark.parametrize("severity", [1, 3, 5])
def test_gaussian_noise_is_x_plus_c_z_clipped(constants: str, severity: int) -> None:
    x = images_with_ties()
    c = CONSTANTS["gaussian_noise"][constants][severity - 1]
    z = standard_normal_draws(7, 3, tuple(x.shape[1:]))
    ours = corrupt(x, "gaussian_noise", severity, 7, constants=constants)
    np.testing.assert_allclose(ours.numpy(), np.clip(x.numpy() + c * z, 0, 1), rtol=0, atol=1e-15)
    # a batch further into the set draws the noise of its own indices
    later = corrupt(x[1:], "gaussian_noise", severity, 7, constants=constants, first_index=1)
    assert torch.equal(later, ours[1:])


def test_shot_noise_is_poisson_over_c_clipped_with_the_right_moments() -> None:
    x = images_with_ties()
    c = CONSTANTS["shot_noise"]["cifar"][4]
    counts = np.stack([torch.poisson(x[i] * c, generator=torch.Generator().manual_seed(image_seed(3, i))).numpy()
                       for i in range(3)])
    ours = corrupt(x, "shot_noise", 5, 3, constants="cifar")
    np.testing.assert_allclose(ours.numpy(), np.clip(counts / c, 0, 1), rtol=0, atol=1e-15)
    # a grey image of 0.4: Poisson(0.4 c) / c has mean 0.4 and variance 0.4 / c (here far from the clip)
    grey = torch.full((4, 3, 32, 32), 0.4, dtype=torch.float64)
    noisy = corrupt(grey, "shot_noise", 5, 0, constants="cifar").numpy()
    assert noisy.mean() == pytest.approx(0.4, abs=0.005)
    assert noisy.var() == pytest.approx(0.4 / c, rel=0.08)


@pytest.mark.parametrize("constants", ["cifar", "imagenet"])
def test_gaussian_blur_is_skimages_gaussian(constants: str) -> None:
    x = images_with_ties(2, 3, 16, 13)
    for severity in (1, 5):
        sigma = CONSTANTS["gaussian_blur"][constants][severity - 1]
        ref = np.clip(ndimage.gaussian_filter(x.numpy(), sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0), 0, 1)
        np.testing.assert_allclose(corrupt(x, "gaussian_blur", severity, constants=constants).numpy(), ref,
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("severity", [1, 4, 5])
def test_defocus_blur_is_filter2d_with_the_disk(severity: int) -> None:
    x = images_with_ties(2, 3, 14, 20)
    radius, alias = CONSTANTS["defocus_blur"]["tiny_imagenet"][severity - 1]
    ref = np.clip(ndimage.correlate(x.numpy(), numpy_disk(radius, alias)[None, None], mode="mirror"), 0, 1)
    ours = corrupt(x, "defocus_blur", severity, constants="tiny_imagenet")
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("constants", ["cifar", "imagenet"])
def test_contrast_is_the_formula_exactly(constants: str) -> None:
    x = images_with_ties()
    for severity in (1, 2, 3, 4, 5):
        c = CONSTANTS["contrast"][constants][severity - 1]
        means = x.numpy().mean(axis=(2, 3), keepdims=True)
        ref = np.clip((x.numpy() - means) * c + means, 0, 1)
        np.testing.assert_allclose(corrupt(x, "contrast", severity, constants=constants).numpy(), ref, rtol=0, atol=1e-15)
    # by hand: a 1x2 grey image (0, 1) has mean 0.5; c = 0.15 maps it to (0.425, 0.575)
    tiny = torch.tensor([[[[0.0, 1.0]]]], dtype=torch.float64)
    assert corrupt(tiny, "contrast", 5, constants="cifar").flatten().tolist() == pytest.approx([0.425, 0.575])


def numpy_rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """The textbook conversion (skimage.color.rgb2hsv), channels last."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    v = rgb.max(-1)
    delta = v - rgb.min(-1)
    s = np.where(v > 0, delta / np.where(v > 0, v, 1), 0)
    safe = np.where(delta > 0, delta, 1)
    h = np.where(r == v, (g - b) / safe, np.where(g == v, 2 + (b - r) / safe, 4 + (r - g) / safe))
    h = np.where(delta > 0, (h / 6) % 1, 0)
    return np.stack([h, s, v], -1)


def numpy_hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """The textbook conversion (skimage.color.hsv2rgb), channels last."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    sector = np.floor(h * 6)
    f = h * 6 - sector
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    sector = sector.astype(int) % 6
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    return np.stack([np.choose(sector, [choice[k] for choice in choices]) for k in range(3)], -1)


@pytest.mark.parametrize("constants", ["cifar", "imagenet"])
def test_brightness_is_the_hsv_value_raised(constants: str) -> None:
    x = images_with_ties()
    for severity in (1, 5):
        c = CONSTANTS["brightness"][constants][severity - 1]
        hsv = numpy_rgb_to_hsv(x.numpy().transpose(0, 2, 3, 1))
        hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
        ref = np.clip(numpy_hsv_to_rgb(hsv), 0, 1).transpose(0, 3, 1, 2)
        np.testing.assert_allclose(corrupt(x, "brightness", severity, constants=constants).numpy(), ref,
                                   rtol=0, atol=1e-12)
    # a grey image: its value plus c, clipped
    grey = images_with_ties(2, 1)
    ours = corrupt(grey, "brightness", 5, constants="cifar").numpy()
    np.testing.assert_allclose(ours, np.clip(grey.numpy() + 0.3, 0, 1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
@pytest.mark.parametrize("constants", ["cifar", "tiny_imagenet", "imagenet"])
def test_distance_to_the_clean_image_grows_with_severity(name: str, constants: str) -> None:
    rng = np.random.default_rng(1)
    # smooth images in [0.1, 0.7] with some texture: room for every corruption to act
    base = ndimage.gaussian_filter(rng.random((4, 3, 24, 24)), sigma=(0, 0, 1, 1), mode="wrap")
    x = torch.from_numpy(0.1 + 0.6 * (base - base.min()) / (base.max() - base.min())).float()
    distances = [float((corrupt(x, name, s, 0, constants=constants) - x).abs().mean()) for s in (1, 2, 3, 4, 5)]
    assert all(a < b for a, b in zip(distances, distances[1:], strict=False)), distances
    assert distances[0] > 0


def test_severity_constants_run_the_way_the_paper_orders_them() -> None:
    for constants in ("cifar", "tiny_imagenet", "imagenet"):
        for name in ("gaussian_noise", "gaussian_blur", "brightness"):
            values = CONSTANTS[name][constants]
            assert all(a < b for a, b in zip(values, values[1:], strict=False)), (name, constants)
        for name in ("shot_noise", "contrast"):  # fewer photons, less contrast
            values = CONSTANTS[name][constants]
            assert all(a > b for a, b in zip(values, values[1:], strict=False)), (name, constants)


@pytest.mark.parametrize("side, expected", [(28, "cifar"), (32, "cifar"), (45, "cifar"), (46, "tiny_imagenet"),
                                            (64, "tiny_imagenet"), (119, "tiny_imagenet"), (120, "imagenet"),
                                            (224, "imagenet"), (500, "imagenet")])
def test_constants_by_size(side: int, expected: str) -> None:
    assert constant_set_for(side, side + 100) == expected
    assert constant_set_for(side + 100, side) == expected
    name = "gaussian_noise"
    assert corruption_constant(name, 2, size=(side, side)) == CONSTANTS[name][expected][1]


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_seeded_in_range_and_same_shape(name: str) -> None:
    x = images_with_ties(3, 1, 28, 28).float()
    first = corrupt(x, name, 3, seed=5)
    assert first.dtype == torch.float32 and first.shape == x.shape
    assert float(first.min()) >= 0 and float(first.max()) <= 1
    assert torch.equal(first, corrupt(x, name, 3, seed=5))
    other = corrupt(x, name, 3, seed=6)
    assert torch.equal(first, other) != CORRUPTIONS[name].random  # noise differs across seeds, filters do not
    assert not torch.equal(first, x)


def test_bad_input_is_named() -> None:
    x = images_with_ties()
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        corrupt(x, "fog", 1)
    for severity in (0, 6, True, 2.0):
        with pytest.raises(ValueError, match="severity must be an integer 1..5"):
            corrupt(x, "contrast", severity)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divide uint8 images by 255"):
        corrupt((x * 255).to(torch.uint8), "contrast", 1)
    with pytest.raises(ValueError, match=r"in \[0, 1\], got values in \[0, 1.5\]"):
        corrupt(x * 1.5, "contrast", 1)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\) tensor, got \(3, 12, 10\)"):
        corrupt(x[0], "contrast", 1)
    with pytest.raises(ValueError, match="constants must be 'auto' or one of"):
        corrupt(x, "contrast", 1, constants="mnist")


# ---------------------------------------------------------------------------------------------- sets


def test_shifted_set_of_tensors_keeps_labels_and_corrupts_each_image_by_its_index() -> None:
    x = images_with_ties(5, 3, 16, 16).float()
    labels = torch.tensor([0, 3, 1, 1, 2])
    shifted = shifted_set(x, labels, name="gaussian_noise", severity=2, seed=4)
    assert torch.equal(dataset_labels(shifted), labels)
    whole = corrupt(x, "gaussian_noise", 2, 4)
    for index in range(5):
        sample = shifted[index]
        assert sample.target == int(labels[index]) and sample.index == index
        assert torch.equal(sample.image, whole[index])
    batch = next(iter(DataLoader(shifted, batch_size=5, collate_fn=collate_samples)))
    assert torch.equal(batch.images, whole) and torch.equal(batch.targets, labels)
    assert shifted.without_transform() is shifted


def test_shifted_set_of_a_data_set_reads_its_raw_images_and_labels() -> None:
    uint8 = (images_with_ties(4, 1, 28, 28) * 255).round().to(torch.uint8)
    labels = torch.tensor([2, 0, 1, 3])
    clean = TensorImageDataset(uint8, labels)
    shifted = shifted_set(Subset(clean, [3, 1]), name="contrast", severity=4)
    assert torch.equal(dataset_labels(shifted), torch.tensor([3, 0]))
    expected = corrupt(uint8[[3, 1]].float() / 255, "contrast", 4)
    assert torch.equal(torch.stack([shifted[0].image, shifted[1].image]), expected)


class PILSet(Dataset):
    """Decoded files as PIL images, the way ImageFileDataset yields them."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, index: int) -> Sample:
        return Sample(Image.fromarray(self.arrays[index]), 1, index)  # type: ignore[arg-type]

    def labels(self) -> torch.Tensor:
        return torch.ones(len(self.arrays), dtype=torch.long)


def test_shifted_set_of_pil_images_and_a_prepare_step() -> None:
    rng = np.random.default_rng(2)
    arrays = [rng.integers(0, 256, size=(20, 30, 3), dtype=np.uint8) for _ in range(2)]
    shifted = shifted_set(PILSet(arrays), name="gaussian_noise", severity=5, seed=1,
                          prepare=lambda image: image.crop((5, 0, 25, 20)))  # a 20x20 centre crop
    for index, array in enumerate(arrays):
        clean = torch.from_numpy(array[:, 5:25].astype(np.float64) / 255).permute(2, 0, 1).float()
        expected = corrupt(clean[None], "gaussian_noise", 5, 1, first_index=index)[0]
        torch.testing.assert_close(shifted[index].image, expected, rtol=0, atol=1e-7)
    assert torch.equal(dataset_labels(shifted), torch.ones(2, dtype=torch.long))


def test_fingerprint_names_corruption_severity_and_seed() -> None:
    x = images_with_ties(2).float()
    labels = torch.tensor([0, 1])
    prints = {dataset_fingerprint(shifted_set(x, labels, name=n, severity=s, seed=seed))
              for n, s, seed in [("contrast", 1, 0), ("contrast", 2, 0), ("contrast", 1, 1), ("brightness", 1, 0)]}
    assert len(prints) == 4
    assert dataset_fingerprint(shifted_set(x, labels, name="contrast", severity=1)) == \
        dataset_fingerprint(shifted_set(x.clone(), labels.clone(), name="contrast", severity=1))


def test_shifted_set_refuses_bad_labels() -> None:
    x = images_with_ties(3).float()
    with pytest.raises(ValueError, match="needs its ID labels"):
        shifted_set(x, name="contrast", severity=1)
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        shifted_set(x, [0, 1], name="contrast", severity=1)
    with pytest.raises(ValueError, match="the labels of a data set are its own"):
        shifted_set(TensorImageDataset(x, torch.zeros(3)), [0, 0, 0], name="contrast", severity=1)
    with pytest.raises(ValueError, match="severity must be an integer"):
        shifted_set(x, [0, 1, 2], name="contrast", severity=9)
