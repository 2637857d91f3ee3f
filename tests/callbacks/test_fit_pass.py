"""The engine's fit pass: fitted detectors fit once per (model, fit set, cap) on gathered outputs, the cap a
seeded, class-balanced choice, and every bad input refused by name before the heavy pass."""

import numpy as np
import pytest
import torch

from datamodules.evaluation import EvaluationSet, fit_folder_set
from datamodules.images import TensorImageDataset
from evaluation_engine.scoring import ScoringPasses, check_detectors, check_fit_options, fit_subset
from metrics.detectors.base import Detector
from metrics.kappa import detector_kappa, kappa_scores
from tests.callbacks.test_scoring import Counting, fake_trainer, scoring_model


class ClassMean(Detector):
    """A minimal fitted detector: minus the distance to the nearest class mean of the fit features."""

    name = "class_mean"
    inputs = frozenset({"features"})
    fit_data = True

    def _fit(self, data):
        features, targets = data["features"].double(), data["targets"]
        self.register_buffer("means", torch.stack([features[targets == c].mean(0) for c in range(int(targets.max()) + 1)]))

    def _score(self, outputs):
        return -torch.cdist(outputs["features"].double(), self.means).min(1).values


class HeadEnergy(Detector):
    """Energy of the head's logits of the features (reads only the head: fitted without data)."""

    name = "head_energy"
    inputs = frozenset({"features", "head"})

    def _score(self, outputs):
        return torch.logsumexp(self.head_logits(outputs["features"]), dim=1)


class Headed(Counting):
    """Features: the first 4 pixels; logits: the linear head of them."""

    def forward(self, images):
        self.calls += 1
        return self.linear(self.features(images))

    def features(self, images):
        return images.flatten(1)[:, :4]


CLASS_MEAN, HEAD_ENERGY = detector_kappa(ClassMean), detector_kappa(HeadEnergy)


def fit_set(n: int = 30, classes: int = 3, seed: int = 0) -> EvaluationSet:
    generator = torch.Generator().manual_seed(seed)
    return EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(n, 1, 2, 2, generator=generator),
                                                          torch.arange(n) % classes))


