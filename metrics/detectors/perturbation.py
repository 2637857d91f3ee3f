"""Confidence functions κ that score images through the model (DESIGN.md §5.2).

    odin        max_c softmax(f(x̃)/T)_c, x̃ = x - ε sign(∇_x CE(f(x)/T, ŷ)), T = 2, ε = 1e-5
                (Liang, Li, Srikant, ICLR 2018; needs input gradients)
    mc_dropout  Σ_c p̄_c log p̄_c, p̄ = mean of 30 softmax passes with dropout active
                (Gal, Ghahramani, ICML 2016)

Each is a detector of kind ``model`` (:meth:`metrics.detectors.Detector.score_images`): the engine runs its own
pass over a set's images. Background-class models: ODIN predicts ŷ = argmax over the known columns, takes the
softmax over K+1 and the max over the known columns; MC dropout spreads the background mass of the mean
softmax over the known classes, as the ``entropy`` κ does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metrics.detectors.base import check_non_negative, check_positive_int
from metrics.detectors.confidence import _negative_entropy_of_known, softmax_response
from metrics.detectors.function import ScoreFunction
from metrics.detectors.registry import register_detector
from openset_common.labels import known_columns


def _check_gradients_available() -> None:
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "ODIN needs input gradients, which inference mode forbids: run it under "
            "torch.inference_mode(False) (the evaluation callbacks do) or a Trainer with inference_mode=False"
        )


def odin(
    model: nn.Module, images: Tensor, temperature: float = 2.0, epsilon: float = 1e-5, background: bool = False,
    image_space: bool = False,
) -> Tensor:
    """ODIN score: temperature-scaled softmax response after a small input perturbation.

    ``x̃ = x - ε · sign(∇_x CE(f(x)/T, ŷ))`` with ``ŷ = argmax f(x)`` (over the known classes), i.e. a step
    that raises the temperature-scaled softmax score of the predicted class; the score is
    ``max_c softmax(f(x̃)/T)_c``. The model should be in eval mode so that samples do not interact
    (batch norm statistics).

    ``image_space``: ``ε`` is a step of the image in ``[0, 1]``, not of the model's input: on a model whose input is
    normalised by a per-channel ``σ_c`` (its ``model_input.std``: timm and torchvision models) the input steps by
    ``ε / σ_c``, as OpenOOD v1.5's ``odin_postprocessor`` (its ``noise`` divided by the preprocessing's std); a
    model that takes ``[0, 1]`` images steps by ``ε`` either way.
    """
    _check_gradients_available()
    with torch.enable_grad():
        inputs = images.detach().clone().requires_grad_(True)
        logits = model(inputs).float() / temperature
        predicted = known_columns(logits, background).argmax(dim=1)
        # summed, not averaged: each sample's gradient does not depend on the batch size
        loss = F.cross_entropy(logits, predicted, reduction="sum")
        (gradient,) = torch.autograd.grad(loss, inputs)
    step = epsilon * gradient.sign()
    std = getattr(getattr(model, "model_input", None), "std", None) if image_space else None
    if std is not None:
        step = step / torch.as_tensor(std, dtype=step.dtype, device=step.device).view(1, -1, 1, 1)
    perturbed = images.detach() - step
    with torch.no_grad():
        return softmax_response(model(perturbed).float() / temperature, background=background)


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose training flag switches dropout on.

    - ``nn.Dropout`` layers (any ``_DropoutNd``) with ``p > 0``;
    - modules with a ``drop_rate > 0`` attribute and no such dropout layer inside: the timm convention
      for models that apply dropout functionally in their head (ResNet, EfficientNet, ... created with
      ``drop_rate > 0``: ``F.dropout(x, p=self.drop_rate, training=self.training)``).
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    functional = [
        m for m in model.modules()
        if isinstance(getattr(m, "drop_rate", None), (int, float)) and float(m.drop_rate) > 0
        and not any(isinstance(c, nn.modules.dropout._DropoutNd) and c.p > 0 for c in m.modules())
    ]
    return layers + functional


def no_dropout_message(model: nn.Module) -> str:
    """Why MC dropout cannot score ``model`` and what would, for its kind: the evaluation commands' models carry
    their spec (``timm:<name>``, ``torchvision:<name>``, a ``.ckpt`` of ``train.py``, ``module:<class>``)."""
    spec = str(getattr(model, "spec", ""))
    network = getattr(model, "network", model)
    name = f"{spec} ({type(network).__name__})" if spec else type(network).__name__
    retrain = ("train.py with a timm backbone created with dropout (--model.init_args.backbone timm:<name> "
               "--model.init_args.backbone_args '{drop_rate: 0.2}'; timm applies it in the pooled features)")
    if spec.endswith(".ckpt"):
        advice = (f"a checkpoint's network is the one it trained, and it has no dropout layer (--model-arg applies to "
                  f"timm/torchvision models only): MC dropout needs a network trained with dropout, e.g. retrain with "
                  f"{retrain}, or evaluate a timm model created with it (--model timm:<name> --model-arg drop_rate=0.2)")
    elif spec.startswith("timm:"):
        advice = ("create it with dropout in its head: evaluate.py --model-arg drop_rate=0.2 (timm's drop_rate, "
                  "applied to the pooled features)")
    elif spec.startswith("torchvision:"):
        advice = ("a torchvision builder that takes a dropout argument takes it as --model-arg (e.g. vit_b_16: "
                  "--model-arg dropout=0.1); one that does not (the ResNets) has no dropout to switch on: take the "
                  "timm model of the same name with dropout (--model timm:<name> --model-arg drop_rate=0.2)")
    else:
        advice = ("give it nn.Dropout layers with p > 0 (or a drop_rate > 0 applied functionally, timm's convention), "
                  "or evaluate a timm model created with dropout (--model timm:<name> --model-arg drop_rate=0.2)")
    return f"{name} has no dropout with p > 0, so MC dropout would equal the plain entropy: {advice}"


def check_dropout(model: nn.Module) -> None:
    """Refuse a model MC dropout cannot score (no dropout with ``p > 0``), with the advice for its kind
    (:func:`no_dropout_message`): MC dropout's ``model_check``, run before any pass."""
    if not dropout_modules(model):
        raise ValueError(no_dropout_message(model))


