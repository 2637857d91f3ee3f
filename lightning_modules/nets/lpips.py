"""LPIPS perceptual distance (Zhang et al., CVPR 2018) as a frozen, differentiable ``nn.Module``.

Mukhoti et al.'s generated benchmarks (DESIGN.md §5.3) regularise their generators with LPIPS: the shift
generator maximises ``LPIPS(x, G(x))``, the near-OOD generator minimises ``LPIPS(G(z), x_real)``. Both
back-propagate through the distance, so gradients must reach the images while the network stays fixed.

``d(x, y) = sum_l mean_{h,w} || w_l ⊙ (f̂_l(x) - f̂_l(y)) ||²`` where ``f̂_l`` are the channel-normalised
activations of layer ``l`` of an ImageNet backbone (VGG-16, AlexNet or SqueezeNet 1.1) and ``w_l`` the
linear weights calibrated on human judgements (shipped inside the ``lpips`` package).

The backbone weights come from torchvision's cache (``torch.hub.get_dir()/checkpoints``) and are never
downloaded: a missing file raises :class:`~lightning_modules.nets.backbones.PretrainedWeightsMissing`. A random
backbone (``random_backbone=True``) must be asked for explicitly, and it is then not a perceptual distance.

Minimum input sizes (per spatial dimension) below which the backbone's feature maps would vanish:

    ``vgg``      16 px: four 2x2/2 max pools before ``relu5_3`` (16 -> 8 -> 4 -> 2 -> 1).
    ``alex``     31 px: the 11x11/4 conv (padding 2) then two 3x3/2 max pools; 31 -> 7 -> 3 -> 1,
                 while 30 -> 6 -> 2 leaves the second pool a 2 px input.
    ``squeeze``  17 px: the 3x3/2 conv then three 3x3/2 ceil-mode max pools; PyTorch's ceil mode
                 accepts a 2 px input (the window starts inside it), so 17 -> 8 -> 4 -> 2 -> 1,
                 while 16 -> 7 -> 3 -> 1 leaves the last pool a 1 px input.

Smaller images are upsampled bilinearly (``align_corners=False``) to the minimum before the distance is
computed, so 28x28 Fashion-MNIST and 32x32 images work with every backbone (AlexNet sees them at 31 px
or more).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.nets.backbones import PretrainedWeightsMissing, _torchvision_weights_path

# lpips' backbone name -> (torchvision builder lpips calls with pretrained=True, smallest input size in px)
BACKBONES: dict[str, tuple[str, int]] = {
    "vgg": ("vgg16", 16),
    "alex": ("alexnet", 31),
    "squeeze": ("squeezenet1_1", 17),
}


def backbone_weights_url(net: str) -> str:
    """The URL of the torchvision weights that lpips' ``pretrained=True`` resolves to (``IMAGENET1K_V1``)."""
    import torchvision

    if net not in BACKBONES:
        raise ValueError(f"unknown LPIPS backbone {net!r}; use one of {sorted(BACKBONES)}")
    return torchvision.models.get_model_weights(BACKBONES[net][0]).IMAGENET1K_V1.url


