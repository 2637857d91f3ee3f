"""The engine's passes (:mod:`evaluation_engine.scoring`).

Sharded passes and the prediction cache: exact on any number of processes, one decision for all ranks.

The fit pass: fitted detectors fit once per (model, fit set, cap) on gathered outputs, the cap a
seeded, class-balanced choice, and every bad input refused by name before the heavy pass."""

import contextlib
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from datamodules.evaluation import EvaluationSet, fit_folder_set
from datamodules.images import TensorImageDataset
from evaluation_engine.scoring import (
    PredictionCache,
    ScoringPasses,
    check_detectors,
    check_fit_options,
    fit_subset,
    shard_indices,
    sharded_outputs,
)
from metrics import KAPPAS
from metrics.detectors import DETECTORS
from metrics.detectors.base import Detector
from metrics.kappa import kappa_scores
from tests.distributed import run_distributed


def fake_runner(rank: int, world_size: int):
    """The parts of a Runner that the sharded pass and the cache use (rank, world, precision, broadcast)."""

    def broadcast(obj, src=0):
        if world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    return SimpleNamespace(global_rank=rank, world_size=world_size, is_global_zero=rank == 0, precision="32-true",
                           forward_context=contextlib.nullcontext, broadcast=broadcast, datamodule=None, loggers=[])


def dataset(n: int) -> TensorImageDataset:
    generator = torch.Generator().manual_seed(n)
    return TensorImageDataset(torch.rand(n, 1, 2, 2, generator=generator), torch.arange(n) % 3)


def step(images: torch.Tensor) -> dict[str, torch.Tensor]:
    flat = images.flatten(1)
    return {"logits": flat * 2, "scores": flat.sum(1)}


def test_shard_indices():
    assert shard_indices(5, 0, 2) == [0, 2, 4] and shard_indices(5, 1, 2) == [1, 3]
    assert shard_indices(1, 1, 2) == []
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        shard_indices(5, 2, 2)


def _sharded(rank: int, world_size: int, n: int, batch_size: int):
    return sharded_outputs(fake_runner(rank, world_size), dataset(n), step, keys=["logits", "scores"],
                           batch_size=batch_size)


CASES = [(1, 4), (7, 2)]  # fewer samples than ranks; uneven shards


def _sharded_each(rank: int, world_size: int, cases: list[tuple[int, int]]):
    """Every case in turn, in one pair of processes (starting processes is most of the cost)."""
    return [_sharded(rank, world_size, n, batch_size) for n, batch_size in cases]


@pytest.fixture(scope="module")
def distributed_results() -> list[list]:
    return run_distributed(_sharded_each, CASES)


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_two_processes_equal_one_process(case, distributed_results):
    n, batch_size = CASES[case]
    data = dataset(n)
    images = torch.stack([data[i].image for i in range(n)])
    expected = step(images)
    single = _sharded(0, 1, n, batch_size)
    torch.testing.assert_close(single["logits"], expected["logits"], rtol=0, atol=0)
    for per_rank in distributed_results:
        result = per_rank[case]
        assert result["targets"].tolist() == data.labels.tolist()
        for key in ("logits", "scores"):
            assert torch.equal(result[key], single[key])


