"""Pure metric functions and their torchmetrics twins (DESIGN.md §4).

This package imports nothing from the rest of the project.
"""

from metrics.auroc import OODAUROC, auroc
from metrics.collect import IndexedPredictions, deduplicate_by_index
from metrics.comparisons import share_first, worse_than_best
from metrics.ensemble import (
    MutualInformation,
    expected_entropy,
    member_probabilities,
    mutual_information,
    mutual_information_from_logits,
    predictive_entropy,
)
from metrics.evg import energy_standardisation, min_rank, standardised_energy
from metrics.gamma import Gamma, gamma
from metrics.intervals import (
    DeLongParts,
    auroc_interval,
    bootstrap_accuracy_ece,
    bootstrap_auroc,
    bootstrap_min_rank,
    bootstrap_open_set,
    cluster_weights,
    delong,
    delong_parts,
    newcombe_interval,
    paired_difference,
    percentile_interval,
    probability_first,
    resample_weights,
    weighted_auroc,
    weighted_min_rank,
    wilson_interval,
)
from metrics.kappa import KAPPAS, Kappa, check_kappa, from_pytorch_ood, get_kappa, kappa_scores, pairs_with
from metrics.open_set import GROUPS, fpr_key, open_set_report
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
)
from metrics.ranking import kendall_tau, rank_agreement
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
    "energy_standardisation",
    "min_rank",
    "standardised_energy",
    "kendall_tau",
    "rank_agreement",
    "KAPPAS",
    "TABLE_COLUMNS",
    "Kappa",
    "class_mean_scores",
    "check_kappa",
    "from_pytorch_ood",
    "kappa_scores",
    "pairs_with",
    "get_kappa",
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
    "wilson_interval",
    "share_first",
    "worse_than_best",
]
