"""``evaluate.py ood`` (:mod:`evaluation_methods.ood`): the OOD benchmark of a model on the demo's benchmark, checked
against numbers computed here without the engine (a plain forward of the model over each set's images, the κ from
its formula, scikit-learn's AUROC), the score-file round trip, and every bad input the method refuses."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from datamodules.catalog import build_ood_benchmark
from evaluation_engine.intervals import Intervals
from evaluation_engine.runner import Runner, TrainerOptions
from evaluation_methods.ood import OODBenchmark, OODEvaluation, Scored, read_scores
from lightning_modules.scoring import ScoringModel
from metrics import resolve_detector

QUIET = TrainerOptions(accelerator="cpu", devices=1, progress_bar=False, wandb_mode="disabled")
SMALL = {"unit_images": 8, "unit_tests": ["uni", "Gaussian"], "corruptions": ["contrast"],
         "val_images": 64}
INTERVALS = {"resamples": 50, "seed": 0}


@pytest.fixture(scope="module")
def benchmark_data():
    return build_ood_benchmark("fashion", SMALL)


def direct_logits(model: ScoringModel, evaluation_set) -> torch.Tensor:
    """The model's logits of every image of a set by a plain forward (its own input transform, no engine)."""
    transform = model.model_input.transform()
    images = torch.stack([transform(evaluation_set.dataset[i].image) for i in range(len(evaluation_set))])
    with torch.no_grad():
        return model.eval()(images).double()


