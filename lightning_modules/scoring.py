"""``ScoringModel``: runs a classifier over a data set for the C-OOD severity benchmark.

The classifier is any timm or torchvision ImageNet model (``timm:<name>``, ``torchvision:<name>``) or a
checkpoint of this project (``path/to/best.ckpt``: an :class:`OpenSetClassifier`, scored on its known
classes; a background class is dropped). ``predict_step`` returns, per batch, the dataset indices and
targets with either the logits (and, with ``features=True``, the penultimate features) for logit-based
confidence functions, or the scores of one model-based κ (``kappa="odin"``/``"mc_dropout"``; ODIN needs
``Trainer(inference_mode=False)``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_modules.checkpoint import load_module
from lightning_modules.networks import build_classifier
from lightning_modules.open_set_classifier import unpack_batch
from metrics.kappa import get_kappa


class _KnownLogits(nn.Module):
    """An OpenSetClassifier's logits over the known classes (the background logit dropped)."""

    def __init__(self, module: pl.LightningModule) -> None:
        super().__init__()
        self.module = module
        self.drop_background = bool(getattr(module, "background_class", False))

    def forward(self, images: Tensor) -> Tensor:
        logits = self.module(images)
        return logits[:, :-1] if self.drop_background else logits


def load_scoring_network(model: str, *, pretrained: bool = True, pretrained_file: str | None = None
                         ) -> tuple[nn.Module, Callable | None, str]:
    """``(network, eval transform or None, display name)`` for a model name or a checkpoint path."""
    if model.endswith(".ckpt"):
        path = Path(model)
        module = load_module(path)
        name = path.stem if path.stem not in ("best", "last") else f"{path.parent.parent.name}-{path.stem}"
        return _KnownLogits(module), None, name
    network, transform = build_classifier(model, pretrained=pretrained, pretrained_file=pretrained_file)
    return network, transform, model.partition(":")[2]


def weights_fingerprint(network: nn.Module) -> str:
    """sha256 over every parameter and buffer: a cache made with other weights is never reused."""
    digest = hashlib.sha256()
    for name, tensor in sorted(network.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode() + str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def penultimate_features(network: nn.Module, images: Tensor) -> Tensor:
    """Pre-logit features through timm's ``forward_features``/``forward_head(pre_logits=True)`` interface."""
    if hasattr(network, "forward_features") and hasattr(network, "forward_head"):
        return network.forward_head(network.forward_features(images), pre_logits=True)
    raise ValueError(f"{type(network).__name__} has no forward_features/forward_head: features need a timm model")


class ScoringModel(pl.LightningModule):
    """Forward passes of a fixed classifier for the severity benchmark (see the module docstring).

    Args:
        model: ``timm:<name>``, ``torchvision:<name>`` or a ``.ckpt`` of this project.
        pretrained: load pretrained weights from the local cache.
        kappa: a model-based κ name, or ``None`` for logits.
        kappa_args: keyword arguments of the κ (e.g. ``{"temperature": 2, "epsilon": 1e-5}``).
        features: also return penultimate features (timm models).
    """

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        pretrained_file: str | None = None,
        kappa: str | None = None,
        kappa_args: dict[str, Any] | None = None,
        features: bool = False,
    ) -> None:
        super().__init__()
        self.network, self.eval_transform, self.display_name = load_scoring_network(
            model, pretrained=pretrained, pretrained_file=pretrained_file
        )
        self.network.eval()
        self.kappa = get_kappa(kappa) if kappa is not None else None
        if self.kappa is not None and self.kappa.kind != "model":
            raise ValueError(f"kappa {kappa!r} is computed from cached logits; ScoringModel runs model-based κ only")
        self.kappa_args = dict(kappa_args or {})
        self.features = features
        self.forward_calls = 0  # number of batches the network saw (tests check the cache with it)

    def forward(self, images: Tensor) -> Tensor:
        return self.network(images)

    def on_predict_start(self) -> None:
        self.network.eval()  # model-based κ switch only their own layers (dropout) on

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        images, targets, indices, _ = unpack_batch(batch)
        if indices is None:
            raise ValueError("the severity benchmark needs dataset indices in every batch")
        self.forward_calls += 1
        out = {"targets": targets, "indices": indices}
        if self.kappa is not None:
            out["scores"] = self.kappa(self.network, images, **self.kappa_args).float()
            return out
        with torch.no_grad():
            if self.features:
                features = penultimate_features(self.network, images)
                out["features"] = features.float()
                out["logits"] = self.network.get_classifier()(features).float()
            else:
                out["logits"] = self.network(images).float()
        return out
