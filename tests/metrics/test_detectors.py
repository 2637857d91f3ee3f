"""The fitted detectors of :mod:`metrics.detectors` against pytorch-ood's own implementations, hand-computed
cases, chunking invariance, background-class models, bad input, state_dict round trips and a contract test
over every registry entry."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from torch import Tensor

from metrics.detectors import DETECTORS, Detector, DetectorNotFitted, ScoreFunction, build_detector
from metrics.detectors import base as detector_base
from metrics.detectors import react as react_module
from metrics.detectors.react import activation_percentile

OUTPUT_DETECTORS = sorted(name for name, cls in DETECTORS.items() if not issubclass(cls, ScoreFunction))
"""The detectors with a fit or a head (the confidence functions of the logits are tested in test_kappa.py)."""

N, D, K = 300, 32, 4

# float64 on both sides: the differences are rounding of sums of ~D products of O(1) values, far below 1e-12
# for these scores of magnitude 1e-2..1e2, so atol only covers scores that happen to be near 0
ATOL = 1e-12
# KNN's distances at 0 (duplicated features): sqrt(2 - 2s) of an s within a few float64 ulps of 1, here and in
# sklearn (sqrt(|x|² - 2x·y + |y|²)): both sqrt(~1e-15) = ~3e-8, so they agree to 1e-7 there
KNN_ATOL = 1e-7


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def centres() -> Tensor:
    return torch.rand(K, D, generator=generator(99), dtype=torch.float64) * 2


def make_head(seed: int = 1) -> tuple[Tensor, Tensor]:
    """A linear head that mostly predicts :func:`make_features`' classes: the centres plus noise."""
    g = generator(seed)
    weight = centres() - centres().mean(dim=0) + 0.3 * torch.randn(K, D, generator=g, dtype=torch.float64)
    return weight / math.sqrt(D), torch.randn(K, generator=g, dtype=torch.float64) * 0.1


def make_features(n: int = N, seed: int = 0, *, grid: float | None = None) -> tuple[Tensor, Tensor]:
    """Non-negative (post-ReLU-like) class-structured features and their classes; ``grid``: rounded to it
    (ties)."""
    g = generator(seed)
    targets = torch.arange(n) % K
    features = torch.relu(centres()[targets] + torch.randn(n, D, generator=g, dtype=torch.float64))
    if grid is not None:
        features = torch.round(features / grid) * grid
    return features, targets


def logits_of(features: Tensor, head: tuple[Tensor, Tensor]) -> Tensor:
    return features @ head[0].T + head[1]