@pytest.fixture(scope="module")
def run(demo_checkpoint: Path, benchmark_data, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("ood") / "out"
    command = OODEvaluation(model=[str(demo_checkpoint)], data="fashion", data_args=SMALL,
                            kappa=["softmax", "energy"], full_spectrum=True, intervals=INTERVALS, output_dir=str(out),
                            cache_dir=None, plots=False, trainer=QUIET)
    return command.run(), out


def test_every_set_and_mean_equals_scikit_learn_on_a_plain_forward(run, demo_checkpoint: Path, benchmark_data) -> None:
    result, _ = run
    model = ScoringModel(str(demo_checkpoint))
    logits = {name: direct_logits(model, benchmark_data[name]) for name in benchmark_data.sets}
    kappas = {"softmax": lambda z: torch.softmax(z, dim=1).max(dim=1).values,
              "energy": lambda z: torch.logsumexp(z, dim=1)}
    id_name = "fashion:known"
    rows = {(r["κ"], r["setting"], r["set"]): r for r in result["sets"]}
    for kappa, formula in kappas.items():
        for setting, id_sets in (("standard", [id_name]), ("full-spectrum", [id_name, "fashion:contrast-3"])):
            id_scores = torch.cat([formula(logits[n]) for n in id_sets]).numpy()
            per_group: dict[str, list[float]] = {}
            for name in benchmark_data.of("near", "far", "unit"):
                ood = formula(logits[name]).numpy()
                expected = roc_auc_score(np.r_[np.ones(len(id_scores)), np.zeros(len(ood))], np.r_[id_scores, ood])
                row = rows[(kappa, setting, name)]
                assert row["auroc"] == pytest.approx(expected, abs=1e-6)
                assert row["auroc low"] <= row["auroc"] <= row["auroc high"]
                per_group.setdefault(benchmark_data.groups[name], []).append(row["auroc"])
            for group, values in per_group.items():
                assert rows[(kappa, setting, group)]["auroc"] == pytest.approx(float(np.mean(values)), abs=1e-12)
    labels = benchmark_data[id_name].labels()
    accuracy = float((logits[id_name].argmax(dim=1) == labels).double().mean())
    summary = {(r["κ"], r["setting"]): r for r in result["summary"]}
    assert summary[("softmax", "standard")]["ID accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_the_per_class_dispersion_is_each_classs_auroc_averaged_over_the_groups_sets(run, demo_checkpoint: Path,
                                                                                    benchmark_data) -> None:
    """GHOST's quantity, recomputed with scikit-learn from a plain forward: each ID class against each near (far) set,
    averaged over the sets; the mean, the population std, the worst and best class over the classes."""
    result, out = run
    model = ScoringModel(str(demo_checkpoint))
    id_name = "fashion:known"
    energy = {name: torch.logsumexp(direct_logits(model, benchmark_data[name]), dim=1).numpy()
              for name in benchmark_data.sets}
    labels = benchmark_data[id_name].labels().numpy()
    rows = {(r["κ"], r["group"]): r for r in result["per_class"]}
    for group in ("near", "far"):
        names = benchmark_data.of(group)
        per_class = np.array([[roc_auc_score(np.r_[np.ones((labels == c).sum()), np.zeros(len(energy[n]))],
                                             np.r_[energy[id_name][labels == c], energy[n]])
                               for c in np.unique(labels)] for n in names]).mean(axis=0)
        row = rows[("energy", group)]
        assert (row["sets"], row["classes"]) == (len(names), len(np.unique(labels)))
        assert row["mean per-class AUROC"] == pytest.approx(per_class.mean(), abs=1e-6)
        assert row["std over classes"] == pytest.approx(per_class.std(), abs=1e-6)
        assert (row["worst class"], row["best class"]) == (int(per_class.argmin()), int(per_class.argmax()))
        assert row["range"] == pytest.approx(per_class.max() - per_class.min(), abs=1e-6)
    assert (out / "per_class.csv").read_text().count("\n") == 1 + len(result["per_class"])


def test_the_headlines_are_the_near_and_far_means_with_their_replicates(run) -> None:
    result, _ = run
    rows = {(r["κ"], r["setting"], r["set"]): r for r in result["sets"]}
    estimates = {(e.kappa, e.key): e for e in result.estimates}
    for kappa in ("softmax", "energy"):
        near = estimates[(kappa, "ood_near_auroc")]
        assert near.value == pytest.approx(rows[(kappa, "standard", "near")]["auroc"])
        assert near.replicates is not None and near.replicates.numel() == INTERVALS["resamples"]
        far = estimates[(kappa, "ood_far_fpr95")]
        assert far.value == pytest.approx(rows[(kappa, "standard", "far")]["fpr@95tpr"])


def test_score_files_round_trip_to_the_same_numbers(run, tmp_path: Path) -> None:
    result, out = run
    (folder,) = (out / "scores").iterdir()  # one model: its folder of score files
    again = OODEvaluation(scores=str(folder), data="fashion", data_args=SMALL, full_spectrum=True,
                          intervals=INTERVALS, output_dir=str(tmp_path / "again"), plots=False, trainer=QUIET).run()
    first = {(r["κ"], r["setting"], r["set"]): r for r in result["sets"]}
    second = {(r["κ"], r["setting"], r["set"]): r for r in again["sets"]}
    assert set(first) == set(second)
    for key, row in first.items():
        for metric in ("auroc", "auroc low", "auroc high", "fpr@95tpr", "fpr@95tpr-openood", "aupr-in", "aurc"):
            assert second[key][metric] == pytest.approx(row[metric], abs=1e-9), (key, metric)
    summary = {(r["κ"], r["setting"]): r for r in again["summary"]}
    assert summary[("softmax", "standard")]["ID accuracy"] == pytest.approx(
        {(r["κ"], r["setting"]): r for r in result["summary"]}[("softmax", "standard")]["ID accuracy"])


def _copy_scores(run, tmp_path: Path) -> Path:
    _, out = run
    source = next((out / "scores").iterdir())
    target = tmp_path / "scores"
    for path in source.rglob("*"):
        if path.is_file():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).write_bytes(path.read_bytes())
    return target


def _edit(path: Path, change) -> None:
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    rows = change(rows)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


@pytest.mark.parametrize(("change", "message"), [
    (lambda rows: rows + [rows[1]], "1 duplicated"),
    (lambda rows: rows[:-1], "1 missing"),
    (lambda rows: rows + [["elsewhere/0", "0.5"]], "1 not in the list"),
    (lambda rows: [rows[0], [rows[1][0], "nan", *rows[1][2:]], *rows[2:]], "NaN or infinite"),
])
def test_a_score_file_not_covering_its_set_exactly_is_refused(run, benchmark_data, tmp_path: Path, change,
                                                              message: str) -> None:
    folder = _copy_scores(run, tmp_path)
    _edit(folder / "softmax" / "unit_Gaussian.csv", change)
    with pytest.raises(ValueError, match=message) as error:
        read_scores(folder, benchmark_data, ["fashion:known", "unit:Gaussian"], sign=None)
    assert "unit:Gaussian" in str(error.value)


