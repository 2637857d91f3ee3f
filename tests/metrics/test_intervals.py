"""metrics.intervals against independent references: numpy DeLong from the formula, per-resample loops of
sklearn / the project's metrics on the expanded resamples, scipy's bootstrap."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torchmetrics.functional.classification import multiclass_calibration_error

from metrics import (
    auroc_interval,
    bootstrap_accuracy_ece,
    bootstrap_auroc,
    bootstrap_min_rank,
    bootstrap_open_set,
    cluster_weights,
    delong,
    delong_parts,
    min_rank,
    newcombe_interval,
    open_set_report,
    paired_difference,
    percentile_interval,
    probability_first,
    resample_weights,
    weighted_auroc,
    weighted_min_rank,
    wilson_interval,
)
from tests.metrics.reference import random_open_set_data


def delong_reference(id_scores, ood_scores):
    """O(N_id N_ood) DeLong from the pairwise kernel ψ = 1, ½, 0."""
    x, y = np.asarray(id_scores, float), np.asarray(ood_scores, float)
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    area = psi.mean()
    return area, np.var(v10, ddof=1) / len(x) + np.var(v01, ddof=1) / len(y)


def sklearn_auroc(id_scores, ood_scores):
    labels = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    return roc_auc_score(labels, np.r_[id_scores, ood_scores])


def expanded(values, counts):
    return np.repeat(np.asarray(values), np.asarray(counts), axis=0)


# -- DeLong -----------------------------------------------------------------------------------------------


def test_delong_matches_pairwise_reference_with_ties():
    rng = np.random.default_rng(0)
    id_scores, ood_scores = rng.integers(0, 12, 400), rng.integers(0, 9, 300)  # many ties
    area, variance = delong(torch.tensor(id_scores), torch.tensor(ood_scores))
    ref_area, ref_variance = delong_reference(id_scores, ood_scores)
    assert area == pytest.approx(ref_area, abs=1e-12)
    assert variance == pytest.approx(ref_variance, rel=1e-10)


def test_delong_hand_computed():
    # ID (2, 1), OOD (1, 0): ψ = [[1, 1], [½, 1]] -> AUROC 3.5/4 = 0.875
    # V10 = (1, 0.75), V01 = (0.75, 1); each sample variance (N - 1) = 0.03125 -> Var = 0.03125/2 * 2 = 0.03125
    area, variance = delong(torch.tensor([2.0, 1.0]), torch.tensor([1.0, 0.0]))
    assert area == 0.875
    assert variance == pytest.approx(0.03125, abs=1e-15)


def test_delong_single_sample_side_has_zero_term():
    # one OOD sample: only the ID term, V10 = (1, 0, ½) -> S10 = 0.25, Var = 0.25 / 3
    area, variance = delong(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0]))
    assert area == pytest.approx(0.5)
    assert variance == pytest.approx(0.25 / 3)


def test_delong_variance_close_to_bootstrap_variance():
    rng = np.random.default_rng(1)
    id_scores = torch.tensor(np.round(rng.normal(0.6, 1.0, 2000), 1))
    ood_scores = torch.tensor(np.round(rng.normal(0.0, 1.0, 2000), 1))
    _, variance = delong(id_scores, ood_scores)
    replicates = bootstrap_auroc(id_scores, ood_scores, resamples=2000, seed=3)
    assert float(replicates.var()) == pytest.approx(variance, rel=0.15)


def test_wald_interval_formula_and_clipping():
    rng = np.random.default_rng(2)
    id_scores, ood_scores = torch.tensor(rng.normal(1, 1, 300)), torch.tensor(rng.normal(0, 1, 200))
    area, variance = delong(id_scores, ood_scores)
    z = statistics.NormalDist().inv_cdf(0.95)  # level 0.9
    low, high = auroc_interval(id_scores, ood_scores, level=0.9, method="delong")
    assert (low, high) == pytest.approx((area - z * math.sqrt(variance), area + z * math.sqrt(variance)), abs=1e-14)
    # perfect separation: AUROC 1, variance 0 -> (1, 1) (the Wald interval's collapse); near-perfect: clipped at 1
    assert auroc_interval(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0]), method="delong") == (1.0, 1.0)
    low, high = auroc_interval(torch.arange(5.0, 25.0), torch.tensor([0.0, 1.0, 2.0, 6.0]), method="delong")
    assert high == 1.0 and low < 1.0


def newcombe_reference(area, m, n, level=0.95):
    """Newcombe's Method 5 from its formula, solved with scipy's brentq (independent of the bisection)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    z2 = norm.ppf((1 + level) / 2) ** 2
    star = (m + n) / 2

    def f(theta):
        var = theta * (1 - theta) * ((2 * star - 1) - (3 * star - 3) / ((2 - theta) * (1 + theta))) / (m * n)
        return (area - theta) ** 2 - z2 * var

    low = 0.0 if area == 0 else brentq(f, 0.0, area - 1e-15) if area < 1 else brentq(f, 0.0, 1 - 1e-15)
    high = 1.0 if area == 1 else brentq(f, area + 1e-15, 1.0) if area > 0 else brentq(f, 1e-15, 1.0)
    return low, high


