"""``evaluate.py generated`` (GeneratedBenchmark, DESIGN.md §5.3) against an independent recomputation: every
number of the detector, set and agreement tables redone with numpy, scikit-learn and scipy from the models'
own outputs on the same images. The tests on the full run (its fixture costs about 45 s on 2 cores) are in the
slow tier; the default tier keeps the ones that need no run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import binomtest, kendalltau
from sklearn.metrics import roc_auc_score

import evaluate
from callbacks.generated import GeneratedBenchmark
from callbacks.severity import model_name
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.sources import DEMO_KNOWN, DEMO_UNKNOWN, load_fashion_mnist
from tests.test_generate import CLI, generate, manifest, seeded_random_lpips, train_generators

# No ImageNet weights on this machine: the LPIPS backbone is the random one, asked for by name on every
# command line below; its warning says so once per construction.
pytestmark = pytest.mark.filterwarnings(r"ignore:LPIPS\(alex, RANDOM backbone:UserWarning")

KAPPAS = ["softmax", "entropy", "ensemble_mi", "ensemble_softmax"]
REFERENCE = 2  # ID test images the nearest-image LPIPS searches (the brute force below costs 2 s each)
SETS = ("id_test", "near_ood:near", "shift:shift", "real:fashion:unknown", "real:digits", "real_shift:inverted")
KEPT = "shift:shift (label kept)"
PER_CLASS = 5  # images of each known class in the real shifted set
FOLDERS = ("T-shirt_top", "Trouser", "Sneaker", "Bag")  # the demo's known classes as folder names


def write_inverted_fashion(root: Path) -> tuple[Path, np.ndarray]:
    """A real shifted set as class folders: the first known-class test images of each class, inverted, as grey PNG
    files under ``<root>/<class name>/``; returns the folder and their test-set indices in folder order."""
    from PIL import Image

    pixels, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    chosen = []
    for folder, fashion_class in zip(FOLDERS, DEMO_KNOWN, strict=True):
        indices = np.flatnonzero(classes == fashion_class)[:PER_CLASS]
        for i, index in enumerate(indices):
            (root / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(255 - pixels[index]).save(root / folder / f"{i}.png")
        chosen.append(indices)
    order = np.argsort(FOLDERS, kind="stable")  # the folders are read in sorted order
    return root, np.concatenate([chosen[i] for i in order])



@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict:
    """Generated sets of the tiny generators, then the benchmark of a classifier and a 2-member ensemble."""
    paths = train_generators(str(tmp_path_factory.getbasetemp() / "generators"))
    root = tmp_path_factory.mktemp("benchmark")
    near = generate(paths["near_ood"], root / "sets" / "near", "--num", "9", "--batch-size", "5", "--reference", "4")
    shift = generate(paths["shift"], root / "sets" / "shift", "--num", "10", "--batch-size", "5")
    members = [str(p) for p in paths["members"]]
    inverted, inverted_indices = write_inverted_fashion(root / "inverted")
    output = root / "tables"
    # every κ of a model reads one set of predictions per labelled set: count how often they are computed
    calls: list[tuple[str, str]] = []
    computed = GeneratedBenchmark._classification

    def counted(self, trainer, model, name, background, batch):
        calls.append((model_name(model), name))
        return computed(self, trainer, model, name, background, batch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GeneratedBenchmark, "_classification", counted)
        result = evaluate.main([
            "generated", "--model", members[0], f"ensemble:{members[0]},{members[1]}", "--kappa", *KAPPAS,
            "--near-ood", str(near), "--shift", str(shift), "--real-ood", "fashion:unknown", "digits",
            "--real-shift", str(inverted), "--label-filter",
            "--ensemble", *members, "--allow-weak-ensemble", "--lpips-net", "alex", "--lpips-random-backbone",
            "--reference", str(REFERENCE), "--output-dir", str(output), "--cache-dir", str(root / "cache"), *CLI,
        ])
    return {"calls": calls, "result": result, "output": output, "near": near, "shift": shift, "members": paths["members"],
            "inverted": inverted_indices, "cache": root / "cache"}


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
    sources = np.array([int(row["source_index"]) for row in manifest(run["shift"])])
    return {
        "sources": torch.from_numpy(pixels[sources]).float().div(255).unsqueeze(1),
        "real_shift:inverted": torch.from_numpy(255 - pixels[run["inverted"]]).float().div(255).unsqueeze(1),
        "id_test": fashion(DEMO_KNOWN),
        "near_ood:near": generated(run["near"]),
        "shift:shift": generated(run["shift"]),
        "real:fashion:unknown": fashion(DEMO_UNKNOWN),
        "real:digits": F.interpolate(digits, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1),
    }


def scored_logits(run: dict) -> dict[str, dict[str, np.ndarray]]:
    """The logits the benchmark scored, from its pass cache: ``{set: {"single": (N, C), "members": (M, N, C)}}``
    (the single model's pass, the ensemble's pass; the describer is the same ensemble, so the same pass)."""
    single, ensemble = model_names(run).values()
    found: dict[str, dict[str, np.ndarray]] = {}
    for path in sorted(run["cache"].glob("*-logits-*.pt")):
        payload = torch.load(path, weights_only=True)
        name, values = payload["meta"]["set"], payload["tensors"]["logits"].double()
        if path.name.startswith(f"{ensemble}-"):
            found.setdefault(name, {})["members"] = values.transpose(0, 1).numpy()  # (N, M, C) -> (M, N, C)
        elif path.name.startswith(f"{single}-"):
            found.setdefault(name, {})["single"] = values.numpy()
    return found


@pytest.fixture(scope="module")
def logits(run: dict, images: dict[str, torch.Tensor]) -> dict[str, dict[str, np.ndarray]]:
    """``{"single": (N, C), "members": (M, N, C)}`` float64 logits of each set, as the benchmark scored them.

    Every number the tests below recompute (AUROC, accuracy, ECE, MI, Kendall's τ) derives from these, not from
    a second forward: a forward of a whole set at once, member by member, puts other images together through
    the convolutions than the benchmark's batches (and its channels-last members), and agrees with them only to
    float32 rounding, whose size depends on the CPU; over 4000 x 3000 (ID, OOD) pairs some near-tie then flips
    and moves an AUROC by 1 / (N_ID N_OOD). The second forward, every member loaded on its own on the images
    read from the files, checks that these are the models' logits of these images in set order."""
    from lightning_modules.checkpoint import load_module
    from lightning_modules.open_set_classifier import OpenSetClassifier

    scored = scored_logits(run)
    # the shifted images' sources are ID test images: their logits are those rows of the ID test pass
    _, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    rows = np.searchsorted(np.flatnonzero(np.isin(classes, DEMO_KNOWN)),
                           [int(row["source_index"]) for row in manifest(run["shift"])])
    scored["sources"] = subset(scored["id_test"], rows)
    assert set(scored) == set(images)
    members = [load_module(p, expected=OpenSetClassifier).eval() for p in run["members"]]
    with torch.no_grad():
        for name, x in images.items():
            stacked = torch.stack([m(x) for m in members]).double().numpy()
            np.testing.assert_allclose(scored[name]["members"], stacked, rtol=1e-4, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(scored[name]["single"], stacked[0], rtol=1e-4, atol=1e-5, err_msg=name)
    return scored


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


def set_labels(run: dict, name: str) -> np.ndarray:
    """The known-class labels of a labelled set, from the files: the manifest, the IDX file."""
    if name.startswith("shift"):
        return source_labels(run)
    _, classes = load_fashion_mnist(FashionMNISTOpenSetDataModule()._folder(), "test")
    if name == "id_test":
        return np.array([DEMO_KNOWN.index(int(c)) for c in classes[np.isin(classes, DEMO_KNOWN)]])
    return np.array([DEMO_KNOWN.index(int(c)) for c in classes[run["inverted"]]])


def label_kept(logits: dict) -> np.ndarray:
    """Mukhoti et al.'s condition with the describing ensemble (the two members): its prediction on each shifted
    image equals its prediction on the source."""
    prediction = softmax(logits["shift:shift"]["members"]).mean(axis=0).argmax(axis=1)
    return prediction == softmax(logits["sources"]["members"]).mean(axis=0).argmax(axis=1)


def subset(out: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {"single": out["single"][keep], "members": out["members"][:, keep]}


def with_kept(logits: dict) -> dict:
    """The logits with the label-keeping shifted images as a set of their own (for the expected numbers)."""
    return {**logits, KEPT: subset(logits["shift:shift"], label_kept(logits))}


@pytest.mark.slow
def test_detector_aurocs_match_sklearn(run: dict, logits: dict) -> None:
    names = model_names(run)
    logits = with_kept(logits)
    rows = {(r["model"], r["confidence function"], r["set"]): r for r in run["result"]["detectors"]}
    evaluated = (*SETS, KEPT)
    expected_keys = {(names["ensemble" if k.startswith("ensemble_") else "single"], k, s)
                     for k in KAPPAS for s in evaluated}
    assert set(rows) == expected_keys and len(run["result"]["detectors"]) == 4 * 7
    kinds = {"id_test": "id", "near_ood": "near_ood", "shift": "shift", "real": "real_ood", "real_shift": "real_shift"}
    for (_, kappa_name, name), row in rows.items():
        assert row["kind"] == kinds[name.split(":")[0]]
        assert row["images"] == logits[name]["single"].shape[0]
        if name == "id_test":
            assert row["auroc"] is None
            continue
        tolerance = auroc_tolerance(logits, kappa_name, name)
        assert tolerance < 2e-3  # a few pairs in a thousand at most, not a loose comparison
        assert row["auroc"] == pytest.approx(expected_auroc(logits, kappa_name, name), abs=tolerance), (kappa_name, name)
    assert [rows[(names["single"], "softmax", s)]["images"] for s in SETS] == [4000, 9, 10, 3000, 1797, 4 * PER_CLASS]
    assert rows[(names["single"], "softmax", KEPT)]["images"] == int(label_kept(logits).sum())
    # (the barely trained members predict one class nearly everywhere, so here every image keeps its label; the
    # filter's choice itself is pinned by test_label_filter_compares_each_shifted_image_with_its_source)


@pytest.mark.slow
def test_accuracy_and_calibration_on_id_shifted_and_real_shifted_sets(run: dict, logits: dict) -> None:
    # each model's predictions of each labelled set (ID test, shifted, real shifted) computed once for all its κ
    assert len(run["calls"]) == len(set(run["calls"])) == 2 * 3
    logits = with_kept(logits)
    kept = label_kept(logits)
    checked = set()
    for row in run["result"]["detectors"]:
        if row["kind"] not in ("id", "shift", "real_shift"):
            assert "accuracy" not in row and "ece" not in row
            continue
        name = row["set"]
        labels = source_labels(run)[kept] if name == KEPT else set_labels(run, name)
        out = logits[name]
        single = row["model"] == model_names(run)["single"]
        probabilities = softmax(out["single"]) if single else softmax(out["members"]).mean(axis=0)
        correct = int((probabilities.argmax(axis=1) == labels).sum())
        assert row["accuracy"] == pytest.approx(correct / len(labels), abs=1e-12)
        wilson = binomtest(correct, len(labels)).proportion_ci(0.95, method="wilson")  # a proportion's interval
        assert (row["accuracy low"], row["accuracy high"]) == pytest.approx((wilson.low, wilson.high), abs=1e-12)
        # torchmetrics' multiclass calibration error (15 bins, L1) against the formula in numpy
        assert row["ece"] == pytest.approx(expected_calibration_error(probabilities, labels), abs=1e-6), name
        checked.add(name)
    assert checked == {"id_test", "shift:shift", KEPT, "real_shift:inverted"}


@pytest.mark.slow
def test_sets_table(run: dict, images: dict[str, torch.Tensor], logits: dict) -> None:
    from datamodules.images import balanced_choice

    sets = {row["set"]: row for row in run["result"]["sets"]}
    assert list(sets) == list(SETS)
    assert [sets[s]["images"] for s in SETS] == [4000, 9, 10, 3000, 1797, 4 * PER_CLASS]
    assert [sets[s]["kind"] for s in SETS] == ["id", "near_ood", "shift", "real_ood", "real_ood", "real_shift"]
    assert sets["shift:shift"]["keeps ensemble label"] == pytest.approx(float(label_kept(logits).mean()), abs=1e-12)
    assert "keeps ensemble label" not in sets["near_ood:near"]
    assert (sets["shift:shift"]["mode"], sets["near_ood:near"]["mode"], sets["id_test"]["mode"]) == ("eval", "eval", None)
    for name in SETS:  # the ensemble given by --ensemble: the same two members
        mi = mutual_information(logits[name]["members"])
        assert sets[name]["mean MI"] == pytest.approx(float(mi.mean()), rel=1e-4, abs=1e-9), name
    predictions = softmax(logits["shift:shift"]["members"]).mean(axis=0).argmax(axis=1)
    assert sets["shift:shift"]["keeps source label"] == pytest.approx(float((predictions == source_labels(run)).mean()))
    assert "keeps source label" not in sets["near_ood:near"]
    assert "mean LPIPS to nearest ID" not in sets["id_test"]
    lpips = seeded_random_lpips()  # the random backbone evaluate.py builds for --lpips-random-backbone
    references = images["id_test"][balanced_choice(set_labels(run, "id_test"), REFERENCE, 0)]  # seeded, balanced
    with torch.no_grad():
        for name in SETS[1:]:  # brute force: each image against each reference through LPIPS' forward
            x = images[name]
            pairs = torch.stack([torch.cat([lpips(chunk, r.expand_as(chunk)) for chunk in x.split(1000)])
                                 for r in references], dim=1)
            nearest = float(pairs.min(dim=1).values.double().mean())
            # a mean of distances through another batching of the backbone: equal to float32 rounding
            assert sets[name]["mean LPIPS to nearest ID"] == pytest.approx(nearest, rel=1e-4, abs=1e-5), name
    for name, path in (("near_ood:near", run["near"]), ("shift:shift", run["shift"])):
        assert (sets[name]["lambda_perceptual"], sets[name]["lambda_semantic"]) == (1.0, 1.0)
        assert sets[name]["generator"] == ("near_ood.ckpt" if name.startswith("near") else "shift.ckpt"), path


@pytest.mark.slow
def test_rank_agreement_matches_scipy(run: dict, logits: dict) -> None:
    names = model_names(run)
    logits = with_kept(logits)
    detectors = sorted((names["ensemble" if k.startswith("ensemble_") else "single"], k) for k in KAPPAS)
    agreement = run["result"]["agreement"]
    assert [(row["generated"], row["real"]) for row in agreement] == [
        ("near_ood:near", "real:fashion:unknown"), ("near_ood:near", "real:digits"),
        ("shift:shift", "real_shift:inverted"), (KEPT, "real_shift:inverted")]  # the shift side too
    for row in agreement:
        generated = [expected_auroc(logits, k, row["generated"]) for _, k in detectors]
        real = [expected_auroc(logits, k, row["real"]) for _, k in detectors]
        reference = kendalltau(generated, real)
        assert row["detectors"] == 4 and row["detectors sharing generator ensemble"] == 4
        assert row["kendall tau"] == pytest.approx(reference.statistic, abs=1e-12)
        assert row["p-value"] == pytest.approx(reference.pvalue, abs=1e-12)


@pytest.mark.slow
def test_detectors_and_describer_of_the_training_ensemble_are_flagged(run: dict) -> None:
    # the generators were trained against members 0 and 1: the single model is member 0, the ensemble and the
    # describer are both members
    assert {row["shares generator ensemble"] for row in run["result"]["detectors"]} == {"near_ood:near, shift:shift"}
    sets = {row["set"]: row for row in run["result"]["sets"]}
    assert [sets[s].get("describer shares generator ensemble") for s in SETS] == [None, "yes", "yes", None, None, None]


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


@pytest.mark.slow
def test_files_hold_the_returned_numbers(run: dict) -> None:
    from callbacks.generated import AGREEMENT_COLUMNS, DETECTOR_COLUMNS, SET_COLUMNS

    out, result = run["output"], run["result"]
    assert_csv_equals(out / "detectors.csv", result["detectors"], DETECTOR_COLUMNS)
    assert_csv_equals(out / "sets.csv", result["sets"], SET_COLUMNS)
    assert_csv_equals(out / "agreement.csv", result["agreement"], AGREEMENT_COLUMNS)
    preamble, table = (out / "detectors.md").read_text().split("\n\n", 1)
    assert preamble.startswith("95% intervals (1000 bootstrap resamples, seed 0; AUROC logit DeLong")
    from callbacks.generated import ECE_NOTE

    assert ECE_NOTE in preamble and "biased upwards" in ECE_NOTE
    detectors_md = table
    assert detectors_md.startswith("| model | confidence function | set |")
    assert detectors_md.count("\n") == 2 + len(result["detectors"])
    # every number with its interval: DeLong's around the AUROC, the bootstrap's for accuracy and ECE
    from evaluation_engine.outputs import read_replicates

    replicates = read_replicates(out)
    for row in result["detectors"]:
        key = f"{row['model']}|{row['confidence function']}|{row['set']}"
        if row["auroc"] is not None:
            assert row["auroc low"] <= row["auroc"] <= row["auroc high"]
            assert replicates[f"{key}|auroc"].numel() == 1000
        for metric in ("accuracy", "ece"):
            if row.get(metric) is not None:
                assert row[f"{metric} low"] <= row[f"{metric} high"]
                assert replicates[f"{key}|{metric}"].numel() == 1000
    assert result["detectors"][0]["set"] == "id_test" and result["detectors"][0]["auroc"] is None  # the baseline first
    assert f"{result['detectors'][1]['auroc']:.4f}" in detectors_md
    sets_md = (out / "sets.md").read_text()
    assert sets_md.startswith(f"LPIPS: LPIPS(alex, RANDOM backbone: not a perceptual distance); reference: {REFERENCE}")
    assert (out / "agreement.md").is_file()
    names = model_names(run)
    for name in names.values():  # each model's own table, written by its callback
        assert len(read_csv(out / f"detectors_{name}.csv")) == 2 * 7
    grids = sorted(p.name for p in (out / "grids").iterdir())
    assert grids == sorted(["id_test.png", "near_ood_near.png", "shift_shift.png", "real_fashion_unknown.png",
                            "real_digits.png", "real_shift_inverted.png"])
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


@pytest.mark.slow
def test_independent_models_are_not_flagged_and_copies_are(run: dict, tmp_path: Path) -> None:
    """A second, independently seeded ensemble describes and scores: not flagged; a byte copy of a training member
    elsewhere is flagged by its sha256."""
    import shutil

    from tests.conftest import train_demo_checkpoint

    independent = [train_demo_checkpoint(tmp_path / f"other{seed}", "softmax", steps=3, seed=seed) for seed in (7, 8)]
    copy = tmp_path / "copy" / "checkpoints" / "best.ckpt"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(run["members"][0], copy)
    result = evaluate.main([
        "generated", "--model", str(independent[0]), str(copy), "--kappa", "softmax", "--near-ood", str(run["near"]),
        "--shift", str(run["shift"]), "--ensemble", *map(str, independent), "--allow-weak-ensemble", "--label-filter",
        "--output-dir", str(tmp_path / "tables"), "--no-plots", *CLI,
    ])
    flags = {row["model"]: row["shares generator ensemble"] for row in result["detectors"]}
    assert flags == {"other7-best": "no", "copy-best": "near_ood:near, shift:shift"}
    sets = {row["set"]: row for row in result["sets"]}
    assert (sets["near_ood:near"]["describer shares generator ensemble"],
            sets["shift:shift"]["describer shares generator ensemble"]) == ("no", "no")
    text = (tmp_path / "tables" / "detectors.md").read_text()
    assert "| shares generator ensemble |" in text.split("\n\n", 1)[1].splitlines()[0] and "copy-best" in text


@pytest.mark.slow
def test_on_bad_image_is_an_option_of_the_command_line(run: dict, logits: dict, tmp_path: Path) -> None:
    import re

    from PIL import Image

    from lightning_modules.checkpoint import load_module

    folder = tmp_path / "ood"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.full((28, 28), 40 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    (folder / "1.png").write_bytes(b"not a png")
    member = str(run["members"][0])
    options = ["generated", "--model", member, "--kappa", "softmax", "--real-ood", f"broken={folder}", "--no-plots", *CLI]
    with pytest.raises(SystemExit, match=f"cannot read image {folder / '1.png'}"):
        evaluate.main([*options, "--output-dir", str(tmp_path / "fail")])
    with pytest.warns(RuntimeWarning, match=re.escape(f"real OOD set {folder}: skipping 1 unreadable image(s) of 3: "
                                                      f"[{str(folder / '1.png')!r}]")):
        result = evaluate.main([*options, "--on-bad-image", "skip", "--output-dir", str(tmp_path / "skip")])
    row = next(r for r in result["detectors"] if r["set"] == "real:broken")
    assert row["images"] == 2  # the unreadable file skipped and left out of the AUROC
    readable = torch.stack([torch.full((1, 28, 28), 40 * i / 255) for i in (0, 2)])
    with torch.no_grad():
        outside = softmax(load_module(member).eval()(readable).double().numpy()).max(axis=1)
    inside = kappa("softmax", logits["id_test"])
    expected = roc_auc_score(np.r_[np.ones(inside.size), np.zeros(2)], np.r_[inside, outside])
    assert row["auroc"] == pytest.approx(expected, abs=1e-3)
    _, parsed = evaluate.parse([*options, "--on-bad-image", "skip", "--output-dir", str(tmp_path / "x")])
    assert parsed.on_bad_image == "skip"


@pytest.mark.slow
def test_generated_refuses_sets_of_other_classes_and_foreign_manifests(run: dict, tmp_path: Path) -> None:
    import json
    import re
    import shutil

    member = str(run["members"][0])
    options = ["generated", "--model", member, "--kappa", "softmax", "--output-dir", str(tmp_path / "t"), *CLI]
    other = tmp_path / "other"
    shutil.copytree(run["shift"], other)
    info = json.loads((other / "info.json").read_text())
    info["classes"] = ["Trouser", "T-shirt/top", "Sneaker", "Bag"]
    (other / "info.json").write_text(json.dumps(info))
    with pytest.raises(SystemExit, match=re.escape(f"{other} was generated for the classes ['Trouser', 'T-shirt/top', "
                                                   "'Sneaker', 'Bag'], but the ID data have the classes ['T-shirt/top', "
                                                   "'Trouser', 'Sneaker', 'Bag']")):
        evaluate.main([*options, "--shift", str(other)])
    foreign = tmp_path / "foreign"
    shutil.copytree(run["shift"], foreign)
    shutil.copyfile(run["near"] / "manifest.csv", foreign / "manifest.csv")  # 9 near-OOD rows for 10 images
    with pytest.raises(SystemExit, match=f"{re.escape(str(foreign / 'manifest.csv'))} holds 9 rows but info.json "
                                         "counts 10 images: the manifest belongs to another set"):
        evaluate.main([*options, "--shift", str(foreign)])
    with pytest.raises(SystemExit, match="label_filter needs --ensemble"):
        evaluate.main([*options, "--shift", str(run["shift"]), "--label-filter"])
    folders = tmp_path / "real"
    (folders / "Dress").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"the class folder 'Dress' is none of the known classes \['T-shirt/top'"):
        evaluate.main([*options, "--real-shift", str(folders)])


def test_label_filter_compares_each_shifted_image_with_its_source(tmp_path: Path) -> None:
    """The label condition by hand: the ID test set is a subset of a larger set (dataset indices 10 ... 15), the
    shifted images' sources are found by their manifest's ``source_index``."""
    import re

    from torch.utils.data import Subset

    from callbacks.generated import GeneratedBenchmark
    from datamodules.generated import GeneratedBenchmarkData
    from datamodules.images import TensorImageDataset
    from tests.datamodules.test_generated import uint8_images, write_set

    base = TensorImageDataset(uint8_images(20, size=28), torch.arange(20) % 4)
    id_test = Subset(base, list(range(10, 16)))
    shift = write_set(tmp_path / "shift", uint8_images(5))  # sources 10, 11, 12, 13, 14
    data = GeneratedBenchmarkData(id_test, shift=[shift])
    benchmark = GeneratedBenchmark(data, ["softmax"], describer=torch.nn.Identity(), label_filter=True)
    id_prediction = torch.tensor([3, 1, 2, 0, 1, 2])  # of dataset indices 10 ... 15
    shift_prediction = torch.tensor([3, 0, 2, 0, 2])  # of the shifts of 10, 11, 12, 13, 14
    description = {"id_test": {"prediction": id_prediction}, "shift:shift": {"prediction": shift_prediction}}
    kept = benchmark._label_kept(description)
    assert kept["shift:shift"].tolist() == [True, False, True, True, False]

    elsewhere = write_set(tmp_path / "elsewhere", uint8_images(3))
    edit = (elsewhere / "manifest.csv").read_text().replace("images/000002.png,2,-1,12,", "images/000002.png,2,-1,17,")
    (elsewhere / "manifest.csv").write_text(edit)
    other = GeneratedBenchmark(GeneratedBenchmarkData(id_test, shift=[elsewhere]), ["softmax"],
                               describer=torch.nn.Identity(), label_filter=True)
    with pytest.raises(ValueError, match=re.escape(f"{elsewhere}: the source images [17] of the shifted set "
                                                   "shift:elsewhere are not in the ID test set")):
        other._label_kept({"id_test": {"prediction": id_prediction},
                           "shift:elsewhere": {"prediction": torch.tensor([0, 1, 2])}})
    with pytest.raises(ValueError, match="label_filter needs the describing ensemble"):
        GeneratedBenchmark(data, ["softmax"], label_filter=True)
