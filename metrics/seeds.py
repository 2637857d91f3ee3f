"""Several training runs of one recipe as one model: the mean over the seeds with an interval that combines
the sampling of the test data and the seeds.

The intervals elsewhere in :mod:`metrics` (:mod:`metrics.closed_form_intervals`,
:mod:`metrics.bootstrap_intervals`) cover the sampling of the test data for *one* trained model. A recipe's number also varies with its training seed (OpenOOD v1.5 reports mean ± std over three
training runs, which leaves the test sampling out). With ``S`` seeds scored on the same test data, a
one-way random-effects model (``θ̂_s = θ + u_s + e + e_s``: ``u_s`` the seed's deviation, ``e`` the test
sampling error the seeds share, ``e_s`` the part of it specific to seed ``s``) gives::

    θ̄ = mean_s θ̂_s
    Var(θ̄) = (σ²_u + σ²_es)/S + σ²_e  ≈  s²/S + C̄

``s²`` the sample variance of the ``S`` estimates (it estimates ``σ²_u + σ²_es``) and ``C̄`` the mean bootstrap
covariance of two seeds' replicates over the same resamples (the shared test sampling, ``σ²_e``; paired
resamples keyed by unit identity make it estimable). The interval is ``θ̄ ± k`` with ``k`` the two-sided
quantile of ``√(s²/S) · T + √C̄ · Z``: Student's ``T`` on ``S - 1`` degrees of freedom for the seeds' part
(estimated from ``S`` numbers) and a standard normal ``Z`` for the shared test sampling (estimated from ``B``
resamples, taken as known), the convolution computed by quadrature over ``Z`` (:func:`convolution_quantile`). Satterthwaite's
approximation ``t_ν`` with ``ν = Var² / ((s²/S)² / (S - 1))``, the usual choice, under-covers with three seeds
(0.927-0.941 where the shared variance is 0.3-1 times the seeds' part, 0.90-0.93 in the coverage study):
its ``ν`` grows when ``s²`` is small by chance. The convolution covers 0.95-0.976 over the same range (exact
when either part is 0). This is the construction of a two-stage sample with the test set as a common second
stage; its coverage is measured in ``benchmarks/interval_coverage.py``. With two seeds the t has 1 degree of
freedom (its 97.5% quantile is 12.7, 4.3 with three seeds) and ``s`` is one difference: the interval is valid
but uninformative (on a proportion it often covers all of [0, 1]); the report card warns and says so.

For comparisons on the leaderboard, the seed mean gets replicates that carry both sources: the seed mean of
the replicates (the test sampling, paired with every other row measured on the same units) plus a seeded
Student-t term on ``S - 1`` degrees of freedom scaled by ``√(Var - var_b(mean_s θ*_s))`` (the seeds' part,
estimated from ``S`` numbers; its tails are those of the estimate, so the max-T of
:func:`metrics.worse_than_best` does not read it as known).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.stats import t as student_t
from torch import Tensor


@dataclass(frozen=True)
class SeedMean:
    """The mean over seeds and its interval (module docstring).

    Attributes:
        value: the mean of the seeds' estimates.
        low, high: its interval.
        std: the sample standard deviation of the seeds' estimates (``s``).
        variance: ``s²/S + C̄``, the variance of the mean.
        shared: ``C̄``, the test-sampling covariance the seeds share.
        dof: the degrees of freedom of the seeds' t term, ``S - 1``.
        seeds: ``S``.
    """

    value: float
    low: float
    high: float
    std: float
    variance: float
    shared: float
    dof: float
    seeds: int


def _checked(estimates: Tensor, replicates: Tensor) -> tuple[Tensor, Tensor]:
    estimates = torch.as_tensor(estimates).double().flatten()
    replicates = torch.as_tensor(replicates).double()
    if estimates.numel() < 2:
        raise ValueError(f"a mean over seeds needs at least 2 seeds, got {estimates.numel()}")
    if replicates.ndim != 2 or replicates.shape[0] != estimates.numel() or replicates.shape[1] < 2:
        raise ValueError(f"replicates must have shape (S, B) = ({estimates.numel()}, B >= 2), got "
                         f"{tuple(replicates.shape)}")
    if not bool(torch.isfinite(estimates).all()):
        raise ValueError(f"every seed needs a finite estimate, got {estimates.tolist()}")
    complete = torch.isfinite(replicates).all(dim=0)
    if int(complete.sum()) < 2:
        raise ValueError(f"the shared test-sampling variance needs at least 2 resamples in which every seed has a "
                         f"value, got {int(complete.sum())} of {replicates.shape[1]}")
    return estimates, replicates[:, complete]


def seed_mean(estimates: Tensor, replicates: Tensor, level: float = 0.95) -> SeedMean:
    """The mean of ``S`` seeds' estimates with the interval of the module docstring.

    Args:
        estimates: ``(S,)`` each seed's estimate.
        replicates: ``(S, B)`` each seed's bootstrap replicates over the same resamples of the same test units.
        level: the confidence level.
    """
    estimates, replicates = _checked(estimates, replicates)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    seeds = estimates.numel()
    between = float(estimates.var())  # s², N - 1
    centred = replicates - replicates.mean(dim=1, keepdim=True)
    covariance = centred @ centred.T / max(replicates.shape[1] - 1, 1)
    off = ~torch.eye(seeds, dtype=torch.bool)
    shared = max(0.0, float(covariance[off].mean()))
    variance = between / seeds + shared
    half = convolution_quantile(math.sqrt(between / seeds), math.sqrt(shared), seeds - 1, level)
    value = float(estimates.mean())
    return SeedMean(value, value - half, value + half, math.sqrt(between), variance, shared, float(seeds - 1), seeds)


def convolution_quantile(t_scale: float, normal_scale: float, dof: int, level: float = 0.95) -> float:
    """``k`` with ``P(|t_scale · T + normal_scale · Z| <= k) = level``, ``T`` Student's t on ``dof`` degrees of
    freedom and ``Z`` standard normal, independent: the coverage as an integral over ``Z`` (the trapezoid rule
    on a uniform grid of ``[-10, 10]`` fine enough for both the normal density and the t distribution function
    it shifts, at most 100,001 points) and ``k`` by Brent's method."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    if t_scale == 0.0:
        return normal_scale * NormalDist().inv_cdf((1 + level) / 2)
    if normal_scale == 0.0:
        return t_scale * float(student_t.ppf((1 + level) / 2, dof))
    ratio = normal_scale / t_scale
    points = int(min(100_001, 401 * max(1.0, ratio))) | 1  # a step of at most 0.05 in z and in the shift
    z = np.linspace(-10.0, 10.0, points)
    weights = np.exp(-z ** 2 / 2)
    weights[[0, -1]] /= 2
    weights /= weights.sum()
    shifts = ratio * z

    def shortfall(k: float) -> float:  # k in units of t_scale
        return float(weights @ (student_t.cdf(k - shifts, dof) - student_t.cdf(-k - shifts, dof))) - level

    tail = 1 - (1 - level) / 4  # each part beyond its quantile at this tail with chance (1 - level) / 2
    high = float(student_t.ppf(tail, dof)) + ratio * NormalDist().inv_cdf(tail)  # covers >= level (Bonferroni)
    return t_scale * float(brentq(shortfall, 0.0, high, xtol=1e-14, rtol=1e-13))


