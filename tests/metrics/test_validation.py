"""Metrics refuse what is not a probability table with project labels (fails before the checks existed)."""

import pytest
import torch

from metrics import Gamma, ccr_at_fpr, gamma, open_set_report, oscr_curve

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


def test_rows_within_tolerance_pass():
    rounded = torch.tensor([[0.33, 0.33, 0.33], [0.5, 0.25, 0.26]])  # sums 0.99 and 1.01
    oscr_curve(rounded, torch.tensor([0, -2]))


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
