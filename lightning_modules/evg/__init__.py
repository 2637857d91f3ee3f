"""EvG, the adversarial generation of outliers (Yoon et al.; DESIGN.md §5.4): variation models (and their
registry), samplers (and theirs), the chains' random numbers, the detector and the search module."""

from lightning_modules.evg.black_box import BlackBox
from lightning_modules.evg.samplers import OWN_BUDGET, SAMPLERS, SearchResult, budget_of
from lightning_modules.evg.search import AdversarialSearch, EvGSearch, search_pairs
from lightning_modules.evg.variations import (
    AFFINE_PRESETS,
    COLOUR_PRESETS,
    VARIATIONS,
    AffineVariation,
    ColourVariation,
    Domain,
    LatentVariation,
    PixelPerturbation,
    PresetSizeWarning,
    build_variation,
    default_affine_preset,
    resolve_generator,
)

__all__ = [
    "AFFINE_PRESETS",
    "COLOUR_PRESETS",
    "OWN_BUDGET",
    "SAMPLERS",
    "VARIATIONS",
    "AdversarialSearch",
    "AffineVariation",
    "ColourVariation",
    "BlackBox",
    "Domain",
    "EvGSearch",
    "LatentVariation",
    "PixelPerturbation",
    "PresetSizeWarning",
    "SearchResult",
    "budget_of",
    "build_variation",
    "default_affine_preset",
    "resolve_generator",
    "search_pairs",
]
