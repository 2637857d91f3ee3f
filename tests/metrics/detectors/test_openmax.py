"""OpenMax (:mod:`metrics.detectors.openmax`) against pytorch-ood (its Nelder-Mead Weibull, and with the
maximum-likelihood one put in its place), against the authors' revision (OSDN's ``compute_openmax.py``, OpenOOD's
``openmax_postprocessor.py``) written here in numpy, its Weibull fit against the likelihood equation solved by
scipy's ``brentq``, a revision by hand, and its refusals."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from pytorch_ood.detector.openmax import libnotmr
from pytorch_ood.detector.openmax import numpy as pood_numpy
from scipy import optimize
from scipy.stats import exponweib, weibull_min

from metrics.detectors import build_detector
from metrics.detectors.openmax import TRANSLATION, weibull_cdf, weibull_fit_high
from tests.metrics.detectors.helpers import (
    assert_matches,
    generator,
    logits_of,
    make_features,
    make_head,
    pood_in_float64,
)


# ------------------------------------------------------------------------- references written here
def weibull_mle(tail: np.ndarray) -> tuple[float, float]:
    """libMR's ``FitHigh`` as maximum likelihood: the 2-parameter Weibull of ``tail + 10000 - min(tail)``, the shape
    the root of the profile likelihood equation (``brentq`` to scipy's tightest tolerance), the scale closed-form."""
    x = np.asarray(tail, dtype=np.float64) + TRANSLATION - np.min(tail)
    log_y = np.log1p((x - x.max()) / x.max())  # ln(x / max x) without the rounding of a ratio near 1

    def equation(k: float) -> float:
        w = np.exp(k * log_y)
        return (w * log_y).sum() / w.sum() - log_y.mean() - 1 / k

    low = 1 / -log_y.mean()
    high = 2 * low
    while equation(high) <= 0:
        low, high = high, 2 * high
    k = optimize.brentq(equation, low, high, xtol=1e-300, rtol=1e-15, maxiter=1000)
    return k, float(x.max() * np.mean(np.exp(k * log_y)) ** (1 / k))


def stable_argsort(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """An ascending ``argsort`` whose equal values come by descending index, so that pytorch-ood's reversed top α
    ranks them by ascending index, the project's rule (argmax's). numpy's default ``argsort`` is not stable: its
    SIMD sort orders a row's equal logits by the machine (``[1, 1, -0.5, -1]`` sorts as ``[3, 2, 1, 0]`` here)."""
    return np.flip(np.argsort(-a, axis=axis, kind="stable"), axis=axis)


class ExactLibNotMR(libnotmr.LibNotMR):
    """pytorch-ood's libMR port with :func:`weibull_mle` in place of ``exponweib.fit``'s Nelder-Mead search."""

    def fit_high(self, inputs: np.ndarray) -> None:
        tail = sorted(inputs)[-self.tailsize:]
        self.min_val = np.min(tail)
        self.c, self.scale = weibull_mle(np.asarray(tail))


def authors_openmax(fit_logits: np.ndarray, targets: np.ndarray, logits: np.ndarray, *, tailsize: int, alpha: int,
                    euclidean: float, cosine: float) -> np.ndarray:
    """-P(unknown) as the authors' OSDN code and OpenOOD's postprocessor compute it, one channel, unchunked: the MAVs
    of the correctly classified samples, each class's tail ``sorted(distances)[-tailsize:]``, libMR's Weibull
    (:func:`weibull_mle`), then per sample the ranked alpha weights on ``argsort()[::-1][:alpha]``, a w-score of
    every class, the revised scores and the unknown's exp(sum) in the softmax."""
    classes = fit_logits.shape[1]
    alpha = min(alpha, classes)  # pytorch-ood's rule (the authors' code needs alpha <= K)

    def distance(v: np.ndarray, mean: np.ndarray) -> float:
        cos = 1 - v @ mean / (np.linalg.norm(v) * np.linalg.norm(mean))
        return euclidean * np.linalg.norm(mean - v) + cosine * cos

    correct = fit_logits.argmax(axis=1) == targets
    means, models = [], []
    for c in range(classes):
        members = fit_logits[correct & (targets == c)]
        mean = members.mean(axis=0)
        tail = np.sort([distance(v, mean) for v in members])[-tailsize:]
        means.append(mean)
        models.append((tail.min(), *weibull_mle(tail)))
    scores = []
    for v in logits:
        ranked = np.argsort(-v, kind="stable")[:alpha]  # ties: the lower index first (see stable_argsort)
        omega = np.zeros(classes)
        omega[ranked] = [((alpha + 1) - i) / float(alpha) for i in range(1, alpha + 1)]
        revised, unknown = [], []
        for c in range(classes):
            low, k, scale = models[c]
            w = 1 - np.exp(-(((distance(v, means[c]) + TRANSLATION - low) / scale) ** k))
            revised.append(v[c] * (1 - w * omega[c]))
            unknown.append(v[c] - revised[-1])
        denominator = np.exp(revised).sum() + np.exp(np.sum(unknown))
        scores.append(-np.exp(np.sum(unknown)) / denominator)
    return np.array(scores)


class NumpyWithStableArgsort:
    """numpy for pytorch-ood's OpenMax module, with :func:`stable_argsort`."""

    argsort = staticmethod(stable_argsort)

    def __getattr__(self, name: str):
        return getattr(np, name)


# ------------------------------------------------------------------------- data
def openmax_data(grid: float | None, seed: int = 0) -> dict:
    """Logits of the shared class-structured features through the shared head (58% of the fit set classified
    correctly); with ``grid``, logits rounded to it: ties within rows (the alpha ranking) and across them."""
    head = make_head()
    features, targets = make_features(seed=seed)
    test, _ = make_features(80, seed=5)
    test = torch.cat([test, torch.relu(torch.randn(40, features.shape[1], generator=generator(6),
                                                   dtype=torch.float64) * 1.5)])
    logits, test_logits = logits_of(features, head), logits_of(test, head)
    if grid is not None:
        logits, test_logits = (torch.round(x / grid) * grid for x in (logits, test_logits))
        test_logits = torch.cat([test_logits, logits[:20]])  # fit samples again: distances in the tails
    correct = logits.argmax(dim=1) == targets
    # pytorch-ood's predict measures the distance only to the classes some sample of the batch predicts: every
    # class is predicted here, so that its scores are the batch-independent ones
    assert torch.bincount(test_logits.argmax(dim=1), minlength=4).min() > 0
    return {"logits": logits, "targets": targets, "test": test_logits, "correct": correct}


# pytorch-ood's euclid_weight w is the project's (euclidean_weight, cosine_weight) = (w, 1 - w)
CASES = [(25, 10, 1.0), (20, 3, 1.0), (10, 2, 0.5), (20, 10, 0.005 / 1.005), (5, 1, 0.0)]


@pytest.mark.parametrize("grid", [None, 0.5])
@pytest.mark.parametrize(("tailsize", "alpha", "w"), CASES)
def test_openmax_matches_pytorch_ood(grid, tailsize, alpha, w) -> None:
    """With the maximum-likelihood Weibull in place of its Nelder-Mead search, pytorch-ood's scores to 1e-10
    (measured: 1.5e-11). Its own search stops at a 1e-4 tolerance: with the Euclidean distance its scores are within
    1e-5 relative (measured: 2.5e-6); with the cosine distances' tails (spreads of ~0.01, shapes of ~10⁶, or few
    distinct values on the grid) it stops far from the maximum (7e-4 and 0.9 relative measured), where only the
    maximum-likelihood comparison holds. Its argsort is given the project's order of equal logits
    (:func:`stable_argsort`)."""
    data = openmax_data(grid)
    fit = {"logits": data["logits"], "targets": data["targets"]}
    ours = build_detector("openmax", tailsize=tailsize, alpha=alpha, euclidean_weight=w,
                          cosine_weight=1 - w).fit(fit).score({"logits": data["test"]})
    correct = data["correct"]  # pytorch-ood fits on every sample it is given: the correctly classified ones

    def theirs() -> torch.Tensor:
        detector = pood.OpenMax(None, tailsize=tailsize, alpha=alpha, euclid_weight=w)
        return detector.fit_logits(data["logits"][correct], data["targets"][correct]).predict_logits(data["test"])

    with pood_in_float64(), mock.patch.object(pood_numpy, "np", NumpyWithStableArgsort()):
        nelder_mead = theirs()
        with mock.patch.object(pood_numpy, "LibNotMR", ExactLibNotMR):
            exact = theirs()
    torch.testing.assert_close(ours, -exact.double(), rtol=1e-10, atol=0)
    if w == 1.0:  # the Euclidean distance: tails spread enough for the Nelder-Mead search (see above)
        assert_matches(ours, nelder_mead, atol=0)  # rtol 1e-5


@pytest.mark.parametrize("grid", [None, 0.5])
def test_openmax_matches_the_authors_revision(grid) -> None:
    """The paper's defaults (tail 20, alpha 10, eucos = euclidean/200 + cosine) and OpenOOD's (tail 20, alpha 3,
    Euclidean), against the numpy transcription of the authors' per-sample revision."""
    data = openmax_data(grid, seed=3)
    fit = {"logits": data["logits"], "targets": data["targets"]}
    arrays = data["logits"].numpy(), data["targets"].numpy(), data["test"].numpy()
    for parameters, (a, b) in [({}, (1 / 200, 1.0)), ({"alpha": 3, "euclidean_weight": 1.0, "cosine_weight": 0.0},
                                                      (1.0, 0.0))]:
        detector = build_detector("openmax", **parameters).fit(fit)
        theirs = authors_openmax(*arrays, tailsize=20, alpha=detector.alpha, euclidean=a, cosine=b)
        if not parameters:
            assert detector.alpha == 10 and (detector.euclidean_weight, detector.cosine_weight) == (a, b)
        np.testing.assert_allclose(detector.score({"logits": data["test"]}).numpy(), theirs, rtol=1e-10, atol=0)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # scipy's searches try huge shapes
def test_weibull_fit_is_the_maximum_likelihood_one() -> None:
    """Random tails over nine orders of magnitude of spread: the shape and scale are the root of the likelihood
    equation (brentq; measured within 4e-16 relative, at shapes up to 1.1e9), and their
    likelihood is at least scipy's fits' (``weibull_min.fit``'s solver and ``exponweib.fit``'s Nelder-Mead, both
    short of the maximum at these shapes)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 30, size=16)
    tails = np.full((16, 30), -np.inf)
    for row, size in enumerate(sizes):
        tails[row, :size] = rng.gamma(2.0, 1.0, size=size) * 10 ** rng.uniform(-5, 4)
    shape, scale, tail_min = weibull_fit_high(torch.from_numpy(tails), torch.from_numpy(sizes))
    for row, size in enumerate(sizes):
        tail = tails[row, :size]
        k, s = weibull_mle(tail)
        assert float(tail_min[row]) == tail.min()
        assert float(shape[row]) == pytest.approx(k, rel=1e-13) and float(scale[row]) == pytest.approx(s, rel=1e-14)
        x = tail + TRANSLATION - tail.min()
        ours = weibull_min.logpdf(x, float(shape[row]), 0, float(scale[row])).sum()
        c, _, lam = weibull_min.fit(x, floc=0)
        _, c2, _, lam2 = exponweib.fit(x, floc=0, f0=1)
        # logpdf rounds (x/λ)^κ: at shapes of 10⁶ and more a relative 1e-16 of x/λ is 1e-10 of each term
        slack = 1e-10 * abs(ours)
        assert ours >= weibull_min.logpdf(x, c, 0, lam).sum() - slack
        assert ours >= weibull_min.logpdf(x, c2, 0, lam2).sum() - slack
    # the CDF: libMR's W_score, scipy's Weibull CDF of the translated distance (0 below the support)
    distances = torch.tensor([0.0, 0.5, 3.0, -2e4], dtype=torch.float64)
    expected = weibull_min.cdf(distances.numpy() + TRANSLATION - float(tail_min[0]), float(shape[0]), 0,
                               float(scale[0]))
    np.testing.assert_allclose(weibull_cdf(distances, shape[0], scale[0], tail_min[0]).numpy(), expected,
                               rtol=1e-9, atol=1e-300)


def test_openmax_revision_by_hand() -> None:
    """Two classes, alpha 2, a Weibull of shape 1 and scale 10000 with tail minimum 0: w(d) = 1 - exp(-1 - d/10⁴).
    v = (3, 1) at distances 0 (class 0) and 10⁴ (class 1): w = 1 - e⁻¹, 1 - e⁻²; ω = (1, 1/2)."""
    detector = build_detector("openmax", alpha=2, euclidean_weight=1.0, cosine_weight=0.0)
    v = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    state = {"class_means": torch.tensor([[3.0, 1.0], [3.0, 1.0 + 1e4]], dtype=torch.float64),
             "weibull_shape": torch.ones(2, dtype=torch.float64), "weibull_scale": torch.full((2,), 1e4,
                                                                                              dtype=torch.float64),
             "tail_min": torch.zeros(2, dtype=torch.float64), "_fitted": torch.tensor(True)}
    detector.load_state_dict(state)
    w0, w1 = 1 - np.exp(-1), 1 - np.exp(-2)
    revised = np.array([3 * (1 - w0), 1 * (1 - w1 / 2)])
    unknown = 3 * w0 + 1 * w1 / 2
    expected = -np.exp(unknown) / (np.exp(unknown) + np.exp(revised).sum())
    assert detector.score({"logits": v}).item() == pytest.approx(expected, rel=1e-14)
    # equal logits: the lower class index ranks first, as argmax predicts (ω = 1 for class 0, 1/2 for class 1)
    tied = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    d0, d1 = np.hypot(1.0, 1.0), np.hypot(1.0, 1e4 - 1)
    w0, w1 = 1 - np.exp(-1 - d0 / 1e4), 1 - np.exp(-1 - d1 / 1e4)
    unknown = 2 * w0 + 2 * w1 / 2
    revised = np.array([2 * (1 - w0), 2 * (1 - w1 / 2)])
    expected = -np.exp(unknown) / (np.exp(unknown) + np.exp(revised).sum())
    assert detector.score({"logits": tied}).item() == pytest.approx(expected, rel=1e-12)


def test_openmax_refuses_bad_hyperparameters_and_fit_sets_by_name() -> None:
    for kwargs, message in [({"tailsize": 1}, "tailsize must be an integer >= 2"),
                            ({"tailsize": 2.5}, "tailsize must be an integer >= 1, got 2.5"),
                            ({"alpha": 0}, "alpha must be an integer >= 1, got 0"),
                            ({"euclidean_weight": -1}, "euclidean_weight must be a non-negative finite number"),
                            ({"cosine_weight": float("nan")}, "cosine_weight must be a non-negative finite number"),
                            ({"euclidean_weight": 0, "cosine_weight": 0},
                             "euclidean_weight and cosine_weight are both 0")]:
        with pytest.raises(ValueError, match=f"'openmax': {message}"):
            build_detector("openmax", **kwargs)
    # class 0: three correctly classified samples at distinct distances; rows 3 and 4 predict 1 and 0
    logits = torch.tensor([[2.0, 0.0], [3.0, 0.5], [5.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="class 1 has no correctly classified fit sample"):
        build_detector("openmax").fit({"logits": logits, "targets": torch.tensor([0, 0, 0, 0, 1])})
    with pytest.raises(ValueError, match="the tail of class 1's distances holds a single distinct value .*class 1 "
                                         "has 1 correctly classified fit samples"):
        build_detector("openmax").fit({"logits": logits, "targets": torch.tensor([0, 0, 0, 1, 1])})
    with pytest.raises(ValueError, match="fit targets go up to 2, the logits have 2 known classes"):
        build_detector("openmax").fit({"logits": logits, "targets": torch.tensor([0, 0, 0, 1, 2])})
    with pytest.raises(ValueError, match="'openmax': 7 fit samples of 4 classes; each class's Weibull fit needs at "
                                         "least two correctly classified samples"):
        build_detector("openmax").check_fit_size(7, 4)
    build_detector("openmax").check_fit_size(8, 4)
    data = openmax_data(None)
    detector = build_detector("openmax").fit({"logits": data["logits"], "targets": data["targets"]})
    with pytest.raises(ValueError, match="'openmax' was fitted on logits of 4 known classes; the logits to score have "
                                         "5 known columns"):
        detector.score({"logits": torch.zeros(3, 5, dtype=torch.float64)})
