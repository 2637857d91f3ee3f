"""open_set_report against independent references: every scalar, both CCR conventions, width checks; its
bootstrap against open_set_report on the expanded resamples."""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import metrics.open_set as open_set
import metrics.resampling as resampling
from metrics import (
    bootstrap_open_set,
    ccr_at_fpr,
    closed_set_accuracy,
    fpr_key,
    gamma,
    max_known_score,
    open_set_report,
    oscr_curve,
    resample_weights,
)
from tests.metrics.reference import (
    authors_ccr_at_fpr_reference,
    ccr_at_fpr_reference,
    gamma_reference,
    random_open_set_data,
)

TARGETS = [1e-3, 1e-2, 1e-1, 1.0]


@pytest.mark.parametrize("background", [False, True])
def test_every_scalar_against_references(background):
    probs, target = random_open_set_data(np.random.default_rng(21), n=400, k=4, background=background)
    report = open_set_report(torch.from_numpy(probs), torch.from_numpy(target), background=background,
                             conventions=("exact", "authors"))
    scalars = report["scalars"]
    known_probs = probs[:, :-1] if background else probs
    known = target >= 0
    for group, label in (("negatives", -1), ("unknowns", -2)):
        exact = [scalars[f"{group}/{fpr_key(t)}"] for t in TARGETS]
        np.testing.assert_array_equal(exact, ccr_at_fpr_reference(probs, target, TARGETS, label, background))
        authors = [scalars[f"{group}/{fpr_key(t, 'authors')}"] for t in TARGETS]
        np.testing.assert_array_equal(authors, authors_ccr_at_fpr_reference(probs, target, TARGETS, label, background))
        members = known | (target == label)
        expected_auroc = roc_auc_score(known[members], known_probs[members].max(1))
        assert scalars[f"{group}/auroc"] == pytest.approx(expected_auroc, abs=1e-12)
        assert report["counts"][group] == int((target == label).sum())
    assert scalars["closed_set_accuracy"] == pytest.approx((known_probs[known].argmax(1) == target[known]).mean())
    keep = target >= -1
    assert scalars["gamma"] == pytest.approx(gamma_reference(probs[keep], target[keep], background=background)[2])
    np.testing.assert_array_equal(report["scores"]["unknowns_max"].numpy(), known_probs[target == -2].max(1))


def test_without_negatives_there_is_no_gamma_and_no_negative_group():
    probs, target = random_open_set_data(np.random.default_rng(3), n=60, k=3)
    target[target == -1] = -2
    report = open_set_report(torch.from_numpy(probs), torch.from_numpy(target))
    assert "gamma" not in report["scalars"] and "negatives" not in report["curves"]
    assert report["counts"]["negatives"] == 0 and "unknowns/auroc" in report["scalars"]


def test_fpr_key_and_bad_convention():
    assert fpr_key(1e-3) == "ccr@fpr=0.001" and fpr_key(0.1, "authors") == "authors_ccr@fpr=0.1"
    with pytest.raises(ValueError, match="convention must be one of"):
        open_set_report(torch.tensor([[1.0, 0.0]]), torch.tensor([0]), conventions=("paper",))


@pytest.mark.parametrize("background", [False, True])
def test_report_equals_the_public_functions(background):
    # the report validates once and calls the unvalidated helpers: their results are the public ones, bit
    # for bit (γ without selecting the known and negative rows first, the curves from one shared pass)
    probs, target = map(torch.from_numpy, random_open_set_data(np.random.default_rng(8), n=500, k=5,
                                                                background=background))
    report = open_set_report(probs, target, background=background, conventions=("exact", "authors"))
    for group, label in (("negatives", -1), ("unknowns", -2)):
        for a, b in zip(report["curves"][group], oscr_curve(probs, target, label, background), strict=True):
            assert torch.equal(a, b)
        authors = [report["scalars"][f"{group}/{fpr_key(t, 'authors')}"] for t in TARGETS]
        torch.testing.assert_close(torch.tensor(authors, dtype=torch.float64), ccr_at_fpr(
            probs, target, TARGETS, label, background, convention="authors"), rtol=0, atol=0, equal_nan=True)
        members = target == label
        assert torch.equal(report["scores"][f"{group}_max"], max_known_score(probs, background)[members])
    assert report["scalars"]["closed_set_accuracy"] == closed_set_accuracy(probs, target, background).item()
    keep = target >= -1
    expected = gamma(probs[keep], target[keep], background=background)
    assert [report["scalars"][k] for k in ("gamma_plus", "gamma_minus", "gamma")] == [v.item() for v in expected]


