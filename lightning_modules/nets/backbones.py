"""Networks: a backbone by name, plus the paper's deep-feature and logit layers.

Palechor et al. (WACV 2023) replace ResNet-50's ``fc`` by ``Linear(2048, K')`` ("deep features") followed
by ``Linear(K', K', bias=False)`` (logits), ``K' = K`` for SoftMax/EOS and ``K+1`` for the background
class. :class:`OpenSetNetwork` does the same on top of any backbone that yields pooled features:

    ``torchvision:<name>``  any torchvision classification model (``torchvision:resnet50`` is the paper's)
    ``timm:<name>``         any timm model (through timm's ``num_classes=0`` pooled-feature interface)
    ``small_cnn``           a 3-layer CNN for small grey-scale images (the Fashion-MNIST demo)

Pretrained weights are read only from the local caches; nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn


class PretrainedWeightsMissing(FileNotFoundError):
    """Raised when ``pretrained=True`` but the weights are not in the local cache."""


class SmallCNN(nn.Module):
    """Three conv blocks and global average pooling: ``(N, C, H, W) -> (N, 4 * width)``."""

    def __init__(self, in_channels: int = 1, width: int = 16) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(in_channels, width),
            nn.MaxPool2d(2),
            *block(width, 2 * width),
            nn.MaxPool2d(2),
            *block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.num_features = 4 * width

    def forward(self, images: Tensor) -> Tensor:
        return self.features(images)


def _torchvision_weights_path(weights: object) -> Path:
    url = weights.url  # type: ignore[attr-defined]
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def _strip_torchvision_classifier(model: nn.Module, name: str) -> int:
    """Replace the final classification layer by ``Identity``; return the pooled feature size."""
    for attribute in ("fc", "classifier", "head", "heads"):
        layer = getattr(model, attribute, None)
        if layer is None:
            continue
        if isinstance(layer, nn.Linear):
            setattr(model, attribute, nn.Identity())
            return layer.in_features
        if isinstance(layer, nn.Sequential):
            for index in range(len(layer) - 1, -1, -1):
                if isinstance(layer[index], nn.Linear):
                    in_features = layer[index].in_features
                    layer[index] = nn.Identity()
                    return in_features
    raise ValueError(f"torchvision:{name} has no final Linear layer in fc/classifier/head/heads to replace")


def _torchvision_backbone(name: str, *, pretrained: bool, in_channels: int) -> tuple[nn.Module, int]:
    import torchvision

    if name not in torchvision.models.list_models():
        raise ValueError(f"unknown torchvision model {name!r}; see torchvision.models.list_models()")
    weights = None
    if pretrained:
        weights = torchvision.models.get_model_weights(name).DEFAULT
        path = _torchvision_weights_path(weights)
        if not path.is_file():
            raise PretrainedWeightsMissing(
                f"pretrained weights for torchvision:{name} are not in the local cache: put {path.name} "
                f"(from {weights.url}) at {path} (set TORCH_HOME to use another cache folder)"
            )
    model = torchvision.models.get_model(name, weights=weights)
    if in_channels != 3:
        conv = getattr(model, "conv1", None)
        if not isinstance(conv, nn.Conv2d):
            raise ValueError(f"in_channels={in_channels} is supported for torchvision ResNets only, not {name}")
        model.conv1 = nn.Conv2d(
            in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None
        )
    return model, _strip_torchvision_classifier(model, name)


def cached_timm_weights(name: str) -> Path | None:
    """The local file of a timm model's pretrained weights, looked up without any network access.

    Looks in the Hugging Face hub cache (``HF_HOME``) for the model's ``hf_hub_id`` and in the torch hub
    cache for its download URL.
    """
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        return None
    if cfg.file and Path(cfg.file).is_file():
        return Path(cfg.file)
    if cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = cfg.hf_hub_id.partition("@")
        for filename in (getattr(cfg, "hf_hub_filename", None), "model.safetensors", "pytorch_model.bin"):
            hit = try_to_load_from_cache(repo, filename, revision=revision or None) if filename else None
            if isinstance(hit, str):
                return Path(hit)
    if cfg.url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(cfg.url)
        if path.is_file():
            return path
    return None


def local_timm_weights(name: str, pretrained_file: str | None = None) -> Path:
    """The weight file of a timm model from an explicit path or the local caches; never the network.

    Raises:
        PretrainedWeightsMissing: naming the model's weight source and where to put the file.
    """
    import timm

    weights = Path(pretrained_file) if pretrained_file is not None else cached_timm_weights(name)
    if weights is None or not weights.is_file():
        cfg = timm.models.get_pretrained_cfg(name)
        source = f"Hugging Face repo {cfg.hf_hub_id} or {cfg.url}" if cfg is not None else "the model's release"
        raise PretrainedWeightsMissing(
            f"pretrained weights for timm:{name} are not in the local cache"
            + (f" (pretrained_file {pretrained_file} does not exist)" if pretrained_file else "")
            + f". Put them (from {source}) in the Hugging Face cache (HF_HOME, default ~/.cache/huggingface) "
            f"or in {torch.hub.get_dir()}/checkpoints, or pass pretrained_file=<path to the weights file>"
        )
    return weights


def pooled_width(model: nn.Module) -> int:
    """The width of what a timm model with ``num_classes=0`` returns: its pre-logits features. That is
    ``head_hidden_size`` for the models with a hidden head layer after the pooling (MobileNetV3, GhostNet,
    LCNet, ...), whose ``num_features`` is the width before it; ``num_features`` for the others."""
    hidden = getattr(model, "head_hidden_size", None)
    return int(hidden) if hidden else int(model.num_features)


def _timm_backbone(
    name: str, *, pretrained: bool, in_channels: int, pretrained_file: str | None, model_args: dict
) -> tuple[nn.Module, int]:
    import timm

    if not timm.is_model(name):
        raise ValueError(f"unknown timm model {name!r}; see timm.list_models()")
    if not pretrained:
        model = timm.create_model(name, pretrained=False, num_classes=0, in_chans=in_channels, **model_args)
        return model, pooled_width(model)
    weights = local_timm_weights(name, pretrained_file)
    model = timm.create_model(
        name, pretrained=True, num_classes=0, in_chans=in_channels, pretrained_cfg_overlay={"file": str(weights)},
        **model_args,
    )
    return model, pooled_width(model)


LOCAL_BACKBONES: dict[str, Callable[[int], tuple[nn.Module, int]]] = {
    "small_cnn": lambda in_channels: (cnn := SmallCNN(in_channels), cnn.num_features),
}


def build_backbone(
    name: str, *, pretrained: bool = False, in_channels: int = 3, pretrained_file: str | None = None,
    backbone_args: dict | None = None,
) -> tuple[nn.Module, int]:
    """Build a backbone that maps images to pooled features.

    Args:
        name: ``torchvision:<model>``, ``timm:<model>`` or a local name (``small_cnn``).
        pretrained: load pretrained weights from the local cache (clear error if missing).
        in_channels: number of image channels.
        pretrained_file: an explicit weight file (timm backbones).
        backbone_args: extra keyword arguments of ``timm.create_model`` (e.g. ``{"drop_rate": 0.2}``).

    Returns:
        ``(module, feature_dim)``: ``module(images)`` has shape ``(N, feature_dim)``.
    """
    source, _, model_name = name.partition(":")
    if backbone_args and source != "timm":
        raise ValueError(f"backbone_args {sorted(backbone_args)} are passed to timm.create_model; {name!r} is not timm")
    if source == "torchvision" and model_name:
        return _torchvision_backbone(model_name, pretrained=pretrained, in_channels=in_channels)
    if source == "timm" and model_name:
        return _timm_backbone(model_name, pretrained=pretrained, in_channels=in_channels, pretrained_file=pretrained_file,
                              model_args=dict(backbone_args or {}))
    if name in LOCAL_BACKBONES:
        if pretrained:
            raise ValueError(f"backbone {name!r} has no pretrained weights")
        return LOCAL_BACKBONES[name](in_channels)
    raise ValueError(
        f"unknown backbone {name!r}: use 'torchvision:<model>', 'timm:<model>' or one of {sorted(LOCAL_BACKBONES)}"
    )


class OpenSetNetwork(nn.Module):
    """``backbone -> Linear(F, D) deep features -> Linear(D, K', bias=False) logits``.

    Args:
        backbone: maps images to ``(N, F)`` pooled features.
        feature_dim: ``F``.
        num_outputs: ``K'`` (``K`` for SoftMax/EOS, ``K+1`` with a background class).
        deep_feature_dim: ``D``; the paper uses ``D = K'``.
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, num_outputs: int, deep_feature_dim: int | None = None):
        super().__init__()
        deep_feature_dim = deep_feature_dim or num_outputs
        self.backbone = backbone
        self.deep_features = nn.Linear(feature_dim, deep_feature_dim)
        self.logits = nn.Linear(deep_feature_dim, num_outputs, bias=False)

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(logits (N, K'), deep features (N, D))``."""
        features = self.deep_features(self.backbone(images))
        return self.logits(features), features


def build_classifier(
    name: str, *, pretrained: bool = True, pretrained_file: str | None = None, model_args: dict | None = None
) -> tuple[nn.Module, Callable | None]:
    """A full ImageNet classifier (logits over its classes) and its evaluation transform.

    Args:
        name: ``timm:<model>`` or ``torchvision:<model>``.
        pretrained: load the weights from the local cache (clear error when missing); ``False`` gives a
            randomly initialised model (tests).
        model_args: extra keyword arguments of ``timm.create_model`` or torchvision's ``get_model``, e.g.
            ``{"drop_rate": 0.2}`` (timm applies it functionally in the head; :func:`metrics.kappa.mc_dropout`
            switches it on).

    Returns:
        ``(model, transform)``; the transform is derived from the model's own data configuration (timm)
        or weights (torchvision), so resolution, crop, mean and std cannot drift from the weights.
    """
    source, _, model_name = name.partition(":")
    model_args = dict(model_args or {})
    if source == "timm" and model_name:
        import timm
        from timm.data import create_transform, resolve_model_data_config

        if not timm.is_model(model_name):
            raise ValueError(f"unknown timm model {model_name!r}; see timm.list_models()")
        if pretrained:
            weights = local_timm_weights(model_name, pretrained_file)
            model = timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay={"file": str(weights)},
                                      **model_args)
        else:
            model = timm.create_model(model_name, pretrained=False, **model_args)
        return model, create_transform(**resolve_model_data_config(model), is_training=False)
    if source == "torchvision" and model_name:
        import torchvision

        if model_name not in torchvision.models.list_models():
            raise ValueError(f"unknown torchvision model {model_name!r}; see torchvision.models.list_models()")
        weights = torchvision.models.get_model_weights(model_name).DEFAULT
        if pretrained:
            path = _torchvision_weights_path(weights)
            if not path.is_file():
                raise PretrainedWeightsMissing(
                    f"pretrained weights for torchvision:{model_name} are not in the local cache: put {path.name} "
                    f"(from {weights.url}) at {path} (set TORCH_HOME to use another cache folder)"
                )
        model = torchvision.models.get_model(model_name, weights=weights if pretrained else None, **model_args)
        return model, weights.transforms()
    raise ValueError(f"unknown classifier {name!r}: use 'timm:<model>' or 'torchvision:<model>'")
