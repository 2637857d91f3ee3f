"""metrics.per_class_auroc against sklearn's roc_auc_score class by class (with ties), numpy's std, a hand-computed
case, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from metrics import auroc, per_class_auroc


def labelled(seed: int, classes: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Scores rounded to 0.1 (many ties within and across classes and OOD), classes of unequal size, negatives -1
    and unknowns -2."""
    rng = np.random.default_rng(seed)
    known = rng.integers(0, classes, size=400)
    target = np.r_[known, np.full(90, -1), np.full(130, -2)]
    shift = np.r_[known / classes, np.zeros(220)]
    scores = np.round(rng.normal(0, 1, size=target.size) + shift + (target >= 0) * 0.6, 1)
    return scores, target


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("unknown_label", [None, -1, -2])
def test_every_class_against_sklearn_with_ties(seed, unknown_label) -> None:
    scores, target = labelled(seed)
    result = per_class_auroc(torch.from_numpy(scores), torch.from_numpy(target), unknown_label=unknown_label,
                             num_classes=7)
    ood = target < 0 if unknown_label is None else target == unknown_label
    expected = []
    for c in range(7):
        mine = target == c
        expected.append(roc_auc_score(np.r_[np.ones(mine.sum()), np.zeros(ood.sum())],
                                      np.r_[scores[mine], scores[ood]]))
        # exactly the project's AUROC of the class against the OOD samples
        assert result.auroc[c].item() == auroc(torch.from_numpy(scores[mine]), torch.from_numpy(scores[ood]))
    expected = np.array(expected)
    assert result.auroc.dtype == torch.float64 and result.classes.tolist() == list(range(7))
    np.testing.assert_allclose(result.auroc.numpy(), expected, rtol=0, atol=1e-15)
    assert result.counts.tolist() == np.bincount(target[target >= 0], minlength=7).tolist()
    assert result.num_ood == ood.sum()
    assert result.mean == pytest.approx(expected.mean(), abs=1e-15)
    assert result.std == pytest.approx(np.std(expected), abs=1e-15)  # population: numpy's ddof=0
    assert result.min == pytest.approx(expected.min(), abs=1e-15)
    assert result.max == pytest.approx(expected.max(), abs=1e-15)
    assert result.range == pytest.approx(np.ptp(expected), abs=1e-15)
    assert result.worst_class == int(np.argmin(expected))
    sample = per_class_auroc(torch.from_numpy(scores), torch.from_numpy(target), unknown_label=unknown_label, ddof=1)
    assert sample.std == pytest.approx(np.std(expected, ddof=1), abs=1e-15)
    assert torch.equal(sample.auroc, result.auroc)


def test_hand_computed() -> None:
    # class 0: scores 1, 3; class 2 (class 1 absent): 0.5; OOD: a negative at 2, an unknown at 0
    # class 0: pairs 1<2, 1>0, 3>2, 3>0 -> 3/4; class 2: 0.5<2, 0.5>0 -> 1/2; mean 0.625, population std 0.125
    scores = torch.tensor([1.0, 3.0, 0.5, 2.0, 0.0])
    target = torch.tensor([0, 0, 2, -1, -2])
    result = per_class_auroc(scores, target)
    assert result.classes.tolist() == [0, 2] and result.auroc.tolist() == [0.75, 0.5]
    assert (result.mean, result.std, result.min, result.max, result.range) == (0.625, 0.125, 0.5, 0.75, 0.25)
    assert result.worst_class == 2 and result.ddof == 0 and result.num_ood == 2
    # against the unknowns only (score 0): both classes are perfect; against the negatives only (score 2): 0.5, 0
    assert per_class_auroc(scores, target, unknown_label=-2).auroc.tolist() == [1.0, 1.0]
    negatives = per_class_auroc(scores, target, unknown_label=-1)
    assert negatives.auroc.tolist() == [0.5, 0.0] and negatives.std == 0.25
    # a tie counts one half: class 0 at 2 and 2 against OOD 2 -> 1/2
    assert per_class_auroc(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0, 0, -2])).auroc.tolist() == [0.5]


def test_bad_input_is_refused_naming_it() -> None:
    scores, target = torch.tensor([1.0, 2.0, 0.0, 0.5]), torch.tensor([0, 2, -1, -2])
    with pytest.raises(ValueError, match=r"class 1 has no test sample \(classes without one: \[1\] of 0..2\)"):
        per_class_auroc(scores, target, num_classes=3)
    with pytest.raises(ValueError, match="target holds label 2 but there are 2 known classes"):
        per_class_auroc(scores, target, num_classes=2)
    with pytest.raises(ValueError, match="needs OOD samples"):
        per_class_auroc(scores[:2], target[:2])
    with pytest.raises(ValueError, match="needs label -2 samples"):
        per_class_auroc(scores[:3], target[:3], unknown_label=-2)
    with pytest.raises(ValueError, match="needs known samples"):
        per_class_auroc(scores[2:], target[2:])
    with pytest.raises(ValueError, match="unknown_label must be None"):
        per_class_auroc(scores, target, unknown_label=-3)
    with pytest.raises(ValueError, match="target holds label -3"):
        per_class_auroc(scores, torch.tensor([0, 2, -1, -3]))
    with pytest.raises(ValueError, match="ddof = 2 leaves no degree of freedom for the standard deviation of 2"):
        per_class_auroc(scores, target, ddof=2)
    with pytest.raises(ValueError, match="scores contains NaN or infinite values in 1 rows"):
        per_class_auroc(torch.tensor([1.0, float("nan"), 0.0, 0.5]), target)
    with pytest.raises(ValueError, match=r"target must have shape \(N,\) with N = 4"):
        per_class_auroc(scores, target[:3])
    with pytest.raises(TypeError, match="integer labels"):
        per_class_auroc(scores, target.double())
