"""Variation models of EvG (DESIGN.md §5.4): identity points; the affine warp at every bound of every preset
against kornia's ``get_affine_matrix2d`` + ``warp_affine`` formulas written out in NumPy (and hand-computed
cases); the authors' presets and the size default; colour against torchvision (colorV0) and kornia's formulas
(colorV1/V2); grayscale behaviour; the GAN latent with any generator (factory paths, truncation, clear errors);
and the l∞ ball."""

from __future__ import annotations

import colorsys
import math
import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF

from lightning_modules.evg.variations import (
    AFFINE_PRESETS,
    COLOUR_PRESETS,
    VARIATIONS,
    AffineVariation,
    ColourVariation,
    Domain,
    LatentVariation,
    PixelPerturbation,
    PresetSizeWarning,
    affine_batch,
    build_variation,
    default_affine_preset,
    translation_note,
)
from tests.lightning_modules.evg import tiny_generators

FACTORIES = "tests.lightning_modules.evg.tiny_generators"


def smooth_images(count: int, channels: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Random smooth images in [0, 1] (low-frequency noise upsampled), with saturated pixels too."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(count, channels, size // 4, size // 4, generator=generator)
    images = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    images[:, :, :2, :2] = 1.0
    images[:, :, -2:, -2:] = 0.0
    return images


def kornia_affine_reference(image: np.ndarray, angle: float, tx: float, ty: float, scale: float,
                            shear: float) -> np.ndarray:
    """kornia's ``warp_affine(img, get_affine_matrix2d(...)[:, :2], (H, W))`` from its formulas, in NumPy: the
    3x3 matrices composed as kornia composes them, inverted, and bilinear sampling (zero outside) at the
    source pixel of each output pixel on the corner-aligned grid."""
    channels, height, width = image.shape
    cx, cy = (width - 1) / 2, (height - 1) / 2

    def shift(x: float, y: float) -> np.ndarray:
        return np.array([[1.0, 0.0, x], [0.0, 1.0, y], [0.0, 0.0, 1.0]])

    r = math.radians(-angle)  # get_affine_matrix2d passes -angle to get_rotation_matrix2d
    rotation = np.array([[math.cos(r), math.sin(r), 0.0], [-math.sin(r), math.cos(r), 0.0], [0.0, 0.0, 1.0]])
    matrix = shift(cx, cy) @ rotation @ np.diag([scale, scale, 1.0]) @ shift(-cx, -cy)
    matrix[:2, 2] += [tx, ty]
    k = math.tan(shear)  # kornia's get_shear_matrix2d with sy = 0
    matrix = matrix @ np.array([[1.0, -k, k * cy], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    inverse = np.linalg.inv(matrix)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    src = inverse @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
    sx, sy = src[0], src[1]
    x0, y0 = np.floor(sx), np.floor(sy)
    out = np.zeros((channels, xs.size))
    for dx in (0, 1):
        for dy in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1 - np.abs(sx - xi)) * (1 - np.abs(sy - yi))
            inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
            values = image[:, np.clip(yi, 0, height - 1).astype(int), np.clip(xi, 0, width - 1).astype(int)]
            out += np.where(inside, weight, 0.0) * values
    return out.reshape(channels, height, width)


def kornia_colour_reference(image: np.ndarray, b: float, c: float, s: float, h: float) -> np.ndarray:
    """kornia's adjust_brightness_accumulative, adjust_contrast_with_mean_subtraction,
    adjust_saturation_with_gray_subtraction and adjust_hue(h·2π) from their formulas (gray 0.299, 0.587,
    0.114), the hue rotation through Python's colorsys, pixel by pixel."""
    def gray(x: np.ndarray) -> np.ndarray:
        return 0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2]

    x = np.clip(image * b, 0, 1)
    x = np.clip(x * c + gray(x).mean() * (1 - c), 0, 1)
    x = np.clip((1 - s) * gray(x)[None] + s * x, 0, 1)
    out = np.empty_like(x)
    for i in range(x.shape[1]):
        for j in range(x.shape[2]):
            hue, sat, val = colorsys.rgb_to_hsv(*x[:, i, j])
            out[:, i, j] = colorsys.hsv_to_rgb((hue + h) % 1.0, sat, val)
    return out


def bound_points(dim: int, identity: torch.Tensor) -> torch.Tensor:
    """Each coordinate at 0 and at 1 with the others at the identity, then all 0, all 1 and one inside."""
    rows = []
    for i in range(dim):
        for end in (0.0, 1.0):
            row = identity.clone()
            row[i] = end
            rows.append(row)
    rows += [torch.zeros(dim), torch.ones(dim), torch.linspace(0.15, 0.85, dim)]
    return torch.stack(rows).double()


def torchvision_colour(image: torch.Tensor, p: dict[str, float]) -> torch.Tensor:
    image = TF.adjust_brightness(image, p["brightness"])
    image = TF.adjust_contrast(image, p["contrast"])
    image = TF.adjust_saturation(image, p["saturation"])
    return TF.adjust_hue(image, p["hue"])


@pytest.mark.parametrize("channels", [1, 3])
def test_identity_points_reproduce_the_image(channels: int) -> None:
    images = smooth_images(5, channels)
    affine = AffineVariation()
    point = affine.identity_point()
    assert point.tolist() == pytest.approx([0.5, 0.5, 0.5, (1.0 - 0.9) / 0.6, 0.5])  # scale 1 is at 1/6
    torch.testing.assert_close(affine(point.expand(5, -1), images), images, atol=1e-6, rtol=0)
    for preset in AFFINE_PRESETS:
        model = AffineVariation(preset=preset)
        torch.testing.assert_close(model(model.identity_point().expand(5, -1), images), images, atol=1e-6, rtol=0)
    for preset in COLOUR_PRESETS:
        model = ColourVariation(channels=channels, preset=preset)
        torch.testing.assert_close(model(model.identity_point().expand(5, -1), images), images, atol=1e-6, rtol=0)
    colour = ColourVariation(channels=channels)
    assert colour.identity_point().tolist() == [0.5, 0.5, 0.5, 0.5]  # the centre of the box
    torch.testing.assert_close(colour(colour.identity_point().expand(5, -1), images), images, atol=1e-6, rtol=0)
    pixel = PixelPerturbation(tuple(images.shape[1:]))
    assert torch.equal(pixel(pixel.identity_point().expand(5, -1), images), images)


def test_affine_parameters_at_the_bounds() -> None:
    affine = AffineVariation()  # affineV1
    corners = torch.tensor([[0.0] * 5, [1.0] * 5], dtype=torch.float64)
    p = affine.parameters_of(corners)
    assert p["angle"].tolist() == [-45.0, 45.0]
    assert p["translate_x"].tolist() == [-5.0, 5.0] and p["translate_y"].tolist() == [-5.0, 5.0]
    assert p["scale"].tolist() == pytest.approx([0.9, 1.5])
    assert p["shear"].tolist() == pytest.approx([-1 / math.sqrt(3), 1 / math.sqrt(3)], abs=1e-15)  # radians
    # kornia applies tan to the shear: ±0.5774 rad is ±33.08°, a shear factor of ±0.6514 (not ±30°, 1/√3)
    assert math.degrees(1 / math.sqrt(3)) == pytest.approx(33.0797, abs=1e-4)
    assert torch.tan(p["shear"]).tolist() == pytest.approx([-0.651388, 0.651388], abs=1e-6)
    # translation is the preset's pixels at every image size
    assert AffineVariation(preset="affineV2").parameters_of(corners)["translate_x"].tolist() == [-45.0, 45.0]


def test_affine_presets_are_the_authors_bounds() -> None:
    shear = (-1 / math.sqrt(3), 1 / math.sqrt(3))
    for name, t in (("affineV0", 10.0), ("affineV1", 5.0), ("affineV2", 45.0), ("affineV3", 70.0)):
        assert AFFINE_PRESETS[name] == {"angle": (-45.0, 45.0), "translation": (-t, t), "scale": (0.9, 1.5),
                                        "shear": shear}
        model = AffineVariation(preset=name)
        assert (model.angle, model.translation, model.scale, model.shear, model.preset) == (
            (-45.0, 45.0), (-t, t), (0.9, 1.5), shear, name)
    expected = {
        "colorV0": ((0.5, 2.0), (0.0, 2.0), (0.0, 2.0), (-0.5, 0.5), (0.2989, 0.587, 0.114)),
        "colorV1": ((0.5, 1.5), (0.5, 1.5), (0.0, 2.0), (-0.5, 0.5), (0.299, 0.587, 0.114)),
        "colorV2": ((0.5, 1.5), (0.5, 1.5), (0.5, 1.5), (-0.2, 0.2), (0.299, 0.587, 0.114)),
    }
    assert sorted(COLOUR_PRESETS) == sorted(expected)
    for name, bounds in expected.items():
        model = ColourVariation(preset=name)
        assert (model.brightness, model.contrast, model.saturation, model.hue, model.luma) == bounds
        assert model.preset == name
    assert AffineVariation(translation=(-3.0, 3.0)).preset == "custom (from affineV1)"
    assert ColourVariation(preset="colorV2", hue=(-0.1, 0.1)).preset == "custom (from colorV2)"


@pytest.mark.parametrize(("side", "preset"), [(8, "affineV1"), (28, "affineV1"), (32, "affineV1"), (127, "affineV1"),
                                              (128, "affineV2"), (224, "affineV2"), (512, "affineV2")])
def test_the_size_default_is_the_nearer_of_the_authors_sizes(side: int, preset: str) -> None:
    assert default_affine_preset(side) == preset
    with warnings.catch_warnings():  # 8 px, or 20 px high: the translation reaches half the side (warned, below)
        warnings.simplefilter("ignore", PresetSizeWarning)
        model = build_variation("affine", None, seed_shape=(3, side, side))
        assert build_variation("affine", None, seed_shape=(3, 20, side)).preset == preset  # the longer side
    assert model.preset == preset and model.translation == AFFINE_PRESETS[preset]["translation"]
    assert build_variation("colour", None, seed_shape=(3, side, side)).preset == "colorV1"


@pytest.mark.parametrize(("name", "side", "reach"), [("affineV3", 28, 70), ("affineV2", 32, 45), ("affineV0", 20, 10),
                                                    ("affineV3", 128, 70)])
def test_a_preset_whose_translation_leaves_the_image_is_warned(name: str, side: int, reach: int) -> None:
    """affineV3 (±70 px) on 28 px digits moves every image out of the frame: blank worst cases, whose AUROC is
    a blank image's. Warned, naming preset and size, and kept on the model for the report."""
    with pytest.warns(PresetSizeWarning, match=rf"'{name}' \(preset {name}\) translates by up to ±{reach} px, at "
                                               rf"least half of the {side}x{side} px images"):
        model = build_variation(name, None, seed_shape=(1, side, side))
    assert model.size_note.startswith(f"variation '{name}' (preset {name})")
    # the warning is right: a translation of half the side puts the centre pixel at the border or beyond
    images = torch.ones(1, 1, side, side)
    point = model.identity_point().clone()
    point[1] = point[2] = 1.0  # the largest translation in x and y
    assert float(model(point[None], images).mean()) < 0.3  # most of the frame is zero fill


@pytest.mark.parametrize(("name", "side"), [("affineV1", 28), ("affineV0", 32), ("affineV2", 224), ("affineV3", 224),
                                            ("affine", 11), ("affineV3", 141)])
def test_presets_within_the_image_are_not_warned(name: str, side: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", PresetSizeWarning)
        model = build_variation(name, None, seed_shape=(3, side, side))
    assert model.size_note == ""
    assert translation_note("x", model, (side, 2 * max(model.translation))) != ""  # the shorter side decides


def test_presets_are_chosen_by_name_or_option() -> None:
    assert {"affineV0", "affineV1", "affineV2", "affineV3", "colorV0", "colorV1", "colorV2"} <= set(VARIATIONS)
    v3 = build_variation("affineV3", None, seed_shape=(3, 224, 224))
    assert isinstance(v3, AffineVariation) and v3.preset == "affineV3" and v3.translation == (-70.0, 70.0)
    by_option = build_variation("affine", {"preset": "affineV0"}, seed_shape=(3, 224, 224))
    assert by_option.preset == "affineV0" and by_option.translation == (-10.0, 10.0)
    colour = build_variation("colorV0", None, seed_shape=(1, 28, 28))
    assert isinstance(colour, ColourVariation) and colour.preset == "colorV0" and colour.channels == 1
    assert build_variation("colour", {"preset": "colorV2"}, seed_shape=(3, 8, 8)).hue == (-0.2, 0.2)
    custom = build_variation("affineV2", {"scale": [0.9, 1.2]}, seed_shape=(3, 224, 224))
    assert custom.scale == (0.9, 1.2) and custom.preset == "custom (from affineV2)"
    with pytest.raises(ValueError, match="unknown preset 'affineV9'"):
        build_variation("affine", {"preset": "affineV9"}, seed_shape=(3, 32, 32))
    with pytest.raises(ValueError, match="unknown preset 'affineV1'"):
        build_variation("colour", {"preset": "affineV1"}, seed_shape=(3, 32, 32))
    with pytest.raises(ValueError, match="cannot choose the preset 'affineV1'"):
        build_variation("affineV2", {"preset": "affineV1"}, seed_shape=(3, 32, 32))
    with pytest.raises(ValueError, match="unknown affine preset 'V2'"):
        AffineVariation(preset="V2")
    with pytest.raises(ValueError, match="unknown variation model 'affineV4'"):
        build_variation("affineV4", None, seed_shape=(3, 32, 32))


@pytest.mark.parametrize(("name", "given", "message"), [
    ("affine", {"translate": [-3, 3]}, "variation model 'affine' (AffineVariation) has no arguments ['translate']; "
                                       "it takes ['angle', 'translation', 'scale', 'shear', 'preset']"),
    ("affineV2", {"rotation": [0, 1]}, "variation model 'affineV2' (AffineVariation) has no arguments ['rotation']; "
                                       "it takes ['angle', 'translation', 'scale', 'shear', 'preset']"),
    ("colour", {"hue_shift": 0.1}, "variation model 'colour' (ColourVariation) has no arguments ['hue_shift']; it "
                                   "takes ['brightness', 'contrast', 'saturation', 'hue', 'channels', 'preset', 'luma']"),
    ("linf", {"eps": 0.1, "generator": "x"}, "variation model 'linf' (PixelPerturbation) has no arguments ['eps', "
                                             "'generator']; it takes ['shape', 'radius']"),
])
def test_an_unknown_variation_option_is_refused_listing_the_models_options(name: str, given: dict, message: str) -> None:
    """``--variation-arg affine.translate=...`` (the option is ``translation``): the error names the option and lists
    the model's own, as κ arguments do."""
    with pytest.raises(ValueError) as raised:
        build_variation(name, given, seed_shape=(3, 32, 32))
    assert str(raised.value) == message


def test_variation_options_are_typed_before_the_model_is_built() -> None:
    with pytest.raises(ValueError, match=r"variation model 'affine': Parser key \"scale\".*Given value: big"):
        build_variation("affine", {"scale": "big"}, seed_shape=(3, 32, 32))
    built = build_variation("affine", {"translation": [-3, 3]}, seed_shape=(3, 32, 32))
    assert built.translation == (-3.0, 3.0) and built.preset == "custom (from affineV1)"


@pytest.mark.parametrize(("preset", "size"), [("affineV0", 32), ("affineV1", 32), ("affineV2", 96), ("affineV3", 160)])
@pytest.mark.parametrize("channels", [1, 3])
def test_affine_matches_kornia_formulas_at_every_bound(preset: str, size: int, channels: int) -> None:
    affine = AffineVariation(preset=preset)
    points = bound_points(5, affine.identity_point().double())
    images = smooth_images(points.shape[0], channels, size=size).double()
    batched = affine(points, images)
    parameters = affine.parameters_of(points)
    for i in range(points.shape[0]):
        p = [float(parameters[k][i]) for k in ("angle", "translate_x", "translate_y", "scale", "shear")]
        expected = kornia_affine_reference(images[i].numpy(), *p)
        np.testing.assert_allclose(batched[i].numpy(), expected, atol=1e-5, rtol=0)
    # float32 (the search's dtype) agrees too
    single = affine(points.float(), images.float())
    torch.testing.assert_close(single, batched.float(), atol=1e-4, rtol=0)


def test_affine_hand_computed_cases() -> None:
    """One bright pixel on a 5x5 image, one right of the centre (x=3, y=2)."""
    image = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    image[0, 0, 2, 3] = 1.0

    def warp(angle: float, tx: float, ty: float, scale: float, shear: float) -> torch.Tensor:
        def one(v: float) -> torch.Tensor:
            return torch.tensor([v], dtype=torch.float64)

        return affine_batch(image, one(angle), one(tx), one(ty), one(scale), one(shear))[0, 0]

    def pixel(y: int, x: int) -> torch.Tensor:
        expected = torch.zeros(5, 5, dtype=torch.float64)
        expected[y, x] = 1.0
        return expected

    torch.testing.assert_close(warp(90.0, 0, 0, 1, 0), pixel(3, 2), atol=1e-12, rtol=0)  # clockwise: below centre
    torch.testing.assert_close(warp(0.0, 1, -1, 1, 0), pixel(1, 4), atol=1e-12, rtol=0)  # +x right, -y up
    torch.testing.assert_close(warp(0.0, 0, 0, 2, 0)[2, 4], torch.tensor(1.0, dtype=torch.float64))  # 1 px -> 2 px
    below = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    below[0, 0, 3, 2] = 1.0  # (x=2, y=3), one below the centre: a shear of π/4 rad (factor 1) moves it to x=1
    one = torch.ones(1, dtype=torch.float64)
    sheared = affine_batch(below, 0 * one, 0 * one, 0 * one, one, math.pi / 4 * one)[0, 0]
    torch.testing.assert_close(sheared, pixel(3, 1), atol=1e-12, rtol=0)


def test_colour_v0_matches_torchvision_at_every_bound() -> None:
    colour = ColourVariation(preset="colorV0")
    points = bound_points(4, colour.identity_point())
    images = smooth_images(points.shape[0], 3, seed=1)
    batched = colour(points.float(), images)
    parameters = colour.parameters_of(points)
    assert parameters["brightness"][[0, 1]].tolist() == [0.5, 2.0]
    assert parameters["contrast"][[2, 3]].tolist() == [0.0, 2.0]
    assert parameters["hue"][[6, 7]].tolist() == [-0.5, 0.5]
    for i in range(points.shape[0]):
        p = {k: float(v[i]) for k, v in parameters.items()}
        torch.testing.assert_close(batched[i], torchvision_colour(images[i], p), atol=2e-6, rtol=0)


@pytest.mark.parametrize("preset", ["colorV1", "colorV2"])
def test_colour_v1_v2_match_kornia_formulas_at_every_bound(preset: str) -> None:
    colour = ColourVariation(preset=preset)
    points = bound_points(4, colour.identity_point().double())
    images = smooth_images(points.shape[0], 3, size=12, seed=2).double()
    batched = colour(points, images)
    parameters = colour.parameters_of(points)
    for i in range(points.shape[0]):
        p = [float(parameters[k][i]) for k in ("brightness", "contrast", "saturation", "hue")]
        np.testing.assert_allclose(batched[i].numpy(), kornia_colour_reference(images[i].numpy(), *p), atol=1e-6,
                                   rtol=0)


def test_grayscale_colour_varies_brightness_and_contrast_only() -> None:
    colour = ColourVariation(channels=1)
    assert colour.active_parameters == ("brightness", "contrast")
    images = smooth_images(1, 1).expand(3, -1, -1, -1)  # one image, three settings of saturation and hue
    points = torch.tensor([[0.2, 0.8, 0.0, 0.0], [0.2, 0.8, 1.0, 1.0], [0.2, 0.8, 0.5, 0.5]])
    out = colour(points, images)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])  # saturation and hue do nothing
    p = {k: float(v[0]) for k, v in colour.parameters_of(points).items()}
    torch.testing.assert_close(out[0], torchvision_colour(images[0], p), atol=1e-6, rtol=0)
    assert ColourVariation(channels=3).active_parameters == ("brightness", "contrast", "saturation", "hue")


