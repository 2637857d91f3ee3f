"""``evaluate.py report``: the OOD report card of a model and an ensemble across the four methods.

The card's numbers are the methods' own (read back from each method's tables), every number has its
interval, the leaderboard's marks follow from the paired replicates, and every (model, data set) pass runs
at most once per run -- a second run with the same cache runs none.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import itertools
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate
from evaluation_engine.command import Evaluation
from evaluation_engine.intervals import Intervals
from evaluation_engine.outputs import read_replicates
from evaluation_engine.runner import TrainerOptions
from evaluation_methods.generated import set_differences
from evaluation_methods.registry import (
    Estimate,
    Headline,
    Method,
    MethodResult,
    headlines,
    register,
    unregister,
)
from evaluation_methods.severity import SeverityEvaluation
from lightning_modules.scoring import checkpoint_display_name
from metrics import worse_than_best
from report_card.card import ReportCard
from report_card.leaderboard import compare_column

ROOT = Path(__file__).resolve().parents[2]
CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]
RESAMPLES = 200


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def split_row(line: str) -> list[str]:
    """The cells of one line of a Markdown table."""
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def percentile(values: np.ndarray, level: float) -> tuple[float, float]:
    values = values[~np.isnan(values)]
    return (float(np.quantile(values, (1 - level) / 2)), float(np.quantile(values, (1 + level) / 2)))


# -- the leaderboard's comparisons, on hand-made replicates ---------------------------------------------------


def test_compare_column_marks_the_best_and_the_significantly_worse_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(3, 500, generator=generator, dtype=torch.float64) * 0.01
    # a: best; b: 0.001 below a on every resample (paired: significant though the intervals overlap); c: 0.2 below
    shared = torch.randn(500, generator=generator, dtype=torch.float64) * 0.05
    replicates = [0.9 + shared, 0.899 + shared, 0.7 + noise[2]]
    rows = [{"model": m, "kappa": "softmax", "cells": {}} for m in "abc"]
    entries = [(row, (float(r.mean()), *percentile(r.numpy(), 0.95), r)) for row, r in zip(rows, replicates, strict=True)]
    column = Headline("x", "x", "generated", True, "")
    compare_column(entries, column, Intervals(resamples=500))
    cells = [row["cells"]["x"] for row in rows]
    assert [c["best"] for c in cells] == [True, False, False]
    assert [c["significant"] for c in cells] == [False, True, True]
    # overlapping marginal intervals, and still a significant paired difference
    assert cells[1]["high"] > cells[0]["low"]
    stacked = torch.stack(replicates)
    firsts = (stacked == stacked.max(dim=0).values).double()
    expected = (firsts / firsts.sum(dim=0)).mean(dim=1)
    assert [c["share_first"] for c in cells] == pytest.approx(expected.tolist(), abs=1e-12)
    assert sum(c["share_first"] for c in cells) == pytest.approx(1.0)
    # the marks are worse_than_best's, simultaneous over the column
    flags = worse_than_best(torch.tensor([e[1][0] for e in entries]), torch.stack(replicates))
    assert [c["significant"] for c in cells] == flags.tolist()
    # lower is better: the minimum is best
    rows = [{"model": m, "kappa": "softmax", "cells": {}} for m in "ab"]
    entries = [(rows[0], (0.1, 0.05, 0.15, None)), (rows[1], (0.3, 0.2, 0.4, None))]
    compare_column(entries, Headline("y", "y", "generated", False, ""), Intervals())
    assert rows[0]["cells"]["y"]["best"] and not rows[1]["cells"]["y"]["best"]
    assert rows[1]["cells"]["y"]["share_first"] is None and rows[1]["cells"]["y"]["significant"] is False
    # rows measured on other images (another protocol's test set) are never compared with the best row
    rows = [{"model": m, "kappa": "softmax", "cells": {}} for m in "ab"]
    entries = [(rows[0], (0.9, 0.89, 0.91, replicates[0], "P1")), (rows[1], (0.7, 0.69, 0.71, replicates[2], "P2"))]
    compare_column(entries, column, Intervals(resamples=500))
    assert [r["cells"]["x"]["best"] for r in rows] == [True, False]
    assert [r["cells"]["x"]["significant"] for r in rows] == [False, False]
    assert [r["cells"]["x"]["share_first"] for r in rows] == [None, None]
    # equal values share the best mark
    rows = [{"model": m, "kappa": "softmax", "cells": {}} for m in "ab"]
    compare_column([(rows[0], (0.5, 0.4, 0.6, None)), (rows[1], (0.5, 0.4, 0.6, None))], column, Intervals())
    assert [r["cells"]["x"]["best"] for r in rows] == [True, True]


def test_the_demo_config_parses_and_bad_sections_are_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, card = evaluate.parse(["report", "--config", str(ROOT / "configs/evaluate/fashion_report.yaml")])
    assert isinstance(card, ReportCard)
    assert card.model == ["runs/demo/checkpoints/best.ckpt", "ensemble:runs/demo/ensemble/ensemble.txt"]
    assert set(card.sections) == {"open_set", "severity", "generated", "evg", "ood"}
    # at least 20 detectors of the EOS model next to the ensemble's, each a registered detector, the leaders of
    # OpenOOD v1.5's ImageNet table and the open-set post-processors among them
    from metrics.detectors import DETECTORS

    single = [k for k in card.kappa if DETECTORS[k].kind != "ensemble"]
    assert len(single) >= 20 and [k for k in card.kappa if k not in single] == ["ensemble_mi"]
    assert {"adascale_a", "nci", "fdbd", "nnguide", "vra", "mahalanobis_pp", "weiper_kld", "optfs", "gradnorm",
            "openmax", "postmax", "ghost"} <= set(single)
    # a section's config file gives its options, without the models, κ and trainer options
    generated = card.section_options["generated"]
    assert generated["output_dir"] == "runs/demo/report/generated" and generated["label_filter"] is True
    assert "model" not in generated and "wandb_mode" not in generated and "kappa" not in generated
    assert card.section_options["evg"]["output_dir"] == "runs/demo/evg"
    assert card.section_options["evg"]["cache_dir"] == "runs/demo/cache"
    assert (card.intervals.level, card.intervals.resamples) == (0.95, 1000)
    # a section is typed by its command's options (jsonargparse names the section and the key)
    with pytest.raises(SystemExit):
        evaluate.main(["report", "--model", "x.ckpt", "--severity", '{"bogus": 1}'])
    error = capsys.readouterr().err
    assert 'Parser key "severity"' in error and "Unexpected keys: {'bogus'}" in error
    with pytest.raises(SystemExit):
        evaluate.main(["report", "--model", "x.ckpt", "--evg", json.dumps({"config": str(tmp_path / "missing.yaml")})])
    error = capsys.readouterr().err
    assert 'Parser key "evg"' in error and f"File does not exist: '{tmp_path / 'missing.yaml'}'" in error
    with pytest.raises(SystemExit, match="report section evg: the models are the report's"):
        evaluate.main(["report", "--model", "x.ckpt", "--evg", '{"model": ["y.ckpt"]}'])
    with pytest.raises(SystemExit, match="the report has no section"):
        evaluate.main(["report", "--model", "x.ckpt"])
    with pytest.raises(SystemExit, match="confidence level must lie in"):
        evaluate.main(["report", "--model", "x.ckpt", "--open_set", "{}", "--intervals.level", "1.5"])


def test_the_open_set_section_s_old_name_still_works_and_says_so() -> None:
    """One id per method: the open-set section is ``open_set`` (its folder, its key), ``oscr`` its command; the
    section's old key is taken for one release, with a warning, on the command line, in YAML and from Python."""
    with pytest.warns(FutureWarning, match="the report section 'oscr' is now 'open_set' \\(kept for one release\\)"):
        card = ReportCard(model=["x.ckpt"], sections={"oscr": {"fpr": [0.1]}})
    assert card.sections == {"open_set": {"fpr": [0.1]}} and card.section_options["open_set"] == {"fpr": [0.1]}
    with pytest.warns(FutureWarning, match="'oscr' is now 'open_set'"):
        card = evaluate.parse(["report", "--model", "x.ckpt", "--oscr", "{fpr: [0.1]}"])[1]
    assert card.section_options == {"open_set": {"fpr": [0.1]}}
    with pytest.raises(ValueError, match="report sections 'oscr' and 'open_set' name one method: give 'open_set' only"):
        ReportCard(model=["x.ckpt"], sections={"oscr": {}, "open_set": {}})


