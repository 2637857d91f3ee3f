"""Metrics refuse what is not a probability table with project labels (fails before the checks existed)."""

from unittest import mock

import numpy as np
import pytest
import torch

import metrics._validation as validation
from metrics import (
    Gamma,
    authors_oscr_curve,
    ccr_at_fpr,
    closed_set_accuracy,
    gamma,
    open_set_report,
    oscr_curve,
)
from metrics._validation import check_finite, check_probabilities, check_probs_and_target
from tests.metrics.reference import random_open_set_data

PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]])
TARGET = torch.tensor([0, 1, -1, -2])


@pytest.mark.parametrize("metric", [lambda p, t: oscr_curve(p, t), lambda p, t: gamma(p, t),
                                    lambda p, t: ccr_at_fpr(p, t, [0.1]), lambda p, t: open_set_report(p, t)])
def test_logits_are_refused(metric):
    logits = torch.log(PROBS) * 3  # negative values
    with pytest.raises(ValueError, match="looks like logits"):
        metric(logits, TARGET)
    scaled = PROBS * 0.5  # inside [0, 1] but rows sum to 0.5
    with pytest.raises(ValueError, match="row 0 sums to 0.5"):
        metric(scaled, TARGET)


def test_rows_within_tolerance_are_scored_as_given():
    # rounded rows (sums 0.99 and 1.01) pass the check and are scored as they are, not renormalised
    rounded = torch.tensor([[0.40, 0.30, 0.29], [0.5, 0.25, 0.26], [0.2, 0.7, 0.11], [0.1, 0.3, 0.61]])
    target = torch.tensor([0, -2, 1, -2])
    fpr, ccr, thresholds = oscr_curve(rounded, target)
    # the OSCR formula in numpy: at each distinct score t, CCR(t) the share of knowns classified correctly with
    # their class's probability above t, FPR(t) the share of unknowns whose largest probability is above t
    probs, labels = rounded.numpy().astype(np.float64), target.numpy()
    known = labels >= 0
    correct = probs[known].argmax(axis=1) == labels[known]
    known_scores = probs[known, labels[known]]
    unknown_scores = probs[labels == -2].max(axis=1)
    expected = np.unique(np.r_[known_scores, unknown_scores])[::-1]
    np.testing.assert_allclose(thresholds.numpy(), expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ccr.numpy(), [np.mean(correct & (known_scores > t)) for t in expected])
    np.testing.assert_allclose(fpr.numpy(), [np.mean(unknown_scores > t) for t in expected])


def test_labels_below_minus_two_are_refused():
    with pytest.raises(ValueError, match="label -3"):
        oscr_curve(PROBS, torch.tensor([0, 1, -3, -2]))
    with pytest.raises(ValueError, match="label -7"):
        gamma(PROBS, torch.tensor([0, -7, -1, -2]))


def test_background_column_without_background_flag_is_refused():
    # a K = 2 background-class model gives (N, 3) probabilities: as K = 3 they would be silently misread
    with pytest.raises(ValueError, match="pass background=True"):
        gamma(PROBS, TARGET, num_classes=2)
    with pytest.raises(ValueError, match="pass background=True"):
        open_set_report(PROBS, TARGET, num_classes=2)
    metric = Gamma(num_classes=2)
    metric.update(PROBS, TARGET, torch.arange(4))
    with pytest.raises(ValueError, match="pass background=True"):
        metric.compute()
    # the same input with the flag: background dropped after the softmax, values from the two known columns
    plus, minus, _ = gamma(PROBS, TARGET, background=True, num_classes=2)
    assert plus.item() == pytest.approx((0.7 + 0.6) / 2)
    assert minus.item() == pytest.approx(1 - 0.3)
    with pytest.raises(ValueError, match="3 columns but the model has 3 known classes plus a background"):
        gamma(PROBS, TARGET, background=True, num_classes=3)


# --- the fused check (one min/max pass, one row-sum pass, labels once) still refuses every bad input ------

