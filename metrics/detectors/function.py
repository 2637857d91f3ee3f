"""Confidence functions with no fit: a detector whose score is one function of the pass's outputs.

:class:`ScoreFunction` is the base of the κ of Galil et al. (softmax response, max logit, entropy, energy,
:mod:`metrics.detectors.confidence`), the deep-ensemble κ of Mukhoti et al. (:mod:`metrics.detectors.ensemble`)
and the κ that score images through the model (ODIN, MC dropout, :mod:`metrics.detectors.perturbation`). Its
``kernel`` is the pure scoring function, called with the detector's hyperparameters and ``background``:

    kind "logits"     kernel(logits (N, C), background, **hyperparameters)
    kind "ensemble"   kernel(member logits (M, N, C), background, ...)   (metrics.ensemble's layout: the pass's
                      (N, M, C) is transposed here, the one place)
    kind "model"      kernel(model, images, background, ...)             (:meth:`Detector.score_images`)

:data:`metrics.KAPPAS` calls the kernels directly (``KAPPAS["softmax"](logits, background=True)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor, nn

from metrics.detectors.base import Detector


class ScoreFunction(Detector):
    """A detector with an empty fit whose score is :attr:`kernel` (see the module docstring)."""

    kernel: ClassVar[Callable[..., Tensor]]

    def _score(self, outputs: dict[str, Tensor]) -> Tensor:
        logits = outputs["logits"]
        if self.kind == "ensemble":
            logits = logits.transpose(0, 1)  # the pass's (N, M, C) -> metrics.ensemble's (M, N, C), a view
        return type(self).kernel(logits, background=self.background, **self.hyperparameters())

    def score_images(self, model: nn.Module, images: Tensor) -> Tensor:
        if self.kind != "model":
            return super().score_images(model, images)
        return type(self).kernel(model, images, background=self.background, **self.hyperparameters())

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kernel = cls.__dict__.get("kernel")
        if kernel is not None and not isinstance(kernel, staticmethod):
            cls.kernel = staticmethod(kernel)  # a plain function as a class attribute would bind as a method
