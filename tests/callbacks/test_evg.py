"""``evaluate.py evg`` (EvG, DESIGN.md §5.4) end to end on the demo data: every number of the report
recomputed from the saved worst cases with an independent pass and scikit-learn, the energy standardised on
ID validation images only, a resumed run that reruns nothing finished, chains independent of the batch size,
and 2 processes equal to 1."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score

import evaluate
from datamodules.fashion_mnist import FashionMNISTOpenSetDataModule
from datamodules.images import balanced_choice
from datamodules.sources import load_digits_images
from datamodules.transforms import ModelInput, TensorPipeline
from lightning_modules import OpenSetClassifier
from lightning_modules.checkpoint import load_module
from lightning_modules.evg import AffineVariation, ColourVariation, Detector, EvGSearch
from lightning_modules.scoring import ScoringModel

pytestmark = pytest.mark.usefixtures("one_thread")

CLI = ["--accelerator", "cpu", "--devices", "1", "--no-progress-bar", "--wandb-mode", "disabled"]
CHAINS, STEPS = 9, 12
KAPPAS = ("softmax", "max_logit")


def options(checkpoint: Path, out: Path, per_batch: int = 4) -> list[str]:
    return ["evg", "--model", str(checkpoint), "--kappa", *KAPPAS, "--ood", "digits",
            "--data", "fashion", "--data-arg", "max_train_per_class=60", "--variation", "affine", "colour", "--sampler", "mh", "random",
            "--chains", str(CHAINS), "--steps", str(STEPS), "--chains-per-batch", str(per_batch), "--seed", "3",
            "--trace-every", "5", "--output-dir", str(out)]



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


def test_report_numbers_are_recomputed_from_the_worst_cases(run: dict) -> None:
    network = load_module(run["checkpoint"], expected=OpenSetClassifier).eval()
    sets = reference_sets()
    worst_cases = torch.load(run["out"] / "worst_cases.pt", weights_only=False)
    rows = {(r["detector"], r["variation"], r["sampler"]): r for r in run["result"]["rows"]}
    assert len(rows) == len(KAPPAS) * 2 * 3  # mh, random and their eV1 ensemble
    # the seeds: a seeded, class-balanced choice of the digits (9 chains: 9 different digits), not the first 9
    chosen = worst_cases["demo-best/softmax|affine|mh"]["seed_index"]
    digit = torch.from_numpy(load_digits().target)
    assert torch.equal(chosen, balanced_choice(digit, CHAINS, seed=3))
    assert len(set(digit[chosen].tolist())) == CHAINS and not torch.equal(chosen, torch.arange(CHAINS))
    seeds = sets["ood"][chosen]
    variations = {"affine": AffineVariation(), "colour": ColourVariation(channels=1)}
    scores = {k: {name: kappa_of(network, images, k) for name, images in sets.items()} for k in KAPPAS}
    for (detector, variation, sampler), row in rows.items():
        kappa = detector.rsplit("/", 1)[1]
        found = worst_cases[f"{detector}|{variation}|{sampler}"]
        worst = variations[variation](found["points"], seeds)
        worst_kappa = kappa_of(network, worst, kappa)
        np.testing.assert_allclose(found["kappa"].double().numpy(), worst_kappa, rtol=1e-4, atol=1e-5)  # raw κ kept
        if sampler == "eV1":  # per chain, the lowest energy of the two samplers; never a better AUROC than either
            parts = [worst_cases[f"{detector}|{variation}|{s}"]["energy"] for s in ("mh", "random")]
            assert torch.equal(found["energy"], torch.minimum(*parts))
            assert row["worst-case auroc"] <= min(rows[(detector, variation, s)]["worst-case auroc"] for s in
                                                  ("mh", "random"))
            assert row["min rank"] <= min(rows[(detector, variation, s)]["min rank"] for s in ("mh", "random"))
        # the energy of each worst case: -κ standardised on ID *validation* scores, σ with N - 1, + 1e-3
        outlier = -scores[kappa]["id_val"]
        energy = (-worst_kappa - outlier.mean()) / (outlier.std(ddof=1) + 1e-3)
        np.testing.assert_allclose(found["energy"].numpy(), energy, rtol=1e-4, atol=1e-4)
        id_test, ood = scores[kappa]["id_test"], scores[kappa]["ood"]
        labels = np.r_[np.ones(id_test.size), np.zeros(ood.size)]
        assert row["clean auroc"] == pytest.approx(roc_auc_score(labels, np.r_[id_test, ood]), abs=1e-6)
        labels = np.r_[np.ones(id_test.size), np.zeros(CHAINS)]
        assert row["worst-case auroc"] == pytest.approx(roc_auc_score(labels, np.r_[id_test, worst_kappa]), abs=1e-6)
        assert row["min rank"] == int((id_test > worst_kappa.max()).sum())
        assert row["clean min rank"] == int((id_test > ood.max()).sum())
        seed_kappa = ood[chosen.numpy()]  # the clean scores of exactly the seed images
        assert row["seed auroc"] == pytest.approx(roc_auc_score(np.r_[np.ones(id_test.size), np.zeros(CHAINS)],
                                                                np.r_[id_test, seed_kappa]), abs=1e-6)
        assert row["seed min rank"] == int((id_test > seed_kappa.max()).sum()) and row["seed images"] == CHAINS
        assert row["nan proposals"] == 0
        assert row["chains"] == CHAINS and row["steps"] == (STEPS + 1) * (2 if sampler == "eV1" else 1)
        assert row["id test images"] == 4000 and row["ood test images"] == 1797
        assert row["preset"] == ("colorV1" if variation == "colour" else "affineV1")  # 28 px: the 32 px presets
        assert row["varied"] == ("brightness, contrast" if variation == "colour"
                                 else "angle, translate_x, translate_y, scale, shear")
        # the search found outliers the detector trusts at least as much as its random start
        assert row["mean lowest energy"] <= row["mean start energy"]
        if sampler in ("random", "eV1"):
            assert np.isnan(row["acceptance"])
        else:
            assert 0.0 < row["acceptance"] <= 1.0
        # transferability: the worst cases found against this detector, scored by every detector
        for other in KAPPAS:
            other_name = detector.rsplit("/", 1)[0] + "/" + other
            other_kappa = kappa_of(network, worst, other)
            expected = roc_auc_score(labels, np.r_[scores[other]["id_test"], other_kappa])
            assert run["result"]["transfer"][(variation, sampler)][detector][other_name] == pytest.approx(expected, abs=1e-6)


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
    assert "Energy standardisation on ID validation" in (out / "results.md").read_text()
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


def test_chains_do_not_depend_on_the_batch_size(run: dict, tmp_path: Path) -> None:
    """Each chain draws the same random numbers in any batch (exact: test_samplers); through a network the
    energies may differ in the last float32 bit between batch sizes (the convolution's blocking), so the
    chains agree to float tolerance, and an acceptance decision flipped by 3e-8 is practically impossible."""
    result = evaluate.main(options(run["checkpoint"], tmp_path / "out", per_batch=CHAINS) + CLI)
    for row, reference in zip(result["rows"], run["result"]["rows"], strict=True):
        for key, value in row.items():
            if isinstance(value, float):
                assert value == pytest.approx(reference[key], abs=1e-5, nan_ok=True), key
            else:
                assert value == reference[key], key
    one = torch.load(run["out"] / "worst_cases.pt", weights_only=False)
    other = torch.load(tmp_path / "out" / "worst_cases.pt", weights_only=False)
    for key in one:
        torch.testing.assert_close(one[key]["points"], other[key]["points"], atol=1e-5, rtol=0)
        torch.testing.assert_close(one[key]["energy"], other[key]["energy"], atol=1e-5, rtol=0)
        assert torch.equal(one[key]["best_step"], other[key]["best_step"]), key


def unnamed(network: torch.nn.Module, size: int = 4) -> ScoringModel:
    return ScoringModel(network, model_input=ModelInput(TensorPipeline(size, 1), size=(size, size), channels=1),
                        name="net")


def test_detector_passes_nan_refuses_infinite_and_unstandardised_use() -> None:
    class NaNNetwork(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.full((images.shape[0], 3), float("nan"))

    detector = Detector(unnamed(NaNNetwork()), "max_logit")
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

    infinite = Detector(unnamed(InfiniteNetwork()), "max_logit")
    infinite.fit_standardisation(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="infinite scores"):  # at the first batch of a search
        infinite.energy(torch.zeros(2, 1, 4, 4))


def test_pairs_and_bad_configurations(demo_checkpoint: Path) -> None:
    detector = Detector(ScoringModel(str(demo_checkpoint)), "softmax")
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
        Detector(ScoringModel(str(demo_checkpoint)), "ensemble_mi")
    with pytest.raises(SystemExit, match="--gan"):
        evaluate.main(["evg", "--model", str(demo_checkpoint), "--variation", "gan", "--chains", "2",
                       "--steps", "1", "--data-arg", "max_train_per_class=20", *CLI])
    with pytest.raises(SystemExit, match=r"\['ensemble_mi'\] pair with none of the models"):  # refused before any pass
        evaluate.main(["evg", "--model", str(demo_checkpoint), "--kappa", "softmax", "ensemble_mi", "--chains", "2",
                       "--steps", "1", *CLI])


def test_timm_detector_normalises_inside() -> None:
    """The variations act on [0, 1] images; a timm model's own mean/std normalisation happens in the detector."""
    import timm

    detector = Detector(ScoringModel("timm:resnet10t", pretrained=False), "max_logit")
    network = timm.create_model("resnet10t", pretrained=False)
    network.load_state_dict(detector.model.network.state_dict())
    network.eval()
    config = timm.data.resolve_model_data_config(network)
    assert detector.model.model_input.mean == pytest.approx(tuple(config["mean"]))
    assert detector.model.model_input.std == pytest.approx(tuple(config["std"]))
    size = config["input_size"][-1]
    images = torch.rand(3, 3, size, size, generator=torch.Generator().manual_seed(0))
    mean = torch.tensor(config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(config["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = network((images - mean) / std).max(dim=1).values
    torch.testing.assert_close(detector.scores(images), expected)
    # images of another size or grey are brought to the model's input first
    grey = images[:, :1, : size // 2, : size // 2]
    resized = torch.nn.functional.interpolate(grey.expand(-1, 3, -1, -1), size=(size, size), mode="bilinear",
                                              align_corners=False, antialias=True)
    with torch.no_grad():
        torch.testing.assert_close(detector.scores(grey), network((resized - mean) / std).max(dim=1).values)
    assert detector.name == "resnet10t/max_logit"


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
