"""metrics.worse_than_best against a loop written from Romano & Wolf's stepdown, hand-built cases, and the
family-wise error of the leaderboard's ▼ before (per-pair intervals) and after (simultaneous)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from metrics import auroc, bootstrap_auroc, paired_difference, share_first, worse_than_best
from metrics.bootstrap_intervals import probability_first


def stepdown_reference(estimates, replicates, level=0.95, higher_is_better=True, single_step=False):
    """The studentised max-T stepdown over all pairs, with python loops over pairs (independent of the vectorised
    code): declare pairs whose |d̂|/se exceeds the ⌈level·B⌉-th order statistic of the centred maximum over
    the pairs not yet declared; a row is worse when a declared pair has a higher other row."""
    est = np.asarray(estimates, float) * (1 if higher_is_better else -1)
    reps = np.asarray(replicates, float) * (1 if higher_is_better else -1)
    keep = np.isfinite(reps).all(axis=0)
    reps = reps[:, keep]
    b = reps.shape[1]
    pairs = []
    for r, s in itertools.combinations(range(len(est)), 2):
        d = reps[s] - reps[r]
        se = d.std(ddof=1)
        if se > 0:
            pairs.append((r, s, (est[s] - est[r]), se, np.abs(d - (est[s] - est[r])) / se))
        elif est[s] != est[r]:  # the same nonzero difference in every resample
            pairs.append((r, s, (est[s] - est[r]), 0.0, np.zeros(b)))
    active = set(range(len(pairs)))
    declared = set()
    while active:
        maxima = np.max([pairs[p][4] for p in active], axis=0)
        critical = np.sort(maxima)[math.ceil(level * b - 1e-9) - 1]
        new = {p for p in active if (abs(pairs[p][2]) / pairs[p][3] if pairs[p][3] else math.inf) > critical}
        if not new:
            break
        declared |= new
        active -= new
        if single_step:
            break
    worse = np.zeros(len(est), bool)
    for p in declared:
        r, s, d, *_ = pairs[p]
        worse[r if d > 0 else s] = True
    return worse


def correlated_detectors(rng, rows, n, *, shifts, correlation=0.8):
    """ID and OOD scores of ``rows`` detectors on the same images: a shared component (correlation) and each
    detector's own noise; ``shifts`` set the detectors' separations (equal shifts: equal true AUROC)."""
    common_id, common_ood = rng.normal(size=n), rng.normal(size=n)
    own = math.sqrt(1 - correlation)
    ids = [math.sqrt(correlation) * common_id + own * rng.normal(size=n) + shift for shift in shifts]
    oods = [math.sqrt(correlation) * common_ood + own * rng.normal(size=n) for _ in range(rows)]
    return ids, oods


def test_matches_the_loop_reference_on_random_columns():
    rng = np.random.default_rng(0)
    for trial in range(20):
        rows = int(rng.integers(2, 8))
        truth = rng.normal(0, 0.02, rows)
        replicates = truth[:, None] + rng.normal(0, 0.01, (rows, 300)) + rng.normal(0, 0.01, 300)[None]
        estimates = truth + rng.normal(0, 0.005, rows)
        if trial % 4 == 0:
            replicates[0, rng.integers(0, 300, 5)] = np.nan  # resamples with a NaN are left out
        for higher in (True, False):
            got = worse_than_best(torch.tensor(estimates), torch.tensor(replicates), 0.95, higher_is_better=higher)
            assert got.tolist() == stepdown_reference(estimates, replicates, 0.95, higher).tolist()


def test_hand_built_columns():
    base = torch.linspace(-1, 1, 200)
    # a far below b and c; b and c indistinguishable
    replicates = torch.stack([0.5 + 0.01 * base, 0.9 + 0.01 * base, 0.9 + 0.01 * base.flip(0)])
    assert worse_than_best(torch.tensor([0.5, 0.9, 0.9]), replicates).tolist() == [True, False, False]
    # lower is better: the 0.9 rows are the worse ones
    assert worse_than_best(torch.tensor([0.5, 0.9, 0.9]), replicates, higher_is_better=False).tolist() == \
        [False, True, True]
    # the best row and rows tied with it are never marked; a NaN estimate is never marked
    assert worse_than_best(torch.tensor([0.9, 0.9]), replicates[1:]).tolist() == [False, False]
    assert worse_than_best(torch.tensor([float("nan"), 0.9, 0.9]), replicates).tolist() == [False, False, False]
    # no spread in the difference: both rows perfectly separated in every resample, no mark; the same nonzero
    # difference in every resample, a mark
    ones = torch.ones(2, 50)
    assert worse_than_best(torch.tensor([1.0, 1.0]), ones).tolist() == [False, False]
    shifted = torch.stack([0.9 + 0.01 * base, 0.899 + 0.01 * base])
    assert worse_than_best(torch.tensor([0.9, 0.899]), shifted).tolist() == [False, True]
    assert worse_than_best(torch.tensor([0.7]), torch.ones(1, 20)).tolist() == [False]


def test_a_paired_difference_is_found_where_marginal_intervals_overlap():
    rng = np.random.default_rng(1)
    id_scores, ood_scores = torch.tensor(rng.normal(1, 1, 400)), torch.tensor(rng.normal(0, 1, 400))
    a = bootstrap_auroc(id_scores, ood_scores, 400, 0)
    b = bootstrap_auroc(id_scores + 0.08, ood_scores, 400, 0)  # the same images: the same resamples
    estimates = torch.tensor([float(a.mean()), float(b.mean())])
    assert worse_than_best(estimates, torch.stack([a, b])).tolist() == [True, False]


def test_stepdown_declares_at_least_what_the_single_step_does():
    # A far below B (declared at the first step); C 2.2 standard errors below B: beyond the critical
    # value of one pair (~1.96) but within that of three (~2.4), so only the step down declares it
    rng = np.random.default_rng(3)
    truth = np.array([0.0, 0.1, 0.1 - 2.2 * 0.01 * math.sqrt(2)])
    found_more = 0
    for _ in range(10):
        replicates = truth[:, None] + rng.normal(0, 0.01, (3, 2000))
        got = worse_than_best(torch.tensor(truth), torch.tensor(replicates)).numpy()
        single = stepdown_reference(truth, replicates, single_step=True)
        assert (got >= single).all() and not got[1] and got[0]
        found_more += bool(got[2] and not single[2])
    assert found_more >= 5  # the stepdown is more powerful


def test_family_wise_error_of_ten_equal_detectors_before_and_after():
    """The bug: each row tested alone against a best chosen from the same data (95%) marks a false ▼ in most
    columns of 10 equal detectors; worse_than_best keeps the chance of any false ▼ near 5%."""
    rng = np.random.default_rng(7)
    repetitions, rows, n = 60, 10, 200
    before = after = 0
    for _ in range(repetitions):
        ids, oods = correlated_detectors(rng, rows, n, shifts=[1.0] * rows)
        seed = int(rng.integers(1 << 30))
        replicates = torch.stack([bootstrap_auroc(torch.tensor(i), torch.tensor(o), 200, seed)
                                  for i, o in zip(ids, oods, strict=True)])
        estimates = torch.tensor([auroc(torch.tensor(i), torch.tensor(o)) for i, o in zip(ids, oods, strict=True)])
        best = int(estimates.argmax())
        before += any(paired_difference(replicates[r], replicates[best])[2] for r in range(rows) if r != best)
        after += bool(worse_than_best(estimates, replicates).any())
    assert before / repetitions > 0.3  # per pair: a false ▼ in most columns
    assert after / repetitions <= 0.12  # simultaneous: about 5% (Monte-Carlo error at 60 repetitions)


def test_share_first_is_the_probability_first_count_and_favours_the_leader():
    rng = np.random.default_rng(9)
    ids, oods = correlated_detectors(rng, 10, 300, shifts=[1.0] * 10)
    replicates = torch.stack([bootstrap_auroc(torch.tensor(i), torch.tensor(o), 300, 4)
                              for i, o in zip(ids, oods, strict=True)])
    shares = share_first(replicates)
    torch.testing.assert_close(shares, probability_first(replicates))
    estimates = [float((i[:, None] > o[None, :]).mean()) for i, o in zip(ids, oods, strict=True)]
    assert float(shares[int(np.argmax(estimates))]) > 2 / 10  # equal truths, yet the leader ranks first often


@pytest.mark.parametrize(("call", "message"), [
    (lambda: worse_than_best(torch.zeros(3), torch.zeros(2, 10)), r"\(R, B\)"),
    (lambda: worse_than_best(torch.zeros(2), torch.zeros(2, 10), level=1.0), "level"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
