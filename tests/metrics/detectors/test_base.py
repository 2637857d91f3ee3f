"""The shared machinery of every detector (:mod:`metrics.detectors.base`), over every registry entry with a fit
or a head: the background-class rule, chunked scoring, state_dict round trips and fingerprints, bad input
refused by name, in-distribution above shifted data, the same bits on any number of threads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from metrics.detectors import DETECTORS, DetectorNotFitted, build_detector
from metrics.detectors import base as detector_base
from metrics.detectors import react as react_module
from tests.metrics.detectors.helpers import (
    ATOL,
    OUTPUT_DETECTORS,
    D,
    K,
    fit_data,
    fitted,
    generator,
    logits_of,
    nac_pass,
    outputs,
    pass_statistic,
)


def test_background_column_is_dropped_by_hand() -> None:
    # two known classes and a background logit of 100: GEN's softmax runs over the known logits only
    logits = torch.tensor([[2.0, 0.0, 100.0]], dtype=torch.float64)
    p = torch.softmax(torch.tensor([2.0, 0.0], dtype=torch.float64), dim=0)
    by_hand = -float((p ** 0.1 * (1 - p) ** 0.1).mean())
    assert build_detector("gen", background=True).score({"logits": logits}).item() == pytest.approx(by_hand, rel=1e-14)
    # ReAct's energy: the background row of the head does not enter
    head = (torch.tensor([[1.0, 0.0], [0.0, 1.0], [50.0, 50.0]], dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    features = torch.tensor([[1.0, 2.0], [3.0, 0.5]], dtype=torch.float64)
    react = build_detector("react", background=True, percentile=0.5).fit(
        {"features": features, "targets": torch.tensor([0, 1]), "logits": logits_of(features, head)}, head=head)
    assert float(react.threshold) == 1.5  # the median of the 4 activations 0.5, 1, 2, 3
    clipped = features.clamp(max=1.5)
    torch.testing.assert_close(react.score({"features": features}), torch.logsumexp(clipped, dim=1), rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_background_model_scores_as_the_model_without_its_background_column(setting, name) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    g = generator(7)
    with_background = (torch.cat([head[0], torch.randn(1, D, generator=g, dtype=torch.float64) * 3]),
                       torch.cat([head[1], torch.tensor([2.0], dtype=torch.float64)]))
    plain = fitted(name, fit_data(features, targets, head), head).score(outputs(test, head))
    detector = build_detector(name, background=True)
    if detector.needs_fit:
        detector.fit(fit_data(features, targets, with_background), head=with_background)
    torch.testing.assert_close(detector.score(outputs(test, with_background)), plain, rtol=1e-12, atol=ATOL)


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_scores_do_not_depend_on_the_chunk_size(setting, monkeypatch, name) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data, scored = fit_data(features, targets, head), outputs(test, head)
    reference = fitted(name, data, head).score(scored)
    monkeypatch.setattr(detector_base, "CHUNK_ROWS", 7)
    monkeypatch.setattr(detector_base, "CHUNK_ELEMENTS", 7 * 64)
    monkeypatch.setattr(react_module, "SELECTION_ELEMENTS", 50)
    torch.testing.assert_close(fitted(name, data, head).score(scored), reference, rtol=1e-12, atol=ATOL)


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_state_dict_round_trip_and_fingerprint(setting, name) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data, scored = fit_data(features, targets, head), outputs(test, head)
    detector = fitted(name, data, head)
    fresh = build_detector(name)
    fresh.load_state_dict(detector.state_dict())
    assert fresh.fitted
    assert torch.equal(fresh.score(scored), detector.score(scored))
    assert fresh.state_fingerprint() == detector.state_fingerprint()
    assert fitted(name, data, head).state_fingerprint() == detector.state_fingerprint()  # the same fit: the same
    if not detector.needs_fit:
        return
    if detector.fit_data:
        other = fit_data(features[1:], targets[1:], head)
        assert fitted(name, other, head).state_fingerprint() != detector.state_fingerprint()
    other_head = (head[0] * 1.01, head[1])
    if "head" in detector.inputs:
        assert fitted(name, fit_data(features, targets, other_head), other_head).state_fingerprint() != \
            detector.state_fingerprint()
    assert build_detector(name).state_fingerprint() != detector.state_fingerprint()


def test_bad_input_is_refused_with_a_clear_error(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data = fit_data(features, targets, head)
    with pytest.raises(DetectorNotFitted, match="'mahalanobis' is not fitted"):
        build_detector("mahalanobis").score({"features": test})
    with pytest.raises(DetectorNotFitted, match="'ash_s' is not fitted"):
        build_detector("ash_s").score(outputs(test, head))
    with pytest.raises(ValueError, match="k = 301 neighbours, but the fit set has only 300 samples"):
        build_detector("knn", k=301).fit(data)
    bad = features.clone()
    bad[[3, 8], 1] = float("nan")
    with pytest.raises(ValueError, match="2 fit samples have NaN or infinite features"):
        build_detector("knn").fit({**data, "features": bad})
    broken = test.clone()
    broken[[0, 5, 6], 2] = float("inf")
    with pytest.raises(ValueError, match=r"'knn': the features to score hold NaN or infinite values in 3 of 120 rows "
                                         r"\(first rows: \[0, 5, 6\]\)"):
        fitted("knn", data, head).score({"features": broken})
    with pytest.raises(ValueError, match=r"'vim': the features must be \(N, 32\)"):
        fitted("vim", data, head).score({"features": test[:, :5]})
    few = {"features": features[:20], "targets": targets[:20]}
    with pytest.raises(ValueError, match="20 fit samples of 4 classes in 32 feature dimensions.*N - K = 16 < D = 32"):
        build_detector("mahalanobis").fit(few)
    with pytest.raises(ValueError, match="'relative_mahalanobis': 20 fit samples of 4 classes.*N - K = 16 < D = 32"):
        build_detector("relative_mahalanobis").fit(few)
    shrunk = build_detector("mahalanobis", shrinkage=0.1).fit(few).score({"features": test})
    assert torch.isfinite(shrunk).all()
    no_class_2 = targets.clone()
    no_class_2[no_class_2 == 2] = 3
    with pytest.raises(ValueError, match="class 2 has no fit sample"):
        build_detector("mahalanobis").fit({"features": features, "targets": no_class_2})
    with pytest.raises(ValueError, match="class 2 has no correctly predicted fit sample"):
        build_detector("she").fit({**data, "targets": no_class_2})
    with pytest.raises(ValueError, match=r"percentile 0.99 of D = 32 activations keeps none"):
        build_detector("ash_s", percentile=0.99).fit({}, head=head)


def clustered(n: int, seed: int, *, shifted: bool = False) -> tuple[Tensor, Tensor]:
    """Features of K classes around sparse prototypes (ID), or shapeless noise of a smaller scale (OOD)."""
    g = generator(seed)
    prototypes = torch.relu(torch.randn(K, D, generator=generator(11), dtype=torch.float64)) * 2
    targets = torch.arange(n) % K
    if shifted:
        return torch.relu(torch.randn(n, D, generator=g, dtype=torch.float64) + 0.3), targets
    return torch.relu(prototypes[targets] + 0.5 * torch.randn(n, D, generator=g, dtype=torch.float64)), targets


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_every_detector_scores_its_fit_distribution_above_a_shifted_one(name) -> None:
    cls = DETECTORS[name]
    assert cls.name == name and cls.inputs - {"model"} <= {"logits", "features", "head"} and cls.background_rule
    prototypes = torch.relu(torch.randn(K, D, generator=generator(11), dtype=torch.float64)) * 2
    head = (prototypes / prototypes.norm(dim=1, keepdim=True), torch.zeros(K, dtype=torch.float64))
    features, targets = clustered(400, 0)
    detector = fitted(name, fit_data(features, targets, head), head)
    in_distribution = detector.score(outputs(clustered(200, 1)[0], head))
    shifted = detector.score(outputs(clustered(200, 2, shifted=True)[0], head))
    for scores in (in_distribution, shifted):
        assert scores.dtype == torch.float64 and scores.shape == (200,) and torch.isfinite(scores).all()
    # not only the means: most in-distribution samples score above the shifted ones' median
    assert in_distribution.mean() > shifted.mean()
    assert (in_distribution > shifted.median()).double().mean() > 0.9
    assert detector.hyperparameters() == cls.hyperparameter_defaults()  # built with the defaults: its values


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_fitted_state_and_scores_do_not_depend_on_the_number_of_threads(name) -> None:
    """Lightning gives each of N processes of a CPU run 1/N of the cores, so the fit and the scores of 2 processes
    run on fewer threads than those of 1 process: both must be the same bit for bit. 256-wide features, where
    MKL's eigh and Cholesky (ViM, Mahalanobis) give other last bits on 1 and on 3 threads unless they run on
    one; 6000 rows, more than a reduction's grain; rows that are not a multiple of the chunk."""
    dim, classes, rows = 256, 5, 6000
    g = generator(11)
    means = torch.rand(classes, dim, generator=g, dtype=torch.float64) * 2
    targets = torch.arange(rows) % classes
    features = torch.relu(means[targets] + torch.randn(rows, dim, generator=g, dtype=torch.float64)).float()
    head = ((means - means.mean(dim=0) + 0.3 * torch.randn(classes, dim, generator=g, dtype=torch.float64)) / 16,
            torch.randn(classes, generator=g, dtype=torch.float64) * 0.1)  # predicts the classes (SHE needs that)
    test = torch.relu(torch.randn(700, dim, generator=g, dtype=torch.float64) * 1.5 + 0.5).float()
    data = {"features": features, "targets": targets, "logits": (features.double() @ head[0].T + head[1]).float(),
            "adascale/statistic": pass_statistic(features), **nac_pass(features, head, classes=classes)}
    scored = {"features": test, "logits": (test.double() @ head[0].T + head[1]).float(),
              "adascale/statistic": pass_statistic(test), **nac_pass(test, head, classes=classes)}
    results = {}
    for threads in (1, 3):
        with intra_op_threads(threads):
            detector = fitted(name, data, head)
            results[threads] = (detector, detector.score(scored))
    (one, one_scores), (three, three_scores) = results[1], results[3]
    state, other = one.state_dict(), three.state_dict()
    assert state.keys() == other.keys()
    different = {key: float((state[key].double() - other[key].double()).abs().max()) for key in state
                 if not torch.equal(state[key], other[key])}
    assert different == {}, different
    assert one.state_fingerprint() == three.state_fingerprint()
    assert torch.equal(one_scores, three_scores), float((one_scores - three_scores).abs().max())


