"""metrics/__init__.py: DESIGN.md §4's public names, each weighted kernel and bootstrap exported from the module
of its metric, and no ``metrics.intervals`` drawer left."""

from __future__ import annotations

import importlib.machinery

import metrics

HOMES = {
    "auroc": "metrics.auroc", "weighted_auroc": "metrics.auroc", "bootstrap_auroc": "metrics.auroc",
    "min_rank": "metrics.evg", "weighted_min_rank": "metrics.evg", "bootstrap_min_rank": "metrics.evg",
    "ccr_at_fpr": "metrics.oscr", "weighted_ccr_at_fpr": "metrics.oscr",
    "gamma": "metrics.gamma", "weighted_gamma": "metrics.gamma",
    "open_set_report": "metrics.open_set", "bootstrap_open_set": "metrics.open_set",
    "fpr_at_tpr": "metrics.detection", "weighted_fpr_at_tpr": "metrics.detection",
    "weighted_calibration_error": "metrics.calibration", "bootstrap_accuracy_ece": "metrics.calibration",
    "auroc_interval": "metrics.closed_form_intervals", "delong": "metrics.closed_form_intervals",
    "newcombe_interval": "metrics.closed_form_intervals", "wilson_interval": "metrics.closed_form_intervals",
    "percentile_interval": "metrics.bootstrap_intervals", "paired_difference": "metrics.bootstrap_intervals",
    "probability_first": "metrics.bootstrap_intervals", "worse_than_best": "metrics.comparisons",
    "resample_weights": "metrics.resampling", "cluster_weights": "metrics.resampling",
}


def test_each_weighted_kernel_and_bootstrap_is_exported_from_its_metrics_module():
    assert {name: getattr(metrics, name).__module__ for name in HOMES} == HOMES
    assert set(HOMES) <= set(metrics.__all__)


def test_the_intervals_drawer_is_gone():
    # searched in this package's folder only: an editable install of another checkout must not answer for it
    assert importlib.machinery.PathFinder.find_spec("metrics.intervals", metrics.__path__) is None
    assert importlib.machinery.PathFinder.find_spec("metrics.resampling", metrics.__path__) is not None
