import pytest
import timm
import torch
from torch import nn

from lightning_modules.nets.backbones import (
    OpenSetNetwork,
    PretrainedWeightsMissing,
    build_backbone,
    cached_timm_weights,
)

# (backbone, in_channels, image size): every backbone family the project offers
BACKBONES = [
    ("small_cnn", 1, 28),
    ("torchvision:resnet18", 3, 32),
    ("torchvision:mobilenet_v3_small", 3, 32),
    ("timm:resnet18", 3, 32),
    ("timm:vit_tiny_patch16_224", 3, 224),
    # timm models with a hidden head layer after the pooling: their features are head_hidden_size wide, not
    # num_features (MobileNetV3 1024 vs 288, GhostNet and LCNet 1280)
    ("timm:mobilenetv3_small_050", 3, 32),
    ("timm:ghostnet_050", 3, 32),
    ("timm:lcnet_050", 3, 32),
    ("timm:convnext_atto", 3, 32),
]


@pytest.mark.parametrize(("name", "channels", "size"), BACKBONES)
def test_backbone_contract(name, channels, size):
    torch.manual_seed(0)
    backbone, feature_dim = build_backbone(name, in_channels=channels)
    network = OpenSetNetwork(backbone, feature_dim, num_outputs=5)
    images = torch.randn(2, channels, size, size)
    assert backbone.eval()(images).shape == (2, feature_dim)  # the width it is sized by is the one it gives
    backbone.train()
    logits, features = network(images)
    assert logits.shape == (2, 5) and features.shape == (2, 5)
    assert torch.isfinite(logits).all()
    # the logits are the bias-free linear map of the deep features
    torch.testing.assert_close(logits, features @ network.logits.weight.T)
    assert network.logits.bias is None
    logits.square().sum().backward()
    # every parameter is connected to the output (timm zero-initialises the last BN of each residual
    # block, so some gradients are exactly zero at initialisation, but none may be missing)
    without_grad = [n for n, p in network.named_parameters() if p.requires_grad and p.grad is None]
    assert without_grad == [], f"parameters without gradient: {without_grad[:5]}"
    assert all(torch.isfinite(p.grad).all() for p in network.parameters())
    assert network.deep_features.weight.grad.abs().sum() > 0


def test_paper_resnet50_layers():
    backbone, feature_dim = build_backbone("torchvision:resnet50")
    network = OpenSetNetwork(backbone, feature_dim, num_outputs=117)  # BG on P1: K + 1
    assert feature_dim == 2048
    assert isinstance(backbone.fc, nn.Identity)
    assert (network.deep_features.in_features, network.deep_features.out_features) == (2048, 117)
    assert network.deep_features.bias is not None
    assert network.logits.weight.shape == (117, 117) and network.logits.bias is None


def test_deep_feature_dim_can_differ():
    backbone, feature_dim = build_backbone("small_cnn", in_channels=1)
    network = OpenSetNetwork(backbone, feature_dim, num_outputs=4, deep_feature_dim=2)
    assert network.logits.weight.shape == (4, 2)


def test_missing_torchvision_weights_name_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(PretrainedWeightsMissing, match=r"resnet18-f37072fd\.pth") as error:
        build_backbone("torchvision:resnet18", pretrained=True)
    assert str(tmp_path / "hub" / "checkpoints") in str(error.value)


def test_missing_timm_weights_name_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    if cached_timm_weights("resnet18") is not None:
        pytest.skip("this machine has timm resnet18 weights cached")
    with pytest.raises(PretrainedWeightsMissing, match="timm/resnet18.a1_in1k"):
        build_backbone("timm:resnet18", pretrained=True)
    with pytest.raises(PretrainedWeightsMissing, match="does not exist"):
        build_backbone("timm:resnet18", pretrained=True, pretrained_file=str(tmp_path / "none.pth"))


def test_timm_weights_load_from_local_cache(tmp_path, monkeypatch):
    # a weight file in the torch hub cache under the name of the model's release URL is used as is
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(1)
    source = timm.create_model("resnet18", pretrained=False)
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(source.state_dict(), cache / "resnet18_a1_0-d63eafa0.pth")
    assert cached_timm_weights("resnet18") == cache / "resnet18_a1_0-d63eafa0.pth"
    backbone, _ = build_backbone("timm:resnet18", pretrained=True)
    torch.testing.assert_close(backbone.conv1.weight, source.conv1.weight)
    explicit, _ = build_backbone("timm:resnet18", pretrained=True, pretrained_file=str(cache / "resnet18_a1_0-d63eafa0.pth"))
    torch.testing.assert_close(explicit.layer4[1].conv2.weight, source.layer4[1].conv2.weight)


def test_unknown_backbones_are_rejected():
    with pytest.raises(ValueError, match="unknown backbone"):
        build_backbone("resnet50")
    with pytest.raises(ValueError, match="unknown torchvision model"):
        build_backbone("torchvision:not_a_model")
    with pytest.raises(ValueError, match="unknown timm model"):
        build_backbone("timm:not_a_model")
