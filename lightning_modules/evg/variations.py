"""Variation models of the adversarial evaluation (EvG; Yoon et al., DESIGN.md §5.4).

A variation model maps a batch of points ``z`` of its domain (one per chain) -- and, for the
instance-conditional ones, one seed OOD image per chain -- to images in ``[0, 1]``. Everything is batched with
per-sample parameters (no Python loop over samples), so one call moves every chain one step.

- :class:`AffineVariation`, D = 5, ``[0, 1]^5`` mapped linearly to rotation ±45°, translation ±5 px at 32 px
  in x and y (the authors' V1; scaled with the image size: ±5·W/32 and ±5·H/32), scale 0.9–1.5 and shear
  ±30° along x. The transform is torchvision's ``functional.affine`` (bilinear, zero fill, centre of the
  image), the per-image function the authors' ``apply_affine_batch`` loops over, written here for a batch
  of per-sample matrices. A shear of 30° is the shear factor tan 30° = 1/√3 of the authors' kornia bound.
- :class:`ColourVariation`, D = 4, brightness 0.5–1.5, contrast 0.5–1.5, saturation 0–2, hue ±0.5 of the
  hue circle (±π), applied in that order, each exactly torchvision's ``adjust_*`` (the authors'
  ``apply_colortransform_batch``). On grayscale images saturation and hue do nothing (torchvision's rule,
  as PIL's), so only brightness and contrast act: :attr:`active_parameters` says so and the report shows it.
- :class:`LatentVariation`, D = 64 by default, ``z`` on the unit sphere, image ``G(r·z)`` for any generator
  module (by default a plain GAN of this project, :class:`NearOODGenerator` with ``λ = 0``). The generator
  was trained on ``N(0, I)`` latents, which concentrate on the sphere of radius ``√D``, so ``r = √D``.
- :class:`PixelPerturbation`, the black-box l∞ baseline of the paper: ``z`` is the perturbation itself,
  ``[-ε, ε]^(C·H·W)`` with ε = 0.01, image ``clamp(x + z, 0, 1)``.

Every model has :meth:`identity_point` where it exists (affine: scale 1 lies at ``1/6`` of its range, not at
the centre), used by the tests: the image comes back unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


@dataclass(frozen=True)
class Domain:
    """Where a variation model's points live: the box ``[low, high]^D`` or the unit sphere in ``R^D``."""

    kind: Literal["box", "sphere"]
    dim: int
    low: float = 0.0
    high: float = 1.0

    def from_uniform(self, uniform: Tensor, normal: Tensor) -> Tensor:
        """A uniformly distributed point from uniforms in ``[0, 1)^D`` (box) or normals (sphere)."""
        if self.kind == "box":
            return self.low + uniform * (self.high - self.low)
        return normal / normal.norm(dim=-1, keepdim=True)

    def project(self, points: Tensor) -> Tensor:
        """Clamp to the box, or renormalise onto the sphere (the authors' ``bound`` handling)."""
        if self.kind == "box":
            return points.clamp(self.low, self.high)
        return points / points.norm(dim=-1, keepdim=True)


def _linear(unit: Tensor, bounds: tuple[float, float]) -> Tensor:
    return bounds[0] + unit * (bounds[1] - bounds[0])


