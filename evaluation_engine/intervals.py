"""The intervals of the evaluation engine: :class:`Intervals` (the confidence level, bootstrap resamples, seed
and AUROC method of every interval a method reports), the ``<metric> low`` / ``<metric> high`` columns
(:func:`interval_columns`) and the detector metrics beside the AUROC (:data:`DETECTION_METRICS`,
:func:`detection_columns`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from metrics import (
    aupr_in,
    aupr_out,
    auroc_interval,
    bootstrap_detection,
    fpr_at_tpr,
    percentile_interval,
    wilson_interval,
)
from openset_common.typed import dataclass_of


@dataclass
class Intervals:
    """The confidence intervals of every reported number.

    Attributes:
        level: the confidence level (0.95: 95% intervals).
        resamples: bootstrap resamples ``B`` (percentile intervals; the replicates are also what the report card
            compares detectors with).
        seed: the bootstrap's seed. Resamples depend on (seed, resampling unit, size) only, and the weights are
            keyed by the identity of the resampled unit (image index, pool class, seed image), so two detectors
            scored on the same units are resampled alike: their differences are paired.
        auroc_method: the AUROC interval (:func:`metrics.auroc_interval`): ``auto`` (the default: logit DeLong
            where enough samples overlap, else Newcombe's score interval), ``logit``, ``newcombe``, ``delong``
            (Wald), ``bootstrap``.

    What the intervals are about: the sampling of the test data (images, classes, chains) for one trained
    model, not the variance over training runs (a report card model of several seeds adds that). Computed
    from gathered data on every rank, so equal on 1 and N processes. Coverage of every interval type:
    ``benchmarks/interval_coverage.py`` (RESULTS.md).
    """

    level: float = 0.95
    resamples: int = 1000
    seed: int = 0
    auroc_method: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0.0 < float(self.level) < 1.0:
            raise ValueError(f"the confidence level must lie in (0, 1), got {self.level!r}")
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, int) or self.resamples < 10:
            raise ValueError(f"bootstrap intervals need a whole number of at least 10 resamples, got {self.resamples!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"the bootstrap seed must be a non-negative integer, got {self.seed!r}")
        if self.auroc_method not in AUROC_METHODS:
            raise ValueError(f"auroc_method must be one of {AUROC_METHODS}, got {self.auroc_method!r}")

    @classmethod
    def of(cls, value: Intervals | dict[str, Any] | None) -> Intervals:
        """The intervals from ``None`` (the defaults), a mapping of their names (``{"level": 0.9}`` from Python
        or YAML), or themselves."""
        return dataclass_of(cls, value, what="intervals")

    def bounds(self, replicates: Tensor) -> tuple[float | None, float | None]:
        """The percentile interval of bootstrap replicates (None, None where every replicate is NaN)."""
        low, high = percentile_interval(replicates, self.level)
        return (None if math.isnan(low) else low), (None if math.isnan(high) else high)

    def auroc(self, id_scores: Tensor, ood_scores: Tensor, *,
              ood_clusters: Tensor | None = None) -> tuple[float | None, float | None]:
        """The interval of the AUROC of ID (positive) vs OOD scores by :attr:`auroc_method`
        (:func:`metrics.auroc_interval`; ``ood_clusters``: the unit of each OOD sample, e.g. an EvG chain's
        seed image)."""
        return auroc_interval(id_scores, ood_scores, level=self.level, method=self.auroc_method,
                              resamples=self.resamples, seed=self.seed, ood_clusters=ood_clusters)

    def detection(self, id_scores: Tensor, ood_scores: Tensor, *, id_weights: Tensor | None = None,
                  ood_weights: Tensor | None = None) -> tuple[dict[str, float | None], dict[str, Tensor]]:
        """The field's detector metrics beside the AUROC (:data:`DETECTION_COLUMNS`): FPR at 95% TPR (ID
        positive: the OOD share accepted where 95% of ID is; :func:`metrics.fpr_at_tpr`), AUPR-In and AUPR-Out
        (the trapezoid, as pytorch-ood's ``OODMetrics`` and OpenOOD's ``compute_all_metrics``), each with its
        percentile bootstrap interval; the weights default to the AUROC's (ID stratum 0, OOD stratum 1, the
        same seed), so replicate ``b`` pairs with AUROC replicate ``b``. Returns the row's values and the
        replicates by column."""
        replicates = bootstrap_detection(id_scores, ood_scores, self.resamples, self.seed, id_weights=id_weights,
                                         ood_weights=ood_weights)
        row: dict[str, float | None] = {"fpr@95tpr": fpr_at_tpr(id_scores, ood_scores),
                                        "aupr-in": aupr_in(id_scores, ood_scores),
                                        "aupr-out": aupr_out(id_scores, ood_scores)}
        named = {"fpr@95tpr": replicates["fpr@95tpr"], "aupr-in": replicates["aupr_in"],
                 "aupr-out": replicates["aupr_out"]}
        for column, values in named.items():
            with_bounds(row, column, self.bounds(values))
        return row, named

    def proportion(self, successes: int, trials: int) -> tuple[float, float]:
        """Wilson's interval of the proportion ``successes / trials`` (an accuracy): a percentile bootstrap of a
        proportion has zero width whenever every image is right (14% of 20-image samples at accuracy 0.91) and
        covered 0.85 / 0.90 at 20 / 50 images in ``benchmarks/interval_coverage.py``."""
        return wilson_interval(int(successes), int(trials), self.level)

    def count(self, successes: int, trials: int) -> tuple[float, float]:
        """Wilson's interval of a count of ``successes`` of ``trials`` (e.g. MinRank: the ID test images above a
        fixed worst case), in whole counts (the lower bound floored, the upper ceiled)."""
        low, high = wilson_interval(int(successes), int(trials), self.level)
        return float(math.floor(low * trials + 1e-9)), float(math.ceil(high * trials - 1e-9))

    def describe(self) -> str:
        return (f"{self.level:.0%} intervals ({self.resamples} bootstrap resamples, seed {self.seed}; AUROC "
                f"{AUROC_DESCRIPTIONS[self.auroc_method]})")


AUROC_METHODS = ("auto", "logit", "newcombe", "delong", "bootstrap")
AUROC_DESCRIPTIONS = {
    "auto": "logit DeLong, Newcombe's score interval where fewer than 40 samples of a side overlap the other",
    "logit": "logit DeLong", "newcombe": "Newcombe's score interval", "delong": "DeLong's Wald interval",
    "bootstrap": "percentile bootstrap"}


def interval_columns(*metrics: str) -> tuple[str, ...]:
    """``("auroc low", "auroc high", ...)``: the interval columns of the given metric columns."""
    return tuple(f"{metric} {side}" for metric in metrics for side in ("low", "high"))


DETECTION_METRICS = ("fpr@95tpr", "aupr-in", "aupr-out")
"""The detector metrics beside the AUROC in every AUROC table (:meth:`Intervals.detection`)."""


DETECTION_NOTE = ("fpr@95tpr: the share of OOD images accepted at the threshold that accepts 95% of the ID images "
                  "(ID positive, the ODIN and energy papers' definition; pytorch-ood and OpenOOD v1.5 fix 95% of OOD "
                  "instead: metrics.fpr_at_tpr(convention='ood') is pytorch-ood's, convention='openood' OpenOOD's, "
                  "whose ROC drops some tied thresholds; evaluate.py ood reports both beside each other); aupr-in / aupr-out: the trapezoid area under the "
                  "precision-recall curve with ID / OOD positive, as pytorch-ood and OpenOOD; their intervals a "
                  "percentile bootstrap on the AUROC's resamples.")


def detection_columns() -> tuple[str, ...]:
    """The detector metrics and their interval columns, in table order."""
    return (*DETECTION_METRICS, *interval_columns(*DETECTION_METRICS))


def with_bounds(row: dict[str, Any], metric: str, bounds: tuple[float | None, float | None]) -> dict[str, Any]:
    """``row`` with ``<metric> low`` and ``<metric> high`` set (in place; returned for chaining)."""
    row[f"{metric} low"], row[f"{metric} high"] = bounds
    return row


