"""metrics.seed_mean against the random-effects formula written out in numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from metrics import seed_mean, seed_mean_replicates, worse_than_best
from metrics.seeds import convolution_quantile


def convolution_reference(a, b, dof, level=0.95):
    """k with P(|a T + b Z| <= k) = level, the other way round from the implementation: scipy's adaptive
    quadrature over T (the t density times the normal distribution function), and brentq."""
    def covered(k):
        def inside(t):
            return (stats.norm.cdf((k - a * t) / b) - stats.norm.cdf((-k - a * t) / b)) * stats.t.pdf(t, dof)

        return integrate.quad(inside, -np.inf, np.inf, limit=400, epsabs=1e-13)[0]
    return optimize.brentq(lambda k: covered(k) - level, 1e-9, 100 * (a + b), xtol=1e-13)


def reference(estimates, replicates, level=0.95):
    est, reps = np.asarray(estimates, float), np.asarray(replicates, float)
    s = len(est)
    between = est.var(ddof=1)
    cov = np.cov(reps)  # (S, S), N - 1
    shared = max(0.0, cov[~np.eye(s, dtype=bool)].mean())
    half = convolution_reference(np.sqrt(between / s), np.sqrt(shared), s - 1, level)
    return est.mean(), est.mean() - half, est.mean() + half, s - 1, shared


def test_matches_the_formula():
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 0.01, 500)  # the test sampling the seeds share
    estimates = np.array([0.81, 0.84, 0.79])
    replicates = estimates[:, None] + shared[None] + rng.normal(0, 0.004, (3, 500))
    got = seed_mean(torch.tensor(estimates), torch.tensor(replicates), 0.9)
    value, low, high, dof, cov = reference(estimates, replicates, 0.9)
    assert (got.value, got.low, got.high, got.dof, got.shared) == pytest.approx((value, low, high, dof, cov), rel=1e-9)
    assert got.shared == pytest.approx(1e-4, rel=0.2) and got.seeds == 3
    assert got.std == pytest.approx(np.std(estimates, ddof=1))


def test_hand_computed_two_seeds_without_shared_sampling():
    # replicates without spread: the interval is t_1 · s/√2 around the mean (s² = 0.005, ν = 1)
    got = seed_mean(torch.tensor([0.8, 0.9], dtype=torch.float64), torch.tensor([[0.8] * 4, [0.9] * 4], dtype=torch.float64))
    half = stats.t.ppf(0.975, 1) * np.sqrt(0.005 / 2)
    assert (got.value, got.low, got.high, got.dof) == pytest.approx((0.85, 0.85 - half, 0.85 + half, 1.0))


def test_replicates_carry_both_sources_and_stay_paired():
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 0.01, 4000)
    estimates = np.array([0.70, 0.74, 0.72])
    replicates = torch.tensor(estimates[:, None] + shared[None] + rng.normal(0, 0.002, (3, 4000)))
    combined = seed_mean(torch.tensor(estimates), replicates)
    draws = seed_mean_replicates(torch.tensor(estimates), replicates, seed=3)
    mean = replicates.mean(dim=0)
    # the seeds' part: Student's t on S - 1 = 2 degrees of freedom, scaled by √(Var - var_b(mean))
    scaled = ((draws - mean) / np.sqrt(combined.variance - float(mean.var()))).numpy()
    quantiles = [0.75, 0.9, 0.975]
    assert np.quantile(scaled, quantiles) == pytest.approx(stats.t.ppf(quantiles, 2), rel=0.15)
    assert np.quantile(scaled, 0.5) == pytest.approx(0.0, abs=0.05)
    # the shared test sampling is kept: the replicates correlate with the shared component
    assert stats.spearmanr(draws.numpy(), shared).statistic > 0.4
    assert torch.equal(draws, seed_mean_replicates(torch.tensor(estimates), replicates, seed=3))  # seeded


@pytest.mark.parametrize(("estimates", "replicates", "message"), [
    ([0.8], [[0.8, 0.8]], "at least 2"),
    ([0.8, 0.9], [[0.8, 0.8]], r"\(S, B\)"),
    ([0.8, float("nan")], [[0.8, 0.8], [0.8, 0.8]], "finite"),
    ([0.8, 0.9], [[0.8, float("nan"), 0.7], [0.8, 0.9, float("nan")]], "at least 2 resamples in which every seed"),
])
def test_bad_input(estimates, replicates, message):
    with pytest.raises(ValueError, match=message):
        seed_mean(torch.tensor(estimates), torch.tensor(replicates))


def test_equal_recipes_of_three_seeds_are_rarely_marked_worse():
    """Two recipes of the same true value, three seeds each on one shared test set: worse_than_best on their
    seed-mean replicates marks one at about its level. With a normal seeds' term (the seeds' variance read as
    known) 13% of the repetitions marked one at 95%."""
    rng = np.random.default_rng(5)
    reps, resamples, marked = 300, 400, 0
    for rep in range(reps):
        shared = rng.normal(0, 0.01, resamples)  # one test set: the same resamples for both recipes
        rows, draws = [], []
        for recipe in range(2):
            estimates = rng.normal(0, 1, 3)  # seed sd 1, test-sampling sd 0.01
            replicates = torch.tensor(estimates[:, None] + shared[None] + rng.normal(0, 0.002, (3, resamples)))
            rows.append(float(np.mean(estimates)))
            draws.append(seed_mean_replicates(torch.tensor(estimates), replicates, seed=rep * 2 + recipe))
        marked += bool(worse_than_best(torch.tensor(rows), torch.stack(draws)).any())
    assert marked / reps <= 0.07


@pytest.mark.parametrize(("a", "b", "dof", "level"), [(1.0, 0.0, 2, 0.95), (0.0, 1.0, 2, 0.95), (1.0, 0.5, 2, 0.95),
                                                      (0.01, 0.02, 4, 0.9), (0.3, 3.0, 2, 0.95)])
def test_convolution_quantile(a, b, dof, level):
    """The t-plus-normal quantile against scipy's quadrature; its edges are the t and the normal quantiles; and
    by simulation it holds the level."""
    got = convolution_quantile(a, b, dof, level)
    if b == 0:
        assert got == pytest.approx(a * stats.t.ppf((1 + level) / 2, dof), rel=1e-12)
    elif a == 0:
        assert got == pytest.approx(b * stats.norm.ppf((1 + level) / 2), rel=1e-12)
    else:
        assert got == pytest.approx(convolution_reference(a, b, dof, level), rel=1e-7)
    rng = np.random.default_rng(0)
    draws = a * rng.standard_t(dof, 200_000) + b * rng.normal(size=200_000)
    assert np.mean(np.abs(draws) <= got) == pytest.approx(level, abs=0.004)


@pytest.mark.slow
def test_three_seeds_with_shared_test_sampling_cover_the_recipe():
    """The interval's coverage of the recipe's mean with three seeds, where the shared test sampling is 0.6
    times the seeds' part of the variance: Satterthwaite's t covered 0.93 here, the convolution 0.97."""
    rng = np.random.default_rng(2)
    reps, resamples, covered = 1000, 32, 0
    for _ in range(reps):
        shared = rng.normal(0, np.sqrt(0.6 / 3))  # the test-sampling error the seeds share (truth 0)
        estimates = rng.normal(0, 1, 3) + shared
        replicates = estimates[:, None] + rng.normal(0, np.sqrt(0.6 / 3), resamples)[None]
        got = seed_mean(torch.tensor(estimates), torch.tensor(replicates))
        covered += got.low <= 0.0 <= got.high
    assert 0.94 <= covered / reps <= 0.99