def _check_bounds(name: str, bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = (float(b) for b in bounds)
    if not low <= high:
        raise ValueError(f"{name} bounds must be (low, high) with low <= high, got {bounds}")
    return low, high


def _unit_point(parameters: tuple[tuple[str, tuple[float, float], float], ...]) -> Tensor:
    """The point of ``[0, 1]^D`` whose linear map gives each ``(name, bounds, value)``'s value."""
    values = []
    for name, bounds, value in parameters:
        if not bounds[0] <= value <= bounds[1]:
            raise ValueError(f"{name} bounds {bounds} exclude the identity {value}")
        values.append(0.5 if bounds[0] == bounds[1] else (value - bounds[0]) / (bounds[1] - bounds[0]))
    return torch.tensor(values)


def _check_points(points: Tensor, images: Tensor | None, dim: int, name: str) -> None:
    if points.ndim != 2 or points.shape[1] != dim:
        raise ValueError(f"{name} takes points of shape (chains, {dim}), got {tuple(points.shape)}")
    if images is not None and (images.ndim != 4 or images.shape[0] != points.shape[0]):
        raise ValueError(f"{name} takes one seed image (C, H, W) per chain: {points.shape[0]} points, images of "
                         f"shape {tuple(images.shape)}")


class AffineVariation(nn.Module):
    """Per-chain affine transforms of the seed images (see the module docstring).

    Args:
        angle: rotation bounds in degrees (torchvision's sign: positive is clockwise on screen).
        translation: bounds in pixels at 32 px, scaled by ``W/32`` (x) and ``H/32`` (y).
        scale: scale bounds.
        shear: shear bounds in degrees along x (±30° = shear factor ±1/√3).
    """

    conditional = True
    parameter_names = ("angle", "translate_x", "translate_y", "scale", "shear")

    def __init__(
        self,
        angle: tuple[float, float] = (-45.0, 45.0),
        translation: tuple[float, float] = (-5.0, 5.0),
        scale: tuple[float, float] = (0.9, 1.5),
        shear: tuple[float, float] = (-30.0, 30.0),
    ) -> None:
        super().__init__()
        self.angle, self.translation = _check_bounds("angle", angle), _check_bounds("translation", translation)
        self.scale, self.shear = _check_bounds("scale", scale), _check_bounds("shear", shear)
        if self.scale[0] <= 0:
            raise ValueError(f"scale bounds must be positive, got {scale}")
        if max(abs(s) for s in self.shear) >= 90:
            raise ValueError(f"shear bounds must lie strictly within ±90°, got {shear}")
        self.domain = Domain("box", 5)
        self.active_parameters = self.parameter_names

    @property
    def dim(self) -> int:
        return 5

    def identity_point(self) -> Tensor:
        """Rotation 0, translation 0, scale 1, shear 0 (each must lie within its bounds)."""
        return _unit_point((("angle", self.angle, 0.0), ("translation", self.translation, 0.0),
                            ("translation", self.translation, 0.0), ("scale", self.scale, 1.0),
                            ("shear", self.shear, 0.0)))

    def parameters_of(self, points: Tensor, height: int, width: int) -> dict[str, Tensor]:
        """Transform parameters ``(chains,)`` each: degrees, pixels, factor, degrees."""
        return {
            "angle": _linear(points[:, 0], self.angle),
            "translate_x": _linear(points[:, 1], self.translation) * width / 32.0,
            "translate_y": _linear(points[:, 2], self.translation) * height / 32.0,
            "scale": _linear(points[:, 3], self.scale),
            "shear": _linear(points[:, 4], self.shear),
        }

    def forward(self, points: Tensor, images: Tensor) -> Tensor:
        _check_points(points, images, 5, "AffineVariation")
        height, width = images.shape[-2:]
        p = self.parameters_of(points.to(images.dtype), height, width)
        return affine_batch(images, p["angle"], p["translate_x"], p["translate_y"], p["scale"], p["shear"])


def affine_batch(images: Tensor, angle: Tensor, translate_x: Tensor, translate_y: Tensor, scale: Tensor,
                 shear: Tensor) -> Tensor:
    """torchvision's ``functional.affine(img, angle, [tx, ty], scale, [shear, 0], BILINEAR)`` with one set of
    parameters per image: its inverse matrix (``_get_inverse_affine_matrix``, centre of the image) and its
    sampling grid, built for the whole batch at once."""
    batch, _, height, width = images.shape
    rot, sx = torch.deg2rad(angle), torch.deg2rad(shear)
    # forward rotation-scale-shear with sy = 0, then inverted, as torchvision
    a, c = torch.cos(rot), torch.sin(rot)
    b = -torch.cos(rot) * torch.tan(sx) - torch.sin(rot)
    d = -torch.sin(rot) * torch.tan(sx) + torch.cos(rot)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    m2 = m0 * (-translate_x) + m1 * (-translate_y)
    m5 = m3 * (-translate_x) + m4 * (-translate_y)
    theta = torch.stack([torch.stack([m0, m1, m2], dim=1), torch.stack([m3, m4, m5], dim=1)], dim=1)  # (B, 2, 3)
    xs = torch.linspace(-width * 0.5 + 0.5, width * 0.5 - 0.5, steps=width, device=images.device, dtype=theta.dtype)
    ys = torch.linspace(-height * 0.5 + 0.5, height * 0.5 - 0.5, steps=height, device=images.device,
                        dtype=theta.dtype)
    base = torch.stack([xs.expand(height, width), ys.unsqueeze(1).expand(height, width),
                        torch.ones(height, width, device=images.device, dtype=theta.dtype)], dim=-1)
    scale_xy = torch.tensor([0.5 * width, 0.5 * height], device=images.device, dtype=theta.dtype)
    grid = base.reshape(1, height * width, 3).expand(batch, -1, -1).bmm(theta.transpose(1, 2) / scale_xy)
    return F.grid_sample(images, grid.reshape(batch, height, width, 2), mode="bilinear", padding_mode="zeros",
                         align_corners=False)


def _grayscale(images: Tensor) -> Tensor:
    r, g, b = images.unbind(dim=-3)
    return (LUMA[0] * r + LUMA[1] * g + LUMA[2] * b).unsqueeze(-3)


def _blend(images: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    ratio = ratio.view(-1, 1, 1, 1)
    return (ratio * images + (1.0 - ratio) * other).clamp(0.0, 1.0)


def rgb_to_hsv(images: Tensor) -> Tensor:
    """torchvision's tensor RGB -> HSV (hue in [0, 1))."""
    r, g, b = images.unbind(dim=-3)
    maxc, minc = images.max(dim=-3).values, images.min(dim=-3).values
    equal = maxc == minc
    chroma = maxc - minc
    ones = torch.ones_like(maxc)
    saturation = chroma / torch.where(equal, ones, maxc)
    divisor = torch.where(equal, ones, chroma)
    rc, gc, bc = (maxc - r) / divisor, (maxc - g) / divisor, (maxc - b) / divisor
    hue = ((maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
           + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc))
    return torch.stack((torch.fmod(hue / 6.0 + 1.0, 1.0), saturation, maxc), dim=-3)


def hsv_to_rgb(images: Tensor) -> Tensor:
    """torchvision's tensor HSV -> RGB."""
    h, s, v = images.unbind(dim=-3)
    sector = torch.floor(h * 6.0)
    f = h * 6.0 - sector
    sector = sector.to(torch.int64) % 6
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    table = torch.stack([torch.stack(row, dim=-3) for row in ((v, q, p, p, t, v), (t, v, v, q, p, p),
                                                               (p, p, t, v, v, q))], dim=-4)  # (B, 3, 6, H, W)
    index = sector.unsqueeze(-3).unsqueeze(-3).expand(-1, 3, 1, -1, -1)
    return table.gather(-3, index).squeeze(-3)


class ColourVariation(nn.Module):
    """Per-chain colour transforms of the seed images (see the module docstring).

    Args:
        brightness, contrast, saturation: factor bounds (1 = unchanged).
        hue: bounds as a fraction of the hue circle (±0.5 = ±π, 0 = unchanged).
    """

    conditional = True
    parameter_names = ("brightness", "contrast", "saturation", "hue")

    def __init__(
        self,
        brightness: tuple[float, float] = (0.5, 1.5),
        contrast: tuple[float, float] = (0.5, 1.5),
        saturation: tuple[float, float] = (0.0, 2.0),
        hue: tuple[float, float] = (-0.5, 0.5),
        channels: int = 3,
    ) -> None:
        super().__init__()
        self.brightness, self.contrast = _check_bounds("brightness", brightness), _check_bounds("contrast", contrast)
        self.saturation, self.hue = _check_bounds("saturation", saturation), _check_bounds("hue", hue)
        for name, bounds in (("brightness", self.brightness), ("contrast", self.contrast),
                             ("saturation", self.saturation)):
            if bounds[0] < 0:
                raise ValueError(f"{name} factors must be non-negative, got bounds {bounds}")
        if not -0.5 <= self.hue[0] <= self.hue[1] <= 0.5:
            raise ValueError(f"hue bounds must lie within [-0.5, 0.5] (a fraction of the hue circle), got {hue}")
        if channels not in (1, 3):
            raise ValueError(f"ColourVariation works on 1- or 3-channel images, got {channels} channels")
        self.channels = channels
        self.domain = Domain("box", 4)
        # torchvision (and PIL) leave grayscale images unchanged by saturation and hue
        self.active_parameters = self.parameter_names if channels == 3 else ("brightness", "contrast")

    @property
    def dim(self) -> int:
        return 4

    def identity_point(self) -> Tensor:
        return _unit_point((("brightness", self.brightness, 1.0), ("contrast", self.contrast, 1.0),
                            ("saturation", self.saturation, 1.0), ("hue", self.hue, 0.0)))

    def parameters_of(self, points: Tensor) -> dict[str, Tensor]:
        return {name: _linear(points[:, i], bounds) for i, (name, bounds) in enumerate(
            zip(self.parameter_names, (self.brightness, self.contrast, self.saturation, self.hue), strict=True))}

    def forward(self, points: Tensor, images: Tensor) -> Tensor:
        _check_points(points, images, 4, "ColourVariation")
        if images.shape[1] != self.channels:
            raise ValueError(f"ColourVariation was built for {self.channels}-channel images, got {images.shape[1]}")
        p = self.parameters_of(points.to(images.dtype))
        out = _blend(images, torch.zeros_like(images), p["brightness"])
        gray = _grayscale(out) if self.channels == 3 else out
        out = _blend(out, gray.mean(dim=(-3, -2, -1), keepdim=True), p["contrast"])
        if self.channels == 1:
            return out
        out = _blend(out, _grayscale(out), p["saturation"])
        hsv = rgb_to_hsv(out)
        hue = torch.remainder(hsv[:, 0] + p["hue"].view(-1, 1, 1), 1.0)
        shifted = hsv_to_rgb(torch.stack((hue, hsv[:, 1], hsv[:, 2]), dim=1))
        # a hue shift of exactly 0 keeps the image (the HSV round trip is not bit-exact)
        return torch.where((p["hue"] == 0).view(-1, 1, 1, 1), out, shifted)


class LatentVariation(nn.Module):
    """``G(√D · z)`` for ``z`` on the unit sphere (see the module docstring).

    Args:
        generator: a module mapping latents ``(N, D)`` to images ``(N, C, H, W)`` in ``[0, 1]`` (e.g. a
            :class:`lightning_modules.generated.generators.NearOODGenerator`); frozen here.
        latent_dim: D; read from ``generator.latent_dim`` when the generator has it.
        image_size: resize the generated images to this size (bilinear, antialiased), e.g. the detector's.
        radius: ``r``; default ``√D``.
    """

    conditional = False

    def __init__(self, generator: nn.Module, latent_dim: int | None = None, image_size: int | None = None,
                 radius: float | None = None) -> None:
        super().__init__()
        if getattr(generator, "num_classes", None):
            raise ValueError("the GAN-latent variation needs an unconditional generator; this one is "
                             f"class-conditional ({generator.num_classes} classes)")
        dim = latent_dim if latent_dim is not None else getattr(generator, "latent_dim", None)
        if dim is None:
            raise ValueError("give latent_dim: the generator has no latent_dim attribute")
        self.generator = generator.eval().requires_grad_(False)
        self.latent_dim, self.image_size = int(dim), image_size
        self.radius = float(radius) if radius is not None else math.sqrt(self.latent_dim)
        self.domain = Domain("sphere", self.latent_dim)
        self.active_parameters = (f"latent ({self.latent_dim} dimensions)",)

    @property
    def dim(self) -> int:
        return self.latent_dim

    def forward(self, points: Tensor, images: Tensor | None = None) -> Tensor:
        _check_points(points, None, self.latent_dim, "LatentVariation")
        out = self.generator(points * self.radius)
        if self.image_size is not None and tuple(out.shape[-2:]) != (self.image_size, self.image_size):
            out = F.interpolate(out, size=(self.image_size, self.image_size), mode="bilinear", antialias=True,
                                align_corners=False).clamp(0.0, 1.0)
        if images is not None and images.shape[1] != out.shape[1]:
            if out.shape[1] == 1:
                out = out.expand(-1, images.shape[1], -1, -1)
            else:
                raise ValueError(f"the generator makes {out.shape[1]}-channel images, the detector takes "
                                 f"{images.shape[1]}")
        return out


class PixelPerturbation(nn.Module):
    """The black-box l∞ baseline: ``clamp(x + z, 0, 1)`` with ``z ∈ [-ε, ε]^(C·H·W)``.

    Args:
        shape: ``(C, H, W)`` of the seed images.
        radius: ε (0.01 in the paper).
    """

    conditional = True

    def __init__(self, shape: tuple[int, int, int], radius: float = 0.01) -> None:
        super().__init__()
        if radius <= 0:
            raise ValueError(f"the l-infinity radius must be positive, got {radius}")
        self.shape, self.radius = tuple(int(s) for s in shape), float(radius)
        self.domain = Domain("box", math.prod(self.shape), -self.radius, self.radius)
        self.active_parameters = (f"pixels (l∞ ≤ {self.radius})",)

    @property
    def dim(self) -> int:
        return self.domain.dim

    def identity_point(self) -> Tensor:
        return torch.zeros(self.dim)

    def forward(self, points: Tensor, images: Tensor) -> Tensor:
        _check_points(points, images, self.dim, "PixelPerturbation")
        return (images + points.view(-1, *self.shape).to(images.dtype)).clamp(0.0, 1.0)


VARIATIONS: dict[str, type[nn.Module]] = {
    "affine": AffineVariation,
    "colour": ColourVariation,
    "gan": LatentVariation,
    "linf": PixelPerturbation,
}


def build_variation(name: str, options: dict | None = None, *, seed_shape: tuple[int, int, int],
                    generator: nn.Module | None = None) -> nn.Module:
    """A variation model of :data:`VARIATIONS` by name, for seed images of ``seed_shape`` ``(C, H, W)``.

    Args:
        options: its keyword arguments (e.g. ``{"scale": [0.9, 1.2]}``); an unknown one is refused by name.
        generator: the GAN-latent variation's generator (``gan`` needs one).
    """
    if name not in VARIATIONS:
        raise ValueError(f"unknown variation model {name!r}; choose from {sorted(VARIATIONS)}")
    options = dict(options or {})
    if name == "colour":
        options.setdefault("channels", seed_shape[0])
    elif name == "gan":
        if generator is None:
            raise ValueError("the gan variation needs a generator (--gan <checkpoint>: a plain GAN of train.py, e.g. "
                             "configs/generators/digits_gan.yaml trained on the OOD set)")
        options.setdefault("image_size", seed_shape[-1])
        return LatentVariation(generator, **options)
    elif name == "linf":
        options.setdefault("shape", tuple(seed_shape))
    try:
        return VARIATIONS[name](**options)
    except TypeError as error:
        raise ValueError(f"variation model {name!r}: {error}") from error