@pytest.mark.parametrize(("area", "m", "n"), [(0.75, 50, 50), (0.95, 20, 30), (1.0, 20, 20), (0.0, 5, 7),
                                              (0.5, 1, 1), (0.999, 1000, 300)])
def test_newcombe_interval_solves_the_score_equation(area, m, n):
    low, high = newcombe_interval(area, m, n)
    ref_low, ref_high = newcombe_reference(area, m, n)
    assert low == pytest.approx(ref_low, abs=1e-9) and high == pytest.approx(ref_high, abs=1e-9)
    assert low <= area <= high and high - low > 0  # never of zero width from a finite sample


def test_newcombe_hand_computed_perfect_separation():
    # AUROC 1 of 20/20 (N* = 20): (1 - θ)² = z² θ(1 - θ)[39 - 57/((2 - θ)(1 + θ))]/400 at the lower bound
    low, high = newcombe_interval(1.0, 20, 20)
    z2 = statistics.NormalDist().inv_cdf(0.975) ** 2
    assert high == 1.0
    assert (1 - low) ** 2 == pytest.approx(z2 * low * (1 - low) * (39 - 57 / ((2 - low) * (1 + low))) / 400, rel=1e-8)
    assert 0.85 < low < 0.95  # and it is this interval that auroc_interval gives a perfectly separated sample
    assert auroc_interval(torch.arange(20.0) + 100, torch.arange(20.0)) == pytest.approx((low, 1.0), abs=1e-12)


def test_logit_interval_formula():
    rng = np.random.default_rng(4)
    id_scores, ood_scores = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
    area, variance = delong_reference(id_scores, ood_scores)
    z = statistics.NormalDist().inv_cdf(0.975)
    logit, se = math.log(area / (1 - area)), math.sqrt(variance) / (area * (1 - area))
    expected = (1 / (1 + math.exp(-(logit - z * se))), 1 / (1 + math.exp(-(logit + z * se))))
    got = auroc_interval(torch.tensor(id_scores), torch.tensor(ood_scores), method="logit")
    assert got == pytest.approx(expected, abs=1e-12)
    # auto: here every sample of both sides overlaps the other (>= 40): the logit interval
    assert auroc_interval(torch.tensor(id_scores), torch.tensor(ood_scores)) == pytest.approx(expected, abs=1e-12)


def test_auto_takes_the_score_interval_where_few_samples_overlap():
    # 100 ID scores above 100 OOD scores but for 10 OOD samples among the lowest ID ones: 10 OOD samples and
    # a few ID samples take part in a discordant pair (< 40): auto = Newcombe
    id_scores = torch.arange(100.0) + 50
    ood_scores = torch.cat([torch.arange(90.0) - 100, torch.arange(10.0) + 50.5])
    parts = delong_parts(id_scores, ood_scores)
    assert parts.involved_ood == 10 and parts.involved_id == 10
    area = parts.area
    assert area == pytest.approx(1 - 55 / 10000)
    assert auroc_interval(id_scores, ood_scores) == pytest.approx(newcombe_interval(area, 100, 100), abs=1e-12)
    assert auroc_interval(id_scores, ood_scores) != pytest.approx(auroc_interval(id_scores, ood_scores, method="logit"))


def test_delong_parts_involved_counts_and_ties():
    # ID 3 is tied with OOD 3 (involved on both sides), ID 5 is above every OOD sample
    parts = delong_parts(torch.tensor([3.0, 5.0, 1.0]), torch.tensor([3.0, 0.0, 2.0]))
    assert parts.involved_id == 2  # 3 (tie) and 1 (below 3 and 2)
    assert parts.involved_ood == 2  # 3 (tie with 3, at/below 5) and 2 (below 3, 5); 0 lies below every ID
    area, variance = delong_reference([3.0, 5.0, 1.0], [3.0, 0.0, 2.0])
    assert parts.area == pytest.approx(area) and parts.variance == pytest.approx(variance)