# -- a whole card ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def card(demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tests.test_generate import generate, train_generators

    root = tmp_path_factory.mktemp("report")
    paths = train_generators(str(root / "generators"))
    members = root / "members.txt"
    members.write_text("".join(f"{p}\n" for p in paths["members"]))
    sets = {kind: generate(paths[kind], root / kind, "--num", "12") for kind in ("shift", "near_ood")}
    config = {
        "model": [str(demo_checkpoint), f"ensemble:{members}"],
        "kappa": ["softmax", "max_logit", "ensemble_mi"],
        "open_set": {},
        "severity": {"data": "fashion", "data_args": {"estimation": 20, "test": 10}},
        "generated": {"data": "fashion", "near_ood": [str(sets["near_ood"])], "shift": [str(sets["shift"])],
                      "real_ood": ["digits=digits"]},
        "evg": {"data": "fashion", "data_args": {"max_train_per_class": 60}, "ood": "digits",
                "variation": ["affine", "colour"], "sampler": ["mh", "random"], "chains": 6, "steps": 6,
                "output_dir": str(root / "evg")},
        "ood": {"data": "fashion", "full_spectrum": True,
                "data_args": {"unit_images": 8, "unit_tests": ["uni", "Gaussian"], "corruptions": ["contrast"],
                              "val_images": 64}},
        "intervals": {"resamples": RESAMPLES, "seed": 1},
        "output_dir": str(root / "card"),
        "cache_dir": str(root / "cache"),
    }
    path = root / "report.yaml"
    path.write_text(json.dumps(config))
    runs = []
    for _ in range(2):
        _, evaluation = evaluate.parse(["report", "--config", str(path), *CLI])
        with counted_checkpoint_reads() as reads:
            rows = evaluation.run()
        runs.append({"rows": rows, "log": list(evaluation.passes.log), "card": evaluation.card, "reads": reads})
    return {"runs": runs, "root": root, "checkpoint": demo_checkpoint, "members": members}


@contextlib.contextmanager
def counted_checkpoint_reads() -> Iterator[collections.Counter]:
    """Count :func:`lightning_modules.checkpoint.read_checkpoint` calls per file, wherever a module imported it."""
    from lightning_modules import checkpoint as checkpoint_module

    original, reads = checkpoint_module.read_checkpoint, collections.Counter()

    def counting(path: str | Path) -> dict:
        reads[str(Path(path).resolve())] += 1
        return original(path)

    patched = [m for m in list(sys.modules.values()) if vars(m).get("read_checkpoint") is original]
    for module in patched:
        module.read_checkpoint = counting
    try:
        yield reads
    finally:
        for module in patched:
            module.read_checkpoint = original


def test_each_checkpoint_is_read_once_per_card(card: dict) -> None:
    """The card builds each model once and every section scores it (OSCR's pass included): the demo
    checkpoint and each ensemble member are read once per card (18 reads of these 3 files before: the demo
    checkpoint 6 times, the first member 8, the second 4)."""
    members = [str(Path(p).resolve()) for p in card["members"].read_text().split()]
    expected = {str(card["checkpoint"].resolve()): 1, **{member: 1 for member in members}}
    for run in card["runs"]:
        assert dict(run["reads"]) == expected


def test_every_pass_runs_at_most_once_and_a_second_run_none(card: dict) -> None:
    first, second = card["runs"]
    ran = [entry["key"] for entry in first["log"] if entry["source"] == "run"]
    assert ran and len(ran) == len(set(ran))  # no (model, set, pass) twice
    # every method asked: OSCR's protocol test set, severity's three sets, generated's sets, EvG's fixed sets
    assert {entry["role"] for entry in first["log"]} >= {"open_set_test", "id_test", "id_val", "estimation", "ood",
                                                         "near_ood", "shift"}
    # OSCR's pass is one of the card's passes: run once, then reused from the card's cache by the second run
    oscr = [[entry["source"] for entry in run["log"] if entry["role"] == "open_set_test"] for run in (first, second)]
    assert oscr == [["run"], ["cache"]]
    assert {entry["model"] for entry in first["log"]} == {row["model"] for row in first["rows"]}
    # a later method asking for a pass an earlier one made gets it from memory
    assert any(entry["source"] == "memory" for entry in first["log"])
    assert [entry for entry in second["log"] if entry["source"] == "run"] == []
    assert json.dumps(second["rows"], sort_keys=True) == json.dumps(first["rows"], sort_keys=True)