# float32 features score within float32 rounding of float64 scoring of the same values. Bound: a float32 product sums
# D terms, each rounded to float32's 6e-8 and accumulated in float32, so its error is a few 1e-7 of the sum of |terms|.
# Measured below (D = 256, K = 50): at most 2.4e-6 of the largest score (WeiPer+KLD: a perturbed logit within
# rounding of a bin edge changes bins), 1.5e-6 (KL matching: a divergence is the difference of two cross-entropies
# ~log K, taken in float32), 5.9e-7 (ViM), 0.8e-7 to 2.7e-7 for the others; relative to each score up to 4.5e-5,
# where a difference cancels near 0 (ViM's energy minus its virtual logit). So 1e-5 relative to each score and 1e-5
# of the largest score: float32's rounding with a margin, orders of magnitude below an error in the computation (a
# TF32 product is 1e-3 off)
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL_OF_MAX = 1e-5


def _products_in_float64(monkeypatch) -> None:
    """Every product in float64, whatever the features' dtype: the detectors' code as it was before the product
    precision (each module that imported :func:`metrics.detectors.base.product_dtype` by name patched too)."""
    import sys

    original = detector_base.product_dtype
    for module in [m for name, m in sys.modules.items() if name.startswith("metrics.detectors")]:
        if getattr(module, "product_dtype", None) is original:
            monkeypatch.setattr(module, "product_dtype", lambda features: torch.float64)