def obuchowski_reference(id_scores, ood_scores, clusters):
    """Obuchowski (1997) clustered OOD term from the pairwise kernel, written from the formula."""
    x, y, c = np.asarray(id_scores, float), np.asarray(ood_scores, float), np.asarray(clusters)
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    area = psi.mean()
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    ids = np.unique(c)
    totals = np.array([v01[c == i].sum() for i in ids])
    sizes = np.array([(c == i).sum() for i in ids])
    ood_term = len(ids) / ((len(ids) - 1) * len(y) ** 2) * ((totals - sizes * area) ** 2).sum()
    return area, np.var(v10, ddof=1) / len(x) + ood_term


def test_clustered_delong_matches_reference_and_reduces_to_delong():
    rng = np.random.default_rng(5)
    id_scores = rng.integers(0, 15, 80).astype(float)
    seeds = rng.normal(0, 1, 12)
    clusters = np.repeat(np.arange(12), 3)  # 3 chains per seed image
    ood_scores = np.round(seeds[clusters] * 3 + rng.normal(0, 1, 36) + 6)
    parts = delong_parts(torch.tensor(id_scores), torch.tensor(ood_scores), ood_clusters=torch.tensor(clusters))
    area, variance = obuchowski_reference(id_scores, ood_scores, clusters)
    assert parts.area == pytest.approx(area, abs=1e-12) and parts.variance == pytest.approx(variance, rel=1e-10)
    assert parts.num_ood == 12  # the score interval counts clusters
    single = delong_parts(torch.tensor(id_scores), torch.tensor(ood_scores), ood_clusters=torch.arange(36))
    assert single.variance == pytest.approx(delong(torch.tensor(id_scores), torch.tensor(ood_scores))[1], rel=1e-12)


def test_wilson_interval_hand_computed():
    z = statistics.NormalDist().inv_cdf(0.975)
    assert wilson_interval(0, 10) == pytest.approx((0.0, z * z / (10 + z * z)), abs=1e-12)  # 0.2775
    assert wilson_interval(0, 10)[1] == pytest.approx(0.27753, abs=1e-5)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(1 - high, abs=1e-12) and low == pytest.approx(0.23659, abs=1e-5)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)


