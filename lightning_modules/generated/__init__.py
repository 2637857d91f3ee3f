"""Mukhoti et al.'s generated shifted and near-OOD sets: the regularised generators (DESIGN.md §5.3)."""

from lightning_modules.generated.generators import NearOODGenerator, RegularisedGenerator, ShiftGenerator
from lightning_modules.generated.modes import GENERATION_MODES, generation_mode

__all__ = ["GENERATION_MODES", "NearOODGenerator", "RegularisedGenerator", "ShiftGenerator", "generation_mode"]