class PerceptualDistance(nn.Module):
    """Frozen LPIPS distance between batches of images in ``[0, 1]``.

    Args:
        net: backbone, ``"vgg"`` (default, the LPIPS paper's recommendation for a loss), ``"alex"`` or
            ``"squeeze"``.
        random_backbone: build a randomly initialised backbone instead of reading the ImageNet weights
            from the cache (the LPIPS linear layers are still the calibrated ones). The result is not a
            perceptual distance; a ``UserWarning`` says so and :attr:`description` carries it.

    Attributes:
        net: the backbone name.
        random_backbone: whether the backbone is random.
        min_size: the smallest input side in pixels; smaller inputs are upsampled bilinearly to it.
        description: a one-line description for outputs, e.g. ``"LPIPS(vgg, ImageNet backbone)"``.

    Raises:
        ValueError: for an unknown ``net``.
        PretrainedWeightsMissing: when the backbone weights are not in the torch hub cache and
            ``random_backbone`` is false; the message names the file, the folder and the URL.

    The module is always in eval mode (``train()`` is a no-op) and no parameter requires a gradient;
    gradients still flow to the input images.
    """

    def __init__(self, net: str = "vgg", *, random_backbone: bool = False) -> None:
        super().__init__()
        if net not in BACKBONES:
            raise ValueError(f"unknown LPIPS backbone {net!r}; use one of {sorted(BACKBONES)}")
        if not random_backbone:
            self._require_cached_backbone(net)
        import lpips

        with warnings.catch_warnings():
            # torchvision's deprecation notice for the ``pretrained=`` flag lpips passes; nothing to act on
            warnings.filterwarnings("ignore", message=r".*(pretrained|weights).*", category=UserWarning)
            # use_dropout must stay True: the shipped linear weights are keyed ``lin*.model.1.weight``
            # (Dropout at index 0), and lpips loads them with strict=False, so without it they are
            # silently skipped.
            # A random backbone is drawn from a fixed seed, without touching the global generator: every
            # process (DDP ranks, later runs) must measure with the same network.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                self.lpips = lpips.LPIPS(
                    net=net, pnet_rand=random_backbone, pretrained=True, use_dropout=True, verbose=False
                )
        self.net = net
        self.random_backbone = random_backbone
        self.min_size = BACKBONES[net][1]
        self.description = (
            f"LPIPS({net}, RANDOM backbone: not a perceptual distance)"
            if random_backbone
            else f"LPIPS({net}, ImageNet backbone)"
        )
        self.requires_grad_(False)
        super().train(False)
        if random_backbone:
            warnings.warn(
                f"{self.description}: the {net} backbone is randomly initialised, so its distances are not "
                "perceptual; use this only where a test or a config asks for it by name",
                UserWarning,
                stacklevel=2,
            )

    @staticmethod
    def _require_cached_backbone(net: str) -> None:
        import torchvision

        weights = torchvision.models.get_model_weights(BACKBONES[net][0]).IMAGENET1K_V1
        path = _torchvision_weights_path(weights)
        if not path.is_file():
            raise PretrainedWeightsMissing(
                f"the LPIPS {net} backbone weights are not in the local torch hub cache: put {path.name} "
                f"(from {weights.url}) in {path.parent} (set TORCH_HOME to use another cache folder), or "
                "pass random_backbone=True to use a random backbone, which is not a perceptual distance"
            )

    def train(self, mode: bool = True) -> PerceptualDistance:
        """Stay in eval mode whatever ``mode`` is (the distance is a fixed function, not a trained part)."""
        return super().train(False)

    def extra_repr(self) -> str:
        return self.description

    def _prepare(self, images: Tensor) -> Tensor:
        """``(N, 1 or 3, H, W) -> (N, 3, max(H, min_size), max(W, min_size))``: grey repeated, upsampled."""
        if images.dim() != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"expected images (N, C, H, W) with 1 or 3 channels, got {tuple(images.shape)}")
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        height, width = images.shape[-2:]
        if height < self.min_size or width < self.min_size:
            size = (max(height, self.min_size), max(width, self.min_size))
            images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        return images

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """LPIPS distance of each pair.

        Args:
            x: images ``(N, C, H, W)`` in ``[0, 1]``, ``C`` = 1 (repeated to 3 channels) or 3.
            y: images of the same shape.

        Returns:
            ``(N,)`` distances, ``>= 0`` and ``0`` for identical images.
        """
        if x.dim() != 4 or x.shape != y.shape:
            raise ValueError(
                f"expected two image batches (N, C, H, W) of one shape, got {tuple(x.shape)} and "
                f"{tuple(y.shape)}"
            )
        x, y = self._prepare(x), self._prepare(y)
        return self.lpips(x, y, normalize=True).reshape(x.shape[0])

    def _unit_features(self, images: Tensor) -> list[Tensor]:
        """Channel-normalised activations ``f̂_l`` of prepared images, ``(N, C_l, H_l, W_l)`` per layer."""
        import lpips

        features = self.lpips.net(self.lpips.scaling_layer(2 * images - 1))
        return [lpips.normalize_tensor(feature) for feature in features]

    def pairwise(self, x: Tensor, y: Tensor) -> Tensor:
        """LPIPS distance of every image of ``x`` to every image of ``y``, one backbone pass per image.

        Uses ``sum_c w_c (a_c - b_c)² = sum_c w_c a_c² + sum_c w_c b_c² - 2 sum_c w_c a_c b_c`` per layer
        and location, so the cross term is a matrix product; equal to :meth:`forward` on each pair up to
        float rounding (about ``1e-6``), clamped at 0.

        Args:
            x: images ``(N, C, H, W)`` in ``[0, 1]``.
            y: images ``(M, C, H, W)`` in ``[0, 1]`` (same ``C, H, W``).

        Returns:
            ``(N, M)`` distances.
        """
        if x.dim() != 4 or y.dim() != 4 or x.shape[1:] != y.shape[1:]:
            raise ValueError(
                f"expected image batches (N, C, H, W) and (M, C, H, W), got {tuple(x.shape)} and "
                f"{tuple(y.shape)}"
            )
        features_x, features_y = self._unit_features(self._prepare(x)), self._unit_features(self._prepare(y))
        distances = x.new_zeros(x.shape[0], y.shape[0])
        for layer, (a, b) in enumerate(zip(features_x, features_y, strict=True)):
            weight = self.lpips.lins[layer].model[-1].weight.reshape(1, -1, 1, 1)
            locations = a.shape[-2] * a.shape[-1]
            own_x = (weight * a.square()).sum(dim=1).mean(dim=(1, 2))
            own_y = (weight * b.square()).sum(dim=1).mean(dim=(1, 2))
            cross = (weight * a).flatten(1) @ b.flatten(1).T / locations
            distances = distances + own_x[:, None] + own_y[None, :] - 2 * cross
        return distances.clamp_min(0)

    def nearest(self, x: Tensor, references: Tensor, *, chunk_size: int = 256) -> tuple[Tensor, Tensor]:
        """The perceptually nearest reference image of each image.

        Args:
            x: images ``(N, C, H, W)`` in ``[0, 1]``.
            references: images ``(M, C, H, W)`` in ``[0, 1]``, processed ``chunk_size`` at a time.
            chunk_size: references per backbone pass.

        Returns:
            ``(indices, distances)``, both ``(N,)``: the index into ``references`` of each image's nearest
            reference and its LPIPS distance (as :meth:`pairwise`). Call under ``torch.no_grad()`` unless the
            distances are to be differentiated.
        """
        if references.dim() != 4 or references.shape[0] == 0:
            raise ValueError(
                f"expected a non-empty reference batch (M, C, H, W), got {tuple(references.shape)}"
            )
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        best_distances, best_indices = self.pairwise(x, references[:chunk_size]).min(dim=1)
        for start in range(chunk_size, references.shape[0], chunk_size):
            distances, indices = self.pairwise(x, references[start : start + chunk_size]).min(dim=1)
            closer = distances < best_distances  # ties keep the earlier reference
            best_distances = torch.where(closer, distances, best_distances)
            best_indices = torch.where(closer, indices + start, best_indices)
        return best_indices, best_distances
