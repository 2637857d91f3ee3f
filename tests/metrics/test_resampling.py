"""metrics.resampling: the rows are multinomial counts that depend only on (seed, stratum, n, b), not on the
chunking, the batching or B; cluster weights give each sample its unit's count, keyed by identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import metrics.resampling as resampling
from metrics import (
    cluster_weights,
    resample_weights,
)

# -- weights ----------------------------------------------------------------------------------------------


def test_resample_weights_are_deterministic_multinomial_rows():
    weights = resample_weights(50, 30, 7)
    assert weights.dtype == torch.int32 and weights.shape == (30, 50)
    assert (weights.sum(dim=1) == 50).all() and (weights >= 0).all()
    assert torch.equal(weights, resample_weights(50, 30, 7))
    assert torch.equal(weights[:10], resample_weights(50, 10, 7))  # rows do not depend on B
    assert not torch.equal(weights, resample_weights(50, 30, 7, stratum=1))
    assert not torch.equal(weights, resample_weights(50, 30, 8))
    assert len({tuple(row) for row in weights.tolist()}) == 30  # distinct resamples


def test_resample_weights_rows_follow_the_block_generators():

    # row b is the (b % BLOCK_ROWS)-th run of n draws of the generator seeded (seed, stratum, b // BLOCK_ROWS)
    n, block = 37, resampling.BLOCK_ROWS
    weights = resample_weights(n, 2 * block + 5, 3, stratum=2)
    for b in (0, 1, block - 1, block, 2 * block + 4):
        generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence((3, 2, b // block))))
        draws = [generator.integers(0, n, n) for _ in range(b % block + 1)][-1]
        assert weights[b].tolist() == np.bincount(draws, minlength=n).tolist()


@pytest.mark.parametrize("n", [5, 700, 3000])
def test_rows_do_not_depend_on_b_the_chunk_size_or_the_batching(monkeypatch, n):

    whole = resample_weights(n, 40, 1, stratum=1)  # 40 rows: three blocks of 16, the last one cut
    for rows in (1, 7, 16, 17, 33):
        assert torch.equal(resample_weights(n, rows, 1, stratum=1), whole[:rows])
    stream = resampling._RowStream(n, 1, 1)  # rows asked for in uneven chunks, across block boundaries
    chunks = [stream.counts(size) for size in (3, 14, 1, 20, 2)]
    assert torch.equal(torch.from_numpy(np.concatenate(chunks)), whole)
    assert torch.equal(torch.from_numpy(resampling._RowStream(n, 1, 1, start=21).counts(19)), whole[21:])
    monkeypatch.setattr(resampling, "BATCH_DRAWS", 1)  # every row drawn and counted alone
    assert torch.equal(resample_weights(n, 40, 1, stratum=1), whole)
    monkeypatch.setattr(resampling, "BATCH_DRAWS", 1 << 30)  # whole blocks in one call
    assert torch.equal(resample_weights(n, 40, 1, stratum=1), whole)
    uint8 = resampling._RowStream(n, 1, 1).counts(40, np.empty((40, n), dtype=np.uint8))
    assert uint8.dtype == np.uint8 and np.array_equal(uint8, whole.numpy())


def test_uint8_counts_fall_back_to_int32_when_a_count_exceeds_255(monkeypatch):

    class Constant:  # every draw picks unit 0 (a count of n = 300 wraps in uint8)
        def integers(self, low, high, size, dtype):
            return np.zeros(size, dtype=dtype)

    monkeypatch.setattr(resampling, "_block_generator", lambda seed, stratum, block: Constant())
    counts = resampling._RowStream(300, 0, 0).counts(3, np.empty((3, 300), dtype=np.uint8))
    assert counts.dtype == np.int32 and (counts[:, 0] == 300).all() and (counts[:, 1:] == 0).all()


def test_cluster_weights_give_every_sample_its_clusters_count():
    clusters = torch.tensor([5, 3, 5, 9, 3, 3])
    weights = cluster_weights(clusters, 20, 1, stratum=2)
    counts = resample_weights(3, 20, 1, stratum=2)  # the distinct ids 3, 5, 9 are the units
    assert torch.equal(weights, counts[:, [1, 0, 1, 2, 0, 0]])
    assert (counts.sum(dim=1) == 3).all()


def test_keyed_cluster_weights_give_a_unit_one_weight_in_every_call():
    # the case: class 5 in levels {3, 5, 7} and {5, 7, 9} of a pool of 12 classes
    first = cluster_weights(torch.tensor([3, 5, 7]), 50, 0, stratum=1, num_units=12)
    second = cluster_weights(torch.tensor([5, 7, 9]), 50, 0, stratum=1, num_units=12)
    assert torch.equal(first[:, 1], second[:, 0]) and torch.equal(first[:, 2], second[:, 1])
    assert torch.equal(first, resample_weights(12, 50, 0, stratum=1)[:, [3, 5, 7]])  # the pool's draw, read at ids
    # relative ids (no universe) pair only by position: class 5 gets other weights, the bug keyed weights fix
    relative = (cluster_weights(torch.tensor([3, 5, 7]), 50, 0, stratum=1)[:, 1],
                cluster_weights(torch.tensor([5, 7, 9]), 50, 0, stratum=1)[:, 0])
    assert not torch.equal(*relative)
    with pytest.raises(ValueError, match=r"\[0, 12\)"):
        cluster_weights(torch.tensor([3, 12]), 5, 0, num_units=12)
    with pytest.raises(ValueError, match="integer"):
        cluster_weights(torch.tensor([0.0, 1.0]), 5, 0, num_units=12)


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: resample_weights(0, 3, 0), "n must"),
    (lambda: resample_weights(3, 0, 0), "resamples"),
    (lambda: resample_weights(3, 2, -1), "seed"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
