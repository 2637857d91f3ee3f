"""Confidence functions κ: higher means more in-distribution, every κ returns shape ``(N,)``.

The κ of Galil, Dabbah, El-Yaniv (ICLR 2023), DESIGN.md §5.2:

    softmax     max_c softmax(z)_c                               (softmax response)
    max_logit   max_c z_c
    entropy     Σ_c p_c log p_c, p = softmax(z)                   (negative entropy)
    energy      T log Σ_c exp(z_c / T), T = 1                     (negative energy; pytorch-ood's EnergyBased)
    odin        max_c softmax(f(x̃)/T)_c, x̃ = x - ε sign(∇_x CE(f(x)/T, ŷ)), T = 2, ε = 1e-5
                (Liang, Li, Srikant, ICLR 2018; needs input gradients: Trainer(inference_mode=False))
    mc_dropout  Σ_c p̄_c log p̄_c, p̄ = mean of 30 softmax passes with dropout active
                (Gal, Ghahramani, ICML 2016)

Logit-based κ (``kind == "logits"``) take logits ``(N, C)``, so many κ can share one cached forward
pass; model-based κ (``kind == "model"``) take ``(model, images)``. :func:`from_pytorch_ood` turns any
pytorch-ood detector into a κ (its outlier score negated), so Energy, ViM, KNN, Mahalanobis ... work too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KappaKind = Literal["logits", "features", "model"]


@dataclass(frozen=True)
class Kappa:
    """A named confidence function and what it takes (``logits``, ``features`` or ``model`` + images)."""

    name: str
    fn: Callable[..., Tensor]
    kind: KappaKind

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.fn(*args, **kwargs)


def _as_float(logits: Tensor) -> Tensor:
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, C), got {tuple(logits.shape)}")
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def softmax_response(logits: Tensor) -> Tensor:
    """``max_c softmax(z)_c``."""
    return torch.softmax(_as_float(logits), dim=1).max(dim=1).values


def max_logit(logits: Tensor) -> Tensor:
    """``max_c z_c``."""
    return _as_float(logits).max(dim=1).values


def negative_entropy(logits: Tensor) -> Tensor:
    """``Σ_c p_c log p_c`` of ``p = softmax(z)`` (``0 log 0 = 0``); the negative of the entropy."""
    log_p = torch.log_softmax(_as_float(logits), dim=1)
    return (log_p.exp() * log_p).sum(dim=1)


def _check_gradients_available() -> None:
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "ODIN needs input gradients, which inference mode forbids: run the Trainer with inference_mode=False"
        )


def odin(model: nn.Module, images: Tensor, temperature: float = 2.0, epsilon: float = 1e-5) -> Tensor:
    """ODIN score: temperature-scaled softmax response after a small input perturbation.

    ``x̃ = x - ε · sign(∇_x CE(f(x)/T, ŷ))`` with ``ŷ = argmax f(x)``, i.e. a step that raises the
    temperature-scaled softmax score of the predicted class; the score is ``max_c softmax(f(x̃)/T)_c``.
    The model should be in eval mode so that samples do not interact (batch norm statistics).
    """
    _check_gradients_available()
    with torch.enable_grad():
        inputs = images.detach().clone().requires_grad_(True)
        logits = model(inputs).float() / temperature
        # summed, not averaged: each sample's gradient does not depend on the batch size
        loss = F.cross_entropy(logits, logits.argmax(dim=1), reduction="sum")
        (gradient,) = torch.autograd.grad(loss, inputs)
    perturbed = images.detach() - epsilon * gradient.sign()
    with torch.no_grad():
        return torch.softmax(model(perturbed).float() / temperature, dim=1).max(dim=1).values


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """The dropout layers of a model that drop anything (``p > 0``)."""
    return [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def mc_dropout(model: nn.Module, images: Tensor, passes: int = 30) -> Tensor:
    """Negative entropy of the mean softmax over ``passes`` forward passes with dropout active.

    Only the dropout layers are switched to training mode (batch norm stays in eval mode); their modes
    are restored afterwards.
    """
    layers = dropout_modules(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no dropout layer with p > 0: MC dropout would equal the plain "
            "entropy (for timm models, create them with drop_rate > 0)"
        )
    modes = [layer.training for layer in layers]
    try:
        for layer in layers:
            layer.train()
        with torch.no_grad():
            mean = sum(torch.softmax(model(images).float(), dim=1) for _ in range(passes)) / passes
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.train(mode)
    return torch.special.xlogy(mean, mean).sum(dim=1)


def from_pytorch_ood(detector: Any, *, name: str, kind: KappaKind = "logits") -> Kappa:
    """Wrap a pytorch-ood detector as a κ: ``κ = -outlier score`` (pytorch-ood: higher = more OOD).

    Args:
        detector: e.g. ``pytorch_ood.detector.EnergyBased(model=None)``; fitted detectors (Mahalanobis,
            KNN, ViM) must be fitted on in-distribution data first.
        kind: ``"logits"`` calls ``predict_logits``, ``"features"`` calls ``predict_features``, ``"model"``
            calls ``predict(images)`` (the detector holds the model; the model argument is ignored).
    """
    if kind == "logits":
        return Kappa(name, lambda logits: -detector.predict_logits(_as_float(logits)), kind)
    if kind == "features":
        return Kappa(name, lambda features: -detector.predict_features(features), kind)
    if kind == "model":
        return Kappa(name, lambda model, images: -detector.predict(images), kind)
    raise ValueError(f"kind must be 'logits', 'features' or 'model', got {kind!r}")


def _energy() -> Kappa:
    from pytorch_ood.detector import EnergyBased

    return from_pytorch_ood(EnergyBased(model=None), name="energy", kind="logits")


KAPPAS: dict[str, Kappa] = {
    "softmax": Kappa("softmax", softmax_response, "logits"),
    "max_logit": Kappa("max_logit", max_logit, "logits"),
    "entropy": Kappa("entropy", negative_entropy, "logits"),
    "energy": _energy(),
    "odin": Kappa("odin", odin, "model"),
    "mc_dropout": Kappa("mc_dropout", mc_dropout, "model"),
}


def get_kappa(name: str) -> Kappa:
    if name not in KAPPAS:
        raise ValueError(f"unknown confidence function {name!r}; choose from {sorted(KAPPAS)}")
    return KAPPAS[name]
