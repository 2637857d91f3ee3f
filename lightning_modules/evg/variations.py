"""Variation models of the adversarial evaluation (EvG; Yoon et al., DESIGN.md §5.4).

A variation model maps a batch of points ``z`` of its domain (one per chain) -- and, for the
instance-conditional ones, one seed OOD image per chain -- to images in ``[0, 1]``. Everything is batched with
per-sample parameters (no Python loop over samples), so one call moves every chain one step.

- :class:`AffineVariation`, D = 5, ``[0, 1]^5`` mapped linearly to rotation (degrees), translation in x and y
  (pixels), isotropic scale and shear along x, warped exactly as the authors' ``apply_affine_kornia``: kornia's
  ``get_affine_matrix2d`` (rotation and scale about the centre ``((W - 1)/2, (H - 1)/2)``, then the
  translation, composed with kornia's shear about the same centre) and ``warp_affine`` (bilinear, zero fill,
  corner-aligned pixel grid), written here from those formulas for a batch of per-sample matrices. kornia
  takes the shear as an **angle in radians** and applies ``tan``: the authors' bound ±1/√3 is ±0.5774 rad =
  ±33.08°, a shear factor of ±tan(1/√3) = ±0.6514 (not ±30°, whose factor is 1/√3).
- The authors' named presets, in their units (:data:`AFFINE_PRESETS`, :data:`COLOUR_PRESETS`): ``affineV0``
  t ±10 px, ``affineV1`` ±5 px (their CIFAR, 32 px runs), ``affineV2`` ±45 px (their 224 px runs),
  ``affineV3`` ±70 px, each with angle ±45°, scale 0.9–1.5, shear ±1/√3 rad; ``colorV0`` (torchvision's
  per-image functions) brightness 0.5–2, contrast 0–2, saturation 0–2, hue ±0.5; ``colorV1`` (kornia's)
  brightness 0.5–1.5, contrast 0.5–1.5, saturation 0–2, hue ±0.5 of the circle; ``colorV2`` (kornia's)
  brightness 0.5–1.5, contrast 0.5–1.5, saturation 0.5–1.5, hue ±0.2. The variation names ``affine`` and
  ``colour`` mean the size default (:func:`default_affine_preset`: this project's rule, the nearer of the two
  sizes the authors ran, 32 px -> ``affineV1`` and 224 px -> ``affineV2``, by the image's longer side;
  ``colour`` is ``colorV1`` at every size). The preset's name is kept on the model (``preset``), so the
  run's configuration and report show it. The pixel bounds are for those sizes: :func:`build_variation` warns
  (:class:`PresetSizeWarning`, naming preset and size) when a translation reaches half the images' side.
- :class:`ColourVariation`, D = 4, brightness, contrast, saturation, hue (a fraction of the hue circle, ×2π
  rad for kornia), applied in that order as blends with black, the mean gray level and the grayscale image,
  then a hue rotation in HSV: torchvision's ``adjust_*`` (``colorV0``, the authors'
  ``apply_colortransform_batch``) and kornia's ``adjust_brightness_accumulative``,
  ``adjust_contrast_with_mean_subtraction``, ``adjust_saturation_with_gray_subtraction``, ``adjust_hue``
  (``colorV1``/``colorV2``, the authors' ``apply_colortransform_kornia``) are the same formulas but for the
  grayscale weights (torchvision 0.2989, 0.587, 0.114; kornia 0.299, 0.587, 0.114), which the preset sets.
  On grayscale images saturation and hue do nothing (torchvision's rule, as PIL's and kornia's), so only
  brightness and contrast act: :attr:`active_parameters` says so and the report shows it.
- :class:`LatentVariation`, D = 64 by default, ``z`` on the unit sphere, image ``G(r·z)`` for any generator: a
  module, a factory path ``pkg.mod:factory`` returning any module that maps latents ``(N, D)`` to images
  ``(N, C, H, W)`` in ``[0, 1]`` (e.g. a StyleGAN2 the user trained, wrapped to ``clamp((G(z) + 1)/2, 0, 1)``),
  or this project's plain GAN checkpoint (:class:`NearOODGenerator` with ``λ = 0``). Such a generator was
  trained on ``N(0, I)`` latents, which concentrate on the sphere of radius ``√D``, so ``r = √D`` by default.
  The paper's variation is a projected-GAN StyleGAN2 (z on the unit sphere, D 16 or 64, truncation ψ 0.8–0.9).
  Truncation ψ: passed through as ``truncation_psi`` to a generator whose ``forward`` takes that argument
  (StyleGAN2's truncation towards the mean ``w``); otherwise this project's rule scales the latent towards
  the prior's mean 0, ``G(ψ·r·z)``. Images of another size than the seeds' are resized to it as the authors'
  ``AdversarialDistributionStyleGAN2`` resizes: bilinear, ``align_corners=False``, no antialiasing.
- :class:`PixelPerturbation`, the black-box l∞ baseline of the paper: ``z`` is the perturbation itself,
  ``[-ε, ε]^(C·H·W)`` with ε = 0.01, image ``clamp(x + z, 0, 1)``.

Every model has :meth:`identity_point` where it exists (affine: scale 1 lies at ``1/6`` of its range, not at
the centre), used by the tests: the image comes back unchanged.
"""