def test_bad_bounds_and_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="hue bounds"):
        ColourVariation(hue=(-0.6, 0.5))
    with pytest.raises(ValueError, match="scale bounds must be positive"):
        AffineVariation(scale=(0.0, 1.5))
    with pytest.raises(ValueError, match="exclude the identity"):
        AffineVariation(scale=(1.1, 1.5)).identity_point()
    with pytest.raises(ValueError, match=r"points of shape \(chains, 5\)"):
        AffineVariation()(torch.zeros(2, 4), smooth_images(2, 1))
    with pytest.raises(ValueError, match="one seed image"):
        AffineVariation()(torch.zeros(3, 5), smooth_images(2, 1))


class LinearGenerator(torch.nn.Module):
    """A stand-in generator: an image that is a fixed linear function of z (records the norms it got)."""

    latent_dim = 8
    num_classes = 0

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16 * 16, generator=torch.Generator().manual_seed(0)))
        self.norms: list[torch.Tensor] = []

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        self.norms.append(z.norm(dim=1))
        return torch.sigmoid(z @ self.weight).view(-1, 1, 16, 16)


def test_latent_variation_uses_the_sphere_of_radius_sqrt_d() -> None:
    generator = LinearGenerator()
    variation = LatentVariation(generator, image_size=28)
    assert variation.domain == Domain("sphere", 8) and variation.dim == 8 and not variation.conditional
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    z = z / z.norm(dim=1, keepdim=True)
    images = variation(z)
    torch.testing.assert_close(generator.norms[-1], torch.full((4,), math.sqrt(8.0)))
    assert images.shape == (4, 1, 28, 28)
    # the authors' resize (AdversarialDistributionStyleGAN2.generate): bilinear, align_corners=False, no antialias,
    # written out here: output pixel i samples the input at (i + 0.5)·16/28 - 0.5, clamped at the border
    small = generator(z * math.sqrt(8.0)).detach().double().numpy()[:, 0]
    source = np.clip((np.arange(28) + 0.5) * 16 / 28 - 0.5, 0, None)
    low = np.floor(source).astype(int)
    high, weight = np.minimum(low + 1, 15), source - np.floor(source)
    rows = small[:, low] * (1 - weight)[None, :, None] + small[:, high] * weight[None, :, None]
    expected = rows[:, :, low] * (1 - weight)[None, None, :] + rows[:, :, high] * weight[None, None, :]
    np.testing.assert_allclose(images[:, 0].double().numpy(), expected, atol=3e-6, rtol=0)  # float32
    smoothed = LatentVariation(generator, image_size=8, antialias=True)  # this project's option: antialiased
    torch.testing.assert_close(smoothed(z), torch.nn.functional.interpolate(
        generator(z * math.sqrt(8.0)), size=(8, 8), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1))
    same = LatentVariation(generator, image_size=16)  # the generator's own size: not resized
    torch.testing.assert_close(same(z), generator(z * math.sqrt(8.0)))
    assert not any(p.requires_grad for p in variation.parameters())  # frozen
    conditional = LinearGenerator()
    conditional.num_classes = 4
    with pytest.raises(ValueError, match="unconditional"):
        LatentVariation(conditional)