def test_skipped_samples_are_an_error():
    class Holey(TensorImageDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return sample._replace(image=None) if index == 2 else sample

    holey = Holey(torch.rand(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="cover 3 of 4 samples"):
        sharded_outputs(fake_runner(0, 1), holey, step, keys=["logits"], batch_size=2)


def _decide(rank: int, world_size: int, directories: list[str], key: str):
    # every rank looks in its own folder: only rank 0's holds the file (e.g. node-local disks)
    cache = PredictionCache(directories[rank])
    return cache.load_on_rank_zero(fake_runner(rank, world_size), "model-id", key, rows=3)


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_rank_zero_decides_for_every_rank(tmp_path):
    tensors = {"logits": torch.arange(6.0).reshape(3, 2), "targets": torch.tensor([0, 1, 2])}
    PredictionCache(tmp_path / "zero").save("model-id", "k" * 64, tensors, {"split": "id"})
    results = run_distributed(_decide, [str(tmp_path / "zero"), str(tmp_path / "one")], "k" * 64)
    for result, meta in results:  # a hit on every rank, with rank 0's tensors and the meta they were saved with
        assert result is not None and torch.equal(result["logits"], tensors["logits"])
        assert meta == {"split": "id"}
    misses = run_distributed(_decide, [str(tmp_path / "one"), str(tmp_path / "zero")], "k" * 64)
    assert misses == [(None, {}), (None, {})]  # rank 0 misses: every rank recomputes, even one with the file


def test_save_is_atomic_and_load_checks_the_key(tmp_path):
    cache = PredictionCache(tmp_path)
    tensors = {"logits": torch.zeros(2, 3), "targets": torch.zeros(2, dtype=torch.long)}
    path = cache.save("m", "a" * 64, tensors, {})
    assert path == tmp_path / f"m-{'a' * 16}.pt" and not list(tmp_path.glob(".*tmp"))
    assert cache.load("m", "b" * 64, rows=2) is None  # another key: another file name
    assert torch.equal(cache.load("m", "a" * 64, rows=2)["logits"], tensors["logits"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load("absent", "a" * 64, rows=2) is None  # a plain miss does not warn


# -- the engine's scoring passes --------------------------------------------------------------------------


class Counting(torch.nn.Module):
    """Logits ``(N, 3)`` and features ``(N, 2)`` of flat images, counting its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(images.flatten(1)[:, :4])

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1)[:, :2]


def scoring_model(network=None, size: int = 2):
    from datamodules.transforms import ModelInput, TensorPipeline
    from lightning_modules.scoring import ScoringModel

    torch.manual_seed(0)
    return ScoringModel(network or Counting(), model_input=ModelInput(TensorPipeline(size, 1), size=(size, size),
                                                                      channels=1), name="counting")


def evaluation_set(n: int = 7, name: str = "id_test"):
    from datamodules.evaluation import EvaluationSet

    return EvaluationSet(name, "id_test", dataset(n))


def test_a_pass_is_run_once_per_model_and_set_whatever_asks_for_it(tmp_path):
    from evaluation_engine.scoring import ScoringPasses
    from metrics import KAPPAS
    from metrics.detectors import DETECTORS

    model, data, trainer = scoring_model(), evaluation_set(), fake_runner(0, 1)
    passes = ScoringPasses(tmp_path / "cache")
    first = passes.outputs(trainer, model, data, batch_size=3)
    assert passes.passes == 1 and model.network.calls == 3  # ceil(7 / 3) batches
    for name in ("softmax", "max_logit", "energy"):  # every logit κ from the same pass
        scores = passes.scores(trainer, model, data, DETECTORS[name], {}, batch_size=3)
        torch.testing.assert_close(scores, KAPPAS[name](first["logits"]))
    assert passes.passes == 1 and model.network.calls == 3
    with_features = passes.outputs(trainer, model, data, features=True, batch_size=3)  # features: one more pass
    assert passes.passes == 2 and torch.equal(with_features["logits"], first["logits"])
    passes.outputs(trainer, model, data, batch_size=3)
    assert passes.passes == 2  # the kept pass with features serves logits too
    # another run (a new engine) reads the cache; another input transform or set is another pass
    again = ScoringPasses(tmp_path / "cache")
    assert torch.equal(again.outputs(trainer, model, data, features=True, batch_size=3)["logits"], first["logits"])
    assert again.passes == 0
    resized = scoring_model(model.network, size=3)
    again.outputs(trainer, resized, data, batch_size=3)
    again.outputs(trainer, model, evaluation_set(5, "other"), batch_size=3)
    assert again.passes == 2


def test_the_models_own_input_reaches_it_and_nan_is_never_cached(tmp_path):
    from PIL import Image

    from datamodules.evaluation import EvaluationSet
    from datamodules.images import ImageFileDataset
    from evaluation_engine.scoring import ScoringPasses

    for i in range(3):  # files of two sizes and modes: the model's input brings them to one
        Image.new("RGB" if i else "L", (5 + i, 4), color=40 * i).save(tmp_path / f"{i}.png")
    files = EvaluationSet("files", "ood", ImageFileDataset(str(tmp_path), [(f"{i}.png", -2) for i in range(3)]))
    model, trainer = scoring_model(size=2), fake_runner(0, 1)
    outputs = ScoringPasses().outputs(trainer, model, files, batch_size=3)
    with torch.no_grad():
        expected = model.network(torch.stack([model.model_input.pipeline(files.dataset[i].image) for i in range(3)]))
    torch.testing.assert_close(outputs["logits"], expected)

    class NaN(Counting):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return super().forward(images) * float("nan")

    passes = ScoringPasses(tmp_path / "cache")
    with pytest.raises(ValueError, match="gave NaN or infinite \\['logits'\\] on id_test; nothing of it is cached"):
        passes.outputs(trainer, scoring_model(NaN()), evaluation_set(), batch_size=3)
    assert not (tmp_path / "cache").exists()


def test_images_of_several_sizes_are_refused_by_name():
    from datamodules.evaluation import EvaluationSet
    from datamodules.transforms import ModelInput, TensorPipeline
    from evaluation_engine.scoring import ScoringPasses
    from lightning_modules.scoring import ScoringModel

    mixed = torch.utils.data.ConcatDataset([TensorImageDataset(torch.rand(2, 1, 2, 2), torch.zeros(2)),
                                            TensorImageDataset(torch.rand(2, 1, 3, 3), torch.zeros(2))])
    free = ScoringModel(Counting(), model_input=ModelInput(TensorPipeline(None, None)), name="free")
    with pytest.raises(ValueError, match=r"mixed holds images of several sizes \[\(1, 2, 2\), \(1, 3, 3\)\]"):
        ScoringPasses().outputs(fake_runner(0, 1), free, EvaluationSet("mixed", "ood", mixed), batch_size=4)


def test_pairs_that_cannot_be_served_are_refused_when_the_run_starts():
    from evaluation_engine.scoring import detector_pairs
    from metrics.detectors import DETECTORS

    single = scoring_model()
    pairs = detector_pairs([single], [DETECTORS["softmax"], DETECTORS["energy"]])
    assert [(m.display_name, k.name) for m, k in pairs] == [("counting", "softmax"), ("counting", "energy")]
    with pytest.raises(ValueError, match=r"\['ensemble_mi'\] pair with none of the models \['counting'\]"):
        detector_pairs([single], [DETECTORS["softmax"], DETECTORS["ensemble_mi"]])


def test_a_detectors_non_finite_scores_name_it_its_arguments_and_the_set():
    """The engine's scores go through the one κ dispatch, which names the κ, its arguments and the set of the pass:
    pytorch-ood's energy at t = 0 is NaN for every image."""
    from evaluation_engine.scoring import ScoringPasses
    from metrics import resolve_detector

    model, data, trainer = scoring_model(), evaluation_set(7, "ood:digits"), fake_runner(0, 1)
    energy = resolve_detector("pood:EnergyBased")
    with pytest.raises(ValueError, match=r"^confidence function 'pood:EnergyBased' \(t=0\) gave NaN or infinite scores "
                                         r"for 7 of 7 images of ood:digits \(first rows: \[0, 1, 2, 3, 4\]\)"):
        ScoringPasses().scores(trainer, model, data, energy, energy.arguments(t=0), batch_size=3)
    passes = ScoringPasses()
    scores = passes.scores(trainer, model, data, energy, energy.arguments(t=1), batch_size=3)
    logits = passes.outputs(trainer, model, data, batch_size=3)["logits"]
    torch.testing.assert_close(scores, torch.logsumexp(logits.double(), dim=1))  # t = 1: -energy, finite


# -- the fit pass ------------------------------------------------------------------------------------------


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


CLASS_MEAN, HEAD_ENERGY = ClassMean, HeadEnergy


def fit_set(n: int = 30, classes: int = 3, seed: int = 0) -> EvaluationSet:
    generator = torch.Generator().manual_seed(seed)
    return EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(n, 1, 2, 2, generator=generator),
                                                          torch.arange(n) % classes))


def test_a_fit_runs_one_pass_and_is_kept_for_the_run_its_cap_another_pass(tmp_path):
    model, trainer, data = scoring_model(), fake_runner(0, 1), fit_set()
    passes = ScoringPasses(tmp_path / "cache")
    detector = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=7)
    assert passes.passes == 1 and detector.fitted
    images = data.dataset.images.flatten(1)[:, :2].double()  # Counting's features: the first two pixels
    labels = data.labels().numpy()
    expected = np.stack([images.numpy()[labels == c].mean(0) for c in range(3)])
    np.testing.assert_allclose(detector.means.numpy(), expected, rtol=1e-6)
    assert passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=7) is detector  # kept for the run
    assert passes.passes == 1 and len(passes.fits) == 1
    # scores() uses the fitted detector: minus the distance to the nearest class mean
    test = EvaluationSet("id_test", "id_test", TensorImageDataset(torch.rand(5, 1, 2, 2), torch.zeros(5, dtype=torch.long)))
    scores = passes.scores(trainer, model, test, CLASS_MEAN, {}, batch_size=7)
    points = test.dataset.images.flatten(1)[:, :2].double().numpy()
    manual = -np.sqrt(((points[:, None, :] - expected[None]) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(scores.numpy(), manual, rtol=1e-6)
    # another cap: another subset, another pass, another fitted state (and the old one is not reused)
    capped = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, fit={"per_class": 4}, batch_size=7)
    assert passes.passes == 3 and capped is not detector  # the capped fit pass and the test pass
    assert passes.fits[-1]["samples"] == 12 and capped.state_fingerprint() != detector.state_fingerprint()
    # a new engine on the same cache: the fit pass comes from the disk, the same state
    again = ScoringPasses(tmp_path / "cache")
    assert again.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=7).state_fingerprint() == \
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
    # images in all, class-balanced (NAC's 1,000: one a class of ImageNet-1K): 8 of 3 classes are 3, 3, 2
    eight = fit_subset(data, {"images": 8})
    assert len(eight) == 8 and sorted(torch.bincount(data.labels()[torch.tensor(eight.dataset.indices)]).tolist()) \
        == [2, 3, 3]
    assert eight.dataset.indices == sorted(eight.dataset.indices) and fit_subset(data, {"images": 31}) is data
    assert fit_subset(data, {"images": 16}).dataset.indices == half.dataset.indices  # the same draw as 50%