# -- weighted, and the bootstrap -------------------------------------------------------------------------


# -- open set ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_bootstrap_open_set_equals_open_set_report_on_expanded_resamples(background):
    rng = np.random.default_rng(8 + background)
    probs, target = random_open_set_data(rng, 240, 4, background=background, decimals=2)
    probs = probs / probs.sum(axis=1, keepdims=True)
    targets_fpr = (0.01, 0.05, 0.1, 0.5, 1.0)
    replicates = bootstrap_open_set(torch.tensor(probs), torch.tensor(target), fpr_targets=targets_fpr,
                                    background=background, conventions=("exact", "authors"), resamples=25, seed=4)
    strata = {0: target >= 0, 1: target == -1, 2: target == -2}
    weights = {s: resample_weights(int(mask.sum()), 25, 4, stratum=s).numpy() for s, mask in strata.items()}
    reference_keys = None
    nan_seen = 0
    for b in range(25):
        rows = np.concatenate([np.repeat(np.flatnonzero(mask), weights[s][b]) for s, mask in strata.items()])
        report = open_set_report(torch.tensor(probs[rows]), torch.tensor(target[rows]), fpr_targets=targets_fpr,
                                 background=background, conventions=("exact", "authors"))["scalars"]
        reference_keys = set(report)
        for key, value in report.items():
            ours = float(replicates[key][b])
            if math.isnan(value):
                nan_seen += 1
                assert math.isnan(ours), (key, b)
            else:
                assert ours == pytest.approx(value, abs=1e-12), (key, b, ours, value)
    assert set(replicates) == reference_keys
    assert nan_seen > 0  # the authors' "—" pattern was exercised


@pytest.mark.parametrize("head", [64, 1])
def test_bootstrap_open_set_absent_lowest_score_adds_no_point(monkeypatch, head):

    monkeypatch.setattr(open_set, "HEAD_SAMPLES", head)  # 1: the lowest sample alone, else a full search
    # the lowest score (the unknown at 0.34) is absent from some resamples: CCR@FPR=1 must then count the
    # correct knowns above the lowest *present* score, exactly as open_set_report on the expanded resample
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.6, 0.2, 0.2], [0.1, 0.8, 0.1], [0.5, 0.3, 0.2],
                          [0.7, 0.2, 0.1], [0.34, 0.33, 0.33]])
    target = torch.tensor([0, 0, 1, 0, -2, -2])
    replicates = bootstrap_open_set(probs, target, fpr_targets=(1.0,), resamples=40, seed=0)
    known_w, unknown_w = resample_weights(4, 40, 0), resample_weights(2, 40, 0, stratum=2)
    for b in range(40):
        rows = np.r_[np.repeat([0, 1, 2, 3], known_w[b]), np.repeat([4, 5], unknown_w[b])]
        report = open_set_report(probs[rows], target[rows], fpr_targets=(1.0,))["scalars"]
        assert float(replicates["unknowns/ccr@fpr=1"][b]) == pytest.approx(report["unknowns/ccr@fpr=1"], abs=1e-15)
    absent = unknown_w[:, 1] == 0
    assert absent.any() and (~absent).any()
    # with the lowest unknown present every correct known counts
    present_ccr = replicates["unknowns/ccr@fpr=1"][~absent]
    assert torch.equal(present_ccr, torch.ones_like(present_ccr))
    lowest_known_present = known_w[:, 3] > 0
    assert (replicates["unknowns/ccr@fpr=1"][absent & lowest_known_present] < 1).all()


def _open_set_sample(seed, n=600, classes=4):
    rng = np.random.default_rng(seed)
    probs, target = random_open_set_data(rng, n, classes, background=False, decimals=2)
    return torch.tensor(probs / probs.sum(axis=1, keepdims=True)), torch.tensor(target)


@pytest.mark.parametrize("conventions, fpr_targets", [(("exact",), (0.0, 0.02, 0.1, 1.0)),
                                                      (("exact", "authors"), (0.02, 0.5, 1.0))])
