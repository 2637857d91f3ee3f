"""EvG's intervals (callbacks.evg.EvGReport._intervals) on stored scores: chains resampled by their seed image,
the worst-case AUROC interval clustered by seed, MinRank conditional on the search (Wilson's count interval),
against the metric functions and formulas written out here."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from callbacks.evg import EvGReport
from evaluation_engine.intervals import Intervals
from metrics import auroc_interval, min_rank, resample_weights, weighted_auroc


def report(seeds: int, resamples: int = 200) -> EvGReport:
    found = EvGReport.__new__(EvGReport)
    found.intervals = Intervals(resamples=resamples, seed=3)
    found.seed_indices = torch.arange(100, 100 + seeds)  # the seed images' indices in the OOD set
    found._weight_cache, found.replicates = {}, {}
    return found


def scores(chains: int, seeds: int, rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    seed_scores = rng.normal(-1, 1, seeds)
    worst = torch.from_numpy(seed_scores[np.arange(chains) % seeds] + 1 + rng.normal(0, 0.3, chains))
    return {"id_test": torch.from_numpy(rng.normal(0, 1, 300)), "ood": torch.from_numpy(rng.normal(-1, 1, 80))}, worst


def test_chains_that_share_a_seed_image_share_its_weight() -> None:
    rng = np.random.default_rng(0)
    card, (fixed, worst) = report(seeds=10), scores(30, 10, rng)  # 30 chains over 10 seed images: 3 each
    kept = torch.ones(30, dtype=torch.bool)
    kept[7] = False  # a chain without a finite energy drops out, the others keep their seeds
    row = {"min rank": min_rank(fixed["id_test"], worst[kept])}
    card._intervals(row, fixed, worst[kept], kept, "d|affine|mh")
    seed_of_chain = (torch.arange(30) % 10)[kept]
    id_weights = resample_weights(300, 200, 3, stratum=0)
    seed_weights = resample_weights(10, 200, 3, stratum=1)  # one draw of the seed images, keyed by position
    expected = weighted_auroc(fixed["id_test"], worst[kept], id_weights, seed_weights[:, seed_of_chain])
    torch.testing.assert_close(card.replicates["d|affine|mh|worst_auroc"], expected, rtol=0, atol=0)
    # the interval: the AUROC interval with the chains clustered by seed image (Obuchowski's DeLong)
    assert (row["worst-case auroc low"], row["worst-case auroc high"]) == pytest.approx(
        auroc_interval(fixed["id_test"], worst[kept], ood_clusters=seed_of_chain), abs=1e-12)
    # clustering widens the interval of chains that share seeds
    plain = auroc_interval(fixed["id_test"], worst[kept], method="logit")
    assert row["worst-case auroc high"] - row["worst-case auroc low"] > plain[1] - plain[0]


def test_min_rank_is_conditional_on_the_search_with_wilsons_interval() -> None:
    rng = np.random.default_rng(1)
    card, (fixed, worst) = report(seeds=20), scores(20, 20, rng)
    kept = torch.ones(20, dtype=torch.bool)
    count = min_rank(fixed["id_test"], worst)
    row = {"min rank": count}
    card._intervals(row, fixed, worst, kept, "d|colour|random")
    z, n = NormalDist().inv_cdf(0.975), 300
    p = count / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert row["min rank low"] == math.floor(max(0.0, centre - half) * n + 1e-9)
    assert row["min rank high"] == math.ceil(min(1.0, centre + half) * n - 1e-9)
    # the replicates resample the ID test images only (the worst case held fixed): a count above the fixed maximum
    id_weights = resample_weights(300, 200, 3, stratum=0)
    above = (fixed["id_test"] > worst.max()).long()
    torch.testing.assert_close(card.replicates["d|colour|random|min_rank"], (id_weights.long() @ above).double())


def test_min_rank_zero_gets_an_interval_of_positive_width() -> None:
    card = report(seeds=5)
    fixed = {"id_test": torch.linspace(0, 1, 50, dtype=torch.float64), "ood": torch.zeros(5, dtype=torch.float64)}
    worst = torch.full((5,), 2.0, dtype=torch.float64)  # every worst case beats every ID image: MinRank 0
    row = {"min rank": 0}
    card._intervals(row, fixed, worst, torch.ones(5, dtype=torch.bool), "d|gan|mh")
    assert row["min rank low"] == 0 and row["min rank high"] >= 3  # Wilson: 50 · z²/(50 + z²) = 3.6 -> 4
    assert row["worst-case auroc low"] == 0.0 and row["worst-case auroc high"] > 0.0  # not [0, 0]