def test_a_head_only_detector_fits_without_data_and_a_wrong_head_is_refused():
    network = Headed()
    model, trainer = scoring_model(network), fake_runner(0, 1)
    detector = ScoringPasses().fitted_detector(trainer, model, HEAD_ENERGY, {}, None)
    images = torch.rand(6, 1, 2, 2)
    features = images.flatten(1)[:, :4]
    with torch.no_grad():
        expected = torch.logsumexp(network.linear(features).double(), dim=1)
    torch.testing.assert_close(detector.score({"features": features}), expected)
    # a detector that reads the head and fits on data: the head must map the features to the logits
    both = type("Both", (ClassMean,), {"name": "both", "inputs": frozenset({"features", "head"})})
    with pytest.raises(ValueError, match="head does not map its penultimate features to its logits"):
        ScoringPasses().fitted_detector(trainer, scoring_model(Counting()), both, {}, fit_set(), batch_size=8)
    ScoringPasses().fitted_detector(trainer, model, both, {}, fit_set(), batch_size=8)  # Headed's head fits


def test_bad_fit_input_is_refused_by_name_before_the_pass():
    model, trainer = scoring_model(), fake_runner(0, 1)
    with pytest.raises(ValueError, match="fits on in-distribution training images and counting has none"):
        check_detectors([CLASS_MEAN], model, None)
    with pytest.raises(ValueError, match="fits on in-distribution training images and counting has none"):
        ScoringPasses().fitted_detector(trainer, model, CLASS_MEAN, {}, None)
    outside = EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(6, 1, 2, 2), torch.tensor([0, 1, 2, 5, 0, 1])))
    with pytest.raises(ValueError, match=r"labels \[5\] are not among its 3 known classes"):
        ScoringPasses().fitted_detector(trainer, model, CLASS_MEAN, {}, outside, batch_size=8)
    absent = EvaluationSet("fit", "fit", TensorImageDataset(torch.rand(4, 1, 2, 2), torch.tensor([0, 0, 1, 1])))
    with pytest.raises(ValueError, match=r"its known classes \[2\] have no image"):
        ScoringPasses().fitted_detector(trainer, model, CLASS_MEAN, {}, absent, batch_size=8)

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
                         ({"fraction": 0.5, "per_class": 3}, "not fraction and per_class"),
                         ({"per_class": 3, "images": 10}, "not per_class and images"), ({"images": 2.5}, "images must be"),
                         ({"count": 3}, r"unknown \['count'\]")):
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

    model, trainer, data = scoring_model(Headed()), fake_runner(0, 1), fit_set(30, 3)
    # a user's cap replaces the detector's default cap (knn_imagenet: 1%), it is not merged into "both"
    passes = ScoringPasses()
    detector = passes.fitted_detector(trainer, model, DETECTORS["knn_imagenet"], {"k": 2}, data, fit={"per_class": 4}, batch_size=8)
    assert passes.fits[-1]["samples"] == 12 and detector.fitted
    # KNN's k above the capped fit set: refused before the fit pass runs
    passes = ScoringPasses()
    with pytest.raises(ValueError, match="k = 50 neighbours, but the fit set has only 30 samples"):
        passes.fitted_detector(trainer, model, DETECTORS["knn"], {"k": 50}, data, batch_size=8)
    assert passes.passes == 0
    # a cap too small for every class: named as the cap's doing, before the pass (the model names its classes)
    model.classes = ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"the cap \{'fraction': 0.05\} keeps 2 images, too few"):
        passes.fitted_detector(trainer, model, DETECTORS["knn"], {"k": 1}, data, fit={"fraction": 0.05}, batch_size=8)
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
        ScoringPasses().scores(trainer, scoring_model(Counting()), data, DETECTORS["ash_s"], {"percentile": 0.5},
                               batch_size=8)


