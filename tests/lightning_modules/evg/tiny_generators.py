"""Tiny generator factories for the tests of the GAN-latent variation (``pkg.mod:factory`` paths)."""

from __future__ import annotations

import torch
from torch import nn


class SigmoidGenerator(nn.Module):
    """``sigmoid(z @ W)`` as a ``(1, 6, 6)`` image: a fixed linear map of the latent, values in (0, 1)."""

    def __init__(self, latent_dim: int = 5, gain: float = 1.0) -> None:
        super().__init__()
        self.latent_dim, self.gain = latent_dim, gain
        weight = torch.randn(latent_dim, 36, generator=torch.Generator().manual_seed(3))
        self.weight = nn.Parameter(weight)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gain * z @ self.weight).view(-1, 1, 6, 6)


class TruncatedGenerator(SigmoidGenerator):
    """A generator whose forward takes ``truncation_psi`` (StyleGAN2's name); it records the value it got."""

    def __init__(self) -> None:
        super().__init__()
        self.psi: list[float] = []

    def forward(self, z: torch.Tensor, truncation_psi: float = 1.0) -> torch.Tensor:
        self.psi.append(truncation_psi)
        return torch.sigmoid(truncation_psi * z @ self.weight).view(-1, 1, 6, 6)


class TanhGenerator(SigmoidGenerator):
    """Images in [-1, 1] (a GAN's raw tanh output): refused."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z @ self.weight).view(-1, 1, 6, 6)


class FlatGenerator(SigmoidGenerator):
    """Flat vectors instead of images: refused."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z @ self.weight)


def make_sigmoid(latent_dim: int = 5, gain: float = 1.0) -> nn.Module:
    return SigmoidGenerator(latent_dim, gain)


def make_truncated() -> nn.Module:
    return TruncatedGenerator()


def make_tanh() -> nn.Module:
    return TanhGenerator()


def make_flat() -> nn.Module:
    return FlatGenerator()


def make_function() -> object:
    """Not a module: refused."""
    return lambda z: z


NOT_CALLABLE = 3
