"""IndexedPredictions: exact accumulation over batches and processes, ranks without data included."""

import pytest
import torch

from metrics import IndexedPredictions, deduplicate_by_index
from tests.distributed import run_distributed


def test_deduplicate_keeps_first_occurrence_in_index_order():
    index = torch.tensor([3, 1, 3, 0, 1])
    values = torch.tensor([30.0, 10.0, 31.0, 0.0, 11.0])
    (kept,) = deduplicate_by_index(index, values)
    assert kept.tolist() == [0.0, 10.0, 30.0]


def test_padding_duplicates_dropped_and_order_restored():
    metric = IndexedPredictions()
    metric.update(torch.tensor([[2.0, 0.0], [4.0, 1.0]]), torch.tensor([2, 4]), torch.tensor([2, 4]))
    metric.update(torch.tensor([[0.0, 5.0], [2.0, 0.0]]), torch.tensor([0, 2]), torch.tensor([0, 2]))  # 2 again
    values, target = metric.compute()
    assert target.tolist() == [0, 2, 4]
    assert values.tolist() == [[0.0, 5.0], [2.0, 0.0], [4.0, 1.0]]


def test_mixed_index_and_no_index_is_refused():
    metric = IndexedPredictions()
    metric.update(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.tensor([0, 1]))
    metric.update(torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="some batches were updated with dataset indices"):
        metric.compute()


def test_bad_updates():
    metric = IndexedPredictions()
    with pytest.raises(ValueError, match="non-negative"):
        metric.update(torch.zeros(1), torch.zeros(1, dtype=torch.long), torch.tensor([-4]))
    with pytest.raises(ValueError, match="3 rows but target has 2"):
        metric.update(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="before any update"):
        IndexedPredictions().compute()


VALUES = torch.arange(5 * 3, dtype=torch.float64).reshape(5, 3) / 7
TARGETS = torch.tensor([0, -1, 2, -2, 1])


def _gather(rank: int, world_size: int, shards: dict[int, list[int]]):
    metric = IndexedPredictions()
    for index in shards.get(rank, []):
        metric.update(VALUES[[index]], TARGETS[[index]], torch.tensor([index]))
    try:
        return metric.gather()
    except ValueError as error:
        return str(error)


SHARDINGS = [
    {0: [0, 2, 4], 1: [1, 3]},  # uneven shards
    {0: [0, 1, 2, 3, 4]},  # rank 1 has no sample at all (N-way data on fewer ranks)
    {1: [4, 3, 2, 1, 0, 2]},  # rank 0 has none; rank 1 holds a duplicate
    {1: [3]},  # one sample: gather keeps its sample dimension (compute() would squeeze it)
    {},  # no rank has data: every rank fails with the reason, none hangs
]


def _gather_each(rank: int, world_size: int, shardings: list[dict[int, list[int]]]):
    """Every sharding in turn, in one pair of processes (starting processes is most of the cost)."""
    return [_gather(rank, world_size, shards) for shards in shardings]


@pytest.fixture(scope="module")
def gathered() -> list[list]:
    """Per rank, the result of each sharding of SHARDINGS."""
    return run_distributed(_gather_each, SHARDINGS)


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
@pytest.mark.parametrize("case", range(len(SHARDINGS) - 1))
def test_two_processes_with_uneven_and_empty_ranks_equal_one_process(case, gathered):
    shards = SHARDINGS[case]
    expected = sorted({i for indices in shards.values() for i in indices})
    for per_rank in gathered:
        values, target = per_rank[case]
        assert values.dtype == torch.float64 and target.dtype == torch.long
        assert torch.equal(values, VALUES[expected]) and torch.equal(target, TARGETS[expected])


@pytest.mark.ddp  # a session-wide gloo pool of 2 processes (tests/distributed.py)
def test_no_rank_with_data_fails_on_every_rank_without_hanging(gathered):
    assert all("before any update" in per_rank[-1] for per_rank in gathered)
