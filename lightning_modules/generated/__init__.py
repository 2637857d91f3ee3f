"""Mukhoti et al.'s generated shifted and near-OOD sets: the regularised generators (DESIGN.md §5.3)."""

from lightning_modules.generated.generators import NearOODGenerator, RegularisedGenerator, ShiftGenerator

__all__ = ["NearOODGenerator", "RegularisedGenerator", "ShiftGenerator"]