from __future__ import annotations

import importlib
import inspect
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openset_common.typed import typed_arguments

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
KORNIA_LUMA = (0.299, 0.587, 0.114)  # kornia's rgb_to_grayscale weights

Bounds = tuple[float, float]
SHEAR = (-1 / math.sqrt(3), 1 / math.sqrt(3))  # the authors' kornia shear bound: an angle in radians

AFFINE_PRESETS: dict[str, dict[str, Bounds]] = {
    name: {"angle": (-45.0, 45.0), "translation": (-t, t), "scale": (0.9, 1.5), "shear": SHEAR}
    for name, t in (("affineV0", 10.0), ("affineV1", 5.0), ("affineV2", 45.0), ("affineV3", 70.0))
}
"""The authors' affine presets (``AdversarialDistributionTransform``): angle in degrees, translation in pixels
(x and y), scale factor, shear in radians (kornia's unit)."""

COLOUR_PRESETS: dict[str, dict[str, Any]] = {
    "colorV0": {"brightness": (0.5, 2.0), "contrast": (0.0, 2.0), "saturation": (0.0, 2.0), "hue": (-0.5, 0.5),
                "luma": LUMA},
    "colorV1": {"brightness": (0.5, 1.5), "contrast": (0.5, 1.5), "saturation": (0.0, 2.0), "hue": (-0.5, 0.5),
                "luma": KORNIA_LUMA},
    "colorV2": {"brightness": (0.5, 1.5), "contrast": (0.5, 1.5), "saturation": (0.5, 1.5), "hue": (-0.2, 0.2),
                "luma": KORNIA_LUMA},
}
"""The authors' colour presets: factor bounds, hue as a fraction of the circle, and the grayscale weights of
the library each used (colorV0 torchvision, colorV1/colorV2 kornia)."""

DEFAULT_COLOUR_PRESET = "colorV1"


class PresetSizeWarning(UserWarning):
    """An affine variation whose pixel bounds do not fit the images it varies (see :func:`translation_note`)."""


def translation_note(name: str, model: AffineVariation, side: tuple[int, int]) -> str:
    """What is wrong with an affine variation's translation bounds on images of ``side`` ``(H, W)``, or ``""``.

    The bounds are pixels (the authors' presets are for their sizes: affineV0/affineV1 at 32 px, affineV2/
    affineV3 at 224 px), so a bound of half the shorter side or more can move the image's centre out of the
    frame: the chains then find images that are mostly zero fill, which a detector may trust completely
    (affineV3, ±70 px, on 28 px digits gives blank worst cases and a worst-case AUROC of a blank image).
    """
    height, width = side
    reach = max(abs(t) for t in model.translation)
    if reach < min(height, width) / 2:
        return ""
    return (f"variation {name!r} (preset {model.preset}) translates by up to ±{reach:g} px, at least half of the "
            f"{height}x{width} px images it varies: the image's centre can leave the frame and the worst cases can "
            "be (nearly) blank zero fill; the authors' presets are for their sizes (affineV0/affineV1 at 32 px, "
            "affineV2/affineV3 at 224 px): choose one for this size or give variation_args translation")


