"""metrics.closed_form_intervals against independent references: numpy DeLong from the formula (pairwise and
Obuchowski's clustered form), Newcombe's score equation solved directly, Wilson's and the logit interval
hand-computed, and the coverage the default interval was chosen for."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from metrics import (
    auroc_interval,
    bootstrap_auroc,
    delong,
    delong_parts,
    newcombe_interval,
    percentile_interval,
    wilson_interval,
)


def delong_reference(id_scores, ood_scores):
    """O(N_id N_ood) DeLong from the pairwise kernel ψ = 1, ½, 0."""
    x, y = np.asarray(id_scores, float), np.asarray(ood_scores, float)
    psi = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    area = psi.mean()
    return area, np.var(v10, ddof=1) / len(x) + np.var(v01, ddof=1) / len(y)


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


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), level=1.0), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), level=0.0), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(3), method="wald"), "'wald'"),
    (lambda: newcombe_interval(0.5, 10, 10, level=1.5), "level"),
    (lambda: auroc_interval(torch.ones(3), torch.zeros(0)), "0 OOD"),
    (lambda: delong(torch.tensor([1.0, float("nan")]), torch.zeros(3)), "NaN"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
