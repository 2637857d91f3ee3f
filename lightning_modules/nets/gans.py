"""Generator and discriminator networks for Mukhoti et al.'s generated benchmarks (DESIGN.md §5.3).

Plain ``nn.Module``s; the GAN LightningModules take them as arguments.

    :class:`UNetGenerator`, :class:`PatchGANDiscriminator`: Pix2Pix (Isola et al., CVPR 2017), the shift
        generator ``x -> G(x)``, 32 to 256 px.
    :class:`DCGANGenerator`, :class:`DCGANDiscriminator`: DCGAN (Radford et al., ICLR 2016), 32 and 64 px.
    :class:`ResNetGenerator`, :class:`ResNetDiscriminator`: SNGAN residual networks (Miyato et al., ICLR
        2018), 64 and 128 px.
    :func:`build_gan`: a (generator, discriminator) pair by kind and size.

Conventions shared by every network here:

- Images are in ``[0, 1]`` at every interface. Networks that read images map them to ``[-1, 1]``
  internally (``2x - 1``, the range the reference implementations train on); generators end with
  ``(tanh(a) + 1) / 2`` (the reference tanh output mapped to ``[0, 1]``; equal to ``sigmoid(2a)``).
- Image sizes are square; an ``image_size`` outside a network's supported set is a ``ValueError``
  naming it (callers resize, e.g. 28 px Fashion-MNIST to 32 px).
- Noise generators have ``latent_dim``, ``image_size``, ``out_channels`` and ``sample_latent(n)``.
- Discriminators return logits (no sigmoid): ``(N,)`` for image-level ones, ``(N, 1, h, w)`` for PatchGAN.
- Class conditioning (``num_classes > 0``): the generator takes ``labels`` ``(N,)``; the discriminator
  adds the projection term ``<embed(y), phi(x)>`` of Miyato & Koyama (ICLR 2018).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm as _spectral_norm

PIX2PIX_SIZES = (32, 64, 128, 256)
DCGAN_SIZES = (32, 64)
RESNET_SIZES = (64, 128)


def _square_size(image_size: int | tuple[int, int], supported: tuple[int, ...], network: str) -> int:
    """Validate ``image_size`` (an int or a square ``(H, W)``) against the sizes a network supports."""
    if isinstance(image_size, (tuple, list)):
        if len(image_size) != 2 or image_size[0] != image_size[1]:
            raise ValueError(f"{network} needs square images, got image_size={tuple(image_size)}")
        image_size = image_size[0]
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size not in supported:
        raise ValueError(f"{network} supports image_size in {list(supported)}, got {image_size!r}")
    return image_size


def _check_channels(channels: int, name: str) -> None:
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise ValueError(f"{name} must be a positive int, got {channels!r}")


def _check_images(images: Tensor, channels: int, size: int, network: str, name: str = "images") -> None:
    if images.dim() != 4 or tuple(images.shape[1:]) != (channels, size, size):
        raise ValueError(
            f"{network} expects {name} of shape (N, {channels}, {size}, {size}), got {tuple(images.shape)}"
        )


def _to_signed(images: Tensor) -> Tensor:
    """``[0, 1] -> [-1, 1]``."""
    return images * 2 - 1


def _to_unit(preactivation: Tensor) -> Tensor:
    """The reference generators' ``tanh`` output mapped to ``[0, 1]``."""
    return (torch.tanh(preactivation) + 1) / 2


def dcgan_weights_init(module: nn.Module) -> None:
    """DCGAN initialisation (Radford et al. 2016, §4): weights ``N(0, 0.02)``, BatchNorm gain ``N(1, 0.02)``.

    Biases are zeroed. Use with ``network.apply(dcgan_weights_init)``; spectrally normalised layers get the
    initialisation on their unnormalised weight.
    """
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        weight = (
            module.parametrizations.weight.original
            if parametrize.is_parametrized(module, "weight")
            else module.weight
        )
        nn.init.normal_(weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d) and module.affine:
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def _maybe_sn(module: nn.Module, enabled: bool) -> nn.Module:
    return _spectral_norm(module) if enabled else module


