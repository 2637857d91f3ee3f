"""metrics.bootstrap_intervals: the percentile interval against scipy's bootstrap, paired differences and the
probability of being first hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from metrics import (
    bootstrap_auroc,
    paired_difference,
    percentile_interval,
    probability_first,
)


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
    (lambda: percentile_interval(torch.zeros(3), level=2.0), "level"),
    (lambda: paired_difference(torch.zeros(3), torch.zeros(4)), "same number"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
