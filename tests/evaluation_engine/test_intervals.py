"""The intervals of every table (:mod:`evaluation_engine.intervals`): the detector metrics against sklearn, each
replicate paired with the AUROC's resample."""

from __future__ import annotations

import pytest


def test_the_detector_metrics_of_every_table_match_sklearn_and_pair_with_the_auroc_resamples():
    import numpy as np
    import torch
    from sklearn.metrics import auc, precision_recall_curve, roc_curve

    from evaluation_engine.intervals import DETECTION_METRICS, Intervals, detection_columns
    from metrics import bootstrap_auroc, bootstrap_detection

    rng = np.random.default_rng(3)
    id_scores, ood_scores = rng.integers(0, 12, 300).astype(float) + 2, rng.integers(0, 12, 200).astype(float)  # ties
    intervals = Intervals(level=0.9, resamples=200, seed=4)
    row, replicates = intervals.detection(torch.tensor(id_scores), torch.tensor(ood_scores))
    labels = np.r_[np.ones(300), np.zeros(200)]
    scores = np.r_[id_scores, ood_scores]
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)  # ID positive
    assert row["fpr@95tpr"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)
    precision, recall, _ = precision_recall_curve(labels, scores)
    assert row["aupr-in"] == pytest.approx(auc(recall, precision), abs=1e-12)
    precision, recall, _ = precision_recall_curve(1 - labels, -scores)
    assert row["aupr-out"] == pytest.approx(auc(recall, precision), abs=1e-12)
    for column in DETECTION_METRICS:  # the percentile interval of the replicates, which hold the estimate's scale
        low, high = np.quantile(replicates[column].numpy(), [0.05, 0.95])
        assert (row[f"{column} low"], row[f"{column} high"]) == pytest.approx((low, high), abs=1e-9)
        assert row[f"{column} low"] <= row[column] <= row[f"{column} high"]
    assert set(detection_columns()) == set(row)
    # replicate b is the AUROC's resample b: the same bootstrap weights (ID stratum 0, OOD stratum 1, same seed)
    again = bootstrap_detection(torch.tensor(id_scores), torch.tensor(ood_scores), 200, 4)
    assert torch.equal(again["aupr_in"], replicates["aupr-in"])
    areas = bootstrap_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), 200, 4)
    assert float(np.corrcoef(areas.numpy(), replicates["aupr-in"].numpy())[0, 1]) > 0.5  # paired: they move together
