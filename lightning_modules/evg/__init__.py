"""EvG, the adversarial generation of outliers (Yoon et al.; DESIGN.md §5.4): variation models (and their
registry), samplers (and theirs), the chains' random numbers, the detector and the search module."""

from lightning_modules.evg.detector import Detector
from lightning_modules.evg.samplers import SAMPLERS, SearchResult
from lightning_modules.evg.search import AdversarialSearch, EvGSearch, search_pairs
from lightning_modules.evg.variations import (
    VARIATIONS,
    AffineVariation,
    ColourVariation,
    Domain,
    LatentVariation,
    PixelPerturbation,
    build_variation,
)

__all__ = [
    "SAMPLERS",
    "VARIATIONS",
    "AdversarialSearch",
    "AffineVariation",
    "ColourVariation",
    "Detector",
    "Domain",
    "EvGSearch",
    "LatentVariation",
    "PixelPerturbation",
    "SearchResult",
    "build_variation",
    "search_pairs",
]