def test_the_card_shows_each_methods_own_numbers_with_intervals(card: dict) -> None:
    rows = card["runs"][0]["rows"]
    root = card["root"] / "card"
    by_row = {(row["model"], row["kappa"]): row["cells"] for row in rows}
    model = next(m for m, k in by_row if k == "softmax")
    ensemble = next(m for m, k in by_row if k == "ensemble_mi")
    assert list(by_row) == [(model, "softmax"), (model, "max_logit"), (ensemble, "ensemble_mi")]
    # OSCR: the checkpoint's softmax row only, its metrics.json numbers
    metrics = json.loads((root / "open_set" / model / "metrics.json").read_text())
    assert by_row[(model, "softmax")]["oscr_ccr"]["value"] == metrics["scalars"]["unknowns/ccr@fpr=0.1"]
    assert [by_row[(model, "softmax")]["oscr_auroc"][k] for k in ("low", "high")] == metrics["intervals"]["unknowns/auroc"]
    assert "oscr_ccr" not in by_row[(model, "max_logit")] and "oscr_ccr" not in by_row[(ensemble, "ensemble_mi")]
    # severity: the mean and the hardest level of the method's own table
    for (name, kappa), cells in by_row.items():
        table = [r for r in read_rows(root / "severity" / name / "severity.csv") if r["confidence function"] == kappa]
        aurocs = [float(r["ood-auroc"]) for r in table]
        assert cells["severity_mean"]["value"] == pytest.approx(sum(aurocs) / len(aurocs), abs=1e-12)
        assert cells["severity_hardest"]["value"] == pytest.approx(aurocs[-1], abs=1e-12)
        assert cells["severity_hardest"]["low"] == pytest.approx(float(table[-1]["ood-auroc low"]), abs=1e-12)
        replicates = read_replicates(root / "severity" / name)
        low, high = percentile(replicates[f"{kappa}/mean"].numpy(), 0.95)
        assert (cells["severity_mean"]["low"], cells["severity_mean"]["high"]) == pytest.approx((low, high), abs=1e-9)
        assert replicates[f"{kappa}/mean"].numel() == RESAMPLES
        # a resample in which a level drew none of its classes has no mean: counted in the summary, left out
        summary = next(r for r in read_rows(root / "severity" / name / "summary.csv") if r["confidence function"] == kappa)
        assert int(summary["empty resamples"]) == int(torch.isnan(replicates[f"{kappa}/mean"]).sum())
    # generated: the first near-OOD set's row of detectors.csv, DeLong's interval around it
    detectors = read_rows(root / "generated" / "detectors.csv")
    for (name, kappa), cells in by_row.items():
        found = next(r for r in detectors if r["model"] == name and r["confidence function"] == kappa
                     and r["kind"] == "near_ood")
        assert cells["near_ood"]["value"] == pytest.approx(float(found["auroc"]), abs=1e-12)
        assert cells["near_ood"]["low"] <= cells["near_ood"]["value"] <= cells["near_ood"]["high"]
        assert cells["near_ood"]["low"] == pytest.approx(float(found["auroc low"]), abs=1e-12)
    # EvG: the lowest worst-case AUROC over the variations of the eV1 rows
    results = read_rows(card["root"] / "evg" / "results.csv")
    for (name, kappa), cells in by_row.items():
        mine = [r for r in results if r["detector"] == f"{name}/{kappa}" and r["sampler"] == "eV1"]
        assert len(mine) == 2
        assert cells["evg_worst"]["value"] == pytest.approx(min(float(r["worst-case auroc"]) for r in mine), abs=1e-12)
        assert cells["evg_min_rank"]["value"] == min(float(r["min rank"]) for r in mine)
        replicates = read_replicates(card["root"] / "evg")
        per_variation = torch.stack([replicates[f"{name}/{kappa}|{r['variation']}|eV1|worst_auroc"] for r in mine])
        low, high = percentile(per_variation.min(dim=0).values.numpy(), 0.95)
        assert (cells["evg_worst"]["low"], cells["evg_worst"]["high"]) == pytest.approx((low, high), abs=1e-9)
    # the OOD benchmark: the near and far means of the standard setting, their percentile intervals
    means = {(r["model"], r["κ"], r["set"]): r for r in read_rows(root / "ood" / "sets.csv")
             if r["setting"] == "standard" and r["group"] == "mean"}
    ood_replicates = read_replicates(root / "ood")
    for (name, kappa), cells in by_row.items():
        for group in ("near", "far"):
            row = means[(name, kappa, group)]
            assert cells[f"ood_{group}_auroc"]["value"] == pytest.approx(float(row["auroc"]), abs=1e-12)
            assert cells[f"ood_{group}_fpr95"]["value"] == pytest.approx(float(row["fpr@95tpr"]), abs=1e-12)
            low, high = percentile(ood_replicates[f"{name}|{kappa}|standard|{group}|auroc"].numpy(), 0.95)
            assert (cells[f"ood_{group}_auroc"]["low"], cells[f"ood_{group}_auroc"]["high"]) == pytest.approx(
                (low, high), abs=1e-9)
    # every cell: an interval, and per column the best row and probabilities of ranking first that sum to 1
    columns = {h.key for h in headlines()} & {k for cells in by_row.values() for k in cells}
    assert columns == {h.key for h in headlines()}  # every method gave its numbers
    for key in columns:
        present = [cells[key] for cells in by_row.values() if key in cells]
        assert all(c["low"] is not None and c["low"] <= c["high"] for c in present)
        assert sum(c["best"] for c in present) == 1
        if len(present) > 1 and all(c["share_first"] is not None for c in present):
            assert sum(c["share_first"] for c in present) == pytest.approx(1.0)


def test_significance_follows_the_paired_replicates(card: dict) -> None:
    rows = card["runs"][0]["rows"]
    root = card["root"] / "card"
    detectors = read_replicates(root / "generated")
    near_ood = next(r["set"] for r in read_rows(root / "generated" / "detectors.csv") if r["kind"] == "near_ood")
    keys = [(row["model"], row["kappa"]) for row in rows]
    cells = [row["cells"]["near_ood"] for row in rows]
    replicates = torch.stack([detectors[f"{m}|{k}|{near_ood}|auroc"] for m, k in keys])
    expected = worse_than_best(torch.tensor([c["value"] for c in cells]), replicates, 0.95)
    assert [c["significant"] for c in cells] == expected.tolist()


def test_the_page_and_the_json_hold_every_row(card: dict) -> None:
    root = card["root"] / "card"
    written = json.loads((root / "report.json").read_text())
    assert written["leaderboard"]["rows"] == card["runs"][1]["rows"]
    assert {s["method"] for s in written["sections"]} == {"open_set", "severity", "generated", "evg", "ood", "cost"}
    # what each (model, κ) of the leaderboard cost: a row each, measured here, and the accuracy-cost figure
    cost = next(s for s in written["sections"] if s["method"] == "cost")
    (table,) = cost["tables"]
    costs = {(r["model"], r["κ"]): r for r in table["rows"]}
    assert set(costs) >= {(r["model"], r["kappa"]) for r in written["leaderboard"]["rows"]}
    assert all(r["images/s"] > 0 and r["passes per image"].endswith("forward") and "cores" in r["measured on"]
               for r in costs.values())
    # softmax, max_logit and the ensemble's MI fit nothing: no fit columns; one forward each (no features)
    assert all(r["fit (s)"] is None and r["fit images"] is None and r["passes per image"] == "1 forward"
               for r in costs.values())
    assert [Path(i["path"]).name for i in cost["images"]] == ["accuracy_cost.png"]
    assert written["level"] == 0.95 and written["resamples"] == RESAMPLES and written["seed"] == 1
    assert {"torch", "python"} <= set(written["versions"])
    assert all(len(d["fingerprint"]) >= 16 and d["samples"] > 0 for d in written["data"])
    page = (root / "index.html").read_text()
    assert page.count("<tr data-model=") == len(written["leaderboard"]["rows"])
    assert "http://" not in page and "https://" not in page
    images = [i for s in written["sections"] for i in s["images"]]
    assert {Path(i["path"]).name for i in images} >= {"oscr_curves.png", "severity_auroc.png"}
    assert all(not Path(i["path"]).is_absolute() and (root / i["path"]).is_file() for i in images)  # the page's own
    # report.md's leaderboard: a line per row of report.json, in its order, each cell's numbers (as printed: three
    # decimals, whole numbers as such) those of the row's cell under the column's heading; "—" where it has none
    lines = (root / "report.md").read_text().splitlines()
    start = lines.index("## Leaderboard") + 2
    columns = written["leaderboard"]["columns"]
    assert split_row(lines[start]) == ["model", "κ", *[c["title"] + (" ↑" if c["higher_is_better"] else " ↓")
                                                        for c in columns]]
    table = list(itertools.takewhile(bool, lines[start + 2:]))
    assert len(table) == len(written["leaderboard"]["rows"])
    for line, row in zip(table, written["leaderboard"]["rows"], strict=True):
        texts = split_row(line)
        assert texts[:2] == [row["model"], row["kappa"]]
        for text, column in zip(texts[2:], columns, strict=True):
            cell = row["cells"].get(column["key"]) or {}
            numbers = [cell.get(k) for k in ("value", "low", "high")]
            finite = [n is not None and math.isfinite(n) for n in numbers]
            expected = numbers if all(finite) else numbers[:1] if finite[0] else []
            printed = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text.split("<sup>")[0])]  # no share
            assert printed == pytest.approx(expected, abs=5e-4 + 1e-12), (row, text)  # printed half-up or down
    assert not math.isnan(written["leaderboard"]["rows"][0]["cells"]["severity_mean"]["value"])


