"""``evaluate.py evg`` (EvG, DESIGN.md §5.4) end to end on the demo data: every number of the report
recomputed from the saved worst cases with an independent pass and scikit-learn, the energy standardised on
ID validation images only, a resumed run that reruns nothing finished, chains independent of the batch size,
and 2 processes equal to 1."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score

import evaluate
from callbacks.evg import ensemble_label, sampler_ensemble
from datamodules.evg import EvGData
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.images import TensorImageDataset, balanced_choice
from datamodules.sources import load_digits_images
from datamodules.transforms import ModelInput, TensorPipeline
from evaluation_engine.runner import Runner
from evaluation_methods.evg import EvGEvaluation
from lightning_modules import OpenSetClassifier
from lightning_modules.checkpoint import load_module
from lightning_modules.evg import AffineVariation, BlackBox, ColourVariation, EvGSearch
from lightning_modules.scoring import ScoringModel
from metrics import resolve_detector
from tests.lightning_modules.evg import tiny_generators

pytestmark = pytest.mark.usefixtures("one_thread")

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]
CHAINS, STEPS = 9, 12
KAPPAS = ("softmax", "max_logit")
VARIATIONS = ("affine", "colour", "gan")
GAN = "tests.lightning_modules.evg.tiny_generators:make_sigmoid"  # sigmoid(z @ W) as 6x6 images, D = 5


def options(checkpoint: Path, out: Path, per_batch: int = 4) -> list[str]:
    return ["evg", "--model", str(checkpoint), "--kappa", *KAPPAS, "--ood", "digits", "--data", "fashion",
            "--data-arg", "max_train_per_class=60", "--variation", *VARIATIONS, "--gan", GAN, "--sampler", "mh",
            "random", "--chains", str(CHAINS), "--steps", str(STEPS), "--chains-per-batch", str(per_batch),
            "--seed", "3", "--trace-every", "5", "--output-dir", str(out)]



@pytest.fixture(scope="module")
def run(demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("adversarial") / "out"
    result = evaluate.main(options(demo_checkpoint, out) + CLI)
    return {"result": result, "out": out, "checkpoint": demo_checkpoint}


def kappa_of(network: torch.nn.Module, images: torch.Tensor, kappa: str) -> np.ndarray:
    """κ from the classifier's logits, written out here. In the model's float32, as the detectors score: a
    float32 softmax response saturates at exactly 1.0 for confident images, so float64 would break ties the
    report (rightly) keeps."""
    with torch.no_grad():
        logits = torch.cat([network(chunk) for chunk in images.split(512)])
    if kappa == "softmax":
        return torch.softmax(logits, dim=1).max(dim=1).values.double().numpy()
    return logits.max(dim=1).values.double().numpy()


def reference_sets() -> dict[str, torch.Tensor]:
    data = FashionMNISTOpenSetDataModule(max_train_per_class=60)
    data.setup("fit")
    data.setup("test")
    sets = {}
    for name, dataset in (("id_val", data.val_set), ("id_test", data.test_set)):
        known = torch.nonzero(dataset.labels >= 0).flatten()
        sets[name] = torch.stack([dataset[int(i)].image for i in known]).float()
    sets["ood"] = load_digits_images(28)[0]
    return sets


def same_rows(one: list[dict], other: list[dict]) -> bool:
    """Rows equal value for value, NaN equal to NaN (random search has no acceptance rate)."""
    def canonical(value: object) -> object:
        return "nan" if isinstance(value, float) and np.isnan(value) else value

    return [{k: canonical(v) for k, v in row.items()} for row in one] == [
        {k: canonical(v) for k, v in row.items()} for row in other]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def gan_images(points: torch.Tensor) -> torch.Tensor:
    """The GAN variation written out: the factory's sigmoid(√5·z @ W) as 6x6 images, resized to the digits' 28 px
    as the authors resize (bilinear, align_corners=False, no antialias)."""
    weight = tiny_generators.SigmoidGenerator().weight.detach()
    small = torch.sigmoid(math.sqrt(5) * points.float() @ weight).view(-1, 1, 6, 6)
    return torch.nn.functional.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False, antialias=False)


def sklearn_auroc(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> float:
    labels = np.r_[np.ones(id_scores.numel()), np.zeros(ood_scores.numel())]
    return float(roc_auc_score(labels, np.r_[id_scores.double().numpy(), ood_scores.double().numpy()]))


def test_report_numbers_are_recomputed_from_the_worst_cases(run: dict) -> None:
    """Every number of the report from the stored κ (``worst_cases.pt``, ``clean_scores.pt``) with scikit-learn
    and NumPy, exactly; the stored κ themselves recomputed through the network from the stored points, within
    float32 tolerance (another batch composition moves the last bits, so the AUROCs and MinRanks are never
    recomputed from those: one near-tie flips on another CPU)."""
    network = load_module(run["checkpoint"], expected=OpenSetClassifier).eval()
    sets = reference_sets()
    worst_cases = torch.load(run["out"] / "worst_cases.pt", weights_only=False)
    clean = torch.load(run["out"] / "clean_scores.pt", weights_only=False)
    rows = {(r["detector"], r["variation"], r["sampler"]): r for r in run["result"]["rows"]}
    assert len(rows) == len(KAPPAS) * len(VARIATIONS) * 3  # mh, random and their eV1 ensemble
    # the seeds: a seeded, class-balanced choice of the digits (9 chains: 9 different digits), not the first 9
    chosen = worst_cases["demo-best/softmax|affine|mh"]["seed_index"]
    digit = torch.from_numpy(load_digits().target)
    assert torch.equal(chosen, balanced_choice(digit, CHAINS, seed=3))
    assert len(set(digit[chosen].tolist())) == CHAINS and not torch.equal(chosen, torch.arange(CHAINS))
    seeds = sets["ood"][chosen]
    variations = {"affine": AffineVariation(), "colour": ColourVariation(channels=1)}
    for kappa in KAPPAS:  # the stored clean κ: the network's, to float32 tolerance
        for split, images in sets.items():
            np.testing.assert_allclose(clean[f"demo-best/{kappa}"][split].double().numpy(),
                                       kappa_of(network, images, kappa), rtol=1e-4, atol=1e-5)
    for (detector, variation, sampler), row in rows.items():
        kappa = detector.rsplit("/", 1)[1]
        found = worst_cases[f"{detector}|{variation}|{sampler}"]
        chains = CHAINS * (2 if sampler == "eV1" and variation == "gan" else 1)
        worst = gan_images(found["points"]) if variation == "gan" else variations[variation](found["points"], seeds)
        worst_kappa = kappa_of(network, worst, kappa)
        np.testing.assert_allclose(found["kappa"].double().numpy(), worst_kappa, rtol=1e-4, atol=1e-5)  # raw κ kept
        stored = found["kappa"]
        if sampler == "eV1":
            parts = {s: worst_cases[f"{detector}|{variation}|{s}"] for s in ("mh", "random")}
            if variation == "gan":  # unconditional: the samplers' samples pooled (ensemble_attack.py)
                assert torch.equal(stored, torch.cat([parts["mh"]["kappa"], parts["random"]["kappa"]]))
                assert torch.equal(found["sampler_choice"], torch.arange(2).repeat_interleave(CHAINS))
                assert row["eV1 of"] == "mh, random: pooled samples"
                # with equal chain counts the pooled AUROC is the samplers' mean, its MinRank their minimum
                assert row["worst-case auroc"] == pytest.approx(
                    np.mean([rows[(detector, variation, s)]["worst-case auroc"] for s in parts]), abs=1e-12)
                assert row["min rank"] == min(rows[(detector, variation, s)]["min rank"] for s in parts)
            else:  # per chain, the lowest energy of the two samplers; never a better AUROC than either
                assert torch.equal(found["energy"], torch.minimum(parts["mh"]["energy"], parts["random"]["energy"]))
                choice = found["sampler_choice"]
                assert torch.equal(stored, torch.where(choice == 0, parts["mh"]["kappa"], parts["random"]["kappa"]))
                assert row["eV1 of"] == "mh, random: per-chain minimum"
                assert row["worst-case auroc"] <= min(rows[(detector, variation, s)]["worst-case auroc"] for s in parts)
                assert row["min rank"] <= min(rows[(detector, variation, s)]["min rank"] for s in parts)
        else:
            assert row["eV1 of"] == ""
        # the energy of each worst case: -κ standardised on ID *validation* scores, σ with N - 1, + 1e-3
        outlier = -clean[detector]["id_val"].double().numpy()
        energy = (-stored.double().numpy() - outlier.mean()) / (outlier.std(ddof=1) + 1e-3)
        np.testing.assert_allclose(found["energy"].double().numpy(), energy, rtol=1e-5, atol=1e-5)
        id_test, ood = clean[detector]["id_test"], clean[detector]["ood"]
        assert row["clean auroc"] == pytest.approx(sklearn_auroc(id_test, ood), abs=1e-12)
        assert row["worst-case auroc"] == pytest.approx(sklearn_auroc(id_test, stored), abs=1e-12)
        assert row["min rank"] == int((id_test > stored.max()).sum())
        assert row["clean min rank"] == int((id_test > ood.max()).sum())
        seed_kappa = ood[chosen]  # the clean scores of exactly the seed images
        assert row["seed auroc"] == pytest.approx(sklearn_auroc(id_test, seed_kappa), abs=1e-12)
        assert row["seed min rank"] == int((id_test > seed_kappa.max()).sum()) and row["seed images"] == CHAINS
        assert row["nan proposals"] == 0
        # MH: its start and STEPS proposals; random search: STEPS draws (the authors' RandomSampler); eV1: both
        assert row["chains"] == chains and row["steps"] == {"mh": STEPS + 1, "random": STEPS, "eV1": 2 * STEPS + 1}[sampler]
        assert row["id test images"] == 4000 and row["ood test images"] == 1797
        assert row["preset"] == {"colour": "colorV1", "affine": "affineV1", "gan": ""}[variation]  # 28 px: the 32 px presets
        assert row["varied"] == {"colour": "brightness, contrast", "gan": "latent (5 dimensions)",
                                 "affine": "angle, translate_x, translate_y, scale, shear"}[variation]
        # the search found outliers the detector trusts at least as much as its random start
        assert row["mean lowest energy"] <= row["mean start energy"]
        if sampler in ("random", "eV1"):
            assert np.isnan(row["acceptance"])
        else:
            assert 0.0 < row["acceptance"] <= 1.0
        # transferability: the worst cases found against this detector, scored by every detector (stored κ)
        for other in KAPPAS:
            other_name = detector.rsplit("/", 1)[0] + "/" + other
            np.testing.assert_allclose(found[f"kappa/{other_name}"].double().numpy(), kappa_of(network, worst, other),
                                       rtol=1e-4, atol=1e-5)
            expected = sklearn_auroc(clean[other_name]["id_test"], found[f"kappa/{other_name}"])
            assert run["result"]["transfer"][(variation, sampler)][detector][other_name] == pytest.approx(expected,
                                                                                                          abs=1e-12)


def test_files_hold_the_returned_numbers(run: dict) -> None:
    out = run["out"]
    written = read_rows(out / "results.csv")
    assert len(written) == len(run["result"]["rows"])
    for line, row in zip(written, run["result"]["rows"], strict=True):
        for key, value in row.items():
            if isinstance(value, float) and np.isnan(value):
                assert line[key] == "nan"
            elif isinstance(value, float):
                assert float(line[key]) == value
            else:
                assert line[key] == str(value)
    markdown = (out / "results.md").read_text()
    assert "Energy standardisation on ID validation" in markdown
    assert "Varied: at the data's own size, 28x28 px (the authors')" in markdown  # the digits' own size
    assert "two gradient samplers (grad, lgv), not run here" in markdown and "Warning" not in markdown
    assert "9 of 1797 OOD images, balanced: class-balanced" in (out / "seeds.md").read_text()
    # the fitted state of the run, written with it: each detector's energy standardisation
    fitted = read_rows(out / "standardisation.csv")
    assert [row["detector"] for row in fitted] == [f"demo-best/{k}" for k in KAPPAS]
    assert all(float(row["scale"]) > 1e-3 for row in fitted)
    transfer = read_rows(out / "transfer_colour_mh.csv")
    matrix = run["result"]["transfer"][("colour", "mh")]
    for line in transfer:
        for other, value in matrix[line["searched against"]].items():
            assert float(line[other]) == value
    for name in ("transfer_affine_mh.png", "grids/demo-best_softmax__affine__mh.png",
                 "traces/demo-best_max_logit__colour.png"):
        assert (out / name).stat().st_size > 1000, name


@pytest.mark.slow
def test_resume_reruns_nothing_finished_and_gives_the_same_report(run: dict, capsys: pytest.CaptureFixture) -> None:
    out = run["out"]
    chain_files = sorted((out / "chains").glob("*/chains-*.pt"))
    assert [p.name for p in chain_files] == ["chains-0000000-0000003.pt", "chains-0000004-0000007.pt",
                                             "chains-0000008-0000008.pt"]
    times = {p: p.stat().st_mtime_ns for p in chain_files}
    chain_files[1].unlink()  # an interrupted run: one batch of chains missing
    result = evaluate.main(options(run["checkpoint"], out) + CLI)
    assert "chains 0-3, 8-8 have results" in capsys.readouterr().out
    assert chain_files[1].is_file()
    assert all(p.stat().st_mtime_ns == times[p] for p in (chain_files[0], chain_files[2]))  # not rerun
    assert same_rows(result["rows"], run["result"]["rows"])
    assert result["transfer"] == run["result"]["transfer"]


def near_ties(one: torch.Tensor, other: torch.Tensor, tolerance: float) -> int:
    """Pairs (i, j) with ``|one_i - other_j| <= tolerance``: the pairs whose order float noise may flip."""
    return int(((one.double()[:, None] - other.double()[None, :]).abs() <= tolerance).sum())


@pytest.mark.slow
def test_chains_do_not_depend_on_the_batch_size(run: dict, tmp_path: Path) -> None:
    """Each chain draws the same random numbers in any batch (exact: test_samplers); through a network the
    energies may differ in the last float32 bits between batch sizes (the convolution's blocking), so the
    chains' lowest energies agree to float tolerance, a chain's state and step agree where the two runs kept
    the same minimum (two states of equal energy, a saturated softmax, may swap), and the AUROC and MinRank of
    the worst cases differ by no more than the pairs of ID test and worst-case κ within that tolerance (each
    computed from its own run's stored κ)."""
    result = evaluate.main(options(run["checkpoint"], tmp_path / "out", per_batch=CHAINS) + CLI)
    one = torch.load(run["out"] / "worst_cases.pt", weights_only=False)
    other = torch.load(tmp_path / "out" / "worst_cases.pt", weights_only=False)
    clean = torch.load(run["out"] / "clean_scores.pt", weights_only=False)
    tolerance = 1e-5
    for key in one:
        # relative too: an energy of 1.8 moved 1.2e-5 between batch sizes on one CPU (float32 convolutions, the
        # standardisation's division)
        torch.testing.assert_close(one[key]["energy"], other[key]["energy"], atol=tolerance, rtol=tolerance)
        same = one[key]["best_step"] == other[key]["best_step"]
        assert bool(same.any()), key
        torch.testing.assert_close(one[key]["points"][same], other[key]["points"][same], atol=1e-5, rtol=0)
    fixed = ("clean auroc", "clean min rank", "seed auroc", "seed min rank", "mean start energy", "mean lowest energy",
             "nan proposals", "chains", "steps", "acceptance")
    for row, reference in zip(result["rows"], run["result"]["rows"], strict=True):
        key = f"{row['detector']}|{row['variation']}|{row['sampler']}"
        for name in fixed:  # the clean passes are the same passes; the start and the minima agree to tolerance
            assert row[name] == pytest.approx(reference[name], abs=tolerance, nan_ok=True), (key, name)
        id_test, kappa = clean[row["detector"]]["id_test"], one[key]["kappa"]
        flips = near_ties(id_test, kappa, tolerance)
        assert abs(row["worst-case auroc"] - reference["worst-case auroc"]) <= flips / (id_test.numel() * kappa.numel()) \
            + 1e-12, key
        assert abs(row["min rank"] - reference["min rank"]) <= near_ties(id_test, kappa.max()[None], tolerance), key


def unnamed(network: torch.nn.Module, size: int = 4) -> ScoringModel:
    return ScoringModel(network, model_input=ModelInput(TensorPipeline(size, 1), size=(size, size), channels=1),
                        name="net")


def test_detector_passes_nan_refuses_infinite_and_unstandardised_use() -> None:
    class NaNNetwork(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.full((images.shape[0], 3), float("nan"))

    detector = BlackBox(unnamed(NaNNetwork()), resolve_detector("max_logit"))
    assert detector.name == "net/max_logit" and not detector.standardised
    with pytest.raises(RuntimeError, match="fit_standardisation"):
        detector.energy(torch.zeros(2, 1, 4, 4))
    detector.fit_standardisation(torch.tensor([0.0, 1.0]))
    assert detector.standardised and float(detector.energy_mean) == -0.5
    assert float(detector.energy_scale) == pytest.approx(float(torch.tensor([0.0, 1.0]).std()) + 1e-3)
    # the fitted state is the module's: buffers, saved with it
    assert set(detector.state_dict()) >= {"energy_mean", "energy_scale"}
    assert torch.isnan(detector.energy(torch.zeros(2, 1, 4, 4))).all()  # NaN energies: rejected proposals

    class InfiniteNetwork(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.full((images.shape[0], 3), float("inf"))

    infinite = BlackBox(unnamed(InfiniteNetwork()), resolve_detector("max_logit"))
    infinite.fit_standardisation(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="infinite scores"):  # at the first batch of a search
        infinite.energy(torch.zeros(2, 1, 4, 4))


def test_pairs_and_bad_configurations(demo_checkpoint: Path) -> None:
    detector = BlackBox(ScoringModel(str(demo_checkpoint)), resolve_detector("softmax"))
    seeds = torch.rand(3, 1, 28, 28)
    module = EvGSearch({"d": detector}, {"affine": AffineVariation()}, {"mh": {}, "random": {}}, seeds)
    assert module.pairs == [("affine", "mh"), ("affine", "random")]
    with pytest.raises(RuntimeError, match="no energy standardisation"):
        module.on_predict_start()  # the search refuses unfitted detectors
    with pytest.raises(ValueError, match="unknown samplers"):
        EvGSearch({"d": detector}, {"affine": AffineVariation()}, {"annealing": {}}, seeds)
    with pytest.raises(ValueError, match="no search to run"):
        EvGSearch({"d": detector}, {"affine": AffineVariation()}, {"linf": {}}, seeds)
    with pytest.raises(ValueError, match="needs an ensemble"):
        BlackBox(ScoringModel(str(demo_checkpoint)), resolve_detector("ensemble_mi"))
    with pytest.raises(SystemExit, match="--gan"):
        evaluate.main(["evg", "--model", str(demo_checkpoint), "--variation", "gan", "--chains", "2",
                       "--steps", "1", "--data-arg", "max_train_per_class=20", *CLI])
    with pytest.raises(SystemExit, match=r"\['ensemble_mi'\] pair with none of the models"):  # refused before any pass
        evaluate.main(["evg", "--model", str(demo_checkpoint), "--kappa", "softmax", "ensemble_mi", "--chains", "2",
                       "--steps", "1", *CLI])


def test_a_misspelt_variation_option_lists_the_options_before_any_model_is_loaded(tmp_path: Path) -> None:
    """``--variation-arg affine.translate=...`` (the option is ``translation``): the command stops at once (the model
    path does not even exist) with the variation's options, as κ arguments do; an option for a variation the run
    does not use is refused there too."""
    command = ["evg", "--model", str(tmp_path / "never-read.ckpt"), "--variation", "affine", "colour", *CLI]
    with pytest.raises(SystemExit) as raised:
        evaluate.main([*command, "--variation-arg", "affine.translate=[-3,3]"])
    assert raised.value.code == ("evaluate.py evg: variation model 'affine' (AffineVariation) has no arguments "
                                 "['translate']; it takes ['angle', 'translation', 'scale', 'shear', 'preset']")
    with pytest.raises(SystemExit, match=r"variation_args for \['gan'\], which are not among the variations "
                                         r"\['affine', 'colour'\]"):
        evaluate.main([*command, "--variation-arg", "gan.truncation=0.5"])


def test_timm_detector_takes_raw_images_through_the_models_transform() -> None:
    """The variations act on [0, 1] images; a timm model's own transform (resize, crop, mean/std) happens in the
    detector, image by image as for every clean image; with ``varied_images="model_input"`` only its
    normalisation (the images already at its input)."""
    import timm

    detector = BlackBox(ScoringModel("timm:resnet10t", pretrained=False), resolve_detector("max_logit"))
    assert detector.varied_images == "raw"
    network = timm.create_model("resnet10t", pretrained=False)
    network.load_state_dict(detector.model.network.state_dict())
    network.eval()
    config = timm.data.resolve_model_data_config(network)
    transform = timm.data.create_transform(**config)  # the model's evaluation transform of PIL images
    assert detector.model.model_input.mean == pytest.approx(tuple(config["mean"]))
    assert detector.model.model_input.std == pytest.approx(tuple(config["std"]))
    images = torch.rand(3, 3, 40, 40, generator=torch.Generator().manual_seed(0)).mul(255).round().div(255)
    with torch.no_grad():
        expected = network(torch.stack([transform(TF.to_pil_image(image)) for image in images])).max(dim=1).values
    torch.testing.assert_close(detector.scores(images), expected, rtol=1e-5, atol=1e-5)
    grey = images[:, :1]  # a grey image: to RGB by the model's own rule (PIL), as a grey file would be
    with torch.no_grad():
        expected = network(torch.stack([transform(TF.to_pil_image(image).convert("RGB")) for image in grey]))
    torch.testing.assert_close(detector.scores(grey), expected.max(dim=1).values, rtol=1e-5, atol=1e-5)
    # images already at the model's input: only the normalisation
    size = config["input_size"][-1]
    ready = BlackBox(ScoringModel("timm:resnet10t", pretrained=False), resolve_detector("max_logit"), varied_images="model_input")
    ready.model.network.load_state_dict(network.state_dict())
    inputs = torch.rand(3, 3, size, size, generator=torch.Generator().manual_seed(1))
    mean, std = torch.tensor(config["mean"]).view(1, 3, 1, 1), torch.tensor(config["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(ready.scores(inputs), network((inputs - mean) / std).max(dim=1).values)
    assert detector.name == "resnet10t/max_logit"
    with pytest.raises(ValueError, match="varied_images must be one of \\['raw', 'model_input'\\], got 'pixels'"):
        BlackBox(ScoringModel("timm:resnet10t", pretrained=False), resolve_detector("max_logit"), varied_images="pixels")


def fake_runner() -> Runner:
    """This one process, as the engine's pass runs in it."""
    return Runner.local()


class Tiny(torch.nn.Module):
    """A fixed small network of any input size: logits from the pooled channels and a 4x4 view."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(channels * 16, 3)
        torch.nn.init.normal_(self.linear.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.nn.functional.adaptive_avg_pool2d(images, 4).flatten(1))


def tiny_model(pipeline: Any, *, size: int | None, channels: int = 1, name: str = "net") -> ScoringModel:
    return ScoringModel(Tiny(channels), model_input=ModelInput(pipeline, size=(size, size) if size else None,
                                                               channels=channels), name=name)


def evg_data(images: torch.Tensor, labels: torch.Tensor) -> EvGData:
    ident = TensorImageDataset(torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(5)), torch.arange(6) % 3)
    return EvGData(id_val=ident, id_test=ident, ood=TensorImageDataset(images, labels), batch_size=4)


def test_seed_choice_first_is_the_authors_and_balanced_the_default() -> None:
    """``first``: the authors' ``attack.py --n_sample N`` (the first N of the set); ``balanced``: one per class a
    round, seeded (a class-sorted set's first rows would be one class)."""
    labels = torch.arange(12) // 4  # class-sorted: 0 0 0 0 1 1 1 1 2 2 2 2
    data = evg_data(torch.rand(12, 1, 8, 8, generator=torch.Generator().manual_seed(0)), labels)
    assert data.seed_indices(5, 3, choice="first").tolist() == [0, 1, 2, 3, 4]
    assert data.seed_indices(50, 3, choice="first").tolist() == list(range(12))  # min(chains, N_ood)
    balanced = data.seed_indices(6, 3)
    assert torch.equal(balanced, balanced_choice(labels, 6, seed=3)) and sorted(labels[balanced].tolist()) == [0, 0, 1, 1,
                                                                                                             2, 2]
    with pytest.raises(ValueError, match="seed choice must be one of \\['balanced', 'first'\\], got 'random'"):
        data.seed_indices(3, 0, choice="random")
    with pytest.raises(ValueError, match="seed_choice must be one of"):
        EvGEvaluation(model=["m.ckpt"], seed_choice="last")


def test_what_the_variations_act_on() -> None:
    """``vary_at: data`` (the authors'): the seeds at the data's size and raw images to every detector; images
    of several sizes: the detectors' common input; ``input``: that input; ``image_size``: every OOD image (the
    clean ones too) resized first."""
    common = [tiny_model(TensorPipeline(32, 1), size=32, name="a"), tiny_model(TensorPipeline(32, 1), size=32, name="b")]
    mixed = [common[0], tiny_model(TensorPipeline(20, 1), size=20, name="c")]
    data = EvGEvaluation(model=["m.ckpt"])
    assert data.vary_at == "data"
    found = data.seed_input(mixed, [(28, 28)])
    assert (found.pipeline, found.resize_ood, found.varied_images) == (None, False, "raw")
    assert found.description.startswith("at the data's own size, 28x28 px (the authors')")
    several = data.seed_input(common, [(28, 28), (30, 28)])  # a folder of photographs: the common input
    assert repr(several.pipeline) == repr(TensorPipeline(32, 1)) and several.varied_images == "model_input"
    assert "several sizes (28x28, 30x28)" in several.description
    with pytest.raises(ValueError, match=r"several sizes .*give image_size"):
        data.seed_input(mixed, [(28, 28), (30, 28)])
    at_input = EvGEvaluation(model=["m.ckpt"], vary_at="input")
    found = at_input.seed_input(common, [(28, 28)])
    assert repr(found.pipeline) == repr(TensorPipeline(32, 1)) and found.varied_images == "model_input"
    assert "at the detectors' common input (32x32 px; vary_at: input)" in found.description
    with pytest.raises(ValueError, match=r"other inputs .*'a': \(32, 32\), 'c': \(20, 20\).*give image_size"):
        at_input.seed_input(mixed, [(28, 28)])
    resized = EvGEvaluation(model=["m.ckpt"], vary_at="input", image_size=16).seed_input(mixed, [(28, 28)])
    assert resized.resize_ood and resized.varied_images == "raw" and repr(resized.pipeline) == repr(TensorPipeline(16, 1))
    with pytest.raises(ValueError, match="vary_at must be one of \\['data', 'input'\\], got 'model'"):
        EvGEvaluation(model=["m.ckpt"], vary_at="model")


@pytest.mark.parametrize("rule", ["data", "image_size", "input"])
def test_the_identity_variation_of_a_seed_scores_its_clean_score(rule: str) -> None:
    """The clean OOD images (the engine's pass, the model's own transform) and the identity variation of each
    seed (the detector) are the same input: the same κ, to float tolerance (another batch composition). Two
    detectors of other inputs, a PIL pipeline among them (as timm's: bicubic resize, then a crop; the
    timm model itself in tests/lightning_modules/evg/test_black_box.py)."""
    from torchvision import transforms as T

    from datamodules.transforms import PILPipeline
    from evaluation_engine.scoring import ScoringPasses
    from lightning_modules.evg import build_variation

    pil = PILPipeline(T.Compose([T.Resize(37, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32),
                                 T.ToTensor()]), mode="RGB")
    models = [tiny_model(pil, size=32, channels=3, name="pil")] if rule != "input" else []
    models.append(tiny_model(TensorPipeline(24, 1), size=24, name="tensor"))
    images = torch.rand(10, 1, 20, 20, generator=torch.Generator().manual_seed(1)).mul(255).round().div(255)
    data = evg_data(images, torch.arange(10) % 5)
    indices = data.seed_indices(6, 0)
    evaluation = EvGEvaluation(model=["m.ckpt"], image_size=28 if rule == "image_size" else None, vary_at=
                               "input" if rule == "input" else "data")
    found = evaluation.seed_input(models, data.seed_sizes(indices))
    if found.resize_ood:
        data = data.through(found.pipeline)
    seeds = data.seed_images(indices, None if found.resize_ood else found.pipeline)
    assert seeds.shape[-2:] == {"data": (20, 20), "image_size": (28, 28), "input": (24, 24)}[rule]
    passes = ScoringPasses()
    for model in models:
        clean = passes.scores(fake_runner(), model, data["ood"], resolve_detector("max_logit"), {}, batch_size=4)
        detector = BlackBox(model, resolve_detector("max_logit"), varied_images=found.varied_images)
        for name in ("affine", "colour"):
            variation = build_variation(name, None, seed_shape=tuple(seeds.shape[1:]))
            varied = detector.scores(variation(variation.identity_point().expand(len(indices), -1), seeds))
            # (an identity warp moves a pixel by ~1e-7, which the PIL pipeline's 8-bit rounding may turn into 1/255)
            torch.testing.assert_close(varied, clean[indices], rtol=1e-5, atol=1e-4)


def test_the_ensemble_of_samplers_as_the_authors() -> None:
    """eV1 (ensemble_attack.py): per chain, the worst case of the lower energy for an instance-conditioned
    variation; the samplers' worst cases pooled for the unconditional GAN."""
    generator = torch.Generator().manual_seed(0)

    def result(energy: list[float]) -> dict[str, torch.Tensor]:
        n = len(energy)
        return {"points": torch.rand(n, 2, generator=generator), "energy": torch.tensor(energy),
                "best_step": torch.randint(0, 5, (n,), generator=generator), "start_energy": torch.zeros(n),
                "nan_proposals": torch.tensor([1] * n), "calls": torch.tensor(5), "kappa/d": -torch.tensor(energy),
                "kappa/e": torch.rand(n, generator=generator), "acceptance": torch.rand(n, generator=generator)}

    mh, rand = result([0.5, -1.0, float("nan"), 2.0]), result([0.7, -2.0, 1.0, 2.0])
    results = {("d", "affine", "mh"): mh, ("d", "affine", "random"): rand, ("d", "gan", "mh"): mh,
               ("d", "gan", "random"): rand, ("d", "colour", "mh"): mh}
    combined = sampler_ensemble(results, pooled={"gan"})
    assert set(combined) == {("d", "affine", "eV1"), ("d", "gan", "eV1")}  # one sampler: no eV1
    per_chain = combined[("d", "affine", "eV1")]
    assert per_chain["sampler_choice"].tolist() == [0, 1, 1, 0]  # NaN = +inf; a tie goes to the sampler run first
    for key in ("points", "energy", "best_step", "kappa/d", "kappa/e"):
        expected = np.stack([(mh if c == 0 else rand)[key][i].numpy() for i, c in enumerate([0, 1, 1, 0])])
        np.testing.assert_array_equal(per_chain[key].numpy(), expected)
    assert per_chain["nan_proposals"].tolist() == [2] * 4 and int(per_chain["calls"]) == 10
    assert per_chain["chain"].tolist() == [0, 1, 2, 3]
    pooled = combined[("d", "gan", "eV1")]
    for key in ("points", "energy", "best_step", "kappa/d", "kappa/e", "nan_proposals"):
        np.testing.assert_array_equal(pooled[key].numpy(), np.concatenate([mh[key].numpy(), rand[key].numpy()]))
    assert pooled["sampler_choice"].tolist() == [0] * 4 + [1] * 4 and pooled["chain"].tolist() == [0, 1, 2, 3] * 2
    assert bool(pooled["acceptance"].isnan().all()) and pooled["acceptance"].numel() == 8
    assert ensemble_label(["mh", "random"], pooled=True) == "mh, random: pooled samples"


@pytest.mark.slow  # three more EvG runs: in make test-all
def test_a_finished_or_half_written_report_is_written_whole_again(run: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = evaluate.main(options(run["checkpoint"], out) + CLI)
    marker = json.loads((out / "report.json").read_text())
    assert [r["sampler"] for r in marker["rows"]] == [r["sampler"] for r in first["rows"]]
    # a run killed while writing its report: the marker is gone, a table half written, another missing
    (out / "report.json").unlink()
    (out / "results.csv").write_text((out / "results.csv").read_text()[:50])
    (out / "transfer_affine_mh.csv").unlink()
    chains = {p: p.stat().st_mtime_ns for p in out.glob("chains/*/chains-*.pt")}
    again = evaluate.main(options(run["checkpoint"], out) + CLI)  # every chain finished: only the report runs
    assert chains and all(p.stat().st_mtime_ns == t for p, t in chains.items())  # no search ran again
    assert same_rows(again["rows"], first["rows"]) and again["rows"]
    assert read_rows(out / "results.csv") == read_rows(run["out"] / "results.csv")
    assert (out / "transfer_affine_mh.csv").read_bytes() == (run["out"] / "transfer_affine_mh.csv").read_bytes()
    assert json.loads((out / "report.json").read_text())["run_key"] == marker["run_key"]


@pytest.mark.slow  # three more EvG runs: in make test-all
def test_resume_with_other_batches_or_precision(run: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(run["out"], out)
    before = {p: p.stat().st_mtime_ns for p in out.glob("chains/*/chains-*.pt")}
    with pytest.raises(SystemExit, match=r"other batches \(chains-0000000-0000003.pt: 4 chains per batch"):
        evaluate.main(options(run["checkpoint"], out, per_batch=3) + CLI)
    assert {p: p.stat().st_mtime_ns for p in out.glob("chains/*/chains-*.pt")} == before  # nothing recomputed
    # another precision is another run: its chains go to their own folder, never mixed with the fp32 ones
    evaluate.main(options(run["checkpoint"], out) + [*CLI, "--precision", "64-true"])
    folders = sorted(p.name for p in (out / "chains").iterdir())
    assert len(folders) == 2 and len(list((out / "chains").glob("*/chains-*.pt"))) == 6
    with pytest.raises(SystemExit, match="chains must be positive, got 0"):
        evaluate.main(options(run["checkpoint"], out)[:-2] + ["--chains", "0", "--output-dir", str(out), *CLI])


@pytest.mark.slow  # three more EvG runs: in make test-all
def test_standardisation_on_id_test_as_the_authors_code(run: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = evaluate.main(options(run["checkpoint"], out) + [*CLI, "--standardise-on", "id_test"])
    network = load_module(run["checkpoint"], expected=OpenSetClassifier).eval()
    sets = reference_sets()
    fitted = {row["detector"]: row for row in read_rows(out / "standardisation.csv")}
    for kappa in KAPPAS:
        outlier = -kappa_of(network, sets["id_test"], kappa)
        assert float(fitted[f"demo-best/{kappa}"]["mean"]) == pytest.approx(outlier.mean(), rel=1e-5)
        assert float(fitted[f"demo-best/{kappa}"]["scale"]) == pytest.approx(outlier.std(ddof=1) + 1e-3, rel=1e-5)
    assert "Energy standardisation on ID test (the authors' code)" in (out / "results.md").read_text()
    # μ cancels in the acceptance and σ only rescales it: the clean columns are the same numbers
    assert [r["clean auroc"] for r in result["rows"]] == [r["clean auroc"] for r in run["result"]["rows"]]
    with pytest.raises(SystemExit):
        evaluate.main(options(run["checkpoint"], out) + [*CLI, "--standardise-on", "ood"])


def test_a_fitted_detector_is_a_fixed_black_box_of_the_search(demo_checkpoint: Path, tmp_path: Path) -> None:
    """Mahalanobis in EvG: fitted once on the ID training split before the fixed sets are scored, then the
    search's energy; the worst cases' κ recomputed with pytorch-ood's Mahalanobis fitted on the same training
    images; its fitted state is part of the run key (another fit cap: other chains)."""
    from pytorch_ood.detector import Mahalanobis

    def arguments(out: Path, cap: int) -> list[str]:
        return ["evg", "--model", str(demo_checkpoint), "--kappa", "softmax", "mahalanobis", "--ood", "digits",
                "--data", "fashion", "--data-arg", "max_train_per_class=60", "--variation", "affine", "--sampler",
                "mh", "--chains", "3", "--steps", "4", "--chains-per-batch", "3", "--seed", "3",
                "--fit-arg", f"mahalanobis.per_class={cap}", "--output-dir", str(out), *CLI]

    result = evaluate.main(arguments(tmp_path / "out", 30))
    assert {row["detector"] for row in result["rows"]} == {"demo-best/softmax", "demo-best/mahalanobis"}
    network = load_module(demo_checkpoint, expected=OpenSetClassifier).eval()
    fit = FashionMNISTOpenSetDataModule(max_train_per_class=60).evaluation_set("train", role="fit", known_only=True)
    chosen = balanced_choice(fit.labels(), 4 * 30, seed=0).sort().values  # the cap: 30 of each class, seed 0
    images = torch.stack([fit.dataset[int(i)].image for i in chosen]).float()
    with torch.no_grad():
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # pytorch-ood allocates its covariance in the default dtype
        try:
            reference = Mahalanobis(None).fit_features(network.features(images).double(), fit.labels()[chosen])
        finally:
            torch.set_default_dtype(default)
        found = torch.load(tmp_path / "out" / "worst_cases.pt", weights_only=False)["demo-best/mahalanobis|affine|mh"]
        seeds = reference_sets()["ood"][found["seed_index"]]
        worst = AffineVariation()(found["points"], seeds)
        expected = -reference.predict_features(network.features(worst).double())
    np.testing.assert_allclose(found["kappa"].double().numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)
    assert (found["energy"] < float("inf")).all()
    states = torch.load(tmp_path / "out" / "fitted_detectors.pt", weights_only=False)  # the fitted state, written
    assert [(e["kappa"], e["samples"]) for e in states.values()] == [("mahalanobis", 120)]
    again = evaluate.main(arguments(tmp_path / "out", 20))  # another fit: another run key, its own chains
    chains = sorted(p.name for p in (tmp_path / "out" / "chains").iterdir())
    assert len(chains) == 2 and again["rows"] != result["rows"]
