"""The card's cost section (:mod:`report_card.costs`): its rows from the run's costs, the figure's points, and the
note of a validation-split detector fitted on training images."""

from __future__ import annotations

from pathlib import Path

import pytest

from report_card.costs import cost_rows, cost_section, figure_points, headline_column
from report_card.provenance import fit_split_notes


def cost(kappa: str, parameters: dict, *, scored: int, rate: float | None, fit: float | None = None,
         peak: int | None = None, passes: tuple[int, int] = (1, 0)) -> dict:
    return {"model": "net", "κ": kappa, "parameters": parameters, "fit seconds": fit, "fit peak bytes": peak,
            "fit samples": 80 if fit is not None else 0, "fit sets": ["fit"] if fit is not None else [],
            "fit hardware": "cpu", "scored samples": scored, "score seconds": scored / rate if rate else 0.0,
            "forward passes": passes[0], "backward passes": passes[1], "images/s": rate, "hardware": "a CPU, 2 cores"}


COSTS = [cost("softmax", {}, scored=1000, rate=5000.0),
         cost("knn", {"k": 50}, scored=1000, rate=1234.5678, fit=0.5, peak=3 * 2**20),
         cost("adascale_a", {**{"p_min": 60.0, "p_max": 65.0}, "k1": 5.0, "k2": 1.0, "lmbda": 10.0, "o": 0.05},
              scored=200, rate=10.0, fit=2.0, peak=2**20, passes=(3, 1)),  # a search candidate: validation only
         cost("adascale_a", {"p_min": 80.0, "p_max": 85.0, "k1": 5.0, "k2": 1.0, "lmbda": 10.0, "o": 0.05},
              scored=1200, rate=300.0, fit=2.0, peak=2**20, passes=(3, 1))]

LEADERBOARD = {"columns": [{"key": "ood_far_fpr95", "title": "far FPR@95", "higher_is_better": False},
                           {"key": "ood_near_auroc", "title": "near AUROC", "higher_is_better": True}],
               "rows": [{"model": "net", "kappa": k, "cells": {"ood_near_auroc": {"value": v, "low": v - 0.01,
                                                                                   "high": v + 0.01}}}
                        for k, v in (("softmax", 0.9), ("knn", 0.8), ("adascale_a", 0.95))]}


def test_the_rows_name_parameters_units_and_passes() -> None:
    rows = cost_rows(COSTS)
    assert [(r["κ"], r["parameters"]) for r in rows] == [
        ("softmax", "defaults"), ("knn", "defaults"), ("adascale_a", "p_min=60.0, p_max=65.0"),
        ("adascale_a", "defaults")]
    knn = rows[1]
    assert (knn["fit (s)"], knn["fit peak memory (MiB)"], knn["fit images"], knn["images/s"]) == (0.5, 3.0, 80, 1230.0)
    assert rows[0]["fit (s)"] is None and rows[0]["fit images"] is None
    assert (rows[0]["passes per image"], rows[3]["passes per image"]) == ("1 forward", "3 forward, 1 backward")


def test_the_figure_takes_the_auroc_column_and_the_reported_parameters(tmp_path: Path) -> None:
    column = headline_column(LEADERBOARD["columns"])
    assert column["key"] == "ood_near_auroc"  # preferred over the first column (an FPR: lower is better)
    assert headline_column([{"key": "min_rank", "title": "MinRank", "higher_is_better": False}]) is None
    points = {p["κ"]: p for p in figure_points(cost_rows(COSTS), LEADERBOARD, column)}
    assert points["adascale_a"]["images/s"] == 300.0  # the parameters that scored the test sets, not the candidate
    assert (points["knn"]["value"], points["knn"]["low"]) == (0.8, pytest.approx(0.79))
    section = cost_section(COSTS, LEADERBOARD, output_dir=tmp_path, plots=True)
    assert [f.path.name for f in section.figures] == ["accuracy_cost.png"] and section.figures[0].path.is_file()
    assert cost_section([], LEADERBOARD, output_dir=tmp_path, plots=True) is None


def test_a_validation_split_detector_fitted_on_training_images_is_noted() -> None:
    fits = [{"model": "net", "kappa": "vra", "fit set": "fit", "fit split": "val", "fit set role": "fit"},
            {"model": "net", "kappa": "vra", "fit set": "fashion:val", "fit split": "val", "fit set role": "id_val"},
            {"model": "net", "kappa": "knn", "fit set": "fit", "fit split": "train", "fit set role": "fit"}]
    assert fit_split_notes(fits) == ["net / vra: fitted on ID validation images by its paper; fitted here on fit (no "
                                     "ID validation set in that section)."]