def test_set_differences_pair_the_sets_of_one_kind_per_detector() -> None:
    generator = torch.Generator().manual_seed(3)
    shared = torch.randn(400, generator=generator, dtype=torch.float64) * 0.02
    replicates = {"m|softmax|near|auroc": 0.85 + shared, "m|softmax|near_plain|auroc": 0.84 + shared,
                  "m|softmax|near_twin|auroc": 0.85 + shared + torch.randn(400, generator=generator,
                                                                           dtype=torch.float64) * 0.01,
                  "m|softmax|shift|auroc": 0.7 + shared}
    rows = [{"model": "m", "confidence function": "softmax", "set": name, "kind": kind, "auroc": float(r.mean())}
            for name, kind, r in (("near", "near_ood", replicates["m|softmax|near|auroc"]),
                                  ("near_plain", "near_ood", replicates["m|softmax|near_plain|auroc"]),
                                  ("near_twin", "near_ood", replicates["m|softmax|near_twin|auroc"]),
                                  ("shift", "shift", replicates["m|softmax|shift|auroc"]))]
    found = set_differences(rows, replicates, Intervals(resamples=400).level)
    # three near-OOD pairs, no pair across kinds
    assert [(r["set A"], r["set B"]) for r in found] == [("near", "near_plain"), ("near", "near_twin"),
                                                         ("near_plain", "near_twin")]
    # a constant paired difference of 0.01 is significant, however wide each set's own interval
    first = found[0]
    assert first["AUROC A − B"]["value"] == pytest.approx(0.01) and first["significant"] == "yes"
    assert first["AUROC A − B"]["low"] == pytest.approx(0.01) and first["AUROC A − B"]["high"] == pytest.approx(0.01)
    difference = (replicates["m|softmax|near|auroc"] - replicates["m|softmax|near_twin|auroc"]).numpy()
    low, high = percentile(difference, 0.95)
    assert (found[1]["AUROC A − B"]["low"], found[1]["AUROC A − B"]["high"]) == pytest.approx((low, high))
    assert found[1]["significant"] == ("yes" if low > 0 or high < 0 else "no")


# -- careless input, refused before anything runs ---------------------------------------------------------------