def test_domains_project_and_start_inside() -> None:
    box = Domain("box", 3, -0.01, 0.01)
    torch.testing.assert_close(box.project(torch.tensor([[0.5, -0.5, 0.001]])), torch.tensor([[0.01, -0.01, 0.001]]))
    torch.testing.assert_close(box.from_uniform(torch.tensor([[0.0, 0.5, 1.0]]), torch.zeros(1, 3)),
                               torch.tensor([[-0.01, 0.0, 0.01]]))
    sphere = Domain("sphere", 3)
    torch.testing.assert_close(sphere.project(torch.tensor([[3.0, 0.0, 4.0]])), torch.tensor([[0.6, 0.0, 0.8]]))


def test_pixel_perturbation_stays_in_the_ball_and_the_pixel_range() -> None:
    images = smooth_images(2, 1, size=8)
    pixel = PixelPerturbation((1, 8, 8), radius=0.01)
    assert pixel.domain == Domain("box", 64, -0.01, 0.01)
    points = pixel.domain.project(torch.full((2, 64), 0.5))
    out = pixel(points, images)
    torch.testing.assert_close(out, (images + 0.01).clamp(0, 1))
    assert float((out - images).abs().max()) <= 0.01 + 1e-7


def unit_latents(count: int, dim: int, seed: int = 1) -> torch.Tensor:
    z = torch.randn(count, dim, generator=torch.Generator().manual_seed(seed))
    return z / z.norm(dim=1, keepdim=True)


