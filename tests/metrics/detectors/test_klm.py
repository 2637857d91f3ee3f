"""KL matching (:mod:`metrics.detectors.klm`) against pytorch-ood, against OpenOOD's postprocessor written here in
numpy (scipy's ``entropy``, one-hot posteriors for unpredicted classes), by hand, and its declared fit split."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from scipy.stats import entropy

from metrics.detectors import build_detector
from tests.metrics.detectors.helpers import (
    assert_matches,
    generator,
    logits_of,
    make_features,
    make_head,
    pood_in_float64,
)


def klm_logits(grid: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fit and test logits of the shared features and head; with ``grid``, rounded to it (equal logits: ties of
    the prediction and equal posteriors)."""
    head = make_head()
    features, targets = make_features(grid=grid)
    test, _ = make_features(80, seed=5, grid=grid)
    test = torch.cat([test, torch.relu(torch.randn(40, features.shape[1], generator=generator(6),
                                                   dtype=torch.float64) * 1.5)])
    fit, scored = logits_of(features, head), logits_of(test, head)
    if grid is not None:
        fit, scored = (torch.round(x / grid) * grid for x in (fit, scored))
        scored = torch.cat([scored, fit[:10]])
    return fit, targets, scored


def openood_klm(fit_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """OpenOOD's ``KLMatchingPostprocessor``: the mean softmax of the fit samples predicted as each class (a one-hot
    for a class predicted for none), the score minus the smallest ``scipy.stats.entropy(p, d_c)``."""
    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    classes = fit_logits.shape[1]
    p_fit, predicted = softmax(fit_logits), fit_logits.argmax(axis=1)
    typical = []
    for c in range(classes):
        if (predicted == c).sum() == 0:
            typical.append(np.eye(classes)[c])
        else:
            typical.append(p_fit[predicted == c].mean(axis=0))
    p = softmax(logits)
    return -np.array([min(entropy(row, d) for d in typical) for row in p])


@pytest.mark.parametrize("grid", [None, 0.5])
def test_klm_matches_pytorch_ood_and_openood(grid) -> None:
    """pytorch-ood to 1e-14 absolute (measured: 6e-16); OpenOOD's form to 1e-13 (measured: 7e-16)."""
    fit, targets, scored = klm_logits(grid)
    detector = build_detector("klm").fit({"logits": fit, "targets": targets})
    ours = detector.score({"logits": scored})
    with pood_in_float64():
        theirs = pood.KLMatching(None).fit_logits(fit, targets).predict_logits(scored)
    assert_matches(ours, theirs, atol=1e-14)
    torch.testing.assert_close(ours, -theirs.double(), rtol=0, atol=1e-14)
    np.testing.assert_allclose(ours.numpy(), openood_klm(fit.numpy(), scored.numpy()), rtol=0, atol=1e-13)


def test_klm_leaves_out_a_class_no_fit_sample_is_predicted_as() -> None:
    """Class 2 is never predicted: OpenOOD's one-hot posterior there is infinitely far from every softmax, so the
    minimum over the predicted classes, pytorch-ood's and the project's, is OpenOOD's."""
    g = generator(8)
    fit = torch.randn(200, 3, generator=g, dtype=torch.float64)
    fit[:, 2] -= 10
    scored = torch.randn(30, 3, generator=g, dtype=torch.float64) * 2
    detector = build_detector("klm").fit({"logits": fit, "targets": torch.zeros(200, dtype=torch.long)})
    assert detector.typical_classes.tolist() == [0, 1] and detector.typical.shape == (2, 3)
    ours = detector.score({"logits": scored})
    np.testing.assert_allclose(ours.numpy(), openood_klm(fit.numpy(), scored.numpy()), rtol=0, atol=1e-13)
    with pood_in_float64():
        theirs = pood.KLMatching(None).fit_logits(fit).predict_logits(scored)
    torch.testing.assert_close(ours, -theirs.double(), rtol=0, atol=1e-14)


def test_klm_by_hand() -> None:
    """Fit logits (0, 0) [predicted 0: softmax (½, ½)] and (ln 3, 0) [predicted 0: (¾, ¼)], and (0, ln 4)
    [predicted 1: (⅕, ⅘)]: d_0 = (⅝, ⅜), d_1 = (⅕, ⅘). A sample with softmax (½, ½) has KL ½ ln(½/⅝) +
    ½ ln(½/⅜) to d_0 and ½ ln(½/⅕) + ½ ln(½/⅘) to d_1."""
    fit = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [0.0, math.log(4)]], dtype=torch.float64)
    detector = build_detector("klm").fit({"logits": fit, "targets": torch.tensor([0, 0, 1])})
    torch.testing.assert_close(detector.typical, torch.tensor([[5 / 8, 3 / 8], [1 / 5, 4 / 5]], dtype=torch.float64),
                               rtol=1e-15, atol=0)
    to_0 = 0.5 * math.log(0.5 / (5 / 8)) + 0.5 * math.log(0.5 / (3 / 8))
    to_1 = 0.5 * math.log(0.5 / (1 / 5)) + 0.5 * math.log(0.5 / (4 / 5))
    # a background-class model: its last logit (100) is not part of the softmax
    background = build_detector("klm", background=True).fit(
        {"logits": torch.cat([fit, torch.full((3, 1), 100.0, dtype=torch.float64)], dim=1),
         "targets": torch.tensor([0, 0, 1])})
    for model, logits in ((detector, torch.tensor([[1.0, 1.0]])), (background, torch.tensor([[1.0, 1.0, 100.0]]))):
        assert model.score({"logits": logits.double()}).item() == pytest.approx(-min(to_0, to_1), rel=1e-14)


def test_klm_fits_on_the_validation_split_and_refuses_other_widths() -> None:
    cls = type(build_detector("klm"))
    assert cls.fit_split == "val" and cls.fit_data and cls.kind == "logits" and cls.hyperparameter_defaults() == {}
    fit, targets, _ = klm_logits(None)
    detector = build_detector("klm").fit({"logits": fit, "targets": targets})
    with pytest.raises(ValueError, match="'klm' was fitted on logits of 4 known classes; the logits to score have 5 "
                                         "known columns"):
        detector.score({"logits": torch.zeros(2, 5, dtype=torch.float64)})
    with pytest.raises(ValueError, match="'klm' has no hyperparameter 'temperature'; it takes none"):
        build_detector("klm", temperature=2.0)
