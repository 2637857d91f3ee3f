"""Any pytorch-ood detector by name (:mod:`metrics.detectors.pood`): it scores as pytorch-ood and as ours, its
outlier scores negated, its fitted state fingerprinted by its fit data."""

from __future__ import annotations

import pytest
import torch

from metrics.detectors import DetectorNotFitted, build_detector
from tests.metrics.detectors.helpers import ATOL, KNN_ATOL, fit_data, fitted, outputs, pood_in_float64


def test_pood_wrapper_scores_as_pytorch_ood_and_as_ours(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data, scored = fit_data(features, targets, head), outputs(test, head)
    with pood_in_float64():  # the wrapper hands pytorch-ood tensors in the default dtype
        wrapped = {name: fitted(f"pood:{name}", data, head, **kw).score(scored) for name, kw in
                   [("KNN", {"k": 5}), ("Mahalanobis", {}), ("ViM", {"d": 8}), ("ASH", {"variant": "ash-b"}),
                    ("EnergyBased", {})]}
    torch.testing.assert_close(wrapped["KNN"], fitted("knn", data, head, k=5).score(scored), rtol=1e-5, atol=KNN_ATOL)
    torch.testing.assert_close(wrapped["Mahalanobis"], fitted("mahalanobis", data, head).score(scored),
                               rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(wrapped["ViM"], fitted("vim", data, head, d=8).score(scored), rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(wrapped["ASH"], fitted("ash_b", data, head, percentile=0.65).score(scored),
                               rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(wrapped["EnergyBased"], torch.logsumexp(scored["logits"], dim=1), rtol=1e-12, atol=0)
    detector = build_detector("pood:KNN", k=3)
    assert detector.name == "pood:KNN" and detector.fit_data and detector.inputs == {"features"}
    assert build_detector("pood:ViM", d=4).inputs == {"features", "head"}
    assert not build_detector("pood:GEN").needs_fit and build_detector("pood:GEN").inputs == {"logits"}


def test_pood_state_fingerprint_follows_the_fit_data_and_a_loaded_one_must_be_refitted(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data = fit_data(features, targets, head)
    knn = fitted("pood:KNN", data, head, k=3)
    assert fitted("pood:KNN", data, head, k=3).state_fingerprint() == knn.state_fingerprint()
    assert fitted("pood:KNN", fit_data(features[1:], targets[1:], head), head, k=3).state_fingerprint() != \
        knn.state_fingerprint()
    assert fitted("pood:KNN", data, head, k=4).state_fingerprint() != knn.state_fingerprint()
    fresh = build_detector("pood:KNN", k=3)
    fresh.load_state_dict(knn.state_dict())
    assert fresh.state_fingerprint() == knn.state_fingerprint()
    with pytest.raises(DetectorNotFitted, match="not part of a state_dict; fit it again"):
        fresh.score(outputs(test, head))
    ash = fitted("pood:ASH", data, head)  # head only: rebuilt from the head buffers
    loaded = build_detector("pood:ASH")
    loaded.load_state_dict(ash.state_dict())
    assert torch.equal(loaded.score(outputs(test, head)), ash.score(outputs(test, head)))


def test_pytorch_ood_adapter_negates_outlier_scores():
    from pytorch_ood.detector import MaxSoftmax

    from metrics import build_detector

    logits = torch.randn(9, 4)
    scores = build_detector("pood:MaxSoftmax").score({"logits": logits})
    torch.testing.assert_close(scores, -MaxSoftmax(model=None).predict_logits(logits).double())
    torch.testing.assert_close(scores, torch.softmax(logits.double(), 1).max(1).values, rtol=1e-6, atol=1e-7)