@pytest.mark.parametrize("name", OUTPUT_DETECTORS)
def test_float32_features_score_to_float32_rounding_and_float64_ones_in_float64(monkeypatch, name) -> None:
    """The product precision (``metrics.detectors.base``, *Precision*): float32 features and logits score within
    float32 rounding of their float64 copies (256-wide, 50 classes, with OOD rows), and a float64 score is the float64
    computation: float32 inputs with every product forced to float64 (the code before the rule) score bit for bit as
    their float64 copies do."""
    dim, classes = 256, 50
    g = generator(21)
    means = torch.rand(classes, dim, generator=g, dtype=torch.float64) * 2
    targets = torch.arange(1000) % classes
    features = torch.relu(means[targets] + torch.randn(1000, dim, generator=g, dtype=torch.float64)).float()
    head = ((means - means.mean(dim=0) + 0.3 * torch.randn(classes, dim, generator=g, dtype=torch.float64)) / 16,
            torch.randn(classes, generator=g, dtype=torch.float64) * 0.1)
    test = torch.cat([torch.relu(means[torch.arange(200) % classes] + torch.randn(200, dim, generator=g)),
                      torch.relu(torch.randn(100, dim, generator=g) * 1.5 + 0.5)]).float()
    # every output (the logits, the detectors' own passes) rounded to float32, as a pass gathers them
    single = {key: value.float() for key, value in outputs(test.double(), head).items()}
    double = {key: value.double() for key, value in single.items()}
    detector = fitted(name, fit_data(features.double(), targets, head), head)
    reference = detector.score(double)
    scores = detector.score(single)
    assert scores.dtype == torch.float64 and reference.dtype == torch.float64
    torch.testing.assert_close(scores, reference, rtol=FLOAT32_RTOL,
                               atol=FLOAT32_ATOL_OF_MAX * float(reference.abs().max()))
    _products_in_float64(monkeypatch)
    assert torch.equal(detector.score(single), reference)
    assert torch.equal(detector.score(double), reference)


