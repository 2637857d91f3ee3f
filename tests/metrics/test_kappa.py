import numpy as np
import pytest
import torch
from torch import nn

from metrics import KAPPAS, resolve_detector
from metrics.detectors import DETECTORS, Detector, ScoreFunction
from metrics.detectors.perturbation import dropout_modules, mc_dropout, odin


class LogitsModel(nn.Module):
    """Treats its input as the logits, through a dropout layer and a learnable-free identity."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x)


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


def test_logit_kappas_against_numpy():
    logits = np.random.default_rng(0).normal(size=(50, 7)) * 3
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    torch_logits = torch.from_numpy(logits)
    np.testing.assert_allclose(KAPPAS["softmax"](torch_logits).numpy(), p.max(1), rtol=1e-12)
    np.testing.assert_allclose(KAPPAS["max_logit"](torch_logits).numpy(), logits.max(1))
    np.testing.assert_allclose(KAPPAS["entropy"](torch_logits).numpy(), (p * np.log(p)).sum(1), rtol=1e-10)
    np.testing.assert_allclose(KAPPAS["energy"](torch_logits).numpy(), np.log(np.exp(logits).sum(1)), rtol=1e-10)


def test_odin_step_direction_on_a_linear_model():
    torch.manual_seed(0)
    model = nn.Linear(6, 4).eval()
    images = torch.randn(10, 6)
    with torch.inference_mode(False):
        scores = odin(model, images, temperature=2.0, epsilon=0.01)
    # hand-derived: for a linear model, d CE / dx = W^T (softmax(z/T) - onehot(ŷ)) / T
    with torch.no_grad():
        logits = model(images) / 2.0
        p = torch.softmax(logits, 1)
        onehot = torch.eye(4)[logits.argmax(1)]
        gradient = (p - onehot) @ model.weight / 2.0
        perturbed = images - 0.01 * gradient.sign()
        expected = torch.softmax(model(perturbed) / 2.0, 1).max(1).values
        unperturbed = p.max(1).values
    torch.testing.assert_close(scores, expected)
    assert (scores > unperturbed).all(), "the ODIN step must raise the temperature-scaled softmax score"


def test_odin_refuses_inference_mode():
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode=False"):
        odin(nn.Linear(3, 2), torch.randn(2, 3))


def test_mc_dropout_varies_across_passes_and_restores_modes():
    torch.manual_seed(0)
    model = LogitsModel(p=0.5).eval()
    logits = torch.randn(8, 5) * 2
    one_pass = mc_dropout(model, logits, passes=1)
    torch.manual_seed(1)
    another = mc_dropout(model, logits, passes=1)
    assert not torch.allclose(one_pass, another), "dropout must be active during the passes"
    assert not model.dropout.training  # mode restored
    # with many passes the score approaches the entropy of the mean prediction, and differs from no dropout
    plain = KAPPAS["entropy"](logits)
    assert not torch.allclose(mc_dropout(model, logits, passes=30), plain)
    with pytest.raises(ValueError, match="no dropout with p > 0"):
        mc_dropout(nn.Linear(5, 5), logits)


def test_pytorch_ood_adapter_negates_outlier_scores():
    from pytorch_ood.detector import MaxSoftmax

    from metrics import build_detector

    logits = torch.randn(9, 4)
    scores = build_detector("pood:MaxSoftmax").score({"logits": logits})
    torch.testing.assert_close(scores, -MaxSoftmax(model=None).predict_logits(logits).double())
    torch.testing.assert_close(scores, torch.softmax(logits.double(), 1).max(1).values, rtol=1e-6, atol=1e-7)


# --- background-class models (DESIGN §3-§4): softmax over K+1, background column dropped afterwards ---

def test_background_keeps_the_rejection_signal():
    # two known classes at 0.05 each and p_bg = 0.9: the OSCR confidence is 0.05, so must the kappa be
    logits = torch.log(torch.tensor([[0.05, 0.05, 0.9]]))
    assert KAPPAS["softmax"](logits, background=True).item() == pytest.approx(0.05)
    assert KAPPAS["softmax"](logits[:, :2]).item() == pytest.approx(0.5)  # what dropping it first gave
    # entropy: the background mass spread over the known classes -> uniform -> the minimum -log K
    assert KAPPAS["entropy"](logits, background=True).item() == pytest.approx(-np.log(2))
    confident = torch.log(torch.tensor([[0.9, 0.05, 0.05]]))
    assert KAPPAS["entropy"](confident, background=True) > KAPPAS["entropy"](logits, background=True)


def test_background_kappas_against_numpy():
    logits = np.random.default_rng(1).normal(size=(40, 6)) * 3  # K = 5 known + background
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    spread = p[:, :5] + p[:, 5:] / 5
    torch_logits = torch.from_numpy(logits)
    np.testing.assert_allclose(KAPPAS["softmax"](torch_logits, background=True).numpy(), p[:, :5].max(1), rtol=1e-12)
    np.testing.assert_allclose(KAPPAS["entropy"](torch_logits, background=True).numpy(),
                               (spread * np.log(spread)).sum(1), rtol=1e-10)
    np.testing.assert_allclose(KAPPAS["max_logit"](torch_logits, background=True).numpy(), logits[:, :5].max(1))
    np.testing.assert_allclose(KAPPAS["energy"](torch_logits, background=True).numpy(),
                               np.log(np.exp(logits[:, :5]).sum(1)), rtol=1e-10)


def test_odin_with_background_predicts_and_scores_known_classes():
    torch.manual_seed(0)
    model = nn.Linear(6, 4).eval()  # 3 known + background
    images = torch.randn(12, 6)
    scores = odin(model, images, temperature=2.0, epsilon=0.0, background=True)
    with torch.no_grad():
        expected = torch.softmax(model(images) / 2.0, 1)[:, :3].max(1).values
    torch.testing.assert_close(scores, expected)


def test_mc_dropout_on_timm_models_with_functional_dropout():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=5, drop_rate=0.5).eval()
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())  # timm applies F.dropout in its head
    assert dropout_modules(model) == [model]
    images = torch.randn(4, 3, 32, 32)
    one, another = mc_dropout(model, images, passes=1), mc_dropout(model, images, passes=1)
    assert not torch.allclose(one, another), "dropout must be active during the passes"
    assert not model.training and all(not m.training for m in model.modules())  # modes restored
    with torch.no_grad():
        plain = KAPPAS["entropy"](model(images))
    torch.testing.assert_close(model(images), model(images))  # eval mode again: deterministic
    assert not torch.allclose(mc_dropout(model, images, passes=8), plain)
    without = timm.create_model("test_resnet", pretrained=False, num_classes=5).eval()
    with pytest.raises(ValueError, match="drop_rate > 0"):
        mc_dropout(without, images)


def test_kappa_parameters_resolve_defaults_and_refuse_unknown_names():
    assert resolve_detector("odin").arguments() == {"temperature": 2.0, "epsilon": 1e-5}
    assert resolve_detector("odin").arguments(temperature=1000) == {"temperature": 1000, "epsilon": 1e-5}
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


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("odin", {"temperature": 0}, "'odin': temperature must be a positive finite number, got 0$"),
    ("odin", {"temperature": -2.0}, "temperature must be a positive finite number, got -2.0"),
    ("odin", {"epsilon": -1e-3}, "epsilon must be a non-negative finite number, got -0.001"),
    ("odin", {"temperature": "hot"}, "temperature must be a positive finite number, got 'hot'"),
    ("mc_dropout", {"passes": 0}, "'mc_dropout': passes must be an integer >= 1, got 0"),
    ("mc_dropout", {"passes": 2.5}, "passes must be an integer >= 1, got 2.5"),
])
def test_kappa_parameters_are_checked_by_value(name, arguments, message):
    with pytest.raises(ValueError, match=message):
        resolve_detector(name).arguments(**arguments)
    assert resolve_detector("odin").arguments(temperature=1000) == {"temperature": 1000, "epsilon": 1e-5}


def test_every_kappa_is_a_detector_that_declares_its_pass_and_fit():
    from metrics.detectors import build_detector

    expected_kind = {"softmax": "logits", "max_logit": "logits", "entropy": "logits", "energy": "logits",
                     "odin": "model", "mc_dropout": "model", "ensemble_mi": "ensemble", "ensemble_softmax": "ensemble",
                     "ensemble_entropy": "ensemble", "gen": "logits", "mahalanobis": "features",
                     "relative_mahalanobis": "features", "knn": "features", "knn_imagenet": "features",
                     "vim": "features", "react": "features", "ash_s": "features", "ash_p": "features",
                     "ash_b": "features", "scale": "features", "she": "features", "dice": "features"}
    assert {name: cls.kind for name, cls in DETECTORS.items()} == expected_kind
    fitted = {"mahalanobis", "relative_mahalanobis", "knn", "knn_imagenet", "vim", "react", "she", "dice"}
    head_only = {"ash_s", "ash_p", "ash_b", "scale"}  # DICE's contribution means come from the fit data
    for name, cls in DETECTORS.items():
        assert resolve_detector(name) is cls and isinstance(build_detector(name), cls)
        assert (cls.fit_data, cls.needs_fit) == (name in fitted, name in fitted | head_only)
    # the hyperparameters are the constructor's keyword-only arguments, each with its default
    assert resolve_detector("knn").arguments() == {"k": 50}
    assert resolve_detector("gen").arguments(M=100) == {"gamma": 0.1, "M": 100, "clamp": False}
    assert resolve_detector("ash_p").arguments() == {"percentile": 0.6}
    assert resolve_detector("knn").arguments(k=7)["k"] == 7
    with pytest.raises(ValueError, match="'knn' has no hyperparameter 'neighbours'; it takes \\['k'\\]"):
        resolve_detector("knn").arguments(neighbours=7)
    with pytest.raises(ValueError, match="percentile must be a fraction in \\(0, 1\\), got 1.5"):
        resolve_detector("react").arguments(percentile=1.5)  # refused by the detector when the arguments resolve
    # a function of the logits is a detector with an empty fit, scoring what its KAPPAS scorer scores
    logits = torch.randn(4, 3)
    softmax = build_detector("softmax")
    assert softmax.fitted and torch.equal(softmax.score({"logits": logits}), torch.softmax(logits, 1).max(1).values)
    # any pytorch-ood detector by name, fitted by the same pass: its arguments are free keywords
    pood = resolve_detector("pood:KNN")
    assert pood.fit_data and pood.kind == "features" and pood.arguments(k=3) == {"k": 3}
    with pytest.raises(ValueError, match="unknown detector 'mahalanobis2'"):
        resolve_detector("mahalanobis2")


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


def test_mc_dropout_on_a_checkpoint_without_dropout_gives_advice_a_checkpoint_can_take(demo_checkpoint):
    """The demo checkpoint's small CNN has no dropout, and a checkpoint refuses --model-arg: the error says so and
    names what works (a network trained with dropout, or a timm model created with it), not --model-arg."""
    from lightning_modules.scoring import ScoringModel

    model = ScoringModel(str(demo_checkpoint))
    with pytest.raises(ValueError) as raised:
        mc_dropout(model, torch.zeros(2, 1, 28, 28))
    message = str(raised.value)
    assert message.startswith(f"{demo_checkpoint} (OpenSetClassifier) has no dropout with p > 0, so MC dropout would "
                              "equal the plain entropy: a checkpoint's network is the one it trained, and it has no "
                              "dropout layer (--model-arg applies to timm/torchvision models only)")
    assert "--model.init_args.backbone_args '{drop_rate: 0.2}'" in message
    with pytest.raises(ValueError, match="model_args .* not to checkpoint"):  # why --model-arg is not the advice
        ScoringModel(str(demo_checkpoint), model_args={"drop_rate": 0.2})


def test_mc_dropout_advice_follows_the_kind_of_model():
    timm_model = type("Spec", (nn.Module,), {})()
    timm_model.spec = "timm:resnet18"
    with pytest.raises(ValueError, match=r"^timm:resnet18 \(Spec\) has no dropout with p > 0.*create it with dropout "
                                         r"in its head: evaluate.py --model-arg drop_rate=0.2"):
        mc_dropout(timm_model, torch.zeros(1, 3))
    timm_model.spec = "torchvision:resnet50"
    with pytest.raises(ValueError, match=r"one that does not \(the ResNets\) has no dropout to switch on: take the timm "
                                         r"model of the same name with dropout \(--model timm:<name> --model-arg "
                                         r"drop_rate=0.2\)"):
        mc_dropout(timm_model, torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"^Linear has no dropout with p > 0.*give it nn.Dropout layers"):
        mc_dropout(nn.Linear(5, 5), torch.zeros(1, 5))


def test_the_advised_retraining_gives_a_checkpoint_network_mc_dropout_can_score():
    """What the advice says to train: an OpenSetClassifier whose timm backbone has drop_rate (timm's functional
    dropout on the pooled features) is a network MC dropout switches on, through the scoring model."""
    from datamodules.transforms import ModelInput
    from lightning_modules import OpenSetClassifier
    from lightning_modules.scoring import ScoringModel

    torch.manual_seed(0)
    classifier = OpenSetClassifier(num_classes=3, loss="softmax", backbone="timm:test_resnet",
                                   backbone_args={"drop_rate": 0.5}, in_channels=3)
    model = ScoringModel(classifier, model_input=ModelInput(None, size=(32, 32), channels=3)).eval()
    images = torch.rand(4, 3, 32, 32)
    torch.manual_seed(1)
    one = mc_dropout(model, images, passes=1)
    torch.manual_seed(2)
    assert not torch.allclose(one, mc_dropout(model, images, passes=1))  # dropout is on in the passes
    assert not any(m.training for m in model.modules())  # and off again after them