def test_a_sign_against_the_files_declaration_or_none_at_all_is_refused(run, benchmark_data, tmp_path: Path) -> None:
    folder = _copy_scores(run, tmp_path)
    with pytest.raises(ValueError, match="contradicts"):
        read_scores(folder, benchmark_data, ["fashion:known"], sign="higher_is_ood")
    (folder / "scores.json").unlink()
    with pytest.raises(ValueError, match="--score-sign"):
        read_scores(folder, benchmark_data, ["fashion:known"], sign=None)
    _, id_first = read_scores(folder, benchmark_data, ["fashion:known"], sign="higher_is_id")[:2]
    _, id_flipped = read_scores(folder, benchmark_data, ["fashion:known"], sign="higher_is_ood")[:2]
    assert torch.equal(id_flipped["softmax"]["fashion:known"], -id_first["softmax"]["fashion:known"])


def test_a_model_of_another_class_count_is_refused_before_any_pass(benchmark_data, tmp_path: Path) -> None:
    model = ScoringModel("timm:resnet18", pretrained=False)
    benchmark = OODBenchmark(benchmark_data, [resolve_detector("softmax")], kappa_parameters={"softmax": {}},
                             intervals=Intervals(resamples=20))
    with pytest.raises(ValueError, match="1000 known classes and the benchmark fashion 4"):
        benchmark.check([model])
    assert benchmark.passes.passes == 0


def test_full_spectrum_needs_covariate_shifted_sets(tmp_path: Path) -> None:
    data = build_ood_benchmark("fashion", {**SMALL, "corruptions": []})
    with pytest.raises(ValueError, match="no covariate-shifted ID set"):
        OODBenchmark(data, [resolve_detector("softmax")], kappa_parameters={}, full_spectrum=True)


def test_models_and_scores_together_or_neither_are_refused() -> None:
    with pytest.raises(ValueError, match="not both and not neither"):
        OODEvaluation(data="fashion", trainer=QUIET)
    with pytest.raises(ValueError, match="not both and not neither"):
        OODEvaluation(model=["a.ckpt"], scores="x", data="fashion", trainer=QUIET)
    # another tool's scores: nothing of ours chose their parameters or fits, so nothing of ours is claimed
    with pytest.raises(ValueError, match=r"\['--tune', '--preset openood', '--kappa-arg'\] would apply to no detector"):
        OODEvaluation(scores="x", data="openood:cifar10", tune=True, preset="openood",
                      kappa_args={"softmax": {}}, trainer=QUIET)


def test_an_unknown_benchmark_names_those_there_are() -> None:
    with pytest.raises(ValueError, match="fashion"):
        build_ood_benchmark("openood:imagenet2k", {})


def test_the_openood_preset_names_the_detectors_it_has_before_any_data(tmp_path: Path) -> None:
    command = OODEvaluation(model=["timm:resnet18"], data="openood:cifar10", kappa=["softmax", "ash_s"],
                            preset="openood", data_root=str(tmp_path / "nowhere"), output_dir=str(tmp_path / "out"),
                            trainer=QUIET)
    with pytest.raises(ValueError, match=r"preset 'openood' has no detector 'ash_s'.*it has \[.*'ash_b'"):
        command.prepare()
    with pytest.raises(ValueError, match="unknown benchmark 'fashion'|benchmarks"):
        OODEvaluation(model=["a.ckpt"], data="fashion", preset="openood", trainer=QUIET).prepare()


def test_missing_images_are_counted_per_set_before_any_pass(tmp_path: Path) -> None:
    from datamodules.openood import openood_tree

    lists = openood_tree(tmp_path / "openood", "cifar10", sets=["id_val", "id_test", "ood_val", "near", "far"],
                         per_set=3, seed=1)
    missing = next((tmp_path / "openood" / "images_classic" / "tin").rglob("*.*"))
    missing.unlink()
    command = OODEvaluation(model=["timm:resnet18"], data="openood:cifar10", data_root=str(tmp_path / "openood"),
                            data_args={"subset_lists": {k: str(v) for k, v in lists.items()}}, random_weights=True,
                            output_dir=str(tmp_path / "out"), trainer=QUIET)
    with pytest.raises(FileNotFoundError, match=r"tin: 1 of 3 images missing under .*images_classic \(first: tin/"):
        command.prepare()
    assert not (tmp_path / "out").exists()