def test_the_fitted_state_is_written_and_a_large_bank_only_fingerprinted(tmp_path, monkeypatch):
    import evaluation_engine.scoring as scoring

    model, trainer, data = scoring_model(), fake_runner(0, 1), fit_set(30, 3)
    passes = ScoringPasses()
    knn = passes.fitted_detector(trainer, model, DETECTORS["knn"], {"k": 3}, data, batch_size=8)
    mean = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=8)
    monkeypatch.setattr(scoring, "FITTED_TENSOR_LIMIT", 100)  # KNN's bank (30 x 2 float64 = 480 bytes) is over it
    written = torch.load(scoring.write_fitted(tmp_path, passes, [knn, mean]), weights_only=False)
    entries = {e["kappa"]: e for e in written.values()}
    assert set(entries) == {"knn", "class_mean"} and entries["knn"]["samples"] == 30
    (name, record), = entries["knn"]["left_out"].items()
    assert record["shape"] == [30, 2] and name not in entries["knn"]["state_dict"]
    torch.testing.assert_close(entries["class_mean"]["state_dict"]["means"], mean.means)  # small: written whole
    assert entries["class_mean"]["state"] == mean.state_fingerprint()


# -- no detector is fitted on the data it is tested on -----------------------------------------------------


def test_a_fit_set_holding_evaluation_images_is_refused_before_any_pass_unless_allowed(monkeypatch):
    import evaluation_engine.scoring as scoring
    from datamodules.overlap import FitOverlapError

    model, trainer, data = scoring_model(), fake_runner(0, 1), fit_set(30, 3)
    images = data.dataset.images
    id_test = EvaluationSet("id_test", "id_test", TensorImageDataset(torch.rand(8, 1, 2, 2), torch.arange(8) % 3))
    shared = [4, 11, 25]  # 3 of the 30 fit images are among the OOD set's 6, at its positions 5, 0, 2
    ood_images = torch.rand(6, 1, 2, 2)
    ood_images[[5, 0, 2]] = images[shared]
    ood = EvaluationSet("ood", "ood", TensorImageDataset(ood_images, torch.full((6,), -2)))
    compared = []
    original = scoring.find_overlap
    monkeypatch.setattr(scoring, "find_overlap", lambda *sets: compared.append(sets) or original(*sets))
    passes = ScoringPasses()
    with pytest.raises(FitOverlapError) as refused:
        passes.check_fit_overlap(data, [id_test, ood, data])
    message = str(refused.value)
    assert "3 of its 30 images are images of ood (role ood, in memory (TensorImageDataset): 3 of its 6 images" in message
    assert "fit[4] = ood[5] (same pixels); fit[11] = ood[0] (same pixels); fit[25] = ood[2] (same pixels)" in message
    assert "id_test" not in message and "--allow-fit-overlap" in message and passes.passes == 0
    assert len(compared) == 2  # id_test and ood; the fit set itself (role fit) is not compared with itself
    # allowed: the overlap is kept (each pair compared once per run) and every fit on the set records it
    with pytest.warns(RuntimeWarning, match="fit set 'fit' overlaps ood: 3 of its 30 images are ood images"):
        (found,) = passes.check_fit_overlap(data, [id_test, ood], allow=True)
    assert found.fit_indices.tolist() == shared and len(compared) == 2
    detector = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=8)
    assert passes.fits[-1]["overlaps"] == [{"set": "ood", "role": "ood", "images": 3, "of": 30, "set images": 6,
                                            "note": "fit set 'fit' overlaps ood: 3 of its 30 images are ood images "
                                                    "(allowed by --allow-fit-overlap)"}]
    assert passes.fit_notes(detector) == passes.fits[-1]["overlaps"][0]["note"]
    # a cap counts the shared images it keeps (compared with the cap's own choice of images)
    capped = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, fit={"per_class": 4}, batch_size=8)
    kept = fit_subset(data, {"per_class": 4}).dataset.indices
    (entry,) = passes.fits[-1]["overlaps"]
    assert (entry["images"], entry["of"]) == (len(set(kept) & set(shared)), 12)
    assert passes.fit_notes(capped).startswith("fit set 'fit[per_class=4]' overlaps ood")
    # a set of a later evaluation of the run (a report card's next section): the fit log is completed, and a
    # table states the overlaps with its own sets only
    later = EvaluationSet("near_ood", "near_ood", TensorImageDataset(images[[0, 1]], torch.full((2,), -2)))
    with pytest.warns(RuntimeWarning, match="overlaps near_ood: 2 of its 30 images"):
        passes.check_fit_overlap(data, [later], allow=True)
    assert [(e["set"], e["images"]) for e in passes.fits[0]["overlaps"]] == [("ood", 3), ("near_ood", 2)]
    assert passes.fit_notes(detector, [id_test, later]) == ("fit set 'fit' overlaps near_ood: 2 of its 30 images are "
                                                            "near_ood images (allowed by --allow-fit-overlap)")
    assert passes.fit_notes(detector, [id_test]) == ""
    # the report card's notes: one line per fitted detector and overlapping set (report_card.provenance)
    from report_card.provenance import fit_overlap_notes

    assert fit_overlap_notes(passes.fits) == [
        f"Warning: counting / class_mean: {entry['note']}; its numbers are of images it was fitted on."
        for fit in passes.fits for entry in fit["overlaps"]] and len(fit_overlap_notes(passes.fits)) == 4
    # a fit set that overlaps nothing: no note
    clean = passes.fitted_detector(trainer, model, CLASS_MEAN, {}, fit_set(30, 3, seed=1), batch_size=8)
    assert passes.fit_notes(clean) == "" and passes.fits[-1]["overlaps"] == []


