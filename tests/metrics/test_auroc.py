import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from metrics import OODAUROC, auroc


@pytest.mark.parametrize("seed", range(5))
def test_against_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    id_scores = np.round(rng.normal(0.5, 1, size=200), 1)
    ood_scores = np.round(rng.normal(0, 1, size=150), 1)
    expected = roc_auc_score(np.r_[np.ones(200), np.zeros(150)], np.r_[id_scores, ood_scores])
    assert auroc(torch.from_numpy(id_scores), torch.from_numpy(ood_scores)) == pytest.approx(expected, abs=1e-15)


def test_hand_computed():
    # pairs (id, ood): 1>0, 1<2, 2>0, 2=2 (1/2), 3>0, 3>2 -> 4.5 / 6
    assert auroc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 2.0])) == 0.75
    assert auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5


def test_large_scores_are_not_saturated():
    # logits-like scores far outside [0, 1]: a sigmoid would make 60 and 70 equal in float64
    assert auroc(torch.tensor([70.0, 80.0]), torch.tensor([60.0, 65.0])) == 1.0


def test_stateful_matches_function():
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4])
    is_id = torch.tensor([0, 1, 0, 1, 0])
    metric = OODAUROC()
    metric.update(scores[:2], is_id[:2], torch.tensor([0, 1]))
    metric.update(scores[1:], is_id[1:], torch.tensor([1, 2, 3, 4]))  # index 1 repeated (padding)
    assert metric.compute().item() == auroc(scores[is_id == 1], scores[is_id == 0])


def test_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        auroc(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="both ID and OOD"):
        auroc(torch.tensor([1.0]), torch.tensor([]))