def mc_dropout(model: nn.Module, images: Tensor, passes: int = 30, background: bool = False) -> Tensor:
    """Negative entropy of the mean softmax over ``passes`` forward passes with dropout active.

    Only the dropout modules' own training flags are switched on (batch norm and everything else stays in
    eval mode); the flags are restored afterwards. Works for models with ``nn.Dropout`` layers and for timm
    models created with ``drop_rate > 0`` (functional dropout in the head, see :func:`dropout_modules`).
    """
    if passes < 1:
        raise ValueError(f"passes must be positive, got {passes}")
    layers = dropout_modules(model)
    if not layers:
        raise ValueError(no_dropout_message(model))
    modes = [layer.training for layer in layers]
    try:
        for layer in layers:
            layer.training = True  # this module only: its children keep their modes
        with torch.no_grad():
            mean = sum(torch.softmax(model(images).float(), dim=1) for _ in range(passes)) / passes
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.training = mode
    return _negative_entropy_of_known(mean, background)


@register_detector
class ODIN(ScoreFunction):
    """ODIN (see the module docstring).

    Hyperparameters:
        temperature: ``T > 0`` (default 2, Galil et al.'s setting).
        epsilon: the step ``ε >= 0`` (default 1e-5).
        image_space: ``ε`` in the units of the ``[0, 1]`` image (``ε / σ_c`` on a normalised model input, as OpenOOD's
            noise; default ``False``: in the model input's units, as Liang et al.'s code and Galil et al.).
    """

    name, paper, kernel = "odin", "Liang et al., ICLR 2018", odin
    inputs = frozenset({"model"})

    def __init__(self, *, temperature: float = 2.0, epsilon: float = 1e-5, background: bool = False,
                 image_space: bool = False) -> None:
        super().__init__(background=background)
        self.temperature = check_non_negative("temperature", temperature, detector=self.name, positive=True)
        self.epsilon = check_non_negative("epsilon", epsilon, detector=self.name)
        if not isinstance(image_space, bool):
            raise ValueError(f"detector {self.name!r}: image_space must be true or false, got {image_space!r}")
        self.image_space = image_space

    def passes_per_image(self) -> tuple[int, int]:
        """A forward with the input's gradient, its backward, the perturbed input's forward."""
        return (2, 1)


@register_detector
class MCDropout(ScoreFunction):
    """MC dropout (see the module docstring): refuses, before any pass, a model without dropout.

    Hyperparameters:
        passes: forward passes with dropout active (default 30).
    """

    name, paper, kernel = "mc_dropout", "Gal & Ghahramani, ICML 2016", mc_dropout
    inputs = frozenset({"model"})

    def __init__(self, *, passes: int = 30, background: bool = False) -> None:
        super().__init__(background=background)
        self.passes = check_positive_int("passes", passes, detector=self.name)

    def passes_per_image(self) -> tuple[int, int]:
        return (self.passes, 0)

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        check_dropout(model)