def test_pairs_types_and_the_python_entry_are_checked_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a κ that pairs with no model of the card, OSCR without a checkpoint: refused as the other commands refuse them
    with pytest.raises(SystemExit, match="'ensemble_mi' pairs with no model of the report"):
        evaluate.main(["report", "--model", "x.ckpt", "--kappa", "ensemble_mi", "--severity", "{}"])
    with pytest.raises(SystemExit, match="oscr needs a classifier checkpoint of train.py"):
        evaluate.main(["report", "--model", "ensemble:members.txt", "--kappa", "ensemble_mi", "--open_set", "{}"])
    # section values checked by type by the command line's parser, naming the section, the key and the value
    for section, value, named in (("severity", "{num_levels: eleven}", "{'num_levels': 'eleven'}"),
                                  ("evg", "{chains: 4.5}", "Expected a <class 'int'>. Got value: 4.5")):
        with pytest.raises(SystemExit):
            evaluate.main(["report", "--model", "x.ckpt", f"--{section}", value])
        error = capsys.readouterr().err
        assert f'Parser key "{section}"' in error and named in error
    # from Python, the same checks by the command's own parser
    with pytest.raises(ValueError, match=r"report section severity: .*num_levels.*eleven"):
        ReportCard(model=["x.ckpt"], sections={"severity": {"num_levels": "eleven"}})
    # from Python: one κ as a string, intervals and trainer options as mappings
    card = ReportCard(model="x.ckpt", kappa="softmax", intervals={"level": 0.9, "resamples": 50},
                      trainer={"accelerator": "cpu", "wandb_mode": "disabled"},
                      sections={"severity": {}})
    assert card.kappa == ["softmax"] and card.model == ["x.ckpt"]
    assert (card.intervals.level, card.intervals.resamples) == (0.9, 50) and card.options.accelerator == "cpu"
    assert card.output_dir == Path("runs/report") and card.cache_dir == "runs/cache"
    with pytest.raises(ValueError, match=r"report sections \['num_level'\] are no registered evaluation method"):
        ReportCard(model="x.ckpt", sections={"severity": {}, "num_level": 3})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'num_level'"):
        SeverityEvaluation(model="x.ckpt", num_level=3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'pretrained_file'"):
        ReportCard(model="x.ckpt", pretrained_file="w.pth", sections={"severity": {}})
    with pytest.raises(ValueError, match=r"intervals: \['levle'\] are not options of Intervals"):
        ReportCard(model=["x.ckpt"], intervals={"levle": 0.9}, sections={"severity": {}})
    with pytest.raises(ValueError, match="a mean over seeds needs at least two different runs"):
        ReportCard(model=[{"name": "eos", "seeds": ["a.ckpt", "a.ckpt"]}], sections={"severity": {}})


def test_a_section_config_is_read_relative_to_the_config_file(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "severity.yaml").write_text("data: fashion\nnum_levels: 5\n")
    (folder / "card.yaml").write_text(json.dumps({"model": ["x.ckpt"], "severity": {"config": "severity.yaml"}}))
    monkeypatch.chdir(tmp_path / "configs" / "..")  # not the config's folder
    _, card = evaluate.parse(["report", "--config", str(folder / "card.yaml")])
    assert card.section_options["severity"] == {"data": "fashion", "num_levels": 5}


def test_section_folders_are_checked_before_the_first_section_runs(demo_checkpoint: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    card = ReportCard(model=[str(demo_checkpoint)], output_dir=str(tmp_path / "card"), cache_dir=None,
                      trainer={"accelerator": "cpu", "devices": 1, "wandb_mode": "disabled"},
                      sections={"open_set": {}, "severity": {"data": "fashion", "output_dir": str(blocked / "s")}})
    with pytest.raises(NotADirectoryError, match="is a file"):
        card.run()
    assert not (tmp_path / "card" / "open_set").exists()  # OSCR, the first section, never ran


def test_a_card_killed_midway_leaves_its_old_page_marked_stale(tmp_path: Path) -> None:
    from report_card.page import write_page
    from report_card.provenance import mark_stale

    report = {"title": "t", "leaderboard": {"columns": [], "rows": []}, "sections": [], "notes": []}
    write_page(report, tmp_path)
    mark_stale(tmp_path)
    mark_stale(tmp_path)  # once is enough
    page = (tmp_path / "index.html").read_text()
    assert page.count("STALE: a report card run over this folder started") == 1
    assert (tmp_path / "report.md").read_text().startswith("**STALE")
    assert json.loads((tmp_path / "report.json").read_text())["stale"].startswith("STALE")
    write_page(report, tmp_path)  # a finished run writes the page whole
    assert "STALE" not in (tmp_path / "index.html").read_text()


# -- several training seeds as one model --------------------------------------------------------------------------


@pytest.mark.slow
def test_several_seeds_make_one_row_with_the_seed_mean_interval(demo_checkpoint: Path, tmp_path: Path) -> None:
    from metrics import seed_mean
    from tests.conftest import train_demo_checkpoint

    seeds = [str(demo_checkpoint)] + [str(train_demo_checkpoint(tmp_path / f"seed{s}", "eos", seed=s)) for s in (1, 2)]
    card = ReportCard(model=[{"name": "eos", "seeds": seeds}], kappa=["softmax", "energy"],
                      output_dir=str(tmp_path / "card"), cache_dir=None,
                      intervals={"resamples": RESAMPLES},
                      trainer={"accelerator": "cpu", "devices": 1, "wandb_mode": "disabled", "progress_bar": False},
                      sections={"severity": {"data": "fashion", "data_args": {"estimation": 20, "test": 10}}})
    rows = card.run()
    assert [(r["model"], r["kappa"]) for r in rows] == [("eos", "softmax"), ("eos", "energy")]  # members folded in
    names = ["demo-best", "seed1-best", "seed2-best"]
    for row in rows:
        kappa, found = row["kappa"], row["cells"]["severity_mean"]
        per_seed = [read_replicates(tmp_path / "card" / "severity" / name)[f"{kappa}/mean"] for name in names]
        values = []
        for name in names:
            table = [r for r in read_rows(tmp_path / "card" / "severity" / name / "severity.csv")
                     if r["confidence function"] == kappa]
            values.append(sum(float(r["ood-auroc"]) for r in table) / len(table))
        combined = seed_mean(torch.tensor(values, dtype=torch.float64), torch.stack(per_seed))
        assert found["value"] == pytest.approx(float(np.mean(values)), abs=1e-12)
        assert (found["low"], found["high"]) == pytest.approx((max(0.0, combined.low), min(1.0, combined.high)))
    section = next(s for s in card.card["sections"] if s["method"] == "seeds")
    table = section["tables"][0]["rows"]
    assert {(r["κ"], r["metric"]) for r in table} >= {("softmax", "mean AUROC"), ("energy", "hardest level")}
    assert all(len([k for k in r if k.startswith("seed ")]) == 3 for r in table)
    assert [m["seed of"] for m in card.card["models"]] == ["eos"] * 3


# -- seeds of one recipe, a leaderboard that is never empty, two seeds --------------------------------------------


def recipe_variant(demo_checkpoint: Path, folder: Path, *, model: dict | None = None, known: tuple | None = None) -> str:
    """A checkpoint of train.py's layout like the demo's, with other model hyper-parameters (a fresh network of
    them, untrained) or other known classes: the same file, as train.py writes it, of another recipe."""
    from datamodules.fashion_mnist import CLASS_NAMES
    from lightning_modules import OpenSetClassifier

    checkpoint = torch.load(demo_checkpoint, map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"] = {**checkpoint["hyper_parameters"], **(model or {})}
    checkpoint["state_dict"] = OpenSetClassifier(**checkpoint["hyper_parameters"]).state_dict()
    if known is not None:
        data = checkpoint["datamodule_hyper_parameters"]
        others = [c for c in range(10) if c not in known]
        data.update(known=known, negative=tuple(others[:3]), unknown=tuple(others[3:]))
        checkpoint["classes"] = [CLASS_NAMES[c] for c in sorted(known)]
    path = folder / "checkpoints" / "best.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(checkpoint, path)
    return str(path)


def seed_variant(demo_checkpoint: Path, path: Path, *, seed: int = 1) -> Path:
    """A checkpoint of the demo's recipe with other weights (each weight moved by a seeded 1e-3 noise): another
    training run, as far as the card can tell, without training one."""
    checkpoint = torch.load(demo_checkpoint, map_location="cpu", weights_only=False)
    generator = torch.Generator().manual_seed(seed)
    checkpoint["state_dict"] = {name: value + 1e-3 * torch.randn(value.shape, generator=generator)
                                if value.is_floating_point() else value
                                for name, value in checkpoint["state_dict"].items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def test_seeds_of_other_recipes_are_refused_before_any_pass(demo_checkpoint: Path, tmp_path: Path) -> None:
    from lightning_modules.scoring import ScoringModel
    from report_card.card import ModelSeeds

    # the kind is in the specs: refused as the card is built, before a file is read
    with pytest.raises(ValueError, match=r"model 'eos' of several seeds: its seeds are not runs of one recipe.*\n"
                                         r"  kind: seed 1 \(a.ckpt\): 'checkpoint'; seed 2 \(ensemble:m.txt\): 'ensemble'"):
        ReportCard(model=[{"name": "eos", "seeds": ["a.ckpt", "ensemble:m.txt"]}],
                   sections={"severity": {}})
    with pytest.raises(ValueError, match=r"kind: seeds 1 \(a.ckpt\), 3 \(b.ckpt\): 'checkpoint'; seed 2 \(timm:resnet18\)"):
        ModelSeeds("eos", ["a.ckpt", "timm:resnet18", "b.ckpt"])
    # the rest is what each checkpoint records: its architecture, loss, classes and data
    copy = tmp_path / "copy" / "checkpoints" / "best.ckpt"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(demo_checkpoint.read_bytes())  # another run of the same recipe
    wider = recipe_variant(demo_checkpoint, tmp_path / "wider", model={"deep_feature_dim": 8})
    softmax = recipe_variant(demo_checkpoint, tmp_path / "softmax", model={"loss": "softmax"})
    other = recipe_variant(demo_checkpoint, tmp_path / "other", known=(0, 1, 2, 4))
    assert ScoringModel(str(copy)).recipe == ScoringModel(str(demo_checkpoint)).recipe
    seeds = [str(demo_checkpoint), wider, str(copy), softmax, other]
    card = ReportCard(model=[{"name": "eos", "seeds": seeds}], output_dir=str(tmp_path / "card"),
                      cache_dir=None, trainer={"wandb_mode": "disabled"},
                      sections={"severity": {"data": "fashion"}})
    with pytest.raises(ValueError, match="its seeds are not runs of one recipe") as raised:
        card.run()
    lines = str(raised.value).splitlines()
    same = f"seeds 1 ({demo_checkpoint}), 3 ({copy}), 4 ({softmax}), 5 ({other})"
    assert f"  architecture: {same}: {{'deep_feature_dim': None}}; seed 2 ({wider}): {{'deep_feature_dim': 8}}" in lines
    assert f"  loss: seeds 1 ({demo_checkpoint}), 2 ({wider}), 3 ({copy}), 5 ({other}): {{'loss': 'eos'}}; " \
           f"seed 4 ({softmax}): {{'loss': 'softmax'}}" in lines
    classes = next(line for line in lines if line.startswith("  classes: "))
    assert f"seed 5 ({other}): ['T-shirt/top', 'Trouser', 'Pullover', 'Coat']" in classes
    data = next(line for line in lines if line.startswith("  data: "))
    assert f"seed 5 ({other}): {{'known': [0, 1, 2, 4], 'negative': [3, 5, 6], 'unknown': [7, 8, 9]}}" in data
    assert card.passes is None and not (tmp_path / "card").exists()  # no pass ran, nothing was written
    # ensembles as seeds: their members' recipe and their number of members
    from report_card.card import seed_differences

    pair, triple = f"ensemble:{demo_checkpoint},{copy}", f"ensemble:{demo_checkpoint},{copy},{copy}"
    recipes = [ScoringModel(spec).recipe for spec in (pair, triple, f"ensemble:{wider},{wider}")]
    assert seed_differences(["a", "b", "c"], recipes) == [
        "members: seeds 1 (a), 3 (c): 2; seed 2 (b): 3",
        "architecture: seeds 1 (a), 2 (b): {'deep_feature_dim': None}; seed 3 (c): {'deep_feature_dim': 8}"]


def test_a_model_no_kappa_pairs_with_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"no confidence function of the report pairs with model ensemble:m.txt: it "
                                         r"would get no leaderboard row .*'softmax'.*an ensemble needs an ensemble κ"):
        ReportCard(model=["x.ckpt", "ensemble:m.txt"], kappa=["softmax"],
                   sections={"severity": {}})
    with pytest.raises(ValueError, match=r"pairs with model 'ens' \(its seeds: \['ensemble:a.txt', 'ensemble:b.txt', "
                                         r"'ensemble:c.txt'\]\)"):
        ReportCard(model=["x.ckpt", {"name": "ens", "seeds": ["ensemble:a.txt", "ensemble:b.txt", "ensemble:c.txt"]}],
                   kappa=["softmax"], sections={"severity": {}})
    # a section's own κ gives the ensemble its rows
    ReportCard(model=["x.ckpt", "ensemble:m.txt"],
               sections={"severity": {"kappa": ["softmax", "ensemble_mi"]}})


PROBE: dict[tuple[str, str], tuple[float | None, torch.Tensor | None, str]] = {}
PROBE_OVERLAP: dict[tuple[str, str], str] = {}  # (model, κ) -> the note of an allowed fit overlap of its estimate


class Probe(Evaluation):
    """``evaluate.py probe``: a method whose numbers the test sets (:data:`PROBE`: (model, κ) -> value, replicates,
    units); a card of it runs no pass."""

    command = "probe"

    def __init__(self, model: list[str], kappa: list[str] = ("softmax",), output_dir: str | None = None, *,
                 trainer: TrainerOptions | None = None) -> None:
        super().__init__(trainer=trainer)
        self.model, self.kappa, self.output_dir = list(model), list(kappa), output_dir

    def run(self) -> MethodResult:
        estimates = []
        for spec in self.model:
            name = checkpoint_display_name(Path(spec))
            for kappa in self.kappa:
                value, replicates, units = PROBE[(name, kappa)]
                estimates.append(Estimate(name, kappa, "probe_score", value, None, None, replicates, units,
                                          fit_overlap=PROBE_OVERLAP.get((name, kappa), "")))
        return MethodResult("probe", {}, folder=self.output_dir, estimates=estimates)


class ProbeMethod(Method):
    key, evaluation = "probe", Probe
    title, name, group = "Probe", "Probe", "Probe"
    unit = "hand-made replicates"
    headlines = (Headline("probe_score", "probe score", "probe", True, "a number the test sets"),)


@pytest.fixture
def probe_method():
    register(ProbeMethod)
    PROBE.clear()
    yield
    unregister("probe")
    PROBE.clear()
    PROBE_OVERLAP.clear()


def constant(value: float, resamples: int = 50) -> torch.Tensor:
    return torch.full((resamples,), value, dtype=torch.float64)


@pytest.mark.usefixtures("probe_method")
def test_two_seeds_warn_and_the_page_says_their_interval_is_uninformative(demo_checkpoint: Path, tmp_path: Path,
                                                                          capsys) -> None:
    from scipy.stats import t as student_t

    second = seed_variant(demo_checkpoint, tmp_path / "seed1" / "checkpoints" / "best.ckpt")
    # softmax: far apart; energy: close; max_logit: measured on other data by the second seed (not combined)
    PROBE.update({("demo-best", "softmax"): (0.5, constant(0.5), "u"), ("seed1-best", "softmax"): (0.8, constant(0.8), "u"),
                  ("demo-best", "energy"): (0.5, constant(0.5), "u"), ("seed1-best", "energy"): (0.51, constant(0.51), "u"),
                  ("demo-best", "max_logit"): (0.5, constant(0.5), "u"),
                  ("seed1-best", "max_logit"): (0.6, constant(0.6), "v")})
    with pytest.warns(UserWarning, match=r"model 'eos': 2 seeds: .* t on 1 degree of freedom \(its 95% quantile is "
                                         r"12.7; 4.3 with 3 seeds\)"):
        card = ReportCard(model=[{"name": "eos", "seeds": [str(demo_checkpoint), str(second)]}],
                          kappa=["softmax", "energy", "max_logit"], sections={"probe": {}},
                          output_dir=str(tmp_path / "card"), cache_dir=None,
                          trainer={"wandb_mode": "disabled"})
    with pytest.warns(UserWarning, match=r"model 'eos': numbers not combined over its seeds, left out of the "
                                         r"leaderboard: max_logit / probe score: the seeds were measured on different "
                                         r"data \(units: demo-best: u; seed1-best: v\)"):
        rows = card.run()
    by_kappa = {row["kappa"]: row["cells"]["probe_score"] for row in rows}
    assert [row["model"] for row in rows] == ["eos", "eos"] and list(by_kappa) == ["softmax", "energy"]
    # no shared test sampling (constant replicates): the half-width is t_{0.975, 1} · s / √2, s = |a − b| / √2
    quantile = float(student_t.ppf(0.975, 1))
    assert (by_kappa["softmax"]["low"], by_kappa["softmax"]["high"]) == (0.0, 1.0)  # 0.65 ± 1.91, clipped
    assert by_kappa["softmax"]["value"] == pytest.approx(0.65)
    assert (by_kappa["energy"]["low"], by_kappa["energy"]["high"]) == pytest.approx(
        (0.505 - quantile * 0.005, 0.505 + quantile * 0.005), abs=1e-9)
    page = (tmp_path / "card" / "index.html").read_text()
    assert page.count("2 seeds: the seeds&#x27; part of the interval is a Student t on 1 degree of freedom") == 2
    assert page.count("<td>uninformative: t on 1 degree of freedom</td>") == 2  # the seeds table, both rows
    assert "eos: not combined over its seeds (left out of the leaderboard): max_logit / probe score" in page
    assert "Report card written" in capsys.readouterr().out


@pytest.mark.usefixtures("probe_method")
def test_a_card_without_a_leaderboard_row_is_an_error_that_says_why(demo_checkpoint: Path, tmp_path: Path,
                                                                     capsys) -> None:
    second, third = (seed_variant(demo_checkpoint, tmp_path / f"seed{k}" / "checkpoints" / "best.ckpt", seed=k)
                     for k in (1, 2))
    seeds = [{"name": "eos", "seeds": [str(demo_checkpoint), str(second), str(third)]}]
    options = {"sections": {"probe": {}}, "cache_dir": None, "trainer": {"wandb_mode": "disabled"}}
    # the seeds measured on other data: no number of the model can be combined, and it was its only row
    PROBE.update({("demo-best", "softmax"): (0.5, constant(0.5), "u"), ("seed1-best", "softmax"): (0.6, constant(0.6), "v"),
                  ("seed2-best", "softmax"): (0.7, constant(0.7), "u")})
    card = ReportCard(model=seeds, output_dir=str(tmp_path / "a"), **options)
    with pytest.raises(ValueError, match=r"model 'eos' of several seeds gets no leaderboard row: none of its numbers "
                                         r"could be combined over its seeds \(softmax / probe score: the seeds were "
                                         r"measured on different data \(units: demo-best: u; seed1-best: v; "
                                         r"seed2-best: u\)\)\. The "
                                         r"card was not written"):
        card.run()
    assert not (tmp_path / "a" / "index.html").exists()
    # one seed without a value
    PROBE[("seed1-best", "softmax")] = (None, None, "u")
    with pytest.raises(ValueError, match=r"softmax / probe score: seed1-best has no value"):
        ReportCard(model=seeds, output_dir=str(tmp_path / "b"), **options).run()
    # a single model without a number: an empty leaderboard
    with pytest.raises(ValueError, match=r"the report card would have an empty leaderboard: the sections gave no "
                                         r"headline number .*\{'probe': 1\}; rows: \['seed1-best / softmax'\]"):
        ReportCard(model=[str(second)], output_dir=str(tmp_path / "c"), **options).run()
    assert not (tmp_path / "c" / "index.html").exists()
    assert "Report card written" not in capsys.readouterr().out


@pytest.mark.usefixtures("probe_method")
def test_a_row_fitted_on_its_test_data_is_marked_on_the_page_and_in_the_json(demo_checkpoint: Path,
                                                                             tmp_path: Path) -> None:
    from report_card.page import FIT_OVERLAP_MARK, FIT_OVERLAP_TEXT

    seeds = [seed_variant(demo_checkpoint, tmp_path / f"seed{k}" / "checkpoints" / "best.ckpt", seed=k)
             for k in (1, 2, 3)]
    note = "fit set 'fit' overlaps id_test: 12 of its 60 images are id_test images (allowed by --allow-fit-overlap)"
    for model, base in (("demo-best", 0.7), ("seed1-best", 0.8), ("seed2-best", 0.81), ("seed3-best", 0.82)):
        PROBE[(model, "softmax")] = (base, constant(base) + torch.linspace(-0.05, 0.05, 50, dtype=torch.float64), "u")
        PROBE[(model, "knn")] = (base + 0.1, constant(base + 0.1) + torch.linspace(-0.05, 0.05, 50,
                                                                                   dtype=torch.float64), "u")
    PROBE_OVERLAP.update({("demo-best", "knn"): note, ("seed2-best", "knn"): note})
    card = ReportCard(model=[str(demo_checkpoint), {"name": "eos", "seeds": [str(s) for s in seeds]}],
                      kappa=["softmax", "knn"], sections={"probe": {}}, output_dir=str(tmp_path / "card"),
                      cache_dir=None, trainer={"wandb_mode": "disabled"})
    rows = {(row["model"], row["kappa"]): row for row in card.run()}
    # the marked rows still compete (eos / knn is the best of its column), and say why
    marked = rows[("demo-best", "knn")]
    assert marked["fit_overlap"] == note and marked["cells"]["probe_score"]["fit_overlap"] == note
    assert marked["cells"]["probe_score"]["best"] is False and rows[("eos", "knn")]["cells"]["probe_score"]["best"]
    # a mean over seeds holds the overlap of the seed it came from
    assert rows[("eos", "knn")]["fit_overlap"] == f"seed2-best: {note}"
    assert all("fit_overlap" not in rows[(model, "softmax")] and "fit_overlap" not in
               rows[(model, "softmax")]["cells"]["probe_score"] for model in ("demo-best", "eos"))
    saved = {(row["model"], row["kappa"]): row for row in
             json.loads((tmp_path / "card" / "report.json").read_text())["leaderboard"]["rows"]}
    assert saved[("demo-best", "knn")]["fit_overlap"] == note
    assert saved[("demo-best", "knn")]["cells"]["probe_score"]["fit_overlap"] == note
    page = (tmp_path / "card" / "index.html").read_text()
    knn_row = page.split('data-model="demo-best" data-kappa="knn">')[1].split("</tr>")[0]
    softmax_row = page.split('data-model="demo-best" data-kappa="softmax">')[1].split("</tr>")[0]
    assert f'aria-label="fitted on its test data">{FIT_OVERLAP_MARK}</span>' in knn_row
    assert FIT_OVERLAP_MARK not in softmax_row
    assert page.count(f'aria-label="fitted on its test data">{FIT_OVERLAP_MARK}</span>') == 2  # demo-best, eos
    assert "<li>demo-best / knn: fit set &#x27;fit&#x27; overlaps id_test: 12 of its 60 images" in page
    assert "(run with --allow-fit-overlap)" in page
    markdown = (tmp_path / "card" / "report.md").read_text()
    assert f"| demo-best | knn | 0.800 ▼ <sup>0.00</sup> {FIT_OVERLAP_MARK} |" in markdown
    assert f"- demo-best / knn: {note}" in markdown
    assert FIT_OVERLAP_TEXT.split(":")[0] in markdown


@pytest.mark.slow
def test_a_card_fitted_on_exports_of_its_test_images_marks_the_rows_and_tables_it_shapes(demo_checkpoint: Path,
                                                                                          tmp_path: Path) -> None:
    """The demo's severity section with KNN fitted on a folder of training images and PNG exports of 2 ID test images
    per class (allowed): the KNN row of the leaderboard is marked, and every severity table of the card has the
    ``fit overlap`` column; softmax (no fit) is not marked."""
    from tests.evaluation_engine.test_scoring import export_demo_test_images

    export_demo_test_images(tmp_path / "fit", 2, train=5)
    card = ReportCard(model=[str(demo_checkpoint)], kappa=["softmax", "knn"], intervals={"resamples": 50},
                      output_dir=str(tmp_path / "card"), cache_dir=None, plots=False,
                      trainer={"wandb_mode": "disabled"},
                      sections={"severity": {"data": "fashion", "data_args": {"estimation": 20, "test": 10},
                                   "fit_data": str(tmp_path / "fit"), "allow_fit_overlap": True,
                                   "kappa_args": {"knn": {"k": 1}}}})
    with pytest.warns(RuntimeWarning, match="fit set 'fit' overlaps id_test: 8 of its 28 images are id_test images"):
        rows = {row["kappa"]: row for row in card.run()}
    note = "fit set 'fit' overlaps id_test: 8 of its 28 images are id_test images (allowed by --allow-fit-overlap)"
    assert rows["knn"]["fit_overlap"] == note and "fit_overlap" not in rows["softmax"]
    assert {key: cell.get("fit_overlap") for key, cell in rows["knn"]["cells"].items()} == {
        "severity_mean": note, "severity_hardest": note}
    (section,) = [s for s in card.card["sections"] if s["method"] == "severity"]
    for table in section["tables"]:
        assert table["columns"][-1] == "fit overlap", table["title"]
        assert {row["κ"]: row["fit overlap"] for row in table["rows"]} == {"softmax": "", "knn": note}
    page = (tmp_path / "card" / "index.html").read_text()
    assert page.count('aria-label="fitted on its test data">†</span>') == 2  # the knn row's two severity cells


def test_severity_levels_beyond_the_windows_are_refused_in_the_card_before_any_pass(demo_checkpoint: Path,
                                                                                     tmp_path: Path) -> None:
    from datamodules.severity import FashionSeverityData

    data = FashionSeverityData(estimation=20, test=10)
    data.setup()
    pool, group = len(data.ood_classes), len(data.classes)
    card = ReportCard(model=[str(demo_checkpoint)], output_dir=str(tmp_path / "card"), cache_dir=None,
                      trainer={"wandb_mode": "disabled"},
                      sections={"open_set": {}, "severity": {"data": "fashion", "num_levels": pool - group + 2,
                                   "data_args": {"estimation": 20, "test": 10}}})
    with pytest.raises(ValueError, match=rf"num_levels = {pool - group + 2} asks for more severity levels than "
                                         rf"FashionSeverityData has distinct ones: M − G \+ 1 = {pool} − {group} \+ 1 = "
                                         rf"{pool - group + 1} windows"):
        card.run()
    assert card.passes.log == []  # refused before any section's passes, the OSCR section's before it included
    assert not (tmp_path / "card" / "open_set").exists()


def test_the_python_entry_checks_its_arguments_types(tmp_path: Path) -> None:
    from report_card.card import ModelSeeds, report

    with pytest.raises(TypeError, match=r"report: model must be a model spec .*got 42 \(int\)"):
        report(42, severity={})
    with pytest.raises(TypeError, match=r"report: kappa must be a confidence function's name \(str\) or a list of "
                                        r"names \(list\[str\]\), got 5 \(int\)"):
        report(["x.ckpt"], 5, severity={})
    with pytest.raises(TypeError, match=r"report: output_dir must be str \| None, got 123 \(int\)"):
        report(["x.ckpt"], severity={}, output_dir=123)
    with pytest.raises(TypeError, match=r"report: plots must be bool, got 5 \(int\)"):
        ReportCard(model="x.ckpt", plots=5, sections={"severity": {}})
    assert ReportCard(model="x.ckpt", plots="no", sections={"severity": {}}).plots is False  # as --plots no reads
    with pytest.raises(TypeError, match=r"report: title must be a str, got 3 \(int\)"):
        ReportCard(model="x.ckpt", title=3, sections={"severity": {}})
    with pytest.raises(TypeError, match=r"model eos: seeds must be a list of model specs \(str\), got \['a.ckpt', 2\]"):
        ModelSeeds("eos", ["a.ckpt", 2])
    with pytest.raises(TypeError, match=r"report: each model must be a model spec .*got 7 \(int\) in \['x.ckpt', 7\]"):
        ReportCard(model=["x.ckpt", 7], sections={"severity": {}})
    # paths are taken as their strings
    card = ReportCard(model="x.ckpt", output_dir=tmp_path / "card", cache_dir=tmp_path / "cache",
                      sections={"severity": {}})
    assert card.output_dir == tmp_path / "card" and card.cache_dir == str(tmp_path / "cache")


def card_with_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, Path]:
    """A card whose images are named relative to its folder, one outside it (EvG's own folder), as the card names
    them; the current folder is another one, where neither path resolves."""
    from PIL import Image

    folder = tmp_path / "card"
    for relative, colour in (("open_set/demo-best/oscr_curves.png", (255, 0, 0)),
                             ("../evg/transfer_affine_mh.png", (0, 0, 255))):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6), colour).save(folder / relative)
    card = {"title": "t", "leaderboard": {"columns": [], "rows": []}, "notes": [], "sections": [
        {"method": "open_set", "title": "OSCR", "text": "", "tables": [], "images": [
            {"title": "OSCR curves: demo-best", "path": "open_set/demo-best/oscr_curves.png", "caption": ""}]},
        {"method": "evg", "title": "EvG", "text": "", "tables": [{"title": "worst", "columns": ["a"], "rows": [{"a": 1}]}],
         "images": [{"title": "transfer affine mh", "path": "../evg/transfer_affine_mh.png", "caption": ""}]}]}
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    return card, folder