def test_latent_variation_takes_a_factory_path() -> None:
    variation = build_variation("gan", {"generator": f"{FACTORIES}:make_sigmoid", "generator_args": {"gain": 0.5}},
                                seed_shape=(1, 6, 6))
    assert isinstance(variation, LatentVariation) and variation.source == f"{FACTORIES}:make_sigmoid"
    assert variation.domain == Domain("sphere", 5) and variation.radius == pytest.approx(math.sqrt(5))
    z = unit_latents(3, 5)
    weight = tiny_generators.SigmoidGenerator().weight.detach()  # the factory's seeded weights
    expected = torch.sigmoid(0.5 * (math.sqrt(5) * z) @ weight).view(3, 1, 6, 6)
    torch.testing.assert_close(variation(z), expected)
    # the same through the constructor, with the detector's three channels
    direct = LatentVariation(f"{FACTORIES}:make_sigmoid", generator_args={"gain": 0.5}, radius=1.0)
    torch.testing.assert_close(direct(z, torch.zeros(3, 3, 6, 6)),
                               torch.sigmoid(0.5 * z @ weight).view(3, 1, 6, 6).expand(-1, 3, -1, -1))


def test_a_generator_in_double_precision_takes_the_samplers_float32_points() -> None:
    """``--precision 64-true`` converts the generator; the samplers' points stay float32."""
    variation = LatentVariation(f"{FACTORIES}:make_sigmoid").double()
    z = unit_latents(3, 5)
    weight = tiny_generators.SigmoidGenerator().weight.detach().double()
    out = variation(z)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.sigmoid(math.sqrt(5) * z.double() @ weight).view(3, 1, 6, 6))