EVERY_METRIC = [
    lambda p, t: oscr_curve(p, t),
    lambda p, t: authors_oscr_curve(p, t),
    lambda p, t: ccr_at_fpr(p, t, [0.1]),
    lambda p, t: ccr_at_fpr(p, t, [0.1], convention="authors"),
    lambda p, t: closed_set_accuracy(p, t),
    lambda p, t: gamma(p, t),
    lambda p, t: open_set_report(p, t, conventions=("exact", "authors")),
]


def _table(n=50, k=4, seed=0):
    probs, target = random_open_set_data(np.random.default_rng(seed), n=n, k=k, decimals=6)
    probs = torch.from_numpy(probs)
    return probs / probs.sum(dim=1, keepdim=True), torch.from_numpy(target)


@pytest.mark.parametrize("metric", EVERY_METRIC)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_value_in_one_row_is_named(metric, bad):
    probs, target = _table()
    probs[17, 2] = bad
    with pytest.raises(ValueError, match=r"probs contains NaN or infinite values in 1 rows \(first rows: \[17\]\)"):
        metric(probs, target)


def test_non_finite_is_reported_before_range_and_sums():
    probs, target = _table()
    probs[3] *= 7  # out of range and not summing to 1 ...
    probs[9, 0] = float("nan")  # ... but the NaN is what the message names
    probs[40, 1] = float("inf")
    with pytest.raises(ValueError, match=r"in 2 rows \(first rows: \[9, 40\]\)"):
        oscr_curve(probs, target)


@pytest.mark.parametrize("metric", EVERY_METRIC)
def test_values_above_one_or_below_zero_are_refused_with_their_range(metric):
    probs, target = _table()
    above = probs.clone()
    above[5] = torch.tensor([2.5, -1.0, -0.25, -0.25])  # sums to 1, but no probabilities
    with pytest.raises(ValueError, match=r"found values from -1 to 2\.5: this looks like logits"):
        metric(above, target)
    below = probs.clone()
    below[0, 0] = -1e-3
    with pytest.raises(ValueError, match=r"\[0, 1\], found values from -0\.001 to"):
        metric(below, target)


@pytest.mark.parametrize("metric", EVERY_METRIC)
def test_row_not_summing_to_one_is_named_with_its_sum(metric):
    probs, target = _table()
    probs[23] *= 0.9  # sums to 0.9; every other row to 1
    with pytest.raises(ValueError, match="but row 23 sums to 0.9:"):
        metric(probs, target)
    probs[23] /= 0.9
    probs[31] *= 1.06
    with pytest.raises(ValueError, match="but row 31 sums to 1.06:"):
        metric(probs, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tolerance_edge_is_decided_in_float64(dtype):
    # float32 sums decide only far from the edge; within ROW_SUM_MARGIN of it the float64 sums decide, as
    # before the fusion: 0.001 inside the tolerance passes, 0.001 outside fails and is named
    k = 4
    near = torch.full((3, k), 1.0 / k, dtype=torch.float64)
    near[1] *= 1 + validation.PROBABILITY_SUM_TOLERANCE - 0.001
    near[2] *= 1 - validation.PROBABILITY_SUM_TOLERANCE + 0.001
    check_probabilities(near.to(dtype))
    near[2] = (1 - validation.PROBABILITY_SUM_TOLERANCE - 0.001) / k
    with pytest.raises(ValueError, match="row 2 sums to 0.949:"):
        check_probabilities(near.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sums(dtype):
    check_probabilities(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.2265625]], dtype=dtype))  # 1 and 0.977
    with pytest.raises(ValueError, match="row 1 sums to 0.9375:"):  # every value exact in both dtypes
        check_probabilities(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.1875]], dtype=dtype))