def test_a_fit_runs_one_pass_and_is_kept_for_the_run_its_cap_another_pass(tmp_path):
    model, trainer, data = scoring_model(), fake_trainer(0, 1), fit_set()
    passes = ScoringPasses(tmp_path / "cache")
    detector = passes.fitted(trainer, model, CLASS_MEAN, {}, data, batch_size=7)
    assert passes.passes == 1 and detector.fitted
    images = data.dataset.images.flatten(1)[:, :2].double()  # Counting's features: the first two pixels
    labels = data.labels().numpy()
    expected = np.stack([images.numpy()[labels == c].mean(0) for c in range(3)])
    np.testing.assert_allclose(detector.means.numpy(), expected, rtol=1e-6)
    assert passes.fitted(trainer, model, CLASS_MEAN, {}, data, batch_size=7) is detector  # kept for the run
    assert passes.passes == 1 and len(passes.fits) == 1
    # scores() uses the fitted detector: minus the distance to the nearest class mean
    test = EvaluationSet("id_test", "id_test", TensorImageDataset(torch.rand(5, 1, 2, 2), torch.zeros(5, dtype=torch.long)))
    scores = passes.scores(trainer, model, test, CLASS_MEAN, {}, batch_size=7)
    points = test.dataset.images.flatten(1)[:, :2].double().numpy()
    manual = -np.sqrt(((points[:, None, :] - expected[None]) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(scores.numpy(), manual, rtol=1e-6)
    # another cap: another subset, another pass, another fitted state (and the old one is not reused)
    capped = passes.fitted(trainer, model, CLASS_MEAN, {}, data, fit={"per_class": 4}, batch_size=7)
    assert passes.passes == 3 and capped is not detector  # the capped fit pass and the test pass
    assert passes.fits[-1]["samples"] == 12 and capped.state_fingerprint() != detector.state_fingerprint()
    # a new engine on the same cache: the fit pass comes from the disk, the same state
    again = ScoringPasses(tmp_path / "cache")
    assert again.fitted(trainer, model, CLASS_MEAN, {}, data, batch_size=7).state_fingerprint() == \
        detector.state_fingerprint()
    assert again.passes == 0


def test_the_cap_is_seeded_and_class_balanced():
    data = fit_set(31, 3)
    half = fit_subset(data, {"fraction": 0.5})
    labels = data.labels()[torch.tensor(half.dataset.indices)]
    assert len(half) == 16 and sorted(torch.bincount(labels).tolist()) == [5, 5, 6]
    assert half.dataset.indices == sorted(half.dataset.indices)  # in dataset order
    assert fit_subset(data, {"fraction": 0.5}).dataset.indices == half.dataset.indices
    assert fit_subset(data, {"fraction": 0.5, "seed": 1}).dataset.indices != half.dataset.indices
    per_class = fit_subset(data, {"per_class": 4})
    assert torch.bincount(data.labels()[torch.tensor(per_class.dataset.indices)]).tolist() == [4, 4, 4]
    assert fit_subset(data, {}) is data and fit_subset(data, {"per_class": 100}) is data
    assert half.fingerprint() != per_class.fingerprint() != data.fingerprint()


def test_a_head_only_detector_fits_without_data_and_a_wrong_head_is_refused():
    network = Headed()
    model, trainer = scoring_model(network), fake_trainer(0, 1)
    detector = ScoringPasses().fitted(trainer, model, HEAD_ENERGY, {}, None)
    images = torch.rand(6, 1, 2, 2)
    features = images.flatten(1)[:, :4]
    with torch.no_grad():
        expected = torch.logsumexp(network.linear(features).double(), dim=1)
    torch.testing.assert_close(detector.score({"features": features}), expected)
    # a detector that reads the head and fits on data: the head must map the features to the logits
    both = type("Both", (ClassMean,), {"name": "both", "inputs": frozenset({"features", "head"})})
    with pytest.raises(ValueError, match="head does not map its penultimate features to its logits"):
        ScoringPasses().fitted(trainer, scoring_model(Counting()), detector_kappa(both), {}, fit_set(), batch_size=8)
    ScoringPasses().fitted(trainer, model, detector_kappa(both), {}, fit_set(), batch_size=8)  # Headed's head fits


def test_bad_fit_input_is_refused_by_name_before_the_pass():
    model, trainer = scoring_model(), fake_trainer(0, 1)
    with pytest.raises(ValueError, match="fits on in-distribution training images and counting has none"):
        check_detectors([CLASS_MEAN], model, None)
    with pytest.raises(ValueError, match="fits on in-distribution training images and counting has none"):
        ScoringPasses().fitted(trainer, model, CLASS_MEAN, {}, None)
    outside = EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(6, 1, 2, 2), torch.tensor([0, 1, 2, 5, 0, 1])))
    with pytest.raises(ValueError, match=r"labels \[5\] are not among its 3 known classes"):
        ScoringPasses().fitted(trainer, model, CLASS_MEAN, {}, outside, batch_size=8)
    absent = EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(4, 1, 2, 2), torch.tensor([0, 0, 1, 1])))
    with pytest.raises(ValueError, match=r"its known classes \[2\] have no image"):
        ScoringPasses().fitted(trainer, model, CLASS_MEAN, {}, absent, batch_size=8)

    class NoFeatures(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, images):
            return self.linear(images.flatten(1))

    with pytest.raises(ValueError, match="reads penultimate features and counting \\(NoFeatures\\) has no feature hook"):
        check_detectors([CLASS_MEAN], scoring_model(NoFeatures()), fit_set())

    class NoHead(Counting):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Identity()

        def forward(self, images):
            return images.flatten(1)[:, :3]

    with pytest.raises(ValueError, match="has no linear classification head"):
        check_detectors([HEAD_ENERGY], scoring_model(NoHead()), None)
    for bad, message in (({"fraction": 0}, r"fraction must be in \(0, 1\]"), ({"per_class": 0}, "positive integer"),
                         ({"fraction": 0.5, "per_class": 3}, "not both"), ({"count": 3}, r"unknown \['count'\]")):
        with pytest.raises(ValueError, match=message):
            check_fit_options("knn", bad)
    # a fitted κ scored without its fit: an error, not a silent default
    with pytest.raises(ValueError, match="must be fitted on in-distribution training outputs first"):
        kappa_scores(CLASS_MEAN, {"logits": torch.zeros(2, 3), "features": torch.zeros(2, 2)}, background=False,
                     parameters={})
    with pytest.raises(ValueError, match="is not fitted: call ScoringPasses.fitted"):
        ScoringPasses().scores(trainer, model, fit_set(), CLASS_MEAN, {}, batch_size=8)


def test_a_fit_folder_must_hold_exactly_the_models_classes(tmp_path):
    from tests.conftest import write_jpeg

    rng = np.random.default_rng(0)
    for wnid in ("n01440764", "n01443537", "n09999999"):
        write_jpeg(tmp_path / "train" / wnid / "a.JPEG", rng)
    with pytest.raises(ValueError, match=r"missing \['n01484850'\] \(1\); not among the model's \['n09999999'\]"):
        fit_folder_set(str(tmp_path / "train"), ["n01440764", "n01443537", "n01484850"])
    (tmp_path / "train" / "n09999999" / "a.JPEG").unlink()
    (tmp_path / "train" / "n09999999").rmdir()
    found = fit_folder_set(str(tmp_path / "train"), ["n01443537", "n01440764"])
    assert found.role == "fit" and found.labels().tolist() == [0, 1]  # in the model's class order
    assert found.dataset.rows[0][0].startswith("n01443537")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        fit_folder_set(str(tmp_path / "nowhere"), ["a"])