def test_scores_checks_a_set_its_fitted_detector_was_not_checked_against():
    from datamodules.overlap import FitOverlapError

    model, trainer, data = scoring_model(), fake_runner(0, 1), fit_set(30, 3)
    passes = ScoringPasses()
    passes.fitted_detector(trainer, model, CLASS_MEAN, {}, data, batch_size=8)
    copied = EvaluationSet("id_test", "id_test", TensorImageDataset(data.dataset.images[:5], torch.arange(5) % 3))
    with pytest.raises(FitOverlapError, match="5 of its 30 images are images of id_test"):
        passes.scores(trainer, model, copied, CLASS_MEAN, {}, batch_size=8)
    assert passes.passes == 1  # the fit pass only: the overlapping set was not scored
    passes.scores(trainer, model, data, CLASS_MEAN, {}, batch_size=8)  # the fit set itself (role fit): no check


def test_a_default_cap_too_small_for_the_detector_names_the_cap_and_the_option():

    model, trainer = scoring_model(Headed()), fake_runner(0, 1)
    with pytest.raises(ValueError) as refused:  # knn_imagenet keeps 1% by default: 1 of 96 images for k = 10
        ScoringPasses().fitted_detector(trainer, model, DETECTORS["knn_imagenet"], {}, fit_set(96, 3), batch_size=8)
    message = str(refused.value)
    assert "knn_imagenet's default fit cap {'fraction': 0.01} keeps 1 of the 96 images of the fit set 'fit'" in message
    assert "--fit-arg knn_imagenet.fraction=F" in message and "--fit-arg knn_imagenet.per_class=N" in message
    with pytest.raises(ValueError, match=r"the cap given \{'per_class': 2\} keeps 6 of the 96 images"):
        ScoringPasses().fitted_detector(trainer, model, DETECTORS["knn_imagenet"], {}, fit_set(96, 3), fit={"per_class": 2},
                               batch_size=8)


KNOWN, UNKNOWN = ["n01440764", "n01443537"], ["n01484850", "n01491361", "n01494475"]


class Quadrants(torch.nn.Module):
    """Features: the mean colour of each image quadrant (12 numbers); logits: a fixed linear head of them."""

    def __init__(self, classes: int = 2) -> None:
        super().__init__()
        self.head = torch.nn.Linear(12, classes)
        torch.nn.init.normal_(self.head.weight, generator=torch.Generator().manual_seed(0))

    def features(self, images):
        return torch.nn.functional.adaptive_avg_pool2d(images, 2).flatten(1)

    def forward(self, images):
        return self.head(self.features(images))


def severity_command(root, out, fit_data, **options):
    """`evaluate.py severity` from Python: a tiny model of the 2 known classes, KNN (k = 1) fitted on
    ``fit_data``, the severity data of class folders (ID test: the known classes' val/ images)."""
    from datamodules.severity import FolderSeverityData
    from datamodules.transforms import ModelInput, TensorPipeline
    from evaluation_engine import TrainerOptions
    from evaluation_methods import SeverityEvaluation
    from lightning_modules.scoring import ScoringModel

    scoring = ScoringModel(Quadrants(), model_input=ModelInput(TensorPipeline(12, 3)), name="tiny", classes=KNOWN)
    data = FolderSeverityData(str(root), KNOWN, UNKNOWN, estimation=2, batch_size=16, num_workers=0)
    evaluation = SeverityEvaluation(
        model=scoring, data=data, num_levels=2, intervals={"resamples": 20}, kappa=["softmax", "knn"],
        kappa_args={"knn": {"k": 1}}, fit_data=str(fit_data), output_dir=str(out), cache_dir=None, plots=False,
        trainer=TrainerOptions(accelerator="cpu", devices=1, wandb_mode="disabled", progress_bar=False), **options)
    return scoring, evaluation


