"""A (model, κ) pair as EvG's black-box OOD detector (Yoon et al.; DESIGN.md §5.4).

:class:`Detector` turns any scoring model of this project -- a timm or torchvision classifier, a checkpoint,
a deep ensemble -- and any κ of :data:`metrics.KAPPAS` (pytorch-ood detectors wrapped as κ too) into a black
box: ``scores(images)`` is κ (higher = more in-distribution) of the images a variation model makes, and
``energy(images)`` the standardised outlier score ``(-κ - μ) / (σ + 1e-3)``. No detector gradients are used
by the search.

The images arrive as float tensors in ``[0, 1]`` at the search's image size (the seeds' pipeline); the
detector brings them to its model's input (channels, size) and applies the model's normalisation, then
scores them through the same outputs and κ dispatch as every other method
(:func:`lightning_modules.scoring.forward_outputs`, :func:`metrics.kappa_scores`).

μ and σ are the fitted state of the detector: buffers (``energy_mean``, ``energy_scale``, float64), set by
one explicit call, :meth:`fit_standardisation`, from in-distribution scores, saved with the run, NaN until
then (an energy asked of an unfitted detector is an error).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.scoring import ScoringModel, forward_outputs
from metrics import Kappa, check_kappa, energy_standardisation, get_kappa, kappa_scores, standardised_energy


class Detector(nn.Module):
    """A (model, κ) pair as a black-box OOD detector (see the module docstring).

    Args:
        model: the scoring model (its network, input and background rule).
        kappa: the confidence function (a name of :data:`metrics.KAPPAS` or a :class:`metrics.Kappa`).
        name: how tables call it, e.g. ``demo-best/softmax`` (default: ``<model>/<κ>``).
        kappa_args: keyword arguments of κ (e.g. ODIN's temperature).

    Raises:
        ValueError: a κ the model cannot serve (an ensemble κ on one model, ...), naming both.
    """

    def __init__(self, model: ScoringModel, kappa: str | Kappa, *, name: str | None = None,
                 kappa_args: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.kappa = get_kappa(kappa) if isinstance(kappa, str) else kappa
        check_kappa(self.kappa, model=model.display_name, ensemble=model.ensemble, background=model.background_class)
        self.name = name or f"{model.display_name}/{self.kappa.name}"
        self.background = model.background_class
        self.kappa_args = self.kappa.parameters(**(kappa_args or {}))
        self.register_buffer("energy_mean", torch.tensor(float("nan"), dtype=torch.float64))
        self.register_buffer("energy_scale", torch.tensor(float("nan"), dtype=torch.float64))

    def fingerprint(self) -> str:
        return self.model.fingerprint()

    def adapt(self, images: Tensor) -> Tensor:
        """Images ``(N, C, H, W)`` in ``[0, 1]`` -> the model's input: its channels (the mean of the channels,
        or repeated to 3), its size (bilinear, antialiased) and its normalisation."""
        model_input = self.model.model_input
        channels = model_input.channels
        if channels is not None and images.shape[1] != channels:
            images = images.mean(dim=1, keepdim=True) if channels == 1 else images.expand(-1, channels, -1, -1)
        if model_input.size is not None and tuple(images.shape[-2:]) != tuple(model_input.size):
            images = F.interpolate(images, size=tuple(model_input.size), mode="bilinear", align_corners=False,
                                   antialias=True)
        return model_input.normalise(images)

    def scores(self, images: Tensor) -> Tensor:
        """κ ``(N,)`` (float32) of images ``(N, C, H, W)`` in ``[0, 1]``."""
        inputs = self.adapt(images)
        if self.kappa.kind == "model":  # e.g. ODIN: its own pass (with input gradients where it needs them)
            outputs = {f"scores/{self.kappa.name}": self.kappa(self.model, inputs, background=self.background,
                                                                **self.kappa_args)}
        else:
            with torch.no_grad():
                outputs = forward_outputs(self.model, inputs, features=self.kappa.kind == "features")
        return kappa_scores(self.kappa, outputs, background=self.background, parameters=self.kappa_args).detach().float()

    @property
    def standardised(self) -> bool:
        return bool(torch.isfinite(self.energy_mean) and torch.isfinite(self.energy_scale))

    def fit_standardisation(self, id_kappa: Tensor) -> None:
        """Set μ and σ + 1e-3 of ``-κ`` on in-distribution images (:func:`metrics.energy_standardisation`)."""
        mean, scale = energy_standardisation(id_kappa)
        self.energy_mean.fill_(mean)
        self.energy_scale.fill_(scale)

    def energy(self, images: Tensor) -> Tensor:
        if not self.standardised:
            raise RuntimeError(f"{self.name}: call fit_standardisation with in-distribution scores before the search")
        return standardised_energy(self.scores(images), float(self.energy_mean), float(self.energy_scale))