def page_images(card: dict, folder: Path) -> list[bytes]:
    """The images the page shows: its inlined data."""
    import base64
    import re

    from report_card.page import render_html

    page = render_html(card, folder)
    return [base64.b64decode(uri) for uri in re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)]


def test_every_image_the_page_shows_is_logged_to_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytorch_lightning.loggers import WandbLogger

    from report_card import publish

    card, folder = card_with_images(tmp_path, monkeypatch)
    logged: dict[str, bytes] = {}

    class Recorder(WandbLogger):  # W&B's logger without a run: what log_card hands it
        def log_table(self, **kwargs) -> None:
            pass

        def log_image(self, key: str, images: list, **kwargs) -> None:
            logged[key] = Path(images[0]).read_bytes()

        @property
        def experiment(self):
            return type("Run", (), {"finish": lambda self: None})()

    import evaluation_engine.runner

    monkeypatch.setattr(evaluation_engine.runner, "make_logger", lambda options, name, version=None: Recorder(project="card"))
    publish.log_card(card, TrainerOptions(wandb_mode="offline"), folder=folder)
    assert list(logged) == ["report/open_set/OSCR_curves_demo-best", "report/evg/transfer_affine_mh"]
    assert list(logged.values()) == page_images(card, folder) and len(logged) == 2
    # an image missing on disk is named, not skipped without a word
    (folder / "open_set/demo-best/oscr_curves.png").unlink()
    with pytest.warns(UserWarning, match=r"the card's image 'OSCR curves: demo-best' \(.*card/open_set/demo-best/"
                                         r"oscr_curves.png\) does not exist: not logged to W&B"):
        publish.log_card(card, TrainerOptions(wandb_mode="offline"), folder=folder)