def fit_data(features: Tensor, targets: Tensor, head: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    return {"features": features, "targets": targets, "logits": logits_of(features, head)}


def outputs(features: Tensor, head: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    return {"features": features, "logits": logits_of(features, head)}


def fitted(name: str, data: dict[str, Tensor], head: tuple[Tensor, Tensor], **hyperparameters) -> Detector:
    detector = build_detector(name, **hyperparameters)
    return detector.fit(data, head=head) if detector.needs_fit else detector


@contextlib.contextmanager
def pood_in_float64() -> Iterator[None]:
    """pytorch-ood's code in float64: its buffers follow the default dtype, and ViM and DICE cast with
    ``.float()`` (in float32 ViM's eigenvectors alone differ by ~7e-6)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
            yield
    finally:
        torch.set_default_dtype(old)


def as_maps(features: Tensor) -> Tensor:
    return features[:, :, None, None]


def linear(head: tuple[Tensor, Tensor]):
    weight, bias = head
    return lambda maps: maps.flatten(1) @ weight.T + bias


def identity(maps: Tensor) -> Tensor:
    return maps


def assert_matches(ours: Tensor, theirs: Tensor, *, atol: float = ATOL) -> None:
    """Ours is float64 and pytorch-ood's outlier score negated."""
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, -torch.as_tensor(theirs).double(), rtol=1e-5, atol=atol)


# ------------------------------------------------------------------------------------------- pytorch-ood


@pytest.fixture(scope="module")
def setting() -> dict:
    head = make_head()
    features, targets = make_features()
    test, _ = make_features(80, seed=5)
    test = torch.cat([test, torch.relu(torch.randn(40, D, generator=generator(6), dtype=torch.float64) * 1.5)])
    return {"head": head, "features": features, "targets": targets, "test": test}


@pytest.mark.parametrize("grid", [None, 0.5])
def test_mahalanobis_and_rmd_match_pytorch_ood(setting, grid) -> None:
    features, targets = make_features(grid=grid)
    test = setting["test"]
    with pood_in_float64():
        theirs = pood.Mahalanobis(None).fit_features(features, targets).predict_features(test)
        theirs_rmd = pood.RMD(None).fit_features(features, targets).predict_features(test)
    data = {"features": features, "targets": targets}
    assert_matches(build_detector("mahalanobis").fit(data).score({"features": test}), theirs)
    assert_matches(build_detector("relative_mahalanobis").fit(data).score({"features": test}), theirs_rmd)


@pytest.mark.parametrize(("grid", "k"), [(None, 50), (None, 1), (0.5, 5), (1.0, 20)])
def test_knn_matches_pytorch_ood(setting, grid, k) -> None:
    features, targets = make_features(grid=grid)
    test = setting["test"] if grid is None else torch.cat([torch.round(setting["test"] / grid) * grid, features[:10]])
    with pood_in_float64():
        theirs = pood.KNN(None, k=k).fit_features(features, targets).predict_features(test)
    ours = build_detector("knn", k=k).fit({"features": features, "targets": targets}).score({"features": test})
    assert_matches(ours, theirs, atol=KNN_ATOL)


@pytest.mark.parametrize("d", [8, 16, None])
def test_vim_matches_pytorch_ood(setting, d) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    with pood_in_float64():  # pytorch-ood's ViM needs d; ours defaults to D // 2 = 16 below D = 768
        theirs = pood.ViM(None, d=d or 16, w=head[0], b=head[1]).fit_features(features, targets).predict_features(test)
    ours = fitted("vim", fit_data(features, targets, head), head, d=d).score(outputs(test, head))
    assert_matches(ours, theirs)


@pytest.mark.parametrize("grid", [None, 0.25])
def test_react_matches_pytorch_ood(setting, grid) -> None:
    head, (features, targets) = setting["head"], make_features(grid=grid)
    test = setting["test"]
    theirs = pood.ReAct(identity, linear(head), percentile=0.9).fit_feature_maps(as_maps(features), targets)
    ours = fitted("react", fit_data(features, targets, head), head)
    assert float(ours.threshold) == theirs.threshold  # np.percentile, bit for bit
    assert_matches(ours.score(outputs(test, head)), theirs.predict_feature_maps(as_maps(test)))


@pytest.mark.parametrize("grid", [None, 0.5])
@pytest.mark.parametrize(("name", "variant", "percentile"), [("ash_s", "ash-s", 0.9), ("ash_p", "ash-p", 0.9),
                                                            ("ash_b", "ash-b", 0.65), ("ash_s", "ash-s", 0.7)])
def test_ash_matches_pytorch_ood(setting, name, variant, percentile, grid) -> None:
    head, test = setting["head"], setting["test"]
    if grid is not None:  # ties at the pruning boundary: the same topk on float64 keeps the same indices
        test = torch.round(test / grid) * grid
    theirs = pood.ASH(identity, linear(head), variant=variant, percentile=percentile).predict_feature_maps(as_maps(test))
    ours = build_detector(name, percentile=percentile).fit({}, head=head).score(outputs(test, head))
    assert_matches(ours, theirs)


@pytest.mark.parametrize("percentile", [0.85, 0.5])
def test_scale_matches_pytorch_ood(setting, percentile) -> None:
    head, test = setting["head"], torch.round(setting["test"] / 0.5) * 0.5  # ties: s2 does not depend on them
    theirs = pood.SCALE(identity, linear(head), percentile=percentile).predict_feature_maps(as_maps(test))
    assert_matches(build_detector("scale", percentile=percentile).fit({}, head=head).score(outputs(test, head)), theirs)


def test_she_gen_dice_match_pytorch_ood(setting) -> None:
    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    data, scored = fit_data(features, targets, head), outputs(test, head)
    theirs = pood.SHE(None, linear(head)).fit_features(features, targets).predict_features(test)
    assert_matches(fitted("she", data, head).score(scored), theirs)
    assert_matches(build_detector("gen").score(scored), pood.GEN(None).predict_logits(scored["logits"]))
    assert_matches(build_detector("gen", gamma=0.5, M=2).score(scored),
                   pood.GEN(None, gamma=0.5, M=2).predict_logits(scored["logits"]))
    for p in (0.7, 0.3):
        with pood_in_float64():
            theirs = pood.DICE(None, head[0], head[1], p=p).fit_features(features, targets).predict_features(test)
        assert_matches(fitted("dice", data, head, p=p).score(scored), theirs)


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


# ------------------------------------------------------------------------------------------- by hand


def test_mahalanobis_two_classes_in_two_dimensions_by_hand() -> None:
    # class 0 around (0, 0), class 1 around (10, 0), each the four points at distance 1 on the axes: each class
    # adds diag(2, 2) to the scatter, S = diag(4, 4) + 1e-6 I
    square = torch.tensor([[-1.0, 0], [1, 0], [0, -1], [0, 1]], dtype=torch.float64)
    features = torch.cat([square, square + torch.tensor([10.0, 0])])
    targets = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    detector = build_detector("mahalanobis").fit({"features": features, "targets": targets})
    test = torch.tensor([[1.0, 1.0], [9.0, 0.0], [5.0, 0.0]], dtype=torch.float64)
    s = 4 + 1e-6
    expected = torch.tensor([-0.5 * 2 / s, -0.5 * 1 / s, -0.5 * 25 / s], dtype=torch.float64)
    torch.testing.assert_close(detector.score({"features": test}), expected, rtol=1e-13, atol=0)
    # RMD: the Gaussian of all 8 points has mean (5, 0) and scatter diag(4 + 200, 4) + 1e-6 I
    rmd = build_detector("relative_mahalanobis").fit({"features": features, "targets": targets})
    background = torch.tensor([16 / (204 + 1e-6) + 1 / s, 16 / (204 + 1e-6), 0.0], dtype=torch.float64)
    torch.testing.assert_close(rmd.score({"features": test}), -(-2 * expected) + background, rtol=1e-13, atol=1e-15)


def test_knn_with_k_1_is_the_brute_force_nearest_neighbour_distance() -> None:
    features, targets = make_features(200, seed=3)
    test, _ = make_features(50, seed=4)
    unit = lambda x: x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)  # noqa: E731
    brute = np.sqrt(((unit(test)[:, None, :] - unit(features)[None, :, :]) ** 2).sum(-1)).min(axis=1)
    ours = build_detector("knn", k=1).fit({"features": features, "targets": targets}).score({"features": test})
    torch.testing.assert_close(ours, -torch.from_numpy(brute), rtol=1e-12, atol=KNN_ATOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("rows", "dim", "grid"), [(1, 1, None), (37, 5, None), (64, 8, 0.5), (100, 3, 1.0),
                                                  (29, 13, 0.125)])
