"""``evaluate.py generated`` (GeneratedBenchmark, DESIGN.md §5.3) against an independent recomputation: every
number of the detector, set and agreement tables redone with numpy, scikit-learn and scipy from the models'
own outputs on the same images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import kendalltau
from sklearn.metrics import roc_auc_score

import evaluate
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.sources import DEMO_KNOWN, DEMO_UNKNOWN, load_fashion_mnist
from tests.test_generate import CLI, generate, manifest, seeded_random_lpips, train_generators

# No ImageNet weights on this machine: the LPIPS backbone is the random one, asked for by name on every
# command line below; its warning says so once per construction.
pytestmark = pytest.mark.filterwarnings(r"ignore:LPIPS\(alex, RANDOM backbone:UserWarning")

KAPPAS = ["softmax", "entropy", "ensemble_mi", "ensemble_softmax"]
REFERENCE = 2  # ID test images the nearest-image LPIPS searches (the brute force below costs 2 s each)
SETS = ("id_test", "near_ood:near", "shift:shift", "real:fashion:unknown", "real:digits")



@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict:
    """Generated sets of the tiny generators, then the benchmark of a classifier and a 2-member ensemble."""
    paths = train_generators(str(tmp_path_factory.getbasetemp() / "generators"))
    root = tmp_path_factory.mktemp("benchmark")
    near = generate(paths["near_ood"], root / "sets" / "near", "--num", "9", "--batch-size", "5", "--reference", "4")
    shift = generate(paths["shift"], root / "sets" / "shift", "--num", "10", "--batch-size", "5")
    members = [str(p) for p in paths["members"]]
    output = root / "tables"
    result = evaluate.main([
        "generated", "--model", members[0], f"ensemble:{members[0]},{members[1]}", "--kappa", *KAPPAS,
        "--near-ood", str(near), "--shift", str(shift), "--real-ood", "fashion:unknown", "digits",
        "--ensemble", *members, "--lpips-net", "alex", "--lpips-random-backbone",
        "--reference", str(REFERENCE), "--output-dir", str(output), *CLI,
    ])
    return {"result": result, "output": output, "near": near, "shift": shift, "members": paths["members"]}


@pytest.fixture(scope="module")
def images(run: dict) -> dict[str, torch.Tensor]:
    """Every set's images in [0, 1] at the models' 28 px, read from the files themselves."""
    from sklearn.datasets import load_digits

    pixels, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")

    def fashion(chosen: tuple[int, ...]) -> torch.Tensor:
        return torch.from_numpy(pixels[np.isin(classes, chosen)]).float().div(255).unsqueeze(1)

    def generated(folder: Path) -> torch.Tensor:
        stored = torch.load(folder / "images.pt", weights_only=True).float().div(255)
        return F.interpolate(stored, size=(28, 28), mode="bilinear", align_corners=False, antialias=True)

    digits = torch.from_numpy(load_digits().images.astype(np.float32) / 16).unsqueeze(1)
    return {
        "id_test": fashion(DEMO_KNOWN),
        "near_ood:near": generated(run["near"]),
        "shift:shift": generated(run["shift"]),
        "real:fashion:unknown": fashion(DEMO_UNKNOWN),
        "real:digits": F.interpolate(digits, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1),
    }


@pytest.fixture(scope="module")
def logits(run: dict, images: dict[str, torch.Tensor]) -> dict[str, dict[str, np.ndarray]]:
    """``{"single": (N, C), "members": (M, N, C)}`` float64 logits of each set, every member loaded on its own."""
    from lightning_modules.checkpoint import load_module
    from lightning_modules.open_set_classifier import OpenSetClassifier

    members = [load_module(p, expected=OpenSetClassifier).eval() for p in run["members"]]
    out = {}
    with torch.no_grad():
        for name, x in images.items():
            stacked = torch.stack([m(x) for m in members]).double().numpy()
            out[name] = {"single": stacked[0], "members": stacked}  # the single model is member 0
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(axis=-1)


def mutual_information(member_logits: np.ndarray) -> np.ndarray:
    p = softmax(member_logits)
    return entropy(p.mean(axis=0)) - entropy(p).mean(axis=0)


def kappa(name: str, out: dict[str, np.ndarray]) -> np.ndarray:
    """κ from the formulas (higher = more in-distribution)."""
    if name == "softmax":
        return softmax(out["single"]).max(axis=1)
    if name == "entropy":
        return -entropy(softmax(out["single"]))
    if name == "ensemble_mi":
        return -mutual_information(out["members"])
    return softmax(out["members"]).mean(axis=0).max(axis=1)


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    """L1 ECE, equal-width bins on the max probability: ``Σ_b |B_b|/N |acc(B_b) - conf(B_b)|``."""
    confidence, correct = probabilities.max(axis=1), probabilities.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    return float(sum((which == b).mean() * abs(correct[which == b].mean() - confidence[which == b].mean())
                     for b in range(bins) if (which == b).any()))


def model_names(run: dict) -> dict[str, str]:
    name = f"{run['members'][0].parent.parent.name}-best"  # .../member0/checkpoints/best.ckpt
    return {"single": name, "ensemble": f"ensemble2-{name}"}


def expected_auroc(logits: dict, kappa_name: str, name: str) -> float:
    inside, outside = kappa(kappa_name, logits["id_test"]), kappa(kappa_name, logits[name])
    truth = np.r_[np.ones(inside.size), np.zeros(outside.size)]  # in-distribution is the positive class
    return float(roc_auc_score(truth, np.r_[inside, outside]))


def auroc_tolerance(logits: dict, kappa_name: str, name: str, relative: float = 2e-7) -> float:
    """The share of (ID, OOD) pairs whose κ differ by less than float32 rounding (about 2 ulps): the library
    scores in float32, this file in float64, so those pairs may be ordered either way. The barely trained
    demo models are nearly uniform, which puts many entropies within ulps of log 4."""
    inside, outside = kappa(kappa_name, logits["id_test"]), kappa(kappa_name, logits[name])
    delta = relative * max(np.abs(inside).max(), np.abs(outside).max())
    ordered = np.sort(inside)
    close = np.searchsorted(ordered, outside + delta, "right") - np.searchsorted(ordered, outside - delta, "left")
    return float(close.sum()) / (inside.size * outside.size) + 1e-12


def source_labels(run: dict) -> np.ndarray:
    return np.array([int(row["source_label"]) for row in manifest(run["shift"])])


def test_detector_aurocs_match_sklearn(run: dict, logits: dict) -> None:
    names = model_names(run)
    rows = {(r["model"], r["confidence function"], r["set"]): r for r in run["result"]["detectors"]}
    expected_keys = {(names["ensemble" if k.startswith("ensemble_") else "single"], k, s)
                     for k in KAPPAS for s in SETS[1:]}
    assert set(rows) == expected_keys and len(run["result"]["detectors"]) == 16
    for (_, kappa_name, name), row in rows.items():
        assert row["kind"] == {"near_ood": "near_ood", "shift": "shift", "real": "real_ood"}[name.split(":")[0]]
        assert row["images"] == logits[name]["single"].shape[0]
        tolerance = auroc_tolerance(logits, kappa_name, name)
        assert tolerance < 2e-3  # a few pairs in a thousand at most, not a loose comparison
        assert row["auroc"] == pytest.approx(expected_auroc(logits, kappa_name, name), abs=tolerance), (kappa_name, name)
    assert [rows[(names["single"], "softmax", s)]["images"] for s in SETS[1:]] == [9, 10, 3000, 1797]


def test_shift_accuracy_and_calibration(run: dict, logits: dict) -> None:
    labels = source_labels(run)
    for row in run["result"]["detectors"]:
        if row["kind"] != "shift":
            assert "accuracy" not in row and "ece" not in row
            continue
        out = logits["shift:shift"]
        single = row["model"] == model_names(run)["single"]
        probabilities = softmax(out["single"]) if single else softmax(out["members"]).mean(axis=0)
        accuracy = float((probabilities.argmax(axis=1) == labels).mean())
        assert row["accuracy"] == pytest.approx(accuracy, abs=1e-12)
        # torchmetrics' multiclass calibration error (15 bins, L1) against the formula in numpy
        assert row["ece"] == pytest.approx(expected_calibration_error(probabilities, labels), abs=1e-6)


def test_sets_table(run: dict, images: dict[str, torch.Tensor], logits: dict) -> None:
    sets = {row["set"]: row for row in run["result"]["sets"]}
    assert list(sets) == list(SETS)
    assert [sets[s]["images"] for s in SETS] == [4000, 9, 10, 3000, 1797]
    assert [sets[s]["kind"] for s in SETS] == ["id", "near_ood", "shift", "real_ood", "real_ood"]
    for name in SETS:  # the ensemble given by --ensemble: the same two members
        mi = mutual_information(logits[name]["members"])
        assert sets[name]["mean MI"] == pytest.approx(float(mi.mean()), rel=1e-4, abs=1e-9), name
    predictions = softmax(logits["shift:shift"]["members"]).mean(axis=0).argmax(axis=1)
    assert sets["shift:shift"]["keeps source label"] == pytest.approx(float((predictions == source_labels(run)).mean()))
    assert "keeps source label" not in sets["near_ood:near"]
    assert "mean LPIPS to nearest ID" not in sets["id_test"]
    lpips = seeded_random_lpips()  # the random backbone evaluate.py builds for --lpips-random-backbone
    references = images["id_test"][:REFERENCE]
    with torch.no_grad():
        for name in SETS[1:]:  # brute force: each image against each reference through LPIPS' forward
            x = images[name]
            pairs = torch.stack([torch.cat([lpips(chunk, r.expand_as(chunk)) for chunk in x.split(1000)])
                                 for r in references], dim=1)
            nearest = float(pairs.min(dim=1).values.double().mean())
            assert sets[name]["mean LPIPS to nearest ID"] == pytest.approx(nearest, abs=1e-5), name
    for name, path in (("near_ood:near", run["near"]), ("shift:shift", run["shift"])):
        assert (sets[name]["lambda_perceptual"], sets[name]["lambda_semantic"]) == (1.0, 1.0)
        assert sets[name]["generator"] == ("near_ood.ckpt" if name.startswith("near") else "shift.ckpt"), path


def test_rank_agreement_matches_scipy(run: dict, logits: dict) -> None:
    names = model_names(run)
    detectors = sorted((names["ensemble" if k.startswith("ensemble_") else "single"], k) for k in KAPPAS)
    agreement = run["result"]["agreement"]
    assert [(row["generated"], row["real"]) for row in agreement] == [
        ("near_ood:near", "real:fashion:unknown"), ("near_ood:near", "real:digits")]
    for row in agreement:
        generated = [expected_auroc(logits, k, row["generated"]) for _, k in detectors]
        real = [expected_auroc(logits, k, row["real"]) for _, k in detectors]
        reference = kendalltau(generated, real)
        assert row["detectors"] == 4
        assert row["kendall tau"] == pytest.approx(reference.statistic, abs=1e-12)
        assert row["p-value"] == pytest.approx(reference.pvalue, abs=1e-12)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def assert_csv_equals(path: Path, rows: list[dict], columns: tuple[str, ...]) -> None:
    written = read_csv(path)
    assert len(written) == len(rows)
    for line, row in zip(written, rows, strict=True):
        assert list(line) == list(columns)
        for name in columns:
            value = row.get(name, "")
            if value is None:  # written as an empty cell
                assert line[name] == "", (path.name, name)
            elif isinstance(value, float):
                assert float(line[name]) == value, (path.name, name)  # repr round-trips exactly
            else:
                assert line[name] == str(value), (path.name, name)


def test_files_hold_the_returned_numbers(run: dict) -> None:
    from callbacks.generated import DETECTOR_COLUMNS, SET_COLUMNS

    out, result = run["output"], run["result"]
    assert_csv_equals(out / "detectors.csv", result["detectors"], DETECTOR_COLUMNS)
    assert_csv_equals(out / "sets.csv", result["sets"], SET_COLUMNS)
    assert_csv_equals(out / "agreement.csv", result["agreement"],
                      ("generated", "real", "detectors", "kendall tau", "p-value"))
    detectors_md = (out / "detectors.md").read_text()
    assert detectors_md.startswith("| model | confidence function | set |")
    assert detectors_md.count("\n") == 2 + len(result["detectors"])
    assert f"{result['detectors'][0]['auroc']:.4f}" in detectors_md
    sets_md = (out / "sets.md").read_text()
    assert sets_md.startswith(f"LPIPS: LPIPS(alex, RANDOM backbone: not a perceptual distance); reference: {REFERENCE}")
    assert (out / "agreement.md").is_file()
    names = model_names(run)
    for name in names.values():  # each model's own table, written by its callback
        assert len(read_csv(out / f"detectors_{name}.csv")) == 8
    grids = sorted(p.name for p in (out / "grids").iterdir())
    assert grids == sorted(["id_test.png", "near_ood_near.png", "shift_shift.png", "real_fashion_unknown.png",
                            "real_digits.png"])
    from PIL import Image

    for grid in grids:
        with Image.open(out / "grids" / grid) as image:
            assert image.format == "PNG" and min(image.size) > 28


@pytest.mark.parametrize("size", [28, 32])
def test_id_test_set_is_the_known_test_images_through_the_models_input(size: int) -> None:
    pixels, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    known = np.flatnonzero(np.isin(classes, DEMO_KNOWN))
    datamodule = FashionMNISTOpenSetDataModule(image_size=size)
    id_test = datamodule.evaluation_set("test", role="id_test", known_only=True)
    assert len(id_test) == 4000 == known.size
    assert id_test.labels().tolist() == [DEMO_KNOWN.index(int(c)) for c in classes[known]]
    raw = torch.from_numpy(pixels[known[[0, 3999]]].copy()).float().div(255).unsqueeze(1)
    # the set holds the images as they are; a model trained at 32 px (the generators) takes them through its
    # datamodule's own resize
    torch.testing.assert_close(torch.stack([id_test.dataset[0].image, id_test.dataset[3999].image]), raw, rtol=0, atol=0)
    expected = raw if size == 28 else F.interpolate(raw, size=(size, size), mode="bilinear", align_corners=False,
                                                    antialias=True)
    pipeline = datamodule.model_input().pipeline
    torch.testing.assert_close(torch.stack([pipeline(id_test.dataset[i].image) for i in (0, 3999)]), expected,
                               rtol=0, atol=1e-6)