def test_the_wandb_leaderboard_and_the_terminal_say_which_rows_were_fitted_on_their_test_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytorch_lightning.loggers import WandbLogger

    import evaluation_engine.runner
    from report_card import publish
    from report_card.leaderboard import leaderboard_text

    note = "fit set 'fit' overlaps id_test: 2 of its 8 images are id_test images (allowed by --allow-fit-overlap)"
    cell = {"value": 0.9, "low": 0.8, "high": 1.0, "best": True, "significant": False, "share_first": 0.7}
    card = {"title": "t", "notes": [], "sections": [], "leaderboard": {
        "columns": [{"key": "severity_mean", "title": "mean AUROC", "method": "severity"}],
        "rows": [{"model": "m", "kappa": "knn", "fit_overlap": note,
                  "cells": {"severity_mean": {**cell, "fit_overlap": note}}},
                 {"model": "m", "kappa": "softmax", "cells": {"severity_mean": {**cell, "best": False}}}]}}
    tables: dict[str, dict] = {}

    class Recorder(WandbLogger):  # W&B's logger without a run: what log_card hands it
        def log_table(self, key: str, **kwargs) -> None:
            tables[key] = kwargs

        @property
        def experiment(self):
            return type("Run", (), {"finish": lambda self: None})()

    monkeypatch.setattr(evaluation_engine.runner, "make_logger", lambda options, name, version=None: Recorder(project="card"))
    publish.log_card(card, TrainerOptions(wandb_mode="offline"), folder=tmp_path)
    board = tables["report/leaderboard"]
    assert board["columns"][-1] == "fit overlap" and [row[-1] for row in board["data"]] == [note, ""]
    assert leaderboard_text(card).splitlines() == [
        "  m / knn: severity mean AUROC 0.900 [0.800, 1.000] (best) (fitted on its test data)",
        "  m / softmax: severity mean AUROC 0.900 [0.800, 1.000]"]