def test_bootstrap_interval_is_percentile_of_bootstrap_auroc():
    rng = np.random.default_rng(3)
    id_scores, ood_scores = torch.tensor(rng.normal(1, 1, 200)), torch.tensor(rng.normal(0, 1, 150))
    expected = percentile_interval(bootstrap_auroc(id_scores, ood_scores, resamples=300, seed=5), 0.9)
    assert auroc_interval(id_scores, ood_scores, 0.9, "bootstrap", resamples=300, seed=5) == expected


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
    import metrics.intervals as intervals

    # row b is the (b % BLOCK_ROWS)-th run of n draws of the generator seeded (seed, stratum, b // BLOCK_ROWS)
    n, block = 37, intervals.BLOCK_ROWS
    weights = resample_weights(n, 2 * block + 5, 3, stratum=2)
    for b in (0, 1, block - 1, block, 2 * block + 4):
        generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence((3, 2, b // block))))
        draws = [generator.integers(0, n, n) for _ in range(b % block + 1)][-1]
        assert weights[b].tolist() == np.bincount(draws, minlength=n).tolist()


@pytest.mark.parametrize("n", [5, 700, 3000])
def test_rows_do_not_depend_on_b_the_chunk_size_or_the_batching(monkeypatch, n):
    import metrics.intervals as intervals

    whole = resample_weights(n, 40, 1, stratum=1)  # 40 rows: three blocks of 16, the last one cut
    for rows in (1, 7, 16, 17, 33):
        assert torch.equal(resample_weights(n, rows, 1, stratum=1), whole[:rows])
    stream = intervals._RowStream(n, 1, 1)  # rows asked for in uneven chunks, across block boundaries
    chunks = [stream.counts(size) for size in (3, 14, 1, 20, 2)]
    assert torch.equal(torch.from_numpy(np.concatenate(chunks)), whole)
    assert torch.equal(torch.from_numpy(intervals._RowStream(n, 1, 1, start=21).counts(19)), whole[21:])
    monkeypatch.setattr(intervals, "BATCH_DRAWS", 1)  # every row drawn and counted alone
    assert torch.equal(resample_weights(n, 40, 1, stratum=1), whole)
    monkeypatch.setattr(intervals, "BATCH_DRAWS", 1 << 30)  # whole blocks in one call
    assert torch.equal(resample_weights(n, 40, 1, stratum=1), whole)
    uint8 = intervals._RowStream(n, 1, 1).counts(40, np.empty((40, n), dtype=np.uint8))
    assert uint8.dtype == np.uint8 and np.array_equal(uint8, whole.numpy())


def test_uint8_counts_fall_back_to_int32_when_a_count_exceeds_255(monkeypatch):
    import metrics.intervals as intervals

    class Constant:  # every draw picks unit 0 (a count of n = 300 wraps in uint8)
        def integers(self, low, high, size, dtype):
            return np.zeros(size, dtype=dtype)

    monkeypatch.setattr(intervals, "_block_generator", lambda seed, stratum, block: Constant())
    counts = intervals._RowStream(300, 0, 0).counts(3, np.empty((3, 300), dtype=np.uint8))
    assert counts.dtype == np.int32 and (counts[:, 0] == 300).all() and (counts[:, 1:] == 0).all()


def test_bootstrap_auroc_does_not_depend_on_threads_or_chunks(monkeypatch):
    import metrics.intervals as intervals

    rng = np.random.default_rng(13)
    id_scores = torch.tensor(np.round(rng.normal(0.5, 1, 900), 1))
    ood_scores = torch.tensor(np.round(rng.normal(0, 1, 700), 1))
    single = bootstrap_auroc(id_scores, ood_scores, 70, 4)
    w_id, w_ood = resample_weights(900, 70, 4), resample_weights(700, 70, 4, stratum=1)
    assert torch.equal(weighted_auroc(id_scores, ood_scores, w_id, w_ood), single)
    monkeypatch.setattr(intervals, "PARALLEL_SIZE", 0)  # blocks spread over threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 70, 4), single)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(intervals, "BATCH_DRAWS", 1)  # one row at a time
    assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 70, 4), single)
    assert torch.equal(bootstrap_auroc(id_scores, ood_scores, 20, 4), single[:20])
    # the batched torch path (real weights, accelerators) gives the same values as the numpy rows
    plan = intervals._AUROCPlan(id_scores, ood_scores)
    assert torch.equal(plan.twice_u(w_id, w_ood), torch.from_numpy(plan.twice_u_counts(w_id.numpy(), w_ood.numpy())))


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
    import metrics.intervals as intervals

    rng = np.random.default_rng(5)
    id_scores = torch.tensor(np.round(rng.normal(0.5, 1, 300), 2), dtype=torch.float32)
    ood_scores = torch.tensor(np.round(rng.normal(0, 1, 200), 2), dtype=torch.float32)
    w_id, w_ood = resample_weights(300, 25, 2), resample_weights(200, 25, 2, stratum=1)
    whole = weighted_auroc(id_scores, ood_scores, w_id, w_ood)
    monkeypatch.setattr(intervals, "CHUNK_ELEMENTS", 1000)  # two rows per chunk
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


