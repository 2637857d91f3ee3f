"""ScoringModel: full logits of any classifier (background column kept), checkpoints, timm arguments."""

import pytest
import torch

from lightning_modules.checkpoint import load_module
from lightning_modules.scoring import ScoringModel, checkpoint_display_name, penultimate_features


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
    assert not eos.background_class and eos.eval_transform is None
    with torch.no_grad():
        features = eos.features(images)
        assert features.shape == (3, 4)
        torch.testing.assert_close(eos.network.network.logits(features), eos(images))
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
    assert scoring.eval_transform is not None
    with pytest.raises(ValueError, match="apply to timm/torchvision models"):
        ScoringModel("runs/x/best.ckpt", model_args={"drop_rate": 0.2})


def test_test_step_does_nothing():
    scoring = ScoringModel("timm:test_resnet", pretrained=False)
    assert scoring.test_step((torch.rand(1, 3, 32, 32), torch.zeros(1, dtype=torch.long)), 0) is None
    assert scoring.forward_calls == 0
