"""OOD detectors with fitted state (DESIGN.md §5.2): one interface, :class:`metrics.detectors.base.Detector`.

:data:`DETECTORS` maps every registry name to its class; :func:`build_detector` makes one by name (``pood:<Class>``
for any pytorch-ood detector that scores a model's outputs, :mod:`metrics.detectors.pood`):

    mahalanobis            Lee et al. 2018, tied-covariance class Gaussians          features
    relative_mahalanobis   Ren et al. 2021, minus one Gaussian of all fit features   features
    knn                    Sun et al. 2022, k = 50 on the whole fit set              features
    knn_imagenet           the same, k = 10 on a 1% fit sample                       features
    vim                    Wang et al. 2022, residual against energy                 features + head
    react                  Sun et al. 2021, energy of clipped features               features + head
    ash_s, ash_p, ash_b    Djurisic et al. 2023, energy of shaped features           features + head (no fit data)
    scale                  Xu et al. 2024, energy of scaled features                 features + head (no fit data)
    she                    Zhang et al. 2023, features · pattern of the prediction   features + logits
    gen                    Liu et al. 2023, generalised entropy                      logits (no fit)
    dice                   Sun & Li 2022, energy of a sparsified head                features + head

Every score is float64 ``(N,)``, higher = more in-distribution; each module's docstring has the formula, the
paper, the defaults and where they come from, and the memory bound.
"""

from __future__ import annotations

import inspect
from typing import Any

from metrics.detectors.ash import ASH, ASHB, ASHP, ASHS
from metrics.detectors.base import CHUNK_ROWS, Detector, DetectorNotFitted, Head, row_chunks
from metrics.detectors.dice import DICE
from metrics.detectors.gen import GEN
from metrics.detectors.knn import KNN, KNNImageNet
from metrics.detectors.mahalanobis import Mahalanobis, RelativeMahalanobis
from metrics.detectors.react import ReAct
from metrics.detectors.scale import SCALE
from metrics.detectors.she import SHE
from metrics.detectors.vim import ViM

POOD_PREFIX = "pood:"

DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (
    Mahalanobis, RelativeMahalanobis, KNN, KNNImageNet, ViM, ReAct, ASHS, ASHP, ASHB, SCALE, SHE, GEN, DICE)}


def detector_hyperparameters(cls: type[Detector]) -> dict[str, Any]:
    """A registry class's hyperparameters with their defaults (its keyword-only constructor arguments)."""
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind == p.KEYWORD_ONLY and name != "background"}


def build_detector(name: str, *, background: bool = False, **hyperparameters: Any) -> Detector:
    """The detector ``name`` (a key of :data:`DETECTORS`, or ``pood:<pytorch-ood class>``), unfitted.

    Raises:
        ValueError: an unknown name or hyperparameter (naming it and listing the valid ones), or an invalid
            value (naming it).
    """
    if name.startswith(POOD_PREFIX):
        from metrics.detectors.pood import pood_detector

        return pood_detector(name[len(POOD_PREFIX):], background=background, **hyperparameters)
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; choose from {sorted(DETECTORS)} or pood:<a pytorch-ood "
                         "detector class>")
    cls = DETECTORS[name]
    valid = detector_hyperparameters(cls)
    unknown = sorted(set(hyperparameters) - set(valid))
    if unknown:
        raise ValueError(f"detector {name!r} has no hyperparameter {unknown[0]!r}; it takes {sorted(valid) or 'none'}")
    return cls(background=background, **hyperparameters)


__all__ = [
    "ASH", "ASHB", "ASHP", "ASHS", "CHUNK_ROWS", "DETECTORS", "DICE", "GEN", "KNN", "POOD_PREFIX", "SCALE", "SHE",
    "Detector", "DetectorNotFitted", "Head", "KNNImageNet", "Mahalanobis", "ReAct", "RelativeMahalanobis", "ViM",
    "build_detector", "detector_hyperparameters", "row_chunks",
]