def default_affine_preset(side: int) -> str:
    """The affine preset of ``affine`` for images of this side (the longer one): this project's rule, the nearer
    of the two sizes the authors ran (32 px: ``affineV1``, 224 px: ``affineV2``), i.e. ``affineV1`` below 128 px
    and ``affineV2`` from 128 px on.

    Raises:
        ValueError: a side that is not positive.
    """
    if side < 1:
        raise ValueError(f"the image side must be positive, got {side}")
    return "affineV1" if abs(side - 32) < abs(side - 224) else "affineV2"


def _preset_name(presets: dict[str, dict[str, Any]], chosen: str, values: dict[str, Any]) -> str:
    """``chosen`` when ``values`` are exactly its bounds, else ``custom (from <chosen>)``."""
    same = all(tuple(values[k]) == tuple(float(b) for b in v) for k, v in presets[chosen].items())
    return chosen if same else f"custom (from {chosen})"


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


def _preset_bounds(kind: str, presets: dict[str, dict[str, tuple[float, float]]], preset: str,
                   **given: tuple[float, float] | None) -> dict[str, tuple[float, float]]:
    """The bounds of ``preset``, each replaced by the one ``given`` where that is not ``None``, checked."""
    if preset not in presets:
        raise ValueError(f"unknown {kind} preset {preset!r}; choose from {sorted(presets)}")
    return {name: _check_bounds(name, presets[preset][name] if value is None else value)
            for name, value in given.items()}


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
    """Per-chain affine transforms of the seed images, kornia's warp (see the module docstring).

    Args:
        angle: rotation bounds in degrees (kornia's ``get_affine_matrix2d`` sign: positive is clockwise on
            screen, the y axis pointing down).
        translation: bounds in pixels, the same for x and y (not scaled with the image size: the presets are
            the authors' pixel bounds at the sizes they ran).
        scale: isotropic scale bounds.
        shear: shear bounds in **radians** along x, kornia's unit (the factor is ``tan(shear)``: ±1/√3 rad is
            ±33.08°, factor ±0.6514).
        preset: the preset of :data:`AFFINE_PRESETS` that gives the bounds not given.

    Raises:
        ValueError: an unknown preset, bounds with low > high, a scale bound that is not positive or a shear
            bound outside ±π/2.
    """

    conditional = True
    parameter_names = ("angle", "translate_x", "translate_y", "scale", "shear")

    def __init__(
        self,
        angle: tuple[float, float] | None = None,
        translation: tuple[float, float] | None = None,
        scale: tuple[float, float] | None = None,
        shear: tuple[float, float] | None = None,
        *,
        preset: str = "affineV1",
    ) -> None:
        super().__init__()
        chosen = _preset_bounds("affine", AFFINE_PRESETS, preset, angle=angle, translation=translation, scale=scale,
                                shear=shear)
        self.angle, self.translation, self.scale, self.shear = (chosen[k] for k in ("angle", "translation", "scale",
                                                                                  "shear"))
        if self.scale[0] <= 0:
            raise ValueError(f"scale bounds must be positive, got {self.scale}")
        if max(abs(s) for s in self.shear) >= math.pi / 2:
            raise ValueError(f"shear bounds are angles in radians and must lie strictly within ±π/2, got {self.shear}")
        self.preset = _preset_name(AFFINE_PRESETS, preset, {"angle": self.angle, "translation": self.translation,
                                                            "scale": self.scale, "shear": self.shear})
        self.domain = Domain("box", 5)
        self.active_parameters = self.parameter_names
        self.size_note = ""  # set by build_variation when the bounds do not fit the images (translation_note)

    @property
    def dim(self) -> int:
        return 5

    def identity_point(self) -> Tensor:
        """Rotation 0, translation 0, scale 1, shear 0 (each must lie within its bounds)."""
        return _unit_point((("angle", self.angle, 0.0), ("translation", self.translation, 0.0),
                            ("translation", self.translation, 0.0), ("scale", self.scale, 1.0),
                            ("shear", self.shear, 0.0)))

    def parameters_of(self, points: Tensor) -> dict[str, Tensor]:
        """Transform parameters ``(chains,)`` each: degrees, pixels, pixels, factor, radians."""
        return {
            "angle": _linear(points[:, 0], self.angle),
            "translate_x": _linear(points[:, 1], self.translation),
            "translate_y": _linear(points[:, 2], self.translation),
            "scale": _linear(points[:, 3], self.scale),
            "shear": _linear(points[:, 4], self.shear),
        }

    def forward(self, points: Tensor, images: Tensor) -> Tensor:
        _check_points(points, images, 5, "AffineVariation")
        p = self.parameters_of(points.to(images.dtype))
        return affine_batch(images, p["angle"], p["translate_x"], p["translate_y"], p["scale"], p["shear"])


