"""Sharded passes and the prediction cache: exact on any number of processes, one decision for all ranks."""

import contextlib
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from datamodules.images import TensorImageDataset
from evaluation_engine.scoring import PredictionCache, shard_indices, sharded_outputs
from tests.distributed import run_distributed


def fake_trainer(rank: int, world_size: int):
    """The parts of a Trainer that the sharded pass and the cache use (rank, world, precision, broadcast)."""

    def broadcast(obj, src=0):
        if world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    return SimpleNamespace(global_rank=rank, world_size=world_size, is_global_zero=rank == 0, precision="32-true",
                           precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext),
                           strategy=SimpleNamespace(broadcast=broadcast))


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
    return sharded_outputs(fake_trainer(rank, world_size), dataset(n), step, keys=["logits", "scores"],
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
        sharded_outputs(fake_trainer(0, 1), holey, step, keys=["logits"], batch_size=2)


def _decide(rank: int, world_size: int, directories: list[str], key: str):
    # every rank looks in its own folder: only rank 0's holds the file (e.g. node-local disks)
    cache = PredictionCache(directories[rank])
    return cache.load_on_rank_zero(fake_trainer(rank, world_size), "model-id", key, rows=3)


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_rank_zero_decides_for_every_rank(tmp_path):
    tensors = {"logits": torch.arange(6.0).reshape(3, 2), "targets": torch.tensor([0, 1, 2])}
    PredictionCache(tmp_path / "zero").save("model-id", "k" * 64, tensors, {"split": "id"})
    results = run_distributed(_decide, [str(tmp_path / "zero"), str(tmp_path / "one")], "k" * 64)
    for result in results:  # a hit on every rank, with rank 0's tensors
        assert result is not None and torch.equal(result["logits"], tensors["logits"])
    misses = run_distributed(_decide, [str(tmp_path / "one"), str(tmp_path / "zero")], "k" * 64)
    assert misses == [None, None]  # rank 0 misses: every rank recomputes, even the one that has the file


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

    model, data, trainer = scoring_model(), evaluation_set(), fake_trainer(0, 1)
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
    model, trainer = scoring_model(size=2), fake_trainer(0, 1)
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
        ScoringPasses().outputs(fake_trainer(0, 1), free, EvaluationSet("mixed", "ood", mixed), batch_size=4)


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

    model, data, trainer = scoring_model(), evaluation_set(7, "ood:digits"), fake_trainer(0, 1)
    energy = resolve_detector("pood:EnergyBased")
    with pytest.raises(ValueError, match=r"^confidence function 'pood:EnergyBased' \(t=0\) gave NaN or infinite scores "
                                         r"for 7 of 7 images of ood:digits \(first rows: \[0, 1, 2, 3, 4\]\)"):
        ScoringPasses().scores(trainer, model, data, energy, energy.arguments(t=0), batch_size=3)
    passes = ScoringPasses()
    scores = passes.scores(trainer, model, data, energy, energy.arguments(t=1), batch_size=3)
    logits = passes.outputs(trainer, model, data, batch_size=3)["logits"]
    torch.testing.assert_close(scores, torch.logsumexp(logits.double(), dim=1))  # t = 1: -energy, finite
