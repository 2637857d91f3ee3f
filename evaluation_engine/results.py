"""What an evaluation returns: :class:`MethodResult`, its method's tables with their headline :class:`Estimate` s,
bootstrap replicates, resampled units and :class:`Figure` s (DESIGN.md §2).

Every callback's ``evaluate`` returns one (severity, the generated benchmarks, EvG, OSCR, a plug-in's), so the
command, Python and the report card read the same object in memory; :mod:`evaluation_methods.registry` turns
results into the card's sections.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor


def number(value: Any) -> float | None:
    """A finite float, or ``None`` (missing, empty, nan)."""
    if value is None or value == "":
        return None
    value = float(value)
    return None if math.isnan(value) else value


@dataclasses.dataclass
class Estimate:
    """One headline number of one (model, κ): its value and interval, the bootstrap replicates it was compared
    by (``None``: not comparable), and ``units``, the identity of the units those replicates resampled (only
    estimates of the same units are paired on the leaderboard). ``fit_overlap``: the note of the method's tables
    when the detector's fit set holds images of the data the number was measured on (allowed by
    ``--allow-fit-overlap``, :meth:`evaluation_engine.scoring.ScoringPasses.fit_notes`); the leaderboard marks
    the cell."""

    model: str
    kappa: str
    key: str
    value: float | None
    low: float | None = None
    high: float | None = None
    replicates: Tensor | None = None
    units: str = ""
    fit_overlap: str = ""

    def __post_init__(self) -> None:
        self.value, self.low, self.high = number(self.value), number(self.low), number(self.high)


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure a method wrote: its title, its file, what it shows."""

    title: str
    path: Path
    caption: str = ""


class MethodResult(dict):
    """What a method's command returns: its own tables (this mapping: the keys the command always returned),
    and as attributes its folder, its headline :attr:`estimates`, every reported number's bootstrap
    :attr:`replicates`, the :attr:`units` they resampled and its :attr:`figures`."""

    def __init__(self, method: str, tables: Mapping[str, Any], *, folder: str | Path | None = None,
                 estimates: Sequence[Estimate] = (), replicates: Mapping[str, Tensor] | None = None,
                 units: str = "", figures: Sequence[Figure] = ()) -> None:
        super().__init__(tables)
        self.method = method
        self.folder = Path(folder) if folder is not None else None
        self.estimates = list(estimates)
        # as replicates.pt holds them: float64 on the CPU (a comparison reads the same numbers from either)
        self.replicates = {k: v.detach().double().cpu() for k, v in (replicates or {}).items()}
        self.units = units
        self.figures = list(figures)

    def figure(self, title: str, path: str | Path, caption: str = "") -> None:
        """Add a figure the method wrote (a file that is not there is left out: plots off)."""
        if Path(path).is_file():
            self.figures.append(Figure(title, Path(path), caption))