def _check_labels(labels: Tensor | None, num_classes: int, batch: int, network: str) -> None:
    if num_classes == 0:
        if labels is not None:
            raise ValueError(f"{network} was built with num_classes=0 and takes no labels")
        return
    if labels is None:
        raise ValueError(f"{network} is class-conditional (num_classes={num_classes}) and needs labels")
    if labels.shape != (batch,):
        raise ValueError(f"{network} expects labels of shape ({batch},), got {tuple(labels.shape)}")
    if labels.numel() == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(f"{network} labels must lie in [0, {num_classes}), got values in [{low}, {high}]")


class NoiseGenerator(nn.Module):
    """Shared interface of the noise-to-image generators."""

    latent_dim: int
    image_size: int
    out_channels: int
    num_classes: int

    def sample_latent(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``(n, latent_dim)`` standard normal latents on the network's device."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        device = next(self.parameters()).device
        if generator is not None and generator.device != device:
            return torch.randn(n, self.latent_dim, generator=generator, device=generator.device).to(device)
        return torch.randn(n, self.latent_dim, generator=generator, device=device)

    def _check_latent(self, z: Tensor, labels: Tensor | None) -> None:
        if z.dim() != 2 or z.shape[1] != self.latent_dim:
            raise ValueError(
                f"{type(self).__name__} expects z of shape (N, {self.latent_dim}), got {tuple(z.shape)}"
            )
        _check_labels(labels, self.num_classes, z.shape[0], type(self).__name__)


# --------------------------------------------------------------------------------------------- Pix2Pix


class UNetGenerator(nn.Module):
    """Pix2Pix's U-Net generator (Isola et al. 2017, §3.2.1 and appendix 6.1.1).

    ``L = log2(image_size)`` encoder levels of 4x4 stride-2 convolutions halve the image down to 1x1
    (``C64-C128-C256-C512-C512-...``, widths ``min(base_width * 2**i, max_width)``); the decoder mirrors them
    with 4x4 stride-2 transposed convolutions and concatenates each encoder level's output (skip
    connections). As in the reference implementation (pytorch-CycleGAN-and-pix2pix's
    ``UnetSkipConnectionBlock``):
    encoder blocks are ``LeakyReLU(0.2) -> conv -> BatchNorm`` with no activation before the first conv and no
    BatchNorm after the first and the innermost (1x1, where BatchNorm of a single image fails); decoder
    blocks are ``ReLU -> transposed conv -> BatchNorm``, with dropout in the first
    ``min(3, L - 1)`` decoder blocks (the Pix2Pix paper's ``CD512-CD512-CD512``; Pix2Pix's only noise source);
    the last decoder block maps to ``out_channels`` and the output nonlinearity.

    Levels per size: 32 px -> 5, 64 -> 6, 128 -> 7, 256 -> 8.

    Args:
        in_channels: channels of the input image (1 or 3).
        out_channels: channels of the output image.
        image_size: side of the square images, a power of two in 32..256.
        base_width: width of the first encoder level (64 in Pix2Pix).
        max_width: the width cap (512 in Pix2Pix).
        dropout: dropout probability in the first decoder blocks (0.5 in Pix2Pix; 0 disables).

    Shapes:
        ``forward(x)``: ``(N, in_channels, S, S)`` in ``[0, 1]`` -> ``(N, out_channels, S, S)`` in ``[0, 1]``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        image_size: int,
        base_width: int = 64,
        max_width: int = 512,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        _check_channels(in_channels, "in_channels")
        _check_channels(out_channels, "out_channels")
        _check_channels(base_width, "base_width")
        if max_width < base_width:
            raise ValueError(f"max_width must be >= base_width={base_width}, got {max_width}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.image_size = _square_size(image_size, PIX2PIX_SIZES, "UNetGenerator")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_levels = int(math.log2(self.image_size))
        widths = [min(base_width * 2**i, max_width) for i in range(self.num_levels)]

        self.encoder = nn.ModuleList()
        for level, width in enumerate(widths):
            innermost = level == self.num_levels - 1
            layers: list[nn.Module] = [] if level == 0 else [nn.LeakyReLU(0.2)]
            cin = in_channels if level == 0 else widths[level - 1]
            layers.append(nn.Conv2d(cin, width, 4, stride=2, padding=1, bias=level == 0 or innermost))
            if level > 0 and not innermost:
                layers.append(nn.BatchNorm2d(width))
            self.encoder.append(nn.Sequential(*layers))

        # decoder block j undoes encoder level L-1-j; it reads that level's output (j = 0) or the
        # concatenation of it with the previous decoder output (j > 0)
        self.decoder = nn.ModuleList()
        dropout_blocks = min(3, self.num_levels - 1)
        for j in range(self.num_levels):
            level = self.num_levels - 1 - j
            cin = widths[level] * (1 if j == 0 else 2)
            outermost = level == 0
            cout = out_channels if outermost else widths[level - 1]
            layers = [nn.ReLU(), nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1, bias=outermost)]
            if not outermost:
                layers.append(nn.BatchNorm2d(cout))
                if j < dropout_blocks and dropout > 0:
                    layers.append(nn.Dropout(dropout))
            self.decoder.append(nn.Sequential(*layers))

    def forward(self, x: Tensor) -> Tensor:
        """Translate ``(N, in_channels, S, S)`` images in ``[0, 1]`` to ``(N, out_channels, S, S)``."""
        _check_images(x, self.in_channels, self.image_size, "UNetGenerator")
        skips = []
        h = _to_signed(x)
        for block in self.encoder:
            h = block(h)
            skips.append(h)
        h = self.decoder[0](skips[-1])
        for block, skip in zip(self.decoder[1:], reversed(skips[:-1]), strict=True):
            h = block(torch.cat([skip, h], dim=1))
        return _to_unit(h)


def default_patchgan_layers(image_size: int) -> int:
    """Stride-2 layers of the PatchGAN by image size: 3 (Pix2Pix's 70x70) from 128 px, 2 at 64, 1 at 32."""
    image_size = _square_size(image_size, PIX2PIX_SIZES, "PatchGANDiscriminator")
    return 3 if image_size >= 128 else 2 if image_size >= 64 else 1


class PatchGANDiscriminator(nn.Module):
    """Pix2Pix's PatchGAN discriminator (Isola et al. 2017, §3.2.2; the reference ``NLayerDiscriminator``).

    ``C64 -> C128 -> ... `` 4x4 convolutions, ``n_layers`` of them with stride 2 (widths
    ``base_width * min(2**i, 8)``, BatchNorm on all but the first, LeakyReLU 0.2), then one stride-1
    ``4x4`` convolution with BatchNorm and a stride-1 ``4x4`` convolution to one logit per patch. Each logit
    sees a receptive field of 70 px for ``n_layers=3`` (the Pix2Pix paper's 70x70 PatchGAN), 34 px for 2, 16 px for 1.
    The logit grid is ``S / 2**n_layers - 2`` on each side: 30x30 at 256 px, 14x14 at 128, 64 and 32 px with
    the default ``n_layers``.

    Args:
        in_channels: channels of one image (the conditional discriminator reads ``2 * in_channels``).
        image_size: side of the square images, a power of two in 32..256.
        base_width: width of the first layer (64 in Pix2Pix).
        n_layers: stride-2 layers; default :func:`default_patchgan_layers` (3 for >= 128 px, 2 for 64 px,
            1 for 32 px, so the patch grid stays at least 2x2).
        conditional: read ``(x, y)`` concatenated on channels (Pix2Pix's conditional GAN), else ``y`` only.

    Shapes:
        ``forward(x, y)`` (conditional) or ``forward(y)``: images ``(N, in_channels, S, S)`` in ``[0, 1]``
        -> logits ``(N, 1, h, h)``, ``h = S / 2**n_layers - 2``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        base_width: int = 64,
        n_layers: int | None = None,
        conditional: bool = True,
    ) -> None:
        super().__init__()
        _check_channels(in_channels, "in_channels")
        _check_channels(base_width, "base_width")
        self.image_size = _square_size(image_size, PIX2PIX_SIZES, "PatchGANDiscriminator")
        n_layers = default_patchgan_layers(self.image_size) if n_layers is None else n_layers
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
        grid = self.image_size // 2**n_layers - 2
        if grid < 1:
            raise ValueError(
                f"n_layers={n_layers} leaves no patch grid at image_size={self.image_size} "
                f"(the grid is image_size / 2**n_layers - 2 = {grid})"
            )
        self.in_channels, self.n_layers, self.conditional = in_channels, n_layers, conditional
        self.grid_size = grid

        cin = 2 * in_channels if conditional else in_channels
        layers: list[nn.Module] = [nn.Conv2d(cin, base_width, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        width = base_width
        for i in range(1, n_layers + 1):
            next_width = base_width * min(2**i, 8)
            stride = 2 if i < n_layers else 1
            layers += [
                nn.Conv2d(width, next_width, 4, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(next_width),
                nn.LeakyReLU(0.2),
            ]
            width = next_width
        layers.append(nn.Conv2d(width, 1, 4, stride=1, padding=1))
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Patch logits of ``y`` given ``x`` (conditional) or of the single image argument (unconditional)."""
        name = type(self).__name__
        if self.conditional:
            if y is None:
                raise ValueError(
                    f"the conditional {name} takes (x, y): the input and the (real or generated) output"
                )
            _check_images(x, self.in_channels, self.image_size, name, "x")
            _check_images(y, self.in_channels, self.image_size, name, "y")
            images = torch.cat([x, y], dim=1)
        else:
            if y is not None:
                raise ValueError(f"the unconditional {name} takes one image batch, got two")
            _check_images(x, self.in_channels, self.image_size, name)
            images = x
        return self.model(_to_signed(images))


# ----------------------------------------------------------------------------------------------- DCGAN


class DCGANGenerator(NoiseGenerator):
    """DCGAN generator (Radford et al. 2016, Fig. 1): ``z -> 4x4`` by a 4x4 transposed convolution, then
    stride-2 4x4 transposed convolutions doubling the size (BatchNorm and ReLU between) up to the image.

    Widths halve from ``base_width * 2**(log2(S) - 3)`` at 4x4 (256 at 32 px, 512 at 64 px with
    ``base_width=64``) to ``base_width`` before the output layer.

    Args:
        latent_dim: dimension of ``z``.
        out_channels: image channels (1 or 3).
        image_size: 32 or 64.
        base_width: width of the last hidden layer (64 in DCGAN).
        num_classes: > 0 makes the generator class-conditional: a learned ``latent_dim``-dimensional
            class embedding is concatenated to ``z``.
        init_weights: apply :func:`dcgan_weights_init` (the DCGAN paper's ``N(0, 0.02)``).

    Shapes:
        ``forward(z, labels=None)``: ``(N, latent_dim)`` (and ``(N,)`` labels) -> ``(N, out_channels, S, S)``
        in ``[0, 1]``.
    """

    def __init__(
        self,
        latent_dim: int,
        out_channels: int,
        image_size: int,
        base_width: int = 64,
        num_classes: int = 0,
        *,
        init_weights: bool = True,
    ) -> None:
        super().__init__()
        _check_channels(latent_dim, "latent_dim")
        _check_channels(out_channels, "out_channels")
        _check_channels(base_width, "base_width")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        self.image_size = _square_size(image_size, DCGAN_SIZES, "DCGANGenerator")
        self.latent_dim, self.out_channels, self.num_classes = latent_dim, out_channels, num_classes
        self.embedding = nn.Embedding(num_classes, latent_dim) if num_classes > 0 else None
        n_up = int(math.log2(self.image_size)) - 2  # stride-2 layers after the 4x4 projection
        width = base_width * 2 ** (n_up - 1)
        cin = latent_dim * (2 if num_classes > 0 else 1)
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(cin, width, 4, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        ]
        for _ in range(n_up - 1):
            layers += [
                nn.ConvTranspose2d(width, width // 2, 4, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(width // 2),
                nn.ReLU(),
            ]
            width //= 2
        layers.append(nn.ConvTranspose2d(width, out_channels, 4, stride=2, padding=1))
        self.model = nn.Sequential(*layers)
        if init_weights:
            self.apply(dcgan_weights_init)

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Images ``(N, out_channels, S, S)`` in ``[0, 1]`` from latents ``(N, latent_dim)``."""
        self._check_latent(z, labels)
        if self.embedding is not None:
            z = torch.cat([z, self.embedding(labels)], dim=1)
        return _to_unit(self.model(z[:, :, None, None]))


class DCGANDiscriminator(nn.Module):
    """DCGAN discriminator (Radford et al. 2016): stride-2 4x4 convolutions with LeakyReLU 0.2 (BatchNorm on
    all but the first) down to 4x4, then a 4x4 convolution to one logit.

    With ``spectral_norm=True`` every weight is spectrally normalised and BatchNorm is left out, as in
    Miyato et al. (2018)'s "standard CNN" discriminator. With ``num_classes > 0`` the projection term
    ``<embed(y), phi(x)>`` (Miyato & Koyama 2018) is added, ``phi(x)`` being the 4x4 feature map summed over
    space (``(N, F)``).

    Args:
        in_channels: image channels (1 or 3).
        image_size: 32 or 64.
        base_width: width of the first layer (64 in DCGAN).
        spectral_norm: spectral normalisation of every layer (and no BatchNorm).
        num_classes: > 0 adds the class projection term.
        init_weights: apply :func:`dcgan_weights_init` (the DCGAN paper's ``N(0, 0.02)``).

    Shapes:
        ``forward(x, labels=None)``: ``(N, in_channels, S, S)`` in ``[0, 1]`` (and ``(N,)`` labels) ->
        logits ``(N,)``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        base_width: int = 64,
        spectral_norm: bool = False,
        num_classes: int = 0,
        *,
        init_weights: bool = True,
    ) -> None:
        super().__init__()
        _check_channels(in_channels, "in_channels")
        _check_channels(base_width, "base_width")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        self.image_size = _square_size(image_size, DCGAN_SIZES, "DCGANDiscriminator")
        self.in_channels, self.num_classes = in_channels, num_classes
        n_down = int(math.log2(self.image_size)) - 2
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, base_width, 4, stride=2, padding=1),
            nn.LeakyReLU(0.2),
        ]
        width = base_width
        for _ in range(n_down - 1):
            layers.append(nn.Conv2d(width, 2 * width, 4, stride=2, padding=1, bias=spectral_norm))
            if not spectral_norm:
                layers.append(nn.BatchNorm2d(2 * width))
            layers.append(nn.LeakyReLU(0.2))
            width *= 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Conv2d(width, 1, 4, stride=1, padding=0)
        self.projection = nn.Embedding(num_classes, width) if num_classes > 0 else None
        if init_weights:
            self.apply(dcgan_weights_init)
        if self.projection is not None:
            nn.init.xavier_uniform_(self.projection.weight)
        if spectral_norm:
            for module in self.modules():
                if isinstance(module, (nn.Conv2d, nn.Embedding)):
                    _spectral_norm(module)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Logits ``(N,)`` of images ``(N, in_channels, S, S)`` in ``[0, 1]``."""
        _check_images(x, self.in_channels, self.image_size, type(self).__name__)
        _check_labels(labels, self.num_classes, x.shape[0], type(self).__name__)
        features = self.features(_to_signed(x))
        logits = self.head(features).flatten()
        if self.projection is not None:
            logits = logits + (self.projection(labels) * features.sum(dim=(2, 3))).sum(dim=1)
        return logits


# ------------------------------------------------------------------------------------------- SNGAN ResNet


class ConditionalBatchNorm2d(nn.Module):
    """BatchNorm whose gain and bias are looked up per class (de Vries et al. 2017; SNGAN's conditional G).

    ``num_classes=0`` gives an ordinary affine BatchNorm.

    Shapes:
        ``forward(h, labels)``: ``(N, C, H, W)`` and ``(N,)`` (or ``None``) -> ``(N, C, H, W)``.
    """

    def __init__(self, num_features: int, num_classes: int = 0) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.norm = nn.BatchNorm2d(num_features, affine=num_classes == 0)
        if num_classes > 0:
            self.gain = nn.Embedding(num_classes, num_features)
            self.bias = nn.Embedding(num_classes, num_features)
            nn.init.ones_(self.gain.weight)
            nn.init.zeros_(self.bias.weight)

    def forward(self, h: Tensor, labels: Tensor | None = None) -> Tensor:
        h = self.norm(h)
        if self.num_classes == 0:
            return h
        return h * self.gain(labels)[:, :, None, None] + self.bias(labels)[:, :, None, None]


class _GeneratorBlock(nn.Module):
    """SNGAN up-sampling residual block: ``BN-ReLU-up-conv3-BN-ReLU-conv3`` plus ``up-conv1`` shortcut."""

    def __init__(self, cin: int, cout: int, num_classes: int) -> None:
        super().__init__()
        self.norm1 = ConditionalBatchNorm2d(cin, num_classes)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = ConditionalBatchNorm2d(cout, num_classes)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, h: Tensor, labels: Tensor | None) -> Tensor:
        residual = F.interpolate(F.relu(self.norm1(h, labels)), scale_factor=2, mode="nearest")
        residual = self.conv2(F.relu(self.norm2(self.conv1(residual), labels)))
        return residual + self.shortcut(F.interpolate(h, scale_factor=2, mode="nearest"))


class _DiscriminatorBlock(nn.Module):
    """SNGAN down-sampling residual block: ``(ReLU)-conv3-ReLU-conv3-avgpool``, ``conv1-avgpool`` shortcut.

    The first block (``first=True``, the reference's ``OptimizedBlock``) has no ReLU before its first
    convolution and pools before its shortcut convolution.
    """

    def __init__(self, cin: int, cout: int, *, downsample: bool, first: bool, sn: bool) -> None:
        super().__init__()
        self.downsample, self.first = downsample, first
        self.conv1 = _maybe_sn(nn.Conv2d(cin, cout, 3, padding=1), sn)
        self.conv2 = _maybe_sn(nn.Conv2d(cout, cout, 3, padding=1), sn)
        self.shortcut = _maybe_sn(nn.Conv2d(cin, cout, 1), sn) if (cin != cout or downsample) else None

    def _pool(self, h: Tensor) -> Tensor:
        return F.avg_pool2d(h, 2) if self.downsample else h

    def forward(self, h: Tensor) -> Tensor:
        residual = self.conv1(h if self.first else F.relu(h))
        residual = self._pool(self.conv2(F.relu(residual)))
        if self.shortcut is None:
            return residual + h
        shortcut = self.shortcut(self._pool(h)) if self.first else self._pool(self.shortcut(h))
        return residual + shortcut


def _resnet_widths(image_size: int, base_width: int) -> list[int]:
    """Widths from 4x4 to the image: ``base_width * min(2**k, 16)``, ``k = n .. 0``, ``n = log2(S) - 2``."""
    n = int(math.log2(image_size)) - 2
    return [base_width * min(2**k, 16) for k in range(n, -1, -1)]


class ResNetGenerator(NoiseGenerator):
    """SNGAN ResNet generator (Miyato et al. 2018, appendix B.4; the 128 px ImageNet layout).

    ``z -> Linear -> 4x4x(16w)``, then ``log2(S) - 2`` up-sampling residual blocks (4 at 64 px, 5 at 128 px)
    with widths ``16w, 8w, ... , w`` (``w = base_width``, capped at ``16w``), then ``BN-ReLU-conv3x3`` to
    the image. Class conditioning uses conditional BatchNorm in every block (Miyato & Koyama 2018).

    Args:
        latent_dim: dimension of ``z`` (128 in SNGAN).
        out_channels: image channels (1 or 3).
        image_size: 64 or 128.
        base_width: ``w`` (64 in SNGAN's 128 px model).
        num_classes: > 0 makes the BatchNorms class-conditional.

    Shapes:
        ``forward(z, labels=None)``: ``(N, latent_dim)`` (and ``(N,)`` labels) -> ``(N, out_channels, S, S)``
        in ``[0, 1]``.
    """

    def __init__(
        self, latent_dim: int, out_channels: int, image_size: int, base_width: int = 64, num_classes: int = 0
    ) -> None:
        super().__init__()
        _check_channels(latent_dim, "latent_dim")
        _check_channels(out_channels, "out_channels")
        _check_channels(base_width, "base_width")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        self.image_size = _square_size(image_size, RESNET_SIZES, "ResNetGenerator")
        self.latent_dim, self.out_channels, self.num_classes = latent_dim, out_channels, num_classes
        widths = _resnet_widths(self.image_size, base_width)
        self.linear = nn.Linear(latent_dim, 4 * 4 * widths[0])
        self.blocks = nn.ModuleList(
            _GeneratorBlock(cin, cout, num_classes) for cin, cout in zip(widths, widths[1:], strict=False)
        )
        self.output = nn.Sequential(
            nn.BatchNorm2d(widths[-1]), nn.ReLU(), nn.Conv2d(widths[-1], out_channels, 3, padding=1)
        )
        for module in self.modules():  # Xavier initialisation, as in the SNGAN reference code
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Images ``(N, out_channels, S, S)`` in ``[0, 1]`` from latents ``(N, latent_dim)``."""
        self._check_latent(z, labels)
        h = self.linear(z).view(z.shape[0], -1, 4, 4)
        for block in self.blocks:
            h = block(h, labels)
        return _to_unit(self.output(h))


class ResNetDiscriminator(nn.Module):
    """SNGAN ResNet discriminator with optional projection (Miyato et al. 2018; Miyato & Koyama 2018).

    ``log2(S) - 2`` down-sampling residual blocks to 4x4 (widths ``w, 2w, ..., `` capped at ``16w``), one
    more residual block at 4x4 with width ``16w``, ``ReLU``, a global sum pool ``phi(x)`` and
    ``Linear(phi(x)) + <embed(y), phi(x)>``. No BatchNorm (Miyato et al. use spectral norm alone).

    Args:
        in_channels: image channels (1 or 3).
        image_size: 64 or 128.
        base_width: ``w`` (64 in SNGAN's 128 px model).
        spectral_norm: spectral normalisation of every layer (default, SNGAN).
        num_classes: > 0 adds the class projection term.

    Shapes:
        ``forward(x, labels=None)``: ``(N, in_channels, S, S)`` in ``[0, 1]`` (and ``(N,)`` labels) ->
        logits ``(N,)``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        base_width: int = 64,
        spectral_norm: bool = True,
        num_classes: int = 0,
    ) -> None:
        super().__init__()
        _check_channels(in_channels, "in_channels")
        _check_channels(base_width, "base_width")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        self.image_size = _square_size(image_size, RESNET_SIZES, "ResNetDiscriminator")
        self.in_channels, self.num_classes = in_channels, num_classes
        widths = _resnet_widths(self.image_size, base_width)[::-1]  # w, 2w, ..., 16w (4x4)
        down = widths[:-1]
        blocks = [_DiscriminatorBlock(in_channels, down[0], downsample=True, first=True, sn=spectral_norm)]
        blocks += [
            _DiscriminatorBlock(cin, cout, downsample=True, first=False, sn=spectral_norm)
            for cin, cout in zip(down, down[1:], strict=False)
        ]
        blocks.append(
            _DiscriminatorBlock(down[-1], widths[-1], downsample=False, first=False, sn=spectral_norm)
        )
        self.blocks = nn.Sequential(*blocks)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                weight = (
                    module.parametrizations.weight.original
                    if parametrize.is_parametrized(module, "weight")
                    else module.weight
                )
                nn.init.xavier_uniform_(weight)
                nn.init.zeros_(module.bias)
        self.linear = _maybe_sn(nn.Linear(widths[-1], 1), spectral_norm)
        self.projection = None
        if num_classes > 0:
            embedding = nn.Embedding(num_classes, widths[-1])
            nn.init.xavier_uniform_(embedding.weight)
            self.projection = _maybe_sn(embedding, spectral_norm)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Logits ``(N,)`` of images ``(N, in_channels, S, S)`` in ``[0, 1]``."""
        _check_images(x, self.in_channels, self.image_size, type(self).__name__)
        _check_labels(labels, self.num_classes, x.shape[0], type(self).__name__)
        phi = F.relu(self.blocks(_to_signed(x))).sum(dim=(2, 3))
        logits = self.linear(phi).flatten()
        if self.projection is not None:
            logits = logits + (self.projection(labels) * phi).sum(dim=1)
        return logits


# ----------------------------------------------------------------------------------------------- factory


def build_gan(
    kind: Literal["dcgan", "resnet", "auto"],
    latent_dim: int,
    channels: int,
    image_size: int,
    *,
    base_width: int = 64,
    num_classes: int = 0,
    spectral_norm: bool | None = None,
) -> tuple[NoiseGenerator, nn.Module]:
    """A generator and a discriminator of one family.

    Args:
        kind: ``"dcgan"`` (32 or 64 px), ``"resnet"`` (64 or 128 px) or ``"auto"`` (DCGAN up to 32 px,
            ResNet for 64 and 128 px).
        latent_dim: dimension of ``z``.
        channels: image channels (1 or 3).
        image_size: side of the square images.
        base_width: width parameter of both networks.
        num_classes: > 0 makes both class-conditional.
        spectral_norm: spectral normalisation in the discriminator; ``None`` takes the family's default
            (off for DCGAN, on for ResNet).

    Returns:
        ``(generator, discriminator)``.
    """
    if kind == "auto":
        if isinstance(image_size, int) and image_size <= 32:
            kind = "dcgan"
        elif isinstance(image_size, int) and image_size <= 128:
            kind = "resnet"
        else:
            raise ValueError(f"build_gan(kind='auto') supports image_size up to 128, got {image_size!r}")
    if kind == "dcgan":
        return (
            DCGANGenerator(latent_dim, channels, image_size, base_width=base_width, num_classes=num_classes),
            DCGANDiscriminator(
                channels,
                image_size,
                base_width=base_width,
                spectral_norm=bool(spectral_norm),
                num_classes=num_classes,
            ),
        )
    if kind == "resnet":
        return (
            ResNetGenerator(latent_dim, channels, image_size, base_width=base_width, num_classes=num_classes),
            ResNetDiscriminator(
                channels,
                image_size,
                base_width=base_width,
                spectral_norm=True if spectral_norm is None else spectral_norm,
                num_classes=num_classes,
            ),
        )
    raise ValueError(f"unknown GAN kind {kind!r}; use 'dcgan', 'resnet' or 'auto'")
