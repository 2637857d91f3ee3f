"""Pure metric functions and their torchmetrics twins (DESIGN.md §4).

This package imports nothing from the rest of the project.
"""

from metrics.auroc import OODAUROC, auroc
from metrics.collect import IndexedPredictions, deduplicate_by_index
from metrics.gamma import Gamma, gamma
from metrics.oscr import (
    DEFAULT_FPR_TARGETS,
    OSCR,
    CCRAtFPR,
    ccr_at_fpr,
    ccr_from_curve,
    closed_set_accuracy,
    max_known_score,
    oscr_curve,
)
from metrics.report import GROUPS, fpr_key, open_set_report

__all__ = [
    "DEFAULT_FPR_TARGETS",
    "GROUPS",
    "OSCR",
    "CCRAtFPR",
    "Gamma",
    "IndexedPredictions",
    "OODAUROC",
    "auroc",
    "ccr_at_fpr",
    "ccr_from_curve",
    "closed_set_accuracy",
    "deduplicate_by_index",
    "fpr_key",
    "gamma",
    "max_known_score",
    "open_set_report",
    "oscr_curve",
]
