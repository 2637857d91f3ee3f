"""metrics.auroc against sklearn, hand-computed values, and its weighted rows and bootstrap against sklearn on
the expanded resamples."""

import importlib

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import metrics.resampling as resampling
from metrics import (
    OODAUROC,
    auroc,
    bootstrap_auroc,
    resample_weights,
    weighted_auroc,
)
from tests.metrics.reference import expanded, sklearn_auroc

auroc_module = importlib.import_module("metrics.auroc")  # `metrics.auroc` is the function


@pytest.mark.parametrize("seed", range(5))
def test_against_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    id_scores = np.round(rng.normal(0.5, 1, size=200), 1)
    ood_scores = np.round(rng.normal(0, 1, size=150), 1)
    expected = roc_auc_score(np.r_[np.ones(200), np.zeros(150)], np.r_[id_scores, ood_scores])
    assert auroc(torch.from_numpy(id_scores), torch.from_numpy(ood_scores)) == pytest.approx(expected, abs=1e-15)


def test_hand_computed():
    # pairs (id, ood): 1>0, 1<2, 2>0, 2=2 (1/2), 3>0, 3>2 -> 4.5 / 6
    assert auroc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 2.0])) == 0.75
    assert auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5


def test_large_scores_are_not_saturated():
    # logits-like scores far outside [0, 1]: a sigmoid would make 60 and 70 equal in float64
    assert auroc(torch.tensor([70.0, 80.0]), torch.tensor([60.0, 65.0])) == 1.0


def test_stateful_matches_function():
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4])
    is_id = torch.tensor([0, 1, 0, 1, 0])
    metric = OODAUROC()
    metric.update(scores[:2], is_id[:2], torch.tensor([0, 1]))
    metric.update(scores[1:], is_id[1:], torch.tensor([1, 2, 3, 4]))  # index 1 repeated (padding)
    assert metric.compute().item() == auroc(scores[is_id == 1], scores[is_id == 0])


def test_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        auroc(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="both ID and OOD"):
        auroc(torch.tensor([1.0]), torch.tensor([]))


# -- weighted, and the bootstrap -------------------------------------------------------------------------


def test_bootstrap_auroc_does_not_depend_on_threads_or_chunks(monkeypatch):

    rng = np.random.default_rng(13)
    id_scores = torch.tensor(np.round(rng.normal(0.5, 1, 900), 1))
    ood_scores = torch.tensor(np.round(rng.normal(0, 1, 700), 1))
    single = bootstrap_auroc(id_scores, ood_scores, 70, 4)
    w_id, w_ood = resample_weights(900, 70, 4), resample_weights(700, 70, 4, stratum=1)
    assert torch.equal(weighted_auroc(id_scores, ood_scores, w_id, w_ood), single)
    monkeypatch.setattr(auroc_module, "PARALLEL_SIZE", 0)  # blocks spread over threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 70, 4), single)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(resampling, "BATCH_DRAWS", 1)  # one row at a time
    assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 70, 4), single)
    assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 20, 4), single[:20])
    # the batched torch path (real weights, accelerators) gives the same values as the numpy rows
    plan = auroc_module._AUROCPlan(id_scores, ood_scores)
    assert torch.equal(plan.twice_u(w_id, w_ood), torch.from_numpy(plan.twice_u_counts(w_id.numpy(), w_ood.numpy())))


# -- AUROC replicates ---------------------------------------------------------------------------------------


def test_weighted_auroc_equals_sklearn_on_expanded_resamples():
    rng = np.random.default_rng(4)
    id_scores, ood_scores = rng.integers(0, 20, 120).astype(float), rng.integers(0, 15, 90).astype(float)
    w_id, w_ood = resample_weights(120, 40, 0), resample_weights(90, 40, 0, stratum=1)
    ours = weighted_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), w_id, w_ood)
    reference = [sklearn_auroc(expanded(id_scores, w_id[b]), expanded(ood_scores, w_ood[b])) for b in range(40)]
    np.testing.assert_allclose(ours.numpy(), reference, rtol=0, atol=1e-12)
    # bootstrap_auroc draws exactly these resamples (ID stratum 0, OOD stratum 1)
    assert torch.equal(bootstrap_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), 40, 0), ours)
    # real-valued weights: the weighted Mann-Whitney statistic, as sklearn's sample_weight
    real_id, real_ood = torch.rand(3, 120, dtype=torch.float64), torch.rand(3, 90, dtype=torch.float64)
    real = weighted_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), real_id, real_ood)
    labels = np.r_[np.ones(120), np.zeros(90)]
    for b in range(3):
        expected = roc_auc_score(labels, np.r_[id_scores, ood_scores], sample_weight=np.r_[real_id[b], real_ood[b]])
        assert float(real[b]) == pytest.approx(expected, abs=1e-12)


def test_weighted_auroc_chunks_and_float32_ties(monkeypatch):

    rng = np.random.default_rng(5)
    id_scores = torch.tensor(np.round(rng.normal(0.5, 1, 300), 2), dtype=torch.float32)
    ood_scores = torch.tensor(np.round(rng.normal(0, 1, 200), 2), dtype=torch.float32)
    w_id, w_ood = resample_weights(300, 25, 2), resample_weights(200, 25, 2, stratum=1)
    whole = weighted_auroc(id_scores, ood_scores, w_id, w_ood)
    monkeypatch.setattr(resampling, "CHUNK_ELEMENTS", 1000)  # two rows per chunk
    assert torch.equal(weighted_auroc(id_scores, ood_scores, w_id, w_ood), whole)
    reference = [sklearn_auroc(expanded(id_scores.numpy(), w_id[b]), expanded(ood_scores.numpy(), w_ood[b]))
                 for b in range(25)]
    np.testing.assert_allclose(whole.numpy(), reference, rtol=0, atol=1e-12)


def test_bootstrap_auroc_with_clusters_equals_loop_over_resampled_clusters():
    rng = np.random.default_rng(6)
    classes = rng.integers(0, 6, 150)
    ood_scores = rng.integers(0, 10, 150).astype(float) + classes * 0.5
    id_scores = rng.integers(3, 14, 100).astype(float)
    ours = bootstrap_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), 30, 9, ood_clusters=torch.tensor(classes))
    id_weights = resample_weights(100, 30, 9)
    distinct = np.unique(classes)
    for b in range(30):
        # draw the classes of this resample from the same generator, and stack copies of their images
        chosen = distinct[np.repeat(np.arange(len(distinct)), resample_weights(len(distinct), 30, 9, stratum=1)[b])]
        ood = np.concatenate([ood_scores[classes == c] for c in chosen])
        assert float(ours[b]) == pytest.approx(sklearn_auroc(expanded(id_scores, id_weights[b]), ood), abs=1e-12)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: weighted_auroc(torch.ones(3), torch.zeros(2), torch.ones(2, 4), torch.ones(2, 2)), r"\(B, 3\)"),
    (lambda: weighted_auroc(torch.ones(3), torch.zeros(2), -torch.ones(2, 3), torch.ones(2, 2)), "negative"),
])
def test_weighted_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
