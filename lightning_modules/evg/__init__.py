"""EvG, the adversarial generation of outliers (Yoon et al.; DESIGN.md §5.4): variation models, samplers, the
chains' random numbers, the detector and the search module."""

from lightning_modules.evg.samplers import SAMPLERS, SearchResult
from lightning_modules.evg.search import AdversarialSearch, Detector
from lightning_modules.evg.variations import (
    AffineVariation,
    ColourVariation,
    Domain,
    LatentVariation,
    PixelPerturbation,
)

__all__ = [
    "SAMPLERS",
    "AdversarialSearch",
    "AffineVariation",
    "ColourVariation",
    "Detector",
    "Domain",
    "LatentVariation",
    "PixelPerturbation",
    "SearchResult",
]