def affine_batch(images: Tensor, angle: Tensor, translate_x: Tensor, translate_y: Tensor, scale: Tensor,
                 shear: Tensor) -> Tensor:
    """kornia's ``warp_affine(images, get_affine_matrix2d(t, c, (s, s), angle, sx=shear, sy=0)[:, :2], (H, W))``
    with one set of parameters per image, from those functions' formulas.

    The forward map of a pixel ``p = (x, y)`` (x the column, y the row) is ``A(Sh(p))`` with the shear
    ``Sh(p) = (x - k·(y - c_y), y)``, ``k = tan(shear)``, and ``A(u) = c + t + s·R(angle)·(u - c)``,
    ``R(a) = [[cos a, -sin a], [sin a, cos a]]``, ``c = ((W - 1)/2, (H - 1)/2)``. Each output pixel samples the
    input at ``Sh⁻¹(A⁻¹(p))``, bilinearly with zero fill on the corner-aligned grid (pixel ``0`` and ``W - 1``
    at ``-1`` and ``+1``).

    Args:
        images: ``(B, C, H, W)``.
        angle: ``(B,)`` degrees; translate_x, translate_y: ``(B,)`` pixels; scale: ``(B,)``; shear: ``(B,)``
            radians.

    Returns:
        ``(B, C, H, W)`` warped images.
    """
    batch, _, height, width = images.shape
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    rot = torch.deg2rad(angle)
    cos, sin, k = torch.cos(rot), torch.sin(rot), torch.tan(shear)
    # source = Sh^-1(c + R^T (p - c - t) / s), written as the rows of a 2x3 matrix acting on (x, y, 1)
    a00, a01 = (cos - k * sin) / scale, (sin + k * cos) / scale
    a10, a11 = -sin / scale, cos / scale
    ox, oy = cx + translate_x, cy + translate_y
    a02 = cx - a00 * ox - a01 * oy
    a12 = cy - a10 * ox - a11 * oy
    # to grid_sample's corner-aligned [-1, 1]: n = 2·x/(W - 1) - 1 (a 1-pixel side maps to 0)
    fx, fy = 2.0 / max(width - 1, 1), 2.0 / max(height - 1, 1)
    ys = torch.arange(height, device=images.device, dtype=images.dtype).view(1, height, 1)
    xs = torch.arange(width, device=images.device, dtype=images.dtype).view(1, 1, width)

    def col(v: Tensor) -> Tensor:
        return v.view(batch, 1, 1)

    gx = (col(a00) * xs + col(a01) * ys + col(a02)) * fx - (1.0 if width > 1 else 0.0)
    gy = (col(a10) * xs + col(a11) * ys + col(a12)) * fy - (1.0 if height > 1 else 0.0)
    grid = torch.stack([gx, gy], dim=-1)  # (B, H, W, 2)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def _grayscale(images: Tensor, luma: tuple[float, float, float] = LUMA) -> Tensor:
    r, g, b = images.unbind(dim=-3)
    return (luma[0] * r + luma[1] * g + luma[2] * b).unsqueeze(-3)


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
        channels: of the seed images (1 or 3).
        preset: the preset of :data:`COLOUR_PRESETS` that gives the bounds not given and the grayscale weights.
        luma: grayscale weights (default: the preset's).

    Raises:
        ValueError: an unknown preset, bounds with low > high, negative factors, hue bounds outside ±0.5 or
            another number of channels.
    """

    conditional = True
    parameter_names = ("brightness", "contrast", "saturation", "hue")

    def __init__(
        self,
        brightness: tuple[float, float] | None = None,
        contrast: tuple[float, float] | None = None,
        saturation: tuple[float, float] | None = None,
        hue: tuple[float, float] | None = None,
        channels: int = 3,
        *,
        preset: str = DEFAULT_COLOUR_PRESET,
        luma: tuple[float, float, float] | None = None,
    ) -> None:
        super().__init__()
        chosen = _preset_bounds("colour", COLOUR_PRESETS, preset, brightness=brightness, contrast=contrast,
                                saturation=saturation, hue=hue)
        self.brightness, self.contrast, self.saturation, self.hue = (chosen[k] for k in ("brightness", "contrast",
                                                                                       "saturation", "hue"))
        for name, bounds in (("brightness", self.brightness), ("contrast", self.contrast),
                             ("saturation", self.saturation)):
            if bounds[0] < 0:
                raise ValueError(f"{name} factors must be non-negative, got bounds {bounds}")
        if not -0.5 <= self.hue[0] <= self.hue[1] <= 0.5:
            raise ValueError(f"hue bounds must lie within [-0.5, 0.5] (a fraction of the hue circle), got {self.hue}")
        if channels not in (1, 3):
            raise ValueError(f"ColourVariation works on 1- or 3-channel images, got {channels} channels")
        weights = tuple(float(w) for w in (COLOUR_PRESETS[preset]["luma"] if luma is None else luma))
        if len(weights) != 3:
            raise ValueError(f"luma takes 3 grayscale weights (r, g, b), got {luma}")
        self.luma: tuple[float, float, float] = weights  # type: ignore[assignment]
        self.channels = channels
        self.preset = _preset_name(COLOUR_PRESETS, preset, {
            "brightness": self.brightness, "contrast": self.contrast, "saturation": self.saturation,
            "hue": self.hue, "luma": self.luma})
        self.domain = Domain("box", 4)
        # torchvision (and PIL, and kornia) leave grayscale images unchanged by saturation and hue
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
        gray = _grayscale(out, self.luma) if self.channels == 3 else out
        out = _blend(out, gray.mean(dim=(-3, -2, -1), keepdim=True), p["contrast"])
        if self.channels == 1:
            return out
        out = _blend(out, _grayscale(out, self.luma), p["saturation"])
        hsv = rgb_to_hsv(out)
        hue = torch.remainder(hsv[:, 0] + p["hue"].view(-1, 1, 1), 1.0)
        shifted = hsv_to_rgb(torch.stack((hue, hsv[:, 1], hsv[:, 2]), dim=1))
        # a hue shift of exactly 0 keeps the image (the HSV round trip is not bit-exact)
        return torch.where((p["hue"] == 0).view(-1, 1, 1, 1), out, shifted)


def _factory_path(spec: str) -> bool:
    """Whether ``spec`` reads as ``pkg.mod:factory`` (and is not a file, e.g. a checkpoint)."""
    module, _, attr = spec.partition(":")
    return (bool(attr) and all(part.isidentifier() for part in module.split("."))
            and all(part.isidentifier() for part in attr.split(".")) and not Path(spec).exists())


def resolve_generator(spec: nn.Module | str, generator_args: dict[str, Any] | None = None) -> tuple[nn.Module, str]:
    """The generator of the GAN-latent variation and a name for the report.

    Args:
        spec: a module; a factory path ``pkg.mod:factory`` (``factory(**generator_args)`` must return an
            ``nn.Module``; a class path works too); or a checkpoint of this project's plain GAN
            (:class:`lightning_modules.generated.NearOODGenerator`).
        generator_args: keyword arguments of the factory.

    Raises:
        ValueError: a factory path whose module or attribute cannot be imported, or arguments for a module
            or a checkpoint.
        TypeError: a factory that is not callable or does not return an ``nn.Module``.
    """
    if isinstance(spec, nn.Module):
        if generator_args:
            raise ValueError("generator_args go with a factory path, not with a generator module")
        return spec, type(spec).__name__
    if not isinstance(spec, str):
        raise TypeError(f"the generator must be an nn.Module, a factory path 'pkg.mod:factory' or a checkpoint, "
                        f"got {type(spec).__name__}")
    if _factory_path(spec):
        module_name, _, attr = spec.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"generator factory {spec!r}: cannot import module {module_name!r} ({error})") from error
        for part in attr.split("."):
            if not hasattr(target, part):
                raise ValueError(f"generator factory {spec!r}: module {module_name!r} has no attribute {attr!r}")
            target = getattr(target, part)
        if not callable(target):
            raise TypeError(f"generator factory {spec!r} is a {type(target).__name__}, not a callable")
        made = target(**dict(generator_args or {}))
        if not isinstance(made, nn.Module):
            raise TypeError(f"generator factory {spec!r} returned a {type(made).__name__}, not an nn.Module "
                            "mapping latents (N, D) to images (N, C, H, W) in [0, 1]")
        return made, spec
    if generator_args:
        raise ValueError(f"generator_args go with a factory path 'pkg.mod:factory', not with the checkpoint {spec!r}")
    # imported here: the checkpoint machinery (and the GAN package) import this module's package
    from lightning_modules.checkpoint import load_module
    from lightning_modules.generated import NearOODGenerator

    return load_module(spec, expected=NearOODGenerator), Path(spec).name


def _takes_truncation(generator: nn.Module) -> bool:
    try:
        return "truncation_psi" in inspect.signature(generator.forward).parameters
    except (TypeError, ValueError):  # a builtin or C-implemented forward has no signature
        return False


class LatentVariation(nn.Module):
    """``G(√D · z)`` for ``z`` on the unit sphere (see the module docstring).

    Args:
        generator: a module mapping latents ``(N, D)`` to images ``(N, C, H, W)`` in ``[0, 1]`` (e.g. a
            :class:`lightning_modules.generated.generators.NearOODGenerator`), a factory path
            ``pkg.mod:factory`` returning one, or a checkpoint of this project's plain GAN; frozen here.
        latent_dim: D; read from ``generator.latent_dim`` when the generator has it.
        image_size: resize the generated images to this side where theirs differs, e.g. the seeds' (the size
            the variations act at): bilinear without antialiasing, as the authors' ``F.interpolate(i, resize,
            mode="bilinear", align_corners=False)`` (``antialias`` changes that).
        radius: ``r``; default ``√D`` (the typical norm of ``N(0, I)`` latents; 1 for the paper's unit sphere).
        truncation: ψ in ``(0, 1]``, or ``None`` for none. Passed as ``truncation_psi`` to a generator whose
            ``forward`` takes it; otherwise this project's rule, the latent scaled towards the prior mean 0:
            ``G(ψ·r·z)``.
        generator_args: keyword arguments of a factory.
        antialias: antialias that resize (this project's option; the authors' is plain bilinear).

    Raises:
        ValueError: a bad factory path, a class-conditional generator, no latent dimension, a ψ outside
            ``(0, 1]``, or a generator whose images for a probe batch of latents have the wrong shape or lie
            outside ``[0, 1]`` (the message names the generator and what was wrong).
        TypeError: a factory that does not return an ``nn.Module``.
    """

    conditional = False
    probe_chains = 4

    def __init__(self, generator: nn.Module | str, latent_dim: int | None = None, image_size: int | None = None,
                 radius: float | None = None, truncation: float | None = None,
                 generator_args: dict[str, Any] | None = None, antialias: bool = False) -> None:
        super().__init__()
        generator, self.source = resolve_generator(generator, generator_args)
        if getattr(generator, "num_classes", None):
            raise ValueError(f"the GAN-latent variation needs an unconditional generator; {self.source} is "
                             f"class-conditional ({generator.num_classes} classes)")
        dim = latent_dim if latent_dim is not None else getattr(generator, "latent_dim", None)
        if dim is None:
            raise ValueError(f"give latent_dim: the generator {self.source} has no latent_dim attribute")
        if truncation is not None and not 0 < truncation <= 1:
            raise ValueError(f"the truncation ψ must lie in (0, 1], got {truncation}")
        self.generator = generator.eval().requires_grad_(False)
        self.latent_dim, self.image_size, self.antialias = int(dim), image_size, bool(antialias)
        self.radius = float(radius) if radius is not None else math.sqrt(self.latent_dim)
        self.truncation = None if truncation is None else float(truncation)
        self.truncation_rule = ("none" if truncation is None else "truncation_psi of the generator"
                                if _takes_truncation(generator) else "latent scaled by ψ towards the prior mean 0")
        self.domain = Domain("sphere", self.latent_dim)
        self.active_parameters = (f"latent ({self.latent_dim} dimensions)",)
        self._probe()

    @property
    def dim(self) -> int:
        return self.latent_dim

    def _generate(self, latents: Tensor) -> Tensor:
        # the samplers' points are float32; a generator converted by the precision (64-true) takes its own type
        weight = next((t for t in (*self.generator.parameters(), *self.generator.buffers()) if t.is_floating_point()),
                      None)
        if weight is not None:
            latents = latents.to(weight.dtype)
        if self.truncation is None:
            return self.generator(latents)
        if self.truncation_rule.startswith("truncation_psi"):
            return self.generator(latents, truncation_psi=self.truncation)
        return self.generator(self.truncation * latents)

    def _check_images(self, out: Any, chains: int) -> None:
        if not isinstance(out, Tensor) or out.ndim != 4 or out.shape[0] != chains or out.shape[1] not in (1, 3):
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"the generator {self.source} must map latents ({chains}, {self.latent_dim}) to images "
                             f"({chains}, 1 or 3, H, W), got {shape}")

    def _probe(self) -> None:
        """One seeded batch of latents through the generator: the images' shape and range."""
        parameter = next(iter(self.generator.parameters()), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        z = torch.randn(self.probe_chains, self.latent_dim, generator=torch.Generator().manual_seed(0))
        z = (z / z.norm(dim=1, keepdim=True)).to(device)
        try:
            with torch.no_grad():
                out = self._generate(z * self.radius)
        except Exception as error:  # any failure of a user's module is reported with its name
            raise ValueError(f"the generator {self.source} failed on latents of shape "
                             f"({self.probe_chains}, {self.latent_dim}): {error}") from error
        self._check_images(out, self.probe_chains)
        low, high = float(out.min()), float(out.max())
        if not (math.isfinite(low) and math.isfinite(high) and low >= 0.0 and high <= 1.0):
            raise ValueError(f"the generator {self.source} must make images in [0, 1], got values in [{low:.4g}, "
                             f"{high:.4g}] (a tanh generator: return clamp((G(z) + 1) / 2, 0, 1))")

    def forward(self, points: Tensor, images: Tensor | None = None) -> Tensor:
        _check_points(points, None, self.latent_dim, "LatentVariation")
        out = self._generate(points * self.radius)
        self._check_images(out, points.shape[0])
        if self.image_size is not None and tuple(out.shape[-2:]) != (self.image_size, self.image_size):
            # bilinear without antialiasing is a convex combination of pixels: the images stay in [0, 1]
            out = F.interpolate(out, size=(self.image_size, self.image_size), mode="bilinear",
                                antialias=self.antialias, align_corners=False).clamp(0.0, 1.0)
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

    def state_bounds(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The pixel range as a perturbation, ``(-x0, 1 - x0)`` flattened to ``(chains, D)`` each: the authors'
        l∞ search keeps its state image in ``[0, 1]`` (:func:`lightning_modules.evg.samplers.zeroth_order_linf`)."""
        flat = images.reshape(images.shape[0], -1)
        if flat.shape[1] != self.dim:
            raise ValueError(f"PixelPerturbation of shape {self.shape} got seed images of shape "
                             f"{tuple(images.shape[1:])}")
        return -flat, 1.0 - flat

    def forward(self, points: Tensor, images: Tensor) -> Tensor:
        _check_points(points, images, self.dim, "PixelPerturbation")
        return (images + points.view(-1, *self.shape).to(images.dtype)).clamp(0.0, 1.0)


VARIATIONS: dict[str, type[nn.Module]] = {
    "affine": AffineVariation,
    "colour": ColourVariation,
    "gan": LatentVariation,
    "linf": PixelPerturbation,
    **dict.fromkeys(AFFINE_PRESETS, AffineVariation),
    **dict.fromkeys(COLOUR_PRESETS, ColourVariation),
}
"""Variation names: the kinds (``affine`` and ``colour`` at the size default preset) and the authors' presets."""


def variation_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The options of variation model ``name`` (``--variation-arg NAME.OPTION=VALUE``), checked by name and type
    against its class's signature, as κ and data arguments are (:func:`openset_common.typed_arguments`): an
    unknown option is refused, naming it and listing the options the model takes. Returns them as parsed
    (lists as the tuples the bounds are). A ``generator`` (the ``gan`` variation's module or path) is passed as
    given.

    Raises:
        ValueError: an unknown variation model, or an option it does not take or of the wrong type.
    """
    if name not in VARIATIONS:
        raise ValueError(f"unknown variation model {name!r}; choose from {sorted(VARIATIONS)}")
    options = dict(options or {})
    kind = VARIATIONS[name]
    # a module or a path, which jsonargparse cannot type: LatentVariation checks it itself
    generator = {"generator": options.pop("generator")} if kind is LatentVariation and "generator" in options else {}
    return {**typed_arguments(kind, options, what=f"variation model {name!r}"), **generator}


def build_variation(name: str, options: dict | None = None, *, seed_shape: tuple[int, int, int],
                    generator: nn.Module | str | None = None) -> nn.Module:
    """A variation model of :data:`VARIATIONS` by name, for seed images of ``seed_shape`` ``(C, H, W)``.

    ``affine`` is the preset :func:`default_affine_preset` of the images' longer side, ``colour`` is
    ``colorV1``; a preset name (``affineV2``, ``colorV0``, ...) is that preset; ``{"preset": ...}`` in the
    options of ``affine`` or ``colour`` chooses another. The preset's name is kept on the model (``preset``).
    An affine model whose translation reaches half the images' shorter side is built with a
    :class:`PresetSizeWarning` naming the preset and the size (:func:`translation_note`, kept as ``size_note``).

    Args:
        options: its keyword arguments (e.g. ``{"scale": [0.9, 1.2]}``); an unknown one is refused by name.
        generator: the GAN-latent variation's generator (``gan`` needs one): a module, a factory path
            ``pkg.mod:factory`` or a checkpoint; ``options["generator"]`` gives it too.

    Raises:
        ValueError: an unknown name or option, a preset of the other kind, or ``gan`` without a generator.
    """
    options = variation_options(name, options)
    kind = VARIATIONS[name]
    if name in AFFINE_PRESETS or name in COLOUR_PRESETS:
        if options.get("preset", name) != name:
            raise ValueError(f"variation {name!r} is a preset; its options cannot choose the preset "
                             f"{options['preset']!r}")
        options["preset"] = name
    elif name == "affine":
        options.setdefault("preset", default_affine_preset(max(seed_shape[-2:])))
    presets = AFFINE_PRESETS if kind is AffineVariation else COLOUR_PRESETS if kind is ColourVariation else None
    if presets is not None and options.get("preset", next(iter(presets))) not in presets:
        raise ValueError(f"variation {name!r}: unknown preset {options['preset']!r}; choose from {sorted(presets)}")
    if kind is ColourVariation:
        options.setdefault("channels", seed_shape[0])
    elif name == "gan":
        given = options.pop("generator", None)
        if generator is not None and given is not None:
            raise ValueError("the gan variation got two generators: one as an argument and one in its options")
        generator = generator if generator is not None else given
        if generator is None:
            raise ValueError("the gan variation needs a generator (--gan <checkpoint>: a plain GAN of train.py, e.g. "
                             "configs/generators/digits_gan.yaml trained on the OOD set; or a factory path "
                             "'pkg.mod:factory' returning a module that maps latents (N, D) to [0, 1] images)")
        options.setdefault("image_size", seed_shape[-1])
        try:
            return LatentVariation(generator, **options)
        except TypeError as error:
            if "unexpected keyword" not in str(error):
                raise
            raise ValueError(f"variation model {name!r}: {error}") from error
    elif name == "linf":
        options.setdefault("shape", tuple(seed_shape))
    try:
        model = kind(**options)
    except TypeError as error:
        raise ValueError(f"variation model {name!r}: {error}") from error
    if isinstance(model, AffineVariation):
        model.size_note = translation_note(name, model, (int(seed_shape[-2]), int(seed_shape[-1])))
        if model.size_note:
            warnings.warn(model.size_note, PresetSizeWarning, stacklevel=2)
    return model