def test_truncation_is_passed_through_or_scales_the_latent() -> None:
    z = unit_latents(2, 5)
    weight = tiny_generators.SigmoidGenerator().weight.detach()
    passed = LatentVariation(f"{FACTORIES}:make_truncated", truncation=0.7)
    assert passed.truncation_rule == "truncation_psi of the generator"
    out = passed(z)
    assert passed.generator.psi[-1] == 0.7
    torch.testing.assert_close(out, torch.sigmoid(0.7 * math.sqrt(5) * z @ weight).view(2, 1, 6, 6))
    scaled = LatentVariation(f"{FACTORIES}:make_sigmoid", truncation=0.8, radius=2.0)
    assert scaled.truncation_rule == "latent scaled by ψ towards the prior mean 0"
    torch.testing.assert_close(scaled(z), torch.sigmoid(0.8 * 2.0 * z @ weight).view(2, 1, 6, 6))
    plain = LatentVariation(f"{FACTORIES}:make_truncated")
    assert plain.truncation_rule == "none"
    plain(z)
    assert plain.generator.psi[-1] == 1.0  # not passed: the generator's own default
    with pytest.raises(ValueError, match=r"truncation ψ must lie in \(0, 1\], got 1.5"):
        LatentVariation(f"{FACTORIES}:make_sigmoid", truncation=1.5)