def test_bootstrap_percentile_interval_close_to_scipy():
    from scipy import stats

    rng = np.random.default_rng(7)
    id_scores, ood_scores = rng.normal(0.8, 1, 300), rng.normal(0, 1, 300)
    low, high = percentile_interval(bootstrap_auroc(torch.tensor(id_scores), torch.tensor(ood_scores), 2000, 1))

    def area(x, y, axis=-1):  # the Mann-Whitney U of x over y, ties ½, / (N_x N_y)
        return stats.mannwhitneyu(x, y, axis=axis).statistic / (x.shape[axis] * y.shape[axis])

    result = stats.bootstrap((id_scores, ood_scores), area, method="percentile", n_resamples=2000,
                             vectorized=True, paired=False, random_state=np.random.default_rng(0))
    assert low == pytest.approx(result.confidence_interval.low, abs=0.01)
    assert high == pytest.approx(result.confidence_interval.high, abs=0.01)


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
    import metrics.intervals as intervals

    monkeypatch.setattr(intervals, "HEAD_SAMPLES", head)  # 1: the lowest sample alone, else a full search
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
    import metrics.intervals as intervals

    def same(a, b):  # equal values, NaN (the authors' "—") where the other has NaN
        return a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())

    probs, target = _open_set_sample(21)
    options = dict(fpr_targets=fpr_targets, conventions=conventions, resamples=37, seed=3)
    single = bootstrap_open_set(probs, target, **options)
    assert {"negatives/ccr@fpr=0.02", "unknowns/ccr@fpr=1", "gamma"} <= set(single)
    # the batched torch path (accelerators) gives the same values as the numpy rows
    monkeypatch.setattr(intervals, "INT64_LIMIT", 0)
    batched = bootstrap_open_set(probs, target, **options)
    monkeypatch.undo()
    assert list(batched) == list(single)
    for key, value in single.items():
        if key.startswith("gamma"):  # float64 dot products: summation order only
            assert torch.allclose(batched[key], value, rtol=0, atol=1e-15), key
        else:
            assert same(batched[key], value), key
    monkeypatch.setattr(intervals, "PARALLEL_SIZE", 0)  # blocks spread over threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        threaded = bootstrap_open_set(probs, target, **options)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(intervals, "BATCH_DRAWS", 1)  # one row at a time
    one_by_one = bootstrap_open_set(probs, target, **options)
    first = bootstrap_open_set(probs, target, **{**options, "resamples": 20})
    monkeypatch.setattr(intervals, "HEAD_SAMPLES", 1)  # the lowest present score by a full search
    searched = bootstrap_open_set(probs, target, **options)
    for key, value in single.items():
        assert same(threaded[key], value), key
        assert same(one_by_one[key], value), key
        assert same(first[key], value[:20]), key
        assert same(searched[key], value), key


def test_bootstrap_open_set_uint8_counts_that_wrap_fall_back_to_int32(monkeypatch):
    import metrics.intervals as intervals

    class Constant:  # every draw picks unit 0: a count of n >= 256 wraps in uint8
        def integers(self, low, high, size, dtype):
            return np.zeros(size, dtype=dtype)

    probs, target = _open_set_sample(2, n=900)
    monkeypatch.setattr(intervals, "_block_generator", lambda seed, stratum, block: Constant())
    rows = bootstrap_open_set(probs, target, fpr_targets=(0.1, 1.0), resamples=3)
    monkeypatch.setattr(intervals, "INT64_LIMIT", 0)  # the batched torch path, int32 counts
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


# -- MinRank, accuracy and ECE ---------------------------------------------------------------------------


def test_min_rank_replicates_equal_loop():
    rng = np.random.default_rng(10)
    id_scores, chains = rng.integers(0, 30, 200).astype(float), rng.integers(0, 25, 12).astype(float)
    ours = bootstrap_min_rank(torch.tensor(id_scores), torch.tensor(chains), 50, 3)
    w_id, w_chain = resample_weights(200, 50, 3), resample_weights(12, 50, 3, stratum=1)
    assert torch.equal(weighted_min_rank(torch.tensor(id_scores), torch.tensor(chains), w_id, w_chain), ours)
    reference = [min_rank(torch.tensor(expanded(id_scores, w_id[b])), torch.tensor(expanded(chains, w_chain[b])))
                 for b in range(50)]
    assert ours.tolist() == reference
    assert len(set(reference)) > 1


def project_accuracy_ece(probs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """callbacks.generated's ``_accuracy_ece``."""
    return (float((probs.argmax(dim=1) == targets).double().mean()),
            float(multiclass_calibration_error(probs, targets, num_classes=probs.shape[1], n_bins=15, norm="l1")))


def test_accuracy_ece_replicates_equal_project_ece_on_expanded_resamples():
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(300, 5)) * 2
    probs = torch.tensor(np.round(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), 2), dtype=torch.float32)
    probs[0] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])  # confidence 1.0: torchmetrics' extra bin
    targets = torch.tensor(rng.integers(0, 5, 300))
    replicates = bootstrap_accuracy_ece(probs, targets, resamples=20, seed=2)
    weights = resample_weights(300, 20, 2)
    for b in range(20):
        rows = np.repeat(np.arange(300), weights[b])
        accuracy, ece = project_accuracy_ece(probs[rows], targets[rows])
        assert float(replicates["accuracy"][b]) == pytest.approx(accuracy, abs=1e-12)
        assert float(replicates["ece"][b]) == pytest.approx(ece, abs=1e-6)  # torchmetrics sums in float32
    # weights of all ones give the project's value
    import metrics.intervals as intervals

    confidence, prediction = probs.max(dim=1)
    confidence = confidence.float()
    bins = torch.bucketize(confidence, torch.linspace(0, 1, 16), right=True) - 1
    ones = torch.ones(1, 300, dtype=torch.int32)
    ece = intervals._ece_rows(ones, bins, confidence.double(), (prediction == targets).double(), 15)
    assert float(ece) == pytest.approx(project_accuracy_ece(probs, targets)[1], abs=1e-6)