def test_a_pair_that_cannot_be_compared_in_full_is_warned_once_naming_both_sets(tmp_path):
    import warnings

    from tests.conftest import make_imagenet_folder

    tree = make_imagenet_folder(tmp_path / "ILSVRC2012", KNOWN, train=2, val=1)
    fit = fit_folder_set(str(tree / "train"), KNOWN)
    odd = EvaluationSet("near_ood:odd", "near_ood", TensorImageDataset(torch.rand(3, 4, 8, 8), torch.full((3,), -2)))
    passes = ScoringPasses()
    with pytest.warns(RuntimeWarning) as caught:
        passes.check_fit_overlap(fit, [odd])
    (warned,) = [str(w.message) for w in caught if "not compared" in str(w.message)]
    assert warned.startswith(f"fit set 'fit' ({tree / 'train'}) and near_ood:odd (role near_ood, in memory "
                             "(TensorImageDataset)) not compared: 3 tensor images of near_ood:odd (shape (4, 8, 8)) "
                             "against the files of fit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        passes.check_fit_overlap(fit, [odd])  # the same pair again in the run: no second warning


def test_a_sets_identities_are_kept_in_the_cache_and_a_second_run_reads_no_file(tmp_path, monkeypatch):
    import os
    import shutil

    from datamodules.overlap import FitOverlapError, SetImages
    from tests.conftest import make_imagenet_folder

    tree = make_imagenet_folder(tmp_path / "ILSVRC2012", KNOWN, train=2, val=2)
    shutil.copytree(tree / "val", tmp_path / "copy")
    test = fit_folder_set(str(tree / "val"), KNOWN, name="id_test")
    test = EvaluationSet("id_test", "id_test", test.dataset, info=test.info)
    reads, stats = [], []
    read, stat = SetImages._read, SetImages.stat

    def counted_read(self, row, head):
        reads.append((self.name, row, head))
        return read(self, row, head)

    def counted_stat(self):
        stats.append(self.name) if self._stat is None else None
        return stat(self)

    monkeypatch.setattr(SetImages, "_read", counted_read)
    monkeypatch.setattr(SetImages, "stat", counted_stat)

    def check(cache):
        reads.clear(), stats.clear()
        with pytest.raises(FitOverlapError) as refused:
            ScoringPasses(cache).check_fit_overlap(fit_folder_set(str(tmp_path / "copy"), KNOWN), [test])
        return str(refused.value)

    first = check(tmp_path / "cache")
    assert "4 of its 4 images are images of id_test" in first and "same bytes: 4" in first
    # 4 heads a set (the tiny JPEGs are shorter than a head: their head is the whole file)
    assert sorted(reads) == [(name, row, True) for name in ("fit", "id_test") for row in range(4)]
    assert sorted(stats) == ["fit", "id_test"]
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "cache").glob("identities-*.npz")) == ["fit", "id_test"]
    assert check(tmp_path / "cache") == first and reads == [] and stats == []  # the second run: from the cache
    # a changed file changes the set's fingerprint: that set's identities are computed again
    changed = tmp_path / "copy" / test.dataset.rows[0][0]
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    assert check(tmp_path / "cache") == first and stats == ["fit"] and {r[0] for r in reads} == {"fit"}
    # a damaged file is rejected with a warning and recomputed
    for path in (tmp_path / "cache").glob("identities-id_test-*.npz"):
        path.write_bytes(b"not an npz")
    with pytest.warns(RuntimeWarning, match="rejecting the saved identities .* of id_test"):
        assert check(tmp_path / "cache") == first
    assert stats == ["id_test"]


def export_demo_test_images(folder, per_class, *, train=0):
    """``per_class`` of the demo's own ID test images (in-memory uint8 tensors) of each known class as grey PNG files
    under ``folder/<class folder>/`` (``T-shirt_top/``, ...), and ``train`` Fashion-MNIST training images of the
    class after them; the ID test positions exported, in the fit set's order (the model's classes)."""
    from PIL import Image

    from datamodules.evaluation import class_folder
    from datamodules.severity import FashionSeverityData
    from datamodules.sources import DEBIAN_FASHION_MNIST_DIR, DEMO_KNOWN, load_fashion_mnist

    data = FashionSeverityData(estimation=20, test=10)
    images, labels = data["id_test"].dataset.images, data["id_test"].dataset.labels
    training, training_classes = load_fashion_mnist(DEBIAN_FASHION_MNIST_DIR, "train")
    exported = []
    for label, name in enumerate(data.classes):
        (folder / class_folder(name)).mkdir(parents=True)
        for k, position in enumerate(torch.nonzero(labels == label).flatten()[:per_class].tolist()):
            Image.fromarray(images[position, 0].numpy()).save(folder / class_folder(name) / f"test-{k}.png")
            exported.append(position)
        for k, position in enumerate(np.flatnonzero(training_classes == DEMO_KNOWN[label])[:train].tolist()):
            Image.fromarray(training[position]).save(folder / class_folder(name) / f"train-{k}.png")
    return exported


