"""metrics.seed_mean against the random-effects formula written out in numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from metrics import seed_mean, seed_mean_replicates


def reference(estimates, replicates, level=0.95):
    est, reps = np.asarray(estimates, float), np.asarray(replicates, float)
    s = len(est)
    between = est.var(ddof=1)
    cov = np.cov(reps)  # (S, S), N - 1
    shared = max(0.0, cov[~np.eye(s, dtype=bool)].mean())
    variance = between / s + shared
    dof = variance ** 2 / ((between / s) ** 2 / (s - 1))
    half = stats.t.ppf((1 + level) / 2, dof) * np.sqrt(variance)
    return est.mean(), est.mean() - half, est.mean() + half, dof, shared


def test_matches_the_formula():
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 0.01, 500)  # the test sampling the seeds share
    estimates = np.array([0.81, 0.84, 0.79])
    replicates = estimates[:, None] + shared[None] + rng.normal(0, 0.004, (3, 500))
    got = seed_mean(torch.tensor(estimates), torch.tensor(replicates), 0.9)
    value, low, high, dof, cov = reference(estimates, replicates, 0.9)
    assert (got.value, got.low, got.high, got.dof, got.shared) == pytest.approx((value, low, high, dof, cov), rel=1e-10)
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
    assert float(draws.var()) == pytest.approx(combined.variance, rel=0.1)
    # the shared test sampling is kept: the replicates correlate with the shared component
    assert np.corrcoef(draws.numpy(), shared)[0, 1] > 0.4
    assert torch.equal(draws, seed_mean_replicates(torch.tensor(estimates), replicates, seed=3))  # seeded


@pytest.mark.parametrize(("estimates", "replicates", "message"), [
    ([0.8], [[0.8, 0.8]], "at least 2"),
    ([0.8, 0.9], [[0.8, 0.8]], r"\(S, B\)"),
    ([0.8, float("nan")], [[0.8, 0.8], [0.8, 0.8]], "finite"),
])
def test_bad_input(estimates, replicates, message):
    with pytest.raises(ValueError, match=message):
        seed_mean(torch.tensor(estimates), torch.tensor(replicates))
