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
