"""Variation models of EvG (DESIGN.md §5.4): identity points, each bound against torchvision's per-image
functional transform, batched equal to per-sample, grayscale behaviour, the GAN latent and the l∞ ball."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

from lightning_modules.evg.variations import (
    AffineVariation,
    ColourVariation,
    Domain,
    LatentVariation,
    PixelPerturbation,
)


def smooth_images(count: int, channels: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Random smooth images in [0, 1] (low-frequency noise upsampled), with saturated pixels too."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(count, channels, size // 4, size // 4, generator=generator)
    images = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    images[:, :, :2, :2] = 1.0
    images[:, :, -2:, -2:] = 0.0
    return images


def torchvision_affine(image: torch.Tensor, p: dict[str, float]) -> torch.Tensor:
    return TF.affine(image, angle=p["angle"], translate=[p["translate_x"], p["translate_y"]], scale=p["scale"],
                     shear=[p["shear"], 0.0], interpolation=InterpolationMode.BILINEAR)


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
    colour = ColourVariation(channels=channels)
    assert colour.identity_point().tolist() == [0.5, 0.5, 0.5, 0.5]  # the centre of the box
    torch.testing.assert_close(colour(colour.identity_point().expand(5, -1), images), images, atol=1e-6, rtol=0)
    pixel = PixelPerturbation(tuple(images.shape[1:]))
    assert torch.equal(pixel(pixel.identity_point().expand(5, -1), images), images)


def test_affine_parameters_at_the_bounds() -> None:
    affine = AffineVariation()
    corners = torch.tensor([[0.0] * 5, [1.0] * 5])
    p = affine.parameters_of(corners, height=32, width=32)
    assert p["angle"].tolist() == [-45.0, 45.0]
    assert p["translate_x"].tolist() == [-5.0, 5.0] and p["translate_y"].tolist() == [-5.0, 5.0]  # V1 at 32 px
    assert p["scale"].tolist() == pytest.approx([0.9, 1.5])
    assert p["shear"].tolist() == [-30.0, 30.0]
    assert math.tan(math.radians(30.0)) == pytest.approx(1 / math.sqrt(3))  # the authors' shear factor bound
    # translation scales with the image size: ±5 px at 32 px is ±14 px at 89.6 px
    wide = affine.parameters_of(corners, height=64, width=224)
    assert wide["translate_x"].tolist() == pytest.approx([-35.0, 35.0])
    assert wide["translate_y"].tolist() == pytest.approx([-10.0, 10.0])


@pytest.mark.parametrize("channels", [1, 3])
def test_affine_matches_torchvision_at_every_bound_and_inside(channels: int) -> None:
    affine = AffineVariation()
    points = torch.tensor([
        [0.0, 0.5, 0.5, 1 / 6, 0.5],  # rotation -45°
        [1.0, 0.5, 0.5, 1 / 6, 0.5],  # rotation +45°
        [0.5, 0.0, 1.0, 1 / 6, 0.5],  # translation (-5, +5)
        [0.5, 1.0, 0.0, 1 / 6, 0.5],  # translation (+5, -5)
        [0.5, 0.5, 0.5, 0.0, 0.5],  # scale 0.9
        [0.5, 0.5, 0.5, 1.0, 0.5],  # scale 1.5
        [0.5, 0.5, 0.5, 1 / 6, 0.0],  # shear -30°
        [0.5, 0.5, 0.5, 1 / 6, 1.0],  # shear +30°
        [0.0] * 5, [1.0] * 5, [0.3, 0.8, 0.1, 0.7, 0.9],
    ])
    images = smooth_images(points.shape[0], channels)
    batched = affine(points, images)
    for i in range(points.shape[0]):
        p = {k: float(v[i]) for k, v in affine.parameters_of(points, 32, 32).items()}
        torch.testing.assert_close(batched[i], torchvision_affine(images[i], p), atol=1e-5, rtol=0)


def test_colour_matches_torchvision_at_every_bound_and_inside() -> None:
    colour = ColourVariation()
    points = torch.tensor([
        [0.0, 0.5, 0.5, 0.5], [1.0, 0.5, 0.5, 0.5],  # brightness 0.5, 1.5
        [0.5, 0.0, 0.5, 0.5], [0.5, 1.0, 0.5, 0.5],  # contrast 0.5, 1.5
        [0.5, 0.5, 0.0, 0.5], [0.5, 0.5, 1.0, 0.5],  # saturation 0, 2
        [0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 1.0],  # hue -0.5, +0.5
        [0.0] * 4, [1.0] * 4, [0.2, 0.9, 0.35, 0.71],
    ])
    images = smooth_images(points.shape[0], 3, seed=1)
    batched = colour(points, images)
    parameters = colour.parameters_of(points)
    assert parameters["hue"][[6, 7]].tolist() == [-0.5, 0.5]
    assert parameters["saturation"][[4, 5]].tolist() == [0.0, 2.0]
    for i in range(points.shape[0]):
        p = {k: float(v[i]) for k, v in parameters.items()}
        torch.testing.assert_close(batched[i], torchvision_colour(images[i], p), atol=2e-6, rtol=0)


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
    expected = torch.nn.functional.interpolate(generator(z * math.sqrt(8.0)), size=(28, 28), mode="bilinear",
                                               antialias=True, align_corners=False)
    torch.testing.assert_close(images, expected.clamp(0, 1))
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