@pytest.mark.parametrize("metric", EVERY_METRIC)
def test_labels_out_of_range_and_below_minus_two_are_refused(metric):
    probs, target = _table(k=4)
    too_high = target.clone()
    too_high[7] = 4
    with pytest.raises(ValueError, match="target holds label 4 but probs cover only 4 known classes"):
        metric(probs, too_high)
    too_low = target.clone()
    too_low[11] = -3
    with pytest.raises(ValueError, match="target holds label -3; labels are known 0..3"):
        metric(probs, too_low)


def test_half_precision_tables_are_checked_too():
    probs, target = _table()
    for dtype in (torch.float16, torch.bfloat16):
        half = probs.to(dtype)
        half[4, 1] = float("nan")
        with pytest.raises(ValueError, match=r"first rows: \[4\]"):
            oscr_curve(half, target)
        with pytest.raises(ValueError, match="looks like logits"):
            oscr_curve(probs.to(dtype) * 3, target)


def test_standalone_checks_keep_their_behaviour():
    # used by metrics.ensemble on single members: finiteness and probabilities checked separately
    check_finite(torch.tensor([0.5, 1e30]), name="scores")
    check_finite(torch.empty(0), name="scores")
    check_finite(torch.tensor([1, 2]), name="labels")  # integers are always finite
    with pytest.raises(ValueError, match=r"scores contains NaN or infinite values in 2 rows \(first rows: \[1, 3\]\)"):
        check_finite(torch.tensor([0.0, float("nan"), 1.0, float("-inf")]), name="scores")
    check_probabilities(torch.empty(0, 3))
    with pytest.raises(ValueError, match=r"member\[2\] must be probabilities in \[0, 1\], found values from 0 to 3"):
        check_probabilities(torch.tensor([[0.0, 3.0]]), name="member[2]")


@mock.patch.object(validation, "check_labels", wraps=validation.check_labels)
@mock.patch.object(validation, "check_probability_table", wraps=validation.check_probability_table)
def test_open_set_report_validates_once(table_check, label_check):
    probs, target = _table(n=200, k=4, seed=5)
    report = open_set_report(probs, target, conventions=("exact", "authors"))
    # both groups, both conventions, accuracy, AUROCs and γ were computed ...
    assert set(report["curves"]) == {"negatives", "unknowns"} and "gamma" in report["scalars"]
    assert "unknowns/authors_ccr@fpr=0.1" in report["scalars"]
    # ... from one validation of the table and of the labels
    assert table_check.call_count == 1 and label_check.call_count == 1
    assert table_check.call_args.kwargs == {"name": "probs"}
    label_check.assert_called_once_with(mock.ANY, num_known=4)


@pytest.mark.parametrize("convention", ["exact", "authors"])
@mock.patch.object(validation, "check_labels", wraps=validation.check_labels)
@mock.patch.object(validation, "check_probability_table", wraps=validation.check_probability_table)
def test_every_public_metric_validates_exactly_once(table_check, label_check, convention):
    probs, target = _table(n=100, k=4, seed=6)
    for metric in (lambda: ccr_at_fpr(probs, target, [0.01, 0.1], convention=convention),
                   lambda: oscr_curve(probs, target), lambda: authors_oscr_curve(probs, target),
                   lambda: closed_set_accuracy(probs, target), lambda: gamma(probs, target)):
        table_check.reset_mock()
        label_check.reset_mock()
        metric()
        assert (table_check.call_count, label_check.call_count) == (1, 1)


def test_validated_tensors_are_the_inputs_not_copies():
    # float32 probabilities and int64 labels pass through without a copy (only the background view differs)
    probs, target = _table()
    checked, labels, num_known = check_probs_and_target(probs, target, background=False)
    assert checked.data_ptr() == probs.data_ptr() and labels.data_ptr() == target.data_ptr() and num_known == 4
    with_background, _, k = check_probs_and_target(torch.cat([probs * 0.5, 0.5 * torch.ones(50, 1)], dim=1), target,
                                                   background=True)
    assert k == 4 and with_background.shape == (50, 4)
