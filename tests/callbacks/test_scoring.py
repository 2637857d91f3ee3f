"""Sharded passes and the prediction cache: exact on any number of processes, one decision for all ranks."""

import contextlib
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from callbacks.scoring import PredictionCache, shard_indices, sharded_outputs
from datamodules.images import TensorImageDataset
from tests.distributed import run_distributed


def fake_trainer(rank: int, world_size: int):
    """The parts of a Trainer that the sharded pass and the cache use (rank, world, precision, broadcast)."""

    def broadcast(obj, src=0):
        if world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    return SimpleNamespace(global_rank=rank, world_size=world_size, is_global_zero=rank == 0,
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