@pytest.mark.slow
def test_the_wandb_run_holds_every_image_the_page_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same through a real offline W&B run, read back from its files."""
    import hashlib
    import io

    from PIL import Image

    from report_card.publish import log_card

    monkeypatch.setenv("WANDB_MODE", "offline")  # Lightning's offline logger sets it to dryrun: restored after
    monkeypatch.setenv("WANDB_SILENT", "true")
    card, folder = card_with_images(tmp_path, monkeypatch)
    log_card(card, TrainerOptions(wandb_mode="offline", log_dir=str(tmp_path / "logs"), wandb_project="card"),
             folder=folder)

    def pixels(data: bytes) -> str:
        return hashlib.sha256(Image.open(io.BytesIO(data)).convert("RGB").tobytes()).hexdigest()

    runs = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    logged = sorted(pixels(p.read_bytes()) for p in runs[0].glob("files/media/images/**/*.png"))
    shown = sorted(pixels(data) for data in page_images(card, folder))
    assert len(shown) == 2 and logged == shown


@pytest.mark.slow
def test_long_table_titles_get_keys_wandb_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B names a logged table's artifact ``run-<id>-<key>`` and refuses names over 128 characters: a table of a long
    title (the OOD benchmark's per-class table once failed the demo there) is logged under a cut key, through a real
    offline run; two long titles of one start stay two keys."""
    from report_card.publish import KEY_LENGTH, log_card, table_key

    long = "per-class dispersion (GHOST, Rabinowitz et al. 2025): each ID class's AUROC against the group's sets, " \
           "averaged over them; over the classes (no interval)"
    keys = [table_key("ood", long), table_key("ood", long + " again"), table_key("ood", "means")]
    assert keys[2] == "report/ood/means" and all(len(k) <= KEY_LENGTH for k in keys) and len(set(keys)) == 3
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    card = {"title": "t", "notes": [], "leaderboard": {"columns": [], "rows": []}, "sections": [
        {"method": "ood", "title": "OOD", "text": "", "images": [],
         "tables": [{"title": long, "columns": ["κ", "AUROC"], "rows": [{"κ": "softmax", "AUROC": 0.9}]}]}]}
    log_card(card, TrainerOptions(wandb_mode="offline", log_dir=str(tmp_path / "logs"), wandb_project="card"),
             folder=tmp_path)
    (run,) = (tmp_path / "logs" / "wandb").glob("offline-run-*")
    tables = [p.name for p in run.glob("files/media/table/**/*.json")]
    assert len(tables) == 2 and any(name.startswith(keys[0].rsplit("/", 1)[-1]) for name in tables), tables


def test_seeds_that_are_one_network_are_refused_before_any_pass(demo_checkpoint: Path, tmp_path: Path) -> None:
    """Two "seeds" of bit-identical weights (a copy of the checkpoint; runs of a config that fixes its seed) would
    be averaged as two runs, with an interval narrower than one run's: refused, naming them."""
    copy = tmp_path / "copy" / "checkpoints" / "best.ckpt"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(demo_checkpoint.read_bytes())
    other = seed_variant(demo_checkpoint, tmp_path / "other" / "checkpoints" / "best.ckpt")
    card = ReportCard(model=[{"name": "eos", "seeds": [str(demo_checkpoint), str(other), str(copy)]}],
                      output_dir=str(tmp_path / "card"), cache_dir=None,
                      trainer={"wandb_mode": "disabled"},
                      sections={"severity": {"data": "fashion"}})
    with pytest.raises(ValueError, match=rf"model 'eos' of several seeds: {demo_checkpoint} and {copy} are one network "
                                         r"\(identical weights\), not runs of different training seeds"):
        card.run()
    assert card.passes is None and not (tmp_path / "card").exists()
