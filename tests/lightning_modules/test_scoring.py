"""ScoringModel: full logits of any classifier (background column kept), checkpoints, timm arguments, the
model's own input and classes."""

import pytest
import torch
from torch import nn

from datamodules.protocols import imagenet1k_wnids
from datamodules.transforms import ModelInput, TensorPipeline
from lightning_modules.checkpoint import CheckpointError, load_module
from lightning_modules.scoring import (
    ScoringModel,
    checkpoint_display_name,
    classification_head,
    forward_outputs,
    penultimate_features,
    shares_features_pass,
)
from tests.conftest import ROOT


def test_checkpoint_scoring_returns_the_full_logits(bg_checkpoint, demo_checkpoint):
    scoring = ScoringModel(str(bg_checkpoint))
    module = load_module(bg_checkpoint)
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        logits = scoring(images)
        torch.testing.assert_close(logits, module.eval()(images))
    assert logits.shape == (3, 5) and scoring.background_class  # 4 known + background, not cut off
    assert scoring.display_name == "bg-best" == checkpoint_display_name(bg_checkpoint)
    eos = ScoringModel(str(demo_checkpoint))
    assert not eos.background_class
    # its input and classes come from its own datamodule (Fashion-MNIST at 28 px, one channel)
    assert eos.model_input.size == (28, 28) and eos.model_input.channels == 1 and eos.model_input.mean is None
    assert repr(eos.model_input.pipeline) == repr(TensorPipeline(28, 1))
    assert eos.classes == ["T-shirt/top", "Trouser", "Sneaker", "Bag"] == scoring.classes
    with torch.no_grad():
        features = eos.features(images)  # the backbone's pooled activations (small_cnn: 64, after a ReLU)
        assert features.shape == (3, 64) and bool((features >= 0).all())
        network = eos.network.network
        torch.testing.assert_close(network.logits(network.deep_features(features)), eos(images))
        weight, bias = classification_head(eos)  # the two linear layers as one head, exactly
        torch.testing.assert_close(features @ weight.T + bias, eos(images), rtol=1e-5, atol=1e-5)
        assert classification_head(ScoringModel(str(bg_checkpoint)))[0].shape == (5, 64)
    assert eos.fingerprint() == ScoringModel(str(demo_checkpoint)).fingerprint() != scoring.fingerprint()


def test_timm_model_arguments_and_features():
    scoring = ScoringModel("timm:test_resnet", pretrained=False, model_args={"drop_rate": 0.25, "num_classes": 7})
    assert scoring.network.drop_rate == 0.25 and not scoring.background_class
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = scoring(images)
        features = penultimate_features(scoring.network, images)
        torch.testing.assert_close(scoring.network.get_classifier()(features), logits)
    assert logits.shape == (2, 7)
    assert scoring.model_input.size == (160, 160) and scoring.model_input.mean is not None  # timm: its data config
    assert scoring.classes is None  # a 7-class head: classes unknown
    assert ScoringModel("timm:test_resnet", pretrained=False).classes == imagenet1k_wnids()
    with pytest.raises(ValueError, match="apply to timm/torchvision models"):
        ScoringModel("runs/x/best.ckpt", model_args={"drop_rate": 0.2})


def _trunk_calls(module: nn.Module) -> list[int]:
    calls: list[int] = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("spec", ["timm:test_resnet", "checkpoint"])
def test_logits_and_features_come_from_one_run_of_the_trunk_exactly_as_two_would_give_them(spec, demo_checkpoint):
    scoring = ScoringModel(str(demo_checkpoint) if spec == "checkpoint" else spec, pretrained=False)
    network = scoring.network
    trunk = network.network.backbone if spec == "checkpoint" else network.layer1
    images = torch.rand(3, *((1, 28, 28) if spec == "checkpoint" else (3, 32, 32)))
    calls = _trunk_calls(trunk)
    with torch.no_grad():
        apart = {"logits": scoring(images), "features": scoring.features(images)}
        assert len(calls) == 2 and scoring.forward_calls == 1
        joint = forward_outputs(scoring, images, features=True)
        assert len(calls) == 3 and scoring.forward_calls == 2  # the trunk once for both
        alone = forward_outputs(network, images, features=True)  # the bare network too (a training callback's)
    assert shares_features_pass(scoring) and shares_features_pass(network)
    for key in ("logits", "features"):  # the same operations on the same trunk output: bit for bit
        assert torch.equal(joint[key], apart[key]) and torch.equal(alone[key], apart[key])


