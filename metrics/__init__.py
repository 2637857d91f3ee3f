"""Pure metric functions and their torchmetrics twins (DESIGN.md §4).

Each metric's module holds the metric, its weighted form over rows of resampling weights and its bootstrap
(``auroc``, ``oscr``, ``gamma``, ``open_set``, ``detection``, ``evg``, ``calibration``; ``ood_benchmark``: the
AURC / AUGRC and the OpenOOD benchmark's table); the weights themselves come from ``resampling``; ``closed_form_intervals`` (DeLong, Newcombe, Wilson, ``auroc_interval``) and
``bootstrap_intervals`` (percentile interval, paired differences) turn estimates and replicates into intervals,
``comparisons`` into marks; ``per_class``: each known class's AUROC against the OOD samples and their
dispersion. This package imports nothing from the rest of the project.
"""

from metrics.auroc import OODAUROC, auroc, bootstrap_auroc, weighted_auroc
from metrics.bootstrap_intervals import paired_difference, percentile_interval, probability_first
from metrics.calibration import bootstrap_accuracy_ece, weighted_calibration_error
from metrics.closed_form_intervals import (
    DeLongParts,
    auroc_interval,
    delong,
    delong_parts,
    newcombe_interval,
    newcombe_variance,
    wilson_interval,
)
from metrics.collect import IndexedPredictions, deduplicate_by_index
from metrics.comparisons import share_first, worse_than_best
from metrics.detection import (
    AUPR_CONVENTIONS,
    FPR_CONVENTIONS,
    aupr_in,
    aupr_out,
    bootstrap_detection,
    detection_intervals,
    fpr_at_tpr,
    fpr_at_tpr_key,
    weighted_aupr,
    weighted_fpr_at_tpr,
)
from metrics.detectors import Detector, build_detector, register_detector, resolve_detector
from metrics.ensemble import (
    MutualInformation,
    expected_entropy,
    member_probabilities,
    mutual_information,
    mutual_information_from_logits,
    predictive_entropy,
)
from metrics.evg import (
    bootstrap_min_rank,
    energy_standardisation,
    min_rank,
    standardised_energy,
    weighted_min_rank,
)
from metrics.gamma import Gamma, gamma, weighted_gamma
from metrics.kappa import KAPPAS, check_kappa, kappa_scores, pairs_with
from metrics.ood_benchmark import (
    BenchmarkTable,
    ResampleCache,
    augrc,
    aurc,
    benchmark_table,
    openood_metrics,
    table_marks,
    weighted_augrc,
    weighted_aurc,
)
from metrics.open_set import GROUPS, bootstrap_open_set, fpr_key, open_set_report
from metrics.oscr import (
    DEFAULT_FPR_TARGETS,
    OSCR,
    CCRAtFPR,
    authors_oscr_curve,
    ccr_at_fpr,
    ccr_from_authors_curve,
    ccr_from_curve,
    closed_set_accuracy,
    max_known_score,
    oscr_curve,
    weighted_ccr_at_fpr,
)
from metrics.per_class import PerClassAUROC, per_class_auroc
from metrics.ranking import kendall_tau, rank_agreement
from metrics.resampling import cluster_weights, resample_weights
from metrics.seeds import SeedMean, seed_mean, seed_mean_replicates
from metrics.severity import (
    TABLE_COLUMNS,
    class_mean_scores,
    level_percentiles,
    level_starts,
    severity_levels,
    severity_table,
)

__all__ = [
    "AUPR_CONVENTIONS",
    "FPR_CONVENTIONS",
    "aupr_in",
    "aupr_out",
    "bootstrap_detection",
    "detection_intervals",
    "fpr_at_tpr",
    "fpr_at_tpr_key",
    "weighted_aupr",
    "weighted_fpr_at_tpr",
    "energy_standardisation",
    "min_rank",
    "standardised_energy",
    "kendall_tau",
    "rank_agreement",
    "PerClassAUROC",
    "per_class_auroc",
    "KAPPAS",
    "TABLE_COLUMNS",
    "Detector",
    "build_detector",
    "register_detector",
    "resolve_detector",
    "class_mean_scores",
    "check_kappa",
    "kappa_scores",
    "pairs_with",
    "level_percentiles",
    "level_starts",
    "severity_levels",
    "severity_table",
    "DEFAULT_FPR_TARGETS",
    "GROUPS",
    "OSCR",
    "CCRAtFPR",
    "Gamma",
    "IndexedPredictions",
    "MutualInformation",
    "expected_entropy",
    "member_probabilities",
    "mutual_information",
    "mutual_information_from_logits",
    "predictive_entropy",
    "OODAUROC",
    "auroc",
    "authors_oscr_curve",
    "ccr_at_fpr",
    "ccr_from_authors_curve",
    "ccr_from_curve",
    "closed_set_accuracy",
    "deduplicate_by_index",
    "fpr_key",
    "gamma",
    "max_known_score",
    "open_set_report",
    "oscr_curve",
    "auroc_interval",
    "bootstrap_accuracy_ece",
    "bootstrap_auroc",
    "bootstrap_min_rank",
    "bootstrap_open_set",
    "cluster_weights",
    "delong",
    "paired_difference",
    "percentile_interval",
    "probability_first",
    "resample_weights",
    "weighted_auroc",
    "weighted_min_rank",
    "SeedMean",
    "seed_mean",
    "seed_mean_replicates",
    "DeLongParts",
    "delong_parts",
    "newcombe_interval",
    "newcombe_variance",
    "weighted_calibration_error",
    "weighted_ccr_at_fpr",
    "weighted_gamma",
    "wilson_interval",
    "share_first",
    "worse_than_best",
    "BenchmarkTable",
    "ResampleCache",
    "augrc",
    "aurc",
    "benchmark_table",
    "openood_metrics",
    "table_marks",
    "weighted_augrc",
    "weighted_aurc",
]