def test_the_demo_refuses_png_exports_of_its_in_memory_test_images_as_fit_data(demo_checkpoint, tmp_path):
    """The demo's ID test set is in memory and --fit-data a folder of files: PNG exports of its images are found by
    their pixels, before any pass."""
    import evaluate
    from datamodules.overlap import FitOverlapError

    exported = export_demo_test_images(tmp_path / "fit", 3)
    _, severity = evaluate.parse(["severity", "--model", str(demo_checkpoint), "--data", "fashion", "--data-arg",
                                  "estimation=20", "--data-arg", "test=10", "--kappa", "knn", "--fit-data",
                                  str(tmp_path / "fit"), "--output-dir", str(tmp_path / "out"), "--cache-dir",
                                  str(tmp_path / "cache"), "--accelerator", "cpu", "--devices", "1",
                                  "--no-progress-bar", "--wandb-mode", "disabled"])
    with pytest.raises(FitOverlapError) as refused:
        severity.run()
    message = str(refused.value)
    assert (f"the fit set 'fit' ({tmp_path / 'fit'}, 12 images) holds images the run evaluates on" in message)
    assert ("12 of its 12 images are images of id_test (role id_test, in memory (TensorImageDataset): 12 of its 4000 "
            "images; same pixels: 12)") in message
    assert f"{tmp_path / 'fit' / 'T-shirt_top' / 'test-0.png'} = id_test[{exported[0]}] (same pixels)" in message
    assert not list((tmp_path / "cache").glob("*.pt"))  # no pass ran


@pytest.fixture()
def severity_tree(tmp_path):
    from tests.conftest import make_imagenet_folder

    return make_imagenet_folder(tmp_path / "ILSVRC2012", KNOWN + UNKNOWN, train=3, val=2)


def test_allow_fit_overlap_is_an_option_of_every_command_that_fits_detectors():
    import evaluate

    for command in ("severity", "generated", "evg", "report"):
        sections = ["--severity", "{}"] if command == "report" else []
        assert evaluate.parse([command, "--model", "m.ckpt", "--allow-fit-overlap", *sections])[1].allow_fit_overlap
        assert not evaluate.parse([command, "--model", "m.ckpt", *sections])[1].allow_fit_overlap


def test_severity_refuses_a_copy_or_links_of_its_id_test_images_as_fit_data_before_any_pass(severity_tree, tmp_path):
    """The issue's two cases through the command: --fit-data a copy of the ID test folders, and a folder of
    symlinks to them. KNN with k = 1 would find every ID test image as its own neighbour."""
    import os
    import shutil

    from datamodules.overlap import FitOverlapError

    shutil.copytree(severity_tree / "val" / KNOWN[0], tmp_path / "copy" / KNOWN[0])
    shutil.copytree(severity_tree / "val" / KNOWN[1], tmp_path / "copy" / KNOWN[1])
    (tmp_path / "links").mkdir()
    for wnid in KNOWN:
        os.symlink(severity_tree / "val" / wnid, tmp_path / "links" / wnid)
    first = sorted(os.listdir(severity_tree / "val" / KNOWN[0]))[0]
    for folder, how in (("copy", "same bytes"), ("links", "same file")):
        scoring, evaluation = severity_command(severity_tree, tmp_path / f"out-{folder}", tmp_path / folder)
        with pytest.raises(FitOverlapError) as refused:
            evaluation.run()
        message = str(refused.value)
        assert f"the fit set 'fit' ({tmp_path / folder}, 4 images)" in message
        assert (f"4 of its 4 images are images of id_test (role id_test, {severity_tree}: 4 of its 4 images; "
                f"{how}: 4)") in message
        assert f"{tmp_path / folder / KNOWN[0] / first} = {severity_tree / 'val' / KNOWN[0] / first} ({how})" in message
        assert "ood_estimation" not in message and "ood_test" not in message  # the pool's images are other files
        assert "--allow-fit-overlap" in message and scoring.forward_calls == 0  # before any pass, the width probe too
        assert not list((tmp_path / f"out-{folder}").glob("*.csv"))


def test_severity_with_an_allowed_overlap_says_so_in_every_table_and_a_training_split_runs_without_note(
        severity_tree, tmp_path):
    import csv
    import shutil

    shutil.copytree(severity_tree / "val" / KNOWN[0], tmp_path / "fit" / KNOWN[0])  # 2 of the 4 ID test images
    shutil.copytree(severity_tree / "train" / KNOWN[1], tmp_path / "fit" / KNOWN[1])  # and 3 training images
    _, evaluation = severity_command(severity_tree, tmp_path / "out", tmp_path / "fit", allow_fit_overlap=True)
    with pytest.warns(RuntimeWarning, match="fit set 'fit' overlaps id_test: 2 of its 5 images are id_test images"):
        result = evaluation.run()
    note = "fit set 'fit' overlaps id_test: 2 of its 5 images are id_test images (allowed by --allow-fit-overlap)"
    assert {row["fit overlap"] for row in result["knn"]} == {note} and all("fit overlap" not in r for r in result["softmax"])
    for name in ("severity.csv", "tiny_knn_n2.csv", "levels_tiny_knn.csv", "summary.csv"):
        with open(tmp_path / "out" / name) as handle:
            rows = list(csv.DictReader(handle))
        assert {r["fit overlap"] for r in rows if r.get("confidence function", "knn") == "knn"} == {note}, name
    assert f"Warning: {note}" in (tmp_path / "out" / "summary.md").read_text()
    (entry,) = torch.load(tmp_path / "out" / "fitted_detectors.pt", weights_only=False).values()
    assert [(o["set"], o["images"], o["of"]) for o in entry["overlaps"]] == [("id_test", 2, 5)]
    # the training split of the known classes: the same run, no note, no column
    for wnid in KNOWN:
        shutil.copytree(severity_tree / "train" / wnid, tmp_path / "train" / wnid)
    _, evaluation = severity_command(severity_tree, tmp_path / "train-out", tmp_path / "train")
    clean = evaluation.run()
    assert all("fit overlap" not in row for rows in clean.values() for row in rows)
    with open(tmp_path / "train-out" / "severity.csv") as handle:
        assert "fit overlap" not in handle.readline()


