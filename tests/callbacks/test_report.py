"""The report layer: output folders checked before anything runs, one writer per format, metric names."""

from __future__ import annotations

import csv
import json
import os

import pytest

from evaluation_engine.outputs import (
    check_output_dir,
    markdown_table,
    metric_key,
    rows_to_csv,
    slug,
    write_json,
    write_tables,
)

ROWS = [{"model": "a/b", "auroc": 0.25, "images": 3, "ece": None}, {"model": "c", "auroc": 1 / 3, "images": 4}]


def test_one_writer_per_format_renders_the_same_rows(tmp_path):
    csv_path, md_path = write_tables(tmp_path / "out", "detectors", ROWS, ("model", "auroc", "images", "ece"),
                                     preamble="Two detectors")
    with open(csv_path, newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [float(r["auroc"]) for r in written] == [0.25, 1 / 3]  # full precision, repr round-trips
    assert written[0]["ece"] == "" and written[1]["ece"] == ""
    assert md_path.read_text() == ("Two detectors\n\n| model | auroc | images | ece |\n|---|---|---|---|\n"
                                   "| a/b | 0.2500 | 3 |  |\n| c | 0.3333 | 4 |  |\n")
    assert markdown_table(ROWS, ("model",)).count("\n") == 4
    assert rows_to_csv([{"x": 1, "extra": 2}], ("x",)) == "x\n1\n"  # columns not asked for are left out
    write_json(tmp_path / "out" / "r.json", {"rows": ROWS})
    assert json.loads((tmp_path / "out" / "r.json").read_text())["rows"][1]["images"] == 4
    assert not list((tmp_path / "out").glob(".*"))  # atomic: no temporary file left


def test_metric_keys_are_stage_prefixed_and_spelt_once():
    assert metric_key("test", "severity", "softmax", "mean_auroc") == "test/severity/softmax/mean_auroc"
    assert metric_key("predict", "evg", "m/softmax", "affine", "mh", "worst_auroc") == \
        "predict/evg/m/softmax/affine/mh/worst_auroc"
    with pytest.raises(ValueError, match="method must be one of"):
        metric_key("test", "adversarial", "x")
    assert slug("demo-best/softmax") == "demo-best_softmax" and slug("///") == "model"


def test_output_folders_are_checked_before_anything_runs(tmp_path, monkeypatch):
    assert check_output_dir(tmp_path / "new" / "report") == tmp_path / "new" / "report"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(NotADirectoryError, match=r"goes to .*file/report, but .*file is a file"):
        check_output_dir(tmp_path / "file" / "report")
    (tmp_path / "done").mkdir()
    check_output_dir(tmp_path / "done")  # reports may overwrite
    with pytest.raises(FileExistsError, match=r"done, which exists; choose another folder or pass --overwrite"):
        check_output_dir(tmp_path / "done", overwrite=False, what="the generated set")
    (tmp_path / "locked").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path / "locked"))  # as a non-root user
    with pytest.raises(PermissionError, match=r"goes to .*locked/report, but .*locked cannot be written"):
        check_output_dir(tmp_path / "locked" / "report")


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
