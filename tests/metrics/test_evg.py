"""MinRank and the energy standardisation of EvG (DESIGN.md §5.4) against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics import (
    auroc,
    bootstrap_min_rank,
    energy_standardisation,
    min_rank,
    resample_weights,
    standardised_energy,
    weighted_min_rank,
)
from tests.metrics.reference import expanded


def direct_min_rank(id_scores: np.ndarray, ood_scores: np.ndarray) -> int:
    """``min_j |{i : κ_id_i > κ_ood_j}|``, counted pair by pair."""
    return min(sum(1 for s in id_scores if s > t) for t in ood_scores)


@pytest.mark.parametrize("seed", range(8))
def test_min_rank_matches_a_direct_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # few distinct values: many ties between and within the two sets
    id_scores = rng.integers(0, 12, size=rng.integers(1, 60)).astype(np.float64)
    ood_scores = rng.integers(0, 12, size=rng.integers(1, 40)).astype(np.float64)
    assert min_rank(torch.from_numpy(id_scores), torch.from_numpy(ood_scores)) == direct_min_rank(id_scores, ood_scores)


def test_min_rank_hand_cases() -> None:
    id_scores = torch.tensor([0.9, 0.8, 0.7, 0.7, 0.2])
    assert min_rank(id_scores, torch.tensor([0.1, 0.05])) == 5  # every outlier below every ID sample: N_id
    assert min_rank(id_scores, torch.tensor([0.1, 0.75])) == 2  # 0.9 and 0.8 above the most trusted outlier
    assert min_rank(id_scores, torch.tensor([0.7])) == 2  # ties do not count: strictly above
    assert min_rank(id_scores, torch.tensor([0.95, 0.1])) == 0
    # MinRank only sees the most trusted outlier, the AUROC sees them all
    assert auroc(id_scores, torch.tensor([0.1, 0.75])) == pytest.approx((5 + 2) / 10)


def test_min_rank_refuses_empty_and_nan() -> None:
    with pytest.raises(ValueError, match="MinRank needs"):
        min_rank(torch.tensor([1.0]), torch.tensor([]))
    with pytest.raises(ValueError, match="NaN"):
        min_rank(torch.tensor([1.0, float("nan")]), torch.tensor([0.5]))


def test_energy_standardisation_is_the_authors() -> None:
    rng = np.random.default_rng(3)
    kappa = rng.normal(2.0, 0.7, size=500)
    mean, scale = energy_standardisation(torch.from_numpy(kappa))
    # outlier score -κ; torch.std's default (N - 1), plus 1e-3
    assert mean == pytest.approx(float(np.mean(-kappa)), abs=1e-12)
    assert scale == pytest.approx(float(np.std(-kappa, ddof=1)) + 1e-3, abs=1e-12)
    energy = standardised_energy(torch.tensor([2.0, 0.0]), mean, scale)
    expected = (np.array([-2.0, 0.0]) - np.mean(-kappa)) / (np.std(-kappa, ddof=1) + 1e-3)
    np.testing.assert_allclose(energy.numpy(), expected, rtol=1e-5)  # float32 κ in, float32 out
    # a constant detector: the 1e-3 keeps the scale finite
    assert energy_standardisation(torch.ones(10)) == (-1.0, pytest.approx(1e-3))


def test_nan_scores_are_a_clear_error() -> None:
    energy = standardised_energy(torch.tensor([0.1, float("nan"), 0.3]), 0.5, 2.0)  # NaN: a rejected proposal
    assert energy[0].item() == pytest.approx(-0.3) and torch.isnan(energy[1]) and energy[2].item() == pytest.approx(-0.4)
    with pytest.raises(ValueError, match=r"infinite scores \(samples \[0, 2\] of 3\)"):
        standardised_energy(torch.tensor([float("inf"), 0.0, -float("inf")]), 0.0, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        energy_standardisation(torch.tensor([1.0]))


# -- weighted, and the bootstrap -------------------------------------------------------------------------


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
