"""Several training runs of one recipe as one model: the mean over the seeds with an interval that combines
the sampling of the test data and the seeds.

The intervals elsewhere in :mod:`metrics.intervals` cover the sampling of the test data for *one* trained
model. A recipe's number also varies with its training seed (OpenOOD v1.5 reports mean ± std over three
training runs, which leaves the test sampling out). With ``S`` seeds scored on the same test data, a
one-way random-effects model (``θ̂_s = θ + u_s + e + e_s``: ``u_s`` the seed's deviation, ``e`` the test
sampling error the seeds share, ``e_s`` the part of it specific to seed ``s``) gives::

    θ̄ = mean_s θ̂_s
    Var(θ̄) = (σ²_u + σ²_es)/S + σ²_e  ≈  s²/S + C̄

``s²`` the sample variance of the ``S`` estimates (it estimates ``σ²_u + σ²_es``) and ``C̄`` the mean bootstrap
covariance of two seeds' replicates over the same resamples (the shared test sampling, ``σ²_e``; paired
resamples keyed by unit identity make it estimable). The interval is ``θ̄ ± t_ν · √Var`` with Satterthwaite's
degrees of freedom for the ``s²`` part, ``ν = Var² / ((s²/S)² / (S - 1))`` (the shared part is estimated from
``B`` resamples and taken as known). This is the construction of a two-stage sample with the test set as a
common second stage; its coverage is measured in ``benchmarks/interval_coverage.py``.

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

import torch
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
        dof: Satterthwaite's degrees of freedom ν.
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
    seed_part = between / seeds
    dof = math.inf if seed_part == 0 else variance ** 2 / (seed_part ** 2 / (seeds - 1))
    quantile = (float(student_t.ppf((1 + level) / 2, dof)) if math.isfinite(dof)
                else NormalDist().inv_cdf((1 + level) / 2))
    half = quantile * math.sqrt(variance)
    value = float(estimates.mean())
    return SeedMean(value, value - half, value + half, math.sqrt(between), variance, shared, dof, seeds)


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


__all__ = ["SeedMean", "seed_mean", "seed_mean_replicates"]
