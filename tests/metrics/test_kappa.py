"""The κ of :mod:`metrics.kappa`: :data:`KAPPAS`' contract (higher is more in-distribution, shape ``(N,)``) for every
confidence function, their arguments resolved, the one κ dispatch of every kind and its non-finite scores named.
The κ themselves: tests/metrics/detectors/ (test_confidence.py, test_perturbation.py, test_ensemble.py)."""

import pytest
import torch

from metrics import KAPPAS, resolve_detector
from metrics.detectors import DETECTORS, Detector, ScoreFunction
from tests.metrics.detectors.helpers import LogitsModel


@pytest.mark.parametrize("name", sorted(k for k, v in DETECTORS.items() if issubclass(v, ScoreFunction)))
def test_kappa_contract(name):
    kappa = KAPPAS[name]
    kind = DETECTORS[name].kind
    confident = torch.eye(5)[[0, 1, 2, 3, 4, 0]] * 8.0
    uniform = torch.zeros(6, 5)
    if kind == "model":
        model = LogitsModel().eval()
        scores_confident, scores_uniform = kappa(model, confident), kappa(model, uniform)
    elif kind == "ensemble":
        # (M, N, C) member logits: 3 members that agree on the confident prediction, against 3 members that
        # are each confident of another class (uniform members would tie with agreeing ones on -MI = 0)
        agreeing = confident.expand(3, -1, -1)
        disagreeing = torch.stack([confident.roll(shift, dims=1) for shift in range(3)])
        scores_confident, scores_uniform = kappa(agreeing), kappa(disagreeing)
    else:
        scores_confident, scores_uniform = kappa(confident), kappa(uniform)
    assert scores_confident.shape == (6,) and scores_uniform.shape == (6,)
    assert torch.isfinite(scores_confident).all() and torch.isfinite(scores_uniform).all()
    assert (scores_confident > scores_uniform).all(), "higher must mean more in-distribution"


def test_kappa_parameters_resolve_defaults_and_refuse_unknown_names():
    assert resolve_detector("odin").arguments() == {"temperature": 2.0, "epsilon": 1e-5, "image_space": False}
    assert resolve_detector("odin").arguments(temperature=1000) == {"temperature": 1000, "epsilon": 1e-5,
                                                                    "image_space": False}
    assert resolve_detector("mc_dropout").arguments() == {"passes": 30}
    assert resolve_detector("softmax").arguments() == {}
    with pytest.raises(ValueError, match="has no hyperparameter"):
        resolve_detector("softmax").arguments(temperature=2)


def test_one_dispatch_for_every_kind_of_kappa():
    from metrics import check_kappa, kappa_scores, pairs_with

    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    members = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))  # per sample: (N, M, C)
    features = torch.randn(5, 6)
    torch.testing.assert_close(kappa_scores(DETECTORS["softmax"], {"logits": logits}, background=False, parameters={}),
                               torch.softmax(logits, 1).max(1).values)
    torch.testing.assert_close(
        kappa_scores(DETECTORS["ensemble_softmax"], {"logits": members}, background=False, parameters={}),
        torch.softmax(members.double(), -1).mean(1).max(1).values)  # the ensemble κ accumulate in float64
    class Norm(Detector):  # a detector of the features with no fit
        name, inputs = "norm", frozenset({"features"})

        def _score(self, outputs):
            return -outputs["features"].norm(dim=1)

    norm = Norm
    torch.testing.assert_close(kappa_scores(norm, {"logits": logits, "features": features}, background=False,
                                            parameters={}), -features.norm(dim=1))
    odin_scores = torch.arange(5.0)
    assert torch.equal(kappa_scores(DETECTORS["odin"], {"scores/odin": odin_scores}, background=False, parameters={}),
                       odin_scores)
    with pytest.raises(ValueError, match="scores one model"):
        kappa_scores(DETECTORS["softmax"], {"logits": members}, background=False, parameters={})
    with pytest.raises(ValueError, match="needs an ensemble"):
        kappa_scores(DETECTORS["ensemble_mi"], {"logits": logits}, background=False, parameters={})
    with pytest.raises(ValueError, match="needs the model's features"):
        kappa_scores(norm, {"logits": logits}, background=False, parameters={})
    # the pairing rules, refused when the run starts
    assert pairs_with(DETECTORS["ensemble_mi"], ensemble=True) and not pairs_with(DETECTORS["softmax"], ensemble=True)
    with pytest.raises(ValueError, match="'ensemble_mi' needs an ensemble.*m is one model"):
        check_kappa(DETECTORS["ensemble_mi"], model="m", ensemble=False, background=False)
    with pytest.raises(ValueError, match="'softmax' scores one model; e is an ensemble"):
        check_kappa(DETECTORS["softmax"], model="e", ensemble=True, background=False)
    class Own(Detector):  # scores images through the model, with no rule for a background column
        name, inputs, background_rule = "own", frozenset({"model"}), False

    model_kind = Own
    with pytest.raises(ValueError, match="'own' has no rule for background-class models, and bg has a background"):
        check_kappa(model_kind, model="bg", ensemble=False, background=True)
    check_kappa(DETECTORS["energy"], model="bg", ensemble=False, background=True)  # every κ of KAPPAS has one


def test_non_finite_scores_name_the_kappa_its_arguments_the_set_and_the_rows():
    """``--kappa pood:EnergyBased --kappa-arg pood:EnergyBased.t=0``: pytorch-ood's energy ``-t logsumexp(z / t)``
    is NaN for every image at t = 0; the one κ dispatch says so, naming the detector, t and the set, instead of a
    metric's "scores contains NaN" after every pass."""
    from metrics import kappa_scores

    energy = resolve_detector("pood:EnergyBased")
    parameters = energy.arguments(t=0)
    detector = energy(background=False, **parameters)
    logits = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError) as raised:
        kappa_scores(energy, {"logits": logits}, background=False, parameters=parameters, detector=detector,
                     data="id_test")
    assert str(raised.value) == (
        "confidence function 'pood:EnergyBased' (t=0) gave NaN or infinite scores for 40 of 40 images of id_test "
        "(first rows: [0, 1, 2, 3, 4]): a detector's scores must be finite; check its arguments (--kappa-arg "
        "pood:EnergyBased.NAME=VALUE) and the model's outputs")
    # t = 1 is pytorch-ood's energy: -logsumexp, finite
    fine = energy(background=False, t=1)
    torch.testing.assert_close(kappa_scores(energy, {"logits": logits}, background=False, parameters={"t": 1},
                                            detector=fine), torch.logsumexp(logits.double(), dim=1))


def test_non_finite_rows_of_a_model_based_kappa_are_counted_and_evgs_search_may_keep_them():
    from metrics import kappa_scores

    odin_scores = torch.tensor([0.5, float("nan"), 0.7, float("inf"), 0.1, float("-inf")])
    with pytest.raises(ValueError) as raised:
        kappa_scores(DETECTORS["odin"], {"scores/odin": odin_scores}, background=False,
                     parameters={"temperature": 2.0, "epsilon": 1e-05})
    assert str(raised.value).startswith("confidence function 'odin' (epsilon=1e-05, temperature=2.0) gave NaN or "
                                        "infinite scores for 3 of 6 images (first rows: [1, 3, 5])")
    # EvG's search: a NaN κ is a rejected proposal, so it asks for the scores as they are
    assert torch.equal(kappa_scores(DETECTORS["odin"], {"scores/odin": odin_scores}, background=False, parameters={},
                                    finite=False).isnan(), odin_scores.isnan())