def test_scores_run_float32_products_in_ieee_float32(setting, monkeypatch) -> None:
    # float32_matmul_precision "high" (TF32 on CUDA and oneDNN) would round a float32 product's inputs to 10 bits:
    # scoring runs at "highest" and restores the user's setting
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    detector = fitted("react", fit_data(features, targets, head), head)
    seen = []
    score = type(detector)._score
    monkeypatch.setattr(type(detector), "_score", lambda self, outputs: seen.append(
        torch.get_float32_matmul_precision()) or score(self, outputs))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        detector.score({"features": test.float()})
        assert seen == ["highest"] and torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("dim", [0, 1])
def test_float64_sums_are_numpys_on_any_number_of_threads(dim) -> None:
    """Float32 values summed in float64 without a float64 copy (numpy's buffered cast), the independent sums split
    among torch's threads: numpy's single reduction bit for bit on 1 and 3 threads; float64 values: their own sum."""
    import numpy as np

    values = torch.exp(torch.randn(1500, 1024, generator=generator(5)) * 4)  # 30 octaves: the order shows
    expected = np.add.reduce(values.numpy(), axis=dim, dtype=np.float64)
    for threads in (1, 3):
        with intra_op_threads(threads):
            assert np.array_equal(detector_base.float64_sums(values, dim).numpy(), expected)
    double = values.double()
    assert torch.equal(detector_base.float64_sums(double, dim), double.sum(dim=dim))