def test_react_percentile_is_numpys_on_chunk_boundaries_and_ties(monkeypatch, dtype, rows, dim, grid) -> None:
    monkeypatch.setattr(detector_base, "CHUNK_ROWS", 4)
    monkeypatch.setattr(react_module, "SELECTION_ELEMENTS", 7)  # chunks of 1 row for dim >= 7
    values = torch.randn(rows, dim, generator=generator(rows), dtype=torch.float64).abs()
    if grid is not None:
        values = torch.round(values / grid) * grid
        values[::3] = 0.0  # many ties at 0 (ReLU)
        values[1::5] = -0.0
    values = values.to(dtype)
    for percentile in (0.9, 0.5, 0.01, 0.999, 0.3):
        assert activation_percentile(values, percentile) == float(np.percentile(values.numpy(), percentile * 100))


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


# ------------------------------------------------------------------------------------------- chunks and state


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


# ------------------------------------------------------------------------------------------- bad input


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


def test_unknown_names_hyperparameters_and_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown detector 'mahalanobi'; choose from \['ash_b'"):
        build_detector("mahalanobi")
    with pytest.raises(ValueError, match=r"'knn' has no hyperparameter 'kk'; it takes \['k'\]"):
        build_detector("knn", kk=3)
    with pytest.raises(ValueError, match="'she' has no hyperparameter 'p'; it takes none"):
        build_detector("she", p=3)
    for name, kwargs, message in [("react", {"percentile": 1.5}, "percentile must be a fraction in \\(0, 1\\), got 1.5"),
                                  ("ash_b", {"percentile": 0}, "got 0"), ("knn", {"k": 0}, "k must be an integer >= 1, got 0"),
                                  ("knn_imagenet", {"k": 2.5}, "got 2.5"), ("dice", {"p": -0.1}, "got -0.1"),
                                  ("gen", {"gamma": 0}, "gamma must be a positive finite number, got 0"),
                                  ("mahalanobis", {"shrinkage": -1}, "got -1"), ("vim", {"d": 0}, "got 0")]:
        with pytest.raises(ValueError, match=message):
            build_detector(name, **kwargs)
    with pytest.raises(ValueError, match="ODIN scores images through the model.*not supported by name"):
        build_detector("pood:ODIN")
    with pytest.raises(ValueError, match="MCD scores images through the model"):
        build_detector("pood:MCD")
    with pytest.raises(ValueError, match=r"no detector class 'Knn'; the supported ones: \['ASH', 'DICE'"):
        build_detector("pood:Knn")
    with pytest.raises(ValueError, match="ViM needs the argument 'd'"):
        build_detector("pood:ViM")
    with pytest.raises(ValueError, match=r"has no argument 'temperature' to set; it takes \['detector', 'percentile', "
                                         r"'threshold'\]"):
        build_detector("pood:ReAct", temperature=2)
    with pytest.raises(ValueError, match="refused the arguments.*percentile must be a fraction"):
        build_detector("pood:ASH", percentile=3)


# ------------------------------------------------------------------------------------------- every entry


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
    assert cls.name == name and cls.inputs <= {"logits", "features", "head"} and cls.background_rule
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


# ------------------------------------------------------------------------------------------- threads


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
    data = {"features": features, "targets": targets, "logits": (features.double() @ head[0].T + head[1]).float()}
    scored = {"features": test, "logits": (test.double() @ head[0].T + head[1]).float()}
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


def test_mahalanobis_inverts_its_factor_once_per_fitted_state(setting, monkeypatch) -> None:
    """L⁻¹ (D³/3 flops) once per fitted state, not per score call (EvG's search scores a few images thousands of
    times); a loaded or refitted state is inverted again, and scores as a fresh detector of that state."""
    from metrics.detectors import mahalanobis as module

    head, features, targets, test = setting["head"], setting["features"], setting["targets"], setting["test"]
    calls = []
    original = module._inverse_factor
    monkeypatch.setattr(module, "_inverse_factor", lambda factor: calls.append(1) or original(factor))
    detector = fitted("relative_mahalanobis", fit_data(features, targets, head), head)
    first = [detector.score(outputs(test[i:i + 3], head)) for i in range(0, 30, 3)]
    assert len(calls) == 2  # the class factor and the background one, once each for the 10 calls
    # (to rounding: a product's last bits may change with its number of rows, as the chunk-size test allows)
    torch.testing.assert_close(torch.cat(first), detector.score(outputs(test[:30], head)), rtol=1e-12, atol=ATOL)
    other = fitted("relative_mahalanobis", fit_data(features[:200], targets[:200], head), head)
    detector.load_state_dict(other.state_dict())  # copied into the same buffers, in place
    assert torch.equal(detector.score(outputs(test, head)), other.score(outputs(test, head)))
    assert len(calls) == 6  # other's two, and detector's two again after the load