# -- reading replicates ---------------------------------------------------------------------------------------


def test_percentile_interval_drops_nan():
    values = torch.tensor([float("nan"), 0.0, 1.0, 2.0, 3.0, 4.0, float("nan")])
    assert percentile_interval(values, 0.5) == (1.0, 3.0)
    low, high = percentile_interval(torch.full((5,), float("nan")))
    assert math.isnan(low) and math.isnan(high)


def test_paired_difference():
    rng = np.random.default_rng(12)
    id_scores, ood_scores = torch.tensor(rng.normal(1, 1, 400)), torch.tensor(rng.normal(0, 1, 400))
    a = bootstrap_auroc(id_scores, ood_scores, 200, 0)
    assert paired_difference(a, a) == (0.0, 0.0, False)
    better = bootstrap_auroc(id_scores + 0.5, ood_scores, 200, 0)  # same images, same resamples
    low, high, significant = paired_difference(better, a)
    assert significant and low > 0


def test_probability_first_splits_ties():
    replicates = torch.tensor([[0.9, 0.5, 0.7, float("nan")],
                               [0.8, 0.5, 0.7, 0.1],
                               [0.1, 0.2, 0.7, 0.2]])
    # column 1: rows 0 and 1 tie (½ each); column 2: three-way tie; column 3: NaN never wins
    expected = torch.tensor([1 + 0.5 + 1 / 3 + 0, 0.5 + 1 / 3, 1 / 3 + 1], dtype=torch.float64) / 4
    torch.testing.assert_close(probability_first(replicates), expected)
    assert float(probability_first(replicates).sum()) == pytest.approx(1.0)
    lower = probability_first(replicates, higher_is_better=False)
    expected_lower = torch.tensor([1 / 3, 1 / 3 + 1, 1 + 1 + 1 / 3], dtype=torch.float64) / 4
    torch.testing.assert_close(lower, expected_lower)


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), level=1.0), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), level=0.0), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), method="wald"), "'wald'"),
    (lambda: newcombe_interval(0.5, 10, 10, level=1.5), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(0)), "0 OOD"),
    (lambda: delong(torch.tensor([1.0, float("nan")]), torch.zeros(3)), "NaN"),
    (lambda: resample_weights(0, 3, 0), "n must"),
    (lambda: resample_weights(3, 0, 0), "resamples"),
    (lambda: resample_weights(3, 2, -1), "seed"),
    (lambda: weighted_auroc(torch.ones(3), torch.zeros(2), torch.ones(2, 4), torch.ones(2, 2)), r"\(B, 3\)"),
    (lambda: weighted_auroc(torch.ones(3), torch.zeros(2), -torch.ones(2, 3), torch.ones(2, 2)), "negative"),
    (lambda: percentile_interval(torch.zeros(3), level=2.0), "level"),
    (lambda: paired_difference(torch.zeros(3), torch.zeros(4)), "same number"),
    (lambda: bootstrap_open_set(torch.full((2, 2), 0.5), torch.tensor([0, -2]), conventions=("paper",)), "paper"),
    (lambda: bootstrap_open_set(torch.randn(2, 2) * 5, torch.tensor([0, -2])), "logits"),
    (lambda: bootstrap_accuracy_ece(torch.randn(4, 3) * 5, torch.tensor([0, 1, 2, 0])), "probabilities"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_default_auroc_interval_covers_where_walds_did_not():
    """The bug: Wald DeLong covered a 95% AUROC in about 83% of 20/20 samples and gave [1, 1] to perfectly
    separated ones; the default (auto) holds the coverage and never has zero width."""
    rng = np.random.default_rng(11)
    d = math.sqrt(2) * statistics.NormalDist().inv_cdf(0.95)
    wald = auto = zero = 0
    reps = 300
    for _ in range(reps):
        x, y = torch.tensor(rng.normal(d, 1, 20)), torch.tensor(rng.normal(0, 1, 20))
        low, high = auroc_interval(x, y, method="delong")
        wald += low <= 0.95 <= high
        low, high = auroc_interval(x, y)
        auto += low <= 0.95 <= high
        zero += high - low <= 0
    assert wald / reps < 0.9 and auto / reps > 0.92 and zero == 0