def test_tuning_refuses_a_validation_set_that_is_a_test_set(benchmark_data) -> None:
    from datamodules.evaluation import EvaluationSet
    from datamodules.ood_benchmark import OODBenchmarkData

    near = benchmark_data["fashion:unknown"]
    again = EvaluationSet("my-ood-val", "ood_val", near.dataset)  # the test images under another name
    leaking = OODBenchmarkData("leaking", [("id_test", benchmark_data["fashion:known"], {}),
                                           ("id_val", benchmark_data["fashion:known-val"], {}),
                                           ("ood_val", again, {}), ("near", near, {})],
                               classes=benchmark_data.classes, num_classes=4)
    with pytest.raises(ValueError, match="validation set my-ood-val is also the test set fashion:unknown"):
        OODBenchmark(leaking, [resolve_detector("gen")], kappa_parameters={}, tune=True)


def test_tuning_picks_the_best_validation_auroc_of_openoods_grid(demo_checkpoint: Path, benchmark_data,
                                                                 tmp_path: Path) -> None:
    """GEN's grid (γ x M) searched on the ID and OOD validation sets: the choice is the first maximum of the
    validation AUROCs computed here (GEN from its formula on a plain forward, scikit-learn's AUROC), and the test
    rows use it."""
    from metrics.detectors.presets import SEARCH_GRIDS, grid_combinations

    model = ScoringModel(str(demo_checkpoint))
    benchmark = OODBenchmark(benchmark_data, [resolve_detector("gen")], kappa_parameters={"gen": {}}, tune=True,
                             intervals=Intervals(resamples=20))
    scored = benchmark.score(Runner.local(), [model])
    (tuned,) = benchmark.tuned
    probabilities = {name: torch.softmax(direct_logits(model, benchmark_data[name]), dim=1)
                     for name in ("fashion:known-val", "fashion:negative")}

    def gen(p: torch.Tensor, gamma: float, m: int) -> torch.Tensor:  # Liu et al. 2023: -Σ_top-M p^γ (1-p)^γ
        top = p.sort(dim=1, descending=True).values[:, :m]
        return -(top ** gamma * (1 - top) ** gamma).sum(dim=1)

    aurocs = []
    for combination in grid_combinations(SEARCH_GRIDS["gen"]):
        id_val, ood_val = (gen(probabilities[n], combination["gamma"], combination["M"]).numpy()
                           for n in ("fashion:known-val", "fashion:negative"))
        aurocs.append(roc_auc_score(np.r_[np.ones(len(id_val)), np.zeros(len(ood_val))], np.r_[id_val, ood_val]))
    assert list(tuned["validation AUROC"].values()) == pytest.approx(aurocs, abs=1e-6)
    best = grid_combinations(SEARCH_GRIDS["gen"])[int(np.argmax(np.round(aurocs, 9)))]
    assert tuned["chosen"] == best and scored[0].parameters == {**best}


def test_the_card_section_shows_the_published_rows_beside_the_runs_own(run, tmp_path: Path) -> None:
    """OpenOOD's leaderboard rows (package data) as reference rows marked "published, no interval", after the run's
    own rows with their intervals; the per-set table holds the standard setting's named sets."""
    from datamodules.openood import read_leaderboard
    from evaluation_methods.ood import OODMethod, published_rows
    from evaluation_methods.registry import CardContext

    result, _ = run
    result["published"] = published_rows("openood:imagenet1k")
    section = OODMethod().section({None: result}, CardContext(Intervals(), False, tmp_path))
    tables = {table.title.split(" (")[0].split(":")[0]: table for table in section.tables}
    published = tables["published"]
    assert [r["Postprocessor"] for r in published.rows] == [r["Postprocessor"] for r in read_leaderboard("imagenet1k_ood")]
    assert all("no interval" in r["published"] and r["setting"] == "standard" for r in published.rows)
    own = tables["per set"].rows
    assert {r["set"] for r in own} == {"fashion:unknown", "digits"} and {r["κ"] for r in own} == {"softmax", "energy"}
    cell = own[0]["AUROC"]
    assert cell["low"] <= cell["value"] <= cell["high"]
    assert [(r["κ"], r["source"]) for r in tables["detector parameters"].rows] == [
        ("softmax", "the project's default"), ("energy", "the project's default")]
    means = tables["means over each group's sets"].rows
    assert {(r["setting"], r["mean over"]) for r in means} == {(s, g) for s in ("standard", "full-spectrum")
                                                                for g in ("near", "far", "unit", "all")}


