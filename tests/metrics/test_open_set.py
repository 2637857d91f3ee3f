"""open_set_report against independent references: every scalar, both CCR conventions, width checks."""

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from metrics import (
    ccr_at_fpr,
    closed_set_accuracy,
    fpr_key,
    gamma,
    max_known_score,
    open_set_report,
    oscr_curve,
)
from tests.metrics.reference import (
    authors_ccr_at_fpr_reference,
    ccr_at_fpr_reference,
    gamma_reference,
    random_open_set_data,
)

TARGETS = [1e-3, 1e-2, 1e-1, 1.0]


@pytest.mark.parametrize("background", [False, True])
def test_every_scalar_against_references(background):
    probs, target = random_open_set_data(np.random.default_rng(21), n=400, k=4, background=background)
    report = open_set_report(torch.from_numpy(probs), torch.from_numpy(target), background=background,
                             conventions=("exact", "authors"))
    scalars = report["scalars"]
    known_probs = probs[:, :-1] if background else probs
    known = target >= 0
    for group, label in (("negatives", -1), ("unknowns", -2)):
        exact = [scalars[f"{group}/{fpr_key(t)}"] for t in TARGETS]
        np.testing.assert_array_equal(exact, ccr_at_fpr_reference(probs, target, TARGETS, label, background))
        authors = [scalars[f"{group}/{fpr_key(t, 'authors')}"] for t in TARGETS]
        np.testing.assert_array_equal(authors, authors_ccr_at_fpr_reference(probs, target, TARGETS, label, background))
        members = known | (target == label)
        expected_auroc = roc_auc_score(known[members], known_probs[members].max(1))
        assert scalars[f"{group}/auroc"] == pytest.approx(expected_auroc, abs=1e-12)
        assert report["counts"][group] == int((target == label).sum())
    assert scalars["closed_set_accuracy"] == pytest.approx((known_probs[known].argmax(1) == target[known]).mean())
    keep = target >= -1
    assert scalars["gamma"] == pytest.approx(gamma_reference(probs[keep], target[keep], background=background)[2])
    np.testing.assert_array_equal(report["scores"]["unknowns_max"].numpy(), known_probs[target == -2].max(1))


def test_without_negatives_there_is_no_gamma_and_no_negative_group():
    probs, target = random_open_set_data(np.random.default_rng(3), n=60, k=3)
    target[target == -1] = -2
    report = open_set_report(torch.from_numpy(probs), torch.from_numpy(target))
    assert "gamma" not in report["scalars"] and "negatives" not in report["curves"]
    assert report["counts"]["negatives"] == 0 and "unknowns/auroc" in report["scalars"]


def test_fpr_key_and_bad_convention():
    assert fpr_key(1e-3) == "ccr@fpr=0.001" and fpr_key(0.1, "authors") == "authors_ccr@fpr=0.1"
    with pytest.raises(ValueError, match="convention must be one of"):
        open_set_report(torch.tensor([[1.0, 0.0]]), torch.tensor([0]), conventions=("paper",))


@pytest.mark.parametrize("background", [False, True])
def test_report_equals_the_public_functions(background):
    # the report validates once and calls the unvalidated helpers: their results are the public ones, bit
    # for bit (γ without selecting the known and negative rows first, the curves from one shared pass)
    probs, target = map(torch.from_numpy, random_open_set_data(np.random.default_rng(8), n=500, k=5,
                                                                background=background))
    report = open_set_report(probs, target, background=background, conventions=("exact", "authors"))
    for group, label in (("negatives", -1), ("unknowns", -2)):
        for a, b in zip(report["curves"][group], oscr_curve(probs, target, label, background), strict=True):
            assert torch.equal(a, b)
        authors = [report["scalars"][f"{group}/{fpr_key(t, 'authors')}"] for t in TARGETS]
        torch.testing.assert_close(torch.tensor(authors, dtype=torch.float64), ccr_at_fpr(
            probs, target, TARGETS, label, background, convention="authors"), rtol=0, atol=0, equal_nan=True)
        members = target == label
        assert torch.equal(report["scores"][f"{group}_max"], max_known_score(probs, background)[members])
    assert report["scalars"]["closed_set_accuracy"] == closed_set_accuracy(probs, target, background).item()
    keep = target >= -1
    expected = gamma(probs[keep], target[keep], background=background)
    assert [report["scalars"][k] for k in ("gamma_plus", "gamma_minus", "gamma")] == [v.item() for v in expected]