def test_a_module_with_its_own_features_method_runs_twice_for_logits_and_features():
    class Own(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, images):
            return self.linear(self.features(images))

        def features(self, images):
            return images.flatten(1)[:, :4] * 2

    module = Own()
    calls = _trunk_calls(module.linear)
    images = torch.rand(2, 1, 2, 2)
    with torch.no_grad():
        outputs = forward_outputs(module, images, features=True)
    assert not shares_features_pass(module) and len(calls) == 1
    assert torch.equal(outputs["features"], images.flatten(1) * 2) and torch.equal(outputs["logits"], module(images))


def test_outputs_are_per_sample_for_an_ensemble_too():
    class Members(nn.Module):
        def forward(self, images):
            return torch.stack([images.flatten(1)[:, :3], 2 * images.flatten(1)[:, :3]])  # (M=2, N, C=3)

    images = torch.rand(4, 1, 2, 2)
    outputs = forward_outputs(Members(), images)
    assert outputs["logits"].shape == (4, 2, 3)
    torch.testing.assert_close(outputs["logits"][:, 1], 2 * images.flatten(1)[:, :3])


def test_a_module_needs_its_input_and_a_generator_is_not_a_classifier():
    with pytest.raises(ValueError, match="needs its model_input"):
        ScoringModel(nn.Linear(4, 2))
    given = ScoringModel(nn.Linear(4, 2), model_input=ModelInput(TensorPipeline(None, None)), name="linear",
                         classes=["a", "b"])
    assert given.display_name == "linear" and given.classes == ["a", "b"] and not given.ensemble
    with pytest.raises(CheckpointError, match="OpenSetClassifier is expected here: scoring needs a classifier of train.py"):
        ScoringModel(str(ROOT / "tests/data/legacy/near_ood.ckpt"))


def test_ensembles_of_members_files_are_named_by_their_folders(demo_checkpoint, tmp_path):
    """Two ensembles whose first members share a file name (``member_0/best.ckpt``) stay apart in the tables."""
    names = []
    for folder in ("ensemble", "ensemble_independent"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ensemble.txt").write_text(f"{demo_checkpoint}\n{demo_checkpoint}\n")
        names.append(ScoringModel(f"ensemble:{tmp_path / folder / 'ensemble.txt'}").display_name)
    assert names == ["ensemble2-ensemble", "ensemble2-ensemble_independent"]
    listed = ScoringModel(f"ensemble:{demo_checkpoint},{demo_checkpoint}").display_name
    assert listed == f"ensemble2-{demo_checkpoint.parent.parent.name}-best"  # listed members: the first's name


def test_a_built_model_is_shared_only_with_an_evaluation_that_would_build_it_alike() -> None:
    """The report card hands its built models to its sections; a section with model options of its own (its
    model_args, another pretrained file) gets a model of its own, never the card's silently."""
    from evaluation_engine.command import Evaluation
    from lightning_modules.scoring import ScoringModel

    built = ScoringModel("timm:resnet10t", pretrained=False)
    evaluation = Evaluation()
    evaluation.built_models = {"timm:resnet10t": built}
    assert evaluation.scoring_model("timm:resnet10t", pretrained=False) is built
    own = evaluation.scoring_model("timm:resnet10t", pretrained=False, model_args={"drop_rate": 0.2})
    assert own is not built and own.network.drop_rate == 0.2 and built.network.drop_rate == 0.0
    assert evaluation.scoring_model("timm:resnet18", pretrained=False) is not built