def seed_mean_replicates(estimates: Tensor, replicates: Tensor, *, seed: int) -> Tensor:
    """``(B,)`` replicates of the seed mean for paired comparisons (module docstring): the seeds' mean replicate
    plus ``√(Var - var_b(mean)) · T`` with ``T`` Student's t on ``S - 1`` degrees of freedom (normal over
    ``√(χ²_{S-1}/(S-1))``, from a generator seeded with ``seed``): the seeds' part of the variance is estimated
    from ``S`` numbers, so a normal term would read it as known and mark seed means as worse too often (13% of
    equal pairs at 95% with three seeds, 2.3% with the t term); resamples in which a seed has no value are NaN."""
    estimates, _ = _checked(estimates, replicates)
    replicates = torch.as_tensor(replicates).double()
    mean = replicates.mean(dim=0)
    finite = torch.isfinite(mean)
    stats = seed_mean(estimates, replicates)
    extra = max(0.0, stats.variance - float(mean[finite].var()))
    dof = stats.seeds - 1
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(mean.numel(), generator=generator, dtype=torch.float64)
    chi2 = torch.randn(mean.numel(), dof, generator=generator, dtype=torch.float64).square().sum(dim=1)
    return mean + math.sqrt(extra) * normal / torch.sqrt(chi2 / dof)


__all__ = ["SeedMean", "convolution_quantile", "seed_mean", "seed_mean_replicates"]
