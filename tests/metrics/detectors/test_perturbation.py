"""ODIN and MC dropout (:mod:`metrics.detectors.perturbation`): ODIN's step by hand, MC dropout's passes and
modes, their arguments checked by value, and the advice MC dropout gives a model without dropout."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from metrics import KAPPAS, resolve_detector
from metrics.detectors.perturbation import dropout_modules, mc_dropout, odin
from tests.metrics.detectors.helpers import LogitsModel


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
    assert resolve_detector("odin").arguments(temperature=1000) == {"temperature": 1000, "epsilon": 1e-5,
                                                                    "image_space": False}


def test_odin_in_image_space_steps_openoods_noise_over_the_inputs_std():
    """OpenOOD v1.5's ODIN (odin_postprocessor.py) divides the gradient's sign by the preprocessing's std before its
    step on the normalised input: a step of ``noise`` on the [0, 1] image. ``image_space=True`` does that for a model
    whose input is normalised (its ``model_input.std``), and nothing more for one without."""
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 5))
    images = torch.randn(6, 3, 4, 4)
    std = (0.229, 0.224, 0.225)

    def expected(divide: bool) -> torch.Tensor:  # the formula, step by step
        inputs = images.clone().requires_grad_(True)
        logits = network(inputs) / 1000.0
        torch.nn.functional.cross_entropy(logits, logits.argmax(dim=1), reduction="sum").backward()
        step = 0.0014 * inputs.grad.sign()
        if divide:
            step = step / torch.tensor(std).view(1, 3, 1, 1)
        with torch.no_grad():
            return torch.softmax(network(images - step) / 1000.0, dim=1).max(dim=1).values

    normalised = torch.nn.Module()
    normalised.forward = network.forward  # a model that takes normalised inputs
    normalised.model_input = types.SimpleNamespace(std=std)
    got = odin(normalised, images, temperature=1000.0, epsilon=0.0014, image_space=True)
    torch.testing.assert_close(got, expected(True), rtol=0, atol=1e-7)
    assert not torch.allclose(got, expected(False), rtol=0, atol=1e-7)
    plain = odin(network, images, temperature=1000.0, epsilon=0.0014, image_space=True)  # no model_input: ε itself
    torch.testing.assert_close(plain, expected(False), rtol=0, atol=1e-7)


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