def test_bootstrap_open_set_cpu_rows_equal_batched_torch_path_threads_and_chunks(monkeypatch, conventions, fpr_targets):

    def same(a, b):  # equal values, NaN (the authors' "—") where the other has NaN
        return a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())

    probs, target = _open_set_sample(21)
    options = dict(fpr_targets=fpr_targets, conventions=conventions, resamples=37, seed=3)
    single = bootstrap_open_set(probs, target, **options)
    assert {"negatives/ccr@fpr=0.02", "unknowns/ccr@fpr=1", "gamma"} <= set(single)
    # the batched torch path (accelerators) gives the same values as the numpy rows
    monkeypatch.setattr(open_set, "INT64_LIMIT", 0)
    batched = bootstrap_open_set(probs, target, **options)
    monkeypatch.undo()
    assert list(batched) == list(single)
    for key, value in single.items():
        if key.startswith("gamma"):  # float64 dot products: summation order only
            assert torch.allclose(batched[key], value, rtol=0, atol=1e-15), key
        else:
            assert same(batched[key], value), key
    monkeypatch.setattr(open_set, "PARALLEL_SIZE", 0)  # blocks spread over threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        threaded = bootstrap_open_set(probs, target, **options)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(resampling, "BATCH_DRAWS", 1)  # one row at a time
    one_by_one = bootstrap_open_set(probs, target, **options)
    first = bootstrap_open_set(probs, target, **{**options, "resamples": 20})
    monkeypatch.setattr(open_set, "HEAD_SAMPLES", 1)  # the lowest present score by a full search
    searched = bootstrap_open_set(probs, target, **options)
    for key, value in single.items():
        assert same(threaded[key], value), key
        assert same(one_by_one[key], value), key
        assert same(first[key], value[:20]), key
        assert same(searched[key], value), key


def test_bootstrap_open_set_uint8_counts_that_wrap_fall_back_to_int32(monkeypatch):

    class Constant:  # every draw picks unit 0: a count of n >= 256 wraps in uint8
        def integers(self, low, high, size, dtype):
            return np.zeros(size, dtype=dtype)

    probs, target = _open_set_sample(2, n=900)
    monkeypatch.setattr(resampling, "_block_generator", lambda seed, stratum, block: Constant())
    rows = bootstrap_open_set(probs, target, fpr_targets=(0.1, 1.0), resamples=3)
    monkeypatch.setattr(open_set, "INT64_LIMIT", 0)  # the batched torch path, int32 counts
    batched = bootstrap_open_set(probs, target, fpr_targets=(0.1, 1.0), resamples=3)
    for key, value in rows.items():
        assert torch.allclose(batched[key], value, rtol=0, atol=1e-15), key
    # every resample holds the first sample of each stratum n times: one sample per group
    first_known = int((target >= 0).nonzero()[0])
    correct = int(probs[first_known].argmax()) == int(target[first_known])
    assert torch.equal(rows["closed_set_accuracy"], torch.full((3,), float(correct), dtype=torch.float64))


def test_bootstrap_open_set_float16_and_no_correct_known():
    probs, target = _open_set_sample(5, n=300, classes=3)
    half = probs.half()
    replicates = bootstrap_open_set(half, target, fpr_targets=(0.05, 1.0), resamples=12, seed=1)
    strata = {s: target.numpy() == label for s, label in ((1, -1), (2, -2))}
    strata[0] = target.numpy() >= 0
    weights = {s: resample_weights(int(mask.sum()), 12, 1, stratum=s).numpy() for s, mask in strata.items()}
    for b in range(12):
        rows = np.concatenate([np.repeat(np.flatnonzero(strata[s]), weights[s][b]) for s in (0, 1, 2)])
        report = open_set_report(half[rows], target[rows], fpr_targets=(0.05, 1.0))["scalars"]
        for key in ("unknowns/ccr@fpr=0.05", "unknowns/ccr@fpr=1", "negatives/ccr@fpr=1", "closed_set_accuracy"):
            assert float(replicates[key][b]) == pytest.approx(report[key], abs=1e-12), (key, b)
    # every known misclassified: CCR 0 everywhere
    wrong = torch.tensor([[0.2, 0.8], [0.7, 0.3], [0.6, 0.4], [0.5, 0.5]])
    replicates = bootstrap_open_set(wrong, torch.tensor([0, 1, -2, -2]), fpr_targets=(0.5, 1.0), resamples=5)
    assert torch.equal(replicates["unknowns/ccr@fpr=1"], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(replicates["closed_set_accuracy"], torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: bootstrap_open_set(torch.full((2, 2), 0.5), torch.tensor([0, -2]), conventions=("paper",)), "paper"),
    (lambda: bootstrap_open_set(torch.randn(2, 2) * 5, torch.tensor([0, -2])), "logits"),
])
def test_bootstrap_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