def tensor_set(name, role, images, labels):
    return EvaluationSet(name, role, TensorImageDataset(images, labels))


def test_evg_refuses_a_fit_set_holding_its_seed_images_and_states_an_allowed_one_in_its_tables(tmp_path):
    import csv

    from callbacks.evg import EvGReport
    from datamodules.evg import EvGData
    from datamodules.overlap import FitOverlapError
    from datamodules.transforms import ModelInput, TensorPipeline
    from evaluation_engine.runner import Runner
    from lightning_modules.evg import BlackBox, EvGSearch, build_variation
    from lightning_modules.scoring import ScoringModel

    generator = torch.Generator().manual_seed(0)
    ood = torch.rand(6, 3, 8, 8, generator=generator)
    data = EvGData(id_val=TensorImageDataset(torch.rand(6, 3, 8, 8, generator=generator), torch.arange(6) % 2),
                   id_test=TensorImageDataset(torch.rand(6, 3, 8, 8, generator=generator), torch.arange(6) % 2),
                   ood=TensorImageDataset(ood, torch.full((6,), -2)), classes=KNOWN, batch_size=4)
    train = torch.cat([torch.rand(8, 3, 8, 8, generator=generator), ood[[1, 4]]])  # two OOD (seed) images
    fit = tensor_set("fit", "fit", train, torch.arange(10) % 2)

    def run(out, **options):
        model = ScoringModel(Quadrants(), model_input=ModelInput(TensorPipeline(8, 3)), name="tiny", classes=KNOWN)
        knn, softmax = KAPPAS["knn"].detector, KAPPAS["softmax"].detector
        pairs = [(model, knn, knn.arguments(k=1)), (model, softmax, softmax.arguments())]
        indices = data.seed_indices(4, 0)
        seeds = data.seed_images(indices, None)

        def search(fitted):
            detectors = [BlackBox(model, kappa, kappa_args=parameters, fitted=fitted.get((id(model), kappa.name)))
                         for model, kappa, parameters in pairs]
            return EvGSearch({d.name: d for d in detectors},
                             {"colour": build_variation("colour", None, seed_shape=tuple(seeds.shape[1:]))},
                             {"mh": {}}, seeds, steps=3, seed=0)

        report = EvGReport(data, chains=4, output_dir=out, plots=False, seed_indices=indices, fit_set=fit, **options)
        report.evaluate(Runner.local(), pairs, search, chains_per_batch=4)
        return report, model

    with pytest.raises(FitOverlapError, match=r"2 of its 10 images are images of ood \(role ood, in memory"):
        run(tmp_path / "refused")
    note = "fit set 'fit' overlaps ood: 2 of its 10 images are ood images (allowed by --allow-fit-overlap)"
    with pytest.warns(RuntimeWarning, match="overlaps ood"):
        report, _ = run(tmp_path / "allowed", allow_fit_overlap=True)
    with open(tmp_path / "allowed" / "results.csv") as handle:
        rows = {row["detector"]: row["fit overlap"] for row in csv.DictReader(handle)}
    assert rows == {"tiny/knn": note, "tiny/softmax": ""}
    assert f"Warning: {note}" in (tmp_path / "allowed" / "results.md").read_text()
    assert f"Warning: {note}" in (tmp_path / "allowed" / "transfer_colour_mh.md").read_text()


def test_generated_refuses_a_fit_set_holding_images_of_a_generated_set(tmp_path):
    from callbacks.generated import GeneratedBenchmark
    from datamodules.generated import GeneratedBenchmarkData
    from datamodules.overlap import FitOverlapError
    from datamodules.transforms import ModelInput, TensorPipeline
    from lightning_modules.scoring import ScoringModel
    from tests.datamodules.test_generated import uint8_images, write_set

    near = uint8_images(5, channels=3, size=8, seed=1)
    data = GeneratedBenchmarkData(TensorImageDataset(uint8_images(4, channels=3, size=8), torch.tensor([0, 1, 0, 1])),
                                  near_ood=[write_set(tmp_path / "near", near, kind="near_ood")], classes=KNOWN)
    # the fit images: 6 others and 3 of the generated near-OOD images, stored as float (the same pixels)
    fit = tensor_set("fit", "fit", torch.cat([uint8_images(6, channels=3, size=8, seed=2).float() / 255,
                                              near[[0, 2, 4]].float() / 255]), torch.arange(9) % 2)
    model = ScoringModel(Quadrants(), model_input=ModelInput(TensorPipeline(8, 3)), name="tiny", classes=KNOWN)
    benchmark = GeneratedBenchmark(data, ["knn"], models=[model], fit_set=fit, output_dir=tmp_path / "out")
    with pytest.raises(FitOverlapError, match=r"3 of its 9 images are images of near_ood:near \(role near_ood"):
        benchmark.setup(None, model, "test")
    assert benchmark.passes.passes == 0
    GeneratedBenchmark(data, ["softmax"], models=[model], fit_set=fit).setup(None, model, "test")  # nothing fitted
    allowed = GeneratedBenchmark(data, ["knn"], models=[model], fit_set=fit, allow_fit_overlap=True)
    with pytest.warns(RuntimeWarning, match="3 of its 9 images are near_ood:near images"):
        allowed.setup(None, model, "test")
