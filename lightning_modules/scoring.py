"""``ScoringModel``: a fixed classifier to be evaluated (severity benchmark, OSCR), from a name or a checkpoint.

The classifier is any timm or torchvision ImageNet model (``timm:<name>``, ``torchvision:<name>``, weights
from the local cache, extra timm arguments such as ``drop_rate`` through ``model_args``) or a checkpoint of
this project (``path/to/best.ckpt``: an :class:`OpenSetClassifier`). ``forward`` returns the model's full
logits; for a background-class checkpoint ``background_class`` is ``True`` and the last logit is the
background class, which every κ and metric drops *after* the softmax (DESIGN.md §3), never before.

The evaluation itself is done by the callbacks (:class:`callbacks.SeverityAUROC`), which run their own
sharded passes; ``evaluate.py`` runs ``trainer.test`` only to launch the processes and call them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from torch import Tensor, nn

from common import tensors_fingerprint
from lightning_modules.checkpoint import load_module
from lightning_modules.nets.backbones import build_classifier
from lightning_modules.open_set_classifier import OpenSetClassifier


def checkpoint_display_name(path: Path) -> str:
    """``runs/p1-eos/checkpoints/best.ckpt`` -> ``p1-eos-best``; other names -> their stem."""
    return path.stem if path.stem not in ("best", "last") else f"{path.parent.parent.name}-{path.stem}"


def load_scoring_network(
    model: str, *, pretrained: bool = True, pretrained_file: str | None = None, model_args: dict[str, Any] | None = None
) -> tuple[nn.Module, Callable | None, str, bool]:
    """``(network, eval transform or None, display name, background_class)`` for a model name or checkpoint.

    ``ensemble:<file>`` loads a :class:`DeepEnsemble` from a members file (one checkpoint per line, as
    ``train.py ensemble`` writes it) or ``ensemble:<a.ckpt>,<b.ckpt>,...``; its forward gives ``(M, N, C)``.
    """
    if model.startswith("ensemble:"):
        from lightning_modules.nets.ensemble import DeepEnsemble

        ensemble = DeepEnsemble.from_checkpoints(model.removeprefix("ensemble:"))
        name = f"ensemble{ensemble.num_members}-{checkpoint_display_name(Path(ensemble.paths[0]))}"
        return ensemble, None, name, ensemble.background
    if model.endswith(".ckpt"):
        if model_args:
            raise ValueError(f"model_args {sorted(model_args)} apply to timm/torchvision models, not to checkpoint {model}")
        module = load_module(model, expected=OpenSetClassifier)
        return module, None, checkpoint_display_name(Path(model)), bool(module.background_class)
    network, transform = build_classifier(model, pretrained=pretrained, pretrained_file=pretrained_file,
                                          model_args=model_args)
    return network, transform, model.partition(":")[2], False


def weights_fingerprint(network: nn.Module) -> str:
    """sha256 over every parameter and buffer (non-persistent ones too, e.g. an ensemble's stacked weights):
    a cache made with other weights is never reused."""
    return tensors_fingerprint({**dict(network.named_parameters()), **dict(network.named_buffers())})


def penultimate_features(network: nn.Module, images: Tensor) -> Tensor:
    """Pre-logit features: an :class:`OpenSetClassifier`'s deep features, or timm's
    ``forward_features``/``forward_head(pre_logits=True)`` interface."""
    if isinstance(network, OpenSetClassifier):
        return network.network(images)[1]
    if hasattr(network, "forward_features") and hasattr(network, "forward_head"):
        return network.forward_head(network.forward_features(images), pre_logits=True)
    raise ValueError(f"{type(network).__name__} has no forward_features/forward_head: features need a timm model")


class ScoringModel(pl.LightningModule):
    """A fixed classifier for evaluation (see the module docstring).

    Args:
        model: ``timm:<name>``, ``torchvision:<name>`` or a ``.ckpt`` of this project.
        pretrained: load pretrained weights from the local cache (timm/torchvision).
        pretrained_file: explicit weights file (timm).
        model_args: extra keyword arguments of ``timm.create_model`` / torchvision's builder, e.g.
            ``{"drop_rate": 0.2}`` for MC dropout on a timm ResNet.
    """

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        pretrained_file: str | None = None,
        model_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.network, self.eval_transform, self.display_name, self.background_class = load_scoring_network(
            model, pretrained=pretrained, pretrained_file=pretrained_file, model_args=model_args
        )
        self.network.eval()
        self.forward_calls = 0  # batches the network saw (tests check the cache with it)

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(N, C)``; ``C = K+1`` with the background class last for a background-class model."""
        self.forward_calls += 1
        return self.network(images)

    def features(self, images: Tensor) -> Tensor:
        """Penultimate features ``(N, F)`` for feature-based κ."""
        return penultimate_features(self.network, images)

    def fingerprint(self) -> str:
        return weights_fingerprint(self.network)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """Nothing: the evaluation callbacks run their own sharded passes (``evaluate.py``)."""
        return None