def test_during_training_the_detector_is_refitted_every_evaluation_on_the_capped_training_split(tmp_path):
    import pytorch_lightning as pl

    from callbacks import SeverityAUROC
    from datamodules import FashionMNISTOpenSetDataModule
    from datamodules.severity import FashionSeverityData
    from lightning_modules import OpenSetClassifier

    pl.seed_everything(0)
    data = FashionMNISTOpenSetDataModule(max_train_per_class=12, batch_size=16)
    model = OpenSetClassifier(num_classes=4, loss="eos", backbone="small_cnn", in_channels=1)
    severity = SeverityAUROC(data=FashionSeverityData(estimation=4, test=3, batch_size=64), kappas=["softmax", CLASS_MEAN],
                             every_n_epochs=1, train_fit={"per_class": 5}, output_dir=str(tmp_path), plots=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[severity], num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    fits = severity.passes.fits
    # one fit per evaluation epoch, on 5 training images of each known class, with that epoch's weights
    assert [entry["samples"] for entry in fits] == [20, 20]
    assert fits[0]["fingerprint"] == fits[1]["fingerprint"] and fits[0]["state"] != fits[1]["state"]
    assert [h["epoch"] for h in severity.history if h["confidence function"] == "class_mean"] == [0] * 11 + [1] * 11
    # the fit set is the training split's known classes (negatives left out), raw images
    assert severity.fit_set.role == "fit" and set(severity.fit_set.labels().tolist()) == {0, 1, 2, 3}


def test_review_fixes_caps_heads_and_checks_before_the_pass():
    from evaluation_engine.scoring import check_head
    from metrics import KAPPAS

    model, trainer, data = scoring_model(Headed()), fake_trainer(0, 1), fit_set(30, 3)
    # a user's cap replaces the detector's default cap (knn_imagenet: 1%), it is not merged into "both"
    passes = ScoringPasses()
    detector = passes.fitted(trainer, model, KAPPAS["knn_imagenet"], {"k": 2}, data, fit={"per_class": 4}, batch_size=8)
    assert passes.fits[-1]["samples"] == 12 and detector.fitted
    # KNN's k above the capped fit set: refused before the fit pass runs
    passes = ScoringPasses()
    with pytest.raises(ValueError, match="k = 50 neighbours, but the fit set has only 30 samples"):
        passes.fitted(trainer, model, KAPPAS["knn"], {"k": 50}, data, batch_size=8)
    assert passes.passes == 0
    # a cap too small for every class: named as the cap's doing, before the pass (the model names its classes)
    model.classes = ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"the cap \{'fraction': 0.05\} keeps 2 images, too few"):
        passes.fitted(trainer, model, KAPPAS["knn"], {"k": 1}, data, fit={"fraction": 0.05}, batch_size=8)
    assert passes.passes == 0
    # the head check: relative to the logits (bf16 rounding passes), a wrong head does not
    features = torch.randn(64, 4, dtype=torch.float64)
    weight, bias = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    logits = features @ weight.T + bias
    check_head((weight, bias), {"features": features, "logits": logits * (1 + 4e-3 * torch.randn_like(logits))}, model="m")
    with pytest.raises(ValueError, match="does not map its penultimate features"):
        check_head((weight, bias), {"features": features, "logits": logits.flip(0)}, model="m")
    # a detector that reads only the head (ASH) gets the check on its first scored pass
    with pytest.raises(ValueError, match="does not map its penultimate features"):
        ScoringPasses().scores(trainer, scoring_model(Counting()), data, KAPPAS["ash_s"], {"percentile": 0.5},
                               batch_size=8)


def test_the_fitted_state_is_written_and_a_large_bank_only_fingerprinted(tmp_path, monkeypatch):
    import evaluation_engine.scoring as scoring
    from metrics import KAPPAS

    model, trainer, data = scoring_model(), fake_trainer(0, 1), fit_set(30, 3)
    passes = ScoringPasses()
    knn = passes.fitted(trainer, model, KAPPAS["knn"], {"k": 3}, data, batch_size=8)
    mean = passes.fitted(trainer, model, CLASS_MEAN, {}, data, batch_size=8)
    monkeypatch.setattr(scoring, "FITTED_TENSOR_LIMIT", 100)  # KNN's bank (30 x 2 float64 = 480 bytes) is over it
    written = torch.load(scoring.write_fitted(tmp_path, passes, [knn, mean]), weights_only=False)
    entries = {e["kappa"]: e for e in written.values()}
    assert set(entries) == {"knn", "class_mean"} and entries["knn"]["samples"] == 30
    (name, record), = entries["knn"]["left_out"].items()
    assert record["shape"] == [30, 2] and name not in entries["knn"]["state_dict"]
    torch.testing.assert_close(entries["class_mean"]["state_dict"]["means"], mean.means)  # small: written whole
    assert entries["class_mean"]["state"] == mean.state_fingerprint()