def test_imagenet21k_sets_join_an_openood_benchmark_as_their_own_group(tmp_path: Path) -> None:
    """ImageNet-OOD and SSB (easy, hard) from an ImageNet-21k tree of real file names join openood:imagenet1k as the
    group in21k: rows and a mean of their own, OpenOOD's near and far means untouched; their lists' hashes recorded."""
    from datamodules.imagenet21k_sets import MANIFEST
    from datamodules.openood import openood_tree
    from tests.datamodules.test_imagenet21k_sets import CLASSES, make_tree

    lists = openood_tree(tmp_path / "openood", "imagenet1k", per_set=3, seed=2)
    make_tree(tmp_path / "imagenet21k")
    data = build_ood_benchmark("openood:imagenet1k", {
        "data_root": str(tmp_path / "openood"), "subset_lists": {k: str(v) for k, v in lists.items()},
        "imagenet21k": ["imagenet_ood", "ssb_easy_21k", "ssb_hard_21k"],
        "imagenet21k_root": str(tmp_path / "imagenet21k"), "imagenet21k_classes": CLASSES})
    assert data.of("in21k") == ["imagenet_ood", "ssb_easy_21k", "ssb_hard_21k"]
    assert {name: data.provenance[name]["sha256"] for name in data.of("in21k")} == {
        name: MANIFEST[name].sha256 for name in data.of("in21k")}
    benchmark = OODBenchmark(data, [resolve_detector("softmax")], kappa_parameters={}, intervals=Intervals(resamples=20))
    generator = torch.Generator().manual_seed(0)
    scores = {name: torch.rand(len(data[name]), generator=generator, dtype=torch.float64) for name in benchmark.scored_sets}
    result = benchmark.tables([Scored("model", "softmax", scores)])
    rows = {r["set"]: r for r in result["sets"]}
    assert rows["in21k"]["auroc"] == pytest.approx(np.mean([rows[n]["auroc"] for n in data.of("in21k")]), abs=1e-12)
    assert rows["near"]["auroc"] == pytest.approx(np.mean([rows[n]["auroc"] for n in ("ssb_hard", "ninco")]), abs=1e-12)
    assert rows["all"]["auroc"] == pytest.approx(np.mean([rows[n]["auroc"] for n in data.of("near", "far")]), abs=1e-12)


def test_a_later_run_replaces_a_models_score_folder_whole(benchmark_data, tmp_path: Path) -> None:
    """Scores of a run with two detectors, then of one with one: the folder holds the later run's detector only (a
    later --scores would otherwise read the first run's other detector as if it were this run's)."""
    benchmark = OODBenchmark(benchmark_data, [resolve_detector("softmax")], kappa_parameters={},
                             intervals=Intervals(resamples=20), output_dir=tmp_path, plots=False)
    generator = torch.Generator().manual_seed(1)
    scores = {name: torch.rand(len(benchmark_data[name]), generator=generator, dtype=torch.float64)
              for name in benchmark.scored_sets}
    first = [Scored("model", "softmax", scores), Scored("model", "energy", scores)]
    benchmark.write(benchmark.tables(first), first)
    assert sorted(p.name for p in (tmp_path / "scores" / "model").iterdir() if p.is_dir()) == ["energy", "softmax"]
    benchmark.write(benchmark.tables(first[:1]), first[:1])
    assert sorted(p.name for p in (tmp_path / "scores").iterdir()) == ["model"]
    assert sorted(p.name for p in (tmp_path / "scores" / "model").iterdir() if p.is_dir()) == ["softmax"]
    assert json.loads((tmp_path / "scores" / "model" / "scores.json").read_text())["detectors"] == ["softmax"]