def test_bad_generators_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'no_such_pkg.gen:make'.*cannot import module 'no_such_pkg.gen'"):
        LatentVariation("no_such_pkg.gen:make")
    with pytest.raises(ValueError, match=rf"'{FACTORIES}:missing'.*has no attribute 'missing'"):
        LatentVariation(f"{FACTORIES}:missing")
    with pytest.raises(TypeError, match=rf"'{FACTORIES}:NOT_CALLABLE' is a int, not a callable"):
        LatentVariation(f"{FACTORIES}:NOT_CALLABLE")
    with pytest.raises(TypeError, match=rf"'{FACTORIES}:make_function' returned a function, not an nn.Module"):
        LatentVariation(f"{FACTORIES}:make_function")
    with pytest.raises(ValueError, match=rf"{FACTORIES}:make_tanh must make images in \[0, 1\], got values in \[-"):
        LatentVariation(f"{FACTORIES}:make_tanh")
    with pytest.raises(ValueError, match=rf"{FACTORIES}:make_flat must map latents \(4, 5\) to images .* got \(4, 36\)"):
        LatentVariation(f"{FACTORIES}:make_flat")
    with pytest.raises(ValueError, match="failed on latents of shape \\(4, 7\\)"):
        LatentVariation(f"{FACTORIES}:make_sigmoid", latent_dim=7)
    with pytest.raises(ValueError, match="generator_args go with a factory path"):
        LatentVariation(tiny_generators.SigmoidGenerator(), generator_args={"gain": 2.0})
    with pytest.raises(FileNotFoundError, match="checkpoint no/such/gan.ckpt does not exist"):
        LatentVariation("no/such/gan.ckpt")  # not a factory path: this project's GAN checkpoint
    with pytest.raises(ValueError, match="needs a generator"):
        build_variation("gan", None, seed_shape=(1, 6, 6))
    with pytest.raises(ValueError, match="two generators"):
        build_variation("gan", {"generator": f"{FACTORIES}:make_sigmoid"}, seed_shape=(1, 6, 6),
                        generator=tiny_generators.SigmoidGenerator())
    with pytest.raises(ValueError, match=r"variation model 'gan' \(LatentVariation\) has no arguments \['psi'\]; it "
                       r"takes \['generator', 'latent_dim', 'image_size', 'radius', 'truncation', 'generator_args', "
                       r"'antialias'\]"):
        build_variation("gan", {"psi": 0.5}, seed_shape=(1, 6, 6), generator=tiny_generators.SigmoidGenerator())


def test_pixel_state_bounds_are_the_pixel_range() -> None:
    images = smooth_images(2, 1, size=4)
    low, high = PixelPerturbation((1, 4, 4)).state_bounds(images)
    torch.testing.assert_close(low, -images.reshape(2, 16))
    torch.testing.assert_close(high, 1 - images.reshape(2, 16))
    with pytest.raises(ValueError, match=r"PixelPerturbation of shape \(1, 4, 4\) got seed images of shape \(1, 8, 8\)"):
        PixelPerturbation((1, 4, 4)).state_bounds(smooth_images(2, 1, size=8))
